//! The admin API: JSON request and reply bodies carried in `Admin.Call`, and
//! the error type every supervisor API returns.
//!
//! One request enum covers every admin operation so that forwarding to the
//! leader is a single code path: a follower forwards the whole [`AdminCall`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::{AdminOp, AdminRecord, ClusterEvent, Host, Incident, Intent, NodeId, Qp};

/// One admin call.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AdminCall {
    /// Who is asking (recorded with every write).
    pub actor: String,
    /// Serve a read from this supervisor's state without a leader round trip.
    #[serde(default)]
    pub stale: bool,
    /// Set by a follower that forwarded the call; the leader never forwards
    /// again (one hop at most).
    #[serde(default)]
    pub forwarded: bool,
    /// Makes a `Write` retry-safe: the cluster applies a request id at most
    /// once and answers a retry with the first result.
    #[serde(default)]
    pub request_id: Option<crate::model::RequestId>,
    pub request: AdminRequest,
}

/// Every admin operation.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
pub enum AdminRequest {
    Status,
    ClusterInit,
    ClusterMembers,
    AddMember {
        id: NodeId,
        addr: String,
    },
    RemoveMember {
        id: NodeId,
    },
    TransferLeader {
        id: NodeId,
    },
    NodeList,
    NodeShow {
        host: String,
    },
    Write {
        op: AdminOp,
    },
    Incidents {
        open_only: bool,
    },
    /// Every NIC of every host, optionally only those in one state.
    NicList {
        state: Option<crate::model::NicState>,
    },
    /// Events after `since`, oldest first, at most `limit`; with `newest`
    /// the last `limit` of them instead (still in order).
    Events {
        since: u64,
        limit: u32,
        #[serde(default)]
        newest: bool,
    },
    AdminHistory {
        limit: u32,
    },
    /// Connection placements, optionally of one host and/or one job.
    QpList {
        host: Option<String>,
        job: Option<String>,
    },
    /// Intents, most recent last.
    Intents {
        open_only: bool,
        limit: u32,
    },
    /// One intent (e.g. to wait for an order's outcome).
    IntentShow {
        id: u64,
    },
    /// The leader's clock solution (leader memory: always served by the
    /// leader, `--stale` or not).
    Clock,
    /// Per-path one-way delays and loss (leader memory, like `Clock`).
    Paths {
        /// Only paths from or to this host.
        host: Option<String>,
        /// At most this many (the worst p99 first); must be ≥ 1.
        top: Option<u32>,
    },
    /// Per-path queueing delay and contention (leader memory).
    Queueing {
        host: Option<String>,
        contended_only: bool,
        top: Option<u32>,
    },
    /// The topology's links with their contention scores (leader memory).
    Links,
    /// Desired and applied HTB shapes (replicated state).
    ShapeList {
        host: Option<String>,
    },
    /// Every job (ended ones included), by name.
    JobList,
    JobShow {
        job: String,
    },
    /// The end of a rank's captured output, fetched from its host's agent
    /// (through the leader: only it talks to agents).
    JobLogs {
        job: String,
        rank: u32,
        max_bytes: u32,
        /// Read on from this position instead of the log's end (follow).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<LogPosition>,
    },
    PlaybookList,
    PlaybookShow {
        name: String,
    },
    /// A dry run of a playbook file against the live state.
    PlaybookPlan {
        file: crate::model::playbook_store::PlaybookFile,
        incident: crate::model::playbook_store::PlanIncident,
    },
    /// Playbook runs (the most recent [`MAX_RUNS_REPLY`]), oldest first.
    PlaybookRuns {
        open_only: bool,
    },
}

/// Most runs in one `PlaybookRuns` reply (the newest).
pub const MAX_RUNS_REPLY: usize = 500;

impl AdminRequest {
    /// Whether the request changes state (and so must reach the leader).
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            AdminRequest::ClusterInit
                | AdminRequest::AddMember { .. }
                | AdminRequest::RemoveMember { .. }
                | AdminRequest::TransferLeader { .. }
                | AdminRequest::Write { .. }
        )
    }

    /// Whether only the leader has the answer (its in-memory probe data),
    /// so the call goes to the leader even with `--stale`.
    pub fn is_leader_memory(&self) -> bool {
        matches!(
            self,
            AdminRequest::Clock
                | AdminRequest::Paths { .. }
                | AdminRequest::JobLogs { .. }
                | AdminRequest::Queueing { .. }
                | AdminRequest::Links
        )
    }
}

/// A place in a rank's log: a byte offset of one incarnation's log.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct LogPosition {
    pub incarnation: u64,
    pub offset: u64,
}

