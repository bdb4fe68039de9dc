//! `scenario admin-failover`: an admin's `nic failover` sticks.
//!
//! ringtrain runs on three hosts of a netns cluster (three supervisors).
//! `railguard nic failover h1 rail0` moves h1's connections whose home is
//! rail0 to rail1 and holds rail0 out of service. For the hold period the
//! scenario samples `qp list` (what the agents report) and `nic list`
//! every half second, while the leader is SIGKILLed (and restarted) and
//! rail0's cable is pulled and put back twice (each time the NIC goes down
//! and recovers, which would normally end in an automatic failback).
//! Every sample must show those connections off rail0 and the NIC held.
//! Then `railguard nic failback h1 rail0` must bring them home. Training
//! must progress throughout, in one incarnation.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use testbed::{Node, Side};

use crate::training::{TrainOpts, Training};

/// The scenario's settings.
#[derive(Debug, Clone)]
pub struct AdminFailoverRun {
    /// How long the failover must hold.
    pub hold: Duration,
    /// How long each cable pull lasts.
    pub pull: Duration,
}

/// The scenario's report.
#[derive(Debug, Clone, Serialize)]
pub struct AdminFailoverReport {
    pub ok: bool,
    pub scenario: &'static str,
    pub hold_ms: u64,
    /// h1's connections whose home is rail0.
    pub conns_held: usize,
    /// `qp list` samples during the hold, and those that showed one of
    /// those connections on rail0 (must be 0).
    pub samples: usize,
    pub samples_on_held_nic: usize,
    /// `nic list` samples that did not show rail0 held (must be 0).
    pub samples_not_held: usize,
    pub leader_kills: usize,
    pub cable_pulls: usize,
    /// From `nic failback` until every connection was home again.
    pub failback_ms: Option<u64>,
    /// Training steps completed during the hold (it kept training).
    pub steps_during_hold: u64,
    pub incarnations: u64,
    pub restarts: u64,
}

const HOST: &str = "h1";
const NIC: &str = "rail0";
const JOB: &str = "held";
const SAMPLE: Duration = Duration::from_millis(500);

/// h1's connections of the job whose home rail is 0: how many, and how
/// many of them are on rail0 now (`None` while the cluster cannot answer).
fn home_rail0(t: &Training) -> Option<(usize, usize)> {
    let v =
        t.c.cli_json(&["qp", "list", "--host", HOST, "--job", JOB])
            .ok()?;
    let qps: Vec<&serde_json::Value> = v["qps"]
        .as_array()?
        .iter()
        .filter(|q| q["rail"] == 0)
        .collect();
    let on = qps.iter().filter(|q| q["nic"] == NIC).count();
    Some((qps.len(), on))
}

/// Whether `nic list` shows h1/rail0 held out (`None`: no answer).
fn held(t: &Training) -> Option<bool> {
    let v = t.c.cli_json(&["nic", "list"]).ok()?;
    let n = v["nics"]
        .as_array()?
        .iter()
        .find(|n| n["host"] == HOST && n["name"] == NIC)?
        .clone();
    Some(!n["held_out"].is_null())
}

/// Runs the scenario.
pub async fn run(r: AdminFailoverRun) -> anyhow::Result<AdminFailoverReport> {
    let o = TrainOpts {
        hosts: 3,
        supervisors: 3,
        ranks: 3,
        // Longer than the scenario: cancelled at the end.
        steps: 1_000_000,
        checkpoint_every: 1000,
        hidden: Some(256),
        deadline: r.hold + Duration::from_secs(300),
        ..TrainOpts::default()
    };
    let mut t = Training::start(&o).await?;
    let report = run_in(&mut t, &o, &r).await;
    if !report.as_ref().is_ok_and(|x| x.ok) {
        t.keep_run_dir();
    }
    report
}

