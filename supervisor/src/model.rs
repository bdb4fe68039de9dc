//! The replicated cluster model: what every supervisor agrees on through Raft.
//!
//! Everything here is deterministic: [`ClusterState::apply`] depends only on
//! the state and the [`Proposal`] (whose timestamp the leader sets before
//! proposing), never on clocks or I/O, so every replica reaches the same state.
//!
//! Commands are validated by [`ClusterState::validate`] twice: on the leader
//! before proposing (a bad command is never written to the log) and again at
//! apply time (the state may have moved since); a command that fails either
//! check changes nothing and reports a typed [`CmdError`].

use std::collections::{BTreeMap, VecDeque};
use std::io::Cursor;

use openraft::LogId;
use serde::{Deserialize, Serialize};

use crate::probe_graph::{join_seed, ProbeGraph, PROBE_DEGREE};

/// Supervisor node id (Raft member id).
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// The Raft type configuration of the supervisor cluster.
    pub TypeConfig:
        D = Proposal,
        R = Vec<CmdResult>,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
);

/// Bound on the admin-operation history kept in the model.
pub const MAX_ADMIN_HISTORY: usize = 10_000;
/// Bound on the cluster event log kept in the model.
pub const MAX_EVENT_LOG: usize = 10_000;
/// Bound on closed incidents and intents kept in the model.
pub const MAX_CLOSED_RECORDS: usize = 10_000;
/// Bound on labels per host and on name lengths.
pub const MAX_LABELS: usize = 64;
/// Longest host, NIC, label key or label value accepted.
pub const MAX_NAME_LEN: usize = 253;
/// Longest drain reason accepted.
pub const MAX_REASON_LEN: usize = 1024;
/// Most NICs a host may register.
pub const MAX_NICS: usize = 64;
/// Most client sessions remembered (least recently used are forgotten).
pub const MAX_SESSIONS: usize = 4_096;
/// Most results remembered per client session (oldest serials forgotten).
pub const MAX_SESSION_RESULTS: usize = 64;
/// Most connection (QP) placements kept per host; further ones are not
/// recorded (an event says so).
pub const MAX_QPS_PER_HOST: usize = 4_096;
/// Most clock state changes in one `SetClockStates` command.
pub const MAX_CLOCK_CHANGES: usize = 4_096;

/// One Raft entry: a batch of commands stamped by the leader.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Proposal {
    /// Leader wall-clock time in Unix milliseconds when the batch was formed.
    pub at_ms: u64,
    /// Commands applied in order; each gets its own result.
    pub cmds: Vec<Command>,
}

/// Result of one command.
pub type CmdResult = Result<CmdOk, CmdError>;

/// A typed, validated state change.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub enum Command {
    /// An agent (re-)registers its host and NICs. Idempotent: NIC state and
    /// history survive a re-registration; NICs no longer reported are removed.
    RegisterHost {
        host: String,
        nics: Vec<NicSpec>,
        labels: BTreeMap<String, String>,
    },
    /// An admin operation, recorded with who asked for it. With a request
    /// id it is applied at most once however often it is retried (client
    /// sessions, Raft dissertation §6.3): a retry gets the first result.
    Admin {
        actor: String,
        op: AdminOp,
        request: Option<RequestId>,
    },
    /// A batch of sequence-numbered events from one agent.
    AgentEvents {
        host: String,
        events: Vec<AgentEvent>,
    },
    /// The leader's liveness detector changes a host's liveness.
    SetLiveness { host: String, liveness: Liveness },
    /// The leader's clock service commits hosts whose clock state changed
    /// (the figures alone never go through Raft). All or nothing: an
    /// unknown host refuses the whole command.
    SetClockStates { changes: Vec<ClockChange> },
    /// Record an intent (what is about to be done) before doing it.
    OpenIntent { action: Action },
    /// Record an intent's outcome and apply its effect.
    CloseIntent { id: u64, outcome: Outcome },
    /// A host's agent answers an order (a `Failover`/`Failback` intent):
    /// closes the intent Done or Failed with the agent's detail. Only the
    /// host the order was for may answer it; answering twice is a no-op.
    OrderDone {
        host: String,
        id: u64,
        ok: bool,
        detail: String,
    },
    /// A leader decision about a job (placement, restart, drain move).
    Job(JobCommand),
    /// A leader decision about playbook runs (start one for an incident).
    Playbook(RunCommand),
    /// The first leader of a new cluster installs the shipped playbooks
    /// (`playbooks::SHIPPED`) once. Files naming a playbook already stored
    /// are skipped (an admin's own version wins); a second install is a
    /// no-op.
    InstallShippedPlaybooks {
        files: Vec<crate::playbook_store::PlaybookFile>,
    },
    /// The leader's webhook sender closes a `notify` step's intent with
    /// the endpoint's answer (see `webhooks.rs`); a second answer is a
    /// no-op.
    WebhookDone { id: u64, ok: bool, detail: String },
    /// The leader's contention detector opens or closes a
    /// `link_contention` incident ([`crate::shaping`]).
    Contention(crate::shaping::ContentionCommand),
}

/// Identifies one client request across retries: the client's session id
/// (random per client instance) and a serial unique within it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RequestId {
    pub client: String,
    pub serial: u64,
    /// Set on every attempt after the first. A first attempt cannot have
    /// been applied before, so it is never refused as forgotten (requests
    /// of one session may arrive out of order when a client has several in
    /// flight).
    #[serde(default)]
    pub retry: bool,
}

/// What the model remembers of one client session.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Session {
    /// Leader time of the last request applied in this session.
    pub last_used_ms: u64,
    /// Results of the most recent requests, by serial.
    pub results: BTreeMap<u64, CmdResult>,
    /// Every serial at or below this one may have been forgotten.
    pub forgotten_through: u64,
}

/// Admin operations on hosts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum AdminOp {
    /// Mark the host unschedulable.
    Cordon {
        host: String,
    },
    /// Make the host schedulable again (not while it is draining).
    Uncordon {
        host: String,
    },
    /// Cordon, move the host's work away, then mark it Drained.
    Drain {
        host: String,
        reason: String,
        /// Unix ms after which remaining work is stopped.
        deadline_ms: Option<u64>,
    },
    /// Return a draining or drained host to service (also uncordons).
    Undrain {
        host: String,
    },
    /// Set and remove labels.
    SetLabels {
        host: String,
        set: BTreeMap<String, String>,
        remove: Vec<String>,
    },
    /// Move every connection off a NIC, to `to` (default: the NIC's backup).
    /// Opens a `Failover` intent; the leader orders the host's agent.
    NicFailover {
        host: String,
        nic: String,
        to: Option<String>,
    },
    /// Move the connections whose home is the NIC back to it (a `Failback`
    /// intent).
    NicFailback {
        host: String,
        nic: String,
    },
    /// Submit, cancel, restart or checkpoint a job.
    Job(JobOp),
    /// Store playbooks (atomically: all or none).
    PlaybookApply {
        files: Vec<crate::playbook_store::PlaybookFile>,
    },
    PlaybookDelete {
        name: String,
    },
    /// Drop every desired shape of the host; the reconciler then orders
    /// its agent to remove what it installed (the incident stays open).
    ShapeClear {
        host: String,
    },
}

impl AdminOp {
    /// One line for replies and `railguard history` (file texts and job
    /// specs are summarised, not dumped).
    pub fn summary(&self) -> String {
        match self {
            AdminOp::PlaybookApply { files } => format!(
                "playbook apply: {}",
                files
                    .iter()
                    .map(|f| f.file.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            AdminOp::PlaybookDelete { name } => format!("playbook delete {name}"),
            AdminOp::Job(JobOp::Submit { spec }) => format!(
                "job submit {} ({} ranks: {})",
                spec.name,
                spec.ranks,
                spec.command.join(" ")
            ),
            AdminOp::Job(op) => format!("job {op:?}"),
            op => format!("{op:?}"),
        }
    }

    /// The host the operation targets (none for job operations).
    pub fn host(&self) -> Option<&str> {
        match self {
            AdminOp::Cordon { host }
            | AdminOp::Uncordon { host }
            | AdminOp::Drain { host, .. }
            | AdminOp::Undrain { host }
            | AdminOp::SetLabels { host, .. }
            | AdminOp::NicFailover { host, .. }
            | AdminOp::NicFailback { host, .. }
            | AdminOp::ShapeClear { host } => Some(host),
            AdminOp::Job(_) | AdminOp::PlaybookApply { .. } | AdminOp::PlaybookDelete { .. } => {
                None
            }
        }
    }
}

/// A NIC as an agent reports it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NicSpec {
    pub name: String,
    pub rail: Option<u32>,
    pub backup: Option<String>,
    pub rdma_device: Option<String>,
    /// The NIC's IP address, where its probe socket listens (validated: it
    /// must parse as an IP address).
    pub addr: Option<String>,
}

/// A host's clock synchronisation state as the leader's clock service last
/// committed it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum ClockState {
    /// Error bound within the synced threshold (1 µs by default).
    Synced,
    /// Error bound within the degraded threshold (100 µs by default).
    Degraded,
    /// Worse, not connected to the reference, or no fresh probes.
    #[default]
    Unsynced,
}

/// The committed clock state of a host and the figures at its last change.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct HostClockRecord {
    pub state: ClockState,
    /// Offset to the reference host when the state changed (ns).
    pub offset_ns: Option<f64>,
    /// Error bound of that offset (ns).
    pub error_bound_ns: Option<f64>,
    /// Leader time of the change (Unix ms; 0: never changed).
    pub changed_ms: u64,
}

/// One host's new clock state, as the clock service commits it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ClockChange {
    pub host: String,
    pub state: ClockState,
    /// Offset to the reference host (ns), finite when present.
    pub offset_ns: Option<f64>,
    /// Its error bound (ns), finite and ≥ 0 when present.
    pub error_bound_ns: Option<f64>,
}

/// NIC health as the agent's link tracker classifies it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum NicState {
    /// No report yet.
    #[default]
    Unknown,
    Up,
    Down,
    /// Suppressed by flap damping.
    Flapping,
    /// Up again but not yet reusable.
    Recovering,
}

/// One agent event with its per-agent sequence number.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AgentEvent {
    pub seq: u64,
    pub at_unix_ns: u64,
    pub kind: AgentEventKind,
}

/// What an agent reports.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub enum AgentEventKind {
    NicState {
        nic: String,
        state: NicState,
        carrier_changes: u64,
        flaps: u32,
        damping_penalty: f64,
        /// Earlier transitions folded into this one by a full agent outbox.
        coalesced: u32,
        /// The link itself is up (independent of damping).
        link_up: bool,
        /// Down because probes stopped crossing the link while the link
        /// layer still said up.
        probes_lost: bool,
    },
    /// Where a job's connection runs (or that it closed).
    QpPlacement {
        job: String,
        rank: u32,
        conn_id: u64,
        nic: String,
        peer_host: String,
        peer_rank: u32,
        rail: u32,
        moved: bool,
        closed: bool,
    },
    /// The agent (re)started: forget the host's placements (live jobs
    /// register theirs again).
    QpReset,
    /// The agent's reflex ordered the connections off a NIC that went down.
    ReflexDone {
        nic: String,
        conns: u32,
        ok: bool,
        detail: String,
    },
    /// A rank the agent launched exited (`signal` 0: by itself).
    RankExited {
        job: String,
        incarnation: u64,
        rank: u32,
        exit_code: i32,
        signal: i32,
        detail: String,
    },
    /// A rank's checkpoint at `step` is durable.
    RankCheckpoint {
        job: String,
        incarnation: u64,
        rank: u32,
        step: u64,
    },
}

/// Things the reconciler does; each is recorded as an intent first.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    /// Finish draining a host once no work remains on it (or its deadline
    /// passed and the remaining work was stopped).
    CompleteDrain { host: String },
    /// Order the host's agent to move every connection off `nic` to `to`
    /// (resolved when the intent opens: `--to` or the NIC's backup).
    Failover {
        host: String,
        nic: String,
        to: String,
    },
    /// Order the host's agent to move connections whose home is `nic` back.
    Failback { host: String, nic: String },
    /// Order the host's agent to launch one rank of a job's incarnation.
    StartRank {
        job: String,
        incarnation: u64,
        rank: u32,
        host: String,
    },
    /// Order the host's agent to stop the job's ranks of this incarnation
    /// and older ones.
    StopJob {
        job: String,
        incarnation: u64,
        host: String,
    },
    /// Order the host's ranks of the incarnation to checkpoint (with
    /// `halt`: and compute nothing more).
    CheckpointJob {
        job: String,
        incarnation: u64,
        host: String,
        halt: bool,
    },
    /// One attempt of a playbook run's step ([`crate::runs`]): opened by
    /// the run in apply (never proposed on its own), with the operation
    /// resolved when the attempt started. `Failover`/`Failback` operations
    /// are orders to the host's agent, by intent id like the admin ones.
    PlaybookStep {
        run: u64,
        step: u32,
        attempt: u32,
        host: String,
        op: StepOp,
    },
    /// Order the host's agent to install the desired shape `version` on
    /// `nic` ([`crate::shaping`]).
    ShapeNic {
        host: String,
        nic: String,
        version: u64,
    },
    /// Order the host's agent to remove every shape from `nic`.
    ClearShape { host: String, nic: String },
}

