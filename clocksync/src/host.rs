//! Host identity in the probe mesh: the id every estimate and solution is
//! keyed by.

use serde::{Deserialize, Serialize};

/// A host in the probe mesh. The supervisor maps host names to these ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct HostId(pub u32);

impl std::fmt::Display for HostId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "host#{}", self.0)
    }
}
