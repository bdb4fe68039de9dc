//! `bench detect`: how fast a link change becomes known.
//!
//! For every flap (fabric-side cable down, then up) on random NICs of a
//! netns cluster, from the injector's netlink call to
//! (a) the agent's tracker seeing it — the agent's observation timestamp,
//!     carried with the event (same machine, same wall clock), and
//! (b) the NIC state committed in Raft — when the leader applied the
//!     event (its clock: the apply time it serves with each event of an
//!     `events --follow` stream read from it), and, for comparison, when
//!     the event reached that stream (`streamed_*`: also the stream's
//!     wake-up, the CLI and the pipe).
//!
//! And over host losses (agent killed, every cable down): time to Down.

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rand::{Rng, SeedableRng};
use serde::Serialize;
use supervisor::api::FollowedEvent;
use supervisor::model::{ClusterEvent, Event, Liveness};
use tokio::io::AsyncBufReadExt;

use crate::bench::percentile_ms;
use testbed::cluster::bin_path;
use testbed::netcluster::NetCluster;
use testbed::{Node, Side, TestbedSpec};

#[derive(Debug, Serialize)]
pub struct DetectReport {
    pub ok: bool,
    pub bench: &'static str,
    pub flaps: usize,
    pub transitions: usize,
    pub tracker_p50_ms: f64,
    pub tracker_p99_ms: f64,
    pub committed_p50_ms: f64,
    pub committed_p99_ms: f64,
    /// Injection → the event read from the leader's follow stream.
    pub streamed_p50_ms: f64,
    pub streamed_p99_ms: f64,
    pub host_losses: usize,
    /// NICs the cluster took Down on probe evidence (`probes_lost`) while
    /// netlink had them up: every one is false here (the bench only pulls
    /// cables, which netlink sees).
    pub false_probes_lost: u64,
    pub down_p50_ms: f64,
    pub down_p99_ms: f64,
    pub down_max_ms: f64,
    pub goals: &'static str,
    pub goals_met: bool,
}

/// Events read from the stream: each with when it arrived and when the
/// serving supervisor applied it (Unix ns).
type Seen = Arc<Mutex<VecDeque<(ClusterEvent, u64, Option<u64>)>>>;

fn unix_ns() -> u64 {
    nodeagent::link::unix_ns()
}

