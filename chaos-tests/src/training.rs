//! Training under railguard: `ringtrain` jobs, or the PyTorch DDP example
//! (`python/examples/torch_ddp.py`), submitted to a netns cluster
//! (supervisor + one agent per host, the agents launch the ranks), with
//! faults injected while they run. The `train-nic-flap`, `host-loss`,
//! `drain`, `torch-host-loss` and `torch-drain` scenarios, the `goodput`
//! bench and the demo are built from it.
//!
//! Every figure comes from the real processes: job states from the
//! supervisor (`railguard job show`), steps and digests from the ranks'
//! own logs, which the agents capture under
//! `<run dir>/h<i>/jobs/<job>/<incarnation>/rank-<r>.log`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rand::{Rng, SeedableRng};
use serde::Serialize;

use testbed::netcluster::NetCluster;
use testbed::{Side, TestbedSpec};

/// The program the ranks run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Workload {
    /// railguard's own `ringtrain` over resilient connections.
    #[default]
    Ringtrain,
    /// The unmodified PyTorch DDP example (gloo over TCP), sleeping
    /// `step_delay_ms` after each step.
    Torch { step_delay_ms: u64 },
}

impl Workload {
    /// The scenario name's prefix (`""` or `"torch-"`).
    pub fn prefix(self) -> &'static str {
        match self {
            Workload::Ringtrain => "",
            Workload::Torch { .. } => "torch-",
        }
    }
}

/// How to run one training job.
#[derive(Debug, Clone)]
pub struct TrainOpts {
    pub workload: Workload,
    /// Hosts in the testbed (ranks plus spares).
    pub hosts: usize,
    pub supervisors: usize,
    pub ranks: u32,
    /// Ranks on each host (torchrun's `--nproc-per-node`).
    pub ranks_per_host: u32,
    pub steps: u64,
    pub checkpoint_every: u64,
    /// Hidden width of ringtrain's MLP (None: its default).
    pub hidden: Option<u32>,
    /// The job gets no backup rail and dies on a network error (the
    /// "without railguard" baselines).
    pub fragile: bool,
    /// How long a ringtrain connection may go without a path before the
    /// rank exits (None: ringtrain's default, 2 s fragile and 30 s else).
    pub stall_timeout: Option<Duration>,
    pub max_restarts: u32,
    pub backoff: Duration,
    /// ringtrain: sleep this long after each step (so faults land at a
    /// chosen step); the PyTorch example has its own in `Workload`.
    pub ringtrain_step_delay_ms: u64,
    /// ringtrain: use the first N rails only (None: all).
    pub rails: Option<usize>,
    /// Longest the whole job may take.
    pub deadline: Duration,
}

impl TrainOpts {
    /// The hosts the job's ranks prefer, in rank order (the first
    /// `ranks / ranks_per_host`); the others are spares.
    pub fn rank_hosts(&self) -> Vec<usize> {
        (0..(self.ranks / self.ranks_per_host.max(1)) as usize).collect()
    }
}

impl Default for TrainOpts {
    fn default() -> Self {
        Self {
            workload: Workload::Ringtrain,
            hosts: 4,
            supervisors: 1,
            ranks: 4,
            ranks_per_host: 1,
            steps: 300,
            checkpoint_every: 50,
            hidden: None,
            fragile: false,
            stall_timeout: None,
            max_restarts: 50,
            backoff: Duration::from_millis(200),
            ringtrain_step_delay_ms: 0,
            rails: None,
            deadline: Duration::from_secs(600),
        }
    }
}

/// A testbed cluster that runs training jobs.
pub struct Training {
    pub c: NetCluster,
    /// The ringtrain binary or the example script, where the job user can
    /// read it.
    program: PathBuf,
    workload: Workload,
}

/// Copies the Python package and its examples where the job user can read
/// them; returns the PyTorch example's path.
pub fn install_python(run_dir: &Path) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../python");
    let dst = run_dir.join("py");
    for sub in ["railguard", "examples"] {
        let to = dst.join(sub);
        std::fs::create_dir_all(&to)?;
        for e in std::fs::read_dir(src.join(sub)).with_context(|| format!("read {sub}"))? {
            let e = e?;
            if e.path().extension().is_some_and(|x| x == "py") {
                let t = to.join(e.file_name());
                std::fs::copy(e.path(), &t)?;
                std::fs::set_permissions(&t, std::fs::Permissions::from_mode(0o644))?;
            }
        }
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755))?;
    }
    std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o755))?;
    Ok(dst.join("examples").join("torch_ddp.py"))
}

/// The log of `job`'s rank `rank` of `incarnation` as host `host`'s agent
/// captured it (empty if there is none yet).
pub fn rank_log(c: &NetCluster, host: usize, job: &str, incarnation: u64, rank: u32) -> String {
    let p = c
        .run_dir
        .path()
        .join(format!("h{host}"))
        .join("jobs")
        .join(job)
        .join(incarnation.to_string())
        .join(format!("rank-{rank}.log"));
    std::fs::read_to_string(p).unwrap_or_default()
}

