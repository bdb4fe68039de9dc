//! `bench detect`: how fast a link change becomes known.
//!
//! For every flap (fabric-side cable down, then up) on random NICs of a
//! netns cluster, from the injector's netlink request to
//! (a) the kernel's link message in the host's namespace, as a reader of
//!     the bench's own sees it (`testbed::link_reader`, on a bench thread): the
//!     kernel's part, taking a bridge port down and publishing the carrier
//!     change on the far end;
//! (b) the agent's tracker seeing it — the agent's observation timestamp,
//!     carried with the event (same machine, same wall clock), and
//! (c) the NIC state committed in Raft — when the leader applied the
//!     event (its clock: the apply time it serves with each event of an
//!     `events --follow` stream read from it), and, for comparison, when
//!     the event reached that stream (`streamed_*`: also the stream's
//!     wake-up, the CLI and the pipe).
//!
//! (b) and (c) are reported both from the request and from (a); the goals
//! are judged from (a), the moment the change exists for any reader.
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
    /// Injection (the netlink request handed over) → the kernel's link
    /// message read in the host's namespace by the bench's own reader: the
    /// kernel's part, no agent in it.
    pub kernel_p50_ms: f64,
    pub kernel_p99_ms: f64,
    /// That kernel message → the agent's tracker stamp (both read the same
    /// multicast message; negative when the agent read it first).
    pub agent_after_kernel_p50_ms: f64,
    pub agent_after_kernel_p99_ms: f64,
    /// That kernel message → the leader applied the event.
    pub committed_after_kernel_p50_ms: f64,
    pub committed_after_kernel_p99_ms: f64,
    /// Transitions the bench's reader did not see (not in the figures above).
    pub witness_missed: usize,
    /// Injection → the agent's tracker stamp (kernel and agent together).
    pub tracker_p50_ms: f64,
    pub tracker_p99_ms: f64,
    /// Injection → the leader applied the event.
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
    let kernel = KernelWitness::start(c, hosts)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut kernel_us = Vec::new();
    let mut after_kernel_tracker_us = Vec::new();
    let mut after_kernel_commit_us = Vec::new();
    let mut tracker_us = Vec::new();
    let mut commit_us = Vec::new();
    let mut stream_us = Vec::new();
    let mut unstamped = 0usize;
    let mut witness_missed = 0usize;
    eprintln!("[detect] {flaps} fabric-side flaps");
    for i in 0..flaps {
        let h = rng.gen_range(0..hosts);
        let r = rng.gen_range(0..2);
        for up in [false, true] {
            let (t_inj, _acked) = c.tb.set_fabric_link_timed(h, r, up).await?;
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
            let committed = applied.unwrap_or(arrived);
            // A flap the witness missed (its socket overran) has no
            // kernel-side figures; counted and reported.
            match kernel.wait(h, r, up, t_inj).await {
                Some(at) => {
                    kernel_us.push(at.saturating_sub(t_inj) / 1000);
                    after_kernel_tracker_us.push((observed as i64 - at as i64) / 1000);
                    after_kernel_commit_us.push((committed as i64 - at as i64) / 1000);
                }
                None => {
                    witness_missed += 1;
                    eprintln!("[detect] flap {i}: the kernel witness missed {host} {want}");
                }
            }
            tracker_us.push(observed.saturating_sub(t_inj) / 1000);
            stream_us.push(arrived.saturating_sub(t_inj) / 1000);
            // Every event the stream's supervisor applied since it
            // started has its time (an event without one counts at its
            // arrival); the run is valid only while that supervisor leads,
            // checked at the end.
            if applied.is_none() {
                unstamped += 1;
            }
            commit_us.push(committed.saturating_sub(t_inj) / 1000);
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
    after_kernel_tracker_us.sort_unstable();
    after_kernel_commit_us.sort_unstable();
    for v in [
        &mut kernel_us,
        &mut tracker_us,
        &mut commit_us,
        &mut stream_us,
        &mut down_us,
    ] {
        v.sort_unstable();
    }
    let r = DetectReport {
        kernel_p50_ms: percentile_ms(&kernel_us, 50.0),
        kernel_p99_ms: percentile_ms(&kernel_us, 99.0),
        witness_missed,
        agent_after_kernel_p50_ms: percentile_ms(&after_kernel_tracker_us, 50.0),
        agent_after_kernel_p99_ms: percentile_ms(&after_kernel_tracker_us, 99.0),
        ok: still_leads,
        committed_after_kernel_p50_ms: percentile_ms(&after_kernel_commit_us, 50.0),
        committed_after_kernel_p99_ms: percentile_ms(&after_kernel_commit_us, 99.0),
        bench: "detect",
        tracker_p50_ms: percentile_ms(&tracker_us, 50.0),
        tracker_p99_ms: percentile_ms(&tracker_us, 99.0),
        flaps,
        committed_p50_ms: percentile_ms(&commit_us, 50.0),
        committed_p99_ms: percentile_ms(&commit_us, 99.0),
        transitions: tracker_us.len(),
        streamed_p50_ms: percentile_ms(&stream_us, 50.0),
        streamed_p99_ms: percentile_ms(&stream_us, 99.0),
        host_losses,
        false_probes_lost: probes_lost.load(std::sync::atomic::Ordering::Relaxed),
        down_p50_ms: percentile_ms(&down_us, 50.0),
        down_p99_ms: percentile_ms(&down_us, 99.0),
        down_max_ms: percentile_ms(&down_us, 100.0),
        goals: "from the kernel's link message: agent p99 <= 0.5 ms, committed p99 <= 5 ms; Down p99 <= 1.5 s; no false probes_lost",
        goals_met: false,
    };
    let goals_met = r.agent_after_kernel_p99_ms <= 0.5
        && r.committed_after_kernel_p99_ms <= 5.0
        && r.witness_missed * 100 <= r.transitions
        && r.down_p99_ms <= 1500.0
        && r.false_probes_lost == 0;
    Ok(DetectReport { goals_met, ..r })
}

/// A reader of link messages in each host's namespace, on a thread of the
/// bench ([`testbed::link_reader`]): when the kernel published each change,
/// as the fastest reader sees it.
struct KernelWitness {
    seen: Arc<Mutex<Vec<Witnessed>>>,
    /// The readers' tasks: aborted with the witness, which drops their
    /// channels and so ends their threads.
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for KernelWitness {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// A link message the witness read: host, NIC, up, when (Unix ns).
struct Witnessed {
    host: usize,
    nic: String,
    up: bool,
    at: u64,
}

impl KernelWitness {
    fn start(c: &NetCluster, hosts: usize) -> anyhow::Result<Self> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for h in 0..hosts {
            let mut rx =
                c.tb.ns(Node::Host(h))
                    .run(|| testbed::link_reader::start(4096))??;
            let sink = seen.clone();
            tasks.push(tokio::spawn(async move {
                while let Some(w) = rx.recv().await {
                    if let testbed::link_reader::Watched::Link(m, at) = w {
                        if let Some(s) = nodeagent::link::LinkSample::from_message(&m) {
                            let unix = unix_ns().saturating_sub(at.elapsed().as_nanos() as u64);
                            let mut q = sink.lock().expect("witness");
                            q.push(Witnessed {
                                host: h,
                                nic: s.name.clone(),
                                up: s.is_up(),
                                at: unix,
                            });
                            if q.len() > 100_000 {
                                q.drain(..50_000);
                            }
                        }
                    }
                }
            }));
        }
        Ok(Self { seen, tasks })
    }

    /// When the kernel published `h`'s `rail<r>` going `up` (or down), at
    /// or after `since`: waits up to a second.
    async fn wait(&self, h: usize, r: usize, up: bool, since: u64) -> Option<u64> {
        let nic = format!("rail{r}");
        for _ in 0..1000 {
            {
                let mut q = self.seen.lock().expect("witness");
                if let Some(i) = q
                    .iter()
                    .position(|w| w.host == h && w.nic == nic && w.up == up && w.at >= since)
                {
                    let at = q[i].at;
                    q.drain(..=i);
                    return Some(at);
                }
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        None
    }
}
