//! What the leader orders an agent to do ([`Order`]) and how an order
//! ended ([`OrderOutcome`]).

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::v1;

use super::error::BorderError;

/// A `TailLog` query's order id has this bit set: a query, not an intent
/// (the agent answers it with `Agent.LogTail` and remembers nothing).
pub const QUERY_BIT: u64 = 1 << 63;

/// Most routes one `Reroute` order may carry (in its set, and in each
/// NIC's standby set).
pub const MAX_REROUTES: usize = 1024;

/// Most NICs one `Reroute` order may give standby sets for.
pub const MAX_STANDBY_NICS: usize = 32;

/// Most routes all of one `Reroute` order's standby sets may carry together.
pub const MAX_STANDBY_ROUTES: usize = 4 * MAX_REROUTES;

/// One detour route: `dst/32 via via dev dev`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RouteVia {
    /// The address to reach (a NIC address whose NIC is down).
    pub dst: Ipv4Addr,
    /// The next hop: the backup NIC's address on that host.
    pub via: Ipv4Addr,
    /// This host's NIC on the backup's rail.
    pub dev: String,
}

/// The detours a host adds by itself, at once, should `nic` go down (the
/// reflex): its peers' addresses on `nic`'s rail via their addresses on
/// the backup's rail.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Standby {
    /// This host's NIC.
    pub nic: String,
    /// The routes to add when it goes down (sorted, one per destination).
    pub routes: Vec<RouteVia>,
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
    /// Make railguard's detour routes on the host exactly `routes` (sorted,
    /// no duplicates; empty removes them all), and keep `standby` for the
    /// reflex.
    Reroute {
        /// The whole desired set.
        routes: Vec<RouteVia>,
        /// Per NIC (sorted by NIC, each at most once): the routes to add
        /// at once should it go down.
        standby: Vec<Standby>,
    },
    /// A query (its id has [`QUERY_BIT`]): the end of a rank's log, or
    /// (`from`) the bytes after an offset of one incarnation's log.
    TailLog {
        /// The job.
        job: String,
        /// The rank.
        rank: u32,
        /// Most bytes to return.
        max_bytes: u32,
        /// Read on from (incarnation, byte offset) instead of the end.
        from: Option<(u64, u64)>,
    },
    /// An admin's failover (`railguard nic failover`): move the
    /// connections on `nic` to `to`, and hold `nic` out of service for
    /// connections (as of Raft log index `version`) until an admin's
    /// failback: automatic failback does not undo it. (Variants are only
    /// ever added last: the agent's order log keeps its bincode.)
    HoldOut {
        /// The NIC to leave and hold.
        nic: String,
        /// The NIC to move to.
        to: String,
        /// The Raft log index of the admin's command.
        version: u64,
    },
    /// An admin's failback (`railguard nic failback`): `nic` is back in
    /// service as of Raft log index `version`; move connections back to it.
    Release {
        /// The NIC to return to.
        nic: String,
        /// The Raft log index of the admin's command.
        version: u64,
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
            Order::HoldOut { nic, to, version } => {
                format!("failover {nic} -> {to}, {nic} held out of service as of {version}")
            }
            Order::Release { nic, version } => {
                format!("failback -> {nic}, back in service as of {version}")
            }
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
            Order::Reroute { routes, standby } => format!(
                "reroute: {} detour route(s), standby for {} NIC(s), #{:016x}",
                routes.len(),
                standby.len(),
                fnv1a(format!("{routes:?}{standby:?}").as_bytes())
            ),
            Order::TailLog {
                job,
                rank,
                max_bytes,
                from: None,
            } => format!("tail log of job {job} rank {rank} ({max_bytes} bytes)"),
            Order::TailLog {
                job,
                rank,
                max_bytes,
                from: Some((inc, off)),
            } => format!(
                "read log of job {job} rank {rank} incarnation {inc} from byte {off} ({max_bytes} bytes)"
            ),
        }
    }

    /// The wire form with its id.
    pub fn to_wire(&self, order_id: u64) -> v1::AgentOrder {
        use v1::agent_order::Kind;
        let kind = match self.clone() {
            Order::Failover { nic, to } => Kind::Failover(v1::NicFailover {
                nic,
                to,
                hold_version: 0,
            }),
            Order::Failback { nic } => Kind::Failback(v1::NicFailback {
                nic,
                release_version: 0,
            }),
            Order::HoldOut { nic, to, version } => Kind::Failover(v1::NicFailover {
                nic,
                to,
                hold_version: version,
            }),
            Order::Release { nic, version } => Kind::Failback(v1::NicFailback {
                nic,
                release_version: version,
            }),
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
            Order::Reroute { routes, standby } => Kind::Reroute(v1::Reroute {
                routes: routes_to_wire(routes),
                standby: standby
                    .into_iter()
                    .map(|s| v1::Standby {
                        nic: s.nic,
                        routes: routes_to_wire(s.routes),
                    })
                    .collect(),
            }),
            Order::TailLog {
                job,
                rank,
                max_bytes,
                from,
            } => Kind::TailLog(v1::TailLog {
                job,
                rank,
                max_bytes,
                from_offset: from.map(|(_, o)| o),
                incarnation: from.map_or(0, |(i, _)| i),
            }),
        };
        v1::AgentOrder {
            order_id,
            term: 0,
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
            Kind::Failover(f) if f.hold_version != 0 => Order::HoldOut {
                nic: f.nic.clone(),
                to: f.to.clone(),
                version: f.hold_version,
            },
            Kind::Failover(f) => Order::Failover {
                nic: f.nic.clone(),
                to: f.to.clone(),
            },
            Kind::Failback(f) if f.release_version != 0 => Order::Release {
                nic: f.nic.clone(),
                version: f.release_version,
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
            Kind::Reroute(r) => reroute_from_wire(o.order_id, r)?,
            Kind::TailLog(t) => Order::TailLog {
                job: t.job.clone(),
                rank: t.rank,
                max_bytes: t.max_bytes,
                from: t.from_offset.map(|o| (t.incarnation, o)),
            },
        })
    }
}

