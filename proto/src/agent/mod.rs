//! The agent↔supervisor border in plain Rust types: what an agent reports
//! ([`Report`]: a NIC's state, a connection's placement, a reflex, a rank's
//! exit or checkpoint), what the leader orders it to do ([`Order`]), and how
//! an order ended ([`OrderOutcome`]), with the conversions to and from the
//! protobuf messages in [`crate::v1`].
//!
//! Both sides parse a wire message into one of these types at the border
//! and nothing past it parses strings for meaning: a checkpoint's step is a
//! field of [`OrderOutcome::Checkpointed`] (and of `OrderResult`), not text
//! in a detail.
//!
//! The types derive serde and are bincode-safe (externally tagged enums,
//! no `#[serde(default)]`): the agent keeps them in its sled database (the
//! outbox holds [`Report`]s, the order log [`Order`]s and
//! [`OrderOutcome`]s) and the supervisor's Raft log carries [`Report`]s.
//! Their variant and field order is their on-disk layout: append only.
//!
//! Conversions from the wire validate and never panic: an order without a
//! kind, an unknown NIC state, or a failed result that claims a checkpoint
//! step is a [`BorderError`].

mod error;
mod nic;
mod order;
mod report;

pub use error::BorderError;
pub use nic::{NicHealth, NicReport};
pub use order::{
    Order, OrderOutcome, RouteVia, Standby, MAX_REROUTES, MAX_STANDBY_NICS, MAX_STANDBY_ROUTES,
    QUERY_BIT,
};
pub use report::{
    ConnStallReport, QpReport, RankCheckpointReport, RankExitReport, ReflexReport, Report,
};

#[cfg(test)]
mod tests;
