//! Connection (queue-pair) placements as agents report them.

use serde::{Deserialize, Serialize};

/// Identifies a connection on a host: job, rank, connection id.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QpKey {
    pub job: String,
    pub rank: u32,
    pub conn_id: u64,
}

/// Where a job's connection (queue pair) runs, as its host's agent reported.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Qp {
    pub job: String,
    pub rank: u32,
    pub conn_id: u64,
    /// The NIC it uses now.
    pub nic: String,
    pub peer_host: String,
    pub peer_rank: u32,
    /// Its home rail.
    pub rail: u32,
    /// Off its home rail's NIC.
    pub moved: bool,
    /// Leader time of the last NIC change (or of registration).
    pub since_ms: u64,
}