/// A supervisor as seen in `status` and `cluster members`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MemberView {
    pub id: NodeId,
    pub addr: String,
    pub voter: bool,
    pub leader: bool,
    /// Highest log index known replicated to it (leader's view; None if unknown).
    pub matched: Option<u64>,
}

/// One event of `events --follow`: the event and, when the supervisor
/// that serves the stream applied it since it started, when (its clock,
/// Unix ns). On the member that led when the event was committed, that is
/// when it was committed and applied; a follower's time is its own (later)
/// apply, and entries replayed at start-up carry the start-up time. JSON
/// only (the event's fields flattened beside it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FollowedEvent {
    #[serde(flatten)]
    pub record: ClusterEvent,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_unix_ns: Option<u64>,
}

/// `railguard status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusView {
    pub answered_by: NodeId,
    pub leader: Option<NodeId>,
    pub term: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    /// Last log index covered by this node's latest snapshot.
    pub snapshot_index: Option<u64>,
    /// Log entries up to this index have been compacted away on this node.
    pub purged_index: Option<u64>,
    pub members: Vec<MemberView>,
    pub hosts_by_status: BTreeMap<String, usize>,
    pub open_incidents: Vec<Incident>,
    pub open_intents: Vec<Intent>,
}

/// A NIC with its host (`nic list`: one object per NIC).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NicView {
    pub host: String,
    #[serde(flatten)]
    pub nic: crate::model::Nic,
}

/// A connection placement with its host.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct QpView {
    pub host: String,
    #[serde(flatten)]
    pub qp: Qp,
}

/// Every reply body.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum AdminReply {
    Status(StatusView),
    Members {
        members: Vec<MemberView>,
    },
    Hosts {
        hosts: Vec<Host>,
    },
    Host {
        host: Host,
        jobs: Vec<String>,
    },
    Incidents {
        incidents: Vec<Incident>,
    },
    Nics {
        nics: Vec<NicView>,
    },
    Events {
        events: Vec<ClusterEvent>,
        /// Matching events the reply leaves out (the limit).
        #[serde(default)]
        omitted: u64,
    },
    History {
        records: Vec<AdminRecord>,
    },
    /// A write was committed at this log index.
    Committed {
        log_index: u64,
        detail: String,
    },
    Qps {
        qps: Vec<QpView>,
        /// More matched than one reply carries.
        truncated: bool,
    },
    Intents {
        intents: Vec<Intent>,
    },
    Intent {
        intent: Intent,
    },
    /// A write that opened an intent (an order) was committed.
    IntentOpened {
        id: u64,
        log_index: u64,
        detail: String,
    },
    /// `railguard clock`.
    Clock(ClockView),
    /// `railguard paths`.
    Paths(PathsView),
    /// `railguard paths --contended`.
    Queueing(QueueingView),
    /// `railguard links`.
    Links(LinksView),
    /// `railguard shape list`.
    Shapes {
        shapes: Vec<ShapeRow>,
    },
    Jobs {
        jobs: Vec<crate::model::jobs::Job>,
    },
    /// Boxed: a job is by far the largest reply.
    Job {
        job: Box<crate::model::jobs::Job>,
        /// Why a job waiting for placement is not placed yet.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        waiting: Option<String>,
    },
    JobLogs {
        host: String,
        incarnation: u64,
        text: String,
        /// The byte of that incarnation's log just after `text`.
        #[serde(default)]
        end_offset: u64,
        /// The newest incarnation with a log of the rank on the host.
        #[serde(default)]
        newest_incarnation: u64,
    },
    Playbooks {
        playbooks: Vec<PlaybookView>,
        version: u64,
    },
    Playbook {
        playbook: crate::model::playbook_store::StoredPlaybook,
    },
    PlaybookPlan {
        plan: Box<playbooks::Plan>,
        /// The stored playbook that would handle this incident today.
        matched_now: Option<String>,
    },
    PlaybookRuns {
        runs: Vec<crate::model::runs::RunView>,
        /// More matched than one reply carries (the oldest were left out).
        truncated: bool,
    },
}

/// A stored playbook in `playbook list`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PlaybookView {
    pub name: String,
    pub version: u64,
    pub priority: u32,
    /// Incident kinds it handles (empty: escalation only).
    pub incidents: Vec<String>,
    pub steps: usize,
    pub on_failure: Option<String>,
    pub applied_ms: u64,
    pub applied_by: String,
    pub description: String,
}

