//! `bench tcp-failover`: an unmodified TCP program (Debian's iperf3) keeps
//! its one connection across pulled cables, because railguard's detour
//! routes keep the pulled NIC's address reachable through the backup rail
//! (`supervisor::model::reroute`, `nodeagent::reroute`).
//!
//! A two-host netns cluster (supervisors and agents, mutual TLS): an
//! iperf3 server on h1's rail0 address, an iperf3 client on h0 bound to
//! h0's rail0 address, sending at a fixed rate. After a fault-free
//! baseline, h1's rail0 cable is pulled (fabric side: h1 sees carrier
//! loss) for `down`, put back, and the run waits until the NIC is up
//! again and its detours are gone (the failback), `pulls` times. Inside
//! h1's namespace a packet socket records when the stream's data arrived,
//! by the kernel's receive timestamps ([`crate::capture`]: the figures do
//! not depend on when the bench process is scheduled); a **gap** is the
//! longest time without a data packet from the pull until 300 ms after
//! h0's detours are gone: it covers the failover and the failback. The
//! bench watches the detours with netlink from its own thread, never a
//! process, inside the window. Figures: each pull's gap, their p50/p99/max
//! (goal: p99 ≤ 50 ms over ≥ 20 pulls), the throughput over the pulls
//! against the baseline, and whether iperf3 finished without an error
//! (one connection throughout: iperf3 never reconnects).
//!
//! A second capture in h0's namespace tells how much of each longest gap
//! iperf3 itself was idle: everything it had sent acknowledged, nothing new
//! sent ([`crate::capture::SenderIdle`]). Now and then iperf3 writes
//! nothing for tens of ms (seen asleep in `poll`, in the fault-free
//! baseline too); such a gap is the sender's, not the failover's. The goal
//! is judged on the whole gap; `network_gap_*` subtract the sender's idle
//! part.
//!
//! iperf3 runs with the congestion control named by `congestion` (default
//! cubic, Linux's own default) whatever the machine's default is: with BBR
//! (which some cloud images set) and no `fq` qdisc, TCP paces itself, and
//! after a moment of application-limited sending BBR's pacing rate can
//! drop to a few MB/s for one round trip; the next 64 KiB then leaves only
//! tens of ms later (the development machine showed 20–60 ms sender stalls
//! with the detour in place, nothing in flight and an open window). Those
//! stalls are the congestion control's, not the path's; the figure is the
//! failover's. `--congestion bbr` measures them.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use testbed::netcluster::NetCluster;

use crate::capture::Capturer;

use crate::bench::percentile_ms;
use testbed::{rail_addr, Node, Side, TestbedSpec};

/// The bench's settings.
#[derive(Debug, Clone)]
pub struct TcpFailoverRun {
    pub pulls: usize,
    /// How long each cable stays out.
    pub down: Duration,
    /// iperf3's sending rate (Mbit/s).
    pub mbit: u32,
    pub supervisors: usize,
    /// The fault-free stretch before the first pull.
    pub baseline: Duration,
    /// Keep the run directory (every process's log) and say where.
    pub keep_logs: bool,
    /// iperf3's TCP congestion control (one the kernel offers).
    pub congestion: String,
}

/// Whether the kernel offers `name` as a TCP congestion control (an error
/// names what it offers).
fn check_congestion(name: &str) -> anyhow::Result<()> {
    const AVAILABLE: &str = "/proc/sys/net/ipv4/tcp_available_congestion_control";
    let offered =
        std::fs::read_to_string(AVAILABLE).with_context(|| format!("read {AVAILABLE}"))?;
    anyhow::ensure!(
        offered.split_whitespace().any(|c| c == name),
        "congestion control {name:?} is not available here; the kernel offers: {}",
        offered.trim()
    );
    Ok(())
}