/// Waits (bounded) for an event matching `f`, consuming events before it.
async fn wait_event(
    seen: &Seen,
    within: Duration,
    f: impl Fn(&ClusterEvent) -> bool,
) -> anyhow::Result<(ClusterEvent, u64, Option<u64>)> {
    let t0 = Instant::now();
    loop {
        {
            let mut q = seen.lock().expect("seen");
            while let Some((e, at, applied)) = q.pop_front() {
                if f(&e) {
                    return Ok((e, at, applied));
                }
            }
        }
        if t0.elapsed() > within {
            bail!("expected event did not arrive within {within:?}");
        }
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
}

pub async fn run(flaps: usize, host_losses: usize, seed: u64) -> anyhow::Result<DetectReport> {
    let hosts = 4;
    eprintln!("[detect] building testbed: 3 supervisors, {hosts} hosts");
    let spec = TestbedSpec {
        supervisors: 3,
        hosts,
    };
    let mut c = NetCluster::start_all_up(spec, Duration::from_secs(20)).await?;
    let r = measure(&mut c, hosts, flaps, host_losses, seed).await;
    if r.as_ref().map_or(true, |r| r.false_probes_lost > 0) {
        // Keep the agents' and supervisors' logs of a failed run, or of
        // one with a false verdict to explain.
        c.keep_run_dir();
    }
    r
}

async fn measure(
    c: &mut NetCluster,
    hosts: usize,
    flaps: usize,
    host_losses: usize,
    seed: u64,
) -> anyhow::Result<DetectReport> {
    // Follow committed events from now on, as the leader serves them (with
    // its apply times).
    let since = c.last_event_seq()?;
    let leader = c.leader_index()?;
    let leader_addr = c.sup_addrs()[leader].clone();
    let mut cmd = c.tb.command(
        Node::Supervisor(0),
        bin_path("railguard")?.to_str().unwrap_or_default(),
    )?;
    cmd.args([
        "--supervisor",
        &leader_addr,
        "-o",
        "json",
        "events",
        "--follow",
        "--since",
        &since.to_string(),
    ]);
    cmd.envs(c.admin_files()?.cli_env());
    cmd.stdout(Stdio::piped()).stderr(Stdio::null());
    let mut child = tokio::process::Command::from(cmd)
        .kill_on_drop(true)
        .spawn()
        .context("railguard events --follow")?;
    let stdout = child.stdout.take().context("stdout")?;
    let seen: Seen = Arc::new(Mutex::new(VecDeque::new()));
    let sink = seen.clone();
    let probes_lost = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let lost = probes_lost.clone();
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        while let Ok(Some(l)) = lines.next_line().await {
            let at = unix_ns();
            if let Ok(f) = serde_json::from_str::<FollowedEvent>(&l) {
                let (e, applied) = (f.record, f.applied_unix_ns);
                if matches!(
                    e.event,
                    Event::NicLink {
                        probes_lost: true,
                        ..
                    }
                ) {
                    eprintln!("[detect] FALSE probes_lost: {l}");
                    lost.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                let mut q = sink.lock().expect("seen");
                q.push_back((e, at, applied));
                while q.len() > 100_000 {
                    q.pop_front();
                }
            }
        }
    });
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut tracker_us = Vec::new();
    let mut commit_us = Vec::new();
    let mut stream_us = Vec::new();
    let mut unstamped = 0usize;
    eprintln!("[detect] {flaps} fabric-side flaps");
    for i in 0..flaps {
        let h = rng.gen_range(0..hosts);
        let r = rng.gen_range(0..2);
        for up in [false, true] {
            let t_inj = unix_ns();
            c.tb.set_cable(h, r, Side::Fabric, up).await?;
            let want = format!("NIC rail{r}: link {}", if up { "up" } else { "down" });
            let nic_name = format!("rail{r}");
            let host = format!("h{h}");
            let (e, arrived, applied) = wait_event(&seen, Duration::from_secs(10), |e| {
                e.host.as_deref() == Some(host.as_str())
                    && matches!(&e.event, Event::NicLink { nic, up: u, .. } if *nic == nic_name && *u == up)
            })
            .await
            .with_context(|| format!("flap {i}: {host} {want}"))?;
            let observed = e.observed_unix_ns.unwrap_or(arrived);
            tracker_us.push(observed.saturating_sub(t_inj) / 1000);
            stream_us.push(arrived.saturating_sub(t_inj) / 1000);
            // Every event the stream's supervisor applied since it
            // started has its time (an event without one counts at its
            // arrival); the run is valid only while that supervisor leads,
            // checked at the end.
            if applied.is_none() {
                unstamped += 1;
            }
            commit_us.push(applied.unwrap_or(arrived).saturating_sub(t_inj) / 1000);
            tokio::time::sleep(Duration::from_millis(rng.gen_range(20..60))).await;
        }
    }
    eprintln!("[detect] {host_losses} host losses");
    let mut down_us = Vec::new();
    for i in 0..host_losses {
        let h = i % hosts;
        let host = format!("h{h}");
        let t0 = unix_ns();
        c.tb.lose_host(h).await?;
        let (_, arrived, _) = wait_event(&seen, Duration::from_secs(15), |e| {
            e.host.as_deref() == Some(host.as_str())
                && matches!(
                    e.event,
                    Event::Liveness {
                        to: Liveness::Down,
                        ..
                    }
                )
        })
        .await
        .with_context(|| format!("host loss {i}: {host} never went Down"))?;
        let took = arrived.saturating_sub(t0) / 1000;
        eprintln!(
            "[detect] loss {i}: {host} Down after {:.0} ms",
            took as f64 / 1e3
        );
        down_us.push(took);
        c.tb.set_mgmt(Node::Host(h), true).await?;
        for r in 0..2 {
            c.tb.set_cable(h, r, Side::Fabric, true).await?;
        }
        c.start_agent(h)?;
        wait_event(&seen, Duration::from_secs(15), |e| {
            e.host.as_deref() == Some(host.as_str())
                && matches!(
                    e.event,
                    Event::Liveness {
                        to: Liveness::Ready,
                        ..
                    }
                )
        })
        .await?;
    }
    // The apply times are the leader's only if it led throughout.
    let still_leads = c.leader_index().ok() == Some(leader);
    if !still_leads {
        eprintln!("[detect] the leader changed during the run: its apply times are a follower's from then on");
    }
    let _ = child.kill().await;
    if unstamped > 0 {
        eprintln!("[detect] {unstamped} events had no apply time from the stream's supervisor (counted at their arrival)");
    }
    for v in [
        &mut tracker_us,
        &mut commit_us,
        &mut stream_us,
        &mut down_us,
    ] {
        v.sort_unstable();
    }
    let r = DetectReport {
        ok: still_leads,
        bench: "detect",
        flaps,
        transitions: tracker_us.len(),
        tracker_p50_ms: percentile_ms(&tracker_us, 50.0),
        tracker_p99_ms: percentile_ms(&tracker_us, 99.0),
        committed_p50_ms: percentile_ms(&commit_us, 50.0),
        committed_p99_ms: percentile_ms(&commit_us, 99.0),
        streamed_p50_ms: percentile_ms(&stream_us, 50.0),
        streamed_p99_ms: percentile_ms(&stream_us, 99.0),
        host_losses,
        false_probes_lost: probes_lost.load(std::sync::atomic::Ordering::Relaxed),
        down_p50_ms: percentile_ms(&down_us, 50.0),
        down_p99_ms: percentile_ms(&down_us, 99.0),
        down_max_ms: percentile_ms(&down_us, 100.0),
        goals:
            "tracker p99 <= 0.5 ms, committed p99 <= 5 ms, Down p99 <= 1.5 s, no false probes_lost",
        goals_met: false,
    };
    let goals_met = r.tracker_p99_ms <= 0.5
        && r.committed_p99_ms <= 5.0
        && r.down_p99_ms <= 1500.0
        && r.false_probes_lost == 0;
    Ok(DetectReport { goals_met, ..r })
}