/// Job `name` as `railguard job show` gives it (`None` while the cluster
/// cannot answer).
pub fn job_view(c: &NetCluster, name: &str) -> Option<serde_json::Value> {
    c.cli_json(&["job", "show", name])
        .ok()
        .map(|v| v["job"].clone())
}

/// A job spec file as `railguard job submit` takes it.
#[derive(Debug, Serialize)]
pub struct JobFile<'a> {
    pub name: &'a str,
    pub ranks: u32,
    pub ranks_per_host: u32,
    pub hosts: Vec<String>,
    pub command: Vec<String>,
    pub checkpoint_dir: String,
    pub checkpoint_every: u64,
    pub max_restarts: u32,
    pub backoff: String,
}

impl JobFile<'_> {
    /// Writes the spec into the run directory and submits it.
    pub fn submit(&self, c: &NetCluster) -> anyhow::Result<()> {
        let path = c.run_dir.path().join(format!("{}.toml", self.name));
        std::fs::write(&path, toml::to_string(self)?)?;
        c.cli(&["job", "submit", path.to_str().unwrap_or_default()])?;
        Ok(())
    }
}

/// What one job's run looked like.
#[derive(Debug, Clone, Serialize)]
pub struct JobRun {
    pub job: String,
    pub state: String,
    pub incarnations: u64,
    pub restarts: u64,
    /// Submission to Succeeded (or to giving up).
    pub wall_ms: u64,
    pub steps: u64,
    pub steps_per_s: f64,
    pub digest: Option<String>,
}

impl Training {
    /// Builds the testbed, starts supervisors and agents, and waits until
    /// every host is registered and Ready.
    pub async fn start(o: &TrainOpts) -> anyhow::Result<Training> {
        Self::start_with(o, Vec::new()).await
    }

    /// [`Self::start`] with extra flags for host `h`'s agent in
    /// `agent_args[h]` (missing entries: none).
    pub async fn start_with(
        o: &TrainOpts,
        agent_args: Vec<Vec<String>>,
    ) -> anyhow::Result<Training> {
        let c = NetCluster::start_with(
            TestbedSpec {
                supervisors: o.supervisors,
                hosts: o.hosts,
            },
            agent_args,
        )
        .await?;
        let t = Training::from_cluster(c, o.workload)?;
        let n = o.hosts;
        t.c.wait_until("every host Ready", Duration::from_secs(30), |c| {
            c.cli_json(&["node", "list"]).is_ok_and(|v| {
                v["hosts"]
                    .as_array()
                    .is_some_and(|h| h.len() == n && h.iter().all(|x| x["liveness"] == "ready"))
            })
        })
        .await?;
        Ok(t)
    }

    /// Wraps a running cluster (whose hosts are Ready).
    pub fn from_cluster(c: NetCluster, workload: Workload) -> anyhow::Result<Training> {
        let program = match workload {
            Workload::Ringtrain => testbed::job_user::job_binary(&c.run_dir, "ringtrain")?,
            Workload::Torch { .. } => install_python(c.run_dir.path())?,
        };
        Ok(Training {
            c,
            program,
            workload,
        })
    }

    /// Keeps the run directory (logs, checkpoints) after the cluster is
    /// gone, and says where it is.
    pub fn keep_run_dir(&mut self) {
        self.c.keep_run_dir();
    }

    /// Keeps the run directory when `r` is an error or not ok.
    pub fn keep_on_failure(&mut self, r: &anyhow::Result<serde_json::Value>) {
        if !r.as_ref().is_ok_and(|v| v["ok"] == true) {
            self.keep_run_dir();
        }
    }

    /// Where job `name` checkpoints.
    pub fn checkpoint_dir(&self, name: &str) -> PathBuf {
        self.c.run_dir.path().join("ckpt").join(name)
    }

