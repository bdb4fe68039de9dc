//! Data cables cut under a training job while every agent and management
//! link stays alive; two scenarios ([`Cut`]):
//!
//! - `scenario cut-off-host`: both data rails of h1 (a rank's host) are
//!   cut. railguard must see h1 cut off (a `host_cut_off` incident, not
//!   Down) and restart the job on hosts with a working rail, never h1
//!   while it is cut off.
//! - `scenario no-common-rail`: h1 loses rail0 and h2 (its ring
//!   neighbour) rail1. Each still has a local backup, but the two share no
//!   working rail: railguard must open a `no_common_rail` incident naming
//!   both and restart the job without the two in it together (a spare
//!   takes one of them; so they are not ring neighbours either), never
//!   crash-looping on the same placement.
//!
//! Five hosts (four ranks of ringtrain and a spare). After a fault-free run
//! for the reference digest, the same job runs once per offset; at
//! `checkpoint step + offset` the cables are pulled (fabric side) for
//! `cut`. The job must resume from its latest complete checkpoint without
//! spending the restart budget, and the incident must stay open until the
//! cables return. Per run: when training was going again after the cut
//! (`resumed_ms`: a rank of the new incarnation logged a step past the
//! resume step), the steps lost, whether a new incarnation was placed the
//! way the fault forbids, the incident's state before and after the cables
//! came back, and the final digest against the fault-free run's.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use testbed::Side;

use crate::bench::percentile_ms;
use crate::training::{fault_free, TrainOpts, Training, Watch};

/// Which cables are cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Both data rails of h1.
    Host,
    /// h1's rail0 and h2's rail1.
    NoCommonRail,
}

impl Cut {
    fn scenario(self) -> &'static str {
        match self {
            Cut::Host => "cut-off-host",
            Cut::NoCommonRail => "no-common-rail",
        }
    }

    /// The (host index, rail) of every cable cut.
    fn cables(self) -> &'static [(usize, usize)] {
        match self {
            Cut::Host => &[(1, 0), (1, 1)],
            Cut::NoCommonRail => &[(1, 0), (2, 1)],
        }
    }

    /// The hosts the fault is about (h1, and h2 for a path).
    fn hosts(self) -> Vec<String> {
        match self {
            Cut::Host => vec!["h1".into()],
            Cut::NoCommonRail => vec!["h1".into(), "h2".into()],
        }
    }

    /// The incident railguard must keep open while the cables are out.
    fn incident(self) -> &'static str {
        match self {
            Cut::Host => "host_cut_off",
            Cut::NoCommonRail => "no_common_rail",
        }
    }

    /// Whether placement `p` (a host per rank) is one the fault forbids:
    /// a rank on the cut-off host, or h1 and h2 in one job (any two ranks
    /// of a job may need to talk, not only ring neighbours).
    fn forbids(self, p: &[String]) -> bool {
        let on = |h: &str| p.iter().any(|x| x == h);
        match self {
            Cut::Host => on("h1"),
            Cut::NoCommonRail => on("h1") && on("h2"),
        }
    }

    fn goal(self) -> &'static str {
        match self {
            Cut::Host => {
                "resumed on a spare within 3 s p99 of the cut, never on the cut-off host, same digest"
            }
            Cut::NoCommonRail => {
                "resumed without the two in one job within 3 s p99 of the cut, 0 restarts spent, same digest"
            }
        }
    }
}