/// `railguard clock`: the leader's latest network clock solution.
///
/// Offsets are `clock_host - clock_reference` at the instant the
/// reference clock reads `solution.at_ns`; with each host's drift a reader
/// evaluates them at any reference time `t`:
/// `offset_ns + drift_ppb * 1e-9 * (t - at_ns)`. Numbers that are not
/// finite are `null`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ClockView {
    /// The leader that answered.
    pub answered_by: NodeId,
    /// The reference host (offset 0) of the solution, if there is one.
    pub reference: Option<String>,
    pub reference_id: Option<u32>,
    pub solution: Option<SolutionInfo>,
    /// Why the last solve failed, if it did.
    pub solve_error: Option<String>,
    /// Every registered host, by id.
    pub hosts: Vec<ClockHostView>,
    /// The edges the solve used (one per host pair and rail).
    pub edges: Vec<ClockEdgeView>,
}

/// Summary figures of a solution.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SolutionInfo {
    /// The reference clock's reading at which the offsets hold (ns).
    pub at_ns: i64,
    /// When the leader solved it (its wall clock, Unix ms).
    pub solved_unix_ms: u64,
    /// How long ago the leader solved it.
    pub age_ms: u64,
    pub chi2_per_dof: Option<f64>,
    pub dof: usize,
    pub edges_used: usize,
    pub edges_rejected: usize,
    /// Hosts connected to the reference (the reference included).
    pub hosts_solved: usize,
}

/// One host in `railguard clock`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ClockHostView {
    pub host: String,
    pub id: u32,
    /// The committed state (changes go through Raft).
    pub state: crate::model::ClockState,
    /// Leader time of the last committed change (Unix ms; 0: never).
    pub state_changed_ms: u64,
    /// The live solution for this host (none: not connected to the
    /// reference, or no solution).
    pub live: Option<LiveClock>,
    /// The NTP-style baseline: min-RTT offsets composed hop by hop along a
    /// BFS tree from the reference (none: not reachable over NTP edges).
    pub ntp: Option<NtpComposition>,
    /// The host's probe mesh as its latest summary gave it (none: no
    /// summary from it since this leader took over).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<ProbeLoad>,
}

/// What a host's probe mesh sends and costs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProbeLoad {
    /// Pairs/s per peer now (the CPU governor may hold it under the
    /// configured rate) and the configured rate.
    pub pairs_per_s: u32,
    pub max_pairs_per_s: u32,
    /// The probe thread's share of one core over its last window (%).
    pub cpu_pct: Option<f64>,
    /// Its CPU budget (% of one core; 0: no governor).
    pub cpu_budget_pct: f64,
    /// How long ago the summary arrived (ms).
    pub age_ms: u64,
}

/// A host's solved clock relative to the reference.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LiveClock {
    /// `clock_host - clock_ref` at the solution's `at_ns` (ns).
    pub offset_ns: f64,
    /// `d(clock_host - clock_ref)/d(clock_ref)` (ppb).
    pub drift_ppb: f64,
    pub error_bound_ns: f64,
    pub drift_error_ppb: f64,
    /// The solution's classification of the bound (before hysteresis).
    pub state: crate::model::ClockState,
    /// Set when the host is not in the current solution and its last
    /// solved clock is carried forward (holdover): for how long (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holdover_ms: Option<u64>,
}

/// The NTP-style offset of a host: the sum of the hops' offsets. Each hop
/// holds at its own time (`at_ns` on its reporter's clock); the sum is
/// not aligned to one instant, as in an NTP stratum hierarchy.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NtpComposition {
    /// `clock_host - clock_ref` (ns), the sum of `hops[].offset_ns`.
    pub offset_ns: f64,
    /// From the reference down to this host.
    pub hops: Vec<NtpHop>,
}

/// One hop of an NTP-style composition.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NtpHop {
    /// The parent (nearer the reference).
    pub from: String,
    /// The child.
    pub to: String,
    pub rail: u32,
    /// The host whose report this is; `at_ns` is on its clock.
    pub reporter: String,
    pub at_ns: i64,
    /// `clock_to - clock_from` (ns).
    pub offset_ns: f64,
    pub rtt_ns: i64,
}