async fn run_in(
    t: &mut Training,
    o: &TrainOpts,
    r: &AdminFailoverRun,
) -> anyhow::Result<AdminFailoverReport> {
    t.submit(JOB, o, &[0, 1, 2])?;
    // Running, with every connection registered on its home NIC.
    t.c.wait_until(
        "the job running on its home NICs",
        Duration::from_secs(60),
        |_| {
            t.job(JOB).is_some_and(|j| j["state"] == "running")
                && home_rail0(t).is_some_and(|(n, on)| n > 0 && on == n)
                && t.max_step(JOB, 1, o.hosts, o.ranks) >= 5
        },
    )
    .await?;
    let (conns, _) = home_rail0(t).context("qp list")?;
    eprintln!("admin-failover: {conns} connections of {HOST} live on {NIC}; railguard nic failover {HOST} {NIC}");
    t.c.cli(&["nic", "failover", HOST, NIC])?;
    t.c.wait_until("the connections off rail0", Duration::from_secs(30), |_| {
        home_rail0(t).is_some_and(|(_, on)| on == 0)
    })
    .await?;
    let step0 = t.max_step(JOB, 1, o.hosts, o.ranks);
    let start = Instant::now();
    let (mut samples, mut on_held, mut not_held) = (0, 0, 0);
    let (mut leader_kills, mut pulls) = (0, 0);
    let mut pulled: Option<Instant> = None;
    let max_samples = (r.hold.as_millis() / SAMPLE.as_millis()) as usize + 10;
    while start.elapsed() < r.hold && samples < max_samples {
        let at = start.elapsed().as_secs_f64() / r.hold.as_secs_f64();
        if leader_kills == 0 && at >= 0.25 {
            let l = t.c.leader_index()?;
            eprintln!(
                "  {:>5.1}s  SIGKILL the leader s{l}",
                start.elapsed().as_secs_f64()
            );
            t.c.tb.kill_node(Node::Supervisor(l));
            leader_kills += 1;
            tokio::time::sleep(Duration::from_millis(300)).await;
            t.c.start_supervisor(l)?;
        }
        if pulled.is_none() && ((pulls == 0 && at >= 0.4) || (pulls == 1 && at >= 0.65)) {
            eprintln!(
                "  {:>5.1}s  {HOST}/{NIC} cable pulled",
                start.elapsed().as_secs_f64()
            );
            t.c.tb.set_cable(1, 0, Side::Fabric, false).await?;
            pulled = Some(Instant::now());
            pulls += 1;
        }
        if pulled.is_some_and(|p| p.elapsed() >= r.pull) {
            t.c.tb.set_cable(1, 0, Side::Fabric, true).await?;
            eprintln!(
                "  {:>5.1}s  {HOST}/{NIC} cable back",
                start.elapsed().as_secs_f64()
            );
            pulled = None;
        }
        if let Some((_, on)) = home_rail0(t) {
            samples += 1;
            if on > 0 {
                on_held += 1;
                eprintln!(
                    "  {:>5.1}s  {on} connections back on the held {NIC}",
                    start.elapsed().as_secs_f64()
                );
            }
        }
        if held(t) == Some(false) {
            not_held += 1;
        }
        tokio::time::sleep(SAMPLE).await;
    }
    if pulled.is_some() {
        t.c.tb.set_cable(1, 0, Side::Fabric, true).await?;
    }
    let steps_during_hold = t.max_step(JOB, 1, o.hosts, o.ranks).saturating_sub(step0);
    eprintln!(
        "admin-failover: held {:.0} s ({samples} samples, {on_held} on {NIC}); {steps_during_hold} steps meanwhile; railguard nic failback {HOST} {NIC}",
        start.elapsed().as_secs_f64()
    );
    // The NIC must be up before it can take connections back.
    t.c.wait_until("rail0 up again", Duration::from_secs(120), |c| {
        c.nic_state(HOST, NIC).is_ok_and(|s| s == "up")
    })
    .await?;
    let back = Instant::now();
    t.c.cli(&["nic", "failback", HOST, NIC])?;
    let failback_ms =
        t.c.wait_until("the connections home", Duration::from_secs(30), |_| {
            home_rail0(t).is_some_and(|(n, on)| on == n)
        })
        .await
        .ok()
        .map(|_| back.elapsed().as_millis() as u64);
    let job = t.job(JOB).unwrap_or_default();
    let (incarnations, restarts) = (
        job["incarnation"].as_u64().unwrap_or(0),
        job["restarts"].as_u64().unwrap_or(0),
    );
    let _ = t.c.cli(&["job", "cancel", JOB]);
    let ok = samples > 0
        && on_held == 0
        && not_held == 0
        && leader_kills == 1
        && pulls == 2
        && failback_ms.is_some()
        && held(t) == Some(false)
        && steps_during_hold > 0
        && incarnations == 1
        && restarts == 0;
    Ok(AdminFailoverReport {
        ok,
        scenario: "admin-failover",
        hold_ms: r.hold.as_millis() as u64,
        conns_held: conns,
        samples,
        samples_on_held_nic: on_held,
        samples_not_held: not_held,
        leader_kills,
        cable_pulls: pulls,
        failback_ms,
        steps_during_hold,
        incarnations,
        restarts,
    })
}
