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
    /// Record an intent (what is about to be done) before doing it.
    OpenIntent { action: Action },
    /// Record an intent's outcome and apply its effect.
    CloseIntent { id: u64, outcome: Outcome },
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
    Cordon { host: String },
    /// Make the host schedulable again (not while it is draining).
    Uncordon { host: String },
    /// Cordon, move the host's work away, then mark it Drained.
    Drain {
        host: String,
        reason: String,
        /// Unix ms after which remaining work is stopped.
        deadline_ms: Option<u64>,
    },
    /// Return a draining or drained host to service (also uncordons).
    Undrain { host: String },
    /// Set and remove labels.
    SetLabels {
        host: String,
        set: BTreeMap<String, String>,
        remove: Vec<String>,
    },
}

impl AdminOp {
    /// The host the operation targets.
    pub fn host(&self) -> &str {
        match self {
            AdminOp::Cordon { host }
            | AdminOp::Uncordon { host }
            | AdminOp::Drain { host, .. }
            | AdminOp::Undrain { host }
            | AdminOp::SetLabels { host, .. } => host,
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
    },
}

/// Things the reconciler does; each is recorded as an intent first.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    /// Finish draining a host once no work remains on it (or its deadline
    /// passed and the remaining work was stopped).
    CompleteDrain { host: String },
}

impl Action {
    fn host(&self) -> &str {
        match self {
            Action::CompleteDrain { host } => host,
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
}

/// A training job (its lifecycle arrives with the jobs issue; drain already
/// consults placement).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Job {
    pub name: String,
    /// Host of each rank.
    pub placement: Vec<String>,
    pub incarnation: u64,
}

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
    /// Index of the last applied log entry (for status output).
    pub last_log_index: u64,
}

fn check_name(what: &str, s: &str) -> Result<(), CmdError> {
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

impl ClusterState {
    /// Checks a command against the current state without changing anything.
    pub fn validate(&self, cmd: &Command) -> Result<(), CmdError> {
        match cmd {
            Command::RegisterHost { host, nics, labels } => {
                check_name("host name", host)?;
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
                let host = self
                    .hosts
                    .get(op.host())
                    .ok_or_else(|| not_found("host", op.host()))?;
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
            Command::OpenIntent { action } => {
                let host = action.host();
                if !self.hosts.contains_key(host) {
                    return Err(not_found("host", host));
                }
                Ok(())
            }
            Command::CloseIntent { id, .. } => match self.intents.get(id) {
                None => Err(not_found("intent", &id.to_string())),
                Some(_) => Ok(()),
            },
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

    fn log_event(&mut self, at_ms: u64, host: Option<&str>, what: String) {
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
                    labels: BTreeMap::new(),
                    nics: BTreeMap::new(),
                    cordoned: false,
                    drain: None,
                    liveness: Liveness::Ready,
                    registered_ms: at_ms,
                    last_event_seq: 0,
                    open_incident: None,
                });
                let mut new_nics = BTreeMap::new();
                for spec in nics {
                    let mut nic = h.nics.remove(&spec.name).unwrap_or(Nic {
                        name: spec.name.clone(),
                        rail: None,
                        backup: None,
                        rdma_device: None,
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
                    new_nics.insert(spec.name.clone(), nic);
                }
                h.nics = new_nics;
                for (k, v) in labels {
                    h.labels.insert(k.clone(), v.clone());
                }
                let last = h.last_event_seq;
                let changed = existing.as_ref() != Some(&h);
                self.hosts.insert(host.clone(), h);
                if existing.is_none() {
                    self.log_event(
                        at_ms,
                        Some(host),
                        format!("host registered with {} NICs", nics.len()),
                    );
                } else if changed {
                    self.log_event(at_ms, Some(host), "host re-registered".into());
                }
                Ok(CmdOk::Registered {
                    last_applied_seq: last,
                })
            }
            Command::Admin { actor, op, .. } => {
                let host = self.hosts.get_mut(op.host()).expect("validated");
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
                };
                let host_name = op.host().to_owned();
                self.admin_history.push_back(AdminRecord {
                    at_ms,
                    actor: actor.clone(),
                    op: op.clone(),
                    log_index: index,
                });
                while self.admin_history.len() > MAX_ADMIN_HISTORY {
                    self.admin_history.pop_front();
                }
                self.log_event(at_ms, Some(&host_name), format!("{what} (by {actor})"));
                Ok(CmdOk::Done)
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
                            "missed heartbeats".into(),
                        );
                        self.hosts.get_mut(host).expect("validated").open_incident = Some(id);
                    }
                    _ => {
                        if let Some(id) = open {
                            self.close_incident(at_ms, id, "host is back");
                        }
                    }
                }
                Ok(CmdOk::Done)
            }
            Command::OpenIntent { action } => {
                if let Some(existing) = self
                    .intents
                    .values()
                    .find(|i| i.status == IntentStatus::Open && &i.action == action)
                {
                    return Ok(CmdOk::IntentOpened { id: existing.id });
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
                    },
                );
                self.log_event(
                    at_ms,
                    Some(action.host()),
                    format!("intent {id} opened: {action:?}"),
                );
                Ok(CmdOk::IntentOpened { id })
            }
            Command::CloseIntent { id, outcome } => {
                let intent = self.intents.get(id).expect("validated").clone();
                if intent.status != IntentStatus::Open {
                    // Idempotent by id: closing twice changes nothing.
                    return Ok(CmdOk::Done);
                }
                let mut outcome = outcome.clone();
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
                    }
                }
                let host = intent.action.host().to_owned();
                let e = self.intents.get_mut(id).expect("validated");
                e.status = IntentStatus::Closed(outcome.clone());
                e.closed_ms = Some(at_ms);
                self.prune_closed_intents(*id);
                let what = match (&intent.action, &outcome) {
                    (Action::CompleteDrain { .. }, Outcome::Done) => {
                        format!("drained (intent {id})")
                    }
                    (_, o) => format!("intent {id} closed: {o:?}"),
                };
                self.log_event(at_ms, Some(&host), what);
                Ok(CmdOk::Done)
            }
        }
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
                        },
                    )
                }
            }
            through = e.seq;
            self.hosts.get_mut(host).expect("validated").last_event_seq = through;
        }
        Ok(CmdOk::Acked { through })
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
        let link = if r.link_up { "up" } else { "down" };
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

    fn open_incident(
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
            },
        );
        self.log_event(at_ms, Some(host), format!("incident {id} opened: {kind}"));
        id
    }

    fn close_incident(&mut self, at_ms: u64, id: u64, why: &str) {
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

fn check_labels(
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
                    },
                    NicSpec {
                        name: "rail1".into(),
                        rail: Some(1),
                        backup: Some("rail0".into()),
                        rdma_device: None,
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
        ];
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
            Err(not_found("host", "h")),
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
        let back: ClusterState = bincode::deserialize(&bincode::serialize(&st).unwrap()).unwrap();
        assert_eq!(back, st);
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
}