/// One edge of the solve: `reporter`'s estimate of `clock_to - clock_from`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ClockEdgeView {
    /// The reporting host (its clock is the time axis).
    pub from: String,
    pub to: String,
    pub from_id: u32,
    pub to_id: u32,
    pub rail: u32,
    /// When the estimate holds, on `from`'s clock (ns).
    pub at_ns: i64,
    /// `clock_to - clock_from` at `at_ns` (ns).
    pub offset_ns: f64,
    pub drift_ppb: f64,
    pub error_bound_ns: f64,
    pub drift_error_ppb: f64,
    pub samples: u32,
    /// How long ago the leader received the report.
    pub report_age_ms: u64,
    /// The NTP-style estimate from the same probes (on `from`'s clock).
    pub ntp_at_ns: Option<i64>,
    pub ntp_offset_ns: Option<f64>,
    pub ntp_rtt_ns: Option<i64>,
    /// Half this edge's round trip beyond its host pair's quietest rail:
    /// the queueing bias it may carry, added to its error in the solve.
    #[serde(default)]
    pub queueing_ns: f64,
    /// Loop residual: measured minus fitted offset (ns).
    pub residual_ns: Option<f64>,
    /// Studentised residual.
    pub z: Option<f64>,
    pub drift_residual_ppb: Option<f64>,
    /// What the solve did with the edge (none: no solution).
    pub status: Option<EdgeFit>,
}

/// What the solve did with an edge.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum EdgeFit {
    Used,
    /// Set aside for its loop residual.
    Rejected,
    /// Not connected to the reference.
    Unreachable,
}

/// `railguard paths`: per directed path, the recent one-way delays and
/// probe loss, worst p99 first.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PathsView {
    pub answered_by: NodeId,
    /// The window the figures cover (s).
    pub window_s: u64,
    /// How per-second figures are combined over the window.
    pub aggregation: String,
    /// Age of the clock solution used for the network correction.
    pub solution_age_ms: Option<u64>,
    /// Paths matching the filter (before `top`).
    pub total: usize,
    pub paths: Vec<PathView>,
}

/// One directed path `src/src_nic → dst/dst_nic` on one rail.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PathView {
    pub src: String,
    pub src_nic: String,
    pub dst: String,
    pub dst_nic: String,
    pub rail: u32,
    /// One-way delay (µs): min of the per-second minima, median of the
    /// per-second medians, max of the per-second p99s (none without
    /// delay samples).
    pub min_us: Option<f64>,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    /// `100 × (1 − received/expected)` over the window (none: nothing
    /// expected).
    pub loss_pct: Option<f64>,
    pub expected: u64,
    pub received: u64,
    /// Delay samples in the window.
    pub samples: u64,
    /// Per-second summaries in the window.
    pub seconds: usize,
    /// Since the last summary for this path.
    pub age_ms: u64,
    /// The weakest correction applied to a second in the window.
    pub correction: Correction,
}

/// `railguard paths --contended`: the detector's per-path state.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct QueueingView {
    pub answered_by: NodeId,
    /// Whether a topology is loaded (without one nothing is localised).
    pub topology: bool,
    pub enter_us: f64,
    pub exit_us: f64,
    pub total: usize,
    pub paths: Vec<PathQueueing>,
}

/// `railguard links`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LinksView {
    pub answered_by: NodeId,
    pub topology: Option<String>,
    pub links: Vec<crate::topology::Link>,
    /// Directed links crossed by fresh paths, with their scores.
    pub scores: Vec<LinkScore>,
    /// Open `link_contention` incidents.
    pub incidents: Vec<crate::model::Incident>,
}

/// One host NIC's shape in `railguard shape list`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ShapeRow {
    pub host: String,
    pub nic: String,
    /// The desired shape (none: only an applied one is left to remove).
    pub desired: Option<crate::model::shaping::NicShape>,
    /// The version the agent confirmed (none: nothing installed).
    pub applied_version: Option<u64>,
}

/// How a path's delays were corrected.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Correction {
    /// Neither the reporter's pair line nor the network solution: raw
    /// receive minus send times, which include the clock offset.
    Raw,
    /// The reporter's pair line only (no network solution for both ends).
    Pair,
    /// The network effect applied: the leader's solution for both ends.
    Network,
}

/// Error categories, mapped onto gRPC status codes on the wire.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum ErrorKind {
    InvalidArgument,
    NotFound,
    FailedPrecondition,
    /// The caller's certificate does not allow the call (or there is none);
    /// nothing was written.
    PermissionDenied,
    /// No leader is reachable right now; nothing was written.
    Unavailable,
    /// The write may or may not have been committed (e.g. leadership changed
    /// after it was proposed). Read before retrying a non-idempotent write.
    Unknown,
    /// The caller's identity is over its write quota; nothing was written.
    /// The message says when to retry.
    ResourceExhausted,
    Internal,
}

/// An API error with a one-line message.
#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error, PartialEq, Eq)]
#[error("{message}")]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
    pub fn unknown(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unknown, message)
    }

    /// Whether the error guarantees nothing was written.
    pub fn is_definite(&self) -> bool {
        !matches!(self.kind, ErrorKind::Unknown | ErrorKind::Internal)
    }
}