/// The scenario's settings.
#[derive(Debug, Clone)]
pub struct RailCutRun {
    pub cut_kind: Cut,
    pub train: TrainOpts,
    /// Cut this many steps after a checkpoint step (negative: before it).
    pub offsets: Vec<i64>,
    /// How long the cables stay cut.
    pub cut: Duration,
    /// Cut silently: the cables' fabric ends detached from their rail
    /// bridges, so every link stays up with carrier and netlink sees
    /// nothing; only the probe mesh's evidence and the ranks' stalled
    /// connections tell.
    pub silent: bool,
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
    /// A new incarnation placed the way the fault forbids while the cables
    /// were out (on the cut-off host; h1 and h2 in one job).
    pub forbidden_placement: bool,
    pub incident_open_before_repair: bool,
    /// Its detail then (what railguard saw: NIC states, or the ranks'
    /// stalled connections).
    pub incident_detail: Option<String>,
    /// From the repair until the incident closed.
    pub incident_closed_ms: Option<u64>,
    /// The hosts Ready (not drained or cordoned by a playbook) once their
    /// rails were back.
    pub host_ready_after: bool,
    pub state: String,
    pub incarnations: u64,
    pub restarts: u64,
    pub digest_equal: bool,
}

/// The scenario's report.
#[derive(Debug, Clone, Serialize)]
pub struct RailCutReport {
    pub ok: bool,
    pub scenario: &'static str,
    /// The cables pulled, as "host/rail".
    pub cut: Vec<String>,
    /// Cut silently (links up, traffic gone).
    pub silent: bool,
    pub incident: &'static str,
    pub cut_ms: u64,
    pub checkpoint_every: u64,
    pub runs: Vec<CutReport>,
    pub resumed_p50_ms: f64,
    pub resumed_p99_ms: f64,
    pub resumed_max_ms: f64,
    pub goal: &'static str,
    pub goal_met: bool,
}

/// Whether the fault's incident is open (`None` also while the cluster
/// cannot answer): of kind `cut.incident()` on h1 (a path incident names
/// h1 as its host and h2 as its peer).
fn incident_open(t: &Training, cut: Cut) -> Option<bool> {
    Some(incident_detail(t, cut)?.is_some())
}

/// The open incident's detail (what railguard saw).
fn incident_detail(t: &Training, cut: Cut) -> Option<Option<String>> {
    let v = t.c.cli_json(&["incidents"]).ok()?;
    Some(
        v["incidents"]
            .as_array()?
            .iter()
            .find(|i| {
                i["kind"] == cut.incident()
                    && i["host"] == "h1"
                    && (cut == Cut::Host || i["peer"] == "h2")
                    && i["closed_ms"].is_null()
            })
            .map(|i| i["detail"].as_str().unwrap_or_default().to_owned()),
    )
}

