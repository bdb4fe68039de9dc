//! `scenario gray-link`: a rail that loses or delays packets without going
//! down.
//!
//! ringtrain runs on four hosts (three supervisors, mutual TLS). Each
//! round measures the job's step rate for a fault-free stretch, then makes
//! the fabric end of h1's rail0 cable misbehave while the link stays up
//! with carrier, so netlink sees nothing: a **loss** round drops a share of
//! the packets it sends to h1, chosen at random
//! ([`testbed::bed::Testbed::set_gray_loss`]); a **stalls** round holds
//! back everything it sends to h1 for random moments, up to a few
//! milliseconds every few tens, dropping nothing
//! ([`testbed::bed::Testbed::gray_stalls`]: a paused port). The probe
//! mesh on h1 must find rail0 Degraded (`nic list` shows it; by loss, or by
//! the share of its probes held back), h1's connections must leave it, and
//! the job's step rate over the faulty stretch must stay within 10 % of the
//! fault-free one (measured before and after the round, the mean of the
//! two: the machine's own load moves the rate by several per cent; a
//! first fault-free stretch is a warm-up, not judged). The
//! fault then ends and rail0 must be Up again. Checkers: no other NIC turns
//! Degraded or Down in the whole run (`false_findings`), the job never
//! restarts.
//!
//! `detect: false` runs the same rounds with the agents' loss and delay
//! checks off (`--probe-degraded-loss-pct 0 --probe-degraded-late-us
//! 0`): what the job suffers without them.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::training::{TrainOpts, Training};

/// What one round does to h1's rail0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GrayFault {
    /// Drops this share (%) of what the fabric sends to h1.
    Loss(f64),
    /// Holds back what the fabric sends to h1 for random moments.
    Stalls(testbed::stalls::StallSpec),
}

impl std::fmt::Display for GrayFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GrayFault::Loss(pct) => write!(f, "loses {pct} % of what the fabric sends it"),
            GrayFault::Stalls(s) => write!(
                f,
                "stalls for up to {} ms about every {} ms",
                s.max_stall.as_millis(),
                s.every.as_millis()
            ),
        }
    }
}

/// The scenario's settings.
#[derive(Debug, Clone)]
pub struct GrayLinkRun {
    /// The rounds' faults, in order.
    pub faults: Vec<GrayFault>,
    /// Fault-free stretch before each round's loss.
    pub baseline: Duration,
    /// How long each round's loss lasts.
    pub fault: Duration,
    /// Largest slowdown of the job allowed (%).
    pub max_slowdown_pct: f64,
    /// Each rank's sleep after each step (a GPU's compute time).
    pub step_delay: Duration,
    /// The agents' loss check on (off: the comparison run).
    pub detect: bool,
}

/// One round's figures.
#[derive(Debug, Clone, Serialize)]
pub struct GrayRound {
    /// The share dropped (%; 0 in a stalls round).
    pub loss_pct: f64,
    /// A stalls round: the longest stall and the mean time between
    /// stalls (ms).
    pub stall_max_ms: Option<u64>,
    pub stall_every_ms: Option<u64>,
    /// From the loss on until `nic list` showed rail0 Degraded.
    pub degraded_ms: Option<u64>,
    /// From the loss on until no connection of h1 was on rail0.
    pub moved_ms: Option<u64>,
    /// Steps per second fault-free and while the link lost packets.
    pub baseline_steps_s: f64,
    pub fault_steps_s: f64,
    /// How much slower the job ran while the link lost packets (%).
    pub slowdown_pct: f64,
    /// From the end of the loss until rail0 was Up again.
    pub clean_ms: Option<u64>,
    /// Which of h1's probe judges reported rail0 during the round
    /// ("loss", "delay", both, or none), from h1's agent log: a stalls
    /// round must be found by the delay judge, a loss round by the loss
    /// judge.
    pub found_by: Vec<String>,
}

/// The scenario's report.
#[derive(Debug, Clone, Serialize)]
pub struct GrayLinkReport {
    pub ok: bool,
    pub scenario: &'static str,
    /// Whether the agents' loss check was on.
    pub detect: bool,
    /// The job's step rate in a fault-free stretch before the first
    /// round's baseline (not judged).
    pub warmup_steps_s: f64,
    pub rounds: Vec<GrayRound>,
    pub degraded_ms_max: Option<u64>,
    pub slowdown_pct_max: f64,
    /// NIC transitions to Degraded or Down of any NIC but h1/rail0 (must
    /// be empty).
    pub false_findings: Vec<String>,
    pub incarnations: u64,
    pub restarts: u64,
}

const HOST: &str = "h1";
const NIC: &str = "rail0";
const JOB: &str = "gray";

/// h1's connections of the job: how many, and how many are on rail0 now
/// (`None` while the cluster cannot answer).
fn on_rail0(t: &Training) -> Option<(usize, usize)> {
    let v =
        t.c.cli_json(&["qp", "list", "--host", HOST, "--job", JOB])
            .ok()?;
    let qps = v["qps"].as_array()?;
    Some((qps.len(), qps.iter().filter(|q| q["nic"] == NIC).count()))
}

