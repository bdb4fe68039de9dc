//! What a connection reports to its application: delivered messages with
//! the path that carried them, its figures, and why it last moved.

use std::time::Instant;

use bytes::Bytes;

/// Why the connection moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MoveReason {
    Initial,
    LinkDown,
    Order,
    TransportError,
    Failback,
    PeerMoved,
}

/// What the connection reports about itself.
#[derive(Debug, Clone, Default)]
pub struct ConnStats {
    /// Epoch of the current (or last) path.
    pub epoch: u32,
    /// Rail index of the current path; `None` while there is none.
    pub rail: Option<usize>,
    /// Path changes after the first path.
    pub migrations: u64,
    /// Messages queued for sending (the highest sequence number used).
    pub sent: u64,
    /// Messages the peer has acknowledged.
    pub acked_through: u64,
    /// Messages delivered to this side's application queue.
    pub delivered: u64,
    /// Messages sent again after a migration.
    pub replayed: u64,
    pub last_reason: Option<MoveReason>,
    /// When the current path was established.
    pub path_since: Option<Instant>,
    /// When the connection lost its last path (`None` while it has one).
    pub stalled_since: Option<Instant>,
}

/// A delivered message and the path that carried it.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub payload: Bytes,
    pub epoch: u32,
    pub rail: usize,
}
