//! What the model remembers of each host's detour routes.

use serde::{Deserialize, Serialize};

/// How often one desired set may fail before the reconciler stops
/// ordering it (a changed set is tried afresh).
pub const MAX_REROUTE_FAILURES: u32 = 3;

/// What a host's agent confirmed, and how its current set fared.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RerouteRecord {
    /// Digest of the set the agent last confirmed (0: none, no routes).
    pub applied: u64,
    /// Digest of the set that last failed, and how many times in a row.
    pub failed: u64,
    pub failures: u32,
}
