//! What an agent reports ([`Report`], one `AgentEvent`'s kind): the agent's
//! outbox stores it, the wire carries it, the supervisor's model applies it.
//! One type on both sides, so a report changes type only at the protobuf
//! border.

use serde::{Deserialize, Serialize};

use super::error::BorderError;
use super::nic::NicReport;
use crate::v1::{self, agent_event::Kind};

/// Where a job's connection runs (or that it closed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpReport {
    /// The job.
    pub job: String,
    /// The rank that owns the connection.
    pub rank: u32,
    /// The connection's id within the rank.
    pub conn_id: u64,
    /// The NIC the connection uses now.
    pub nic: String,
    /// The host at the other end.
    pub peer_host: String,
    /// The rank at the other end.
    pub peer_rank: u32,
    /// The connection's home rail.
    pub rail: u32,
    /// The connection is off its home rail's NIC.
    pub moved: bool,
    /// The connection is gone (the fields above identify it).
    pub closed: bool,
    /// When the agent observed it (ns since the Unix epoch).
    pub at_unix_ns: u64,
}

/// The outcome of a reflex (connections ordered off a NIC that went down).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReflexReport {
    /// The NIC that went down.
    pub nic: String,
    /// Connections the order covered.
    pub conns: u32,
    /// Every connection moved.
    pub ok: bool,
    /// What happened, for people and logs.
    pub detail: String,
    /// When the agent observed it (ns since the Unix epoch).
    pub at_unix_ns: u64,
}

/// A rank the agent launched has exited.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankExitReport {
    /// The job.
    pub job: String,
    /// The job's incarnation the rank belonged to.
    pub incarnation: u64,
    /// The rank.
    pub rank: u32,
    /// The exit code (-1: killed by a signal, or unknown).
    pub exit_code: i32,
    /// The signal that ended it (0: none).
    pub signal: i32,
    /// How it ended, for people and logs.
    pub detail: String,
    /// When the agent observed it (ns since the Unix epoch).
    pub at_unix_ns: u64,
}

/// A rank said its checkpoint at `step` is durable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankCheckpointReport {
    /// The job.
    pub job: String,
    /// The job's incarnation the rank belongs to.
    pub incarnation: u64,
    /// The rank.
    pub rank: u32,
    /// The checkpoint's step.
    pub step: u64,
    /// When the agent observed it (ns since the Unix epoch).
    pub at_unix_ns: u64,
}

/// A rank's connection has had no path for a while (the job said
/// `conn_stalled`): no rail it tried reached the peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnStallReport {
    /// The job.
    pub job: String,
    /// The job's incarnation the rank belongs to.
    pub incarnation: u64,
    /// The rank that owns the connection.
    pub rank: u32,
    /// The connection's id within the rank.
    pub conn_id: u64,
    /// The host at the other end.
    pub peer_host: String,
    /// The rank at the other end.
    pub peer_rank: u32,
    /// When the agent observed it (ns since the Unix epoch).
    pub at_unix_ns: u64,
}

/// Anything an agent reports to the supervisor. The variant order is the
/// on-disk order (bincode): append only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Report {
    /// A NIC's state changed.
    Nic(NicReport),
    /// A connection's placement changed.
    Qp(QpReport),
    /// The agent started: the host's connection placements are unknown
    /// until the jobs register again.
    QpReset {
        /// When the agent started.
        at_unix_ns: u64,
    },
    /// The agent's reflex moved connections off a NIC.
    Reflex(ReflexReport),
    /// A rank the agent launched exited (or was found gone at start).
    RankExited(RankExitReport),
    /// A rank's checkpoint at a step is durable.
    RankCheckpoint(RankCheckpointReport),
    /// A rank's connection has had no path for a while.
    ConnStalled(ConnStallReport),
}

impl From<NicReport> for Report {
    fn from(r: NicReport) -> Self {
        Report::Nic(r)
    }
}

impl Report {
    /// When the agent observed it.
    pub fn at_unix_ns(&self) -> u64 {
        match self {
            Report::Nic(r) => r.at_unix_ns,
            Report::Qp(q) => q.at_unix_ns,
            Report::QpReset { at_unix_ns } => *at_unix_ns,
            Report::Reflex(r) => r.at_unix_ns,
            Report::RankExited(r) => r.at_unix_ns,
            Report::RankCheckpoint(r) => r.at_unix_ns,
            Report::ConnStalled(r) => r.at_unix_ns,
        }
    }

