//! `scenario disk-faults`: what a disk does to a supervisor — it fills, it
//! turns read-only after an error, it stalls — under the leader and under
//! a follower, while admin clients write and read; then clock steps on
//! hosts of a netns cluster with real agents.
//!
//! **The disks** (3 supervisors on loopback, each on its own small ext4
//! filesystem on a loop device, [`testbed::disk::LoopDisk`]): each fault
//! in turn, first under the leader, then under a follower, with the
//! `leader-kill` scenario's admin load running throughout.
//! - *full*: the filesystem fills. The member must stop (openraft stops
//!   on a storage error; the supervisor then exits rather than going on
//!   as a leader with a dead core), the others go on, and once the space
//!   is freed and it is started again it catches up.
//! - *read-only*: ext4 records an error and remounts read-only (every
//!   write `EROFS`). The same must follow; the operator's repair is
//!   unmount, `e2fsck`, mount.
//! - *stall*: the filesystem is frozen for `--stall-s`: every write and
//!   fsync blocks. The member must survive it and catch up after; under
//!   the leader, the cluster must not wait for the disk (the leader hands
//!   its leadership on when its own log flush stalls).
//!
//! Checked over the whole run: every acknowledged write survives
//! (`lost_acked_ops`), the history is linearizable, no member panics.
//!
//! **Clock steps** ([`clock_steps`]): two hosts' clocks step by ±1 s (the
//! agents' test clock, as an NTP daemon steps a clock) and back, in a
//! netns cluster with the probe mesh and the contention detector running:
//! no NIC, host or contention finding may follow, and the clock solution
//! must follow the steps.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;
use supervisor::api::{AdminReply, AdminRequest};
use supervisor::client::AdminClient;
use testbed::cluster::SupervisorCluster;
use testbed::disk::LoopDisk;

use crate::admin_history::HistoryLoad;

/// Size of each supervisor's disk.
const DISK_MIB: u64 = 64;
/// Longest wait for a member to stop after its disk failed.
const EXIT_WITHIN: Duration = Duration::from_secs(30);
/// Longest wait for a restarted member to catch up.
const CATCH_UP_WITHIN: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub struct DiskFaultsRun {
    /// How long a stalled (frozen) disk stays frozen.
    pub stall: Duration,
    pub clients: usize,
    pub seed: u64,
    /// Load between two faults.
    pub settle: Duration,
    /// Size of the clock steps (`None`: no clock part).
    pub clock_step: Option<Duration>,
    /// Time between two clock steps.
    pub clock_gap: Duration,
}

/// One fault and what it did.
#[derive(Debug, Clone, Serialize)]
pub struct FaultReport {
    /// `full`, `read-only` or `stall`.
    pub fault: &'static str,
    /// `leader` or `follower`.
    pub target: &'static str,
    pub member: u64,
    /// From the fault to the member's exit (`null`: it did not exit,
    /// which is right only for a stall).
    pub exit_ms: Option<u64>,
    /// The member's exit code when it exited.
    pub exit_code: Option<i32>,
    /// Who led once the fault had been dealt with.
    pub leader_after: u64,
    /// Longest time without a successful admin operation, from the fault
    /// until the member had caught up.
    pub unavailable_ms: u64,
    /// From its restart (or the thaw) until it had applied what the leader
    /// had.
    pub caught_up_ms: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct DiskReport {
    pub faults: Vec<FaultReport>,
    pub acked_ops: usize,
    pub lost_acked_ops: usize,
    pub unknown_ops: usize,
    pub linearizable: bool,
    pub linearizability: String,
    pub unexpected_errors: usize,
    /// Members whose log shows a panic.
    pub panics: usize,
    pub errors: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Full,
    ReadOnly,
    Stall,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Full => "full",
            Fault::ReadOnly => "read-only",
            Fault::Stall => "stall",
        }
    }
}

/// Longest time (ms) without a success inside `[from, to]`, given the
/// sorted success times.
pub fn longest_gap_within(successes: &[u64], from: u64, to: u64) -> u64 {
    let mut last = from;
    let mut longest = 0;
    for &t in successes.iter().filter(|&&t| t > from && t <= to) {
        longest = longest.max(t - last);
        last = t;
    }
    longest.max(to.saturating_sub(last))
}