impl Action {
    /// The host the action concerns.
    pub fn host(&self) -> &str {
        match self {
            Action::CompleteDrain { host }
            | Action::Failover { host, .. }
            | Action::Failback { host, .. }
            | Action::StartRank { host, .. }
            | Action::StopJob { host, .. }
            | Action::CheckpointJob { host, .. }
            | Action::PlaybookStep { host, .. }
            | Action::ShapeNic { host, .. }
            | Action::ClearShape { host, .. } => host,
        }
    }

    /// Whether the action is carried out by the host's agent (an order).
    pub fn is_order(&self) -> bool {
        match self {
            Action::CompleteDrain { .. } => false,
            Action::PlaybookStep { op, .. } => op.is_order(),
            _ => true,
        }
    }

    /// The job the action concerns, if any.
    pub fn job(&self) -> Option<&str> {
        match self {
            Action::StartRank { job, .. }
            | Action::StopJob { job, .. }
            | Action::CheckpointJob { job, .. } => Some(job),
            _ => None,
        }
    }
}

/// How an intent ended.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// Nothing to do any more (e.g. the host was undrained meanwhile).
    Cancelled {
        why: String,
    },
    Failed {
        error: String,
    },
}

/// Successful command results.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub enum CmdOk {
    Done,
    /// Registration applied; the agent resends events after this sequence.
    Registered {
        last_applied_seq: u64,
    },
    /// Events applied (or already applied) through this sequence.
    Acked {
        through: u64,
    },
    /// Intent recorded (or the same action was already open under this id).
    IntentOpened {
        id: u64,
    },
    /// A playbook run started (it may have ended at once: failed guards).
    RunStarted {
        id: u64,
    },
}

/// Why a command was refused. Nothing was changed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, thiserror::Error)]
pub enum CmdError {
    #[error("{kind} {name:?} not found")]
    NotFound { kind: String, name: String },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("{0}")]
    FailedPrecondition(String),
    /// A retried request is older than what its session remembers: it may or
    /// may not have been applied.
    #[error("request {serial} of client {client:?} is too old to tell whether it was applied")]
    RequestForgotten { client: String, serial: u64 },
    /// Events must arrive in sequence; the agent resends after `acked`.
    #[error("event sequence gap for host {host:?}: expected {expected}, got {got}")]
    SequenceGap {
        host: String,
        expected: u64,
        got: u64,
        acked: u64,
    },
}

fn not_found(kind: &str, name: &str) -> CmdError {
    CmdError::NotFound {
        kind: kind.into(),
        name: name.into(),
    }
}

/// Host liveness as the leader's detector last committed it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Liveness {
    #[default]
    Ready,
    Suspect,
    Down,
}

/// Drain progress.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum DrainPhase {
    Draining,
    Drained,
}

/// An ongoing or finished drain.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Drain {
    pub phase: DrainPhase,
    pub reason: String,
    pub deadline_ms: Option<u64>,
    pub by: String,
    pub since_ms: u64,
}

/// The status shown to admins, derived from liveness, drain and cordon.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum HostStatus {
    Ready,
    Cordoned,
    Draining,
    Drained,
    Down,
}

impl std::fmt::Display for HostStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            HostStatus::Ready => "Ready",
            HostStatus::Cordoned => "Cordoned",
            HostStatus::Draining => "Draining",
            HostStatus::Drained => "Drained",
            HostStatus::Down => "Down",
        };
        f.write_str(s)
    }
}

/// A GPU host.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Host {
    pub name: String,
    /// Stable numeric id, given at first registration and never reused
    /// (the probe graph's and the clock solve's host id).
    pub id: u32,
    pub labels: BTreeMap<String, String>,
    pub nics: BTreeMap<String, Nic>,
    pub cordoned: bool,
    pub drain: Option<Drain>,
    pub liveness: Liveness,
    pub registered_ms: u64,
    /// Last agent event sequence applied for this host (exactly-once).
    pub last_event_seq: u64,
    /// The open `host_down` incident, if any.
    pub open_incident: Option<u64>,
    /// Clock synchronisation state (changes committed by the leader).
    pub clock: HostClockRecord,
    /// Left out of OWD-based (contention) decisions by a playbook's
    /// `exclude_from_owd` until an `include_in_owd`.
    #[serde(default)]
    pub owd_excluded: bool,
    /// The open `clock_unsynced` incident, if any.
    #[serde(default)]
    pub clock_incident: Option<u64>,
}

impl Host {
    /// The admin-facing status.
    pub fn status(&self) -> HostStatus {
        match (&self.liveness, &self.drain) {
            (Liveness::Down, _) => HostStatus::Down,
            (_, Some(d)) if d.phase == DrainPhase::Drained => HostStatus::Drained,
            (_, Some(_)) => HostStatus::Draining,
            _ if self.cordoned => HostStatus::Cordoned,
            _ => HostStatus::Ready,
        }
    }
}

/// A NIC of a host.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Nic {
    pub name: String,
    pub rail: Option<u32>,
    pub backup: Option<String>,
    pub rdma_device: Option<String>,
    /// IP address of the NIC's probe socket.
    pub addr: Option<String>,
    pub state: NicState,
    pub flaps: u32,
    pub damping_penalty: f64,
    pub carrier_changes: u64,
    pub last_change_ms: u64,
    /// Open incidents of this NIC by kind (index into `incidents`).
    pub open_incidents: BTreeMap<String, u64>,
    /// The link's last reported up/down (None before the first report).
    pub link_up: Option<bool>,
    /// How many link up/down changes were committed.
    pub link_transitions: u64,
}

/// One NIC report as applied.
struct NicReport {
    observed_unix_ns: u64,
    state: NicState,
    link_up: bool,
    carrier_changes: u64,
    flaps: u32,
    penalty: f64,
    probes_lost: bool,
}

pub use crate::jobs::{Job, JobCommand, JobOp, JobSpec, JobState};
pub use crate::runs::{PlaybookRun, RunCommand, RunState, StepOp};

/// Something that went wrong and may need remediation.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Incident {
    pub id: u64,
    pub kind: String,
    pub host: String,
    pub nic: Option<String>,
    pub opened_ms: u64,
    pub closed_ms: Option<u64>,
    pub detail: String,
    /// The incident's latest playbook run (none: never had one).
    #[serde(default)]
    pub run: Option<u64>,
    /// A `link_contention` incident's link, sides and evidence.
    #[serde(default)]
    pub link: Option<crate::shaping::LinkContention>,
}

/// Intent status.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum IntentStatus {
    Open,
    Closed(Outcome),
}

/// What the reconciler is about to do (or did), keyed by command id.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Intent {
    pub id: u64,
    pub action: Action,
    pub status: IntentStatus,
    pub opened_ms: u64,
    pub closed_ms: Option<u64>,
    /// What the outcome's author said (an agent's order answer).
    #[serde(default)]
    pub detail: String,
}

/// Identifies a connection on a host: job, rank, connection id.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QpKey {
    pub job: String,
    pub rank: u32,
    pub conn_id: u64,
}

/// Where a job's connection (queue pair) runs, as its host's agent reported.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Qp {
    pub job: String,
    pub rank: u32,
    pub conn_id: u64,
    /// The NIC it uses now.
    pub nic: String,
    pub peer_host: String,
    pub peer_rank: u32,
    /// Its home rail.
    pub rail: u32,
    /// Off its home rail's NIC.
    pub moved: bool,
    /// Leader time of the last NIC change (or of registration).
    pub since_ms: u64,
}

/// One admin operation as recorded (who, when, what).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AdminRecord {
    pub at_ms: u64,
    pub actor: String,
    pub op: AdminOp,
    pub log_index: u64,
}

/// A line of the cluster's event log (`railguard events`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ClusterEvent {
    pub seq: u64,
    pub at_ms: u64,
    pub host: Option<String>,
    pub what: String,
    /// For events an agent reported: when the agent observed it (its wall
    /// clock, Unix ns).
    #[serde(default)]
    pub observed_unix_ns: Option<u64>,
}

/// The whole replicated model.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ClusterState {
    pub hosts: BTreeMap<String, Host>,
    pub jobs: BTreeMap<String, Job>,
    /// Open incidents and the most recently closed ones.
    pub incidents: BTreeMap<u64, Incident>,
    /// Closed incident ids, oldest first (bounds `incidents`).
    pub closed_incidents: VecDeque<u64>,
    /// Open intents and the most recently closed ones.
    pub intents: BTreeMap<u64, Intent>,
    /// Closed intent ids, oldest first (bounds `intents`).
    pub closed_intents: VecDeque<u64>,
    pub admin_history: VecDeque<AdminRecord>,
    /// Client sessions: results of recent requests, for exactly-once retries.
    pub sessions: BTreeMap<String, Session>,
    pub events: VecDeque<ClusterEvent>,
    pub next_event_seq: u64,
    pub next_incident_id: u64,
    pub next_intent_id: u64,
    /// Jobs submitted so far (numbers jobs: their data port).
    #[serde(default)]
    pub next_job_number: u64,
    /// Stored playbooks by name.
    #[serde(default)]
    pub playbooks: BTreeMap<String, crate::playbook_store::StoredPlaybook>,
    /// Bumped whenever a playbook changes.
    #[serde(default)]
    pub playbook_version: u64,
    /// Whether the shipped playbooks were installed (once per cluster).
    #[serde(default)]
    pub shipped_playbooks_installed: bool,
    /// Playbook runs: active ones and the most recently ended.
    #[serde(default)]
    pub runs: BTreeMap<u64, PlaybookRun>,
    /// Ended run ids, oldest first (bounds `runs`).
    #[serde(default)]
    pub closed_runs: VecDeque<u64>,
    #[serde(default)]
    pub next_run_id: u64,
    /// Index of the last applied log entry (for status output).
    pub last_log_index: u64,
    /// Connection placements per host (each host bounded by
    /// [`MAX_QPS_PER_HOST`]).
    #[serde(default)]
    pub qps: BTreeMap<String, BTreeMap<QpKey, Qp>>,
    /// Desired HTB shaping, host → NIC → shape ([`crate::shaping`]).
    #[serde(default)]
    pub shapes: BTreeMap<String, BTreeMap<String, crate::shaping::NicShape>>,
    /// What each agent confirmed installing: host → NIC → shape version.
    #[serde(default)]
    pub applied_shapes: BTreeMap<String, BTreeMap<String, u64>>,
    #[serde(default)]
    pub next_shape_version: u64,
    /// The next host id to give (ids are never reused).
    pub next_host_id: u32,
    /// Host names by id.
    pub host_ids: BTreeMap<u32, String>,
    /// Who probes whom: a random regular graph over host ids
    /// ([`crate::probe_graph`]).
    pub probe_graph: ProbeGraph,
    /// Bumped whenever the graph or a NIC's address or rail changes; agents
    /// compare it with their plan's.
    pub probe_plan_version: u64,
}

pub(crate) fn check_name(what: &str, s: &str) -> Result<(), CmdError> {
    if s.is_empty() {
        return Err(CmdError::InvalidArgument(format!(
            "{what} must not be empty"
        )));
    }
    if s.len() > MAX_NAME_LEN {
        return Err(CmdError::InvalidArgument(format!(
            "{what} is longer than {MAX_NAME_LEN} bytes"
        )));
    }
    if s.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(CmdError::InvalidArgument(format!(
            "{what} {s:?} contains whitespace or control characters"
        )));
    }
    Ok(())
}

/// The NIC a failover of `host`/`nic` moves to: `to`, else the NIC's
/// backup. Refuses an unknown NIC, a target that is the NIC itself or not a
/// NIC of the host, a NIC without backup (and no `to`), and a target that
/// is down.
pub(crate) fn failover_target(
    host: &Host,
    nic: &str,
    to: Option<&str>,
) -> Result<String, CmdError> {
    let n = host
        .nics
        .get(nic)
        .ok_or_else(|| not_found("NIC", &format!("{}/{nic}", host.name)))?;
    let target = match to {
        Some(t) if t == nic => {
            return Err(CmdError::InvalidArgument(format!(
                "--to {t:?} is the NIC being failed over"
            )))
        }
        Some(t) if !host.nics.contains_key(t) => {
            return Err(CmdError::InvalidArgument(format!(
                "--to {t:?} is not a NIC of host {:?}",
                host.name
            )))
        }
        Some(t) => t.to_owned(),
        None => n.backup.clone().ok_or_else(|| {
            CmdError::FailedPrecondition(format!(
                "NIC {}/{nic} has no backup configured; pass --to NIC",
                host.name
            ))
        })?,
    };
    match host.nics.get(&target).map(|t| t.state) {
        Some(s @ (NicState::Down | NicState::Flapping)) => Err(CmdError::FailedPrecondition(
            format!("target NIC {}/{target} is {s:?}", host.name),
        )),
        Some(_) => Ok(target),
        None => Err(not_found("NIC", &format!("{}/{target}", host.name))),
    }
}

