//! The railguard node agent (being built by the agent issue).
//!
//! # Layout
//! - [`damper`]: RFC 2439-style flap damping (`FlapDamper`), shared with the
//!   `rdma` crate (a resilient connection fails back only to a reusable NIC).
//! - [`link`]: `LinkTracker` over rtnetlink multicast, per-NIC health.
//! - [`outbox`]: persisted, bounded, coalescing outbox of sequenced reports.
//!
//! - [`agent`]: the runtime (tracker → outbox → report stream, heartbeats).
//! - [`config`]: TOML + flags, NIC discovery.
//!
//! RDMA port events (the `rdma` crate's event stream) will feed the same
//! tracker once that crate exists; today only netlink feeds it.

pub mod agent;
pub mod config;
pub use rdma::damper;
pub mod link;
pub mod outbox;
