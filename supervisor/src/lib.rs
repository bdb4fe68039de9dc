//! railguard's supervisor: the Raft-replicated brain of the cluster.
//!
//! # Layout
//! - [`model`]: the replicated cluster model and its typed commands
//!   (deterministic apply, validation before proposing).
//! - [`node`]: one supervisor's Raft node: proposal batcher, read paths,
//!   membership. It knows nothing of [`leader`].
//! - [`leader`]: the leader's memory and loops over the node: the
//!   reconciler, order streams to agents, webhooks, liveness, the clock
//!   service and the contention detector ([`leader::services::Leader`]
//!   bundles them).
//! - [`network`]: Raft RPC between supervisors over gRPC.
//! - [`service`]: the gRPC services (`Admin`, `Agent`, `RaftPeer`).
//! - [`runs`]: the playbook executor (runs of stored playbooks for
//!   incidents, each step an intent).
//! - [`probe_graph`]: who probes whom (a random regular graph in the model).
//! - [`api`] / [`client`]: admin API types and the client the CLI uses.
//! - [`config`] / [`datadir`]: configuration loading and data-dir locking.
//! - [`daemon`]: wiring for the `railguard-supervisor` binary.

pub mod api;
pub mod client;
pub mod config;
pub mod daemon;
pub mod datadir;
pub mod jobs;
pub mod leader;
pub mod model;
pub mod network;
pub mod node;
pub mod playbook_store;
pub mod probe_graph;
pub mod runs;
pub mod service;
pub mod shaping;
pub mod topology;

// The model files still name these by their old paths (their tests and doc
// links); the model refactor moves those uses and drops the aliases.
pub use leader::{orders, reconciler, webhooks};