/// How many times h1's agent has reported rail0 losing probes, and
/// holding them back (its log's warnings).
fn verdicts(t: &Training) -> (usize, usize) {
    let log =
        std::fs::read_to_string(t.c.run_dir.path().join(format!("{HOST}.log"))).unwrap_or_default();
    let count = |what: &str| {
        log.lines()
            .filter(|l| l.contains(what) && l.contains(&format!("nic={NIC}")))
            .count()
    };
    (
        count("the NIC loses probes (gray link)"),
        count("the NIC holds probes back (gray link)"),
    )
}

/// Steps per second of the job over `d` from now.
async fn rate(t: &Training, o: &TrainOpts, d: Duration) -> f64 {
    let s0 = t.max_step(JOB, 1, o.hosts, o.ranks);
    let t0 = Instant::now();
    tokio::time::sleep(d).await;
    let s1 = t.max_step(JOB, 1, o.hosts, o.ranks);
    s1.saturating_sub(s0) as f64 / t0.elapsed().as_secs_f64()
}

/// Every committed transition to Degraded or Down of a NIC other than
/// h1/rail0.
fn false_findings(t: &Training) -> anyhow::Result<Vec<String>> {
    let mut events = Vec::new();
    let mut since = 0u64;
    // Page by page from the oldest (5,000 a call), bounded.
    for _ in 0..1_000 {
        let v =
            t.c.cli_json(&["events", "--since", &since.to_string(), "--limit", "5000"])?;
        let page = v["events"].as_array().cloned().unwrap_or_default();
        let last = page.last().and_then(|e| e["seq"].as_u64());
        let full = page.len() >= 5_000;
        events.extend(page);
        match last {
            Some(s) if full => since = s + 1,
            _ => break,
        }
    }
    let mut out = Vec::new();
    for e in events {
        let Some(ev) = ["NicLink", "NicState"]
            .iter()
            .map(|k| &e["event"][*k])
            .find(|x| x.is_object())
        else {
            continue;
        };
        let host = e["host"].as_str().unwrap_or_default();
        let nic = ev["nic"].as_str().unwrap_or_default();
        let bad = ev["to"] == "degraded" || ev["to"] == "down";
        if bad && (host, nic) != (HOST, NIC) {
            out.push(format!("{host}/{nic} → {}", ev["to"]));
        }
    }
    Ok(out)
}

/// Runs the scenario.
pub async fn run(r: GrayLinkRun) -> anyhow::Result<GrayLinkReport> {
    let o = TrainOpts {
        hosts: 4,
        supervisors: 3,
        ranks: 4,
        // Longer than the scenario: cancelled at the end.
        steps: 1_000_000,
        checkpoint_every: 1000,
        hidden: Some(256),
        ringtrain_step_delay_ms: r.step_delay.as_millis() as u64,
        deadline: (r.baseline + r.fault + Duration::from_secs(60)) * r.faults.len() as u32
            + Duration::from_secs(300),
        ..TrainOpts::default()
    };
    let args = if r.detect {
        Vec::new()
    } else {
        let off = [
            "--probe-degraded-loss-pct",
            "0",
            "--probe-degraded-late-us",
            "0",
        ];
        vec![off.iter().map(|a| a.to_string()).collect(); o.hosts]
    };
    let mut t = Training::start_with(&o, args).await?;
    let report = run_in(&mut t, &o, &r).await;
    // Nothing left in the fabric, whatever happened.
    let _ = t.c.tb.set_gray_loss(1, 0, 0.0).await;
    if !report.as_ref().is_ok_and(|x| x.ok) {
        t.keep_run_dir();
    }
    report
}