    /// Submits the job through `railguard job submit`.
    pub fn submit(&self, name: &str, o: &TrainOpts, hosts: &[usize]) -> anyhow::Result<()> {
        let mut argv = match self.workload {
            Workload::Ringtrain => vec![self.program.display().to_string()],
            Workload::Torch { step_delay_ms } => vec![
                "/usr/bin/python3".into(),
                self.program.display().to_string(),
                "--step-delay-ms".into(),
                step_delay_ms.to_string(),
            ],
        };
        argv.extend([
            "--steps".into(),
            o.steps.to_string(),
            "--log-every".into(),
            "1".into(),
        ]);
        if let Some(h) = o.hidden {
            argv.extend(["--hidden".into(), h.to_string()]);
        }
        if self.workload == Workload::Ringtrain && o.ringtrain_step_delay_ms > 0 {
            argv.extend([
                "--step-delay-ms".into(),
                o.ringtrain_step_delay_ms.to_string(),
            ]);
        }
        if o.fragile {
            anyhow::ensure!(
                self.workload == Workload::Ringtrain,
                "only ringtrain has a fragile mode"
            );
            argv.push("--fragile".into());
        }
        if let Some(n) = o.rails {
            anyhow::ensure!(
                self.workload == Workload::Ringtrain,
                "only ringtrain takes a rail count"
            );
            argv.extend(["--rails".into(), n.to_string()]);
        }
        if let Some(st) = o.stall_timeout {
            anyhow::ensure!(
                self.workload == Workload::Ringtrain,
                "only ringtrain takes a stall timeout"
            );
            argv.extend(["--stall-timeout".into(), format!("{}ms", st.as_millis())]);
        }
        // The agents create the job's directory (the job user's); only the
        // parent is made here.
        let ckpt = self.checkpoint_dir(name);
        if let Some(parent) = ckpt.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let f = JobFile {
            name,
            ranks: o.ranks,
            ranks_per_host: o.ranks_per_host,
            // The preferred hosts first (rank order), then every other
            // host of the testbed as an allowed spare.
            hosts: hosts
                .iter()
                .copied()
                .chain((0..o.hosts).filter(|h| !hosts.contains(h)))
                .map(|h| format!("h{h}"))
                .collect(),
            command: argv,
            checkpoint_dir: ckpt.display().to_string(),
            checkpoint_every: o.checkpoint_every,
            max_restarts: o.max_restarts,
            backoff: format!("{}ms", o.backoff.as_millis()),
        };
        f.submit(&self.c)
    }

    /// The job as the supervisor shows it (`None` while unreachable).
    pub fn job(&self, name: &str) -> Option<serde_json::Value> {
        job_view(&self.c, name)
    }

    /// Host index of each rank of the current incarnation (of the last
    /// one once the job ended).
    pub fn placement(&self, name: &str) -> Vec<usize> {
        self.job(name)
            .and_then(|j| {
                let p = &j["placement"];
                let p = if p.as_array().is_some_and(|a| !a.is_empty()) {
                    p
                } else {
                    &j["previous_placement"]
                };
                p.as_array().map(|a| {
                    a.iter()
                        .filter_map(|h| h.as_str()?.strip_prefix('h')?.parse().ok())
                        .collect()
                })
            })
            .unwrap_or_default()
    }

    /// A rank's log (empty if there is none yet).
    pub fn rank_log(&self, host: usize, job: &str, incarnation: u64, rank: u32) -> String {
        rank_log(&self.c, host, job, incarnation, rank)
    }

    /// The highest completed step any rank of `incarnation` logged, over
    /// all hosts (ranks log every step in these scenarios).
    pub fn max_step(&self, job: &str, incarnation: u64, hosts: usize, ranks: u32) -> u64 {
        (0..hosts)
            .flat_map(|h| (0..ranks).map(move |r| (h, r)))
            .map(|(h, r)| last_step(&self.rank_log(h, job, incarnation, r)))
            .max()
            .unwrap_or(0)
    }

    /// The digest rank 0 printed in the job's last incarnation.
    pub fn digest(&self, job: &str, incarnation: u64, hosts: usize) -> Option<String> {
        (0..hosts).find_map(|h| digest_of(&self.rank_log(h, job, incarnation, 0)))
    }

    /// Takes host `h` out: its agent and every process in its namespace
    /// SIGKILLed, its management link and both data cables down.
    pub async fn lose_host(&mut self, h: usize) -> anyhow::Result<()> {
        self.c.tb.lose_host(h).await
    }
}

/// Follows one job until it ends.
pub struct Watch {
    pub name: String,
    t0: Instant,
    deadline: Duration,
    last: serde_json::Value,
    last_state: String,
}

