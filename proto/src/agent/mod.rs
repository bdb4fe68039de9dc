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

use serde::{Deserialize, Serialize};

use crate::v1;

mod report;

pub use report::{QpReport, RankCheckpointReport, RankExitReport, ReflexReport, Report};

/// A `TailLog` query's order id has this bit set: a query, not an intent
/// (the agent answers it with `Agent.LogTail` and remembers nothing).
pub const QUERY_BIT: u64 = 1 << 63;

/// A wire message that does not make a valid border value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BorderError {
    /// An `AgentOrder` without a kind (or of a kind this side does not
    /// know: protobuf drops unknown oneof members).
    #[error("order {order_id} has no kind this agent knows")]
    NoOrderKind {
        /// The order's id.
        order_id: u64,
    },
    /// A `NicStateChange` whose state is unspecified or out of range.
    #[error("NIC {nic}: state {state} is not a NIC state")]
    BadNicState {
        /// The NIC the report is about.
        nic: String,
        /// The raw enum value received.
        state: i32,
    },
    /// An `AgentEvent` without a kind (or of a kind this side does not
    /// know).
    #[error("event {seq} has no kind this side knows")]
    NoEventKind {
        /// The event's sequence number.
        seq: u64,
    },
    /// A NIC report whose damping penalty is negative, NaN or infinite.
    #[error("NIC {nic}: damping penalty {penalty} is not a finite number >= 0")]
    BadPenalty {
        /// The NIC the report is about.
        nic: String,
        /// The penalty received.
        penalty: f64,
    },
    /// An `OrderResult` that failed (`ok` false) yet carries a checkpoint
    /// step.
    #[error("order {order_id} failed but names checkpoint step {step}")]
    StepOnFailure {
        /// The order's id.
        order_id: u64,
        /// The step it named.
        step: u64,
    },
}

/// A NIC's health as the agent's link tracker sees it (after damping).
/// The variant order is the on-disk order (bincode): append only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NicHealth {
    /// Usable.
    Up,
    /// Link down (or probes lost).
    Down,
    /// Suppressed by flap damping.
    Flapping,
    /// Up again, waiting for the damping penalty to decay.
    Recovering,
}

impl NicHealth {
    /// The protobuf enum value.
    pub fn to_wire(self) -> v1::NicState {
        match self {
            NicHealth::Up => v1::NicState::Up,
            NicHealth::Down => v1::NicState::Down,
            NicHealth::Flapping => v1::NicState::Flapping,
            NicHealth::Recovering => v1::NicState::Recovering,
        }
    }

    /// From the protobuf enum value; `None` for unspecified or unknown.
    pub fn from_wire(state: i32) -> Option<NicHealth> {
        match v1::NicState::try_from(state).ok()? {
            v1::NicState::Up => Some(NicHealth::Up),
            v1::NicState::Down => Some(NicHealth::Down),
            v1::NicState::Flapping => Some(NicHealth::Flapping),
            v1::NicState::Recovering => Some(NicHealth::Recovering),
            v1::NicState::Unspecified => None,
        }
    }
}

/// One report about a NIC (a `NicStateChange` event).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NicReport {
    /// The NIC's name.
    pub nic: String,
    /// Its health after damping.
    pub health: NicHealth,
    /// The link itself is up (independent of damping).
    pub link_up: bool,
    /// The kernel's carrier up+down counter.
    pub carrier_changes: u64,
    /// Flaps counted by the damper.
    pub flaps: u32,
    /// The damping penalty.
    pub penalty: f64,
    /// When the agent observed it (ns since the Unix epoch).
    pub at_unix_ns: u64,
    /// Transitions folded into this report because the outbox was full.
    pub coalesced: u32,
    /// Down because probes stopped crossing it while the link said up.
    pub probes_lost: bool,
}

impl NicReport {
    /// The wire form (the event's time travels in `AgentEvent`).
    pub fn to_wire(&self) -> v1::NicStateChange {
        v1::NicStateChange {
            nic: self.nic.clone(),
            state: self.health.to_wire() as i32,
            carrier_changes: self.carrier_changes,
            flaps: self.flaps,
            damping_penalty: self.penalty,
            coalesced: self.coalesced,
            link_up: self.link_up,
            probes_lost: self.probes_lost,
        }
    }

