//! Jobs in the replicated model: spec, lifecycle, placement, checkpoints,
//! restarts, and the drain that moves them.
//!
//! **Lifecycle.** `Pending` (submitted, waiting for hosts) → `Running` (an
//! incarnation is placed; its ranks are started by `StartRank` orders) ⇄
//! `Checkpointing` (a `CheckpointJob` order per host is open) → `Succeeded`
//! when every rank exited 0. A rank that fails, a host that goes Down, a
//! failed start or `job restart` make it `Restarting`: the incarnation's
//! hosts get `StopJob` orders, and once they are answered (and the backoff
//! passed) the job is placed again — spares first, surviving hosts kept —
//! as the next incarnation, resuming from its latest complete checkpoint.
//! More than `max_restarts` failures: `Failed`. `job cancel`: `Cancelled`.
//!
//! **Fencing.** Every order carries the incarnation; orders of an older
//! incarnation are cancelled here, refused by agents, and the ranks of two
//! incarnations cannot talk (their connection ids differ).
//!
//! **Checkpoints.** A checkpoint at step N is complete once every rank
//! reported its part (agent `RankCheckpoint` events, or the `step=N`
//! answer of a checkpoint order); only complete checkpoints are restart
//! points. Steps are deterministic, so parts written by different
//! incarnations of the same rank are the same part.
//!
//! **Drain.** A job with a rank on a draining host is checkpointed with
//! `halt` (its ranks agree on a step, write it and compute nothing more),
//! then restarted off the host from exactly that step: no step is lost and
//! the move does not count as a failure. At the drain deadline whatever is
//! still there is stopped and restarted from the latest complete checkpoint.
//!
//! Everything here runs inside Raft apply or as a pure function of the
//! state: no clock, no randomness, no I/O.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::model::{
    Action, ClusterState, CmdError, CmdOk, CmdResult, HostStatus, IntentStatus, Liveness,
    MAX_REASON_LEN,
};

/// Most jobs kept (finished ones are forgotten oldest first beyond it).
pub const MAX_JOBS: usize = 1_024;
/// Most ranks of one job.
pub const MAX_RANKS: u32 = 1_024;
/// Longest command line (arguments, bytes in total) and environment.
pub const MAX_COMMAND_BYTES: usize = 16 << 10;
/// Most environment entries of a job.
pub const MAX_ENV: usize = 128;
/// Checkpoint steps remembered per job (the newest).
pub const MAX_CHECKPOINTS: usize = 16;
/// Longest restart backoff.
pub const MAX_BACKOFF_MS: u64 = 300_000;
/// Data ports are `PORT_BASE + job number % PORT_SPAN`.
pub const PORT_BASE: u16 = 20_000;
pub const PORT_SPAN: u64 = 20_000;

/// What `railguard job submit` asks for.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    pub name: String,
    pub ranks: u32,
    /// Hosts the job may use (empty: any); the first `ranks` of them are
    /// preferred in rank order.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Placement constraint: hosts must carry these labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The rank's command line (argv).
    pub command: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Where ranks write checkpoints (absolute; shared by the hosts).
    pub checkpoint_dir: String,
    /// Steps between periodic checkpoints (0: only on order).
    #[serde(default)]
    pub checkpoint_every: u64,
    #[serde(default = "default_max_restarts")]
    pub max_restarts: u32,
    /// First restart delay; doubles with each failure in a row (without a
    /// new complete checkpoint between them) up to [`MAX_BACKOFF_MS`].
    #[serde(default = "default_backoff_ms")]
    pub backoff_ms: u64,
}

fn default_max_restarts() -> u32 {
    3
}
fn default_backoff_ms() -> u64 {
    1_000
}

impl JobSpec {
    /// Checks what the types cannot.
    pub fn validate(&self) -> Result<(), CmdError> {
        let bad = |m: String| Err(CmdError::InvalidArgument(m));
        crate::model::check_name("job name", &self.name)?;
        if self.ranks == 0 || self.ranks > MAX_RANKS {
            return bad(format!("ranks must be 1..={MAX_RANKS}"));
        }
        if !self.hosts.is_empty() && self.hosts.len() < self.ranks as usize {
            return bad(format!(
                "{} ranks need at least as many hosts; `hosts` lists {}",
                self.ranks,
                self.hosts.len()
            ));
        }
        let mut seen = BTreeSet::new();
        for h in &self.hosts {
            crate::model::check_name("host name", h)?;
            if !seen.insert(h) {
                return bad(format!("host {h:?} is listed twice"));
            }
        }
        crate::model::check_labels(&self.labels, &[])?;
        if self.command.is_empty() || self.command[0].is_empty() {
            return bad("command must name a program".into());
        }
        let bytes: usize = self.command.iter().map(|a| a.len() + 1).sum::<usize>()
            + self
                .env
                .iter()
                .map(|(k, v)| k.len() + v.len() + 2)
                .sum::<usize>();
        if bytes > MAX_COMMAND_BYTES {
            return bad(format!(
                "command and environment take {bytes} bytes; at most {MAX_COMMAND_BYTES}"
            ));
        }
        if self.command.iter().any(|a| a.contains('\0')) {
            return bad("command arguments cannot contain NUL".into());
        }
        if self.env.len() > MAX_ENV {
            return bad(format!("at most {MAX_ENV} environment entries"));
        }
        for (k, v) in &self.env {
            let ok = !k.is_empty()
                && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !k.starts_with(|c: char| c.is_ascii_digit());
            if !ok || v.contains('\0') {
                return bad(format!(
                    "environment variable {k:?} needs a name of letters, digits and _ (not first) and a value without NUL"
                ));
            }
            if k.starts_with("RAILGUARD_") {
                return bad(format!(
                    "environment variable {k:?}: RAILGUARD_* is set by the agent"
                ));
            }
        }
        if !self.checkpoint_dir.starts_with('/') || self.checkpoint_dir.contains('\0') {
            return bad(format!(
                "checkpoint_dir must be an absolute path, got {:?}",
                self.checkpoint_dir
            ));
        }
        if self.checkpoint_dir.len() > 4096 {
            return bad("checkpoint_dir is longer than 4096 bytes".into());
        }
        if self.max_restarts > 1_000 {
            return bad("max_restarts must be at most 1000".into());
        }
        if self.backoff_ms > MAX_BACKOFF_MS {
            return bad(format!(
                "backoff must be at most {} s",
                MAX_BACKOFF_MS / 1000
            ));
        }
        Ok(())
    }
}

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Pending,
    Running,
    Checkpointing,
    Restarting,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobState {
    /// Succeeded, Failed or Cancelled: nothing more happens.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }
}

/// How a rank ended, as its agent reported.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Exit {
    pub code: i32,
    /// The signal that ended it (0: it exited by itself).
    pub signal: i32,
    pub detail: String,
}

impl Exit {
    pub fn success(&self) -> bool {
        self.code == 0 && self.signal == 0
    }

    fn describe(&self) -> String {
        let how = if self.signal != 0 {
            format!("killed by signal {}", self.signal)
        } else {
            format!("exit code {}", self.code)
        };
        if self.detail.is_empty() {
            how
        } else {
            format!("{how} ({})", self.detail)
        }
    }
}