impl Watch {
    pub fn new(name: &str, deadline: Duration) -> Self {
        Self {
            name: name.into(),
            t0: Instant::now(),
            deadline,
            last: serde_json::Value::Null,
            last_state: String::new(),
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.t0.elapsed()
    }

    /// The job as last seen.
    pub fn last(&self) -> &serde_json::Value {
        &self.last
    }

    /// Polls the supervisor once: `Some` when the job ended; an error when
    /// the deadline passed.
    pub fn poll(&mut self, t: &Training, o: &TrainOpts) -> anyhow::Result<Option<JobRun>> {
        if self.t0.elapsed() > self.deadline {
            // The cluster's own account, for whoever reads the logs.
            if let Ok(ev) = t.c.cli(&["events", "--limit", "1000"]) {
                let _ = std::fs::write(t.c.run_dir.path().join("events.txt"), ev);
            }
            bail!(
                "job {} did not finish within {:?} (last state {}); logs in {}",
                self.name,
                self.deadline,
                self.last_state,
                t.c.run_dir.path().display()
            );
        }
        let Some(j) = t.job(&self.name) else {
            return Ok(None);
        };
        let state = j["state"].as_str().unwrap_or("?").to_string();
        if state != self.last_state {
            eprintln!(
                "  {:>7.1}s  job {} {state} (incarnation {}, on {})",
                self.t0.elapsed().as_secs_f64(),
                self.name,
                j["incarnation"],
                j["placement"]
                    .as_array()
                    .map(|a| a
                        .iter()
                        .filter_map(|h| h.as_str())
                        .collect::<Vec<_>>()
                        .join(","))
                    .unwrap_or_default()
            );
            self.last_state = state.clone();
        }
        self.last = j;
        if !matches!(state.as_str(), "succeeded" | "failed" | "cancelled") {
            return Ok(None);
        }
        let wall = self.t0.elapsed();
        let inc = self.last["incarnation"].as_u64().unwrap_or(0);
        Ok(Some(JobRun {
            job: self.name.clone(),
            state,
            incarnations: inc,
            restarts: self.last["restarts"].as_u64().unwrap_or(0),
            wall_ms: wall.as_millis() as u64,
            steps: o.steps,
            steps_per_s: o.steps as f64 / wall.as_secs_f64().max(1e-9),
            digest: t.digest(&self.name, inc, o.hosts),
        }))
    }
}

/// Polling period of the scenarios' loops.
const POLL: Duration = Duration::from_millis(100);

/// The last `step=N` a ringtrain or torch_ddp.py log shows (0: none).
pub fn last_step(log: &str) -> u64 {
    log.lines()
        .rev()
        .find_map(|l| {
            let first = l.split_whitespace().next()?;
            first.strip_prefix("step=")?.parse().ok()
        })
        .unwrap_or(0)
}

/// The digest of the final weights: ringtrain's `digest=<hex>` line or
/// torch_ddp.py's `DIGEST <hex>`.
pub fn digest_of(log: &str) -> Option<String> {
    log.lines().rev().find_map(|l| {
        let l = l.trim();
        l.strip_prefix("digest=")
            .or_else(|| l.strip_prefix("DIGEST "))
            .map(str::to_owned)
    })
}

/// A flap storm on the data NICs of the given hosts: every `every`
/// (± half), one random NIC's fabric-side cable goes down for `down`, or,
/// for every `long_every`-th flap, for `long_down` (an outage that outlasts
/// NCCL's ~30 s of retries).
#[derive(Debug, Clone)]
pub struct Storm {
    pub every: Duration,
    pub down: Duration,
    pub seed: u64,
    /// Every this many flaps, one lasts `long_down` (0: never).
    pub long_every: u32,
    pub long_down: Duration,
}

impl Storm {
    /// Short flaps only.
    pub fn short(every: Duration, down: Duration, seed: u64) -> Self {
        Self {
            every,
            down,
            seed,
            long_every: 0,
            long_down: Duration::ZERO,
        }
    }

    /// Whether flap number `n` (1-based) is a long one.
    pub fn is_long(&self, n: u64) -> bool {
        self.long_every > 0 && n.is_multiple_of(u64::from(self.long_every))
    }

    /// How long flap number `n` (1-based) lasts.
    pub fn down_of(&self, n: u64) -> Duration {
        if self.is_long(n) {
            self.long_down
        } else {
            self.down
        }
    }
}

/// Drives a [`Storm`] from a scenario's tick.
pub struct StormState {
    storm: Storm,
    rng: rand::rngs::StdRng,
    next_at: Duration,
    /// (host, rail, up at).
    down: Option<(usize, usize, Duration)>,
    pub flaps: u64,
    /// Of `flaps`, those that lasted `long_down`.
    pub long_flaps: u64,
}

impl StormState {
    pub fn new(storm: Storm, start_after: Duration) -> Self {
        Self {
            rng: rand::rngs::StdRng::seed_from_u64(storm.seed),
            next_at: start_after,
            storm,
            down: None,
            flaps: 0,
            long_flaps: 0,
        }
    }

    /// Takes a cable down or up when it is time.
    pub async fn tick(
        &mut self,
        t: &mut Training,
        now: Duration,
        hosts: &[usize],
    ) -> anyhow::Result<()> {
        if let Some((h, r, up_at)) = self.down {
            if now >= up_at {
                t.c.tb.set_cable(h, r, Side::Fabric, true).await?;
                self.down = None;
            }
            return Ok(());
        }
        if now < self.next_at || hosts.is_empty() {
            return Ok(());
        }
        let h = hosts[self.rng.gen_range(0..hosts.len())];
        let r = self.rng.gen_range(0..2);
        t.c.tb.set_cable(h, r, Side::Fabric, false).await?;
        self.flaps += 1;
        let down = self.storm.down_of(self.flaps);
        if self.storm.is_long(self.flaps) {
            self.long_flaps += 1;
        }
        tracing::info!(
            host = h,
            rail = r,
            down_ms = down.as_millis() as u64,
            "flap: cable down"
        );
        self.down = Some((h, r, now + down));
        let half = self.storm.every.as_millis() as u64 / 2;
        let jitter = self.rng.gen_range(0..=half.max(1) * 2);
        self.next_at = now + down + Duration::from_millis(half + jitter);
        Ok(())
    }

