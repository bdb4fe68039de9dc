//! The job runner: the agent launches, fences, stops and checkpoints the
//! ranks of jobs the supervisor places on this host.
//!
//! **Launch** ([`JobOrder::Start`], a `StartRank` order). The rank runs
//! `argv` (`argv[0]` resolved as given: a path, or a name looked up in the
//! agent's `PATH`) in its own process group (the group id is the rank's
//! pid), with stdin `/dev/null`, its working directory and log at
//! `<data dir>/jobs/<job>/<incarnation>/` (`<job>` as [`job_dir_name`]
//! writes it: the name itself unless it has bytes other than letters,
//! digits, `.`, `_`, `-`) and stdout and stderr through one pipe into
//! `rank-<r>.log` there (appended; at [`LOG_CAP`] a note is
//! written and further output is read and discarded, so the rank never
//! blocks on it). The environment is the agent's, plus the order's `env`
//! entries, plus (winning over both):
//!
//! | variable | value |
//! |---|---|
//! | `RAILGUARD_AGENT_SOCKET` | the agent's control socket |
//! | `RAILGUARD_JOB`, `RAILGUARD_INCARNATION`, `RAILGUARD_RANK` | the order's |
//! | `RAILGUARD_WORLD_SIZE` | the number of peers |
//! | `RAILGUARD_PEERS` | `host=addr0,addr1;…`, one entry per rank in rank order |
//! | `RAILGUARD_NICS` | this host's data NICs with a rail, in rail order: `name=addr,…` (addr empty if unknown) |
//! | `RAILGUARD_PORT` | the job's data port |
//! | `RAILGUARD_CHECKPOINT_DIR`, `RAILGUARD_CHECKPOINT_EVERY`, `RAILGUARD_RESUME_STEP` | the order's |
//!
//! The order is answered ok with detail `pid=N` once the process runs and
//! its record is durable; a spawn failure answers ok=false with the OS
//! error. Starting a (job, incarnation, rank) that runs already answers
//! its pid again (whatever the order id); one that ran and exited is
//! refused. The agent keeps the newest [`KEEP_INCARNATION_LOGS`]
//! incarnations' log directories of a job.
//!
//! **Exits.** A reaper thread per rank waits for the rank's exit without
//! reaping it, kills what is left of its process group (SIGKILL, while the
//! zombie keeps the group id reserved), reaps it and reports a
//! `RankExited` event (exit code, or -1 and the signal; the detail says
//! why the agent stopped it, if it did) through the outbox, like every
//! other report: durable before it is sent, sent until acknowledged.
//!
//! **Fencing.** Per job the agent keeps, in its sled database (tree
//! `job_fences`), the highest incarnation it has seen and the highest one a
//! `StopJob` covered. A `StartRank` or `CheckpointJob` of an older
//! incarnation than the highest is refused ("stale incarnation X < Y"), and
//! so is a `StartRank` of an incarnation a `StopJob` covered. A
//! `StartRank` of a newer incarnation records it first, then stops every
//! rank of the job's older incarnations on this host (and waits until they
//! are reaped) before it launches: two incarnations of a job never run
//! together on the host. Orders of one job run one at a time.
//!
//! **Stop** ([`JobOrder::Stop`]): every rank of the job with incarnation
//! <= the order's gets SIGTERM (to its process group), then SIGKILL after
//! [`STOP_GRACE`]; answered once they are reaped (failed if one survives
//! SIGKILL for [`KILL_WAIT`]). Nothing running: ok at once.
//!
//! **Checkpoint** ([`JobOrder::Checkpoint`]): `OrderKind::Checkpoint {
//! step: None, halt }` goes over the control socket to each running rank
//! of that incarnation ([`Control::order_ranks`]; a rank not connected yet
//! gets it when it says hello); answered once every rank answered, within
//! [`CHECKPOINT_TIMEOUT`] in all. The detail is the ranks' common detail
//! (`step=N`), else `rank R: …` per rank. For incarnation 0 with no rank
//! launched here, the job's connected ranks are ordered (a job the agent
//! did not launch).
//!
//! **Checkpointed.** A rank's `checkpointed {step}` becomes a
//! `RankCheckpoint` event (the incarnation of the rank the agent launched
//! for that job and rank; 0 for a rank it did not launch). The contract
//! client re-sends its newest step after a reconnect: a (job, incarnation,
//! rank, step) already reported by this agent process is not reported
//! again (the supervisor treats repeats as idempotent anyway).
//!
//! **Log tail** ([`Launcher::tail_log`]): the last `max_bytes` (at most
//! [`MAX_TAIL`]) of the newest incarnation's `rank-<r>.log`, as lossy UTF-8.
//!
//! **Agent restart.** Every launched rank is recorded (job, incarnation,
//! rank, pid, the process's start time from `/proc/<pid>/stat`) in the tree
//! `job_ranks` before the start is answered, and removed once its exit is
//! in the outbox. On start ([`Launcher::open`]) a recorded rank whose
//! process still runs (same start time) is killed (SIGKILL to its group)
//! and reported exited with code -1, signal 9, "agent restarted: rank
//! stopped"; one that is gone is reported with code -1, signal 0, "lost
//! while the agent was down". The supervisor restarts the job from its
//! checkpoint. At most [`MAX_RANKS`] ranks run (and are recorded) at once.
//!
//! **Agent shutdown** ([`Launcher::shutdown`], on SIGTERM or Ctrl-C): ranks
//! are not left running without their agent: every rank gets SIGTERM, then
//! SIGKILL after [`STOP_GRACE`], its exit is written to the outbox
//! ("agent shutting down: rank stopped"), and the agent exits.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use proto::v1::StartRank;
use rdma::contract::OrderKind;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch, Notify};

use crate::agent::NicConfig;
use crate::control::{Control, RankEvents, MAX_DETAIL};
use crate::link::unix_ns;
use crate::outbox::{Outbox, OutboxError, RankCheckpointReport, RankExitReport, Report};

/// Between SIGTERM and SIGKILL when the agent stops a rank.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// How long a rank may take to disappear after SIGKILL.
pub const KILL_WAIT: Duration = Duration::from_secs(5);
/// Most bytes of a rank's output kept in its log.
pub const LOG_CAP: u64 = 64 << 20;
/// Most bytes a log tail returns.
pub const MAX_TAIL: usize = 128 << 10;
/// How long a checkpoint order waits for every rank's answer.
pub const CHECKPOINT_TIMEOUT: Duration = Duration::from_secs(30);
/// Ranks running (and recorded) at once on this host.
pub const MAX_RANKS: usize = 256;
/// Jobs whose fence is remembered (beyond it, the least recently updated
/// job with nothing running is forgotten).
pub const MAX_FENCES: usize = 4096;
/// Log directories (incarnations) kept per job.
pub const KEEP_INCARNATION_LOGS: usize = 8;
/// Exited ranks remembered (for idempotent starts and checkpoint events).
const MAX_EXITED: usize = 1024;
/// (rank, step) checkpoints remembered to drop repeats.
const MAX_CHECKPOINTS_SEEN: usize = 4096;
/// Events waiting for the outbox.
const EVENT_QUEUE: usize = 1024;
/// Longest job name (its directory name may be three times as long, within
/// the usual 255-byte limit only for plain names; the supervisor allows 253).
pub const MAX_JOB_NAME: usize = 253;

const FENCE_TREE: &str = "job_fences";
const RANK_TREE: &str = "job_ranks";