/// Refuses a failback to an unknown NIC or one that is down.
pub(crate) fn check_failback(host: &Host, nic: &str) -> Result<(), CmdError> {
    let n = host
        .nics
        .get(nic)
        .ok_or_else(|| not_found("NIC", &format!("{}/{nic}", host.name)))?;
    if matches!(n.state, NicState::Down | NicState::Flapping) {
        return Err(CmdError::FailedPrecondition(format!(
            "NIC {}/{nic} is {:?}; fail back once it is up",
            host.name, n.state
        )));
    }
    Ok(())
}

impl ClusterState {
    /// Checks a command against the current state without changing anything.
    pub fn validate(&self, cmd: &Command) -> Result<(), CmdError> {
        match cmd {
            Command::RegisterHost { host, nics, labels } => {
                check_name("host name", host)?;
                if !self.hosts.contains_key(host) && self.next_host_id == u32::MAX {
                    return Err(CmdError::FailedPrecondition(
                        "no host ids left to give".into(),
                    ));
                }
                if nics.len() > MAX_NICS {
                    return Err(CmdError::InvalidArgument(format!(
                        "a host may register at most {MAX_NICS} NICs"
                    )));
                }
                let mut seen = std::collections::BTreeSet::new();
                for n in nics {
                    check_name("NIC name", &n.name)?;
                    if !seen.insert(n.name.as_str()) {
                        return Err(CmdError::InvalidArgument(format!(
                            "NIC {:?} listed twice",
                            n.name
                        )));
                    }
                    if let Some(a) = &n.addr {
                        if a.parse::<std::net::IpAddr>().is_err() {
                            return Err(CmdError::InvalidArgument(format!(
                                "address {a:?} of NIC {:?} is not an IP address",
                                n.name
                            )));
                        }
                    }
                }
                for n in nics {
                    if let Some(b) = &n.backup {
                        if !seen.contains(b.as_str()) || b == &n.name {
                            return Err(CmdError::InvalidArgument(format!(
                                "backup {b:?} of NIC {:?} is not another NIC of the host",
                                n.name
                            )));
                        }
                    }
                }
                check_labels(labels, &[])
            }
            Command::Admin {
                actor, op, request, ..
            } => {
                if let Some(r) = request {
                    if r.client.is_empty() || r.client.len() > MAX_NAME_LEN {
                        return Err(CmdError::InvalidArgument(
                            "request client id must be 1..253 bytes".into(),
                        ));
                    }
                }
                if actor.is_empty() || actor.len() > MAX_NAME_LEN {
                    return Err(CmdError::InvalidArgument(
                        "actor must be 1..253 bytes".into(),
                    ));
                }
                let Some(host_name) = op.host() else {
                    return match op {
                        AdminOp::Job(jop) => self.validate_job_op(jop),
                        AdminOp::PlaybookApply { files } => {
                            self.playbooks_after_apply(files).map(|_| ())
                        }
                        AdminOp::PlaybookDelete { name } => self.validate_playbook_delete(name),
                        _ => unreachable!("only cluster-wide operations have no host"),
                    };
                };
                let host = self
                    .hosts
                    .get(host_name)
                    .ok_or_else(|| not_found("host", host_name))?;
                match op {
                    AdminOp::Uncordon { .. } if host.drain.is_some() => {
                        Err(CmdError::FailedPrecondition(format!(
                            "host {:?} is {}; use `node undrain` to return it to service",
                            host.name,
                            host.status()
                        )))
                    }
                    AdminOp::Drain { reason, .. } => {
                        if reason.trim().is_empty() {
                            Err(CmdError::InvalidArgument(
                                "drain needs a non-empty reason".into(),
                            ))
                        } else if reason.len() > MAX_REASON_LEN {
                            Err(CmdError::InvalidArgument(format!(
                                "drain reason is longer than {MAX_REASON_LEN} bytes"
                            )))
                        } else {
                            Ok(())
                        }
                    }
                    AdminOp::SetLabels { set, remove, .. } => {
                        for k in remove {
                            check_name("label key", k)?;
                        }
                        check_labels(set, &[&host.labels])
                    }
                    AdminOp::NicFailover { nic, to, .. } => {
                        failover_target(host, nic, to.as_deref()).map(|_| ())
                    }
                    AdminOp::NicFailback { nic, .. } => check_failback(host, nic),
                    _ => Ok(()),
                }
            }
            Command::AgentEvents { host, events } => {
                let h = self
                    .hosts
                    .get(host)
                    .ok_or_else(|| not_found("host", host))?;
                for e in events {
                    match &e.kind {
                        AgentEventKind::NicState { nic, .. } => {
                            if !h.nics.contains_key(nic) {
                                return Err(not_found("NIC", &format!("{host}/{nic}")));
                            }
                        }
                        AgentEventKind::QpPlacement {
                            job,
                            nic,
                            peer_host,
                            ..
                        } => {
                            check_name("job name", job)?;
                            check_name("NIC name", nic)?;
                            check_name("peer host", peer_host)?;
                        }
                        AgentEventKind::QpReset => {}
                        AgentEventKind::ReflexDone { nic, detail, .. } => {
                            check_name("NIC name", nic)?;
                            if detail.len() > MAX_REASON_LEN {
                                return Err(CmdError::InvalidArgument(format!(
                                    "reflex detail is longer than {MAX_REASON_LEN} bytes"
                                )));
                            }
                        }
                        AgentEventKind::RankExited { job, detail, .. } => {
                            check_name("job name", job)?;
                            if detail.len() > MAX_REASON_LEN {
                                return Err(CmdError::InvalidArgument(format!(
                                    "exit detail is longer than {MAX_REASON_LEN} bytes"
                                )));
                            }
                        }
                        AgentEventKind::RankCheckpoint { job, .. } => {
                            check_name("job name", job)?;
                        }
                    }
                }
                Ok(())
            }
            Command::SetLiveness { host, .. } => {
                if !self.hosts.contains_key(host) {
                    return Err(not_found("host", host));
                }
                Ok(())
            }
            Command::SetClockStates { changes } => {
                if changes.len() > MAX_CLOCK_CHANGES {
                    return Err(CmdError::InvalidArgument(format!(
                        "at most {MAX_CLOCK_CHANGES} clock changes per command"
                    )));
                }
                let mut seen = std::collections::BTreeSet::new();
                for c in changes {
                    if !self.hosts.contains_key(&c.host) {
                        return Err(not_found("host", &c.host));
                    }
                    if !seen.insert(c.host.as_str()) {
                        return Err(CmdError::InvalidArgument(format!(
                            "clock change for host {:?} listed twice",
                            c.host
                        )));
                    }
                    let finite = |v: Option<f64>| v.is_none_or(f64::is_finite);
                    if !finite(c.offset_ns)
                        || !finite(c.error_bound_ns)
                        || c.error_bound_ns.is_some_and(|b| b < 0.0)
                    {
                        return Err(CmdError::InvalidArgument(format!(
                            "clock figures of host {:?} must be finite (error bound ≥ 0)",
                            c.host
                        )));
                    }
                }
                Ok(())
            }
            Command::OpenIntent { action } => {
                let host = self
                    .hosts
                    .get(action.host())
                    .ok_or_else(|| not_found("host", action.host()))?;
                match action {
                    Action::CompleteDrain { .. } => Ok(()),
                    Action::Failover { nic, to, .. } => {
                        failover_target(host, nic, Some(to)).map(|_| ())
                    }
                    Action::Failback { nic, .. } => check_failback(host, nic),
                    Action::StartRank { job, .. }
                    | Action::StopJob { job, .. }
                    | Action::CheckpointJob { job, .. } => {
                        if !self.jobs.contains_key(job) {
                            return Err(not_found("job", job));
                        }
                        Ok(())
                    }
                    Action::PlaybookStep { .. } => Err(CmdError::InvalidArgument(
                        "playbook steps are opened by their run, not on their own".into(),
                    )),
                    Action::ShapeNic { nic, .. } | Action::ClearShape { nic, .. } => {
                        if !host.nics.contains_key(nic) {
                            return Err(not_found("NIC", nic));
                        }
                        Ok(())
                    }
                }
            }
            Command::CloseIntent { id, .. } => match self.intents.get(id) {
                None => Err(not_found("intent", &id.to_string())),
                Some(_) => Ok(()),
            },
            Command::OrderDone {
                host, id, detail, ..
            } => {
                if detail.len() > MAX_REASON_LEN {
                    return Err(CmdError::InvalidArgument(format!(
                        "order detail is longer than {MAX_REASON_LEN} bytes"
                    )));
                }
                let intent = self
                    .intents
                    .get(id)
                    .ok_or_else(|| not_found("intent", &id.to_string()))?;
                if !intent.action.is_order() || intent.action.host() != host {
                    return Err(CmdError::InvalidArgument(format!(
                        "intent {id} is not an order for host {host:?}"
                    )));
                }
                Ok(())
            }
            Command::Job(c) => self.validate_job_command(c),
            Command::Playbook(c) => self.validate_run_command(c),
            Command::InstallShippedPlaybooks { .. } => Ok(()),
            Command::Contention(c) => {
                crate::shaping::validate(self, c).map_err(CmdError::InvalidArgument)
            }
            Command::WebhookDone { id, detail, .. } => {
                if detail.len() > MAX_REASON_LEN {
                    return Err(CmdError::InvalidArgument(format!(
                        "webhook detail is longer than {MAX_REASON_LEN} bytes"
                    )));
                }
                let intent = self
                    .intents
                    .get(id)
                    .ok_or_else(|| not_found("intent", &id.to_string()))?;
                match &intent.action {
                    Action::PlaybookStep {
                        op:
                            crate::runs::StepOp::Notify {
                                webhook: Some(_), ..
                            },
                        ..
                    } => Ok(()),
                    _ => Err(CmdError::InvalidArgument(format!(
                        "intent {id} is not a webhook notification"
                    ))),
                }
            }
        }
    }

    /// Applies one proposal; returns one result per command.
    pub fn apply_proposal(&mut self, log_id: &LogId<NodeId>, p: &Proposal) -> Vec<CmdResult> {
        self.last_log_index = log_id.index;
        p.cmds
            .iter()
            .map(|c| {
                let request = match c {
                    Command::Admin {
                        request: Some(r), ..
                    } => Some(r),
                    _ => None,
                };
                if let Some(done) = request.and_then(|r| self.session_result(r)) {
                    return done;
                }
                let res = match self.validate(c) {
                    Ok(()) => self.apply_valid(log_id.index, p.at_ms, c),
                    Err(e) => Err(e),
                };
                if let Some(r) = request {
                    self.remember(r, p.at_ms, &res);
                }
                res
            })
            .collect()
    }

    /// The result of a request already applied in its session, if any; a
    /// request older than what the session remembers gets
    /// [`CmdError::RequestForgotten`].
    pub fn session_result(&self, r: &RequestId) -> Option<CmdResult> {
        let s = self.sessions.get(&r.client)?;
        match s.results.get(&r.serial) {
            Some(res) => Some(res.clone()),
            None if r.retry && r.serial <= s.forgotten_through => {
                Some(Err(CmdError::RequestForgotten {
                    client: r.client.clone(),
                    serial: r.serial,
                }))
            }
            None => None,
        }
    }

    fn remember(&mut self, r: &RequestId, at_ms: u64, res: &CmdResult) {
        if !self.sessions.contains_key(&r.client) && self.sessions.len() >= MAX_SESSIONS {
            // Forget the least recently used session (ties: smallest id).
            if let Some(victim) = self
                .sessions
                .iter()
                .min_by_key(|(_, s)| s.last_used_ms)
                .map(|(k, _)| k.clone())
            {
                self.sessions.remove(&victim);
            }
        }
        let s = self.sessions.entry(r.client.clone()).or_default();
        s.last_used_ms = s.last_used_ms.max(at_ms);
        s.results.insert(r.serial, res.clone());
        while s.results.len() > MAX_SESSION_RESULTS {
            if let Some((old, _)) = s.results.pop_first() {
                s.forgotten_through = s.forgotten_through.max(old);
            }
        }
    }

