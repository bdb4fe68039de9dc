//! The resilient connection: one logical, exactly-once, in-order message
//! channel between two ranks over an ordered set of rails (a local NIC and
//! the peer's address on the same rail), primary first.
//!
//! At any moment at most one *path* (a soft QP: a NIC-bound TCP connection,
//! see [`crate::soft`]) carries the frames of [`crate::seq`]. When the path
//! is lost both ends move to another rail and carry on where they were: the
//! side that opens the new path sends a `Hello` with a higher *epoch* and
//! the sequence it delivered through, the other side answers with its own,
//! and each replays what the other has not delivered from its bounded send
//! window. Nothing is lost, duplicated or reordered, across any number of
//! migrations.
//!
//! **Triggers.** A local link-down (the endpoint's link state, fed by netlink
//! or RDMA port events: the reflex, no supervisor round trip), an order
//! ([`ResilientConnection::migrate`], from the agent), and transport errors
//! (the path breaks, or stays silent past `dead_after` although both sides
//! ping every `ping_interval`).
//!
//! **Who dials.** Either side may open a path; when both do at once for the
//! same epoch, side A's path wins (B accepts A's hello at an equal epoch, A
//! refuses B's), so the two always converge on one path.
//!
//! **Failback.** With [`Failback::WhenReusable`], once the primary NIC is up,
//! its flap damper says it is reusable and it has stayed up for `hold`, the
//! connection moves back to it. Arriving on a backup restarts that `hold`
//! (on both sides), so a migrate order is never undone at once. A side refuses a new path on a rail whose
//! local NIC is down or suppressed unless it has no path at all.
//!
//! **No NIC left.** Sends fill the window (bounded) and then wait; the
//! connection keeps trying every rail and resumes when one returns. After
//! `stall_timeout` without a path it fails loudly: every pending and later
//! call returns [`ConnError::NoPath`]. It never drops a message silently.
//!
//! **Pacing.** [`ResilientConnection::set_rate`] limits the bytes per second
//! the connection puts on the wire (the rate-reshaping hook).
//!
//! # Layout
//! - `config`: [`ConnConfig`] and its parts; `error`: [`ConnError`];
//!   `report`: [`ConnStats`], [`Delivery`], [`MoveReason`];
//! - `handle`: [`ResilientConnection`], [`ConnSender`], [`ConnControl`], the
//!   application's side, which talks to the task over bounded channels;
//! - `driver`: the connection's task, which decides every move;
//! - `path`: opening a path on a rail and its reader and writer tasks;
//! - `pacer`: the token bucket behind [`ResilientConnection::set_rate`].

mod config;
mod driver;
mod error;
mod handle;
mod pacer;
mod path;
mod report;

pub use config::{ConnConfig, Failback, Rail, Side};
pub use error::ConnError;
pub use handle::{ConnControl, ConnSender, ResilientConnection};
pub use report::{ConnStats, Delivery, MoveReason};
