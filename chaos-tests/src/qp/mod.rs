//! Traffic over resilient connections between testbed hosts, for the
//! `qp-migrate` scenario and the `failover` benchmark.
//!
//! Each host runs its endpoint on a thread inside the host's network
//! namespace (every socket it ever opens, including the ones a migration
//! dials, belongs to that namespace). Both ends of every connection send
//! self-checking messages: an index, a CRC32 and a payload whose size and
//! bytes derive from a seed, so the receiver verifies order, completeness
//! and content without keeping a copy.
//!
//! # Layout
//! - [`traffic`]: the self-checking traffic itself ([`HostTraffic`]: one
//!   host's endpoint and its connections, optionally speaking the job
//!   contract with the host's agent), its counters and checks.
//! - [`migrate`]: the `qp-migrate` scenario and its placement checker
//!   (`qp list` matches every connection's NIC).
//! - [`failover`](mod@failover): `bench failover` (time to resume after a flap, steady
//!   throughput against TCP, the dip around a flap).

pub mod failover;
pub mod migrate;
pub mod traffic;

pub use failover::{failover, FailoverReport, FailoverRun};
pub use migrate::{qp_migrate, QpMigrateReport, QpMigrateRun};
pub use traffic::{
    drain, host_nics, join, message, spawn_in, totals, wait_established, AgentLink,
    ContractCounters, DirCounters, HostTraffic, Sizes, Totals, TrafficSpec, PORT,
};