/// One rank of the current incarnation.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Rank {
    pub host: String,
    /// Its agent answered the start order.
    pub started: bool,
    pub exit: Option<Exit>,
}

/// A training job.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Job {
    pub name: String,
    /// Host of each rank of the current incarnation (empty while none is
    /// placed).
    pub placement: Vec<String>,
    /// Bumped each time the job is placed; every order carries it.
    pub incarnation: u64,
    pub spec: JobSpec,
    pub state: JobState,
    /// Submission number (gives the data port).
    pub number: u64,
    pub port: u16,
    pub submitted_ms: u64,
    pub state_since_ms: u64,
    /// Restarts after failures (planned moves are not counted).
    pub restarts: u32,
    /// Failures since the job last completed a checkpoint: the backoff's
    /// exponent (a job that makes progress between failures keeps a short
    /// backoff, as Kubernetes resets CrashLoopBackOff after a good run).
    #[serde(default)]
    pub failures_in_a_row: u32,
    /// No placement before this leader time (restart backoff).
    pub not_before_ms: u64,
    pub ranks: Vec<Rank>,
    /// The step the current incarnation resumed from (0: from scratch).
    pub resume_step: u64,
    /// Ranks whose part of the checkpoint at each step is durable (the
    /// newest [`MAX_CHECKPOINTS`] steps). A list of pairs on the wire: the
    /// admin JSON is an internally tagged enum, which cannot read integer
    /// map keys back.
    #[serde(with = "pairs")]
    pub checkpoints: BTreeMap<u64, BTreeSet<u32>>,
    /// The newest complete checkpoint.
    pub latest_checkpoint: Option<u64>,
    /// When it became complete (leader time).
    #[serde(default)]
    pub latest_checkpoint_ms: Option<u64>,
    /// Hosts whose ranks of an older incarnation must be stopped before the
    /// job is placed again (host → that incarnation).
    pub stopping: BTreeMap<String, u64>,
    /// The placement before the last stop (kept hosts are preferred).
    pub previous_placement: Vec<String>,
    /// The current checkpoint order halts the ranks (a drain moves the job).
    pub halting: bool,
    /// Hosts that were Down when an incarnation of theirs ended: they get
    /// a stop order when they are back (host → newest such incarnation).
    #[serde(default)]
    pub fenced: BTreeMap<String, u64>,
    /// Why the job last restarted, failed or was cancelled.
    pub reason: String,
}

impl Job {
    /// Hosts of the current incarnation, each once.
    pub fn hosts(&self) -> BTreeSet<&str> {
        self.placement.iter().map(String::as_str).collect()
    }

    fn record_checkpoint(&mut self, at_ms: u64, rank: u32, step: u64) -> bool {
        if step == 0 || rank >= self.spec.ranks {
            return false;
        }
        let e = self.checkpoints.entry(step).or_default();
        e.insert(rank);
        while self.checkpoints.len() > MAX_CHECKPOINTS {
            self.checkpoints.pop_first();
        }
        let complete = self
            .checkpoints
            .get(&step)
            .is_some_and(|r| r.len() == self.spec.ranks as usize);
        if complete && self.latest_checkpoint.is_none_or(|s| s < step) {
            self.latest_checkpoint = Some(step);
            self.latest_checkpoint_ms = Some(at_ms);
            self.failures_in_a_row = 0;
            return true;
        }
        false
    }
}

/// A map as a sequence of (key, value) pairs.
mod pairs {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<K, V, S>(m: &BTreeMap<K, V>, s: S) -> Result<S::Ok, S::Error>
    where
        K: Serialize,
        V: Serialize,
        S: Serializer,
    {
        s.collect_seq(m.iter())
    }

    pub fn deserialize<'de, K, V, D>(d: D) -> Result<BTreeMap<K, V>, D::Error>
    where
        K: Deserialize<'de> + Ord,
        V: Deserialize<'de>,
        D: Deserializer<'de>,
    {
        Ok(Vec::<(K, V)>::deserialize(d)?.into_iter().collect())
    }
}

/// The data port of the `number`th job.
pub fn port_of(number: u64) -> u16 {
    PORT_BASE + (number % PORT_SPAN) as u16
}

/// Whether a host may receive new ranks of `spec`.
fn eligible(st: &ClusterState, host: &str, spec: &JobSpec) -> bool {
    let Some(h) = st.hosts.get(host) else {
        return false;
    };
    h.liveness == Liveness::Ready
        && h.status() == HostStatus::Ready
        && (spec.hosts.is_empty() || spec.hosts.iter().any(|x| x == host))
        && spec.labels.iter().all(|(k, v)| h.labels.get(k) == Some(v))
        && h.nics
            .values()
            .any(|n| n.rail.is_some() && n.addr.is_some())
}

/// Ranks of other live jobs on each host.
fn load<'a>(st: &'a ClusterState, except: &str) -> BTreeMap<&'a str, usize> {
    let mut l = BTreeMap::new();
    for j in st.jobs.values().filter(|j| j.name != except) {
        for h in &j.placement {
            *l.entry(h.as_str()).or_default() += 1;
        }
    }
    l
}

/// Where the job's next incarnation would run: hosts of the previous
/// placement that are still eligible keep their ranks; the others go to
/// eligible hosts with the fewest ranks of other jobs (spares first), then
/// in the spec's host order, then by name. `None` when there are not enough.
pub fn place(st: &ClusterState, job: &Job) -> Option<Vec<String>> {
    let n = job.spec.ranks as usize;
    let mut out: Vec<Option<String>> = vec![None; n];
    let mut used = BTreeSet::new();
    for (r, h) in job.previous_placement.iter().enumerate().take(n) {
        if eligible(st, h, &job.spec) && used.insert(h.clone()) {
            out[r] = Some(h.clone());
        }
    }
    let load = load(st, &job.name);
    let order = |h: &str| {
        job.spec
            .hosts
            .iter()
            .position(|x| x == h)
            .unwrap_or(usize::MAX)
    };
    let mut spare: Vec<&str> = st
        .hosts
        .keys()
        .map(String::as_str)
        .filter(|h| !used.contains(*h) && eligible(st, h, &job.spec))
        .collect();
    spare.sort_by_key(|h| (load.get(h).copied().unwrap_or(0), order(h), *h));
    let mut spare = spare.into_iter();
    for slot in out.iter_mut().filter(|s| s.is_none()) {
        *slot = Some(spare.next()?.to_owned());
    }
    out.into_iter().collect()
}

/// Leader decisions about jobs (proposed by the reconciler, checked again
/// at apply).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum JobCommand {
    /// Place the job's next incarnation (`incarnation` is the current one).
    Place {
        job: String,
        incarnation: u64,
        placement: Vec<String>,
    },
    /// Stop the incarnation and place the job again (`planned`: a move
    /// that does not count as a failure and waits no backoff).
    Restart {
        job: String,
        incarnation: u64,
        reason: String,
        planned: bool,
    },
    /// Checkpoint the incarnation with `halt` (a drain moves it).
    Halt { job: String, incarnation: u64 },
}

/// Admin operations on jobs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum JobOp {
    Submit { spec: JobSpec },
    Cancel { job: String },
    Restart { job: String, reason: String },
    Checkpoint { job: String },
}