    /// From the wire, with the event's time.
    pub fn from_wire(m: &v1::NicStateChange, at_unix_ns: u64) -> Result<NicReport, BorderError> {
        let health = NicHealth::from_wire(m.state).ok_or_else(|| BorderError::BadNicState {
            nic: m.nic.clone(),
            state: m.state,
        })?;
        if !m.damping_penalty.is_finite() || m.damping_penalty < 0.0 {
            return Err(BorderError::BadPenalty {
                nic: m.nic.clone(),
                penalty: m.damping_penalty,
            });
        }
        Ok(NicReport {
            nic: m.nic.clone(),
            health,
            link_up: m.link_up,
            carrier_changes: m.carrier_changes,
            flaps: m.flaps,
            penalty: m.damping_penalty,
            at_unix_ns,
            coalesced: m.coalesced,
            probes_lost: m.probes_lost,
        })
    }
}

/// What the leader orders an agent to do (one `AgentOrder`'s kind). Two
/// orders are the same order exactly when they are equal: an agent that
/// gets an id again compares the orders, not descriptions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Order {
    /// Move the connections on `nic` to `to`.
    Failover {
        /// The NIC to leave.
        nic: String,
        /// The NIC to move to.
        to: String,
    },
    /// Move connections back to `nic`.
    Failback {
        /// The NIC to return to.
        nic: String,
    },
    /// Launch one rank of a job.
    StartRank(v1::StartRank),
    /// Stop the job's ranks of incarnation <= `incarnation`.
    StopJob {
        /// The job.
        job: String,
        /// The highest incarnation stopped.
        incarnation: u64,
    },
    /// Checkpoint the job's ranks of `incarnation` (and halt them).
    CheckpointJob {
        /// The job.
        job: String,
        /// The incarnation ordered.
        incarnation: u64,
        /// Compute nothing after the checkpoint until stopped.
        halt: bool,
    },
    /// Replace the shaping on a NIC.
    ShapeNic(v1::ShapeNic),
    /// Remove the shaping on `nic`.
    ClearShape {
        /// The NIC.
        nic: String,
    },
    /// A query (its id has [`QUERY_BIT`]): the end of a rank's log.
    TailLog {
        /// The job.
        job: String,
        /// The rank.
        rank: u32,
        /// Most bytes to return.
        max_bytes: u32,
    },
}

impl Order {
    /// A query answered with `Agent.LogTail`, never logged or deduplicated.
    pub fn is_query(&self) -> bool {
        matches!(self, Order::TailLog { .. })
    }

    /// A stable one-line description for logs and the execution journal.
    pub fn describe(&self) -> String {
        match self {
            Order::Failover { nic, to } => format!("failover {nic} -> {to}"),
            Order::Failback { nic } => format!("failback -> {nic}"),
            Order::StartRank(s) => format!(
                "start job {} incarnation {} rank {}",
                s.job, s.incarnation, s.rank
            ),
            Order::StopJob { job, incarnation } => {
                format!("stop job {job} through incarnation {incarnation}")
            }
            Order::CheckpointJob {
                job,
                incarnation,
                halt,
            } => format!(
                "checkpoint job {job} incarnation {incarnation}{}",
                if *halt { " and halt" } else { "" }
            ),
            Order::ShapeNic(s) => format!(
                "shape {}: {} classes, {} paced jobs, #{:016x}",
                s.nic,
                s.classes.len(),
                s.pace.len(),
                fnv1a(format!("{s:?}").as_bytes())
            ),
            Order::ClearShape { nic } => format!("clear shaping on {nic}"),
            Order::TailLog {
                job,
                rank,
                max_bytes,
            } => format!("tail log of job {job} rank {rank} ({max_bytes} bytes)"),
        }
    }