/// Job runner failures (its storage).
#[derive(Debug, thiserror::Error)]
pub enum JobsError {
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    #[error("job store at {path}: {source}")]
    Sled {
        path: String,
        #[source]
        source: sled::Error,
    },
    #[error("jobs directory {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// What the launcher needs from the agent's configuration.
#[derive(Debug, Clone)]
pub struct JobsConfig {
    /// The agent's data directory (logs go under `jobs/` in it).
    pub data_dir: PathBuf,
    /// The control socket ranks talk to.
    pub control_socket: PathBuf,
    /// The data NICs (with their addresses, for `RAILGUARD_NICS`).
    pub nics: Vec<NicConfig>,
    /// Most bytes kept per rank log ([`LOG_CAP`]).
    pub log_cap: u64,
}

impl JobsConfig {
    pub fn new(data_dir: PathBuf, control_socket: PathBuf, nics: Vec<NicConfig>) -> Self {
        Self {
            data_dir,
            control_socket,
            nics,
            log_cap: LOG_CAP,
        }
    }
}

/// A job order from the supervisor.
#[derive(Debug, Clone, PartialEq)]
pub enum JobOrder {
    Start(StartRank),
    Stop {
        job: String,
        incarnation: u64,
    },
    Checkpoint {
        job: String,
        incarnation: u64,
        halt: bool,
    },
}

impl JobOrder {
    /// A stable description (a repeated order id must carry the same order).
    pub fn describe(&self) -> String {
        match self {
            JobOrder::Start(s) => format!(
                "start job {} incarnation {} rank {}",
                s.job, s.incarnation, s.rank
            ),
            JobOrder::Stop { job, incarnation } => {
                format!("stop job {job} through incarnation {incarnation}")
            }
            JobOrder::Checkpoint {
                job,
                incarnation,
                halt,
            } => format!(
                "checkpoint job {job} incarnation {incarnation}{}",
                if *halt { " and halt" } else { "" }
            ),
        }
    }
}

/// One rank of one incarnation of a job.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RankKey {
    pub job: String,
    pub incarnation: u64,
    pub rank: u32,
}

impl std::fmt::Display for RankKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "job {} incarnation {} rank {}",
            self.job, self.incarnation, self.rank
        )
    }
}

/// How a rank ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankExit {
    /// The exit code (-1: ended by a signal, or unknown).
    pub exit_code: i32,
    /// The signal that ended it (0: none).
    pub signal: i32,
    pub detail: String,
}

/// The end of a rank's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogTail {
    pub ok: bool,
    /// The log's last bytes (ok) or why there are none.
    pub text: String,
    /// The incarnation whose log it is (0 when none was found).
    pub incarnation: u64,
}

/// Per job, durable.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Fence {
    highest: u64,
    /// The highest incarnation a stop order covered.
    stopped_through: Option<u64>,
    updated_unix_ms: u64,
}

/// A launched rank, durable until its exit is in the outbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct RankRecord {
    job: String,
    incarnation: u64,
    rank: u32,
    pid: u32,
    /// Field 22 of `/proc/<pid>/stat` (clock ticks since boot).
    start_time: u64,
}

impl RankRecord {
    fn key(&self) -> Vec<u8> {
        record_key(&RankKey {
            job: self.job.clone(),
            incarnation: self.incarnation,
            rank: self.rank,
        })
    }
}

fn record_key(k: &RankKey) -> Vec<u8> {
    let mut v = k.job.as_bytes().to_vec();
    v.push(0);
    v.extend_from_slice(&k.incarnation.to_be_bytes());
    v.extend_from_slice(&k.rank.to_be_bytes());
    v
}

/// A rank in memory (running, or exited and remembered).
struct Rank {
    pid: u32,
    exit: watch::Receiver<Option<RankExit>>,
    /// Why the agent stopped it (set with the first SIGTERM).
    stop_reason: Option<String>,
    /// SIGKILL after the grace period.
    escalated: bool,
    /// Reaped: its pid may belong to someone else now; never signal it.
    reaped: bool,
}

impl Rank {
    fn running(&self) -> bool {
        self.exit.borrow().is_none()
    }
}

#[derive(Default)]
struct State {
    ranks: BTreeMap<RankKey, Rank>,
    checkpoints_seen: HashSet<(RankKey, u64)>,
    checkpoints_order: VecDeque<(RankKey, u64)>,
    closing: bool,
}

enum Event {
    Report(Report),
    /// An exit; the rank's record goes once the report is durable.
    Exited(RankExitReport),
    /// Answered once everything before it is in the outbox.
    Barrier(oneshot::Sender<()>),
}