    /// The wire form (its time travels in `AgentEvent`).
    pub fn to_wire(&self) -> Kind {
        match self.clone() {
            Report::Nic(n) => Kind::NicState(n.to_wire()),
            Report::Qp(q) => Kind::Qp(v1::QpPlacement {
                job: q.job,
                rank: q.rank,
                conn_id: q.conn_id,
                nic: q.nic,
                peer_host: q.peer_host,
                peer_rank: q.peer_rank,
                rail: q.rail,
                moved: q.moved,
                closed: q.closed,
            }),
            Report::QpReset { .. } => Kind::QpReset(v1::QpReset {}),
            Report::Reflex(x) => Kind::Reflex(v1::ReflexDone {
                nic: x.nic,
                conns: x.conns,
                ok: x.ok,
                detail: x.detail,
            }),
            Report::RankExited(x) => Kind::RankExited(v1::RankExited {
                job: x.job,
                incarnation: x.incarnation,
                rank: x.rank,
                exit_code: x.exit_code,
                signal: x.signal,
                detail: x.detail,
            }),
            Report::RankCheckpoint(x) => Kind::RankCheckpoint(v1::RankCheckpoint {
                job: x.job,
                incarnation: x.incarnation,
                rank: x.rank,
                step: x.step,
            }),
            Report::ConnStalled(x) => Kind::ConnStalled(v1::ConnStalled {
                job: x.job,
                incarnation: x.incarnation,
                rank: x.rank,
                conn_id: x.conn_id,
                peer_host: x.peer_host,
                peer_rank: x.peer_rank,
            }),
        }
    }

    /// From an `AgentEvent`: its kind and time. Names and lengths are the
    /// receiver's to check; this refuses what no receiver could read.
    pub fn from_wire(e: &v1::AgentEvent) -> Result<Report, BorderError> {
        let at_unix_ns = e.at_unix_ns;
        let kind = e
            .kind
            .as_ref()
            .ok_or(BorderError::NoEventKind { seq: e.seq })?;
        Ok(match kind.clone() {
            Kind::NicState(n) => Report::Nic(NicReport::from_wire(&n, at_unix_ns)?),
            Kind::Qp(q) => Report::Qp(QpReport {
                job: q.job,
                rank: q.rank,
                conn_id: q.conn_id,
                nic: q.nic,
                peer_host: q.peer_host,
                peer_rank: q.peer_rank,
                rail: q.rail,
                moved: q.moved,
                closed: q.closed,
                at_unix_ns,
            }),
            Kind::QpReset(_) => Report::QpReset { at_unix_ns },
            Kind::Reflex(r) => Report::Reflex(ReflexReport {
                nic: r.nic,
                conns: r.conns,
                ok: r.ok,
                detail: r.detail,
                at_unix_ns,
            }),
            Kind::RankExited(r) => Report::RankExited(RankExitReport {
                job: r.job,
                incarnation: r.incarnation,
                rank: r.rank,
                exit_code: r.exit_code,
                signal: r.signal,
                detail: r.detail,
                at_unix_ns,
            }),
            Kind::RankCheckpoint(c) => Report::RankCheckpoint(RankCheckpointReport {
                job: c.job,
                incarnation: c.incarnation,
                rank: c.rank,
                step: c.step,
                at_unix_ns,
            }),
            Kind::ConnStalled(c) => Report::ConnStalled(ConnStallReport {
                job: c.job,
                incarnation: c.incarnation,
                rank: c.rank,
                conn_id: c.conn_id,
                peer_host: c.peer_host,
                peer_rank: c.peer_rank,
                at_unix_ns,
            }),
        })
    }

    /// The wire event: `host`'s report number `seq`.
    pub fn to_event(&self, host: &str, seq: u64) -> v1::AgentEvent {
        v1::AgentEvent {
            host: host.to_owned(),
            seq,
            at_unix_ns: self.at_unix_ns(),
            kind: Some(self.to_wire()),
        }
    }
}
