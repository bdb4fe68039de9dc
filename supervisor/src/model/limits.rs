//! Bounds on everything the replicated model keeps or accepts.

/// Bound on the admin-operation history kept in the model.
pub const MAX_ADMIN_HISTORY: usize = 10_000;

/// Bound on the cluster event log kept in the model.
pub const MAX_EVENT_LOG: usize = 10_000;

/// Open `no_common_rail` incidents naming one host: enough to move its
/// jobs (placement avoids every cut pair by itself), not one per pair of a
/// thousand-host job.
pub const MAX_PATH_INCIDENTS_PER_HOST: usize = 4;

/// Bound on closed incidents and intents kept in the model.
pub const MAX_CLOSED_RECORDS: usize = 10_000;

/// Bound on labels per host and on name lengths.
pub const MAX_LABELS: usize = 64;

/// Longest host, NIC, label key or label value accepted.
pub const MAX_NAME_LEN: usize = 253;

/// Longest drain reason accepted.
pub const MAX_REASON_LEN: usize = 1024;

/// Most NICs a host may register.
pub const MAX_NICS: usize = 64;

/// Most client sessions remembered (least recently used are forgotten).
pub const MAX_SESSIONS: usize = 4_096;

/// Most results remembered per client session (oldest serials forgotten).
pub const MAX_SESSION_RESULTS: usize = 64;

/// Most connection (QP) placements kept per host; further ones are not
/// recorded (an event says so).
pub const MAX_QPS_PER_HOST: usize = 4_096;

/// Most clock state changes in one `SetClockStates` command.
pub const MAX_CLOCK_CHANGES: usize = 4_096;
/// Most revoked certificate serials the cluster keeps (revoke a CA's
/// certificates wholesale by rotating the CA).
pub const MAX_REVOKED: usize = 10_000;