/// The bench's report.
#[derive(Debug, Clone, Serialize)]
pub struct TcpFailoverReport {
    pub ok: bool,
    pub bench: &'static str,
    pub pulls: usize,
    pub down_ms: u64,
    /// Longest time without progress around each pull (failover and
    /// failback), in pull order.
    pub gaps_ms: Vec<f64>,
    /// The same, split: from the pull until the cable is back (failover),
    /// and from then until 300 ms after the detours are gone (failback).
    pub failover_gaps_ms: Vec<f64>,
    pub failback_gaps_ms: Vec<f64>,
    /// Per pull, after the cable was put back: when the failback's longest
    /// gap began, and when h0's detour was seen gone (polled every 50 ms).
    pub failback_gap_began_ms: Vec<f64>,
    pub detour_gone_ms: Vec<f64>,
    /// Per pull, when its longest gap began (Unix ms): to find it in the
    /// logs of a run kept with `--keep-logs`.
    pub gap_began_unix_ms: Vec<u64>,
    /// Per pull, what ended its longest gap: "<interface>" or
    /// "<interface> retransmit" (a segment sent again), or "-" when the
    /// window ended silent.
    pub gap_ended_by: Vec<String>,
    pub gap_p50_ms: f64,
    pub gap_p99_ms: f64,
    pub gap_max_ms: f64,
    /// Per pull, how much of its longest gap iperf3 was idle (all it had
    /// sent acknowledged, nothing new sent): the sender's pause, not the
    /// path's.
    pub gap_sender_idle_ms: Vec<f64>,
    /// Per pull, the longest silence less its sender-idle part (idle time
    /// inside an outage hides that much of it: a lower bound); p99 and max.
    pub network_gap_p99_ms: f64,
    pub network_gap_max_ms: f64,
    /// The longest gap in the fault-free baseline (the machine's own
    /// noise: what no failover caused).
    pub baseline_ms: u64,
    pub baseline_gap_max_ms: f64,
    /// Received rate over the fault-free baseline and over the pulls.
    pub baseline_mbit_s: f64,
    pub pulls_mbit_s: f64,
    pub throughput_ratio: f64,
    /// iperf3 ended without an error: one connection throughout.
    pub iperf3_ok: bool,
    pub iperf3_error: Option<String>,
    pub goal: &'static str,
    pub goal_met: bool,
    /// iperf3's congestion control.
    pub congestion_control: String,
}

const IPERF_PORT: u16 = 5201;

/// Figures in ms as whole µs, sorted (for [`percentile_ms`]).
fn sorted_us(ms: &[f64]) -> Vec<u64> {
    let mut us: Vec<u64> = ms.iter().map(|g| (g * 1000.0) as u64).collect();
    us.sort_unstable();
    us
}

