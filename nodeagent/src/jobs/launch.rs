//! The launcher: starts, fences, stops and checkpoints ranks, reaps them
//! and reports their exits and checkpoints (see the [`crate::jobs`] docs
//! for the contract).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fs::OpenOptions;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use proto::agent::OrderOutcome;
use proto::v1::StartRank;
use rdma::contract::{ConnUp, Hello, OrderKind};
use tokio::sync::{mpsc, oneshot, watch, Notify};

use super::fence::{Fence, FenceStore};
use super::logs::{copy_log, prune_logs, read_log};
use super::model::*;
use super::process::{in_rank, kill_group, proc_stat, signal_name, wait_exited};
use super::records::{RankRecord, RankStore};
use super::user::{become_user, chown_to, prepare_checkpoint_dir, JobUser};
use crate::config::NicConfig;
use crate::control::{Control, Peer, RankEvents, MAX_DETAIL};
use crate::link::unix_ns;
use crate::outbox::{ConnStallReport, Outbox, RankCheckpointReport, RankExitReport, Report};

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
    /// What ranks said and was reported, per incarnation: checkpoint
    /// steps and stalled connections (bounded by [`MAX_CHECKPOINTS_SEEN`]).
    seen: HashSet<(RankKey, u64)>,
    seen_order: VecDeque<(RankKey, u64)>,
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
    fences: FenceStore,
    pub(super) records: RankStore,
    path: String,
    state: Mutex<State>,
    events: mpsc::Sender<Event>,
    job_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
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
        let fences = FenceStore::open(&db, &path)?;
        let records = RankStore::open(&db, &path)?;
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
        let found = self.records.load().map_err(self.sled_err())?;
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

    pub(super) fn fence(&self, job: &str) -> Result<Fence, String> {
        self.fences.get(job)
    }

    async fn save_fence(&self, job: &str, f: Fence) -> Result<(), String> {
        self.fences
            .save(job, f, || {
                self.lock().ranks.keys().map(|k| k.job.clone()).collect()
            })
            .await
    }

    /// Carries out a job order. A checkpoint that every rank answered
    /// with the same step (the contract answer's `step` field) is
    /// [`OrderOutcome::Checkpointed`] at that step.
    pub async fn execute(self: &Arc<Self>, control: &Control, order: &JobOrder) -> OrderOutcome {
        let (ok, detail, step) = match order {
            JobOrder::Start(s) => with_no_step(self.start(s).await),
            JobOrder::Stop { job, incarnation } => {
                with_no_step(self.stop_job(job, *incarnation).await)
            }
            JobOrder::Checkpoint {
                job,
                incarnation,
                halt,
            } => self.checkpoint(control, job, *incarnation, *halt).await,
        };
        let detail = rdma::contract::truncate(&detail, MAX_DETAIL).to_owned();
        match (ok, step) {
            (false, _) => OrderOutcome::Failed { error: detail },
            (true, Some(step)) => OrderOutcome::Checkpointed { step, detail },
            (true, None) => OrderOutcome::Done { detail },
        }
    }

    /// Launches one rank (see the module docs).
    pub async fn start(self: &Arc<Self>, o: &StartRank) -> (bool, String) {
        if let Err(e) = check_start(o) {
            return (false, e);
        }
        // Who the rank runs as, and whether it may run this: refused
        // before anything changes.
        let user = match self
            .cfg
            .policy
            .check_command(&o.argv[0])
            .and_then(|()| self.cfg.policy.resolve(&o.user))
        {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!(job = %o.job, incarnation = o.incarnation, rank = o.rank, user = %o.user, argv0 = %o.argv[0], error = %e, "rank refused");
                return (false, e);
            }
        };
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
            prune_logs(&self.jobs_dir, &o.job, o.incarnation);
        }
        let running = self.lock().ranks.values().filter(|r| r.running()).count();
        if running >= MAX_RANKS {
            return (
                false,
                format!("the agent runs at most {MAX_RANKS} ranks at once"),
            );
        }
        match self.spawn(&key, o, &user).await {
            Ok(pid) => {
                tracing::info!(job = %o.job, incarnation = o.incarnation, rank = o.rank, pid, argv0 = %o.argv[0], user = %user.name, uid = user.uid, "rank started");
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

    async fn spawn(
        self: &Arc<Self>,
        key: &RankKey,
        o: &StartRank,
        user: &JobUser,
    ) -> Result<u32, String> {
        let dir = self
            .jobs_dir
            .join(job_dir_name(&key.job))
            .join(key.incarnation.to_string());
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        // The working directory and the log are the rank's user's (the
        // agent writes the log; the rank may write beside it).
        chown_to(&dir, user)?;
        let log_path = dir.join(format!("rank-{}.log", key.rank));
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("cannot open {}: {e}", log_path.display()))?;
        chown_to(&log_path, user)?;
        prepare_checkpoint_dir(user, &o.checkpoint_dir, &dir)?;
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
        cmd.env("USER", &user.name)
            .env("LOGNAME", &user.name)
            .env("HOME", &user.home);
        for (k, v) in rank_env(&self.cfg, o) {
            cmd.env(k, v);
        }
        let who = user.clone();
        // SAFETY: `become_user` makes only async-signal-safe system calls
        // on values allocated before the fork. It runs after the working
        // directory and process group are set, right before exec.
        unsafe {
            cmd.pre_exec(move || become_user(&who));
        }
        let spawned = cmd.spawn();
        // The command holds the pipe's write ends: without dropping it the
        // log would never see end-of-file.
        drop(cmd);
        let mut child = spawned.map_err(|e| {
            let hint = if e.kind() == std::io::ErrorKind::PermissionDenied {
                format!(
                    " (the rank runs as user {}: it must be able to execute it)",
                    user.name
                )
            } else {
                String::new()
            };
            format!("cannot start {:?}: {e}{hint}", o.argv[0])
        })?;
        let pid = child.id();
        // Known before anything awaits: the rank may say hello on the
        // control socket at once, and only known ranks are admitted.
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
        let start_time = proc_stat(pid).map_or(0, |s| s.start_time);
        let rec = RankRecord {
            job: key.job.clone(),
            incarnation: key.incarnation,
            rank: key.rank,
            pid,
            start_time,
        };
        let stored = self.records.insert(&rec).await;
        if let Err(e) = stored {
            kill_group(pid, libc::SIGKILL);
            let _ = child.wait();
            self.lock().ranks.remove(key);
            let _ = self.records.remove(key);
            return Err(format!("cannot record the rank (it was killed): {e}"));
        }
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
            let _ = self.records.remove(key);
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
    ) -> (bool, String, Option<u64>) {
        if let Err(e) = check_job_name(job) {
            return (false, e, None);
        }
        match self.fence(job) {
            Ok(f) if incarnation < f.highest => {
                return (
                    false,
                    format!("stale incarnation {incarnation} < {}", f.highest),
                    None,
                )
            }
            Ok(_) => {}
            Err(e) => return (false, e, None),
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
                None,
            );
        }
        let kind = OrderKind::Checkpoint { step: None, halt };
        let answers = control
            .order_ranks(job, &ranks, kind, CHECKPOINT_TIMEOUT)
            .await;
        let ok = answers.iter().all(|a| a.ok);
        // The checkpoint is this host's part of one restart point only if
        // every rank names the same step.
        let step = answers[0]
            .step
            .filter(|s| answers.iter().all(|a| a.step == Some(*s)));
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
        tracing::info!(job, incarnation, halt, ok, step = ?step, detail = %detail, "checkpoint order answered");
        (ok, detail, step.filter(|_| ok))
    }

    /// The last `max_bytes` (0 or more than [`MAX_TAIL`]: [`MAX_TAIL`]) of
    /// the newest incarnation's log of `job`'s `rank`, or (`from`) the
    /// bytes after an offset of one incarnation's log ([`read_log`]).
    pub async fn tail_log(
        &self,
        job: &str,
        rank: u32,
        max_bytes: u32,
        from: Option<(u64, u64)>,
    ) -> LogTail {
        if let Err(e) = check_job_name(job) {
            return LogTail {
                text: e,
                ..LogTail::default()
            };
        }
        let dir = self.jobs_dir.join(job_dir_name(job));
        let (job, n) = (job.to_owned(), max_bytes as usize);
        let n = if n == 0 { MAX_TAIL } else { n.min(MAX_TAIL) };
        let read = tokio::task::spawn_blocking(move || read_log(&dir, &job, rank, n, from)).await;
        read.unwrap_or_else(|e| LogTail {
            text: format!("reading the log failed: {e}"),
            ..LogTail::default()
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
    /// A job this agent runs ranks of speaks only through processes of
    /// those ranks: the connecting process must belong to the running
    /// rank the hello names (its process group, or a descendant of its
    /// leader), and the pid the hello claims must be the connecting one or
    /// in its process group. A job the agent runs no rank of (one started
    /// by other means; its checkpoints count for incarnation 0) is admitted
    /// only from root or a user of the `[jobs]` default and allowed users.
    fn admit(&self, hello: &Hello, peer: &Peer) -> Result<(), String> {
        let (job, rank) = (&hello.job, hello.rank);
        let (mut ours, leader) = {
            let st = self.lock();
            let mut ours: Vec<u32> = Vec::new();
            let mut leader = None;
            for (k, r) in st
                .ranks
                .iter()
                .filter(|(k, r)| k.job == *job && r.running())
            {
                ours.push(k.rank);
                if k.rank == rank {
                    leader = Some(r.pid);
                }
            }
            (ours, leader)
        };
        if ours.is_empty() {
            if peer.uid == 0 || self.cfg.policy.allowed_uids().contains(&peer.uid) {
                return Ok(());
            }
            return Err(format!(
                "job {job} runs no rank launched by this agent, and uid {} is neither root nor a job user of this host; only they may speak for such a job",
                peer.uid
            ));
        }
        let Some(leader) = leader else {
            ours.sort_unstable();
            ours.dedup();
            return Err(format!(
                "pid {} is not a rank of job {job}: rank {rank} does not run on this host (ranks {ours:?} do)",
                peer.pid
            ));
        };
        if !in_rank(peer.pid, leader) {
            return Err(format!(
                "pid {} is not a rank of job {job} (rank {rank} runs as process group {leader})",
                peer.pid
            ));
        }
        let same_group = |a: u32, b: u32| matches!((proc_stat(a), proc_stat(b)), (Some(x), Some(y)) if x.pgrp == y.pgrp);
        if hello.pid != peer.pid && !same_group(hello.pid, peer.pid) {
            return Err(format!(
                "hello claims pid {} but the connection comes from pid {} (another process group)",
                hello.pid, peer.pid
            ));
        }
        Ok(())
    }

    fn checkpointed(&self, job: &str, rank: u32, pid: u32, step: u64) {
        self.report_once(job, rank, pid, step, |key| {
            Report::RankCheckpoint(RankCheckpointReport {
                job: key.job.clone(),
                incarnation: key.incarnation,
                rank,
                step,
                at_unix_ns: unix_ns(),
            })
        });
    }

    fn conn_stalled(&self, job: &str, rank: u32, pid: u32, conn: &ConnUp) {
        // Conn ids and steps share the seen set: their reports differ.
        self.report_once(job, rank, pid, STALL_TAG | conn.conn_id, |key| {
            Report::ConnStalled(ConnStallReport {
                job: key.job.clone(),
                incarnation: key.incarnation,
                rank,
                conn_id: conn.conn_id,
                peer_host: conn.peer_host.clone(),
                peer_rank: conn.peer_rank,
                at_unix_ns: unix_ns(),
            })
        });
    }
}

/// Marks a connection id in the seen set (steps stay far below it).
const STALL_TAG: u64 = 1 << 63;

impl Launcher {
    /// Reports what rank `rank` of `job` (process `pid`) said, once per
    /// incarnation and `what` (a step, or a tagged connection id): the
    /// report goes to the outbox through the rank event queue. The
    /// incarnation is the one whose process group holds the sender; else
    /// the running one (at most one incarnation of a job runs here); else
    /// the newest.
    fn report_once(
        &self,
        job: &str,
        rank: u32,
        pid: u32,
        what: u64,
        report: impl FnOnce(&RankKey) -> Report,
    ) {
        let mut st = self.lock();
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
        if !st.seen.insert((key.clone(), what)) {
            tracing::debug!(job, incarnation, rank, what, "already reported");
            return;
        }
        st.seen_order.push_back((key.clone(), what));
        if st.seen_order.len() > MAX_CHECKPOINTS_SEEN {
            if let Some(old) = st.seen_order.pop_front() {
                st.seen.remove(&old);
            }
        }
        let report = report(&key);
        if self.events.try_send(Event::Report(report)).is_err() {
            st.seen.remove(&(key, what));
            tracing::warn!(
                job,
                incarnation,
                rank,
                what,
                pid,
                "rank event queue full; not reported"
            );
        } else {
            tracing::info!(job, incarnation, rank, what, pid, "rank report recorded");
        }
    }
}

/// Puts rank events into the outbox in order; removes an exited rank's
/// record once its report is durable.
async fn write_events(
    mut rx: mpsc::Receiver<Event>,
    outbox: Arc<tokio::sync::Mutex<Outbox>>,
    fresh: Arc<Notify>,
    records: RankStore,
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
                    done.push(RankKey {
                        job: x.job.clone(),
                        incarnation: x.incarnation,
                        rank: x.rank,
                    });
                    reports.push(Report::RankExited(x));
                }
                Event::Barrier(tx) => barriers.push(tx),
            }
        }
        let n = reports.len();
        match crate::outbox::record(&outbox, reports, &fresh).await {
            Ok(_) => {
                for k in done {
                    if let Err(e) = records.remove(&k) {
                        tracing::warn!(error = %e, "cannot remove a rank record");
                    }
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

/// Checks a `StartRank` before anything runs.
pub(crate) fn check_start(o: &StartRank) -> Result<(), String> {
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

/// The rank's environment beyond the agent's own: torchrun's variables
/// (one rank per host: `RANK`, `WORLD_SIZE`, `LOCAL_RANK` 0,
/// `LOCAL_WORLD_SIZE` 1, `GROUP_RANK`, `MASTER_ADDR` = rank 0's first rail
/// address, `MASTER_PORT` = the job's port, `GLOO_SOCKET_IFNAME` and
/// `NCCL_SOCKET_IFNAME` = this host's first data NIC), then the order's
/// `env` (which may override those), then the `RAILGUARD_*` variables
/// (which win).
pub fn rank_env(cfg: &JobsConfig, o: &StartRank) -> Vec<(String, String)> {
    let mut env: BTreeMap<String, String> = torchrun_env(cfg, o).into_iter().collect();
    env.extend(o.env.iter().map(|(k, v)| (k.clone(), v.clone())));
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

/// What torchrun would set for this rank, so a PyTorch script runs under
/// railguard unchanged. The peers list every rank in rank order with its
/// host; a host's ranks are consecutive (`ranks_per_host`), so the local
/// rank is this rank's place among its host's ranks and the group rank is
/// its host's place among the hosts.
pub(super) fn torchrun_env(cfg: &JobsConfig, o: &StartRank) -> Vec<(String, String)> {
    let rank = o.rank as usize;
    let me = o.peers.get(rank).map(|p| p.host.as_str());
    let local: Vec<usize> = (0..o.peers.len())
        .filter(|&r| Some(o.peers[r].host.as_str()) == me)
        .collect();
    let local_rank = local.iter().position(|&r| r == rank).unwrap_or(0);
    // Host changes between consecutive ranks up to this one.
    let group_rank = (1..=rank.min(o.peers.len().saturating_sub(1)))
        .filter(|&r| o.peers[r].host != o.peers[r - 1].host)
        .count();
    let mut out = vec![
        ("RANK".to_string(), o.rank.to_string()),
        ("GROUP_RANK".to_string(), group_rank.to_string()),
        ("WORLD_SIZE".to_string(), o.peers.len().to_string()),
        ("LOCAL_RANK".to_string(), local_rank.to_string()),
        (
            "LOCAL_WORLD_SIZE".to_string(),
            local.len().max(1).to_string(),
        ),
        ("MASTER_PORT".to_string(), o.port.to_string()),
    ];
    if let Some(a) = o.peers.first().and_then(|p| p.addrs.first()) {
        out.push(("MASTER_ADDR".to_string(), a.clone()));
    }
    if let Some(n) = cfg
        .nics
        .iter()
        .filter(|n| n.rail.is_some())
        .min_by_key(|n| n.rail)
    {
        out.push(("GLOO_SOCKET_IFNAME".to_string(), n.name.clone()));
        out.push(("NCCL_SOCKET_IFNAME".to_string(), n.name.clone()));
    }
    out
}

/// An answer that names no checkpoint step.
fn with_no_step((ok, detail): (bool, String)) -> (bool, String, Option<u64>) {
    (ok, detail, None)
}