impl From<crate::model::CmdError> for ApiError {
    fn from(e: crate::model::CmdError) -> Self {
        use crate::model::CmdError as E;
        let kind = match &e {
            E::NotFound { .. } => ErrorKind::NotFound,
            E::InvalidArgument(_) => ErrorKind::InvalidArgument,
            E::FailedPrecondition(_) | E::SequenceGap { .. } => ErrorKind::FailedPrecondition,
            E::RequestForgotten { .. } => ErrorKind::Unknown,
        };
        ApiError::new(kind, e.to_string())
    }
}

impl From<ApiError> for tonic::Status {
    fn from(e: ApiError) -> Self {
        let code = match e.kind {
            ErrorKind::InvalidArgument => tonic::Code::InvalidArgument,
            ErrorKind::NotFound => tonic::Code::NotFound,
            ErrorKind::FailedPrecondition => tonic::Code::FailedPrecondition,
            ErrorKind::PermissionDenied => tonic::Code::PermissionDenied,
            ErrorKind::Unavailable => tonic::Code::Unavailable,
            ErrorKind::Unknown => tonic::Code::Unknown,
            ErrorKind::ResourceExhausted => tonic::Code::ResourceExhausted,
            ErrorKind::Internal => tonic::Code::Internal,
        };
        let mut status = tonic::Status::new(code, e.message);
        if let Ok(v) = tonic::metadata::MetadataValue::try_from(format!("{:?}", e.kind)) {
            status.metadata_mut().insert(ERROR_KIND_HEADER, v);
        }
        status
    }
}

/// Metadata key naming the [`ErrorKind`] of an error the supervisor itself
/// produced. A status without it came from the transport (connection reset,
/// timeout...), where a write's outcome is unknown.
pub const ERROR_KIND_HEADER: &str = "rg-error-kind";

impl From<tonic::Status> for ApiError {
    fn from(s: tonic::Status) -> Self {
        let from_server = s
            .metadata()
            .get(ERROR_KIND_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if let Some(kind) = from_server {
            let kind = match kind.as_str() {
                "InvalidArgument" => ErrorKind::InvalidArgument,
                "NotFound" => ErrorKind::NotFound,
                "FailedPrecondition" => ErrorKind::FailedPrecondition,
                "PermissionDenied" => ErrorKind::PermissionDenied,
                "Unavailable" => ErrorKind::Unavailable,
                "ResourceExhausted" => ErrorKind::ResourceExhausted,
                "Internal" => ErrorKind::Internal,
                _ => ErrorKind::Unknown,
            };
            return ApiError::new(kind, s.message().to_string());
        }
        // Errors tonic raises itself for bad messages (decode failure, size
        // limits) are definite: the handler never ran.
        let kind = match s.code() {
            tonic::Code::InvalidArgument
            | tonic::Code::OutOfRange
            | tonic::Code::ResourceExhausted => ErrorKind::InvalidArgument,
            tonic::Code::PermissionDenied | tonic::Code::Unauthenticated => {
                ErrorKind::PermissionDenied
            }
            _ => ErrorKind::Unknown,
        };
        ApiError::new(kind, s.message().to_string())
    }
}

/// A directed path between two host NICs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PathKey {
    pub src: String,
    pub src_nic: String,
    pub dst: String,
    pub dst_nic: String,
    pub rail: u32,
}

impl PathKey {
    /// The same NIC pair in the other direction.
    pub fn reversed(&self) -> PathKey {
        PathKey {
            src: self.dst.clone(),
            src_nic: self.dst_nic.clone(),
            dst: self.src.clone(),
            dst_nic: self.src_nic.clone(),
            rail: self.rail,
        }
    }
}

impl std::fmt::Display for PathKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}→{}/{}",
            self.src, self.src_nic, self.dst, self.dst_nic
        )
    }
}

/// A path's detector state (`railguard paths --contended`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PathQueueing {
    pub path: PathKey,
    pub baseline_us: f64,
    pub queueing_p50_us: f64,
    pub queueing_p99_us: f64,
    pub contended: bool,
    /// How long it has been contended (ms).
    pub contended_ms: Option<u64>,
    pub age_ms: u64,
}

/// A directed link's score (`railguard links`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkScore {
    pub link: crate::topology::DirLink,
    pub rate_bps: Option<u64>,
    pub access: bool,
    /// Fresh paths crossing it, and how many are contended.
    pub paths: usize,
    pub contended: usize,
    pub score: f64,
    /// Named as a bottleneck now.
    pub bottleneck: bool,
    /// The worst queueing p99 among its contended paths (µs).
    pub queueing_p99_us: Option<f64>,
}