    /// Puts the cable that is down back up.
    pub async fn heal(&mut self, t: &mut Training) -> anyhow::Result<()> {
        if let Some((h, r, _)) = self.down.take() {
            t.c.tb.set_cable(h, r, Side::Fabric, true).await?;
        }
        Ok(())
    }
}

/// Runs one job without faults: its digest and speed are the reference.
pub async fn fault_free(t: &mut Training, name: &str, o: &TrainOpts) -> anyhow::Result<JobRun> {
    let hosts = o.rank_hosts();
    t.submit(name, o, &hosts)?;
    let mut w = Watch::new(name, o.deadline);
    let r = loop {
        if let Some(r) = w.poll(t, o)? {
            break r;
        }
        tokio::time::sleep(POLL).await;
    };
    if r.state != "succeeded" || r.digest.is_none() {
        bail!(
            "the fault-free run ended {} ({}); logs in {}",
            r.state,
            w.last()["reason"],
            t.c.run_dir.path().display()
        );
    }
    Ok(r)
}

/// The flaps a stormy run saw.
#[derive(Debug, Clone, Copy)]
pub struct Flaps {
    pub total: u64,
    /// Of `total`, those that lasted the storm's `long_down`.
    pub long: u64,
}

/// Runs job `name` on the first `ranks` hosts under `storm`.
pub async fn stormy(
    t: &mut Training,
    name: &str,
    o: &TrainOpts,
    storm: &Storm,
) -> anyhow::Result<(JobRun, Flaps)> {
    let hosts = o.rank_hosts();
    t.submit(name, o, &hosts)?;
    let mut s = StormState::new(storm.clone(), Duration::from_secs(2));
    let mut w = Watch::new(name, o.deadline);
    let run = loop {
        let r = match s.tick(t, w.elapsed(), &hosts).await {
            Ok(()) => w.poll(t, o),
            Err(e) => Err(e),
        };
        match r {
            Ok(Some(r)) => break Ok(r),
            Ok(None) => tokio::time::sleep(POLL).await,
            Err(e) => break Err(e),
        }
    };
    s.heal(t).await?;
    let flaps = Flaps {
        total: s.flaps,
        long: s.long_flaps,
    };
    Ok((run?, flaps))
}

/// `scenario train-nic-flap`: a fault-free run, then the same job under a
/// flap storm on random hosts' NICs. ok: the stormy run needed no restart
/// and ended with the fault-free digest.
pub async fn train_nic_flap(o: &TrainOpts, storm: Storm) -> anyhow::Result<serde_json::Value> {
    let mut t = Training::start(o).await?;
    let r = train_nic_flap_in(&mut t, o, storm).await;
    t.keep_on_failure(&r);
    r
}

async fn train_nic_flap_in(
    t: &mut Training,
    o: &TrainOpts,
    storm: Storm,
) -> anyhow::Result<serde_json::Value> {
    eprintln!(
        "train-nic-flap: fault-free run ({} ranks, {} steps)",
        o.ranks, o.steps
    );
    let base = fault_free(t, "base", o).await?;
    eprintln!(
        "train-nic-flap: fault-free {:.2} steps/s, digest {}",
        base.steps_per_s,
        base.digest.as_deref().unwrap_or("-")
    );
    eprintln!(
        "train-nic-flap: the same job under a flap storm (a cable down {:?} every ~{:?})",
        storm.down, storm.every
    );
    let (run, Flaps { total: flaps, .. }) = stormy(t, "storm", o, &storm).await?;
    let same = run.digest.is_some() && run.digest == base.digest;
    eprintln!(
        "train-nic-flap: {flaps} flaps; {:.2} steps/s; restarts {}; digest {}",
        run.steps_per_s,
        run.restarts,
        if same { "equal" } else { "DIFFERENT" }
    );
    let ok = run.state == "succeeded" && run.restarts == 0 && run.incarnations == 1 && same;
    Ok(serde_json::json!({
        "ok": ok,
        "flaps": flaps,
        "restarts": run.restarts,
        "incarnations": run.incarnations,
        "steps": o.steps,
        "digest_equal": same,
        "fault_free_steps_per_s": round2(base.steps_per_s),
        "steps_per_s": round2(run.steps_per_s),
        "goodput": round3(run.steps_per_s / base.steps_per_s.max(1e-9)),
        "digest": run.digest,
    }))
}

/// `scenario host-loss`: the host of the last rank is lost at
/// `lose_at_step` (agent and ranks SIGKILLed, management link and cables
/// down); the job resumes on the spare from its latest complete checkpoint.
pub async fn host_loss(o: &TrainOpts, lose_at_step: u64) -> anyhow::Result<serde_json::Value> {
    let mut t = Training::start(o).await?;
    let r = host_loss_in(&mut t, o, lose_at_step).await;
    t.keep_on_failure(&r);
    r
}

async fn host_loss_in(
    t: &mut Training,
    o: &TrainOpts,
    lose_at_step: u64,
) -> anyhow::Result<serde_json::Value> {
    if o.hosts <= o.rank_hosts().len() {
        bail!("host-loss needs a spare host: --hosts must exceed the ranks");
    }
    eprintln!("host-loss: fault-free run");
    let base = fault_free(t, "base", o).await?;
    let hosts = o.rank_hosts();
    let victim = *hosts.last().context("no ranks")?;
    eprintln!("host-loss: the same job; h{victim} is lost at step {lose_at_step}");
    t.submit("lossy", o, &hosts)?;
    let mut w = Watch::new("lossy", o.deadline);
    let mut lost_at: Option<Instant> = None;
    let mut resumed_after: Option<Duration> = None;
    let run = loop {
        if let Some(r) = w.poll(t, o)? {
            break r;
        }
        let inc = w.last()["incarnation"].as_u64().unwrap_or(0);
        match lost_at {
            None if inc == 1 && t.max_step("lossy", 1, o.hosts, o.ranks) >= lose_at_step => {
                t.lose_host(victim).await?;
                lost_at = Some(Instant::now());
                eprintln!(
                    "  {:>7.1}s  h{victim} lost (agent and ranks killed, links down)",
                    w.elapsed().as_secs_f64()
                );
            }
            Some(at) if resumed_after.is_none() && inc >= 2 => {
                let resume = w.last()["resume_step"].as_u64().unwrap_or(0);
                if t.max_step("lossy", inc, o.hosts, o.ranks) > resume {
                    resumed_after = Some(at.elapsed());
                    eprintln!(
                        "  {:>7.1}s  training resumed from step {resume} ({} ms after the loss)",
                        w.elapsed().as_secs_f64(),
                        at.elapsed().as_millis()
                    );
                }
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let reached = t.max_step("lossy", 1, o.hosts, o.ranks);
    let job = t.job("lossy").unwrap_or_default();
    let resume = job["resume_step"].as_u64().unwrap_or(0);
    let lost_steps = reached.saturating_sub(resume);
    let placement = t.placement("lossy");
    let same = run.digest.is_some() && run.digest == base.digest;
    let on_spare = placement.iter().any(|h| !hosts.contains(h)) && !placement.contains(&victim);
    eprintln!(
        "host-loss: step {reached} reached before the loss, resumed from {resume} ({lost_steps} lost); now on {placement:?}; digest {}",
        if same { "equal" } else { "DIFFERENT" }
    );
    let ok = lost_at.is_some()
        && run.state == "succeeded"
        && same
        && on_spare
        && lost_steps <= o.checkpoint_every
        && resumed_after.is_some();
    Ok(serde_json::json!({
        "ok": ok,
        "scenario": format!("{}host-loss", o.workload.prefix()),
        "lost_host": format!("h{victim}"),
        "steps": o.steps,
        "checkpoint_every": o.checkpoint_every,
        "reached_step": reached,
        "resumed_from_step": resume,
        "lost_steps": lost_steps,
        "resumed_after_ms": resumed_after.map(|d| d.as_millis() as u64),
        "restarts": run.restarts,
        "on_spare": on_spare,
        "digest_equal": same,
    }))
}

/// `scenario drain`: the host of the last rank is drained at
/// `drain_at_step`; the job halts at a checkpoint and moves to the spare
/// without losing a step.
pub async fn drain(o: &TrainOpts, drain_at_step: u64) -> anyhow::Result<serde_json::Value> {
    let mut t = Training::start(o).await?;
    let r = drain_in(&mut t, o, drain_at_step).await;
    t.keep_on_failure(&r);
    r
}

async fn drain_in(
    t: &mut Training,
    o: &TrainOpts,
    drain_at_step: u64,
) -> anyhow::Result<serde_json::Value> {
    if o.hosts <= o.rank_hosts().len() {
        bail!("drain needs a spare host: --hosts must exceed the ranks");
    }
    eprintln!("drain: fault-free run");
    let base = fault_free(t, "base", o).await?;
    let hosts = o.rank_hosts();
    let victim = *hosts.last().context("no ranks")?;
    eprintln!("drain: the same job; h{victim} is drained at step {drain_at_step}");
    t.submit("moved", o, &hosts)?;
    let mut w = Watch::new("moved", o.deadline);
    let mut drained_at: Option<Instant> = None;
    let mut moved_after = None;
    let run = loop {
        if let Some(r) = w.poll(t, o)? {
            break r;
        }
        let inc = w.last()["incarnation"].as_u64().unwrap_or(0);
        if drained_at.is_none()
            && inc == 1
            && t.max_step("moved", 1, o.hosts, o.ranks) >= drain_at_step
        {
            t.c.cli(&[
                "node",
                "drain",
                &format!("h{victim}"),
                "--reason",
                "chaos: drain scenario",
            ])?;
            drained_at = Some(Instant::now());
            eprintln!(
                "  {:>7.1}s  railguard node drain h{victim}",
                w.elapsed().as_secs_f64()
            );
        }
        if let (Some(at), None) = (drained_at, moved_after) {
            let resume = w.last()["resume_step"].as_u64().unwrap_or(0);
            if inc >= 2 && t.max_step("moved", inc, o.hosts, o.ranks) > resume {
                moved_after = Some(at.elapsed());
                eprintln!(
                    "  {:>7.1}s  training resumed from step {resume} on the new hosts",
                    w.elapsed().as_secs_f64()
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let reached = t.max_step("moved", 1, o.hosts, o.ranks);
    let job = t.job("moved").unwrap_or_default();
    let resume = job["resume_step"].as_u64().unwrap_or(0);
    let lost_steps = reached.saturating_sub(resume);
    let same = run.digest.is_some() && run.digest == base.digest;
    let host = t.c.cli_json(&["node", "show", &format!("h{victim}")])?;
    let drained = host["host"]["drain"]["phase"] == "drained";
    let placement = t.placement("moved");
    eprintln!(
        "drain: step {reached} reached, resumed from {resume} ({lost_steps} lost); h{victim} {}; digest {}",
        if drained { "drained" } else { "NOT drained" },
        if same { "equal" } else { "DIFFERENT" }
    );
    let ok = drained_at.is_some()
        && run.state == "succeeded"
        && same
        && lost_steps == 0
        && drained
        && run.restarts == 0
        && !placement.contains(&victim);
    Ok(serde_json::json!({
        "ok": ok,
        "scenario": format!("{}drain", o.workload.prefix()),
        "drained_host": format!("h{victim}"),
        "steps": o.steps,
        "reached_step": reached,
        "resumed_from_step": resume,
        "lost_steps": lost_steps,
        "moved_after_ms": moved_after.map(|d| d.as_millis() as u64),
        "host_drained": drained,
        "restarts": run.restarts,
        "digest_equal": same,
    }))
}

/// `bench goodput`: the same flap storm (same seed: short flaps and, if
/// the storm has them, outages longer than NCCL's retries) against three
/// jobs in one cluster, one after the other: railguard's resilient job;
/// today's fragile baseline (no backup rail, dies after 2 s without a
/// path, restarts from its checkpoint); and an NCCL-like one (no backup
/// rail, waits `nccl_like_timeout` for the path to return before it dies,
/// as NCCL's socket transport retries for ~30 s).
pub async fn goodput(
    o: &TrainOpts,
    storm: Storm,
    nccl_like_timeout: Duration,
) -> anyhow::Result<serde_json::Value> {
    let mut t = Training::start(o).await?;
    let r = goodput_in(&mut t, o, storm, nccl_like_timeout).await;
    t.keep_on_failure(&r);
    r
}

async fn goodput_in(
    t: &mut Training,
    o: &TrainOpts,
    storm: Storm,
    nccl_like_timeout: Duration,
) -> anyhow::Result<serde_json::Value> {
    // A baseline has no backup rail and restarts as often as it needs to:
    // its budget must not be what ends the bench (the fragile job restarts
    // every 2-3 s through a long outage).
    let baseline = |stall_timeout| TrainOpts {
        fragile: true,
        stall_timeout,
        max_restarts: o.max_restarts.max(500),
        ..o.clone()
    };
    let runs = [
        (
            "railguard",
            "resilient",
            o.clone(),
            "with railguard's migration",
        ),
        (
            "without",
            "fragile",
            baseline(None),
            "without (fragile job: no backup rail, dies after 2 s without a path)",
        ),
        (
            "nccl_like",
            "nccl-like",
            baseline(Some(nccl_like_timeout)),
            "NCCL-like (no backup rail, dies only after its stall timeout without a path)",
        ),
    ];
    let mut out = serde_json::Map::new();
    out.insert("steps".into(), o.steps.into());
    out.insert("checkpoint_every".into(), o.checkpoint_every.into());
    out.insert(
        "flap_down_ms".into(),
        (storm.down.as_millis() as u64).into(),
    );
    out.insert(
        "long_flap_down_ms".into(),
        (storm.long_down.as_millis() as u64).into(),
    );
    out.insert("long_flap_every".into(), storm.long_every.into());
    out.insert(
        "nccl_like_timeout_ms".into(),
        (nccl_like_timeout.as_millis() as u64).into(),
    );
    let mut results = Vec::new();
    for (key, job, opts, what) in runs {
        eprintln!("goodput: {what}");
        let (run, flaps) = stormy(t, job, &opts, &storm).await?;
        eprintln!(
            "goodput: {:.2} steps/s, {} restarts, {} flaps ({} long)",
            run.steps_per_s, run.restarts, flaps.total, flaps.long
        );
        out.insert(format!("{key}_steps_per_s"), round2(run.steps_per_s).into());
        out.insert(format!("{key}_restarts"), run.restarts.into());
        out.insert(format!("{key}_flaps"), flaps.total.into());
        out.insert(format!("{key}_long_flaps"), flaps.long.into());
        results.push(run);
    }
    let [with, without, nccl_like] = &results[..] else {
        bail!("goodput ran {} jobs, not 3", results.len());
    };
    let same =
        with.digest.is_some() && with.digest == without.digest && with.digest == nccl_like.digest;
    let ok = results.iter().all(|r| r.state == "succeeded") && same;
    out.insert(
        "ratio".into(),
        round2(with.steps_per_s / without.steps_per_s.max(1e-9)).into(),
    );
    out.insert(
        "ratio_vs_nccl_like".into(),
        round2(with.steps_per_s / nccl_like.steps_per_s.max(1e-9)).into(),
    );
    out.insert("digests_equal".into(), same.into());
    let mut v = serde_json::json!({ "ok": ok });
    v.as_object_mut().context("a JSON object")?.extend(out);
    Ok(v)
}

/// What the demo's training part showed.
#[derive(Debug, Clone, Serialize)]
pub struct DemoTraining {
    pub ok: bool,
    pub steps: u64,
    pub fault_free_steps_per_s: f64,
    pub steps_per_s: f64,
    pub restarts: u64,
    pub digest_equal: bool,
    pub moved_connections: usize,
}

/// The demo's training part: a fault-free ringtrain run, then the same
/// job with a cable pulled under it for `outage`; `say` prints the
/// timeline.
pub async fn demo_training(
    t: &mut Training,
    o: &TrainOpts,
    outage: Duration,
    say: &dyn Fn(&str),
) -> anyhow::Result<DemoTraining> {
    say(&format!(
        "TRAINING: ringtrain, {} ranks (one per host), {} steps, ring all-reduce over resilient connections on rail0/rail1",
        o.ranks, o.steps
    ));
    let base = fault_free(t, "demo-base", o).await?;
    say(&format!(
        "  fault-free run: {:.1} s, {:.1} steps/s, digest {}",
        base.wall_ms as f64 / 1e3,
        base.steps_per_s,
        short_digest(base.digest.as_deref())
    ));
    let hosts = o.rank_hosts();
    t.submit("demo", o, &hosts)?;
    say("  the same job again; a cable will be pulled under it at a third of the run");
    let mut w = Watch::new("demo", o.deadline);
    let victim = 1.min(hosts.len() - 1);
    let mut pulled: Option<Instant> = None;
    let mut restored = false;
    let mut moved = 0;
    let run = loop {
        if let Some(r) = w.poll(t, o)? {
            break r;
        }
        let step = t.max_step("demo", 1, o.hosts, o.ranks);
        match pulled {
            None if step >= o.steps / 3 => {
                t.c.tb.set_cable(victim, 0, Side::Fabric, false).await?;
                pulled = Some(Instant::now());
                say(&format!(
                    "  FAULT at step {step}: cable of h{victim}/rail0 pulled (carrier lost; NCCL would now retry and give up)"
                ));
            }
            Some(at) if !restored && at.elapsed() >= outage => {
                let qps =
                    t.c.cli_json(&["qp", "list", "--job", "demo"])
                        .unwrap_or_default();
                moved = qps["qps"]
                    .as_array()
                    .map_or(0, |a| a.iter().filter(|q| q["moved"] == true).count());
                say(&format!(
                    "  {:.1} s later: training at step {step}; {moved} connections run off their home NIC (railguard qp list)",
                    at.elapsed().as_secs_f64()
                ));
                t.c.tb.set_cable(victim, 0, Side::Fabric, true).await?;
                restored = true;
                say("  REPAIR: cable back; connections fail back once the NIC is reusable");
            }
            _ => {}
        }
        tokio::time::sleep(POLL).await;
    };
    if !restored {
        t.c.tb.set_cable(victim, 0, Side::Fabric, true).await?;
    }
    let same = run.digest.is_some() && run.digest == base.digest;
    say(&format!(
        "  finished: {:.1} steps/s ({:.0} % of fault-free), restarts {}, digest {} ({})",
        run.steps_per_s,
        100.0 * run.steps_per_s / base.steps_per_s.max(1e-9),
        run.restarts,
        short_digest(run.digest.as_deref()),
        if same {
            "equal: not one bit lost"
        } else {
            "DIFFERENT"
        }
    ));
    Ok(DemoTraining {
        ok: run.state == "succeeded" && run.restarts == 0 && same && pulled.is_some(),
        steps: o.steps,
        fault_free_steps_per_s: round2(base.steps_per_s),
        steps_per_s: round2(run.steps_per_s),
        restarts: run.restarts,
        digest_equal: same,
        moved_connections: moved,
    })
}

fn short_digest(d: Option<&str>) -> String {
    d.map(|d| format!("{}…", &d[..d.len().min(12)]))
        .unwrap_or_else(|| "-".into())
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ringtrain_logs_are_read() {
        let log = "start rank=0 world=2\nstep=1 elapsed_ms=3 loss=1\nstep=2 elapsed_ms=5 loss=1\ncheckpoint step=2 ordered=0 path=x\ndigest=abc\n";
        assert_eq!(last_step(log), 2);
        assert_eq!(digest_of(log).as_deref(), Some("abc"));
        assert_eq!(last_step(""), 0);
        assert_eq!(digest_of("step=1 elapsed_ms=1"), None);
        let torch =
            "start rank=0 world=2 step=0\nstep=7 unix_ms=5 loss=0.1\nSTALL {}\nDIGEST 00ff\n";
        assert_eq!(last_step(torch), 7);
        assert_eq!(digest_of(torch).as_deref(), Some("00ff"));
    }
}