    pub(crate) fn log_event(&mut self, at_ms: u64, host: Option<&str>, what: String) {
        self.log_observed(at_ms, host, what, None);
    }

    fn log_observed(
        &mut self,
        at_ms: u64,
        host: Option<&str>,
        what: String,
        observed_unix_ns: Option<u64>,
    ) {
        self.next_event_seq += 1;
        self.events.push_back(ClusterEvent {
            seq: self.next_event_seq,
            at_ms,
            host: host.map(str::to_owned),
            what,
            observed_unix_ns,
        });
        while self.events.len() > MAX_EVENT_LOG {
            self.events.pop_front();
        }
    }

    fn apply_valid(&mut self, index: u64, at_ms: u64, cmd: &Command) -> CmdResult {
        match cmd {
            Command::RegisterHost { host, nics, labels } => {
                let existing = self.hosts.get(host).cloned();
                let mut h = existing.clone().unwrap_or(Host {
                    name: host.clone(),
                    id: self.next_host_id,
                    labels: BTreeMap::new(),
                    nics: BTreeMap::new(),
                    cordoned: false,
                    drain: None,
                    liveness: Liveness::Ready,
                    registered_ms: at_ms,
                    last_event_seq: 0,
                    open_incident: None,
                    clock: HostClockRecord::default(),
                    owd_excluded: false,
                    clock_incident: None,
                });
                let probe_view_before = existing.as_ref().map(probe_view);
                let mut new_nics = BTreeMap::new();
                for spec in nics {
                    let mut nic = h.nics.remove(&spec.name).unwrap_or(Nic {
                        name: spec.name.clone(),
                        rail: None,
                        backup: None,
                        rdma_device: None,
                        addr: None,
                        state: NicState::Unknown,
                        flaps: 0,
                        damping_penalty: 0.0,
                        carrier_changes: 0,
                        last_change_ms: at_ms,
                        open_incidents: BTreeMap::new(),
                        link_up: None,
                        link_transitions: 0,
                    });
                    nic.rail = spec.rail;
                    nic.backup = spec.backup.clone();
                    nic.rdma_device = spec.rdma_device.clone();
                    nic.addr = spec.addr.clone();
                    new_nics.insert(spec.name.clone(), nic);
                }
                h.nics = new_nics;
                for (k, v) in labels {
                    h.labels.insert(k.clone(), v.clone());
                }
                let last = h.last_event_seq;
                let changed = existing.as_ref() != Some(&h);
                let id = h.id;
                if probe_view_before.as_ref() != Some(&probe_view(&h)) {
                    self.probe_plan_version += 1;
                }
                self.hosts.insert(host.clone(), h);
                if existing.is_none() {
                    self.next_host_id += 1;
                    self.host_ids.insert(id, host.clone());
                    let seed = join_seed(host, self.probe_graph.len());
                    let change = self.probe_graph.join(id, PROBE_DEGREE, seed);
                    self.log_event(
                        at_ms,
                        Some(host),
                        format!(
                            "host registered with {} NICs (probe id {id}; probe graph: {} edges added, {} split)",
                            nics.len(),
                            change.added.len(),
                            change.removed.len()
                        ),
                    );
                } else if changed {
                    self.log_event(at_ms, Some(host), "host re-registered".into());
                }
                Ok(CmdOk::Registered {
                    last_applied_seq: last,
                })
            }
            Command::Admin { actor, op, .. } => {
                let Some(host_name) = op.host() else {
                    let what = match op {
                        AdminOp::Job(jop) => self.apply_job_op(at_ms, jop, actor),
                        AdminOp::PlaybookApply { files } => {
                            self.apply_playbooks(at_ms, actor, files)
                        }
                        AdminOp::PlaybookDelete { name } => {
                            self.playbooks.remove(name);
                            self.playbook_version += 1;
                            format!("playbook {name} deleted")
                        }
                        _ => unreachable!("only cluster-wide operations have no host"),
                    };
                    self.record_admin(index, at_ms, actor, op);
                    self.log_event(at_ms, None, format!("{what} (by {actor})"));
                    return Ok(CmdOk::Done);
                };
                if let AdminOp::ShapeClear { host } = op {
                    let dropped = self.clear_host_shapes(host);
                    let applied = self.applied_shapes.get(host).map_or(0, |m| m.len());
                    self.record_admin(index, at_ms, actor, op);
                    self.log_event(
                        at_ms,
                        Some(host),
                        format!(
                            "shapes cleared: {dropped} desired dropped, {applied} to remove (by {actor})"
                        ),
                    );
                    return Ok(CmdOk::Done);
                }
                let host = self.hosts.get_mut(host_name).expect("validated");
                let mut order = None;
                let what = match op {
                    AdminOp::Cordon { .. } => {
                        host.cordoned = true;
                        "cordoned".to_string()
                    }
                    AdminOp::Uncordon { .. } => {
                        host.cordoned = false;
                        "uncordoned".to_string()
                    }
                    AdminOp::Drain {
                        reason,
                        deadline_ms,
                        ..
                    } => {
                        host.cordoned = true;
                        if host.drain.is_none() {
                            host.drain = Some(Drain {
                                phase: DrainPhase::Draining,
                                reason: reason.clone(),
                                deadline_ms: *deadline_ms,
                                by: actor.clone(),
                                since_ms: at_ms,
                            });
                            format!("draining: {reason}")
                        } else {
                            "drain requested again (already draining)".to_string()
                        }
                    }
                    AdminOp::Undrain { .. } => {
                        host.cordoned = false;
                        host.drain = None;
                        "undrained, back in service".to_string()
                    }
                    AdminOp::SetLabels { set, remove, .. } => {
                        for k in remove {
                            host.labels.remove(k);
                        }
                        for (k, v) in set {
                            host.labels.insert(k.clone(), v.clone());
                        }
                        format!("labels: {} set, {} removed", set.len(), remove.len())
                    }
                    AdminOp::NicFailover { nic, to, .. } => {
                        let target = failover_target(host, nic, to.as_deref()).expect("validated");
                        let what = format!("failover of NIC {nic} to {target} ordered");
                        order = Some(Action::Failover {
                            host: host.name.clone(),
                            nic: nic.clone(),
                            to: target,
                        });
                        what
                    }
                    AdminOp::NicFailback { nic, .. } => {
                        order = Some(Action::Failback {
                            host: host.name.clone(),
                            nic: nic.clone(),
                        });
                        format!("failback to NIC {nic} ordered")
                    }
                    AdminOp::Job(_)
                    | AdminOp::PlaybookApply { .. }
                    | AdminOp::PlaybookDelete { .. } => {
                        unreachable!("cluster-wide operations have no host")
                    }
                    AdminOp::ShapeClear { .. } => unreachable!("applied above"),
                };
                let host_name = host_name.to_owned();
                self.record_admin(index, at_ms, actor, op);
                self.log_event(at_ms, Some(&host_name), format!("{what} (by {actor})"));
                match order {
                    Some(action) => Ok(CmdOk::IntentOpened {
                        id: self.open_intent(at_ms, &action),
                    }),
                    None => Ok(CmdOk::Done),
                }
            }
            Command::AgentEvents { host, events } => self.apply_agent_events(at_ms, host, events),
            Command::SetLiveness { host, liveness } => {
                let h = self.hosts.get_mut(host).expect("validated");
                let prev = h.liveness;
                if prev == *liveness {
                    return Ok(CmdOk::Done);
                }
                h.liveness = *liveness;
                let open = h.open_incident.take();
                self.log_event(at_ms, Some(host), format!("host {prev:?} -> {liveness:?}"));
                match liveness {
                    Liveness::Down => {
                        let id = self.open_incident(
                            at_ms,
                            "host_down",
                            host,
                            None,
                            "missed heartbeats and no probe evidence".into(),
                        );
                        self.hosts.get_mut(host).expect("validated").open_incident = Some(id);
                        // The playbook for host_down (the shipped
                        // host-down.toml restarts the jobs) handles it;
                        // nothing is hard-wired beside it.
                        let what = match self.playbook_for(id) {
                            Some((pb, _)) => format!("host_down handled by playbook {}", pb.name),
                            None => "no playbook handles host_down: its jobs wait for an operator"
                                .into(),
                        };
                        self.log_event(at_ms, Some(host), what);
                    }
                    _ => {
                        if let Some(id) = open {
                            self.close_incident(at_ms, id, "host is back");
                        }
                        if prev == Liveness::Down {
                            self.jobs_host_back(host);
                        }
                    }
                }
                Ok(CmdOk::Done)
            }
            Command::SetClockStates { changes } => {
                for c in changes {
                    let h = self.hosts.get_mut(&c.host).expect("validated");
                    let prev = h.clock.state;
                    if prev == c.state {
                        continue;
                    }
                    h.clock = HostClockRecord {
                        state: c.state,
                        offset_ns: c.offset_ns,
                        error_bound_ns: c.error_bound_ns,
                        changed_ms: at_ms,
                    };
                    let figures = match (c.offset_ns, c.error_bound_ns) {
                        (Some(o), Some(b)) => format!(" (offset {o:.0} ns ± {b:.0} ns)"),
                        _ => String::new(),
                    };
                    self.log_event(
                        at_ms,
                        Some(&c.host),
                        format!("clock {prev:?} -> {:?}{figures}", c.state),
                    );
                    self.clock_incidents(at_ms, &c.host, prev, c.state);
                }
                Ok(CmdOk::Done)
            }
            Command::OpenIntent { action } => Ok(CmdOk::IntentOpened {
                id: self.open_intent(at_ms, action),
            }),
            Command::CloseIntent { id, outcome } => {
                self.close_intent(at_ms, *id, outcome.clone(), "")
            }
            Command::OrderDone { id, ok, detail, .. } => {
                let outcome = if *ok {
                    Outcome::Done
                } else {
                    Outcome::Failed {
                        error: detail.clone(),
                    }
                };
                self.close_intent(at_ms, *id, outcome, detail)
            }
            Command::Job(c) => self.apply_job_command(at_ms, c),
            Command::Playbook(c) => self.apply_run_command(at_ms, c),
            Command::InstallShippedPlaybooks { files } => {
                self.install_shipped_playbooks(at_ms, files);
                Ok(CmdOk::Done)
            }
            Command::WebhookDone { id, ok, detail } => {
                let outcome = if *ok {
                    Outcome::Done
                } else {
                    Outcome::Failed {
                        error: detail.clone(),
                    }
                };
                self.close_intent(at_ms, *id, outcome, detail)
            }
            Command::Contention(c) => {
                crate::shaping::apply(self, at_ms, c);
                Ok(CmdOk::Done)
            }
        }
    }

    fn record_admin(&mut self, index: u64, at_ms: u64, actor: &str, op: &AdminOp) {
        self.admin_history.push_back(AdminRecord {
            at_ms,
            actor: actor.to_owned(),
            op: op.clone(),
            log_index: index,
        });
        while self.admin_history.len() > MAX_ADMIN_HISTORY {
            self.admin_history.pop_front();
        }
    }

    /// Records an intent (or finds the open one for the same action).
    pub(crate) fn open_intent(&mut self, at_ms: u64, action: &Action) -> u64 {
        if let Some(existing) = self
            .intents
            .values()
            .find(|i| i.status == IntentStatus::Open && &i.action == action)
        {
            return existing.id;
        }
        self.next_intent_id += 1;
        let id = self.next_intent_id;
        self.intents.insert(
            id,
            Intent {
                id,
                action: action.clone(),
                status: IntentStatus::Open,
                opened_ms: at_ms,
                closed_ms: None,
                detail: String::new(),
            },
        );
        self.log_event(
            at_ms,
            Some(action.host()),
            format!("intent {id} opened: {action:?}"),
        );
        id
    }