async fn run_in(
    t: &mut Training,
    o: &TrainOpts,
    r: &GrayLinkRun,
) -> anyhow::Result<GrayLinkReport> {
    t.submit(JOB, o, &[0, 1, 2, 3])?;
    t.c.wait_until(
        "the job running on its home NICs",
        Duration::from_secs(60),
        |_| {
            t.job(JOB).is_some_and(|j| j["state"] == "running")
                && on_rail0(t).is_some_and(|(n, on)| n > 0 && on > 0)
                && t.max_step(JOB, 1, o.hosts, o.ranks) >= 5
        },
    )
    .await?;
    let mut rounds = Vec::new();
    // The job's first seconds run faster than its steady state (in one
    // run 202 steps/s, then 148–179 in every later fault-free window): a
    // first round judged against them would count that as slowdown.
    let warmup_steps_s = rate(t, o, r.baseline).await;
    let mut before = rate(t, o, r.baseline).await;
    for &fault in &r.faults {
        eprintln!("gray-link: {before:.1} steps/s fault-free; {HOST}/{NIC} now {fault}");
        let stalls = match fault {
            GrayFault::Loss(pct) => {
                t.c.tb.set_gray_loss(1, 0, pct).await?;
                None
            }
            GrayFault::Stalls(spec) => Some(t.c.tb.gray_stalls(1, 0, spec).await?),
        };
        let lossy = Instant::now();
        let seen0 = verdicts(t);
        let s0 = t.max_step(JOB, 1, o.hosts, o.ranks);
        let within = if r.detect {
            r.fault.max(Duration::from_secs(15))
        } else {
            r.fault
        };
        let degraded_ms =
            t.c.wait_until("rail0 Degraded", within, |c| {
                c.nic_state(HOST, NIC).is_ok_and(|s| s == "degraded")
            })
            .await
            .ok()
            .map(|_| lossy.elapsed().as_millis() as u64);
        let moved_ms = match degraded_ms {
            None => None,
            Some(_) => {
                t.c.wait_until(
                    "h1's connections off rail0",
                    Duration::from_secs(15),
                    |_| on_rail0(t).is_some_and(|(n, on)| n > 0 && on == 0),
                )
                .await
                .ok()
                .map(|_| lossy.elapsed().as_millis() as u64)
            }
        };
        if let Some(rest) = r.fault.checked_sub(lossy.elapsed()) {
            tokio::time::sleep(rest).await;
        }
        let s1 = t.max_step(JOB, 1, o.hosts, o.ranks);
        let seen1 = verdicts(t);
        let found_by: Vec<String> = [("loss", seen0.0, seen1.0), ("delay", seen0.1, seen1.1)]
            .into_iter()
            .filter(|(_, a, b)| b > a)
            .map(|(k, _, _)| k.to_string())
            .collect();
        let fault_rate = s1.saturating_sub(s0) as f64 / lossy.elapsed().as_secs_f64();
        match stalls {
            None => t.c.tb.set_gray_loss(1, 0, 0.0).await?,
            Some(s) => s.stop().await?,
        }
        let healed = Instant::now();
        let clean_ms =
            t.c.wait_until("rail0 Up again", Duration::from_secs(30), |c| {
                c.nic_state(HOST, NIC).is_ok_and(|s| s == "up")
            })
            .await
            .ok()
            .map(|_| healed.elapsed().as_millis() as u64);
        // Home again, then the fault-free rate after the round.
        let _ =
            t.c.wait_until("h1's connections home", Duration::from_secs(30), |_| {
                on_rail0(t).is_some_and(|(n, on)| n > 0 && on > 0)
            })
            .await;
        let after = rate(t, o, r.baseline).await;
        let baseline = (before + after) / 2.0;
        before = after;
        let slowdown_pct = if baseline > 0.0 {
            (100.0 * (1.0 - fault_rate / baseline)).max(0.0)
        } else {
            100.0
        };
        eprintln!(
            "gray-link: {fault}: Degraded after {degraded_ms:?} ms, connections off after {moved_ms:?} ms, {fault_rate:.1} steps/s ({slowdown_pct:.1} % slower), Up {clean_ms:?} ms after the fault ended"
        );
        let stall = match fault {
            GrayFault::Stalls(s) => Some(s),
            GrayFault::Loss(_) => None,
        };
        rounds.push(GrayRound {
            loss_pct: match fault {
                GrayFault::Loss(pct) => pct,
                GrayFault::Stalls(_) => 0.0,
            },
            stall_max_ms: stall.map(|s| s.max_stall.as_millis() as u64),
            stall_every_ms: stall.map(|s| s.every.as_millis() as u64),
            found_by,
            degraded_ms,
            moved_ms,
            baseline_steps_s: baseline,
            fault_steps_s: fault_rate,
            slowdown_pct,
            clean_ms,
        });
    }
    let false_findings = false_findings(t)?;
    let job = t.job(JOB).unwrap_or_default();
    let (incarnations, restarts) = (
        job["incarnation"].as_u64().unwrap_or(0),
        job["restarts"].as_u64().unwrap_or(0),
    );
    let _ = t.c.cli(&["job", "cancel", JOB]);
    let slowdown_pct_max = rounds.iter().map(|x| x.slowdown_pct).fold(0.0, f64::max);
    // Without the check, the run shows what the job suffers: no verdict,
    // nothing moved, no restart.
    let ok = !rounds.is_empty()
        && rounds.iter().all(|x| {
            if r.detect {
                let judge = if x.stall_max_ms.is_some() {
                    "delay"
                } else {
                    "loss"
                };
                x.degraded_ms.is_some()
                    && x.found_by.iter().any(|k| k == judge)
                    && x.moved_ms.is_some()
                    && x.clean_ms.is_some()
                    && x.slowdown_pct <= r.max_slowdown_pct
            } else {
                x.degraded_ms.is_none()
            }
        })
        && false_findings.is_empty()
        && incarnations == 1
        && restarts == 0;
    Ok(GrayLinkReport {
        ok,
        scenario: "gray-link",
        detect: r.detect,
        warmup_steps_s,
        degraded_ms_max: rounds.iter().filter_map(|x| x.degraded_ms).max(),
        slowdown_pct_max,
        rounds,
        false_findings,
        incarnations,
        restarts,
    })
}