impl JobOp {
    pub fn job(&self) -> &str {
        match self {
            JobOp::Submit { spec } => &spec.name,
            JobOp::Cancel { job } | JobOp::Restart { job, .. } | JobOp::Checkpoint { job } => job,
        }
    }
}

impl ClusterState {
    fn job(&self, name: &str) -> Result<&Job, CmdError> {
        self.jobs.get(name).ok_or_else(|| CmdError::NotFound {
            kind: "job".into(),
            name: name.into(),
        })
    }

    /// Validation of an admin job operation (nothing changes).
    pub(crate) fn validate_job_op(&self, op: &JobOp) -> Result<(), CmdError> {
        match op {
            JobOp::Submit { spec } => {
                spec.validate()?;
                if self.jobs.contains_key(&spec.name) {
                    return Err(CmdError::FailedPrecondition(format!(
                        "a job named {:?} exists; cancel it or choose another name",
                        spec.name
                    )));
                }
                if let Some(h) = spec.hosts.iter().find(|h| !self.hosts.contains_key(*h)) {
                    return Err(CmdError::NotFound {
                        kind: "host".into(),
                        name: h.clone(),
                    });
                }
                if self.jobs.len() >= MAX_JOBS && !self.jobs.values().any(|j| j.state.is_final()) {
                    return Err(CmdError::FailedPrecondition(format!(
                        "{MAX_JOBS} jobs are live; cancel some first"
                    )));
                }
                Ok(())
            }
            JobOp::Cancel { job } => {
                let j = self.job(job)?;
                if j.state.is_final() {
                    return Err(CmdError::FailedPrecondition(format!(
                        "job {job:?} already ended ({:?})",
                        j.state
                    )));
                }
                Ok(())
            }
            JobOp::Restart { job, reason } => {
                let j = self.job(job)?;
                check_reason(reason)?;
                if !matches!(j.state, JobState::Running | JobState::Checkpointing) {
                    return Err(CmdError::FailedPrecondition(format!(
                        "job {job:?} is {:?}; only a running job can be restarted",
                        j.state
                    )));
                }
                Ok(())
            }
            JobOp::Checkpoint { job } => {
                let j = self.job(job)?;
                match j.state {
                    JobState::Running if j.ranks.iter().all(|r| r.started) => Ok(()),
                    JobState::Running => Err(CmdError::FailedPrecondition(format!(
                        "job {job:?} is still starting its ranks"
                    ))),
                    JobState::Checkpointing => Err(CmdError::FailedPrecondition(format!(
                        "job {job:?} is already checkpointing"
                    ))),
                    s => Err(CmdError::FailedPrecondition(format!(
                        "job {job:?} is {s:?}; only a running job can checkpoint"
                    ))),
                }
            }
        }
    }

    /// Applies a validated admin job operation; returns what to log.
    pub(crate) fn apply_job_op(&mut self, at_ms: u64, op: &JobOp, actor: &str) -> String {
        match op {
            JobOp::Submit { spec } => {
                self.forget_finished_jobs();
                self.next_job_number += 1;
                let number = self.next_job_number;
                let job = Job {
                    name: spec.name.clone(),
                    placement: Vec::new(),
                    incarnation: 0,
                    spec: spec.clone(),
                    state: JobState::Pending,
                    number,
                    port: port_of(number),
                    submitted_ms: at_ms,
                    state_since_ms: at_ms,
                    restarts: 0,
                    failures_in_a_row: 0,
                    not_before_ms: 0,
                    ranks: Vec::new(),
                    resume_step: 0,
                    checkpoints: BTreeMap::new(),
                    latest_checkpoint: None,
                    latest_checkpoint_ms: None,
                    stopping: BTreeMap::new(),
                    previous_placement: spec
                        .hosts
                        .iter()
                        .take(spec.ranks as usize)
                        .cloned()
                        .collect(),
                    halting: false,
                    fenced: BTreeMap::new(),
                    reason: String::new(),
                };
                self.jobs.insert(spec.name.clone(), job);
                format!("job {} submitted: {} ranks", spec.name, spec.ranks)
            }
            JobOp::Cancel { job } => {
                self.stop_job(
                    at_ms,
                    job,
                    JobState::Cancelled,
                    &format!("cancelled by {actor}"),
                );
                format!("job {job} cancelled")
            }
            JobOp::Restart { job, reason } => {
                let inc = self.jobs[job].incarnation;
                self.restart_job(at_ms, job, inc, &format!("{reason} (by {actor})"), true);
                format!("job {job} restart ordered: {reason}")
            }
            JobOp::Checkpoint { job } => {
                self.checkpoint_job(at_ms, job, false);
                format!("job {job} checkpoint ordered")
            }
        }
    }

    fn forget_finished_jobs(&mut self) {
        while self.jobs.len() >= MAX_JOBS {
            let oldest = self
                .jobs
                .values()
                .filter(|j| j.state.is_final())
                .min_by_key(|j| (j.state_since_ms, j.number))
                .map(|j| j.name.clone());
            match oldest {
                Some(n) => {
                    self.jobs.remove(&n);
                }
                None => break,
            }
        }
    }

    pub(crate) fn validate_job_command(&self, c: &JobCommand) -> Result<(), CmdError> {
        match c {
            JobCommand::Place {
                job,
                incarnation,
                placement,
            } => {
                let j = self.job(job)?;
                if j.incarnation != *incarnation {
                    return Err(stale(job, *incarnation, j.incarnation));
                }
                if !matches!(j.state, JobState::Pending | JobState::Restarting) {
                    return Err(CmdError::FailedPrecondition(format!(
                        "job {job:?} is {:?}, not waiting for placement",
                        j.state
                    )));
                }
                if !j.stopping.is_empty() {
                    return Err(CmdError::FailedPrecondition(format!(
                        "job {job:?} still has ranks to stop"
                    )));
                }
                if placement.len() != j.spec.ranks as usize {
                    return Err(CmdError::InvalidArgument(format!(
                        "placement of {} hosts for {} ranks",
                        placement.len(),
                        j.spec.ranks
                    )));
                }
                let mut seen = BTreeSet::new();
                for h in placement {
                    if !seen.insert(h) || !eligible(self, h, &j.spec) {
                        return Err(CmdError::FailedPrecondition(format!(
                            "host {h:?} cannot take a rank of job {job:?}"
                        )));
                    }
                }
                Ok(())
            }
            JobCommand::Restart {
                job, incarnation, ..
            }
            | JobCommand::Halt { job, incarnation } => {
                let j = self.job(job)?;
                if let JobCommand::Restart { reason, .. } = c {
                    check_reason(reason)?;
                }
                if j.incarnation != *incarnation {
                    return Err(stale(job, *incarnation, j.incarnation));
                }
                if !matches!(j.state, JobState::Running | JobState::Checkpointing) {
                    return Err(CmdError::FailedPrecondition(format!(
                        "job {job:?} is {:?}",
                        j.state
                    )));
                }
                Ok(())
            }
        }
    }