    /// Closes an open intent with its outcome and applies the effect;
    /// closing a closed intent changes nothing.
    pub(crate) fn close_intent(
        &mut self,
        at_ms: u64,
        id: u64,
        outcome: Outcome,
        detail: &str,
    ) -> CmdResult {
        let intent = self.intents.get(&id).expect("validated").clone();
        if intent.status != IntentStatus::Open {
            // Idempotent by id: closing twice changes nothing.
            return Ok(CmdOk::Done);
        }
        let mut outcome = outcome;
        if outcome == Outcome::Done {
            match &intent.action {
                Action::CompleteDrain { host } => {
                    let h = self.hosts.get_mut(host).expect("validated");
                    match &mut h.drain {
                        Some(d) if d.phase == DrainPhase::Draining => {
                            d.phase = DrainPhase::Drained;
                        }
                        _ => {
                            outcome = Outcome::Cancelled {
                                why: "host is no longer draining".into(),
                            }
                        }
                    }
                }
                // The agent moved the connections; their placements arrive
                // as agent events.
                Action::Failover { .. } | Action::Failback { .. } => {}
                Action::StartRank { .. }
                | Action::StopJob { .. }
                | Action::CheckpointJob { .. } => {}
                // Step effects were applied when the attempt started.
                Action::PlaybookStep { .. } => {}
                Action::ShapeNic { .. } | Action::ClearShape { .. } => {}
            }
        }
        self.shape_order_closed(&intent.action, &outcome);
        let host = intent.action.host().to_owned();
        let e = self.intents.get_mut(&id).expect("validated");
        e.status = IntentStatus::Closed(outcome.clone());
        e.closed_ms = Some(at_ms);
        e.detail = detail.to_owned();
        self.prune_closed_intents(id);
        if intent.action.job().is_some() {
            self.job_order_closed(at_ms, &intent.action, outcome == Outcome::Done, detail);
        }
        if let Action::PlaybookStep { run, .. } = &intent.action {
            // Logged first so the run's lines follow the intent's.
            let what = format!("intent {id} closed: {outcome:?}");
            self.log_event(at_ms, Some(&host), what);
            self.run_step_closed(at_ms, *run, id, &outcome);
            return Ok(CmdOk::Done);
        }
        let what = match (&intent.action, &outcome) {
            (Action::CompleteDrain { .. }, Outcome::Done) => {
                format!("drained (intent {id})")
            }
            (Action::Failover { nic, to, .. }, Outcome::Done) => {
                format!("failover of NIC {nic} to {to} done (intent {id}): {detail}")
            }
            (Action::Failback { nic, .. }, Outcome::Done) => {
                format!("failback to NIC {nic} done (intent {id}): {detail}")
            }
            (_, o) => format!("intent {id} closed: {o:?}"),
        };
        self.log_event(at_ms, Some(&host), what);
        Ok(CmdOk::Done)
    }

    fn apply_agent_events(&mut self, at_ms: u64, host: &str, events: &[AgentEvent]) -> CmdResult {
        let mut through = self.hosts[host].last_event_seq;
        for e in events {
            if e.seq <= through {
                continue; // already applied: exactly-once
            }
            if e.seq != through + 1 {
                return Err(CmdError::SequenceGap {
                    host: host.into(),
                    expected: through + 1,
                    got: e.seq,
                    acked: through,
                });
            }
            match &e.kind {
                AgentEventKind::NicState {
                    nic,
                    state,
                    carrier_changes,
                    flaps,
                    damping_penalty,
                    coalesced,
                    link_up,
                    probes_lost,
                } => {
                    if *coalesced > 0 {
                        self.log_event(
                            at_ms,
                            Some(host),
                            format!("NIC {nic}: {coalesced} transitions coalesced by the agent's full outbox"),
                        );
                    }
                    self.apply_nic_state(
                        at_ms,
                        host,
                        nic,
                        NicReport {
                            observed_unix_ns: e.at_unix_ns,
                            state: *state,
                            link_up: *link_up,
                            carrier_changes: *carrier_changes,
                            flaps: *flaps,
                            penalty: *damping_penalty,
                            probes_lost: *probes_lost,
                        },
                    )
                }
                AgentEventKind::QpPlacement {
                    job,
                    rank,
                    conn_id,
                    nic,
                    peer_host,
                    peer_rank,
                    rail,
                    moved,
                    closed,
                } => {
                    let qp = Qp {
                        job: job.clone(),
                        rank: *rank,
                        conn_id: *conn_id,
                        nic: nic.clone(),
                        peer_host: peer_host.clone(),
                        peer_rank: *peer_rank,
                        rail: *rail,
                        moved: *moved,
                        since_ms: at_ms,
                    };
                    self.apply_qp(at_ms, host, qp, *closed)
                }
                AgentEventKind::QpReset => {
                    let n = self.qps.remove(host).map_or(0, |t| t.len());
                    if n > 0 {
                        self.log_event(
                            at_ms,
                            Some(host),
                            format!("agent restarted: {n} connection placements forgotten until their jobs register again"),
                        );
                    }
                }
                AgentEventKind::ReflexDone {
                    nic,
                    conns,
                    ok,
                    detail,
                } => {
                    let how = if *ok { "done" } else { "failed" };
                    self.log_observed(
                        at_ms,
                        Some(host),
                        format!("reflex: NIC {nic} down, {conns} connections ordered off it: {how}: {detail}"),
                        Some(e.at_unix_ns),
                    );
                }
                AgentEventKind::RankExited {
                    job,
                    incarnation,
                    rank,
                    exit_code,
                    signal,
                    detail,
                } => self.apply_rank_exited(
                    at_ms,
                    host,
                    job,
                    *incarnation,
                    *rank,
                    crate::jobs::Exit {
                        code: *exit_code,
                        signal: *signal,
                        detail: detail.clone(),
                    },
                ),
                AgentEventKind::RankCheckpoint {
                    job,
                    incarnation,
                    rank,
                    step,
                } => self.apply_rank_checkpoint(at_ms, host, job, *incarnation, *rank, *step),
            }
            through = e.seq;
            self.hosts.get_mut(host).expect("validated").last_event_seq = through;
        }
        Ok(CmdOk::Acked { through })
    }

    /// Records (or with `closed` removes) one connection's placement.
    fn apply_qp(&mut self, at_ms: u64, host: &str, mut qp: Qp, closed: bool) {
        let key = QpKey {
            job: qp.job.clone(),
            rank: qp.rank,
            conn_id: qp.conn_id,
        };
        let table = self.qps.entry(host.to_owned()).or_default();
        if closed {
            table.remove(&key);
            if table.is_empty() {
                self.qps.remove(host);
            }
            return;
        }
        match table.get(&key) {
            Some(prev) if prev.nic == qp.nic => qp.since_ms = prev.since_ms,
            Some(_) => {}
            None if table.len() >= MAX_QPS_PER_HOST => {
                self.log_event(
                    at_ms,
                    Some(host),
                    format!(
                        "connection {}/{}/{} not recorded: the host already has {MAX_QPS_PER_HOST}",
                        key.job, key.rank, key.conn_id
                    ),
                );
                return;
            }
            None => {}
        }
        table.insert(key, qp);
    }

    fn apply_nic_state(&mut self, at_ms: u64, host: &str, nic_name: &str, r: NicReport) {
        let nic = self
            .hosts
            .get_mut(host)
            .and_then(|h| h.nics.get_mut(nic_name))
            .expect("validated");
        let prev = nic.state;
        let state = r.state;
        let link_changed = nic.link_up != Some(r.link_up);
        if link_changed {
            nic.link_up = Some(r.link_up);
            nic.link_transitions += 1;
        }
        nic.state = state;
        nic.carrier_changes = r.carrier_changes;
        nic.flaps = r.flaps;
        nic.damping_penalty = r.penalty;
        let changed = prev != state;
        if changed {
            nic.last_change_ms = at_ms;
        }
        let kind = match state {
            NicState::Down => Some("nic_down"),
            NicState::Flapping => Some("nic_flapping"),
            _ => None,
        };
        // Recovery closes the NIC's open incidents.
        let to_close = if changed && state == NicState::Up {
            std::mem::take(&mut nic.open_incidents)
        } else {
            BTreeMap::new()
        };
        let open_new = kind.filter(|k| changed && !nic.open_incidents.contains_key(*k));
        let link = match (r.link_up, r.probes_lost) {
            (true, _) => "up",
            (false, false) => "down",
            (false, true) => "down (probes lost)",
        };
        if link_changed {
            self.log_observed(
                at_ms,
                Some(host),
                format!("NIC {nic_name}: link {link} ({prev:?} -> {state:?})"),
                Some(r.observed_unix_ns),
            );
        } else if changed {
            self.log_event(
                at_ms,
                Some(host),
                format!("NIC {nic_name}: {prev:?} -> {state:?}"),
            );
        }
        for id in to_close.into_values() {
            self.close_incident(at_ms, id, "nic_recovered");
        }
        if let Some(kind) = open_new {
            let id = self.open_incident(
                at_ms,
                kind,
                host,
                Some(nic_name),
                format!("{prev:?} -> {state:?}"),
            );
            self.hosts
                .get_mut(host)
                .and_then(|h| h.nics.get_mut(nic_name))
                .expect("validated")
                .open_incidents
                .insert(kind.to_owned(), id);
        }
    }

    pub(crate) fn open_incident(
        &mut self,
        at_ms: u64,
        kind: &str,
        host: &str,
        nic: Option<&str>,
        detail: String,
    ) -> u64 {
        self.next_incident_id += 1;
        let id = self.next_incident_id;
        self.incidents.insert(
            id,
            Incident {
                id,
                kind: kind.into(),
                host: host.into(),
                nic: nic.map(str::to_owned),
                opened_ms: at_ms,
                closed_ms: None,
                detail,
                run: None,
                link: None,
            },
        );
        self.log_event(at_ms, Some(host), format!("incident {id} opened: {kind}"));
        id
    }

    /// A clock that lost sync (Synced or Degraded → Unsynced) opens a
    /// `clock_unsynced` incident; Synced again closes it (a playbook
    /// waiting for `clock_synced` goes on to its last steps). A Down
    /// host's clock is unknowable and its `host_down` incident says more:
    /// no clock incident for it.
    fn clock_incidents(&mut self, at_ms: u64, host: &str, prev: ClockState, now: ClockState) {
        let h = &self.hosts[host];
        match now {
            ClockState::Unsynced
                if prev != ClockState::Unsynced
                    && h.clock_incident.is_none()
                    && h.liveness != Liveness::Down =>
            {
                let id = self.open_incident(
                    at_ms,
                    "clock_unsynced",
                    host,
                    None,
                    format!("clock {prev:?} -> Unsynced"),
                );
                self.hosts.get_mut(host).expect("exists").clock_incident = Some(id);
            }
            ClockState::Synced => {
                if let Some(id) = self
                    .hosts
                    .get_mut(host)
                    .and_then(|h| h.clock_incident.take())
                {
                    self.close_incident(at_ms, id, "clock synced again");
                }
            }
            _ => {}
        }
    }

    pub(crate) fn close_incident(&mut self, at_ms: u64, id: u64, why: &str) {
        let Some(i) = self.incidents.get_mut(&id) else {
            return;
        };
        if i.closed_ms.is_some() {
            return;
        }
        i.closed_ms = Some(at_ms);
        let host = i.host.clone();
        let kind = i.kind.clone();
        self.log_event(
            at_ms,
            Some(&host),
            format!("incident {id} ({kind}) closed: {why}"),
        );
        self.closed_incidents.push_back(id);
        // Its shapes go; the reconciler clears what was applied.
        self.drop_desired_shapes(id);
        // A run still acting on it is cancelled (a waiting one goes on).
        self.incident_cleared(at_ms, id);
        while self.closed_incidents.len() > MAX_CLOSED_RECORDS {
            if let Some(old) = self.closed_incidents.pop_front() {
                self.incidents.remove(&old);
            }
        }
    }

    fn prune_closed_intents(&mut self, closed: u64) {
        self.closed_intents.push_back(closed);
        while self.closed_intents.len() > MAX_CLOSED_RECORDS {
            if let Some(old) = self.closed_intents.pop_front() {
                self.intents.remove(&old);
            }
        }
    }

    /// Open intents, oldest first.
    pub fn open_intents(&self) -> impl Iterator<Item = &Intent> {
        self.intents
            .values()
            .filter(|i| i.status == IntentStatus::Open)
    }

    /// Jobs with a rank on `host`.
    pub fn jobs_on(&self, host: &str) -> impl Iterator<Item = &Job> {
        let host = host.to_owned();
        self.jobs
            .values()
            .filter(move |j| j.placement.contains(&host))
    }
}

/// What of a host its probe peers see: NIC names, rails and addresses.
fn probe_view(h: &Host) -> Vec<(&str, Option<u32>, Option<&str>)> {
    h.nics
        .values()
        .map(|n| (n.name.as_str(), n.rail, n.addr.as_deref()))
        .collect()
}

pub(crate) fn check_labels(
    set: &BTreeMap<String, String>,
    existing: &[&BTreeMap<String, String>],
) -> Result<(), CmdError> {
    for (k, v) in set {
        check_name("label key", k)?;
        if v.len() > MAX_NAME_LEN {
            return Err(CmdError::InvalidArgument(format!(
                "label value for {k:?} is longer than {MAX_NAME_LEN} bytes"
            )));
        }
    }
    let mut keys: std::collections::BTreeSet<&String> = set.keys().collect();
    for e in existing {
        keys.extend(e.keys());
    }
    if keys.len() > MAX_LABELS {
        return Err(CmdError::InvalidArgument(format!(
            "a host may carry at most {MAX_LABELS} labels"
        )));
    }
    Ok(())
}

impl raft_store::StateModel<TypeConfig> for ClusterState {
    fn apply(&mut self, log_id: &LogId<NodeId>, data: &Proposal) -> Vec<CmdResult> {
        self.apply_proposal(log_id, data)
    }