/// Runs the bench.
pub async fn run(r: TcpFailoverRun) -> anyhow::Result<TcpFailoverReport> {
    anyhow::ensure!(r.pulls >= 1, "at least one pull");
    check_congestion(&r.congestion)?;
    let mut c = NetCluster::start_all_up(
        TestbedSpec {
            supervisors: r.supervisors,
            hosts: 2,
        },
        Duration::from_secs(90),
    )
    .await?;
    if r.keep_logs {
        c.keep_run_dir();
    }
    // Instants to the kernel's timestamps (ns since the Unix epoch).
    let epoch = (Instant::now(), std::time::SystemTime::now());
    let unix_ns = |t: Instant| {
        let wall = match t.checked_duration_since(epoch.0) {
            Some(d) => epoch.1 + d,
            None => epoch.1 - epoch.0.duration_since(t),
        };
        wall.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    };
    let server: Ipv4Addr = rail_addr(1, 0);
    let client: Ipv4Addr = rail_addr(0, 0);
    let mut srv =
        c.tb.ns(Node::Host(1))
            .command("iperf3")?
            .args(["-s", "-1", "-B"])
            .arg(server.to_string())
            .args(["-p", &IPERF_PORT.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("start iperf3 -s (is iperf3 installed?)")?;
    testbed::register_pid(srv.id());
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Long enough for every pull and its failback (a NIC pulled again and
    // again is damped: up to 60 s suppressed, then its hold time); ended
    // early otherwise.
    let per_pull_max = r.down + Duration::from_secs(90);
    let secs = (r.baseline + per_pull_max * r.pulls as u32).as_secs() + 5;
    let cli =
        c.tb.ns(Node::Host(0))
            .command("iperf3")?
            .args(["-c"])
            .arg(server.to_string())
            .args(["-B"])
            .arg(client.to_string())
            .args(["-p", &IPERF_PORT.to_string()])
            .args(["-t", &secs.to_string()])
            .args(["-b", &format!("{}M", r.mbit), "-J"])
            .args(["-C", &r.congestion])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("start iperf3 -c")?;
    testbed::register_pid(cli.id());
    let cli_pid = cli.id();
    let output = tokio::task::spawn_blocking(move || cli.wait_with_output());

    let capture = Capturer::start(c.tb.ns(Node::Host(1)), IPERF_PORT)?;
    let sender = Capturer::start_sender(c.tb.ns(Node::Host(0)), IPERF_PORT)?;
    let routes_h0 = nodeagent::reroute::Rerouter::new(c.tb.ns(Node::Host(0)).netlink()?);
    let base_from = Instant::now() + Duration::from_millis(500);
    tokio::time::sleep(r.baseline + Duration::from_millis(500)).await;
    let base_to = Instant::now();
    if output.is_finished() {
        let out = output.await??;
        anyhow::bail!(
            "iperf3 -c ended before the first pull: {}",
            iperf3_error(&out.stdout).unwrap_or_else(|| "no error reported".into())
        );
    }
    let mut windows = Vec::new();
    let mut restores = Vec::new();
    let mut gone = Vec::new();
    for i in 0..r.pulls {
        let from = Instant::now();
        c.tb.set_cable(1, 0, Side::Fabric, false).await?;
        tokio::time::sleep(r.down).await;
        c.tb.set_cable(1, 0, Side::Fabric, true).await?;
        restores.push(Instant::now());
        // The failback: h0's detour to the NIC is gone (the leader drops
        // it once the NIC is up again, its hold time passed, not damped),
        // then the NIC shows up. Watched with a netlink route dump in h0's
        // namespace every 50 ms, not a process: a CLI call (TLS handshake,
        // a leader round trip) or an `ip route` (a fork of this large
        // process, then an exec) every 50 ms through a damped NIC's ~22 s
        // is load of the bench's own beside what it measures.
        wait_no_detours(&routes_h0, per_pull_max).await?;
        gone.push(Instant::now());
        tokio::time::sleep(Duration::from_millis(300)).await;
        windows.push((from, Instant::now()));
        // Checked with the CLI after the window, so its process is no load
        // inside it.
        c.wait_until(
            &format!("pull {i}: rail0 of h1 up again"),
            Duration::from_secs(10),
            |c| c.nic_state("h1", "rail0").is_ok_and(|s| s == "up"),
        )
        .await?;
    }
    // End iperf3 now (SIGINT: it reports what it measured).
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(cli_pid as i32, libc::SIGINT) };
    let out = output.await??;
    testbed::unregister_pid(cli_pid);
    let _ = srv.wait();
    testbed::unregister_pid(srv.id());
    let cap = capture.finish()?;
    let idle = sender.finish()?;
    let gap = |a: Instant, b: Instant| cap.longest_gap(unix_ns(a), unix_ns(b));
    let longest: Vec<(Duration, u64)> = windows.iter().map(|(a, b)| gap(*a, *b)).collect();
    let names = interface_names(&c)?;
    let gap_ended_by: Vec<String> = windows
        .iter()
        .map(
            |(a, b)| match cap.longest_gap_edge(unix_ns(*a), unix_ns(*b)).2 {
                None => "-".to_string(),
                Some(e) => {
                    let n = names
                        .get(&e.ifindex_after)
                        .cloned()
                        .unwrap_or_else(|| e.ifindex_after.to_string());
                    if e.retransmit_after {
                        format!("{n} retransmit")
                    } else {
                        n
                    }
                }
            },
        )
        .collect();
    let gaps: Vec<f64> = longest
        .iter()
        .map(|(g, _)| g.as_secs_f64() * 1000.0)
        .collect();
    let gap_began_unix_ms: Vec<u64> = longest.iter().map(|(_, at)| at / 1_000_000).collect();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let failover_gaps: Vec<f64> = windows
        .iter()
        .zip(&restores)
        .map(|((a, _), back)| ms(gap(*a, *back).0))
        .collect();
    let failback: Vec<(Duration, u64)> = windows
        .iter()
        .zip(&restores)
        .map(|((_, b), back)| gap(*back, *b))
        .collect();
    let failback_gaps: Vec<f64> = failback.iter().map(|(g, _)| ms(*g)).collect();
    // When, after the cable was put back, the failback's longest gap began
    // and h0's detour was seen gone (polled): a gap that begins at the
    // detour's removal is the failback's own, one that begins at once is
    // the returning link's.
    let failback_gap_began_ms: Vec<f64> = failback
        .iter()
        .zip(&restores)
        .map(|((_, at), back)| at.saturating_sub(unix_ns(*back)) as f64 / 1e6)
        .collect();
    let detour_gone_ms: Vec<f64> = gone
        .iter()
        .zip(&restores)
        .map(|(g, back)| ms(g.saturating_duration_since(*back)))
        .collect();
    let gap_sender_idle_ms: Vec<f64> = longest
        .iter()
        .map(|(g, at)| ms(idle.idle_within(*at, at + g.as_nanos() as u64)))
        .collect();
    // Per window, the longest silence less its sender-idle part (another
    // silence than the longest may be the longest of the network's).
    let network: Vec<f64> = windows
        .iter()
        .map(|(a, b)| {
            cap.silences(unix_ns(*a), unix_ns(*b))
                .into_iter()
                .map(|(s, e, _)| {
                    ms(Duration::from_nanos(e - s).saturating_sub(idle.idle_within(s, e)))
                })
                .fold(0.0, f64::max)
        })
        .collect();
    let network_us = sorted_us(&network);
    let sorted_us = sorted_us(&gaps);
    let rate = |(bytes, d): (u64, Duration)| {
        if d.is_zero() {
            0.0
        } else {
            bytes as f64 * 8.0 / d.as_secs_f64() / 1e6
        }
    };
    let between = |a: Instant, b: Instant| cap.bytes_between(unix_ns(a), unix_ns(b));
    let baseline = rate(between(base_from, base_to));
    let during = rate(between(
        windows.first().map_or(base_to, |w| w.0),
        windows.last().map_or(base_to, |w| w.1),
    ));
    let iperf3_error = iperf3_error(&out.stdout);
    let iperf3_ok = iperf3_error.is_none();
    let p99 = percentile_ms(&sorted_us, 99.0);
    Ok(TcpFailoverReport {
        ok: iperf3_ok && gaps.len() == r.pulls,
        bench: "tcp-failover",
        pulls: r.pulls,
        down_ms: r.down.as_millis() as u64,
        gap_p50_ms: percentile_ms(&sorted_us, 50.0),
        gap_p99_ms: p99,
        gap_max_ms: gaps.iter().copied().fold(0.0, f64::max),
        network_gap_p99_ms: percentile_ms(&network_us, 99.0),
        network_gap_max_ms: network.iter().copied().fold(0.0, f64::max),
        gap_sender_idle_ms,
        baseline_ms: r.baseline.as_millis() as u64,
        baseline_gap_max_ms: ms(gap(base_from, base_to).0),
        gaps_ms: gaps,
        failover_gaps_ms: failover_gaps,
        failback_gaps_ms: failback_gaps,
        failback_gap_began_ms,
        detour_gone_ms,
        gap_began_unix_ms,
        gap_ended_by,
        baseline_mbit_s: baseline,
        pulls_mbit_s: during,
        throughput_ratio: if baseline > 0.0 {
            during / baseline
        } else {
            0.0
        },
        iperf3_ok,
        iperf3_error,
        goal: "longest zero-throughput gap p99 <= 50 ms over >= 20 pulls, one connection",
        goal_met: iperf3_ok && r.pulls >= 20 && p99 <= 50.0,
        congestion_control: r.congestion,
    })
}

/// The error in iperf3's JSON report, if any. The SIGINT that ends the
/// run is reported as an "error"; any other (a broken connection, a
/// refused one) is a failure.
fn iperf3_error(stdout: &[u8]) -> Option<String> {
    let json: serde_json::Value = serde_json::from_slice(stdout).unwrap_or(serde_json::Value::Null);
    match json["error"].as_str() {
        Some(e) if e.starts_with("interrupt") => None,
        Some(e) => Some(e.to_string()),
        None if json.is_null() => Some("iperf3 printed no JSON report".to_string()),
        None => None,
    }
}

/// h1's interface names by index.
fn interface_names(c: &NetCluster) -> anyhow::Result<std::collections::HashMap<i32, String>> {
    let out =
        c.tb.ns(Node::Host(1))
            .command("ip")?
            .args(["-o", "link"])
            .output()?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            let i = f.next()?.trim().parse().ok()?;
            let name = f.next()?.trim().split('@').next()?.to_string();
            Some((i, name))
        })
        .collect())
}

/// Waits (up to `within`, polling every 50 ms) until the namespace of
/// `routes` has no detour route of railguard's.
async fn wait_no_detours(
    routes: &nodeagent::reroute::Rerouter,
    within: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        if routes
            .current()
            .await
            .context("read the routes")?
            .is_empty()
        {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "detour routes still present after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
