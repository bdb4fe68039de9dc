//! The railguard node agent.
//!
//! # Layout
//! - [`damper`]: RFC 2439-style flap damping (`FlapDamper`), shared with the
//!   `rdma` crate (a resilient connection fails back only to a reusable NIC).
//! - [`link`]: `LinkTracker` over rtnetlink multicast, per-NIC health.
//! - [`outbox`]: persisted, bounded, coalescing outbox of sequenced reports,
//!   and the order log.
//! - [`store_format`]: the format versions of the agent's sled trees.
//!
//! - [`control`]: the job contract's socket, the connection inventory, the
//!   reflex and the execution of failover/failback orders.
//! - [`jobs`]: the job runner (launches, fences, stops and checkpoints the
//!   ranks the supervisor places here; rank exits and checkpoints as
//!   reports; restart recovery).
//! - [`agent`]: the runtime (tracker → outbox → report stream, heartbeats,
//!   orders from the leader).
//! - [`config`]: TOML + flags, NIC discovery.
//! - [`shaping`]: the supervisor's `ShapeNic`/`ClearShape` orders on this
//!   host's NICs (apply through the `tc-htb` crate, verify by dump, pace
//!   jobs) and the shaped NICs' counters.
//! - [`hold`]: On-Ramp-style edge holding of shaped jobs' connections while
//!   the outgoing queueing to their peer is above the order's threshold.
//!
//! - [`probe`]: the probe mesh (coded probe pairs with kernel timestamps,
//!   per-pair clock estimation, one-way delays, probe evidence of dead NICs).
//! - [`rdma_events`]: RDMA port events (the `rdma` crate's event stream,
//!   verbs backend with the `verbs` feature) into the same tracker.

pub mod agent;
pub mod config;
pub mod control;
pub mod hold;
pub mod jobs;
pub mod journal;
pub mod leader_link;
pub mod leader_term;
pub use rdma::damper;
pub mod link;
pub mod outbox;
pub mod probe;
pub mod rdma_events;
pub mod reroute;
pub mod shaping;
pub mod store_format;