    pub(crate) fn apply_job_command(&mut self, at_ms: u64, c: &JobCommand) -> CmdResult {
        match c {
            JobCommand::Place { job, placement, .. } => {
                let j = self.jobs.get_mut(job).expect("validated");
                j.incarnation += 1;
                j.placement = placement.clone();
                j.ranks = placement
                    .iter()
                    .map(|h| Rank {
                        host: h.clone(),
                        started: false,
                        exit: None,
                    })
                    .collect();
                j.resume_step = j.latest_checkpoint.unwrap_or(0);
                j.state = JobState::Running;
                j.state_since_ms = at_ms;
                j.halting = false;
                let what = format!(
                    "job {job} incarnation {} placed on {} (resuming from {})",
                    j.incarnation,
                    placement.join(","),
                    match j.resume_step {
                        0 => "scratch".to_string(),
                        s => format!("step {s}"),
                    }
                );
                self.log_job(at_ms, what);
            }
            JobCommand::Restart {
                job,
                incarnation,
                reason,
                planned,
            } => self.restart_job(at_ms, job, *incarnation, reason, *planned),
            JobCommand::Halt { job, .. } => self.checkpoint_job(at_ms, job, true),
        }
        Ok(CmdOk::Done)
    }

    /// Opens a checkpoint order per host of the incarnation.
    pub(crate) fn checkpoint_job(&mut self, at_ms: u64, job: &str, halt: bool) {
        let j = self.jobs.get_mut(job).expect("validated");
        j.state = JobState::Checkpointing;
        j.state_since_ms = at_ms;
        j.halting = halt;
        let inc = j.incarnation;
        let hosts: Vec<String> = j.hosts().into_iter().map(str::to_owned).collect();
        for host in hosts {
            self.open_intent(
                at_ms,
                &Action::CheckpointJob {
                    job: job.to_owned(),
                    incarnation: inc,
                    host,
                    halt,
                },
            );
        }
    }

    /// Ends the incarnation: its hosts (those not Down) get stop orders.
    fn stop_incarnation(&mut self, job: &str) {
        let hosts = &self.hosts;
        let j = self.jobs.get_mut(job).expect("job exists");
        for h in j.placement.iter() {
            match hosts.get(h) {
                Some(x) if x.liveness != Liveness::Down => {
                    j.stopping.insert(h.clone(), j.incarnation);
                }
                // Unreachable: its ranks may still run (a partition). They
                // cannot talk to the next incarnation (connection ids), and
                // the host is told to stop them when it is back.
                Some(_) => {
                    let e = j.fenced.entry(h.clone()).or_default();
                    *e = (*e).max(j.incarnation);
                }
                None => {}
            }
        }
        if !j.placement.is_empty() {
            j.previous_placement = std::mem::take(&mut j.placement);
        }
        j.halting = false;
    }

    /// Stops the job for good (`state` final).
    fn stop_job(&mut self, at_ms: u64, job: &str, state: JobState, reason: &str) {
        self.stop_incarnation(job);
        let j = self.jobs.get_mut(job).expect("job exists");
        j.state = state;
        j.state_since_ms = at_ms;
        j.reason = reason.to_owned();
        self.log_job(at_ms, format!("job {job} {state:?}: {reason}"));
    }

    /// Stops the incarnation and schedules the next one (`planned`: no
    /// backoff, not counted). Stale incarnations and ended jobs are left
    /// alone.
    pub(crate) fn restart_job(
        &mut self,
        at_ms: u64,
        job: &str,
        incarnation: u64,
        reason: &str,
        planned: bool,
    ) {
        let Some(j) = self.jobs.get(job) else { return };
        if j.incarnation != incarnation
            || !matches!(j.state, JobState::Running | JobState::Checkpointing)
        {
            return;
        }
        if !planned && j.restarts >= j.spec.max_restarts {
            let why = format!("{reason}; gave up after {} restarts", j.restarts);
            self.stop_job(at_ms, job, JobState::Failed, &why);
            return;
        }
        self.stop_incarnation(job);
        let j = self.jobs.get_mut(job).expect("job exists");
        if !planned {
            j.restarts += 1;
            j.failures_in_a_row = j.failures_in_a_row.saturating_add(1);
            let shift = (j.failures_in_a_row - 1).min(16);
            let backoff = j
                .spec
                .backoff_ms
                .saturating_mul(1 << shift)
                .min(MAX_BACKOFF_MS);
            j.not_before_ms = at_ms.saturating_add(backoff);
        } else {
            j.not_before_ms = at_ms;
        }
        j.state = JobState::Restarting;
        j.state_since_ms = at_ms;
        j.reason = reason.to_owned();
        let what = format!(
            "job {job} incarnation {incarnation} stopped for a restart{} (restarts {}): {reason}",
            if planned { " (planned)" } else { "" },
            j.restarts
        );
        self.log_job(at_ms, what);
    }

    /// A host is back from Down: stop whatever older incarnations it may
    /// still run.
    pub(crate) fn jobs_host_back(&mut self, host: &str) {
        for j in self.jobs.values_mut() {
            if let Some(inc) = j.fenced.remove(host) {
                let e = j.stopping.entry(host.to_owned()).or_default();
                *e = (*e).max(inc);
            }
        }
    }

    pub(crate) fn apply_rank_exited(
        &mut self,
        at_ms: u64,
        host: &str,
        job: &str,
        incarnation: u64,
        rank: u32,
        exit: Exit,
    ) {
        let Some(j) = self.jobs.get_mut(job) else {
            return;
        };
        // A rank ends once: an agent that crashed between reporting an
        // exit and forgetting the rank reports it again after its restart.
        let current = j.incarnation == incarnation
            && matches!(j.state, JobState::Running | JobState::Checkpointing)
            && j.ranks
                .get(rank as usize)
                .is_some_and(|r| r.host == host && r.exit.is_none());
        let what = format!(
            "job {job} incarnation {incarnation} rank {rank} ended: {}",
            exit.describe()
        );
        if !current {
            self.log_observed_job(at_ms, host, format!("{what} (not the current incarnation)"));
            return;
        }
        let ok = exit.success();
        j.ranks[rank as usize].exit = Some(exit);
        let all_done = j
            .ranks
            .iter()
            .all(|r| r.exit.as_ref().is_some_and(Exit::success));
        self.log_observed_job(at_ms, host, what.clone());
        if all_done {
            let j = self.jobs.get_mut(job).expect("exists");
            j.state = JobState::Succeeded;
            j.state_since_ms = at_ms;
            j.previous_placement = std::mem::take(&mut j.placement);
            j.reason = "every rank finished".into();
            self.log_job(at_ms, format!("job {job} succeeded"));
        } else if !ok {
            self.restart_job(at_ms, job, incarnation, &what, false);
        }
    }

    pub(crate) fn apply_rank_checkpoint(
        &mut self,
        at_ms: u64,
        host: &str,
        job: &str,
        incarnation: u64,
        rank: u32,
        step: u64,
    ) {
        let Some(j) = self.jobs.get_mut(job) else {
            return;
        };
        // Parts from any incarnation of the rank count (steps are
        // deterministic); the host must have run that rank at some point,
        // which the incarnation check approximates for the current one.
        if incarnation == j.incarnation && j.ranks.get(rank as usize).is_none_or(|r| r.host != host)
        {
            return;
        }
        if j.record_checkpoint(at_ms, rank, step) {
            self.log_job(
                at_ms,
                format!("job {job}: checkpoint at step {step} complete"),
            );
        }
    }