    fn non_app_response(&mut self, log_id: &LogId<NodeId>) -> Vec<CmdResult> {
        self.last_log_index = log_id.index;
        Vec::new()
    }

    fn encode(&self) -> Result<Vec<u8>, String> {
        bincode::serialize(self).map_err(|e| e.to_string())
    }

    fn decode(bytes: &[u8]) -> Result<Self, String> {
        bincode::deserialize(bytes).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::CommittedLeaderId;

    fn lid(i: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(1, 1), i)
    }

    fn register(st: &mut ClusterState, host: &str) {
        let p = Proposal {
            at_ms: 1,
            cmds: vec![Command::RegisterHost {
                host: host.into(),
                nics: vec![
                    NicSpec {
                        name: "rail0".into(),
                        rail: Some(0),
                        backup: Some("rail1".into()),
                        rdma_device: None,
                        addr: None,
                    },
                    NicSpec {
                        name: "rail1".into(),
                        rail: Some(1),
                        backup: Some("rail0".into()),
                        rdma_device: None,
                        addr: None,
                    },
                ],
                labels: BTreeMap::new(),
            }],
        };
        assert!(st.apply_proposal(&lid(1), &p)[0].is_ok());
    }

    fn admin(op: AdminOp) -> Command {
        Command::Admin {
            actor: "alice".into(),
            op,
            request: None,
        }
    }

    fn admin_req(op: AdminOp, client: &str, serial: u64) -> Command {
        Command::Admin {
            actor: "alice".into(),
            op,
            request: Some(RequestId {
                client: client.into(),
                serial,
                retry: true,
            }),
        }
    }

    fn one(st: &mut ClusterState, index: u64, at_ms: u64, cmd: Command) -> CmdResult {
        let p = Proposal {
            at_ms,
            cmds: vec![cmd],
        };
        st.apply_proposal(&lid(index), &p).remove(0)
    }

    #[test]
    fn retried_request_applies_once_and_returns_the_first_result() {
        let mut st = ClusterState::default();
        register(&mut st, "h0");
        let drain = AdminOp::Drain {
            host: "h0".into(),
            reason: "r".into(),
            deadline_ms: None,
        };
        assert_eq!(
            one(&mut st, 2, 10, admin_req(drain, "c1", 1)),
            Ok(CmdOk::Done)
        );
        let uncordon = AdminOp::Uncordon { host: "h0".into() };
        let refused = one(&mut st, 3, 11, admin_req(uncordon.clone(), "c1", 2));
        assert!(matches!(refused, Err(CmdError::FailedPrecondition(_))));
        let undrain = AdminOp::Undrain { host: "h0".into() };
        assert_eq!(
            one(&mut st, 4, 12, admin_req(undrain.clone(), "c1", 3)),
            Ok(CmdOk::Done)
        );
        let history = st.admin_history.len();
        // Retries, even reordered and after the state moved on, change
        // nothing and get the first answer.
        let before = st.hosts.clone();
        assert_eq!(
            one(&mut st, 5, 13, admin_req(undrain, "c1", 3)),
            Ok(CmdOk::Done)
        );
        assert_eq!(one(&mut st, 6, 14, admin_req(uncordon, "c1", 2)), refused);
        assert_eq!(st.hosts, before);
        assert_eq!(st.admin_history.len(), history);
        // The same serial in another session is a different request.
        let cordon = AdminOp::Cordon { host: "h0".into() };
        assert_eq!(
            one(&mut st, 7, 15, admin_req(cordon, "c2", 3)),
            Ok(CmdOk::Done)
        );
        assert!(st.hosts["h0"].cordoned);
    }

    #[test]
    fn sessions_are_bounded_and_forgotten_requests_say_so() {
        let mut st = ClusterState::default();
        register(&mut st, "h0");
        let n = MAX_SESSION_RESULTS as u64 + 5;
        for serial in 1..=n {
            let op = AdminOp::Cordon { host: "h0".into() };
            one(&mut st, serial + 1, serial, admin_req(op, "c", serial)).unwrap();
        }
        assert_eq!(st.sessions["c"].results.len(), MAX_SESSION_RESULTS);
        let mut old = RequestId {
            client: "c".into(),
            serial: 1,
            retry: true,
        };
        assert!(matches!(
            st.session_result(&old),
            Some(Err(CmdError::RequestForgotten { serial: 1, .. }))
        ));
        // A first attempt that arrives late is simply applied.
        old.retry = false;
        assert_eq!(st.session_result(&old), None);
        for i in 0..MAX_SESSIONS + 3 {
            let op = AdminOp::Cordon { host: "h0".into() };
            one(
                &mut st,
                1000 + i as u64,
                1000 + i as u64,
                admin_req(op, &format!("s{i}"), 1),
            )
            .unwrap();
        }
        assert_eq!(st.sessions.len(), MAX_SESSIONS);
        assert!(
            !st.sessions.contains_key("c"),
            "least recently used goes first"
        );
    }

    #[test]
    fn unknown_host_is_not_found_and_changes_nothing() {
        let mut st = ClusterState::default();
        register(&mut st, "h0");
        let before = st.clone();
        let r = st.apply_proposal(
            &lid(2),
            &Proposal {
                at_ms: 2,
                cmds: vec![admin(AdminOp::Cordon {
                    host: "nope".into(),
                })],
            },
        );
        assert_eq!(
            r[0],
            Err(CmdError::NotFound {
                kind: "host".into(),
                name: "nope".into()
            })
        );
        // Only the applied index moves.
        let mut after = st.clone();
        after.last_log_index = before.last_log_index;
        assert_eq!(after, before);
    }

    #[test]
    fn drain_requires_reason_and_blocks_uncordon() {
        let mut st = ClusterState::default();
        register(&mut st, "h0");
        let bad = admin(AdminOp::Drain {
            host: "h0".into(),
            reason: "  ".into(),
            deadline_ms: None,
        });
        assert!(matches!(
            st.validate(&bad),
            Err(CmdError::InvalidArgument(_))
        ));
        let good = admin(AdminOp::Drain {
            host: "h0".into(),
            reason: "bad psu".into(),
            deadline_ms: None,
        });
        st.apply_proposal(
            &lid(2),
            &Proposal {
                at_ms: 2,
                cmds: vec![good],
            },
        );
        assert_eq!(st.hosts["h0"].status(), HostStatus::Draining);
        assert!(matches!(
            st.validate(&admin(AdminOp::Uncordon { host: "h0".into() })),
            Err(CmdError::FailedPrecondition(_))
        ));
        st.apply_proposal(
            &lid(3),
            &Proposal {
                at_ms: 3,
                cmds: vec![admin(AdminOp::Undrain { host: "h0".into() })],
            },
        );
        assert_eq!(st.hosts["h0"].status(), HostStatus::Ready);
        assert_eq!(st.admin_history.len(), 2);
        assert_eq!(st.admin_history[0].actor, "alice");
    }

    #[test]
    fn drain_intent_completes_once() {
        let mut st = ClusterState::default();
        register(&mut st, "h0");
        st.apply_proposal(
            &lid(2),
            &Proposal {
                at_ms: 2,
                cmds: vec![admin(AdminOp::Drain {
                    host: "h0".into(),
                    reason: "r".into(),
                    deadline_ms: None,
                })],
            },
        );
        let open = Command::OpenIntent {
            action: Action::CompleteDrain { host: "h0".into() },
        };
        let r = st.apply_proposal(
            &lid(3),
            &Proposal {
                at_ms: 3,
                cmds: vec![open.clone(), open],
            },
        );
        assert_eq!(r[0], Ok(CmdOk::IntentOpened { id: 1 }));
        assert_eq!(
            r[1],
            Ok(CmdOk::IntentOpened { id: 1 }),
            "same action dedups to the open intent"
        );
        let close = Command::CloseIntent {
            id: 1,
            outcome: Outcome::Done,
        };
        st.apply_proposal(
            &lid(4),
            &Proposal {
                at_ms: 4,
                cmds: vec![close.clone(), close],
            },
        );
        assert_eq!(st.hosts["h0"].status(), HostStatus::Drained);
        assert_eq!(st.open_intents().count(), 0);
    }

    #[test]
    fn agent_events_apply_exactly_once_in_order() {
        let mut st = ClusterState::default();
        register(&mut st, "h0");
        let ev = |seq, state| AgentEvent {
            seq,
            at_unix_ns: 0,
            kind: AgentEventKind::NicState {
                nic: "rail0".into(),
                state,
                carrier_changes: seq,
                flaps: 0,
                damping_penalty: 0.0,
                coalesced: 0,
                link_up: state == NicState::Up,
                probes_lost: false,
            },
        };
        let cmd = |events| Command::AgentEvents {
            host: "h0".into(),
            events,
        };
        let r = st.apply_proposal(
            &lid(2),
            &Proposal {
                at_ms: 2,
                cmds: vec![cmd(vec![ev(1, NicState::Up), ev(2, NicState::Down)])],
            },
        );
        assert_eq!(r[0], Ok(CmdOk::Acked { through: 2 }));
        assert!(
            st.events
                .iter()
                .filter(|e| e.what.contains(": link "))
                .all(|e| e.observed_unix_ns.is_some()),
            "link events carry the agent's observation time"
        );
        assert_eq!(
            st.incidents
                .values()
                .filter(|i| i.kind == "nic_down")
                .count(),
            1
        );
        // A resend of 1..2 plus 3 applies only 3.
        let r = st.apply_proposal(
            &lid(3),
            &Proposal {
                at_ms: 3,
                cmds: vec![cmd(vec![
                    ev(1, NicState::Up),
                    ev(2, NicState::Down),
                    ev(3, NicState::Up),
                ])],
            },
        );
        assert_eq!(r[0], Ok(CmdOk::Acked { through: 3 }));
        assert_eq!(st.hosts["h0"].nics["rail0"].state, NicState::Up);
        assert!(st.incidents.values().all(|i| i.closed_ms.is_some()));
        // A gap is refused.
        let r = st.apply_proposal(
            &lid(4),
            &Proposal {
                at_ms: 4,
                cmds: vec![cmd(vec![ev(5, NicState::Down)])],
            },
        );
        assert!(matches!(
            r[0],
            Err(CmdError::SequenceGap {
                expected: 4,
                got: 5,
                ..
            })
        ));
        assert_eq!(st.hosts["h0"].last_event_seq, 3);
    }

