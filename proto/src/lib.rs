//! railguard's wire protocol: the gRPC services spoken between supervisors
//! (`RaftPeer`), by the admin CLI (`Admin`) and by node agents (`Agent`).
//!
//! The agent-facing messages are typed protobuf (agents are long-lived and
//! may be written in other languages). Raft peer traffic carries openraft's
//! own serde types encoded with bincode, and admin calls carry JSON bodies of
//! the supervisor's `api` types, inside a `Blob`: both are Rust-to-Rust, and
//! one set of types is easier to keep correct than a second copy in protobuf.
//!
//! [`agent`] holds the agent↔supervisor vocabulary as plain Rust types
//! (NIC reports, orders, typed order outcomes) with validating conversions
//! from and to the protobuf messages.

pub mod agent;
pub mod v1;

pub use agent::{BorderError, NicHealth, NicReport, Order, OrderOutcome, QUERY_BIT};

/// Largest admin request or reply body accepted (bytes).
pub const MAX_ADMIN_MESSAGE_BYTES: usize = 4 << 20;

/// Most peers a heartbeat carries probe evidence for
/// (`HeartbeatRequest.heard`); the supervisor reads no more.
pub const MAX_PEERS_HEARD: usize = 64;
/// Largest agent message accepted (bytes). Events are small; this bounds a
/// hostile or broken agent.
pub const MAX_AGENT_MESSAGE_BYTES: usize = 256 << 10;
/// Largest Raft peer message (append batches, snapshot chunks).
pub const MAX_PEER_MESSAGE_BYTES: usize = 64 << 20;