    /// Effect of a closed job order intent.
    pub(crate) fn job_order_closed(&mut self, at_ms: u64, action: &Action, ok: bool, detail: &str) {
        match action {
            Action::StartRank {
                job,
                incarnation,
                rank,
                host,
            } => {
                let Some(j) = self.jobs.get_mut(job) else {
                    return;
                };
                if j.incarnation != *incarnation {
                    return;
                }
                if ok {
                    if let Some(r) = j.ranks.get_mut(*rank as usize) {
                        r.started = true;
                    }
                } else {
                    let why = format!("rank {rank} could not start on {host}: {detail}");
                    self.restart_job(at_ms, job, *incarnation, &why, false);
                }
            }
            Action::StopJob {
                job,
                incarnation,
                host,
            } => {
                let Some(j) = self.jobs.get_mut(job) else {
                    return;
                };
                if j.stopping.get(host) == Some(incarnation) {
                    j.stopping.remove(host);
                }
            }
            Action::CheckpointJob {
                job,
                incarnation,
                host,
                ..
            } => {
                let Some(j) = self.jobs.get_mut(job) else {
                    return;
                };
                if j.incarnation != *incarnation || j.state != JobState::Checkpointing {
                    return;
                }
                if ok {
                    if let Some(step) = step_of(detail) {
                        let ranks: Vec<u32> = (0..j.ranks.len() as u32)
                            .filter(|r| j.ranks[*r as usize].host == *host)
                            .collect();
                        let mut complete = false;
                        for r in ranks {
                            complete |= j.record_checkpoint(at_ms, r, step);
                        }
                        if complete {
                            self.log_job(
                                at_ms,
                                format!("job {job}: checkpoint at step {step} complete"),
                            );
                        }
                    }
                }
                let still_open = self.intents.values().any(|i| {
                    i.status == IntentStatus::Open
                        && matches!(&i.action, Action::CheckpointJob { job: ij, incarnation: ii, .. } if ij == job && ii == incarnation)
                });
                if still_open {
                    return;
                }
                let j = self.jobs.get_mut(job).expect("exists");
                if j.halting {
                    // The ranks halted at the checkpoint (or the order
                    // failed): move the job from exactly there.
                    let why = if ok {
                        "moving off a draining host".to_string()
                    } else {
                        format!("moving off a draining host (checkpoint failed: {detail})")
                    };
                    self.restart_job(at_ms, job, *incarnation, &why, true);
                } else {
                    j.state = JobState::Running;
                    j.state_since_ms = at_ms;
                }
            }
            _ => {}
        }
    }

    fn log_job(&mut self, at_ms: u64, what: String) {
        self.log_event(at_ms, None, what);
    }

    fn log_observed_job(&mut self, at_ms: u64, host: &str, what: String) {
        self.log_event(at_ms, Some(host), what);
    }
}

/// The step in an order answer (`step=N`).
pub fn step_of(detail: &str) -> Option<u64> {
    detail
        .split(|c: char| c.is_whitespace() || c == ',' || c == ';')
        .find_map(|w| w.strip_prefix("step=")?.parse().ok())
}

fn stale(job: &str, got: u64, now: u64) -> CmdError {
    CmdError::FailedPrecondition(format!("job {job:?} is at incarnation {now}, not {got}"))
}

fn check_reason(reason: &str) -> Result<(), CmdError> {
    if reason.len() > MAX_REASON_LEN {
        return Err(CmdError::InvalidArgument(format!(
            "reason is longer than {MAX_REASON_LEN} bytes"
        )));
    }
    Ok(())
}

/// Leader decisions the state calls for now (pure): placements, drain
/// moves, drain deadlines.
pub fn wanted_job_commands(st: &ClusterState, now_ms: u64) -> Vec<JobCommand> {
    let mut out = Vec::new();
    for j in st.jobs.values() {
        match j.state {
            JobState::Pending | JobState::Restarting
                if j.stopping.is_empty() && now_ms >= j.not_before_ms =>
            {
                if let Some(placement) = place(st, j) {
                    out.push(JobCommand::Place {
                        job: j.name.clone(),
                        incarnation: j.incarnation,
                        placement,
                    });
                }
            }
            JobState::Running | JobState::Checkpointing => {
                let draining: Vec<&crate::model::Host> = j
                    .hosts()
                    .into_iter()
                    .filter_map(|h| st.hosts.get(h))
                    .filter(|h| h.status() == HostStatus::Draining)
                    .collect();
                if draining.is_empty() {
                    continue;
                }
                let overdue = draining.iter().find(|h| {
                    h.drain
                        .as_ref()
                        .and_then(|d| d.deadline_ms)
                        .is_some_and(|d| now_ms >= d)
                });
                if let Some(h) = overdue {
                    out.push(JobCommand::Restart {
                        job: j.name.clone(),
                        incarnation: j.incarnation,
                        reason: format!("drain deadline of {} passed", h.name),
                        planned: true,
                    });
                } else if j.state == JobState::Running && j.ranks.iter().all(|r| r.started) {
                    out.push(JobCommand::Halt {
                        job: j.name.clone(),
                        incarnation: j.incarnation,
                    });
                }
            }
            _ => {}
        }
    }
    out
}

/// Orders the jobs call for that have no intent yet (pure).
pub fn wanted_job_actions(st: &ClusterState) -> Vec<Action> {
    let mut out = Vec::new();
    for j in st.jobs.values() {
        if j.state == JobState::Running || j.state == JobState::Checkpointing {
            for (r, rank) in j.ranks.iter().enumerate() {
                if !rank.started {
                    out.push(Action::StartRank {
                        job: j.name.clone(),
                        incarnation: j.incarnation,
                        rank: r as u32,
                        host: rank.host.clone(),
                    });
                }
            }
        }
        for (host, inc) in &j.stopping {
            out.push(Action::StopJob {
                job: j.name.clone(),
                incarnation: *inc,
                host: host.clone(),
            });
        }
    }
    out
}

/// Whether a job order is still worth carrying out (`Some(why)`: cancel it).
pub fn job_order_obsolete(st: &ClusterState, action: &Action) -> Option<String> {
    match action {
        Action::StartRank {
            job, incarnation, ..
        }
        | Action::CheckpointJob {
            job, incarnation, ..
        } => match st.jobs.get(job) {
            None => Some(format!("job {job} no longer exists")),
            Some(j) if j.incarnation != *incarnation => Some(format!(
                "job {job} moved on to incarnation {}",
                j.incarnation
            )),
            Some(j) if !matches!(j.state, JobState::Running | JobState::Checkpointing) => {
                Some(format!("job {job} is {:?}", j.state))
            }
            Some(_) => None,
        },
        Action::StopJob {
            job,
            incarnation,
            host,
        } => match st.jobs.get(job) {
            None => Some(format!("job {job} no longer exists")),
            Some(j) if j.stopping.get(host) != Some(incarnation) => {
                Some("nothing left to stop".into())
            }
            Some(_)
                if st
                    .hosts
                    .get(host)
                    .is_none_or(|h| h.liveness == Liveness::Down) =>
            {
                Some(format!(
                    "host {host} is down; its agent stops the ranks when it returns"
                ))
            }
            Some(_) => None,
        },
        _ => None,
    }
}

