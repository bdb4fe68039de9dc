//! railguard's supervisor: the Raft-replicated brain of the cluster.
//!
//! # Layout
//! - [`model`]: the replicated cluster model and its typed commands
//!   (deterministic apply, validation before proposing).
//! - [`node`]: one supervisor: Raft node, proposal batcher, read paths,
//!   membership.
//! - [`network`]: Raft RPC between supervisors over gRPC.
//! - [`service`]: the gRPC services (`Admin`, `Agent`, `RaftPeer`).
//! - [`reconciler`]: leader-side intents and actions.
//! - [`runs`]: the playbook executor (runs of stored playbooks for
//!   incidents, each step an intent).
//! - [`orders`]: the leader's order streams to agents (failover/failback).
//! - [`liveness`]: Ready/Suspect/Down from heartbeats and probe evidence,
//!   with a grace period.
//! - [`probe_graph`]: who probes whom (a random regular graph in the model).
//! - [`clock`]: the leader's clock service: probe summaries, the network
//!   clock solve, per-path delays, probe evidence, clock state changes.
//! - [`api`] / [`client`]: admin API types and the client the CLI uses.
//! - [`config`] / [`datadir`]: configuration loading and data-dir locking.
//! - [`daemon`]: wiring for the `railguard-supervisor` binary.

pub mod api;
pub mod client;
pub mod clock;
pub mod config;
pub mod contention;
pub mod daemon;
pub mod datadir;
pub mod liveness;
pub mod model;
pub mod network;
pub mod node;
pub mod orders;
pub mod reconciler;
pub mod service;
pub mod topology;
pub mod webhooks;

// The model's areas, also at the crate root where they always were.
pub use model::{jobs, playbook_store, probe_graph, runs, shaping};