    /// The wire form with its id.
    pub fn to_wire(&self, order_id: u64) -> v1::AgentOrder {
        use v1::agent_order::Kind;
        let kind = match self.clone() {
            Order::Failover { nic, to } => Kind::Failover(v1::NicFailover { nic, to }),
            Order::Failback { nic } => Kind::Failback(v1::NicFailback { nic }),
            Order::StartRank(s) => Kind::StartRank(s),
            Order::StopJob { job, incarnation } => Kind::StopJob(v1::StopJob { job, incarnation }),
            Order::CheckpointJob {
                job,
                incarnation,
                halt,
            } => Kind::CheckpointJob(v1::CheckpointJob {
                job,
                incarnation,
                halt,
            }),
            Order::ShapeNic(s) => Kind::ShapeNic(s),
            Order::ClearShape { nic } => Kind::ClearShape(v1::ClearShape { nic }),
            Order::TailLog {
                job,
                rank,
                max_bytes,
            } => Kind::TailLog(v1::TailLog {
                job,
                rank,
                max_bytes,
            }),
        };
        v1::AgentOrder {
            order_id,
            kind: Some(kind),
        }
    }
}

impl TryFrom<&v1::AgentOrder> for Order {
    type Error = BorderError;

    fn try_from(o: &v1::AgentOrder) -> Result<Order, BorderError> {
        use v1::agent_order::Kind;
        let kind = o.kind.as_ref().ok_or(BorderError::NoOrderKind {
            order_id: o.order_id,
        })?;
        Ok(match kind {
            Kind::Failover(f) => Order::Failover {
                nic: f.nic.clone(),
                to: f.to.clone(),
            },
            Kind::Failback(f) => Order::Failback { nic: f.nic.clone() },
            Kind::StartRank(s) => Order::StartRank(s.clone()),
            Kind::StopJob(s) => Order::StopJob {
                job: s.job.clone(),
                incarnation: s.incarnation,
            },
            Kind::CheckpointJob(c) => Order::CheckpointJob {
                job: c.job.clone(),
                incarnation: c.incarnation,
                halt: c.halt,
            },
            Kind::ShapeNic(s) => Order::ShapeNic(s.clone()),
            Kind::ClearShape(c) => Order::ClearShape { nic: c.nic.clone() },
            Kind::TailLog(t) => Order::TailLog {
                job: t.job.clone(),
                rank: t.rank,
                max_bytes: t.max_bytes,
            },
        })
    }
}

/// How an order ended, as the agent answers it (`OrderResult`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum OrderOutcome {
    /// Carried out.
    Done {
        /// What was done, for people and logs.
        detail: String,
    },
    /// A checkpoint order: every rank checkpointed at `step`.
    Checkpointed {
        /// The step of the checkpoint.
        step: u64,
        /// The ranks' answer, for people and logs.
        detail: String,
    },
    /// Not carried out (or only in part).
    Failed {
        /// Why.
        error: String,
    },
}

impl OrderOutcome {
    /// Whether the order succeeded.
    pub fn ok(&self) -> bool {
        !matches!(self, OrderOutcome::Failed { .. })
    }

    /// The text for people and logs (the detail, or the error).
    pub fn detail(&self) -> &str {
        match self {
            OrderOutcome::Done { detail } | OrderOutcome::Checkpointed { detail, .. } => detail,
            OrderOutcome::Failed { error } => error,
        }
    }

    /// The checkpoint step, for [`OrderOutcome::Checkpointed`].
    pub fn step(&self) -> Option<u64> {
        match self {
            OrderOutcome::Checkpointed { step, .. } => Some(*step),
            _ => None,
        }
    }

    /// The wire form for order `order_id` of `host`.
    pub fn to_wire(&self, host: &str, order_id: u64) -> v1::OrderResult {
        v1::OrderResult {
            host: host.to_owned(),
            order_id,
            ok: self.ok(),
            detail: self.detail().to_owned(),
            checkpoint_step: self.step(),
        }
    }
}

impl TryFrom<&v1::OrderResult> for OrderOutcome {
    type Error = BorderError;

    /// A success without `checkpoint_step` is [`OrderOutcome::Done`]:
    /// nothing reads a step out of the detail.
    fn try_from(r: &v1::OrderResult) -> Result<OrderOutcome, BorderError> {
        Ok(match (r.ok, r.checkpoint_step) {
            (true, None) => OrderOutcome::Done {
                detail: r.detail.clone(),
            },
            (true, Some(step)) => OrderOutcome::Checkpointed {
                step,
                detail: r.detail.clone(),
            },
            (false, None) => OrderOutcome::Failed {
                error: r.detail.clone(),
            },
            (false, Some(step)) => {
                return Err(BorderError::StepOnFailure {
                    order_id: r.order_id,
                    step,
                })
            }
        })
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests;