/// Registers host `name` (the `i`th) with `rail0`/`rail1`, each the other's
/// backup, at 10.<rail>.0.<i+1> (for tests).
#[cfg(test)]
pub(crate) fn register_two_rails_for_test(i: usize, name: &str) -> crate::model::Command {
    crate::model::Command::RegisterHost {
        host: name.to_string(),
        nics: (0..2)
            .map(|r| crate::model::NicSpec {
                name: format!("rail{r}"),
                rail: Some(r),
                backup: Some(format!("rail{}", 1 - r)),
                rdma_device: None,
                addr: Some(format!("10.{r}.0.{}", i + 1)),
            })
            .collect(),
        labels: BTreeMap::new(),
    }
}

/// A running job placed on `hosts` (for tests of code that only looks at
/// placement).
#[cfg(test)]
pub(crate) fn placed_for_test(name: &str, hosts: &[&str]) -> Job {
    let spec = tests::spec(name, hosts.len() as u32);
    Job {
        name: name.into(),
        placement: hosts.iter().map(|h| h.to_string()).collect(),
        incarnation: 1,
        state: JobState::Running,
        number: 1,
        port: port_of(1),
        submitted_ms: 0,
        state_since_ms: 0,
        restarts: 0,
        failures_in_a_row: 0,
        not_before_ms: 0,
        ranks: hosts
            .iter()
            .map(|h| Rank {
                host: h.to_string(),
                started: true,
                exit: None,
            })
            .collect(),
        resume_step: 0,
        checkpoints: BTreeMap::new(),
        latest_checkpoint: None,
        latest_checkpoint_ms: None,
        stopping: BTreeMap::new(),
        previous_placement: Vec::new(),
        halting: false,
        fenced: BTreeMap::new(),
        reason: String::new(),
        spec,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_is_read_from_order_answers() {
        assert_eq!(step_of("step=42"), Some(42));
        assert_eq!(step_of("rank 0: step=7, rank 1: step=7"), Some(7));
        assert_eq!(step_of("no step"), None);
        assert_eq!(step_of("step=x"), None);
    }

    #[test]
    fn ports_stay_in_their_range() {
        assert_eq!(port_of(1), PORT_BASE + 1);
        assert_eq!(port_of(PORT_SPAN), PORT_BASE);
        assert!(port_of(u64::MAX) < PORT_BASE + PORT_SPAN as u16);
    }

    #[test]
    fn job_names_limits() {
        let mut s = spec("j", 2);
        assert!(s.validate().is_ok());
        s.env.insert("RAILGUARD_RANK".into(), "3".into());
        assert!(s.validate().is_err());
        let mut s = spec("j", 2);
        s.checkpoint_dir = "relative".into();
        assert!(s.validate().is_err());
        let mut s = spec("j", 0);
        s.ranks = 0;
        assert!(s.validate().is_err());
        let mut s = spec("j", 2);
        s.hosts = vec!["a".into()];
        assert!(s.validate().is_err());
    }

    use crate::model::{AdminOp, AgentEvent, AgentEventKind, Command, Outcome, Proposal};
    use openraft::{CommittedLeaderId, LogId};

    struct World {
        st: ClusterState,
        t: u64,
        seq: BTreeMap<String, u64>,
    }

    impl World {
        fn new(hosts: &[&str]) -> Self {
            let mut w = World {
                st: ClusterState::default(),
                t: 0,
                seq: BTreeMap::new(),
            };
            for (i, h) in hosts.iter().enumerate() {
                w.ok(super::register_two_rails_for_test(i, h));
            }
            // A new cluster's playbooks (host-down restarts the jobs).
            w.ok(Command::InstallShippedPlaybooks {
                files: crate::playbook_store::shipped_files(),
            });
            w
        }

        fn apply(&mut self, cmd: Command) -> CmdResult {
            self.t += 1;
            let lid = LogId::new(CommittedLeaderId::new(1, 1), self.t);
            self.st
                .apply_proposal(
                    &lid,
                    &Proposal {
                        at_ms: self.t * 1000,
                        cmds: vec![cmd],
                    },
                )
                .remove(0)
        }

        fn ok(&mut self, cmd: Command) {
            let r = self.apply(cmd.clone());
            assert!(r.is_ok(), "{cmd:?} refused: {r:?}");
        }

        fn admin(&mut self, op: JobOp) -> CmdResult {
            self.apply(Command::Admin {
                actor: "t".into(),
                op: AdminOp::Job(op),
                request: None,
            })
        }

        fn event(&mut self, host: &str, kind: AgentEventKind) {
            let seq = self.seq.entry(host.into()).or_default();
            *seq += 1;
            let e = AgentEvent {
                seq: *seq,
                at_unix_ns: 0,
                kind,
            };
            self.ok(Command::AgentEvents {
                host: host.into(),
                events: vec![e],
            });
        }

        /// Runs the leader's decisions and answers every open order the
        /// way `answer` says, until nothing changes (bounded).
        fn settle(&mut self, mut answer: impl FnMut(&Action) -> Option<(bool, String)>) {
            for _ in 0..50 {
                let now = self.t * 1000 + 100_000;
                let mut progressed = false;
                for c in wanted_job_commands(&self.st, now) {
                    progressed |= self.apply(Command::Job(c)).is_ok();
                }
                for c in crate::runs::wanted_run_commands(&self.st) {
                    progressed |= self.apply(Command::Playbook(c)).is_ok();
                }
                for a in crate::reconciler::wanted_actions(&self.st) {
                    self.ok(Command::OpenIntent { action: a });
                    progressed = true;
                }
                let open: Vec<_> = self.st.open_intents().cloned().collect();
                for i in open {
                    if let Some(o) = crate::reconciler::evaluate(&self.st, &i, self.t * 1000) {
                        self.ok(Command::CloseIntent {
                            id: i.id,
                            outcome: o,
                        });
                        progressed = true;
                        continue;
                    }
                    if !i.action.is_order() {
                        continue;
                    }
                    if let Some((ok, detail)) = answer(&i.action) {
                        self.ok(Command::OrderDone {
                            host: i.action.host().into(),
                            id: i.id,
                            ok,
                            detail,
                        });
                        progressed = true;
                    }
                }
                if !progressed {
                    return;
                }
            }
            panic!("the job state did not settle");
        }

        fn job(&self) -> &Job {
            &self.st.jobs["j"]
        }
    }

    fn obey(a: &Action) -> Option<(bool, String)> {
        Some((
            true,
            match a {
                Action::CheckpointJob { .. } => "step=40".into(),
                _ => "pid=1".into(),
            },
        ))
    }

    fn exited(job: &str, incarnation: u64, rank: u32, code: i32) -> AgentEventKind {
        AgentEventKind::RankExited {
            job: job.into(),
            incarnation,
            rank,
            exit_code: code,
            signal: 0,
            detail: String::new(),
        }
    }

    fn ckpt(incarnation: u64, rank: u32, step: u64) -> AgentEventKind {
        AgentEventKind::RankCheckpoint {
            job: "j".into(),
            incarnation,
            rank,
            step,
        }
    }

    #[test]
    fn a_job_runs_to_success_on_ready_hosts_only() {
        let mut w = World::new(&["h0", "h1", "h2"]);
        w.ok(Command::Admin {
            actor: "t".into(),
            op: AdminOp::Cordon { host: "h0".into() },
            request: None,
        });
        w.admin(JobOp::Submit { spec: spec("j", 2) }).unwrap();
        assert_eq!(w.job().state, JobState::Pending);
        w.settle(obey);
        let j = w.job();
        assert_eq!(j.state, JobState::Running);
        assert_eq!(
            j.placement,
            vec!["h1".to_string(), "h2".to_string()],
            "never the cordoned host"
        );
        assert!(j.ranks.iter().all(|r| r.started));
        let order = crate::orders::open_orders(&w.st);
        assert!(order.is_empty(), "every start order answered");
        w.event("h1", exited("j", 1, 0, 0));
        assert_eq!(
            w.job().state,
            JobState::Running,
            "one rank is still running"
        );
        // The agent restarted and reports the same rank again as lost.
        w.event("h1", exited("j", 1, 0, -1));
        assert_eq!(w.job().state, JobState::Running, "a rank ends once");
        assert_eq!(w.job().restarts, 0);
        w.event("h2", exited("j", 1, 1, 0));
        assert_eq!(w.job().state, JobState::Succeeded);
        assert!(
            w.st.jobs_on("h1").next().is_none(),
            "a finished job holds no host"
        );
    }

    #[test]
    fn start_orders_carry_peers_command_and_checkpoint() {
        let mut w = World::new(&["h0", "h1"]);
        w.admin(JobOp::Submit { spec: spec("j", 2) }).unwrap();
        w.settle(|_| None);
        let orders = crate::orders::open_orders(&w.st);
        assert_eq!(orders.len(), 2);
        let Some(proto::v1::agent_order::Kind::StartRank(s)) = &orders[1].1.kind else {
            panic!("{orders:?}");
        };
        assert_eq!(orders[1].0, "h1");
        assert_eq!((s.rank, s.incarnation, s.resume_step), (1, 1, 0));
        assert_eq!(s.peers.len(), 2);
        assert_eq!(s.peers[0].host, "h0");
        assert_eq!(
            s.peers[1].addrs,
            vec!["10.0.0.2".to_string(), "10.1.0.2".to_string()]
        );
        assert_eq!(s.argv, vec!["/bin/true".to_string()]);
        assert_eq!(s.checkpoint_every, 10);
        assert_eq!(s.port, u32::from(w.job().port));
    }

    #[test]
    fn a_failed_rank_restarts_the_job_from_its_latest_complete_checkpoint() {
        let mut w = World::new(&["h0", "h1", "h2"]);
        w.admin(JobOp::Submit { spec: spec("j", 2) }).unwrap();
        w.settle(obey);
        w.event("h0", ckpt(1, 0, 10));
        w.event("h1", ckpt(1, 1, 10));
        w.event("h0", ckpt(1, 0, 20)); // incomplete: rank 1 never wrote 20
        assert_eq!(w.job().latest_checkpoint, Some(10));
        w.event("h1", exited("j", 1, 1, 75));
        let j = w.job();
        assert_eq!(j.state, JobState::Restarting);
        assert_eq!(j.restarts, 1);
        assert_eq!(j.stopping.len(), 2, "both hosts stop incarnation 1");
        // A late event from the old incarnation changes nothing.
        w.event("h0", exited("j", 1, 0, 143));
        assert_eq!(w.job().restarts, 1);
        w.settle(obey);
        let j = w.job();
        assert_eq!(j.state, JobState::Running);
        assert_eq!(j.incarnation, 2);
        assert_eq!(j.resume_step, 10);
        assert_eq!(
            j.placement,
            vec!["h0".to_string(), "h1".to_string()],
            "survivors keep their ranks"
        );
        let stops =
            w.st.intents
                .values()
                .filter(|i| matches!(i.action, Action::StopJob { incarnation: 1, .. }))
                .count();
        assert_eq!(stops, 2);
    }

    #[test]
    fn a_lost_host_is_replaced_by_a_spare_and_is_not_ordered_to_stop() {
        let mut w = World::new(&["h0", "h1", "h2", "h3"]);
        w.admin(JobOp::Submit {
            spec: spec("busy", 1),
        })
        .unwrap();
        w.settle(obey);
        assert_eq!(w.st.jobs["busy"].placement, vec!["h0".to_string()]);
        w.admin(JobOp::Submit { spec: spec("j", 2) }).unwrap();
        w.settle(obey);
        assert_eq!(w.job().placement, vec!["h1".to_string(), "h2".to_string()]);
        w.ok(Command::SetLiveness {
            host: "h2".into(),
            liveness: Liveness::Down,
        });
        // The host-down playbook's run restarts the job.
        assert_eq!(w.job().state, JobState::Running, "nothing hard-wired");
        w.settle(obey);
        let j = w.job();
        assert!(w.st.runs.values().any(|r| r.playbook == "host-down"));
        assert_eq!(j.incarnation, 2);
        assert_eq!(
            j.placement,
            vec!["h1".to_string(), "h3".to_string()],
            "the idle spare h3, not the busy h0"
        );
        assert!(!w
            .st
            .intents
            .values()
            .any(|i| matches!(&i.action, Action::StopJob { host, .. } if host == "h2")));
    }

    #[test]
    fn the_backoff_doubles_per_failure_in_a_row_and_resets_after_progress() {
        let mut w = World::new(&["h0"]);
        let mut s = spec("j", 1);
        s.max_restarts = 10;
        s.backoff_ms = 1_000;
        w.admin(JobOp::Submit { spec: s }).unwrap();
        w.settle(obey);
        let mut delays = Vec::new();
        for inc in 1..=3 {
            w.event("h0", exited("j", inc, 0, 1));
            delays.push(w.job().not_before_ms - w.t * 1000);
            w.settle(obey);
        }
        assert_eq!(delays, vec![1_000, 2_000, 4_000]);
        w.event("h0", ckpt(4, 0, 10));
        w.event("h0", exited("j", 4, 0, 1));
        assert_eq!(
            w.job().not_before_ms - w.t * 1000,
            1_000,
            "progress resets the backoff"
        );
        assert_eq!(w.job().restarts, 4, "but every restart counts");
    }

    #[test]
    fn a_host_back_from_down_is_told_to_stop_the_old_incarnation() {
        let mut w = World::new(&["h0", "h1", "h2"]);
        w.admin(JobOp::Submit { spec: spec("j", 2) }).unwrap();
        w.settle(obey);
        w.ok(Command::SetLiveness {
            host: "h1".into(),
            liveness: Liveness::Down,
        });
        w.settle(obey);
        assert_eq!(w.job().incarnation, 2, "placed without waiting for h1");
        assert!(w.job().stopping.is_empty());
        w.ok(Command::SetLiveness {
            host: "h1".into(),
            liveness: Liveness::Ready,
        });
        assert_eq!(w.job().stopping.get("h1"), Some(&1));
        let stop = crate::reconciler::wanted_actions(&w.st);
        assert!(
            stop.contains(&Action::StopJob {
                job: "j".into(),
                incarnation: 1,
                host: "h1".into()
            }),
            "{stop:?}"
        );
        w.settle(obey);
        assert!(w.job().stopping.is_empty());
        assert!(w.job().fenced.is_empty());
    }

    #[test]
    fn too_many_failures_fail_the_job() {
        let mut w = World::new(&["h0"]);
        let mut s = spec("j", 1);
        s.max_restarts = 1;
        w.admin(JobOp::Submit { spec: s }).unwrap();
        w.settle(obey);
        w.event("h0", exited("j", 1, 0, 1));
        assert_eq!(w.job().state, JobState::Restarting);
        assert!(w.job().not_before_ms > w.t * 1000, "backoff");
        w.settle(obey);
        assert_eq!(w.job().incarnation, 2);
        w.event("h0", exited("j", 2, 0, 1));
        assert_eq!(w.job().state, JobState::Failed);
        assert!(w.job().reason.contains("gave up"), "{}", w.job().reason);
    }

    #[test]
    fn drain_halts_the_job_at_a_checkpoint_and_moves_it_without_losing_a_step() {
        let mut w = World::new(&["h0", "h1", "h2"]);
        w.admin(JobOp::Submit { spec: spec("j", 2) }).unwrap();
        w.settle(obey);
        assert_eq!(w.job().placement, vec!["h0".to_string(), "h1".to_string()]);
        w.ok(Command::Admin {
            actor: "t".into(),
            op: AdminOp::Drain {
                host: "h0".into(),
                reason: "maintenance".into(),
                deadline_ms: None,
            },
            request: None,
        });
        w.settle(obey);
        let j = w.job();
        assert_eq!(j.state, JobState::Running);
        assert_eq!(j.incarnation, 2);
        assert_eq!(j.resume_step, 40, "resumes from the halting checkpoint");
        assert_eq!(j.restarts, 0, "a planned move is not a failure");
        assert_eq!(j.placement, vec!["h2".to_string(), "h1".to_string()]);
        let halts =
            w.st.intents
                .values()
                .filter(|i| matches!(i.action, Action::CheckpointJob { halt: true, .. }))
                .count();
        assert_eq!(halts, 2, "every host of the job halts");
        assert_eq!(
            w.st.hosts["h0"].drain.as_ref().unwrap().phase,
            crate::model::DrainPhase::Drained
        );
    }

    #[test]
    fn at_the_drain_deadline_the_job_is_moved_from_its_latest_checkpoint() {
        let mut w = World::new(&["h0", "h1", "h2"]);
        w.admin(JobOp::Submit { spec: spec("j", 2) }).unwrap();
        w.settle(obey);
        w.event("h0", ckpt(1, 0, 30));
        w.event("h1", ckpt(1, 1, 30));
        w.ok(Command::Admin {
            actor: "t".into(),
            op: AdminOp::Drain {
                host: "h0".into(),
                reason: "r".into(),
                deadline_ms: Some(1),
            },
            request: None,
        });
        // Checkpoint orders are never answered: the deadline decides.
        w.settle(|a| match a {
            Action::CheckpointJob { .. } => None,
            _ => Some((true, "pid=1".into())),
        });
        let j = w.job();
        assert_eq!(j.incarnation, 2);
        assert_eq!(j.state, JobState::Running);
        assert_eq!(j.resume_step, 30);
        assert!(!j.placement.contains(&"h0".to_string()));
        assert!(j.reason.contains("deadline"), "{}", j.reason);
        assert_eq!(j.restarts, 0);
    }

    #[test]
    fn bad_job_operations_change_nothing() {
        let mut w = World::new(&["h0"]);
        let before = w.st.clone();
        let mut s = spec("j", 1);
        s.hosts = vec!["nope".into()];
        assert!(matches!(
            w.admin(JobOp::Submit { spec: s }),
            Err(CmdError::NotFound { .. })
        ));
        assert!(matches!(
            w.admin(JobOp::Cancel { job: "x".into() }),
            Err(CmdError::NotFound { .. })
        ));
        assert!(w.admin(JobOp::Checkpoint { job: "x".into() }).is_err());
        assert!(w
            .apply(Command::Job(JobCommand::Place {
                job: "x".into(),
                incarnation: 0,
                placement: vec!["h0".into()],
            }))
            .is_err());
        let mut after = w.st.clone();
        after.last_log_index = before.last_log_index;
        assert_eq!(after, before);
        w.admin(JobOp::Submit { spec: spec("j", 1) }).unwrap();
        assert!(matches!(
            w.admin(JobOp::Submit { spec: spec("j", 1) }),
            Err(CmdError::FailedPrecondition(_))
        ));
        // A stale placement decision is refused.
        w.settle(obey);
        assert!(w
            .apply(Command::Job(JobCommand::Place {
                job: "j".into(),
                incarnation: 0,
                placement: vec!["h0".into()],
            }))
            .is_err());
        assert_eq!(w.job().incarnation, 1);
    }

    #[test]
    fn cancel_stops_every_rank_and_start_orders_of_old_incarnations_are_cancelled() {
        let mut w = World::new(&["h0", "h1"]);
        w.admin(JobOp::Submit { spec: spec("j", 2) }).unwrap();
        w.settle(|_| None);
        assert_eq!(crate::orders::open_orders(&w.st).len(), 2);
        w.admin(JobOp::Cancel { job: "j".into() }).unwrap();
        assert_eq!(w.job().state, JobState::Cancelled);
        w.settle(obey);
        let cancelled =
            w.st.intents
                .values()
                .filter(|i| {
                    matches!(i.action, Action::StartRank { .. })
                        && matches!(i.status, IntentStatus::Closed(Outcome::Cancelled { .. }))
                })
                .count();
        assert_eq!(cancelled, 2);
        assert!(w.job().stopping.is_empty(), "both stops answered");
    }

    pub(crate) fn spec(name: &str, ranks: u32) -> JobSpec {
        JobSpec {
            name: name.into(),
            ranks,
            hosts: vec![],
            labels: BTreeMap::new(),
            command: vec!["/bin/true".into()],
            env: BTreeMap::new(),
            checkpoint_dir: "/tmp/ckpt".into(),
            checkpoint_every: 10,
            max_restarts: 2,
            backoff_ms: 100,
        }
    }
}

#[cfg(test)]
mod json_tests {
    #[test]
    fn a_job_with_checkpoints_and_exits_round_trips_through_the_admin_json() {
        let mut j = super::placed_for_test("j", &["h0"]);
        j.checkpoints.insert(10, [0u32].into_iter().collect());
        j.ranks[0].exit = Some(super::Exit {
            code: 0,
            signal: 0,
            detail: "d".into(),
        });
        let reply = crate::api::AdminReply::Job { job: j.clone() };
        let text = serde_json::to_string(&reply).unwrap();
        let back: crate::api::AdminReply = serde_json::from_str(&text).unwrap();
        let crate::api::AdminReply::Job { job } = back else {
            panic!("{text}")
        };
        assert_eq!(job, j);
    }
}
