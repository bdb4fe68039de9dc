//! What agents report (sequence-numbered events) and the cluster event log.

use crate::model::admin::AdminAction;
use crate::model::hosts::{ClockState, Liveness, NicState};
use crate::model::incidents::IncidentKind;
use crate::model::intents::{Action, Outcome};
use crate::model::jobs::types::JobState;
use proto::agent::Report;
use serde::{Deserialize, Serialize};

/// One agent report with its per-agent sequence number (the report is the
/// border type, [`proto::agent::Report`], as the agent stored and sent it).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AgentEvent {
    pub seq: u64,
    pub report: Report,
}

/// A line of the cluster's event log (`railguard events`): a typed
/// [`Event`] and the line it renders to (`what`, for people; code that acts
/// on events matches on `event`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ClusterEvent {
    pub seq: u64,
    pub at_ms: u64,
    pub host: Option<String>,
    /// The line `railguard events` shows (rendered from `event`).
    pub what: String,
    /// What happened, typed.
    pub event: Event,
    /// For events an agent reported: when the agent observed it (its wall
    /// clock, Unix ns).
    pub observed_unix_ns: Option<u64>,
}

/// What happened. Every line of the event log is one of these; its
/// `Display` is the line people read.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub enum Event {
    /// A host registered for the first time and joined the probe graph.
    HostRegistered {
        nics: u32,
        probe_id: u32,
        edges_added: u32,
        edges_split: u32,
    },
    /// A known host registered again with something changed.
    HostReRegistered,
    /// An admin operation was applied (`what`: its one-line effect).
    Admin {
        action: AdminAction,
        what: String,
        by: String,
    },
    /// An admin dropped a host's desired shapes.
    ShapesCleared {
        dropped: u64,
        to_remove: u64,
        by: String,
    },
    /// The leader's detector changed a host's liveness.
    Liveness { from: Liveness, to: Liveness },
    /// Who handles a host that went Down (`None`: no playbook does).
    HostDownHandled { playbook: Option<String> },
    /// A host's committed clock state changed.
    Clock {
        from: ClockState,
        to: ClockState,
        offset_ns: Option<f64>,
        error_bound_ns: Option<f64>,
    },
    /// An agent's full outbox folded transitions of a NIC into one.
    NicCoalesced { nic: String, transitions: u32 },
    /// A NIC's link went up or down.
    NicLink {
        nic: String,
        up: bool,
        /// Down because probes stopped crossing a link that said up.
        probes_lost: bool,
        from: NicState,
        to: NicState,
    },
    /// A NIC's state changed without a link change (damping, recovery).
    NicState {
        nic: String,
        from: NicState,
        to: NicState,
    },
    /// An agent restarted and the host's connection placements were
    /// forgotten.
    AgentRestarted { placements_forgotten: u64 },
    /// An agent's reflex moved connections off a NIC that went down.
    Reflex {
        nic: String,
        conns: u32,
        ok: bool,
        detail: String,
    },
    /// A connection placement was not recorded: the host is at its bound.
    QpNotRecorded {
        job: String,
        rank: u32,
        conn_id: u64,
        limit: u64,
    },
    /// An intent was recorded.
    IntentOpened { id: u64, action: Action },
    /// An intent ended (the generic line; drains and failovers have their
    /// own).
    IntentClosed { id: u64, outcome: Outcome },
    /// A drain completed.
    Drained { intent: u64 },
    /// An agent moved a NIC's connections to another NIC.
    FailoverDone {
        intent: u64,
        nic: String,
        to: String,
        detail: String,
    },
    /// An agent moved connections back to their home NIC.
    FailbackDone {
        intent: u64,
        nic: String,
        detail: String,
    },
    /// An incident opened.
    IncidentOpened { id: u64, kind: IncidentKind },
    /// An incident closed.
    IncidentClosed {
        id: u64,
        kind: IncidentKind,
        why: String,
    },
    /// A job's incarnation was placed.
    JobPlaced {
        job: String,
        incarnation: u64,
        hosts: Vec<String>,
        resume_step: u64,
    },
    /// A job reached a final state other than success.
    JobEnded {
        job: String,
        state: JobState,
        reason: String,
    },
    /// A job's incarnation was stopped to be placed again.
    JobRestarting {
        job: String,
        incarnation: u64,
        planned: bool,
        restarts: u32,
        reason: String,
    },
    /// A rank exited (`current`: of the running incarnation).
    RankEnded {
        job: String,
        incarnation: u64,
        rank: u32,
        exit: String,
        current: bool,
    },
    /// Every rank of a job exited 0.
    JobSucceeded { job: String },
    /// Every rank reported its part of the checkpoint at `step`.
    CheckpointComplete { job: String, step: u64 },
    /// A playbook run's log line.
    Run { run: u64, line: String },
    /// A playbook's `notify` step.
    Notify { message: String },
    /// A playbook installed desired shapes for a link incident.
    Reshaping {
        incident: u64,
        summary: String,
        kept: u64,
    },
    /// A link incident whose run completed stays open until its link is
    /// quiet.
    LinkIncidentStays { incident: u64 },
    /// A new cluster's install of the shipped playbooks: how many were
    /// stored (0: all were stored already, or the set did not validate).
    ShippedPlaybooks { installed: u32, what: String },
    /// A NIC incident whose run completed stays open until its NIC is up.
    NicIncidentStays { incident: u64 },
    /// A `host_cut_off` incident's run completed while the host is still
    /// cut off: the incident stays open until a data rail works again.
    HostIncidentStays { incident: u64 },
    /// A `no_common_rail` incident's run completed while its two hosts
    /// still share no working rail: it stays open until they do.
    PathIncidentStays { incident: u64 },
    /// A rank said one of its connections has had no path for a while.
    ConnStalled { job: String, what: String },
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Event::HostRegistered {
                nics,
                probe_id,
                edges_added,
                edges_split,
            } => write!(
                f,
                "host registered with {nics} NICs (probe id {probe_id}; probe graph: {edges_added} edges added, {edges_split} split)"
            ),
            Event::HostReRegistered => f.write_str("host re-registered"),
            Event::Admin { what, by, .. } => write!(f, "{what} (by {by})"),
            Event::ShapesCleared {
                dropped,
                to_remove,
                by,
            } => write!(
                f,
                "shapes cleared: {dropped} desired dropped, {to_remove} to remove (by {by})"
            ),
            Event::Liveness { from, to } => write!(f, "host {from:?} -> {to:?}"),
            Event::HostDownHandled { playbook: Some(p) } => {
                write!(f, "host_down handled by playbook {p}")
            }
            Event::HostDownHandled { playbook: None } => {
                f.write_str("no playbook handles host_down: its jobs wait for an operator")
            }
            Event::Clock {
                from,
                to,
                offset_ns,
                error_bound_ns,
            } => {
                write!(f, "clock {from:?} -> {to:?}")?;
                match (offset_ns, error_bound_ns) {
                    (Some(o), Some(b)) => write!(f, " (offset {o:.0} ns ± {b:.0} ns)"),
                    _ => Ok(()),
                }
            }
            Event::NicCoalesced { nic, transitions } => write!(
                f,
                "NIC {nic}: {transitions} transitions coalesced by the agent's full outbox"
            ),
            Event::NicLink {
                nic,
                up,
                probes_lost,
                from,
                to,
            } => {
                let link = match (up, probes_lost) {
                    (true, _) => "up",
                    (false, false) => "down",
                    (false, true) => "down (probes lost)",
                };
                write!(f, "NIC {nic}: link {link} ({from:?} -> {to:?})")
            }
            Event::NicState { nic, from, to } => write!(f, "NIC {nic}: {from:?} -> {to:?}"),
            Event::AgentRestarted {
                placements_forgotten,
            } => write!(
                f,
                "agent restarted: {placements_forgotten} connection placements forgotten until their jobs register again"
            ),
            Event::Reflex {
                nic,
                conns,
                ok,
                detail,
            } => {
                let how = if *ok { "done" } else { "failed" };
                write!(
                    f,
                    "reflex: NIC {nic} down, {conns} connections ordered off it: {how}: {detail}"
                )
            }
            Event::QpNotRecorded {
                job,
                rank,
                conn_id,
                limit,
            } => write!(
                f,
                "connection {job}/{rank}/{conn_id} not recorded: the host already has {limit}"
            ),
            Event::IntentOpened { id, action } => write!(f, "intent {id} opened: {action}"),
            Event::IntentClosed { id, outcome } => write!(f, "intent {id} closed: {outcome}"),
            Event::Drained { intent } => write!(f, "drained (intent {intent})"),
            Event::FailoverDone {
                intent,
                nic,
                to,
                detail,
            } => write!(
                f,
                "failover of NIC {nic} to {to} done (intent {intent}): {detail}"
            ),
            Event::FailbackDone {
                intent,
                nic,
                detail,
            } => write!(f, "failback to NIC {nic} done (intent {intent}): {detail}"),
            Event::IncidentOpened { id, kind } => write!(f, "incident {id} opened: {kind}"),
            Event::IncidentClosed { id, kind, why } => {
                write!(f, "incident {id} ({kind}) closed: {why}")
            }
            Event::JobPlaced {
                job,
                incarnation,
                hosts,
                resume_step,
            } => {
                write!(
                    f,
                    "job {job} incarnation {incarnation} placed on {} (resuming from ",
                    hosts.join(",")
                )?;
                match resume_step {
                    0 => f.write_str("scratch)"),
                    s => write!(f, "step {s})"),
                }
            }
            Event::JobEnded { job, state, reason } => write!(f, "job {job} {state:?}: {reason}"),
            Event::JobRestarting {
                job,
                incarnation,
                planned,
                restarts,
                reason,
            } => write!(
                f,
                "job {job} incarnation {incarnation} stopped for a restart{} (restarts {restarts}): {reason}",
                if *planned { " (planned)" } else { "" }
            ),
            Event::RankEnded {
                job,
                incarnation,
                rank,
                exit,
                current,
            } => {
                write!(f, "job {job} incarnation {incarnation} rank {rank} ended: {exit}")?;
                if !current {
                    f.write_str(" (not the current incarnation)")?;
                }
                Ok(())
            }
            Event::JobSucceeded { job } => write!(f, "job {job} succeeded"),
            Event::CheckpointComplete { job, step } => {
                write!(f, "job {job}: checkpoint at step {step} complete")
            }
            Event::Run { run, line } => write!(f, "run {run}: {line}"),
            Event::Notify { message } => write!(f, "notify: {message}"),
            Event::Reshaping {
                incident,
                summary,
                kept,
            } => write!(
                f,
                "reshaping for incident {incident}: {summary} ({kept} NICs kept for other incidents)"
            ),
            Event::LinkIncidentStays { incident } => write!(
                f,
                "incident {incident} stays open until its link is quiet (the contention detector closes it)"
            ),
            Event::ShippedPlaybooks { what, .. } => f.write_str(what),
            Event::NicIncidentStays { incident } => write!(
                f,
                "incident {incident} stays open until its NIC is up again (its recovery closes it)"
            ),
            Event::HostIncidentStays { incident } => write!(
                f,
                "incident {incident} stays open until a data rail of its host works again"
            ),
            Event::PathIncidentStays { incident } => write!(
                f,
                "incident {incident} stays open until its two hosts share a working rail again"
            ),
            Event::ConnStalled { job, what } => write!(f, "job {job}: {what}"),
        }
    }
}