    /// Log entries are bincode: every command variant must round-trip
    /// (bincode rejects e.g. internally tagged enums at decode time, which
    /// would stop Raft on the first such entry).
    #[test]
    fn every_command_roundtrips_through_bincode() {
        let cmds = vec![
            Command::RegisterHost {
                host: "h".into(),
                nics: vec![NicSpec {
                    name: "n".into(),
                    rail: Some(1),
                    backup: None,
                    rdma_device: Some("mlx5_0".into()),
                    addr: None,
                }],
                labels: BTreeMap::from([("a".into(), "b".into())]),
            },
            admin(AdminOp::Cordon { host: "h".into() }),
            admin(AdminOp::Uncordon { host: "h".into() }),
            admin(AdminOp::Drain {
                host: "h".into(),
                reason: "r".into(),
                deadline_ms: Some(5),
            }),
            admin(AdminOp::Undrain { host: "h".into() }),
            admin_req(AdminOp::Undrain { host: "h".into() }, "c", 7),
            admin(AdminOp::SetLabels {
                host: "h".into(),
                set: BTreeMap::from([("k".into(), "v".into())]),
                remove: vec!["x".into()],
            }),
            Command::AgentEvents {
                host: "h".into(),
                events: vec![AgentEvent {
                    seq: 1,
                    at_unix_ns: 2,
                    kind: AgentEventKind::NicState {
                        nic: "n".into(),
                        state: NicState::Flapping,
                        carrier_changes: 3,
                        flaps: 4,
                        damping_penalty: 1.5,
                        coalesced: 2,
                        link_up: false,
                        probes_lost: false,
                    },
                }],
            },
            Command::OpenIntent {
                action: Action::CompleteDrain { host: "h".into() },
            },
            Command::CloseIntent {
                id: 1,
                outcome: Outcome::Done,
            },
            Command::CloseIntent {
                id: 1,
                outcome: Outcome::Cancelled { why: "w".into() },
            },
            Command::CloseIntent {
                id: 1,
                outcome: Outcome::Failed { error: "e".into() },
            },
            admin(AdminOp::NicFailover {
                host: "h".into(),
                nic: "n".into(),
                to: Some("m".into()),
            }),
            admin(AdminOp::NicFailover {
                host: "h".into(),
                nic: "n".into(),
                to: None,
            }),
            admin(AdminOp::NicFailback {
                host: "h".into(),
                nic: "n".into(),
            }),
            Command::OpenIntent {
                action: Action::Failover {
                    host: "h".into(),
                    nic: "n".into(),
                    to: "m".into(),
                },
            },
            Command::OpenIntent {
                action: Action::Failback {
                    host: "h".into(),
                    nic: "n".into(),
                },
            },
            Command::OrderDone {
                host: "h".into(),
                id: 4,
                ok: false,
                detail: "d".into(),
            },
            Command::SetClockStates {
                changes: vec![
                    ClockChange {
                        host: "h".into(),
                        state: ClockState::Synced,
                        offset_ns: Some(-12.5),
                        error_bound_ns: Some(300.0),
                    },
                    ClockChange {
                        host: "g".into(),
                        state: ClockState::Unsynced,
                        offset_ns: None,
                        error_bound_ns: None,
                    },
                ],
            },
            Command::SetLiveness {
                host: "h".into(),
                liveness: Liveness::Suspect,
            },
            Command::AgentEvents {
                host: "h".into(),
                events: vec![
                    AgentEvent {
                        seq: 2,
                        at_unix_ns: 3,
                        kind: AgentEventKind::QpPlacement {
                            job: "j".into(),
                            rank: 1,
                            conn_id: u64::MAX,
                            nic: "n".into(),
                            peer_host: "p".into(),
                            peer_rank: 2,
                            rail: 3,
                            moved: true,
                            closed: false,
                        },
                    },
                    AgentEvent {
                        seq: 3,
                        at_unix_ns: 4,
                        kind: AgentEventKind::QpReset,
                    },
                    AgentEvent {
                        seq: 4,
                        at_unix_ns: 5,
                        kind: AgentEventKind::ReflexDone {
                            nic: "n".into(),
                            conns: 7,
                            ok: true,
                            detail: "d".into(),
                        },
                    },
                    AgentEvent {
                        seq: 5,
                        at_unix_ns: 6,
                        kind: AgentEventKind::RankExited {
                            job: "j".into(),
                            incarnation: 2,
                            rank: 1,
                            exit_code: -1,
                            signal: 9,
                            detail: "d".into(),
                        },
                    },
                    AgentEvent {
                        seq: 6,
                        at_unix_ns: 7,
                        kind: AgentEventKind::RankCheckpoint {
                            job: "j".into(),
                            incarnation: 2,
                            rank: 1,
                            step: 40,
                        },
                    },
                ],
            },
            Command::Admin {
                actor: "a".into(),
                op: AdminOp::Job(JobOp::Submit {
                    spec: JobSpec {
                        name: "j".into(),
                        ranks: 2,
                        hosts: vec!["h".into()],
                        labels: BTreeMap::from([("k".into(), "v".into())]),
                        command: vec!["x".into()],
                        env: BTreeMap::from([("A".into(), "b".into())]),
                        checkpoint_dir: "/c".into(),
                        checkpoint_every: 5,
                        max_restarts: 3,
                        backoff_ms: 1000,
                    },
                }),
                request: None,
            },
            Command::Admin {
                actor: "a".into(),
                op: AdminOp::Job(JobOp::Restart {
                    job: "j".into(),
                    reason: "r".into(),
                }),
                request: None,
            },
            Command::Job(JobCommand::Place {
                job: "j".into(),
                incarnation: 1,
                placement: vec!["h".into()],
            }),
            Command::Job(JobCommand::Restart {
                job: "j".into(),
                incarnation: 1,
                reason: "r".into(),
                planned: true,
            }),
            Command::Job(JobCommand::Halt {
                job: "j".into(),
                incarnation: 1,
            }),
            Command::OpenIntent {
                action: Action::StartRank {
                    job: "j".into(),
                    incarnation: 1,
                    rank: 0,
                    host: "h".into(),
                },
            },
            Command::OpenIntent {
                action: Action::CheckpointJob {
                    job: "j".into(),
                    incarnation: 1,
                    host: "h".into(),
                    halt: true,
                },
            },
            Command::OpenIntent {
                action: Action::StopJob {
                    job: "j".into(),
                    incarnation: 1,
                    host: "h".into(),
                },
            },
            Command::Playbook(RunCommand::Start {
                incident: 3,
                playbook: "nic-down".into(),
                version: 7,
            }),
        ];
        // Playbook steps are opened by their run, not proposed, but they
        // sit in intents (snapshots) and every operation must round-trip.
        let mark = crate::runs::JobMark {
            job: "j".into(),
            incarnation: 2,
            checkpoint: Some(40),
        };
        let ops = vec![
            StepOp::Failover {
                nic: "n".into(),
                to: "m".into(),
            },
            StepOp::Failback { nic: "n".into() },
            StepOp::CheckpointJobs {
                jobs: vec![mark.clone()],
            },
            StepOp::RestartJobs {
                jobs: vec![
                    mark,
                    crate::runs::JobMark {
                        job: "k".into(),
                        incarnation: 0,
                        checkpoint: None,
                    },
                ],
            },
            StepOp::Cordon,
            StepOp::Drain {
                deadline_ms: 600_000,
            },
            StepOp::WaitUntil {
                condition: "not nic_reusable".into(),
            },
            StepOp::ExcludeFromOwd,
            StepOp::IncludeInOwd,
            StepOp::Notify {
                message: "m".into(),
                webhook: Some("http://127.0.0.1:9/hook".into()),
            },
            StepOp::ReshapeRate {
                bits_per_sec: Some(40_000_000_000),
                edge_hold_us: Some(1_000),
            },
        ];
        let mut cmds = cmds;
        cmds.push(Command::InstallShippedPlaybooks {
            files: crate::playbook_store::shipped_files(),
        });
        cmds.push(Command::WebhookDone {
            id: 4,
            ok: false,
            detail: "webhook http://h/x answered 503: busy".into(),
        });
        for (i, op) in ops.into_iter().enumerate() {
            cmds.push(Command::OpenIntent {
                action: Action::PlaybookStep {
                    run: 1,
                    step: i as u32,
                    attempt: 2,
                    host: "h".into(),
                    op,
                },
            });
        }
        let p = Proposal { at_ms: 9, cmds };
        let bytes = bincode::serialize(&p).unwrap();
        let back: Proposal = bincode::deserialize(&bytes).unwrap();
        assert_eq!(back.cmds, p.cmds);
        let results: Vec<CmdResult> = vec![
            Ok(CmdOk::Done),
            Ok(CmdOk::Registered {
                last_applied_seq: 1,
            }),
            Ok(CmdOk::Acked { through: 2 }),
            Ok(CmdOk::IntentOpened { id: 3 }),
            Ok(CmdOk::RunStarted { id: 4 }),
            Err(not_found("host", "h")),
            Err(not_found("NIC", "h/n")),
            Err(CmdError::InvalidArgument("x".into())),
            Err(CmdError::FailedPrecondition("y".into())),
            Err(CmdError::SequenceGap {
                host: "h".into(),
                expected: 1,
                got: 3,
                acked: 0,
            }),
        ];
        let back: Vec<CmdResult> =
            bincode::deserialize(&bincode::serialize(&results).unwrap()).unwrap();
        assert_eq!(back, results);
        let mut st = ClusterState::default();
        register(&mut st, "h0");
        st.apply_proposal(
            &lid(2),
            &Proposal {
                at_ms: 2,
                cmds: vec![admin(AdminOp::Drain {
                    host: "h0".into(),
                    reason: "r".into(),
                    deadline_ms: None,
                })],
            },
        );
        // Placements and order intents are part of snapshots too.
        qp_event(&mut st, 3, 1, qp_kind("j", 1, "rail0", false)).unwrap();
        one(
            &mut st,
            4,
            4,
            admin(AdminOp::NicFailover {
                host: "h0".into(),
                nic: "rail0".into(),
                to: None,
            }),
        )
        .unwrap();
        assert!(!st.qps.is_empty() && st.open_intents().count() == 1);
        let back: ClusterState = bincode::deserialize(&bincode::serialize(&st).unwrap()).unwrap();
        assert_eq!(back, st);
    }

    fn qp_kind(job: &str, conn_id: u64, nic: &str, closed: bool) -> AgentEventKind {
        AgentEventKind::QpPlacement {
            job: job.into(),
            rank: 0,
            conn_id,
            nic: nic.into(),
            peer_host: "h9".into(),
            peer_rank: 1,
            rail: 0,
            moved: nic != "rail0",
            closed,
        }
    }

    fn qp_event(st: &mut ClusterState, index: u64, seq: u64, kind: AgentEventKind) -> CmdResult {
        one(
            st,
            index,
            index,
            Command::AgentEvents {
                host: "h0".into(),
                events: vec![AgentEvent {
                    seq,
                    at_unix_ns: 0,
                    kind,
                }],
            },
        )
    }

    #[test]
    fn qp_placements_are_recorded_moved_closed_and_reset() {
        let mut st = ClusterState::default();
        register(&mut st, "h0");
        qp_event(&mut st, 2, 1, qp_kind("j", 1, "rail0", false)).unwrap();
        qp_event(&mut st, 3, 2, qp_kind("j", 2, "rail0", false)).unwrap();
        qp_event(&mut st, 4, 3, qp_kind("k", 1, "rail1", false)).unwrap();
        let t = &st.qps["h0"];
        assert_eq!(t.len(), 3, "same conn id in two jobs is two connections");
        let key = |job: &str, conn_id| QpKey {
            job: job.into(),
            rank: 0,
            conn_id,
        };
        assert_eq!(t[&key("j", 1)].since_ms, 2);
        // A move updates the placement and its time; a repeat keeps the time.
        qp_event(&mut st, 5, 4, qp_kind("j", 1, "rail1", false)).unwrap();
        qp_event(&mut st, 6, 5, qp_kind("j", 1, "rail1", false)).unwrap();
        let q = &st.qps["h0"][&key("j", 1)];
        assert_eq!((q.nic.as_str(), q.moved, q.since_ms), ("rail1", true, 5));
        // Closing removes it; a resent (already applied) event changes nothing.
        qp_event(&mut st, 7, 6, qp_kind("j", 2, "rail0", true)).unwrap();
        assert!(!st.qps["h0"].contains_key(&key("j", 2)));
        let before = st.qps.clone();
        qp_event(&mut st, 8, 2, qp_kind("j", 2, "rail0", false)).unwrap();
        assert_eq!(st.qps, before, "exactly once");
        // Bad names are refused with nothing changed.
        let r = qp_event(&mut st, 9, 7, qp_kind("bad job", 3, "rail0", false));
        assert!(matches!(r, Err(CmdError::InvalidArgument(_))), "{r:?}");
        assert_eq!(st.hosts["h0"].last_event_seq, 6);
        // An agent restart forgets the host's placements.
        qp_event(&mut st, 10, 7, AgentEventKind::QpReset).unwrap();
        assert!(!st.qps.contains_key("h0"));
        assert!(st
            .events
            .iter()
            .any(|e| e.what.contains("2 connection placements forgotten")));
    }

    #[test]
    fn qp_placements_are_bounded_per_host() {
        let mut st = ClusterState::default();
        register(&mut st, "h0");
        let events: Vec<AgentEvent> = (1..=MAX_QPS_PER_HOST as u64 + 2)
            .map(|i| AgentEvent {
                seq: i,
                at_unix_ns: 0,
                kind: qp_kind("j", i, "rail0", false),
            })
            .collect();
        let r = one(
            &mut st,
            2,
            2,
            Command::AgentEvents {
                host: "h0".into(),
                events,
            },
        );
        assert_eq!(
            r,
            Ok(CmdOk::Acked {
                through: MAX_QPS_PER_HOST as u64 + 2
            }),
            "never stalls the agent's stream"
        );
        assert_eq!(st.qps["h0"].len(), MAX_QPS_PER_HOST);
        assert!(st.events.iter().any(|e| e.what.contains("not recorded")));
        // Updates of recorded connections still apply when full.
        qp_event(
            &mut st,
            3,
            MAX_QPS_PER_HOST as u64 + 3,
            qp_kind("j", 1, "rail1", false),
        )
        .unwrap();
        assert_eq!(
            st.qps["h0"][&QpKey {
                job: "j".into(),
                rank: 0,
                conn_id: 1
            }]
                .nic,
            "rail1"
        );
    }

