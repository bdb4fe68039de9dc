//! railguard's supervisor: the Raft-replicated brain of the cluster.
//!
//! # Layout
//! - [`model`]: the replicated cluster model: typed commands, validation,
//!   deterministic apply, and the leader's pure decisions
//!   ([`model::decide`]); jobs, playbook runs, shaping, stored playbooks
//!   and the probe graph are its areas.
//! - [`node`]: one supervisor's Raft node: proposal batcher, read paths,
//!   membership. It knows nothing of [`leader`].
//! - [`leader`]: the leader's memory and loops over the node: the
//!   reconciler, order streams to agents, webhooks, liveness, the clock
//!   service and the contention detector ([`leader::services::Leader`]
//!   bundles them).
//! - [`network`]: Raft RPC between supervisors over gRPC.
//! - [`election_gate`]: when this node may campaign (openraft's `elect`
//!   switch has this one owner).
//! - [`service`]: the gRPC services (`Admin`, `Agent`, `RaftPeer`).
//! - [`api`] / [`client`]: admin API types and the client the CLI uses.
//! - [`config`] / [`datadir`]: configuration loading and data-dir locking.
//! - [`daemon`]: wiring for the `railguard-supervisor` binary.

pub mod api;
pub mod archive;
pub mod client;
pub mod config;
pub mod daemon;
pub mod datadir;
pub mod election_gate;
pub mod leader;
pub mod model;
pub mod network;
pub mod node;
pub mod replica;
pub mod service;
pub mod topology;