fn routes_to_wire(routes: Vec<RouteVia>) -> Vec<v1::RouteVia> {
    routes
        .into_iter()
        .map(|r| v1::RouteVia {
            dst: r.dst.to_string(),
            via: r.via.to_string(),
            dev: r.dev,
        })
        .collect()
}

/// Whether `s` can name a NIC: 1..=15 bytes without `/`, whitespace or
/// control characters.
fn nic_name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 15
        && !s.contains('/')
        && !s.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// A wire `Reroute`, checked: at most [`MAX_REROUTES`] routes in the set
/// and in each standby set, at most [`MAX_STANDBY_NICS`] standby sets
/// holding at most [`MAX_STANDBY_ROUTES`] routes together, each NIC at
/// most once; IPv4 addresses and NIC names. Sets come out sorted without
/// duplicates.
fn reroute_from_wire(order_id: u64, r: &v1::Reroute) -> Result<Order, BorderError> {
    let bad = |why: String| BorderError::BadReroute { order_id, why };
    if r.standby.len() > MAX_STANDBY_NICS {
        return Err(bad(format!(
            "standby sets for {} NICs (at most {MAX_STANDBY_NICS})",
            r.standby.len()
        )));
    }
    let total: usize = r.standby.iter().map(|s| s.routes.len()).sum();
    if total > MAX_STANDBY_ROUTES {
        return Err(bad(format!(
            "{total} standby routes (at most {MAX_STANDBY_ROUTES})"
        )));
    }
    let routes = routes_from_wire(&r.routes, "routes").map_err(&bad)?;
    let mut standby = Vec::with_capacity(r.standby.len());
    for s in &r.standby {
        if !nic_name_ok(&s.nic) {
            return Err(bad(format!("standby NIC {:?} is not a NIC name", s.nic)));
        }
        let routes =
            routes_from_wire(&s.routes, &format!("standby routes of {}", s.nic)).map_err(&bad)?;
        standby.push(Standby {
            nic: s.nic.clone(),
            routes,
        });
    }
    standby.sort();
    if let Some(w) = standby.windows(2).find(|w| w[0].nic == w[1].nic) {
        return Err(bad(format!("two standby sets for NIC {}", w[0].nic)));
    }
    Ok(Order::Reroute { routes, standby })
}

/// One list of wire routes, checked (see [`reroute_from_wire`]).
fn routes_from_wire(wire: &[v1::RouteVia], what: &str) -> Result<Vec<RouteVia>, String> {
    if wire.len() > MAX_REROUTES {
        return Err(format!("{} {what} (at most {MAX_REROUTES})", wire.len()));
    }
    let mut out = Vec::with_capacity(wire.len());
    for w in wire {
        let addr = |which: &str, s: &str| {
            s.parse::<Ipv4Addr>()
                .map_err(|_| format!("route {which} {s:?} is not an IPv4 address"))
        };
        let (dst, via) = (addr("destination", &w.dst)?, addr("next hop", &w.via)?);
        if !nic_name_ok(&w.dev) {
            return Err(format!("route device {:?} is not a NIC name", w.dev));
        }
        out.push(RouteVia {
            dst,
            via,
            dev: w.dev.clone(),
        });
    }
    out.sort();
    out.dedup();
    Ok(out)
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
