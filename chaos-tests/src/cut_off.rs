//! `scenario cut-off-host`: both data rails of a rank's host are cut while
//! its agent and management link stay alive.
//!
//! Five hosts (four ranks of ringtrain and a spare). After a fault-free run
//! for the reference digest, the same job runs once per offset; at
//! `checkpoint step + offset` both data cables of h1 are pulled (fabric
//! side) for `cut`. railguard must see h1 cut off (a `host_cut_off`
//! incident, not Down), restart the job from its latest complete
//! checkpoint on hosts that have a working rail (never h1 while it is cut
//! off) without spending the restart budget, and keep the incident open
//! until the rails return. Per run: when training was going again after
//! the cut (`resumed_ms`: a rank of the new incarnation logged a step past
//! the resume step), the steps lost, where each new incarnation was
//! placed, the incident's state before and after the cables came back, and
//! the final digest against the fault-free run's.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use testbed::Side;

use crate::bench::percentile_ms;
use crate::training::{fault_free, TrainOpts, Training, Watch};

/// The scenario's settings.
#[derive(Debug, Clone)]
pub struct CutOffRun {
    pub train: TrainOpts,
    /// Cut this many steps after a checkpoint step (negative: before it).
    pub offsets: Vec<i64>,
    /// How long both rails stay cut.
    pub cut: Duration,
}

/// One cut.
#[derive(Debug, Clone, Serialize)]
pub struct CutReport {
    pub offset: i64,
    pub cut_at_step: u64,
    pub resumed_from_step: u64,
    pub lost_steps: u64,
    /// From the cut until a rank of a new incarnation logged a step past
    /// its resume step.
    pub resumed_ms: Option<u64>,
    /// A new incarnation placed on the cut-off host while it was cut off.
    pub placed_on_cut_host: bool,
    pub incident_open_before_repair: bool,
    /// From the repair until the incident closed.
    pub incident_closed_ms: Option<u64>,
    /// The host Ready (not drained or cordoned by a playbook) once its
    /// rails were back.
    pub host_ready_after: bool,
    pub state: String,
    pub incarnations: u64,
    pub restarts: u64,
    pub digest_equal: bool,
}

/// The scenario's report.
#[derive(Debug, Clone, Serialize)]
pub struct CutOffReport {
    pub ok: bool,
    pub scenario: &'static str,
    pub cut_host: String,
    pub cut_ms: u64,
    pub checkpoint_every: u64,
    pub runs: Vec<CutReport>,
    pub resumed_p50_ms: f64,
    pub resumed_p99_ms: f64,
    pub resumed_max_ms: f64,
    pub goal: &'static str,
    pub goal_met: bool,
}

const VICTIM: usize = 1;

/// The host's open `host_cut_off` incident, if any (`None` also while the
/// cluster cannot answer).
fn cut_off_open(t: &Training, host: &str) -> Option<bool> {
    let v = t.c.cli_json(&["incidents"]).ok()?;
    Some(
        v["incidents"]
            .as_array()?
            .iter()
            .any(|i| i["kind"] == "host_cut_off" && i["host"] == host && i["closed_ms"].is_null()),
    )
}

/// Whether job view `j`'s current placement has a rank on `host`.
fn runs_on(j: &serde_json::Value, host: &str) -> bool {
    j["placement"]
        .as_array()
        .is_some_and(|p| p.iter().any(|h| *h == host))
}

/// Both data cables of the victim in (`up`) or out (fabric side).
async fn set_rails(t: &mut Training, up: bool) -> anyhow::Result<()> {
    for rail in 0..2 {
        t.c.tb.set_cable(VICTIM, rail, Side::Fabric, up).await?;
    }
    Ok(())
}

/// Runs the scenario.
pub async fn run(r: CutOffRun) -> anyhow::Result<CutOffReport> {
    anyhow::ensure!(
        r.train.hosts > r.train.rank_hosts().len(),
        "the scenario needs a spare host: --hosts must exceed the ranks' hosts"
    );
    anyhow::ensure!(
        r.train.rank_hosts().contains(&VICTIM),
        "h{VICTIM} must run a rank"
    );
    let mut t = Training::start(&r.train).await?;
    let out = run_in(&mut t, &r).await;
    if !out.as_ref().is_ok_and(|x| x.ok) {
        t.keep_run_dir();
    }
    out
}