    #[test]
    fn failover_and_failback_open_intents_closed_by_the_hosts_answer() {
        let mut st = ClusterState::default();
        register(&mut st, "h0");
        register(&mut st, "h1");
        let failover = admin(AdminOp::NicFailover {
            host: "h0".into(),
            nic: "rail0".into(),
            to: None,
        });
        assert_eq!(
            one(&mut st, 2, 2, failover.clone()),
            Ok(CmdOk::IntentOpened { id: 1 })
        );
        assert_eq!(
            st.intents[&1].action,
            Action::Failover {
                host: "h0".into(),
                nic: "rail0".into(),
                to: "rail1".into()
            },
            "the target resolves to the NIC's backup"
        );
        assert_eq!(
            one(&mut st, 3, 3, failover),
            Ok(CmdOk::IntentOpened { id: 1 }),
            "the same order while open is the same intent"
        );
        assert_eq!(st.admin_history.len(), 2, "both requests are recorded");
        // Only the host the order is for may answer it.
        let wrong = Command::OrderDone {
            host: "h1".into(),
            id: 1,
            ok: true,
            detail: "x".into(),
        };
        assert!(matches!(
            one(&mut st, 4, 4, wrong),
            Err(CmdError::InvalidArgument(_))
        ));
        assert_eq!(st.open_intents().count(), 1);
        let done = Command::OrderDone {
            host: "h0".into(),
            id: 1,
            ok: true,
            detail: "moved 3 connections".into(),
        };
        assert_eq!(one(&mut st, 5, 5, done.clone()), Ok(CmdOk::Done));
        assert_eq!(st.intents[&1].status, IntentStatus::Closed(Outcome::Done));
        assert_eq!(st.intents[&1].detail, "moved 3 connections");
        // A repeated answer changes nothing, not even a different one.
        let failed = Command::OrderDone {
            host: "h0".into(),
            id: 1,
            ok: false,
            detail: "late".into(),
        };
        let before = st.clone();
        assert_eq!(one(&mut st, 6, 6, done), Ok(CmdOk::Done));
        assert_eq!(one(&mut st, 7, 7, failed), Ok(CmdOk::Done));
        assert_eq!(st.intents, before.intents);
        assert_eq!(st.events, before.events);
        // A failback, answered as failed.
        let failback = admin(AdminOp::NicFailback {
            host: "h0".into(),
            nic: "rail0".into(),
        });
        assert_eq!(
            one(&mut st, 8, 8, failback),
            Ok(CmdOk::IntentOpened { id: 2 })
        );
        let r = one(
            &mut st,
            9,
            9,
            Command::OrderDone {
                host: "h0".into(),
                id: 2,
                ok: false,
                detail: "job j rank 0 did not answer".into(),
            },
        );
        assert_eq!(r, Ok(CmdOk::Done));
        assert_eq!(
            st.intents[&2].status,
            IntentStatus::Closed(Outcome::Failed {
                error: "job j rank 0 did not answer".into()
            })
        );
        // Answers to what is not an order are refused.
        let mut drain = st.clone();
        one(
            &mut drain,
            10,
            10,
            admin(AdminOp::Drain {
                host: "h0".into(),
                reason: "r".into(),
                deadline_ms: None,
            }),
        )
        .unwrap();
        one(
            &mut drain,
            11,
            11,
            Command::OpenIntent {
                action: Action::CompleteDrain { host: "h0".into() },
            },
        )
        .unwrap();
        let r = one(
            &mut drain,
            12,
            12,
            Command::OrderDone {
                host: "h0".into(),
                id: 3,
                ok: true,
                detail: String::new(),
            },
        );
        assert!(matches!(r, Err(CmdError::InvalidArgument(_))), "{r:?}");
    }

    #[test]
    fn bad_failover_and_failback_requests_change_nothing() {
        let mut st = ClusterState::default();
        register(&mut st, "h0");
        // A NIC without a backup.
        one(
            &mut st,
            2,
            2,
            Command::RegisterHost {
                host: "h1".into(),
                nics: vec![
                    NicSpec {
                        name: "rail0".into(),
                        rail: Some(0),
                        backup: None,
                        rdma_device: None,
                        addr: None,
                    },
                    NicSpec {
                        name: "rail1".into(),
                        rail: Some(1),
                        backup: None,
                        rdma_device: None,
                        addr: None,
                    },
                ],
                labels: BTreeMap::new(),
            },
        )
        .unwrap();
        // rail1 of h0 is down.
        one(
            &mut st,
            3,
            3,
            Command::AgentEvents {
                host: "h0".into(),
                events: vec![AgentEvent {
                    seq: 1,
                    at_unix_ns: 0,
                    kind: AgentEventKind::NicState {
                        nic: "rail1".into(),
                        state: NicState::Down,
                        carrier_changes: 1,
                        flaps: 0,
                        damping_penalty: 0.0,
                        coalesced: 0,
                        link_up: false,
                        probes_lost: false,
                    },
                }],
            },
        )
        .unwrap();
        let fo = |host: &str, nic: &str, to: Option<&str>| {
            admin(AdminOp::NicFailover {
                host: host.into(),
                nic: nic.into(),
                to: to.map(Into::into),
            })
        };
        let fb = |nic: &str| {
            admin(AdminOp::NicFailback {
                host: "h0".into(),
                nic: nic.into(),
            })
        };
        let before = st.clone();
        let cases: Vec<(Command, CmdError)> = vec![
            (fo("nope", "rail0", None), not_found("host", "nope")),
            (fo("h0", "rail9", None), not_found("NIC", "h0/rail9")),
            (
                fo("h0", "rail0", Some("rail0")),
                CmdError::InvalidArgument("--to \"rail0\" is the NIC being failed over".into()),
            ),
            (
                fo("h0", "rail0", Some("eth7")),
                CmdError::InvalidArgument("--to \"eth7\" is not a NIC of host \"h0\"".into()),
            ),
            (
                fo("h1", "rail0", None),
                CmdError::FailedPrecondition(
                    "NIC h1/rail0 has no backup configured; pass --to NIC".into(),
                ),
            ),
            (
                fo("h0", "rail0", None),
                CmdError::FailedPrecondition("target NIC h0/rail1 is Down".into()),
            ),
            (fb("rail9"), not_found("NIC", "h0/rail9")),
            (
                fb("rail1"),
                CmdError::FailedPrecondition(
                    "NIC h0/rail1 is Down; fail back once it is up".into(),
                ),
            ),
        ];
        for (i, (cmd, want)) in cases.into_iter().enumerate() {
            assert_eq!(st.validate(&cmd), Err(want.clone()), "case {i}");
            assert_eq!(one(&mut st, 10 + i as u64, 10, cmd), Err(want), "case {i}");
        }
        let mut after = st.clone();
        after.last_log_index = before.last_log_index;
        assert_eq!(after, before, "nothing written, not even history");
        // An explicit healthy target works where the backup does not.
        assert!(st.validate(&fo("h1", "rail0", Some("rail1"))).is_ok());
    }

    #[test]
    fn snapshot_roundtrip_preserves_model() {
        use raft_store::StateModel;
        let mut st = ClusterState::default();
        register(&mut st, "h0");
        let bytes = StateModel::encode(&st).unwrap();
        let back = <ClusterState as StateModel<TypeConfig>>::decode(&bytes).unwrap();
        assert_eq!(back, st);
    }

    fn register_nics(
        st: &mut ClusterState,
        index: u64,
        host: &str,
        nics: Vec<NicSpec>,
    ) -> CmdResult {
        one(
            st,
            index,
            index,
            Command::RegisterHost {
                host: host.into(),
                nics,
                labels: BTreeMap::new(),
            },
        )
    }

    fn data_nic(name: &str, rail: u32, addr: &str) -> NicSpec {
        NicSpec {
            name: name.into(),
            rail: Some(rail),
            backup: None,
            rdma_device: None,
            addr: Some(addr.into()),
        }
    }

    #[test]
    fn hosts_get_stable_ids_and_join_the_probe_graph() {
        let mut st = ClusterState::default();
        for i in 0..8u64 {
            let h = format!("h{i}");
            let nics = vec![data_nic("rail0", 0, &format!("10.0.0.{i}"))];
            register_nics(&mut st, i + 1, &h, nics).unwrap();
            assert_eq!(st.hosts[&h].id, i as u32);
        }
        assert_eq!(st.next_host_id, 8);
        assert_eq!(st.probe_graph.len(), 8);
        for h in st.hosts.values() {
            assert_eq!(st.probe_graph.degree(h.id), PROBE_DEGREE, "{}", h.name);
        }
        let version = st.probe_plan_version;
        assert_eq!(version, 8, "every join changes the plan");
        // Re-registering the same way changes neither graph nor version.
        let graph = st.probe_graph.clone();
        register_nics(&mut st, 20, "h3", vec![data_nic("rail0", 0, "10.0.0.3")]).unwrap();
        assert_eq!(st.probe_graph, graph);
        assert_eq!(st.probe_plan_version, version);
        assert_eq!(st.hosts["h3"].id, 3);
        // A new address (or rail) changes the plan, not the graph.
        register_nics(&mut st, 21, "h3", vec![data_nic("rail0", 0, "10.0.9.3")]).unwrap();
        assert_eq!(st.probe_graph, graph);
        assert_eq!(st.probe_plan_version, version + 1);
        assert_eq!(
            st.hosts["h3"].nics["rail0"].addr.as_deref(),
            Some("10.0.9.3")
        );
        register_nics(&mut st, 22, "h3", vec![data_nic("rail0", 1, "10.0.9.3")]).unwrap();
        assert_eq!(st.probe_plan_version, version + 2);
        // Replicas that apply the same log agree on the graph.
        let mut other = ClusterState::default();
        for i in 0..8u64 {
            let nics = vec![data_nic("rail0", 0, &format!("10.0.0.{i}"))];
            register_nics(&mut other, i + 1, &format!("h{i}"), nics).unwrap();
        }
        assert_eq!(other.probe_graph, graph);
    }

    #[test]
    fn a_bad_nic_address_is_refused_and_changes_nothing() {
        let mut st = ClusterState::default();
        register(&mut st, "h0");
        let before = st.clone();
        let r = register_nics(
            &mut st,
            2,
            "h1",
            vec![
                data_nic("rail0", 0, "10.0.0.1"),
                data_nic("rail1", 1, "10.0.0.256"),
            ],
        );
        assert_eq!(
            r,
            Err(CmdError::InvalidArgument(
                "address \"10.0.0.256\" of NIC \"rail1\" is not an IP address".into()
            ))
        );
        let mut after = st.clone();
        after.last_log_index = before.last_log_index;
        assert_eq!(after, before);
        // IPv6 is an IP address too.
        register_nics(&mut st, 3, "h1", vec![data_nic("rail0", 0, "fd00::1")]).unwrap();
    }

    fn clock(host: &str, state: ClockState) -> ClockChange {
        ClockChange {
            host: host.into(),
            state,
            offset_ns: Some(40.0),
            error_bound_ns: Some(250.0),
        }
    }

    #[test]
    fn clock_states_change_with_an_event_and_unknown_hosts_write_nothing() {
        let mut st = ClusterState::default();
        register(&mut st, "h0");
        register(&mut st, "h1");
        assert_eq!(st.hosts["h0"].clock.state, ClockState::Unsynced);
        let before = st.clone();
        for bad in [
            vec![
                clock("h0", ClockState::Synced),
                clock("ghost", ClockState::Synced),
            ],
            vec![
                clock("h0", ClockState::Synced),
                clock("h0", ClockState::Degraded),
            ],
            vec![ClockChange {
                offset_ns: Some(f64::NAN),
                ..clock("h0", ClockState::Synced)
            }],
            vec![ClockChange {
                error_bound_ns: Some(-1.0),
                ..clock("h0", ClockState::Synced)
            }],
        ] {
            let r = one(&mut st, 5, 5, Command::SetClockStates { changes: bad });
            assert!(r.is_err(), "{r:?}");
        }
        assert_eq!(
            one(
                &mut st,
                6,
                6,
                Command::SetClockStates {
                    changes: vec![clock("ghost", ClockState::Synced)]
                }
            ),
            Err(not_found("host", "ghost"))
        );
        let mut after = st.clone();
        after.last_log_index = before.last_log_index;
        assert_eq!(after, before, "nothing written");
        let change = Command::SetClockStates {
            changes: vec![clock("h0", ClockState::Synced)],
        };
        assert_eq!(one(&mut st, 7, 70, change.clone()), Ok(CmdOk::Done));
        let c = &st.hosts["h0"].clock;
        assert_eq!(
            (c.state, c.offset_ns, c.error_bound_ns, c.changed_ms),
            (ClockState::Synced, Some(40.0), Some(250.0), 70)
        );
        assert!(st
            .events
            .back()
            .is_some_and(|e| e.what == "clock Unsynced -> Synced (offset 40 ns ± 250 ns)"));
        // The same state again changes nothing, not even the figures.
        let events = st.events.len();
        let mut again = clock("h0", ClockState::Synced);
        again.offset_ns = Some(1.0);
        one(
            &mut st,
            8,
            80,
            Command::SetClockStates {
                changes: vec![again],
            },
        )
        .unwrap();
        assert_eq!(st.events.len(), events);
        assert_eq!(st.hosts["h0"].clock.changed_ms, 70);
    }
}