/// The job runner of one agent.
pub struct Launcher {
    cfg: JobsConfig,
    jobs_dir: PathBuf,
    db: sled::Db,
    fences: sled::Tree,
    records: sled::Tree,
    path: String,
    state: Mutex<State>,
    events: mpsc::Sender<Event>,
    job_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// A job name: 1 to [`MAX_JOB_NAME`] bytes without control characters (the
/// supervisor's rule is stricter: no whitespace either). Its directory name
/// is [`job_dir_name`].
pub fn check_job_name(job: &str) -> Result<(), String> {
    if job.is_empty() || job.len() > MAX_JOB_NAME || job.chars().any(char::is_control) {
        return Err(format!(
            "job name {job:?} must be 1-{MAX_JOB_NAME} bytes without control characters"
        ));
    }
    Ok(())
}

/// The directory of a job's logs under `jobs/`: the name itself when it is
/// only letters, digits, `_`, `-` and (not first) `.`; any other byte is
/// written `%XX` (so `a/b` is `a%2Fb`, `..` is `%2E.`; one name, one
/// directory).
pub fn job_dir_name(job: &str) -> String {
    let mut out = String::with_capacity(job.len());
    for (i, b) in job.bytes().enumerate() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || (b == b'.' && i > 0) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Launcher {
    /// Opens the launcher on the agent's database (from `outbox`), reports
    /// the ranks an earlier run left behind (killing those still running)
    /// and starts the writer that puts rank events into the outbox.
    pub async fn open(
        cfg: JobsConfig,
        outbox: Arc<tokio::sync::Mutex<Outbox>>,
        fresh: Arc<Notify>,
    ) -> Result<Arc<Launcher>, JobsError> {
        let (db, path) = outbox.lock().await.database();
        let sled_err = |source| JobsError::Sled {
            path: path.clone(),
            source,
        };
        let fences = db.open_tree(FENCE_TREE).map_err(sled_err)?;
        let records = db.open_tree(RANK_TREE).map_err(sled_err)?;
        let jobs_dir = cfg.data_dir.join("jobs");
        std::fs::create_dir_all(&jobs_dir).map_err(|source| JobsError::Io {
            path: jobs_dir.display().to_string(),
            source,
        })?;
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        tokio::spawn(write_events(rx, outbox, fresh, records.clone()));
        let l = Arc::new(Launcher {
            cfg,
            jobs_dir,
            db,
            fences,
            records,
            path,
            state: Mutex::new(State::default()),
            events: tx,
            job_locks: Mutex::new(HashMap::new()),
        });
        l.recover().await?;
        Ok(l)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sled_err(&self) -> impl Fn(sled::Error) -> JobsError + '_ {
        move |source| JobsError::Sled {
            path: self.path.clone(),
            source,
        }
    }

    /// Reports (and kills) the ranks recorded by an earlier run.
    async fn recover(&self) -> Result<(), JobsError> {
        let mut found = Vec::new();
        for kv in self.records.iter() {
            let (k, v) = kv.map_err(self.sled_err())?;
            match bincode::deserialize::<RankRecord>(&v) {
                Ok(r) => found.push(r),
                Err(e) => {
                    tracing::warn!(error = %e, "unreadable rank record; forgetting it");
                    self.records.remove(k).map_err(self.sled_err())?;
                }
            }
        }
        for r in found {
            let same = proc_stat(r.pid)
                .filter(|s| s.start_time == r.start_time && s.state != 'Z')
                .is_some();
            let (signal, detail) = if same {
                kill_group(r.pid, libc::SIGKILL);
                let deadline = tokio::time::Instant::now() + KILL_WAIT;
                while proc_stat(r.pid)
                    .is_some_and(|s| s.start_time == r.start_time && s.state != 'Z')
                    && tokio::time::Instant::now() < deadline
                {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                (libc::SIGKILL, "agent restarted: rank stopped")
            } else {
                if proc_stat(r.pid).is_none() {
                    // The pid is free, so a group with its id is what is
                    // left of the rank's (a pid is not reused while it
                    // names a group).
                    kill_group(r.pid, libc::SIGKILL);
                }
                (0, "lost while the agent was down")
            };
            tracing::warn!(job = %r.job, incarnation = r.incarnation, rank = r.rank, pid = r.pid, detail, "rank left by an earlier agent run");
            let report = RankExitReport {
                job: r.job,
                incarnation: r.incarnation,
                rank: r.rank,
                exit_code: -1,
                signal,
                detail: detail.to_owned(),
                at_unix_ns: unix_ns(),
            };
            if self.events.send(Event::Exited(report)).await.is_err() {
                tracing::error!("rank event writer stopped");
            }
        }
        Ok(())
    }

    fn job_lock(&self, job: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut m = self.job_locks.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() >= MAX_FENCES {
            m.retain(|_, l| Arc::strong_count(l) > 1);
        }
        m.entry(job.to_owned()).or_default().clone()
    }

    fn fence(&self, job: &str) -> Result<Fence, String> {
        match self.fences.get(job.as_bytes()) {
            Ok(Some(b)) => bincode::deserialize(&b).map_err(|e| format!("fence of {job}: {e}")),
            Ok(None) => Ok(Fence::default()),
            Err(e) => Err(format!("cannot read the fence of job {job}: {e}")),
        }
    }

    async fn save_fence(&self, job: &str, mut f: Fence) -> Result<(), String> {
        f.updated_unix_ms = unix_ns() / 1_000_000;
        let b = bincode::serialize(&f).map_err(|e| e.to_string())?;
        let store = |e: sled::Error| format!("cannot store the fence of job {job}: {e}");
        self.fences.insert(job.as_bytes(), b).map_err(store)?;
        if self.fences.len() > MAX_FENCES {
            self.evict_fence(job);
        }
        self.db.flush_async().await.map_err(store)?;
        Ok(())
    }

    /// Forgets the least recently updated fence of a job with nothing here.
    fn evict_fence(&self, keep: &str) {
        let busy: HashSet<String> = self.lock().ranks.keys().map(|k| k.job.clone()).collect();
        let mut oldest: Option<(u64, sled::IVec)> = None;
        for (k, v) in self.fences.iter().flatten() {
            let name = String::from_utf8_lossy(&k);
            if name == keep || busy.contains(name.as_ref()) {
                continue;
            }
            let at = bincode::deserialize::<Fence>(&v).map_or(0, |f| f.updated_unix_ms);
            if oldest.as_ref().is_none_or(|(t, _)| at < *t) {
                oldest = Some((at, k));
            }
        }
        if let Some((_, k)) = oldest {
            tracing::info!(job = %String::from_utf8_lossy(&k), "forgetting the fence of an idle job (too many jobs)");
            let _ = self.fences.remove(k);
        }
    }

    /// Carries out a job order; returns (ok, detail).
    pub async fn execute(self: &Arc<Self>, control: &Control, order: &JobOrder) -> (bool, String) {
        let (ok, detail) = match order {
            JobOrder::Start(s) => self.start(s).await,
            JobOrder::Stop { job, incarnation } => self.stop_job(job, *incarnation).await,
            JobOrder::Checkpoint {
                job,
                incarnation,
                halt,
            } => self.checkpoint(control, job, *incarnation, *halt).await,
        };
        (ok, rdma::contract::truncate(&detail, MAX_DETAIL).to_owned())
    }

    /// Launches one rank (see the module docs).
    pub async fn start(self: &Arc<Self>, o: &StartRank) -> (bool, String) {
        if let Err(e) = check_start(o) {
            return (false, e);
        }
        let lock = self.job_lock(&o.job);
        let _job = lock.lock().await;
        let key = RankKey {
            job: o.job.clone(),
            incarnation: o.incarnation,
            rank: o.rank,
        };
        let mut fence = match self.fence(&o.job) {
            Ok(f) => f,
            Err(e) => return (false, e),
        };
        if o.incarnation < fence.highest {
            return (
                false,
                format!("stale incarnation {} < {}", o.incarnation, fence.highest),
            );
        }
        if fence.stopped_through.is_some_and(|s| o.incarnation <= s) {
            return (
                false,
                format!(
                    "incarnation {} of job {} was stopped; start a newer one",
                    o.incarnation, o.job
                ),
            );
        }
        {
            let st = self.lock();
            if st.closing {
                return (false, "the agent is shutting down".into());
            }
            if let Some(r) = st.ranks.get(&key) {
                return match &*r.exit.borrow() {
                    None => (true, format!("pid={}", r.pid)),
                    Some(x) => (
                        false,
                        format!("{key} already ran as pid {} and ended: {}", r.pid, x.detail),
                    ),
                };
            }
        }
        let newer = o.incarnation > fence.highest;
        if newer {
            fence.highest = o.incarnation;
            if let Err(e) = self.save_fence(&o.job, fence).await {
                return (false, e);
            }
        }
        // Never two incarnations of a job at once on this host.
        let older: Vec<RankKey> = self
            .lock()
            .ranks
            .iter()
            .filter(|(k, r)| k.job == o.job && k.incarnation < o.incarnation && r.running())
            .map(|(k, _)| k.clone())
            .collect();
        if !older.is_empty() {
            let reason = format!("superseded by incarnation {}", o.incarnation);
            tracing::info!(job = %o.job, incarnation = o.incarnation, older = older.len(), "stopping the job's older ranks first");
            if let Err(e) = self.stop_ranks(older, &reason).await {
                return (
                    false,
                    format!("cannot start {key}: older ranks still run: {e}"),
                );
            }
        }
        if newer {
            self.forget_older(&o.job, o.incarnation);
            self.prune_logs(&o.job, o.incarnation);
        }
        let running = self.lock().ranks.values().filter(|r| r.running()).count();
        if running >= MAX_RANKS {
            return (
                false,
                format!("the agent runs at most {MAX_RANKS} ranks at once"),
            );
        }
        match self.spawn(&key, o).await {
            Ok(pid) => {
                tracing::info!(job = %o.job, incarnation = o.incarnation, rank = o.rank, pid, argv0 = %o.argv[0], "rank started");
                (true, format!("pid={pid}"))
            }
            Err(e) => {
                tracing::warn!(job = %o.job, incarnation = o.incarnation, rank = o.rank, error = %e, "rank did not start");
                (false, e)
            }
        }
    }

    /// Forgets exited ranks of the job's older incarnations but the
    /// newest of them (a late `checkpointed` of a superseded rank still
    /// finds its incarnation).
    fn forget_older(&self, job: &str, incarnation: u64) {
        let mut st = self.lock();
        let keep = st
            .ranks
            .keys()
            .filter(|k| k.job == job && k.incarnation < incarnation)
            .map(|k| k.incarnation)
            .max()
            .unwrap_or(0);
        st.ranks
            .retain(|k, r| !(k.job == job && k.incarnation < keep && !r.running()));
        let exited = st.ranks.values().filter(|r| !r.running()).count();
        if exited > MAX_EXITED {
            let drop: Vec<RankKey> = st
                .ranks
                .iter()
                .filter(|(_, r)| !r.running())
                .take(exited - MAX_EXITED)
                .map(|(k, _)| k.clone())
                .collect();
            for k in drop {
                st.ranks.remove(&k);
            }
        }
    }

    /// Keeps the newest log directories of the job (the new incarnation's
    /// is made next).
    fn prune_logs(&self, job: &str, incarnation: u64) {
        let dir = self.jobs_dir.join(job_dir_name(job));
        let mut incs = incarnation_dirs(&dir);
        incs.retain(|i| *i < incarnation);
        incs.sort_unstable_by(|a, b| b.cmp(a));
        for old in incs.iter().skip(KEEP_INCARNATION_LOGS.saturating_sub(1)) {
            let p = dir.join(old.to_string());
            if let Err(e) = std::fs::remove_dir_all(&p) {
                tracing::warn!(path = %p.display(), error = %e, "cannot remove an old log directory");
            }
        }
    }

    async fn spawn(self: &Arc<Self>, key: &RankKey, o: &StartRank) -> Result<u32, String> {
        let dir = self
            .jobs_dir
            .join(job_dir_name(&key.job))
            .join(key.incarnation.to_string());
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let log_path = dir.join(format!("rank-{}.log", key.rank));
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("cannot open {}: {e}", log_path.display()))?;
        let logged = log.metadata().map(|m| m.len()).unwrap_or(0);
        let (reader, writer) =
            std::io::pipe().map_err(|e| format!("cannot make the rank's output pipe: {e}"))?;
        let writer2 = writer
            .try_clone()
            .map_err(|e| format!("cannot make the rank's output pipe: {e}"))?;
        let mut cmd = Command::new(&o.argv[0]);
        cmd.args(&o.argv[1..])
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(writer2)
            .process_group(0);
        for (k, v) in rank_env(&self.cfg, o) {
            cmd.env(k, v);
        }
        let spawned = cmd.spawn();
        // The command holds the pipe's write ends: without dropping it the
        // log would never see end-of-file.
        drop(cmd);
        let mut child = spawned.map_err(|e| format!("cannot start {:?}: {e}", o.argv[0]))?;
        let pid = child.id();
        let start_time = proc_stat(pid).map_or(0, |s| s.start_time);
        let rec = RankRecord {
            job: key.job.clone(),
            incarnation: key.incarnation,
            rank: key.rank,
            pid,
            start_time,
        };
        let stored = match bincode::serialize(&rec) {
            Ok(b) => self
                .records
                .insert(rec.key(), b)
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let stored = match stored {
            Ok(()) => self
                .db
                .flush_async()
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        if let Err(e) = stored {
            kill_group(pid, libc::SIGKILL);
            let _ = child.wait();
            let _ = self.records.remove(rec.key());
            return Err(format!("cannot record the rank (it was killed): {e}"));
        }
        let (exit_tx, exit_rx) = watch::channel(None);
        self.lock().ranks.insert(
            key.clone(),
            Rank {
                pid,
                exit: exit_rx,
                stop_reason: None,
                escalated: false,
                reaped: false,
            },
        );
        let cap = self.cfg.log_cap;
        let name = format!("rank-log-{pid}");
        if let Err(e) = std::thread::Builder::new()
            .name(name)
            .spawn(move || copy_log(reader, log, logged, cap))
        {
            tracing::warn!(pid, error = %e, "cannot start the log thread; the rank's output is lost");
        }
        let me = self.clone();
        let k = key.clone();
        let reaper = std::thread::Builder::new()
            .name(format!("rank-reaper-{pid}"))
            .spawn(move || me.reap(k, child, exit_tx));
        if let Err(e) = reaper {
            // Without a reaper the rank could never be reported: stop it.
            kill_group(pid, libc::SIGKILL);
            self.lock().ranks.remove(key);
            let _ = self.records.remove(rec.key());
            return Err(format!("cannot start the rank's reaper thread: {e}"));
        }
        Ok(pid)
    }

    /// Waits for the rank's exit (blocking thread), then reports it.
    fn reap(
        self: Arc<Self>,
        key: RankKey,
        mut child: std::process::Child,
        exit_tx: watch::Sender<Option<RankExit>>,
    ) {
        let pid = child.id();
        if let Err(e) = wait_exited(pid) {
            tracing::warn!(pid, error = %e, "waiting for the rank failed");
        }
        let (reason, escalated) = {
            let mut st = self.lock();
            // The leader is a zombie until reaped: its group id cannot be
            // reused yet. Take what is left of the group down with it.
            kill_group(pid, libc::SIGKILL);
            match st.ranks.get_mut(&key) {
                Some(r) => {
                    r.reaped = true;
                    (r.stop_reason.clone(), r.escalated)
                }
                None => (None, false),
            }
        };
        let (exit_code, signal) = match child.wait() {
            Ok(s) => (s.code().unwrap_or(-1), s.signal().unwrap_or(0)),
            Err(e) => {
                tracing::warn!(pid, error = %e, "cannot reap the rank");
                (-1, 0)
            }
        };
        let how = if signal != 0 {
            format!("killed by {}", signal_name(signal))
        } else {
            format!("exited with code {exit_code}")
        };
        let detail = match (reason, escalated) {
            (Some(r), true) => format!(
                "{r}: {how} (SIGKILL after {} s of SIGTERM)",
                STOP_GRACE.as_secs()
            ),
            (Some(r), false) => format!("{r}: {how}"),
            (None, _) => how,
        };
        tracing::info!(job = %key.job, incarnation = key.incarnation, rank = key.rank, pid, exit_code, signal, detail = %detail, "rank exited");
        let report = RankExitReport {
            job: key.job,
            incarnation: key.incarnation,
            rank: key.rank,
            exit_code,
            signal,
            detail: detail.clone(),
            at_unix_ns: unix_ns(),
        };
        // The event first, then the watch: whoever waited for the exit (a
        // stop, the shutdown) and then flushes the events finds this one
        // queued ahead of its barrier, so the shutdown's last exits reach
        // the outbox.
        if self.events.blocking_send(Event::Exited(report)).is_err() {
            tracing::error!(
                pid,
                "rank event writer stopped; the exit is reported at the next start"
            );
        }
        exit_tx.send_replace(Some(RankExit {
            exit_code,
            signal,
            detail,
        }));
    }

    /// SIGTERM, then SIGKILL after the grace period, to each rank's group;
    /// returns how many were stopped once all are reaped.
    async fn stop_ranks(&self, keys: Vec<RankKey>, reason: &str) -> Result<usize, String> {
        let mut waits = Vec::new();
        {
            let mut st = self.lock();
            for k in keys {
                let Some(r) = st.ranks.get_mut(&k) else {
                    continue;
                };
                if !r.running() {
                    continue;
                }
                if r.stop_reason.is_none() {
                    r.stop_reason = Some(reason.to_owned());
                }
                if !r.reaped {
                    kill_group(r.pid, libc::SIGTERM);
                }
                waits.push((k, r.exit.clone()));
            }
        }
        let n = waits.len();
        if n == 0 {
            return Ok(0);
        }
        tracing::info!(ranks = n, reason, "SIGTERM sent to ranks");
        let grace_end = tokio::time::Instant::now() + STOP_GRACE;
        let mut late = Vec::new();
        for (k, mut rx) in waits {
            let done = tokio::time::timeout_at(grace_end, rx.wait_for(Option::is_some))
                .await
                .is_ok();
            if !done {
                late.push((k, rx));
            }
        }
        if late.is_empty() {
            return Ok(n);
        }
        {
            let mut st = self.lock();
            for (k, _) in &late {
                if let Some(r) = st.ranks.get_mut(k) {
                    if !r.reaped {
                        r.escalated = true;
                        kill_group(r.pid, libc::SIGKILL);
                    }
                }
            }
        }
        tracing::warn!(
            ranks = late.len(),
            grace_s = STOP_GRACE.as_secs(),
            "ranks ignored SIGTERM; SIGKILL sent"
        );
        let kill_end = tokio::time::Instant::now() + KILL_WAIT;
        let mut stuck = Vec::new();
        for (k, mut rx) in late {
            let done = tokio::time::timeout_at(kill_end, rx.wait_for(Option::is_some))
                .await
                .is_ok();
            if !done {
                stuck.push(k.to_string());
            }
        }
        if stuck.is_empty() {
            Ok(n)
        } else {
            Err(format!(
                "{} still running {} s after SIGKILL",
                stuck.join(", "),
                KILL_WAIT.as_secs()
            ))
        }
    }

    /// Stops every rank of `job` with incarnation <= `incarnation`.
    pub async fn stop_job(&self, job: &str, incarnation: u64) -> (bool, String) {
        if let Err(e) = check_job_name(job) {
            return (false, e);
        }
        let lock = self.job_lock(job);
        let _job = lock.lock().await;
        match self.fence(job) {
            Ok(mut f) => {
                if f.stopped_through.is_none_or(|s| s < incarnation) {
                    f.stopped_through = Some(incarnation);
                    if let Err(e) = self.save_fence(job, f).await {
                        return (false, e);
                    }
                }
            }
            Err(e) => return (false, e),
        }
        let keys: Vec<RankKey> = self
            .lock()
            .ranks
            .iter()
            .filter(|(k, r)| k.job == job && k.incarnation <= incarnation && r.running())
            .map(|(k, _)| k.clone())
            .collect();
        match self.stop_ranks(keys, "stopped by order").await {
            Ok(0) => (true, "nothing running".into()),
            Ok(n) => (true, format!("{n} ranks stopped")),
            Err(e) => (false, e),
        }
    }

    /// Orders the incarnation's ranks on this host to checkpoint.
    pub async fn checkpoint(
        &self,
        control: &Control,
        job: &str,
        incarnation: u64,
        halt: bool,
    ) -> (bool, String) {
        if let Err(e) = check_job_name(job) {
            return (false, e);
        }
        match self.fence(job) {
            Ok(f) if incarnation < f.highest => {
                return (
                    false,
                    format!("stale incarnation {incarnation} < {}", f.highest),
                )
            }
            Ok(_) => {}
            Err(e) => return (false, e),
        }
        let mut ranks: Vec<u32> = self
            .lock()
            .ranks
            .iter()
            .filter(|(k, r)| k.job == job && k.incarnation == incarnation && r.running())
            .map(|(k, _)| k.rank)
            .collect();
        if ranks.is_empty() && incarnation == 0 {
            ranks = control.connected_ranks(job).into_iter().collect();
        }
        if ranks.is_empty() {
            return (
                false,
                format!("no rank of job {job} incarnation {incarnation} runs on this host"),
            );
        }
        let kind = OrderKind::Checkpoint { step: None, halt };
        let answers = control
            .order_ranks(job, &ranks, kind, CHECKPOINT_TIMEOUT)
            .await;
        let ok = answers.iter().all(|a| a.ok);
        let same = answers.windows(2).all(|w| w[0].detail == w[1].detail);
        let detail = if ok && same {
            answers[0].detail.clone()
        } else {
            answers
                .iter()
                .map(|a| {
                    let tag = if a.ok { "" } else { "failed: " };
                    format!("rank {}: {tag}{}", a.rank, a.detail)
                })
                .collect::<Vec<_>>()
                .join("; ")
        };
        tracing::info!(job, incarnation, halt, ok, detail = %detail, "checkpoint order answered");
        (ok, detail)
    }

    /// The last `max_bytes` (0 or more than [`MAX_TAIL`]: [`MAX_TAIL`]) of
    /// the newest incarnation's log of `job`'s `rank`.
    pub async fn tail_log(&self, job: &str, rank: u32, max_bytes: u32) -> LogTail {
        if let Err(e) = check_job_name(job) {
            return LogTail {
                ok: false,
                text: e,
                incarnation: 0,
            };
        }
        let dir = self.jobs_dir.join(job_dir_name(job));
        let (job, n) = (job.to_owned(), max_bytes as usize);
        let n = if n == 0 { MAX_TAIL } else { n.min(MAX_TAIL) };
        let read = tokio::task::spawn_blocking(move || read_tail(&dir, &job, rank, n)).await;
        read.unwrap_or_else(|e| LogTail {
            ok: false,
            text: format!("reading the log failed: {e}"),
            incarnation: 0,
        })
    }

    /// Stops every rank (SIGTERM, grace, SIGKILL), refuses new ones, and
    /// waits (bounded) until their exits are in the outbox.
    pub async fn shutdown(&self) {
        self.lock().closing = true;
        // Starts check `closing` under their job's lock: once every lock
        // was free once, no start is half done.
        let locks: Vec<_> = self
            .job_locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        let settle = async {
            for l in locks {
                drop(l.lock().await);
            }
        };
        if tokio::time::timeout(STOP_GRACE + KILL_WAIT + KILL_WAIT, settle)
            .await
            .is_err()
        {
            tracing::warn!("job orders still running at shutdown; stopping what runs now");
        }
        let keys: Vec<RankKey> = {
            let st = self.lock();
            st.ranks
                .iter()
                .filter(|(_, r)| r.running())
                .map(|(k, _)| k.clone())
                .collect()
        };
        if !keys.is_empty() {
            tracing::info!(
                ranks = keys.len(),
                "agent shutting down: stopping its ranks"
            );
        }
        if let Err(e) = self
            .stop_ranks(keys, "agent shutting down: rank stopped")
            .await
        {
            tracing::error!(error = %e, "ranks survived the shutdown");
        }
        self.flush_events().await;
    }

    /// Waits (bounded) until every rank event so far is in the outbox.
    pub async fn flush_events(&self) {
        let (tx, rx) = oneshot::channel();
        if self.events.send(Event::Barrier(tx)).await.is_ok() {
            let _ = tokio::time::timeout(Duration::from_secs(5), rx).await;
        }
    }

    /// The ranks running now.
    pub fn running(&self) -> Vec<(RankKey, u32)> {
        self.lock()
            .ranks
            .iter()
            .filter(|(_, r)| r.running())
            .map(|(k, r)| (k.clone(), r.pid))
            .collect()
    }

    /// How `key` ended (None: running or unknown).
    pub fn exit_of(&self, key: &RankKey) -> Option<RankExit> {
        self.lock()
            .ranks
            .get(key)
            .and_then(|r| r.exit.borrow().clone())
    }
}

impl RankEvents for Launcher {
    fn checkpointed(&self, job: &str, rank: u32, pid: u32, step: u64) {
        let mut st = self.lock();
        // The rank whose process group holds the sender; else the running
        // one (at most one incarnation of a job runs here); else the newest.
        let group = proc_stat(pid).map(|s| s.pgrp);
        let incarnation = st
            .ranks
            .iter()
            .filter(|(k, _)| k.job == job && k.rank == rank)
            .max_by_key(|(k, r)| {
                let ours = r.pid == pid || group == Some(r.pid);
                (ours, r.running(), k.incarnation)
            })
            .map_or(0, |(k, _)| k.incarnation);
        let key = RankKey {
            job: job.to_owned(),
            incarnation,
            rank,
        };
        if !st.checkpoints_seen.insert((key.clone(), step)) {
            tracing::debug!(job, incarnation, rank, step, "checkpoint already reported");
            return;
        }
        st.checkpoints_order.push_back((key.clone(), step));
        if st.checkpoints_order.len() > MAX_CHECKPOINTS_SEEN {
            if let Some(old) = st.checkpoints_order.pop_front() {
                st.checkpoints_seen.remove(&old);
            }
        }
        let report = Report::RankCheckpoint(RankCheckpointReport {
            job: job.to_owned(),
            incarnation,
            rank,
            step,
            at_unix_ns: unix_ns(),
        });
        if self.events.try_send(Event::Report(report)).is_err() {
            st.checkpoints_seen.remove(&(key, step));
            tracing::warn!(
                job,
                incarnation,
                rank,
                step,
                pid,
                "rank event queue full; checkpoint not reported"
            );
        } else {
            tracing::info!(
                job,
                incarnation,
                rank,
                step,
                pid,
                "rank checkpoint recorded"
            );
        }
    }
}

/// Puts rank events into the outbox in order; removes an exited rank's
/// record once its report is durable.
async fn write_events(
    mut rx: mpsc::Receiver<Event>,
    outbox: Arc<tokio::sync::Mutex<Outbox>>,
    fresh: Arc<Notify>,
    records: sled::Tree,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < 256 {
            match rx.try_recv() {
                Ok(e) => batch.push(e),
                Err(_) => break,
            }
        }
        let mut reports = Vec::new();
        let mut done = Vec::new();
        let mut barriers = Vec::new();
        for e in batch {
            match e {
                Event::Report(r) => reports.push(r),
                Event::Exited(x) => {
                    done.push(record_key(&RankKey {
                        job: x.job.clone(),
                        incarnation: x.incarnation,
                        rank: x.rank,
                    }));
                    reports.push(Report::RankExited(x));
                }
                Event::Barrier(tx) => barriers.push(tx),
            }
        }
        let n = reports.len();
        match outbox.lock().await.push_all(reports).await {
            Ok(()) => {
                for k in done {
                    if let Err(e) = records.remove(k) {
                        tracing::warn!(error = %e, "cannot remove a rank record");
                    }
                }
                if n > 0 {
                    fresh.notify_one();
                }
            }
            // The records stay: the next start reports those ranks as lost.
            Err(e) => {
                tracing::error!(error = %e, reports = n, "cannot write rank events to the outbox")
            }
        }
        for b in barriers {
            let _ = b.send(());
        }
    }
}

fn check_start(o: &StartRank) -> Result<(), String> {
    check_job_name(&o.job)?;
    if o.argv.first().is_none_or(String::is_empty) {
        return Err("argv is empty".into());
    }
    if o.peers.is_empty() {
        return Err("no peers (the world is empty)".into());
    }
    if o.rank as usize >= o.peers.len() {
        return Err(format!(
            "rank {} is outside a world of {}",
            o.rank,
            o.peers.len()
        ));
    }
    if o.argv.iter().any(|a| a.contains('\0')) {
        return Err("argv contains a NUL byte".into());
    }
    for (k, v) in &o.env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(format!("bad environment entry {k:?}"));
        }
    }
    Ok(())
}

/// The rank's environment beyond the agent's own: the order's `env`, then
/// the `RAILGUARD_*` variables (which win).
pub fn rank_env(cfg: &JobsConfig, o: &StartRank) -> Vec<(String, String)> {
    let mut env: BTreeMap<String, String> =
        o.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let peers = o
        .peers
        .iter()
        .map(|p| format!("{}={}", p.host, p.addrs.join(",")))
        .collect::<Vec<_>>()
        .join(";");
    let mut nics: Vec<&NicConfig> = cfg.nics.iter().filter(|n| n.rail.is_some()).collect();
    nics.sort_by_key(|n| n.rail);
    let nics = nics
        .iter()
        .map(|n| {
            let addr = n.addr.map(|a| a.to_string()).unwrap_or_default();
            format!("{}={addr}", n.name)
        })
        .collect::<Vec<_>>()
        .join(",");
    let ours = [
        (
            "RAILGUARD_AGENT_SOCKET",
            cfg.control_socket.display().to_string(),
        ),
        ("RAILGUARD_JOB", o.job.clone()),
        ("RAILGUARD_INCARNATION", o.incarnation.to_string()),
        ("RAILGUARD_RANK", o.rank.to_string()),
        ("RAILGUARD_WORLD_SIZE", o.peers.len().to_string()),
        ("RAILGUARD_PEERS", peers),
        ("RAILGUARD_NICS", nics),
        ("RAILGUARD_PORT", o.port.to_string()),
        ("RAILGUARD_CHECKPOINT_DIR", o.checkpoint_dir.clone()),
        ("RAILGUARD_CHECKPOINT_EVERY", o.checkpoint_every.to_string()),
        ("RAILGUARD_RESUME_STEP", o.resume_step.to_string()),
    ];
    for (k, v) in ours {
        env.insert(k.to_owned(), v);
    }
    env.into_iter().collect()
}

/// Copies the rank's output into its log until end-of-file, up to `cap`
/// bytes (then a note, and the rest is discarded).
fn copy_log(mut reader: std::io::PipeReader, mut file: File, mut written: u64, cap: u64) {
    let mut buf = vec![0u8; 64 << 10];
    let mut capped = false;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::warn!(error = %e, "reading a rank's output failed");
                return;
            }
        };
        if capped {
            continue;
        }
        let take = (cap.saturating_sub(written) as usize).min(n);
        if take > 0 {
            if let Err(e) = file.write_all(&buf[..take]) {
                tracing::warn!(error = %e, "writing a rank's log failed; discarding its output");
                capped = true;
                continue;
            }
            written += take as u64;
        }
        if take < n {
            let note = format!(
                "\n[railguard-agent: log capped at {} MiB; further output discarded]\n",
                cap >> 20
            );
            let _ = file.write_all(note.as_bytes());
            capped = true;
        }
    }
}

