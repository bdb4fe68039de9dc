//! The railguard node agent (being built by the agent issue).
//!
//! # Layout
//! - [`damper`]: RFC 2439-style flap damping (`FlapDamper`).
//! - [`link`]: `LinkTracker` over rtnetlink multicast, per-NIC health.
//! - [`outbox`]: persisted, bounded, coalescing outbox of sequenced reports.
//!
//! Still to come with the agent issue: the netlink link tracker, the
//! reliable report stream and the `railguard-agent` daemon. Until then the
//! supervisor's agent API is exercised by `chaos_tests::agentsim`.

pub mod damper;
pub mod link;
pub mod outbox;