/// Job view `j`'s current placement.
fn placement(j: &serde_json::Value) -> Vec<String> {
    j["placement"]
        .as_array()
        .map(|p| {
            p.iter()
                .filter_map(|h| h.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The fault's cables in (`up`) or out (fabric side; `silent`: detached
/// from the rail bridge, link up).
async fn set_rails(t: &mut Training, cut: Cut, silent: bool, up: bool) -> anyhow::Result<()> {
    for &(host, rail) in cut.cables() {
        if silent {
            t.c.tb.set_blackhole(host, rail, !up).await?;
        } else {
            t.c.tb.set_cable(host, rail, Side::Fabric, up).await?;
        }
    }
    Ok(())
}

/// Runs the scenario.
pub async fn run(r: RailCutRun) -> anyhow::Result<RailCutReport> {
    anyhow::ensure!(
        r.train.hosts > r.train.rank_hosts().len(),
        "the scenario needs a spare host: --hosts must exceed the ranks' hosts"
    );
    anyhow::ensure!(
        r.train.rank_hosts().contains(&1) && r.train.rank_hosts().contains(&2),
        "h1 and h2 must run ranks (--ranks at least 3)"
    );
    let mut t = Training::start(&r.train).await?;
    let out = run_in(&mut t, &r).await;
    if !out.as_ref().is_ok_and(|x| x.ok) {
        t.keep_run_dir();
    }
    out
}

async fn run_in(t: &mut Training, r: &RailCutRun) -> anyhow::Result<RailCutReport> {
    let o = &r.train;
    let cut_kind = r.cut_kind;
    let scenario = cut_kind.scenario();
    let cables: Vec<String> = cut_kind
        .cables()
        .iter()
        .map(|(h, rail)| format!("h{h}/rail{rail}"))
        .collect();
    let what = cables.join(" and ");
    eprintln!("{scenario}: fault-free run");
    let base = fault_free(t, "base", o).await?;
    let mut runs = Vec::new();
    for (i, &offset) in r.offsets.iter().enumerate() {
        // The second checkpoint, so a complete one exists before it.
        let ckpt = 2 * o.checkpoint_every;
        let cut_at = (ckpt as i64 + offset).max(1) as u64;
        anyhow::ensure!(cut_at < o.steps, "offset {offset} cuts after the last step");
        let name = format!("cut{i}");
        eprintln!("{scenario}: job {name}: {what} cut at step {cut_at}");
        t.submit(&name, o, &o.rank_hosts())?;
        let mut w = Watch::new(&name, o.deadline);
        let mut cut: Option<Instant> = None;
        let mut repaired: Option<Instant> = None;
        let (mut resumed, mut closed, mut open_before) = (None, None, false);
        let mut forbidden = false;
        let mut detail = None;
        let run = loop {
            let done = w.poll(t, o)?;
            let inc = w.last()["incarnation"].as_u64().unwrap_or(0);
            if cut.is_none() && inc == 1 && t.max_step(&name, 1, o.hosts, o.ranks) >= cut_at {
                anyhow::ensure!(
                    cut_kind.forbids(&placement(w.last())),
                    "job {name}'s placement {} is not one the fault concerns; is a host drained?",
                    w.last()["placement"]
                );
                set_rails(t, cut_kind, r.silent, false).await?;
                cut = Some(Instant::now());
                eprintln!("  {:>7.1}s  {what} cut", w.elapsed().as_secs_f64());
            }
            if let (Some(at), None) = (cut, repaired) {
                forbidden |= inc >= 2 && cut_kind.forbids(&placement(w.last()));
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
                    detail = incident_detail(t, cut_kind).flatten();
                    open_before = detail.is_some();
                    set_rails(t, cut_kind, r.silent, true).await?;
                    repaired = Some(Instant::now());
                    eprintln!("  {:>7.1}s  {what} back", w.elapsed().as_secs_f64());
                }
            }
            if let (Some(at), None) = (repaired, closed) {
                if incident_open(t, cut_kind) == Some(false) {
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
            forbidden_placement: forbidden,
            incident_open_before_repair: open_before,
            incident_detail: detail,
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
            cut_kind.cables().iter().all(|(h, n)| {
                c.nic_state(&format!("h{h}"), &format!("rail{n}"))
                    .is_ok_and(|s| s == "up")
            })
        })
        .await?;
        let mut ready = true;
        for host in cut_kind.hosts() {
            let h = t.c.cli_json(&["node", "show", &host])?["host"].clone();
            ready &= h["drain"].is_null() && h["cordoned"] == false && h["liveness"] == "ready";
        }
        if let Some(last) = runs.last_mut() {
            last.host_ready_after = ready;
        }
        eprintln!("{scenario}: {:?}", runs.last());
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
            && !x.forbidden_placement
            && x.resumed_ms.is_some()
            && x.incident_open_before_repair
            && x.incident_closed_ms.is_some()
            && x.host_ready_after
            && x.restarts == 0
            && x.lost_steps <= o.checkpoint_every
    });
    Ok(RailCutReport {
        ok: each_ok && !runs.is_empty(),
        scenario,
        cut: cables,
        silent: r.silent,
        incident: cut_kind.incident(),
        cut_ms: r.cut.as_millis() as u64,
        checkpoint_every: o.checkpoint_every,
        resumed_p50_ms: percentile_ms(&us, 50.0),
        resumed_p99_ms: p99,
        resumed_max_ms: us.last().map_or(0.0, |m| *m as f64 / 1000.0),
        runs,
        goal: cut_kind.goal(),
        goal_met: each_ok && p99 <= 3000.0,
    })
}