/// The incarnations that have a log directory under `dir`.
fn incarnation_dirs(dir: &Path) -> Vec<u64> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

fn read_tail(dir: &Path, job: &str, rank: u32, n: usize) -> LogTail {
    let name = format!("rank-{rank}.log");
    let mut incs = incarnation_dirs(dir);
    incs.sort_unstable_by(|a, b| b.cmp(a));
    let Some(inc) = incs
        .into_iter()
        .find(|i| dir.join(i.to_string()).join(&name).exists())
    else {
        return LogTail {
            ok: false,
            text: format!("no log of job {job} rank {rank} on this host"),
            incarnation: 0,
        };
    };
    let path = dir.join(inc.to_string()).join(&name);
    let fail = |e: std::io::Error| LogTail {
        ok: false,
        text: format!("cannot read {}: {e}", path.display()),
        incarnation: inc,
    };
    let mut f = match File::open(&path) {
        Ok(f) => f,
        Err(e) => return fail(e),
    };
    let len = match f.metadata() {
        Ok(m) => m.len(),
        Err(e) => return fail(e),
    };
    let from = len.saturating_sub(n as u64);
    let mut buf = Vec::with_capacity(n.min(len as usize));
    if let Err(e) = f
        .seek(SeekFrom::Start(from))
        .and_then(|_| f.take(n as u64).read_to_end(&mut buf))
    {
        return fail(e);
    }
    // Do not start in the middle of a UTF-8 sequence.
    let skip = if from > 0 {
        buf.iter()
            .take(3)
            .take_while(|b| (**b & 0xC0) == 0x80)
            .count()
    } else {
        0
    };
    LogTail {
        ok: true,
        text: String::from_utf8_lossy(&buf[skip..]).into_owned(),
        incarnation: inc,
    }
}