async fn run_in(t: &mut Training, r: &CutOffRun) -> anyhow::Result<CutOffReport> {
    let o = &r.train;
    let host = format!("h{VICTIM}");
    eprintln!("cut-off-host: fault-free run");
    let base = fault_free(t, "base", o).await?;
    let mut runs = Vec::new();
    for (i, &offset) in r.offsets.iter().enumerate() {
        // The second checkpoint, so a complete one exists before it.
        let ckpt = 2 * o.checkpoint_every;
        let cut_at = (ckpt as i64 + offset).max(1) as u64;
        anyhow::ensure!(cut_at < o.steps, "offset {offset} cuts after the last step");
        let name = format!("cut{i}");
        eprintln!("cut-off-host: job {name}: both rails of {host} cut at step {cut_at}");
        t.submit(&name, o, &o.rank_hosts())?;
        let mut w = Watch::new(&name, o.deadline);
        let mut cut: Option<Instant> = None;
        let mut repaired: Option<Instant> = None;
        let (mut resumed, mut closed, mut open_before) = (None, None, false);
        let mut placed_on_cut = false;
        let run = loop {
            let done = w.poll(t, o)?;
            let inc = w.last()["incarnation"].as_u64().unwrap_or(0);
            if cut.is_none() && inc == 1 && t.max_step(&name, 1, o.hosts, o.ranks) >= cut_at {
                anyhow::ensure!(
                    runs_on(w.last(), &host),
                    "job {name} runs no rank on {host} (placement {}); is it drained?",
                    w.last()["placement"]
                );
                set_rails(t, false).await?;
                cut = Some(Instant::now());
                eprintln!(
                    "  {:>7.1}s  both rails of {host} cut",
                    w.elapsed().as_secs_f64()
                );
            }
            if let (Some(at), None) = (cut, repaired) {
                placed_on_cut |= inc >= 2 && runs_on(w.last(), &host);
                let resume = w.last()["resume_step"].as_u64().unwrap_or(0);
                if resumed.is_none()
                    && inc >= 2
                    && t.max_step(&name, inc, o.hosts, o.ranks) > resume
                {
                    resumed = Some(at.elapsed());
                    eprintln!(
                        "  {:>7.1}s  training again from step {resume}",
                        w.elapsed().as_secs_f64()
                    );
                }
                if at.elapsed() >= r.cut && (done.is_some() || resumed.is_some()) {
                    open_before = cut_off_open(t, &host) == Some(true);
                    set_rails(t, true).await?;
                    repaired = Some(Instant::now());
                    eprintln!(
                        "  {:>7.1}s  rails of {host} back",
                        w.elapsed().as_secs_f64()
                    );
                }
            }
            if let (Some(at), None) = (repaired, closed) {
                if cut_off_open(t, &host) == Some(false) {
                    closed = Some(at.elapsed());
                } else if at.elapsed() > Duration::from_secs(30) {
                    closed = Some(Duration::MAX);
                }
            }
            if let Some(run) = done {
                if repaired.is_some() && closed.is_some() {
                    break run;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let reached = t.max_step(&name, 1, o.hosts, o.ranks);
        let job = t.job(&name).context("job")?;
        let resume = job["resume_step"].as_u64().unwrap_or(0);
        runs.push(CutReport {
            offset,
            cut_at_step: cut_at,
            resumed_from_step: resume,
            lost_steps: reached.saturating_sub(resume),
            resumed_ms: resumed.map(|d| d.as_millis() as u64),
            placed_on_cut_host: placed_on_cut,
            incident_open_before_repair: open_before,
            incident_closed_ms: closed
                .filter(|d| *d != Duration::MAX)
                .map(|d| d.as_millis() as u64),
            host_ready_after: false,
            state: run.state.clone(),
            incarnations: run.incarnations,
            restarts: run.restarts,
            digest_equal: run.digest.is_some() && run.digest == base.digest,
        });
        // The NICs up and the incident gone before the next run.
        t.c.wait_until("the rails up again", Duration::from_secs(120), |c| {
            (0..2).all(|n| {
                c.nic_state(&host, &format!("rail{n}"))
                    .is_ok_and(|s| s == "up")
            })
        })
        .await?;
        let h = t.c.cli_json(&["node", "show", &host])?["host"].clone();
        let ready = h["drain"].is_null() && h["cordoned"] == false && h["liveness"] == "ready";
        if let Some(last) = runs.last_mut() {
            last.host_ready_after = ready;
        }
        eprintln!("cut-off-host: {:?}", runs.last());
    }
    let mut us: Vec<u64> = runs
        .iter()
        .map(|x| x.resumed_ms.map_or(u64::MAX / 1000, |m| m * 1000))
        .collect();
    us.sort_unstable();
    let p99 = percentile_ms(&us, 99.0);
    let each_ok = runs.iter().all(|x| {
        x.state == "succeeded"
            && x.digest_equal
            && !x.placed_on_cut_host
            && x.resumed_ms.is_some()
            && x.incident_open_before_repair
            && x.incident_closed_ms.is_some()
            && x.host_ready_after
            && x.restarts == 0
            && x.lost_steps <= o.checkpoint_every
    });
    Ok(CutOffReport {
        ok: each_ok && !runs.is_empty(),
        scenario: "cut-off-host",
        cut_host: host,
        cut_ms: r.cut.as_millis() as u64,
        checkpoint_every: o.checkpoint_every,
        resumed_p50_ms: percentile_ms(&us, 50.0),
        resumed_p99_ms: p99,
        resumed_max_ms: us.last().map_or(0.0, |m| *m as f64 / 1000.0),
        runs,
        goal:
            "resumed on a spare within 3 s p99 of the cut, never on the cut-off host, same digest",
        goal_met: each_ok && p99 <= 3000.0,
    })
}