/// Waits until member `id` has applied at least what the leader had
/// applied when this was called.
async fn caught_up(c: &SupervisorCluster, id: u64) -> anyhow::Result<()> {
    let leader = c.wait_leader(Duration::from_secs(20)).await?;
    let target = match c
        .client_for(leader, Duration::from_secs(2))?
        .call(AdminRequest::Status, true)
        .await?
    {
        AdminReply::Status(s) => s.applied_index,
        other => bail!("unexpected reply {other:?}"),
    };
    let mine = c.client_for(id, Duration::from_secs(2))?;
    let deadline = Instant::now() + CATCH_UP_WITHIN;
    loop {
        if let Ok(AdminReply::Status(s)) = mine.call(AdminRequest::Status, true).await {
            if s.applied_index >= target {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("member {id} did not catch up to index {target} within {CATCH_UP_WITHIN:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits (bounded) for member `id` to exit by itself.
async fn wait_exit(c: &mut SupervisorCluster, id: u64) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + EXIT_WITHIN;
    while Instant::now() < deadline {
        if let Some(s) = c.exit_status(id) {
            return Some(s);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// Counts the members whose log shows a panic.
fn panics(c: &SupervisorCluster) -> usize {
    (1..=c.nodes.len() as u64)
        .filter(|&id| {
            std::fs::read_to_string(c.log_of(id)).is_ok_and(|l| l.contains("panicked at"))
        })
        .count()
}

/// The disk part: every fault under the leader, then under a follower.
pub async fn disks(p: &DiskFaultsRun) -> anyhow::Result<DiskReport> {
    anyhow::ensure!((1..=32).contains(&p.clients), "--clients takes 1..=32");
    anyhow::ensure!(
        (Duration::from_secs(1)..=Duration::from_secs(60)).contains(&p.stall),
        "--stall-s takes 1..=60"
    );
    let mut disks: Vec<LoopDisk> = Vec::new();
    let mut c = SupervisorCluster::start_prepared(3, &[], |n| {
        let image = n.data_dir.with_extension("img");
        disks.push(LoopDisk::create(&image, &n.data_dir, DISK_MIB)?);
        Ok(())
    })?;
    c.init().await.context("initialise the cluster")?;
    let hosts: Vec<String> = (0..4).map(|i| format!("h{i}")).collect();
    for h in &hosts {
        testbed::agentsim::register_host(&c.addrs(), h, &c.agent_tls(h)?).await?;
    }
    let clients = (0..p.clients)
        .map(|id| {
            Ok(
                c.client(&format!("chaos-{id}"), id, Duration::from_secs(3))?
                    .with_retry_window(Duration::from_secs(10)),
            )
        })
        .collect::<anyhow::Result<Vec<AdminClient>>>()?;
    let load = HistoryLoad::start(clients, hosts, p.seed);
    let since = |t: Instant| t.duration_since(load.started()).as_millis() as u64;
    let mut windows = Vec::new();
    let mut faults = Vec::new();
    let mut errors = Vec::new();
    for fault in [Fault::Full, Fault::ReadOnly, Fault::Stall] {
        for target in ["leader", "follower"] {
            tokio::time::sleep(p.settle).await;
            let leader = c.wait_leader(Duration::from_secs(20)).await?;
            let member = if target == "leader" {
                leader
            } else {
                (1..=3).find(|&id| id != leader).unwrap_or(1)
            };
            let disk = &mut disks[(member - 1) as usize];
            eprintln!(
                "[disk-faults] {} under the {target} (member {member})",
                fault.name()
            );
            let t0 = Instant::now();
            let (exit, ready) = match fault {
                Fault::Full | Fault::ReadOnly => {
                    if fault == Fault::Full {
                        disk.fill()?;
                    } else {
                        disk.fail_read_only()?;
                    }
                    let exit = wait_exit(&mut c, member).await.map(|s| (t0.elapsed(), s));
                    if exit.is_none() {
                        errors.push(format!(
                            "member {member} kept running {EXIT_WITHIN:?} after its disk went {}",
                            fault.name()
                        ));
                        c.kill(member);
                    }
                    if fault == Fault::Full {
                        disk.unfill()?;
                    } else {
                        disk.repair()?;
                    }
                    c.restart(member)?;
                    (exit, Instant::now())
                }
                Fault::Stall => {
                    disk.freeze()?;
                    let frozen = tokio::time::sleep(p.stall);
                    frozen.await;
                    disk.thaw()?;
                    if let Some(s) = c.exit_status(member) {
                        errors.push(format!("member {member} exited during a stall: {s}"));
                        c.restart(member)?;
                    }
                    (None, Instant::now())
                }
            };
            if let Err(e) = caught_up(&c, member).await {
                errors.push(e.to_string());
            }
            let caught_up_ms = ready.elapsed().as_millis() as u64;
            let leader_after = c.wait_leader(Duration::from_secs(20)).await?;
            windows.push((since(t0), since(Instant::now())));
            eprintln!(
                "[disk-faults] {} under the {target}: exit {:?}, leader after {leader_after}, caught up in {caught_up_ms} ms",
                fault.name(),
                exit.map(|(t, s)| (t, s.code()))
            );
            faults.push(FaultReport {
                fault: fault.name(),
                target,
                member,
                exit_ms: exit.map(|(t, _)| t.as_millis() as u64),
                exit_code: exit.and_then(|(_, s)| s.code()),
                leader_after,
                unavailable_ms: 0,
                caught_up_ms,
            });
        }
    }
    tokio::time::sleep(p.settle).await;
    c.wait_leader(Duration::from_secs(20)).await?;
    let reader = c.client("chaos-final", 0, Duration::from_secs(5))?;
    let v = load.finish(&reader, "disk-faults").await?;
    for (f, (from, to)) in faults.iter_mut().zip(windows) {
        f.unavailable_ms = longest_gap_within(&v.successes, from, to);
    }
    for u in v.unexpected.iter().take(5) {
        eprintln!("[disk-faults] unexpected: {u}");
    }
    v.keep_failed(&c.run_dir, "disk-faults");
    let panics = panics(&c);
    // Stopped before their disks go, and the disks before the run
    // directory they are mounted in.
    for id in 1..=3 {
        c.kill(id);
    }
    drop(disks);
    let report = DiskReport {
        faults,
        acked_ops: v.acked_ops,
        lost_acked_ops: v.lost_ops,
        unknown_ops: v.unknown_ops,
        linearizable: v.linearizable,
        linearizability: v.linearizability,
        unexpected_errors: v.unexpected.len(),
        panics,
        errors,
    };
    if !report.errors.is_empty() || !v.linearizable || v.lost_ops > 0 || panics > 0 {
        let dir = c.keep();
        eprintln!("[disk-faults] supervisor logs kept in {}", dir.display());
    }
    Ok(report)
}

/// What the clock steps did.
#[derive(Debug, Clone, Serialize)]
pub struct ClockStepReport {
    /// Size of every step, ms (forward, then back).
    pub step_ms: i64,
    /// Steps taken, over all hosts.
    pub steps: usize,
    /// Committed NIC transitions to Degraded, Down or Flapping, and host
    /// liveness changes, while nothing but clocks changed (must be none).
    pub false_link_findings: Vec<String>,
    /// Incidents opened other than `clock_unsynced` (must be none).
    pub false_incidents: Vec<String>,
    /// Committed clock-state changes to Unsynced.
    pub clock_unsynced: usize,
    /// Per step: from the step until the leader's estimate of every
    /// host's offset was within 100 µs of the truth, and stayed so until
    /// the next step (`null`: not before the next step).
    pub resync_ms: Vec<Option<u64>>,
    pub errors: Vec<String>,
}

/// How a stepped host's clock is judged back in sync (ns).
const RESYNC_WITHIN_NS: f64 = 100_000.0;
/// Hosts of the clock part, and which of them step.
const CLOCK_HOSTS: usize = 4;
const STEPPED: [usize; 2] = [1, 2];

/// The clock part: a netns cluster (3 supervisors, 4 hosts with agents and
/// the probe mesh; rail0 split into two leaves joined by an idle 1 Gbit/s
/// uplink, so the contention detector watches every path). Once the
/// clocks converged, one step every `gap`: h1's clock forward by `step`,
/// h2's back, h1's back, h2's forward. Nothing else changes: every NIC and
/// host finding in that time is false. Reports how long the leader's clock
/// solution takes to follow each step.
pub async fn clock_steps(step: Duration, gap: Duration) -> anyhow::Result<ClockStepReport> {
    use testbed::netcluster::{NetCluster, NetClusterOptions};
    anyhow::ensure!(
        (Duration::from_millis(1)..=Duration::from_secs(60)).contains(&step),
        "--clock-step-ms takes 1..=60000"
    );
    anyhow::ensure!(
        (Duration::from_secs(5)..=Duration::from_secs(120)).contains(&gap),
        "--clock-gap-s takes 5..=120"
    );
    let delta = step.as_nanos() as i64;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos() as i64;
    // Convergence takes a few seconds; the first step comes well after.
    let lead = Duration::from_secs(25);
    let first = now + lead.as_nanos() as i64;
    let g = gap.as_nanos() as i64;
    // (host, at, delta), one step every `gap`: h1 forward, h2 back, h1
    // back, h2 forward; the last window ends a gap after the last step.
    let plan: Vec<(usize, i64, i64)> = vec![
        (STEPPED[0], first, delta),
        (STEPPED[1], first + g, -delta),
        (STEPPED[0], first + 2 * g, -delta),
        (STEPPED[1], first + 3 * g, delta),
    ];
    let end = first + 4 * g;
    let args: Vec<Vec<String>> = (0..CLOCK_HOSTS)
        .map(|h| {
            plan.iter()
                .filter(|(x, _, _)| *x == h)
                .map(|(_, at, d)| format!("--test-clock-step={at}:{d}"))
                .collect()
        })
        .collect();
    eprintln!(
        "[disk-faults] clock steps of {} ms, one every {gap:?} from {lead:?} on: h1 +, h2 -, h1 -, h2 +",
        delta / 1_000_000
    );
    let c = NetCluster::start_opts(
        testbed::TestbedSpec {
            supervisors: 3,
            hosts: CLOCK_HOSTS,
        },
        NetClusterOptions {
            agent_args: args,
            leaf_splits: vec![testbed::LeafSplit {
                rail: 0,
                right: (CLOCK_HOSTS / 2..CLOCK_HOSTS).collect(),
                uplink_bps: 1_000_000_000,
            }],
        },
    )
    .await?;
    let mut errors = Vec::new();
    let all_up = CLOCK_HOSTS * 2;
    c.wait_until("every NIC up", Duration::from_secs(30), |c| {
        c.nics_up() == all_up
    })
    .await?;
    let since = c.last_event_seq()? + 1;
    let open_before: Vec<u64> = incident_ids(&c)?;
    // The truth of host h's clock minus the true time, at true time t.
    let truth = |h: usize, t: i64| -> f64 {
        plan.iter()
            .filter(|(x, at, _)| *x == h && *at <= t)
            .map(|(_, _, d)| *d as f64)
            .sum()
    };
    // Poll the solution every 250 ms until a gap after the last step.
    let mut samples: Vec<(i64, usize, f64)> = Vec::new(); // (at, host, error)
    let unix_now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as i64)
            .unwrap_or(0)
    };
    while unix_now() < end {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let Ok(v) = c.cli_json(&["clock"]) else {
            continue;
        };
        let Some(r) = v["reference"].as_str().and_then(host_index) else {
            continue;
        };
        let t = unix_now();
        for h in v["hosts"].as_array().into_iter().flatten() {
            let Some(i) = h["host"].as_str().and_then(host_index) else {
                continue;
            };
            if let Some(off) = h["live"]["offset_ns"].as_f64() {
                samples.push((t, i, off - (truth(i, t) - truth(r, t))));
            }
        }
    }
    // Per step: the first reading after it from which every host's error
    // stays within the bound until the next step (a step of the reference
    // host moves every other host's offset).
    let mut resync_ms = Vec::new();
    for (k, &(h, at, _)) in plan.iter().enumerate() {
        let next = plan.get(k + 1).map_or(end, |p| p.1);
        let mut readings: BTreeMap<i64, f64> = BTreeMap::new();
        for &(t, _, e) in samples.iter().filter(|(t, _, _)| *t > at && *t < next) {
            let worst = readings.entry(t).or_insert(0.0);
            *worst = worst.max(e.abs());
        }
        let readings: Vec<(i64, f64)> = readings.into_iter().collect();
        let settled = readings
            .iter()
            .position(|&(_, e)| e <= RESYNC_WITHIN_NS)
            .filter(|&i| readings[i..].iter().all(|&(_, e)| e <= RESYNC_WITHIN_NS));
        let trail: Vec<String> = readings
            .iter()
            .step_by(2)
            .map(|(t, e)| format!("{:.1}s:{:.0}us", (t - at) as f64 / 1e9, e / 1e3))
            .collect();
        eprintln!(
            "[disk-faults] step {k} (h{h}): worst error after it {}",
            trail.join(" ")
        );
        resync_ms.push(settled.map(|i| ((readings[i].0 - at) / 1_000_000) as u64));
    }
    let events = c.cli_json(&["events", "--since", &since.to_string(), "--limit", "5000"])?;
    let mut false_link_findings = Vec::new();
    let mut clock_unsynced = 0;
    for e in events["events"].as_array().into_iter().flatten() {
        let host = e["host"].as_str().unwrap_or_default();
        let ev = &e["event"];
        for k in ["NicLink", "NicState"] {
            let to = &ev[k]["to"];
            if to == "degraded" || to == "down" || to == "flapping" {
                false_link_findings.push(format!("{host}/{} → {to}", ev[k]["nic"]));
            }
        }
        if ev["Liveness"].is_object() {
            false_link_findings.push(format!("{host} → {}", ev["Liveness"]["to"]));
        }
        if ev["Clock"]["to"] == "unsynced" {
            clock_unsynced += 1;
        }
    }
    let all = c.cli_json(&["incidents"])?;
    let false_incidents = all["incidents"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| {
            i["id"]
                .as_u64()
                .is_some_and(|id| !open_before.contains(&id))
        })
        .filter(|i| i["kind"] != "clock_unsynced")
        .map(|i| format!("{} {}", i["kind"], i["host"]))
        .collect();
    if samples.is_empty() {
        errors.push("no clock solution was read".into());
    }
    Ok(ClockStepReport {
        step_ms: delta / 1_000_000,
        steps: plan.len(),
        false_link_findings,
        false_incidents,
        clock_unsynced,
        resync_ms,
        errors,
    })
}

fn host_index(name: &str) -> Option<usize> {
    name.strip_prefix('h')?.parse().ok()
}

/// Ids of every incident the cluster has.
fn incident_ids(c: &testbed::netcluster::NetCluster) -> anyhow::Result<Vec<u64>> {
    let v = c.cli_json(&["incidents"])?;
    Ok(v["incidents"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["id"].as_u64())
        .collect())
}

/// The scenario's report (the last line of output).
#[derive(Debug, Clone, Serialize)]
pub struct DiskFaultsReport {
    pub ok: bool,
    pub scenario: &'static str,
    pub lost_acked_ops: usize,
    pub linearizable: bool,
    pub disks: DiskReport,
    pub clock: Option<ClockStepReport>,
    pub wall_s: f64,
}

/// Runs the scenario.
pub async fn disk_faults(p: DiskFaultsRun) -> anyhow::Result<DiskFaultsReport> {
    let t0 = Instant::now();
    let d = disks(&p).await?;
    let clock = match p.clock_step {
        Some(step) => Some(clock_steps(step, p.clock_gap).await?),
        None => None,
    };
    let clock_ok = clock.as_ref().is_none_or(|c| {
        c.errors.is_empty()
            && c.false_link_findings.is_empty()
            && c.false_incidents.is_empty()
            && c.resync_ms.iter().all(Option::is_some)
    });
    let ok = d.errors.is_empty()
        && d.lost_acked_ops == 0
        && d.linearizable
        && d.panics == 0
        && d.unexpected_errors == 0
        && d.acked_ops > 0
        && clock_ok;
    Ok(DiskFaultsReport {
        ok,
        scenario: "disk-faults",
        lost_acked_ops: d.lost_acked_ops,
        linearizable: d.linearizable,
        disks: d,
        clock,
        wall_s: t0.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gap_inside_a_window_counts_its_edges() {
        let s = [100, 200, 900, 1000];
        assert_eq!(longest_gap_within(&s, 150, 950), 700);
        assert_eq!(longest_gap_within(&s, 0, 150), 100);
        assert_eq!(longest_gap_within(&s, 1000, 1500), 500);
        assert_eq!(longest_gap_within(&[], 10, 40), 30);
    }
}