/// What the launcher reads of `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProcStat {
    state: char,
    /// The process group.
    pgrp: u32,
    start_time: u64,
}

fn proc_stat(pid: u32) -> Option<ProcStat> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: the
    // fields after it start after the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(ProcStat {
        state: fields.first()?.chars().next()?,
        pgrp: fields.get(2)?.parse().ok()?,
        // Field 22; `rest` starts at field 3.
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// Sends `sig` to the process group `pgid` (never to groups 0 or 1, which
/// would mean the caller's group or every process).
fn kill_group(pgid: u32, sig: i32) -> bool {
    let Ok(g) = i32::try_from(pgid) else {
        return false;
    };
    if g <= 1 {
        return false;
    }
    // SAFETY: kill(2) only sends a signal; a negative pid names a group.
    unsafe { libc::kill(-g, sig) == 0 }
}

/// Blocks until the child `pid` has exited, leaving it waitable (so
/// `Child::wait` reaps it and gets its status).
fn wait_exited(pid: u32) -> std::io::Result<()> {
    loop {
        // SAFETY: siginfo_t is plain data; all-zero is a valid value.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a valid, writable siginfo_t for the call.
        let r = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if r == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGTERM => "SIGTERM",
        _ => return format!("signal {sig}"),
    };
    format!("signal {sig} ({name})")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::v1::RankPeer;
    use rdma::contract::{ClientOptions, ContractClient, Hello};
    use std::time::Instant;

    struct Rig {
        dir: tempfile::TempDir,
        outbox: Arc<tokio::sync::Mutex<Outbox>>,
        launcher: Arc<Launcher>,
    }

    fn nics() -> Vec<NicConfig> {
        // Out of rail order on purpose, plus a NIC on no rail.
        vec![
            NicConfig {
                name: "rail1".into(),
                rail: Some(1),
                backup: Some("rail0".into()),
                rdma_device: None,
                addr: Some("10.11.0.1".parse().unwrap()),
            },
            NicConfig {
                name: "eth0".into(),
                rail: None,
                backup: None,
                rdma_device: None,
                addr: None,
            },
            NicConfig {
                name: "rail0".into(),
                rail: Some(0),
                backup: Some("rail1".into()),
                rdma_device: None,
                addr: Some("10.10.0.1".parse().unwrap()),
            },
        ]
    }

    fn jobs_cfg(dir: &Path) -> JobsConfig {
        JobsConfig::new(dir.to_path_buf(), dir.join("agent.sock"), nics())
    }

    async fn rig_with(dir: tempfile::TempDir, cfg: JobsConfig) -> Rig {
        let outbox = Outbox::open(&dir.path().join("outbox"), 1000).unwrap();
        let outbox = Arc::new(tokio::sync::Mutex::new(outbox));
        let launcher = Launcher::open(cfg, outbox.clone(), Arc::new(Notify::new()))
            .await
            .unwrap();
        Rig {
            dir,
            outbox,
            launcher,
        }
    }

    async fn rig() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let cfg = jobs_cfg(dir.path());
        rig_with(dir, cfg).await
    }

    fn order(job: &str, incarnation: u64, rank: u32, script: &str) -> StartRank {
        StartRank {
            job: job.into(),
            incarnation,
            rank,
            peers: vec![
                RankPeer {
                    host: "h0".into(),
                    addrs: vec!["10.10.0.1".into(), "10.11.0.1".into()],
                },
                RankPeer {
                    host: "h1".into(),
                    addrs: vec!["10.10.0.2".into(), "10.11.0.2".into()],
                },
            ],
            argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
            env: [
                ("EXTRA".to_string(), "x y".to_string()),
                ("RAILGUARD_RANK".to_string(), "overridden".to_string()),
            ]
            .into(),
            checkpoint_dir: "/ckpt/train".into(),
            checkpoint_every: 50,
            resume_step: 100,
            port: 7000,
        }
    }

    fn key(job: &str, incarnation: u64, rank: u32) -> RankKey {
        RankKey {
            job: job.into(),
            incarnation,
            rank,
        }
    }

    impl Rig {
        fn log_dir(&self, job: &str, inc: u64) -> PathBuf {
            self.dir
                .path()
                .join("jobs")
                .join(job_dir_name(job))
                .join(inc.to_string())
        }

        async fn wait_exit(&self, k: &RankKey) -> RankExit {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Some(x) = self.launcher.exit_of(k) {
                    return x;
                }
                assert!(Instant::now() < deadline, "{k} did not exit");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }

        async fn reports(&self) -> Vec<Report> {
            self.launcher.flush_events().await;
            self.outbox
                .lock()
                .await
                .pending_after(0)
                .unwrap()
                .into_iter()
                .map(|s| s.report)
                .collect()
        }

        async fn exits(&self) -> Vec<RankExitReport> {
            self.reports()
                .await
                .into_iter()
                .filter_map(|r| match r {
                    Report::RankExited(x) => Some(x),
                    _ => None,
                })
                .collect()
        }

        async fn wait_log(&self, job: &str, inc: u64, rank: u32, needle: &str) -> String {
            let p = self.log_dir(job, inc).join(format!("rank-{rank}.log"));
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let s = std::fs::read_to_string(&p).unwrap_or_default();
                if s.contains(needle) {
                    return s;
                }
                assert!(Instant::now() < deadline, "{needle:?} not in {s:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    fn pid_of(detail: &str) -> u32 {
        detail
            .strip_prefix("pid=")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("not pid=N: {detail}"))
    }

    #[tokio::test]
    async fn a_rank_gets_its_environment_and_its_output_and_exit_are_captured() {
        let r = rig().await;
        let (ok, detail) = r
            .launcher
            .start(&order(
                "train",
                4,
                1,
                "env > env.txt; echo to-stdout; echo to-stderr >&2; exit 3",
            ))
            .await;
        assert!(ok, "{detail}");
        let pid = pid_of(&detail);
        let x = r.wait_exit(&key("train", 4, 1)).await;
        assert_eq!((x.exit_code, x.signal), (3, 0), "{x:?}");
        assert_eq!(x.detail, "exited with code 3");
        let env = std::fs::read_to_string(r.log_dir("train", 4).join("env.txt")).unwrap();
        let vars: BTreeMap<&str, &str> = env.lines().filter_map(|l| l.split_once('=')).collect();
        let sock = r.dir.path().join("agent.sock").display().to_string();
        for (k, v) in [
            ("RAILGUARD_AGENT_SOCKET", sock.as_str()),
            ("RAILGUARD_JOB", "train"),
            ("RAILGUARD_INCARNATION", "4"),
            ("RAILGUARD_RANK", "1"),
            ("RAILGUARD_WORLD_SIZE", "2"),
            (
                "RAILGUARD_PEERS",
                "h0=10.10.0.1,10.11.0.1;h1=10.10.0.2,10.11.0.2",
            ),
            ("RAILGUARD_NICS", "rail0=10.10.0.1,rail1=10.11.0.1"),
            ("RAILGUARD_PORT", "7000"),
            ("RAILGUARD_CHECKPOINT_DIR", "/ckpt/train"),
            ("RAILGUARD_CHECKPOINT_EVERY", "50"),
            ("RAILGUARD_RESUME_STEP", "100"),
            ("EXTRA", "x y"),
        ] {
            assert_eq!(vars.get(k).copied(), Some(v), "{k} in {env}");
        }
        assert!(vars.contains_key("PATH"), "the agent's environment is kept");
        let log = r.wait_log("train", 4, 1, "to-stderr").await;
        assert!(log.contains("to-stdout\n"), "{log}");
        let exits = r.exits().await;
        assert_eq!(exits.len(), 1, "{exits:?}");
        assert_eq!(
            (exits[0].job.as_str(), exits[0].incarnation, exits[0].rank),
            ("train", 4, 1)
        );
        assert_eq!(exits[0].exit_code, 3);
        assert!(
            r.launcher.records.is_empty(),
            "the record goes with the exit"
        );
        assert!(pid > 1);
        // Starting the exited rank again (another order id) is refused.
        let (ok, detail) = r.launcher.start(&order("train", 4, 1, "exit 0")).await;
        assert!(!ok && detail.contains("already ran"), "{detail}");
    }

    #[tokio::test]
    async fn a_signal_is_reported_and_a_bad_start_fails_with_the_os_error() {
        let r = rig().await;
        let (ok, detail) = r.launcher.start(&order("j", 1, 0, "kill -9 $$")).await;
        assert!(ok, "{detail}");
        let x = r.wait_exit(&key("j", 1, 0)).await;
        assert_eq!((x.exit_code, x.signal), (-1, 9), "{x:?}");
        assert_eq!(x.detail, "killed by signal 9 (SIGKILL)");
        let mut o = order("j", 1, 1, "");
        o.argv = vec!["/nonexistent/trainer".into()];
        let (ok, detail) = r.launcher.start(&o).await;
        assert!(!ok, "{detail}");
        assert!(detail.contains("No such file"), "{detail}");
        let mut o = order("bad\nname", 1, 0, "true");
        let (ok, detail) = r.launcher.start(&o).await;
        assert!(!ok && detail.contains("job name"), "{detail}");
        // Any other name gets a directory of its own, inside jobs/.
        let (ok, detail) = r.launcher.start(&order("../x/y", 1, 0, "pwd")).await;
        assert!(ok, "{detail}");
        r.wait_exit(&key("../x/y", 1, 0)).await;
        let t = r.launcher.tail_log("../x/y", 0, 1000).await;
        assert!(t.ok, "{t:?}");
        assert!(t.text.trim_end().ends_with("/jobs/%2E.%2Fx%2Fy/1"), "{t:?}");
        assert_eq!(job_dir_name("a.b-c_D9"), "a.b-c_D9");
        assert_eq!(job_dir_name(".%"), "%2E%25");
        o.job = "j".into();
        o.rank = 2;
        let (ok, detail) = r.launcher.start(&o).await;
        assert!(!ok && detail.contains("outside a world of 2"), "{detail}");
    }

    #[tokio::test]
    async fn stop_escalates_from_sigterm_to_sigkill() {
        let r = rig().await;
        let script = "trap 'echo got TERM' TERM; echo ready; while :; do sleep 0.1; done";
        let (ok, detail) = r.launcher.start(&order("j", 1, 0, script)).await;
        assert!(ok, "{detail}");
        r.wait_log("j", 1, 0, "ready").await;
        let t0 = Instant::now();
        let (ok, detail) = r.launcher.stop_job("j", 1).await;
        let took = t0.elapsed();
        assert!(ok, "{detail}");
        assert_eq!(detail, "1 ranks stopped");
        assert!(took >= STOP_GRACE, "SIGKILL came after {took:?}");
        assert!(took < STOP_GRACE + KILL_WAIT, "{took:?}");
        let x = r
            .launcher
            .exit_of(&key("j", 1, 0))
            .expect("reaped before the answer");
        assert_eq!((x.exit_code, x.signal), (-1, 9), "{x:?}");
        assert!(
            x.detail.starts_with("stopped by order: killed by signal 9")
                && x.detail.contains("SIGKILL after 5 s"),
            "{}",
            x.detail
        );
        r.wait_log("j", 1, 0, "got TERM").await;
        // Nothing left: ok at once.
        let t0 = Instant::now();
        let (ok, detail) = r.launcher.stop_job("j", 1).await;
        assert!(ok && detail == "nothing running", "{detail}");
        assert!(t0.elapsed() < Duration::from_secs(1));
        // A stopped incarnation does not start again.
        let (ok, detail) = r.launcher.start(&order("j", 1, 1, "true")).await;
        assert!(!ok && detail.contains("was stopped"), "{detail}");
    }

    #[tokio::test]
    async fn fencing_refuses_stale_incarnations_and_a_newer_one_stops_the_older_first() {
        let r = rig().await;
        let (ok, d) = r.launcher.start(&order("j", 2, 0, "exec sleep 100")).await;
        assert!(ok, "{d}");
        let old_pid = pid_of(&d);
        let (ok, d) = r.launcher.start(&order("j", 2, 1, "exec sleep 100")).await;
        assert!(ok, "{d}");
        // The same rank again (another order id): the same process.
        let (ok, again) = r.launcher.start(&order("j", 2, 0, "exec sleep 100")).await;
        assert!(ok && pid_of(&again) == old_pid, "{again}");
        // Older incarnations are refused, for starts and checkpoints.
        let (ok, d) = r.launcher.start(&order("j", 1, 0, "true")).await;
        assert_eq!((ok, d.as_str()), (false, "stale incarnation 1 < 2"));
        let control = Control::new(nics());
        let (ok, d) = r.launcher.checkpoint(&control, "j", 1, false).await;
        assert_eq!((ok, d.as_str()), (false, "stale incarnation 1 < 2"));
        assert_eq!(r.launcher.running().len(), 2, "nothing was touched");
        // A newer incarnation: the older ranks are gone before it starts.
        let (ok, d) = r.launcher.start(&order("j", 3, 0, "exec sleep 100")).await;
        assert!(ok, "{d}");
        assert!(
            proc_stat(old_pid).is_none(),
            "reaped before the newer started"
        );
        for rank in [0, 1] {
            let x = r.launcher.exit_of(&key("j", 2, rank));
            let x = x.expect("the older rank was reaped before the newer started");
            assert_eq!(x.signal, 15, "{x:?}");
            assert!(x.detail.starts_with("superseded by incarnation 3"), "{x:?}");
        }
        let exits = r.exits().await;
        assert_eq!(exits.len(), 2, "{exits:?}");
        assert!(exits.iter().all(|x| x.incarnation == 2));
        let running: Vec<RankKey> = r.launcher.running().into_iter().map(|(k, _)| k).collect();
        assert_eq!(running, vec![key("j", 3, 0)]);
        // Other jobs are not fenced by this one.
        let (ok, d) = r
            .launcher
            .start(&order("other", 1, 0, "exec sleep 100"))
            .await;
        assert!(ok, "{d}");
        // The fence is durable.
        assert_eq!(r.launcher.fence("j").unwrap().highest, 3);
        r.launcher.shutdown().await;
        let exits = r.exits().await;
        assert_eq!(exits.len(), 4, "{exits:?}");
        let last: Vec<&str> = exits[2..].iter().map(|x| x.detail.as_str()).collect();
        assert!(
            last.iter()
                .all(|d| d.starts_with("agent shutting down: rank stopped")),
            "{last:?}"
        );
        let (ok, d) = r.launcher.start(&order("j", 4, 0, "true")).await;
        assert!(!ok && d.contains("shutting down"), "{d}");
    }

    #[tokio::test]
    async fn ranks_left_by_an_earlier_run_are_killed_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let mut alive = Command::new("sleep")
            .arg("100")
            .process_group(0)
            .spawn()
            .unwrap();
        let mut gone = Command::new("true").spawn().unwrap();
        let gone_pid = gone.id();
        gone.wait().unwrap();
        {
            let outbox = Outbox::open(&dir.path().join("outbox"), 1000).unwrap();
            let (db, _) = outbox.database();
            let tree = db.open_tree(RANK_TREE).unwrap();
            let recs = [
                RankRecord {
                    job: "j".into(),
                    incarnation: 7,
                    rank: 0,
                    pid: alive.id(),
                    start_time: proc_stat(alive.id()).unwrap().start_time,
                },
                RankRecord {
                    job: "j".into(),
                    incarnation: 7,
                    rank: 1,
                    pid: gone_pid,
                    start_time: 12345,
                },
            ];
            for rec in recs {
                tree.insert(rec.key(), bincode::serialize(&rec).unwrap())
                    .unwrap();
            }
            db.flush().unwrap();
        }
        let cfg = jobs_cfg(dir.path());
        let r = rig_with(dir, cfg).await;
        let status = alive.wait().unwrap();
        assert_eq!(status.signal(), Some(9), "the leftover rank was killed");
        let mut exits = r.exits().await;
        exits.sort_by_key(|x| x.rank);
        assert_eq!(exits.len(), 2, "{exits:?}");
        assert_eq!(
            (
                exits[0].exit_code,
                exits[0].signal,
                exits[0].detail.as_str()
            ),
            (-1, 9, "agent restarted: rank stopped")
        );
        assert_eq!(
            (
                exits[1].exit_code,
                exits[1].signal,
                exits[1].detail.as_str()
            ),
            (-1, 0, "lost while the agent was down")
        );
        assert!(r.launcher.records.is_empty());
    }

    #[tokio::test]
    async fn the_log_tail_is_the_end_of_the_newest_incarnations_log_and_logs_are_capped() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = jobs_cfg(dir.path());
        cfg.log_cap = 1000;
        let r = rig_with(dir, cfg).await;
        let (ok, d) = r.launcher.start(&order("j", 1, 0, "echo first")).await;
        assert!(ok, "{d}");
        r.wait_exit(&key("j", 1, 0)).await;
        let script = "i=0; while [ $i -lt 20 ]; do echo line-$i; i=$((i+1)); done";
        let (ok, d) = r.launcher.start(&order("j", 2, 0, script)).await;
        assert!(ok, "{d}");
        r.wait_exit(&key("j", 2, 0)).await;
        r.wait_log("j", 2, 0, "line-19").await;
        let t = r.launcher.tail_log("j", 0, 16).await;
        assert!(t.ok, "{t:?}");
        assert_eq!(t.incarnation, 2);
        assert_eq!(t.text, "line-18\nline-19\n");
        let t = r.launcher.tail_log("j", 0, 0).await;
        assert!(t.text.starts_with("line-0\n"), "0 means the cap: {t:?}");
        let t = r.launcher.tail_log("j", 5, 100).await;
        assert!(!t.ok && t.text.contains("no log"), "{t:?}");
        let t = r.launcher.tail_log("nope", 0, 100).await;
        assert!(!t.ok, "{t:?}");
        // Output beyond the cap is discarded with a note; the rank is not
        // blocked by it.
        let script =
            "i=0; while [ $i -lt 500 ]; do echo 0123456789; i=$((i+1)); done; echo done >&2";
        let (ok, d) = r.launcher.start(&order("j", 3, 0, script)).await;
        assert!(ok, "{d}");
        let x = r.wait_exit(&key("j", 3, 0)).await;
        assert_eq!(x.exit_code, 0, "{x:?}");
        let log = r.wait_log("j", 3, 0, "log capped").await;
        assert!(log.len() < 1100, "{}", log.len());
        assert!(!log.contains("done"), "{log}");
    }

    #[tokio::test]
    async fn checkpoint_orders_reach_the_ranks_and_checkpoints_are_reported_once() {
        let r = rig().await;
        let sock = r.dir.path().join("agent.sock");
        let listener = crate::control::bind(&sock).unwrap();
        let control =
            Control::with_rank_events(nics(), Some(r.launcher.clone() as Arc<dyn RankEvents>));
        tokio::spawn(control.clone().serve(listener));
        let (ok, d) = r.launcher.checkpoint(&control, "j", 5, true).await;
        assert_eq!(
            (ok, d.as_str()),
            (false, "no rank of job j incarnation 5 runs on this host")
        );
        let (ok, d) = r.launcher.start(&order("j", 5, 0, "exec sleep 100")).await;
        assert!(ok, "{d}");
        // The rank's contract side, played by the test: it connects after
        // the order was sent (the order waits for its hello).
        let checkpoint = {
            let (l, c) = (r.launcher.clone(), control.clone());
            tokio::spawn(async move { l.checkpoint(&c, "j", 5, true).await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (client, mut orders) = ContractClient::connect_with(
            &sock,
            Hello {
                job: "j".into(),
                rank: 0,
                pid: std::process::id(),
            },
            ClientOptions::default(),
        )
        .await
        .unwrap();
        let o = tokio::time::timeout(Duration::from_secs(5), orders.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            o.kind,
            OrderKind::Checkpoint {
                step: None,
                halt: true
            }
        );
        client.checkpointed(40).await.unwrap();
        client.checkpointed(40).await.unwrap();
        client
            .order_done(o.order_id, true, "step=40")
            .await
            .unwrap();
        let (ok, d) = checkpoint.await.unwrap();
        assert_eq!((ok, d.as_str()), (true, "step=40"));
        client.checkpointed(41).await.unwrap();
        let ckpts: Vec<(u64, u64)> = r
            .reports()
            .await
            .into_iter()
            .filter_map(|r| match r {
                Report::RankCheckpoint(c) => Some((c.incarnation, c.step)),
                _ => None,
            })
            .collect();
        assert_eq!(ckpts, vec![(5, 40), (5, 41)], "repeats are not reported");
        r.launcher.shutdown().await;
    }
}
