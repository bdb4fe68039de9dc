//! The leader's memory and loops: everything a supervisor keeps and does
//! only while it leads, never replicated. Each service here depends on the
//! Raft node ([`crate::node::Supervisor`]) and acts only while
//! [`crate::node::Supervisor::leads`]; the node knows nothing of them.
//!
//! # Layout
//! - [`services`]: [`services::Leader`], the bundle of the services below
//!   with the node, built once per process by the daemon and handed to the
//!   gRPC services; it starts the loops.
//! - [`clock`]: probe summaries, the network clock solve, per-path delays,
//!   probe evidence, clock state changes.
//! - [`contention`]: per-path queueing, bottleneck links, `link_contention`
//!   incidents.
//! - [`orders`]: the order streams to agents ([`orders::OrderHub`]).
//! - [`webhooks`]: POSTs of `notify` steps.
//! - [`liveness`]: Ready/Suspect/Down from heartbeats and probe evidence.
//! - [`reconciler`]: the loop that opens and closes intents and hands the
//!   open orders to the hub.

pub mod clock;
pub mod contention;
pub mod liveness;
pub mod orders;
pub mod reconciler;
pub mod services;
pub mod webhooks;
