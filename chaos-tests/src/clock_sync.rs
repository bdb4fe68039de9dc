//! `bench clock-sync`: software clock synchronisation against the truth.
//!
//! Every host's agent gets a random test clock error (offset within ±1 s,
//! drift within ±200 ppm, one common anchor), so the true offset of any
//! host against any other at any instant is known exactly (all namespaces
//! share one kernel clock). After the leader's solution converges, the
//! bench reads `railguard clock --output json` once a second for the
//! measurement window and compares, from the same probes:
//!
//! * **railguard**: each host's offset from the network solution (Huygens
//!   pair fits + loop correction) against the truth, relative to the
//!   solution's reference host, at the solution's instant;
//! * **NTP-style**: the min-RTT estimate of each probe edge (symmetric-path
//!   assumption), composed hop by hop from the reference along a BFS tree
//!   as an NTP stratum hierarchy would, each hop judged at its own instant
//!   (which spares it any drift error: generous to NTP);
//! * per-edge errors of both estimators, one hop each, like for like.
//!
//! It also reports convergence time (agents started → every host solved
//! with an error bound ≤ 1 µs), CPU of each agent's probe thread and of
//! the whole agent (% of one core, from /proc over the window), and probe
//! bytes/s per agent (the rails' kernel tx counters over the window).

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::Value;

use testbed::bulk::BulkFlow;
use testbed::burst::{BurstLoad, BurstSpec};
use testbed::netcluster::{NetCluster, NetClusterOptions, RESHAPING_PLAYBOOK};
use testbed::{LeafSplit, TestbedSpec};

/// One run's parameters.
#[derive(Debug, Clone)]
pub struct ClockSyncRun {
    pub hosts: usize,
    pub supervisors: usize,
    /// Measurement window (s).
    pub seconds: u64,
    pub seed: u64,
    /// Longest wait for convergence.
    pub converge_timeout: Duration,
    /// Mbit/s of the shaped uplink a bulk flow crosses (0: no load).
    pub uplink_load_mbit: u64,
    /// Mbit/s of the shaped uplinks of both rails that bursty UDP cross
    /// traffic crosses both ways (0: none).
    pub cross_load_mbit: u64,
    /// Offered cross traffic per direction, fraction of the uplink rate.
    pub cross_load_util: f64,
    /// The agents' probe CPU budget (% of one core; 0: no governor; None:
    /// the agent's default).
    pub probe_cpu_budget_pct: Option<f64>,
    /// The agents' probe rate, pairs/s per peer (None: the agent's
    /// default).
    pub probe_rate: Option<u32>,
    /// Pin every agent (all its threads) to this CPU, so the simulated
    /// fabric — which veth runs in the sender's context — runs on one CPU
    /// for every path (None: the scheduler's choice).
    pub pin_agents_cpu: Option<usize>,
}

impl ClockSyncRun {
    /// An idle fabric, one supervisor, the agents' own probe settings, a
    /// minute to converge; set the rest with struct update syntax.
    pub fn idle(hosts: usize, seconds: u64, seed: u64) -> Self {
        Self {
            hosts,
            supervisors: 1,
            seconds,
            seed,
            converge_timeout: Duration::from_secs(60),
            uplink_load_mbit: 0,
            cross_load_mbit: 0,
            cross_load_util: 0.85,
            probe_cpu_budget_pct: None,
            probe_rate: None,
            pin_agents_cpu: None,
        }
    }
}

/// The probe rates the agents ran at over the window (pairs/s per peer,
/// one reading per host per second).
#[derive(Debug, Clone, Serialize, Default)]
pub struct RateStats {
    /// The configured (most) rate.
    pub configured: u64,
    pub p50: f64,
    pub min: f64,
    pub max: f64,
    /// The agents' CPU budget (% of one core; 0: no governor).
    pub cpu_budget_pct: f64,
}

/// Mean datagrams per burst of the cross traffic.
const CROSS_MEAN_BURST: f64 = 8.0;
/// UDP port of the cross traffic.
const CROSS_PORT: u16 = 5301;

/// One cross-traffic flow of a run.
#[derive(Debug, Clone, Serialize)]
pub struct CrossFlow {
    pub from: usize,
    pub to: usize,
    pub rail: usize,
    pub offered_mbps: f64,
    pub delivered_mbps: f64,
}

/// The cross traffic of a run.
#[derive(Debug, Clone, Serialize)]
pub struct CrossLoad {
    pub uplink_mbit: u64,
    pub util: f64,
    pub mean_burst: f64,
    pub flows: Vec<CrossFlow>,
}

/// The cross-traffic flows for `hosts` hosts (leaf 1 the upper half): per
/// rail a distinct pair across the leaves, both ways.
fn cross_pairs(hosts: usize) -> Vec<(usize, usize, usize)> {
    let half = hosts / 2;
    let mut out = Vec::new();
    for rail in 0..2 {
        let (a, b) = (rail % half, half + rail % (hosts - half));
        out.push((a, b, rail));
        out.push((b, a, rail));
    }
    out
}

/// The rail the load splits and queues.
const LOAD_RAIL: usize = 0;
/// TCP port of the bulk flow.
const LOAD_PORT: u16 = 5201;

/// Percentiles of absolute errors (ns).
#[derive(Debug, Clone, Serialize, Default)]
pub struct ErrorStats {
    pub samples: usize,
    pub p50_ns: f64,
    pub p99_ns: f64,
    pub max_ns: f64,
}

impl ErrorStats {
    fn of(mut v: Vec<f64>) -> Self {
        v.retain(|x| x.is_finite());
        v.iter_mut().for_each(|x| *x = x.abs());
        v.sort_by(f64::total_cmp);
        let q = |p: f64| {
            if v.is_empty() {
                f64::NAN
            } else {
                v[(((v.len() - 1) as f64) * p).round() as usize]
            }
        };
        Self {
            samples: v.len(),
            p50_ns: q(0.5),
            p99_ns: q(0.99),
            max_ns: v.last().copied().unwrap_or(f64::NAN),
        }
    }
}

/// Readings per block of [`ErrorSplit`]: 6 s, three disjoint 2 s
/// estimator windows.
const SPLIT_BLOCK: u64 = 6;

/// Where the per-edge errors come from. Each edge's error series (one
/// reading a second, both estimators from the same probes) is cut into
/// blocks of `SPLIT_BLOCK` readings: the block means are the *slow* part
/// (what persists over several disjoint windows: a path asymmetry, which
/// both estimators see alike if it is the fabric's), the deviations from
/// them the *fast* part (each estimator's own noise, which the block
/// averages away). Over the whole run, each edge's mean error is its
/// *bias*: a path asymmetry, which a symmetric-path estimator cannot see
/// (it is indistinguishable from an offset), shows as the same bias in
/// both estimators. The NTP-style block means still carry much of its own
/// noise (its windows overlap), so they correlate with railguard's only
/// through the bias.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ErrorSplit {
    /// Edges with at least two blocks of both estimates.
    pub edges: usize,
    pub block_s: u64,
    /// Root mean square of the block means and of the deviations from them.
    pub railguard_slow_rms_ns: f64,
    pub railguard_fast_rms_ns: f64,
    pub ntp_style_slow_rms_ns: f64,
    pub ntp_style_fast_rms_ns: f64,
    /// Pearson correlation, across edges, of the two estimators' biases
    /// (1: they err alike, as a shared path asymmetry makes them).
    pub bias_correlation: f64,
    /// Root mean square of railguard's and the NTP-style biases.
    pub railguard_bias_rms_ns: f64,
    pub ntp_style_bias_rms_ns: f64,
}

/// Per edge (from, to, rail), the readings (index, railguard error,
/// NTP-style error) that have both.
type EdgeSeries = BTreeMap<(usize, usize, u64), Vec<(u64, f64, f64)>>;

impl ErrorSplit {
    fn of(series: &EdgeSeries) -> Self {
        let rms = |v: &[f64]| {
            if v.is_empty() {
                f64::NAN
            } else {
                (v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64).sqrt()
            }
        };
        let (mut slow, mut fast_rg, mut fast_ntp) = (Vec::new(), Vec::new(), Vec::new());
        let mut edges = 0;
        let (mut bias_rg, mut bias_ntp) = (Vec::new(), Vec::new());
        for readings in series.values() {
            let mut blocks: BTreeMap<u64, Vec<(f64, f64)>> = BTreeMap::new();
            for &(k, rg, ntp) in readings {
                blocks.entry(k / SPLIT_BLOCK).or_default().push((rg, ntp));
            }
            // Only blocks at least half full: a mean of one or two readings
            // of overlapping windows is not slow.
            blocks.retain(|_, b| 2 * b.len() as u64 >= SPLIT_BLOCK);
            if blocks.len() < 2 {
                continue;
            }
            edges += 1;
            let all: Vec<(f64, f64)> = blocks.values().flatten().copied().collect();
            let (b_rg, b_ntp) = mean2(&all);
            bias_rg.push(b_rg);
            bias_ntp.push(b_ntp);
            for b in blocks.values() {
                let m = mean2(b);
                slow.push(m);
                fast_rg.extend(b.iter().map(|x| x.0 - m.0));
                fast_ntp.extend(b.iter().map(|x| x.1 - m.1));
            }
        }
        let rg: Vec<f64> = slow.iter().map(|m| m.0).collect();
        let ntp: Vec<f64> = slow.iter().map(|m| m.1).collect();
        Self {
            edges,
            block_s: SPLIT_BLOCK,
            railguard_slow_rms_ns: rms(&rg),
            railguard_fast_rms_ns: rms(&fast_rg),
            ntp_style_slow_rms_ns: rms(&ntp),
            ntp_style_fast_rms_ns: rms(&fast_ntp),
            bias_correlation: pearson(&bias_rg, &bias_ntp),
            railguard_bias_rms_ns: rms(&bias_rg),
            ntp_style_bias_rms_ns: rms(&bias_ntp),
        }
    }
}

/// The means of both members of `v` (non-empty).
fn mean2(v: &[(f64, f64)]) -> (f64, f64) {
    let n = v.len() as f64;
    let (a, b) = v.iter().fold((0.0, 0.0), |s, x| (s.0 + x.0, s.1 + x.1));
    (a / n, b / n)
}

/// Pearson's correlation (NaN with fewer than two points or no spread).
fn pearson(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len().min(b.len());
    if n < 2 {
        return f64::NAN;
    }
    let (ma, mb) = (
        a[..n].iter().sum::<f64>() / n as f64,
        b[..n].iter().sum::<f64>() / n as f64,
    );
    let (mut sab, mut saa, mut sbb) = (0.0, 0.0, 0.0);
    for (x, y) in a[..n].iter().zip(&b[..n]) {
        sab += (x - ma) * (y - mb);
        saa += (x - ma) * (x - ma);
        sbb += (y - mb) * (y - mb);
    }
    sab / (saa * sbb).sqrt()
}

/// The report (last line of output).
#[derive(Debug, Clone, Serialize)]
pub struct ClockSyncReport {
    pub ok: bool,
    pub bench: &'static str,
    pub hosts: usize,
    pub seconds: u64,
    /// Per-host offset error of the network solution (held-over clocks
    /// included: they are what railguard reports).
    pub railguard: ErrorStats,
    /// Of `railguard.samples`, readings of hosts held over (not in the
    /// solution of the moment; see the supervisor's clock holdover).
    pub held_over_samples: usize,
    /// Per-host error of the NTP-style composition.
    pub ntp_style: ErrorStats,
    /// Per-edge errors (one hop), both estimators.
    pub railguard_edges: ErrorStats,
    pub ntp_style_edges: ErrorStats,
    /// The per-edge errors split into a slow part (path asymmetry) and a
    /// fast one (estimator noise).
    pub edge_error_split: ErrorSplit,
    /// ntp_style.p99 / railguard.p99.
    pub improvement_p99: f64,
    pub convergence_s: f64,
    /// Mean error bound the solution claimed.
    pub claimed_bound_p50_ns: f64,
    /// Share of samples whose |error| exceeded the claimed bound.
    pub bound_violations: f64,
    /// Probe thread CPU (user + system) per agent, % of one core.
    pub probe_thread_cpu_pct: Vec<f64>,
    pub probe_thread_cpu_pct_max: f64,
    /// Of which user space (the mesh's own code) and system (syscalls and,
    /// on veth, the whole simulated wire: a veth transmit runs the peer's
    /// receive path in the sender's context). Tick-sampled, approximate;
    /// the total above is exact (`schedstat`).
    pub probe_thread_user_pct_max: f64,
    pub probe_thread_sys_pct_max: f64,
    pub agent_cpu_pct_max: f64,
    /// The CPU every agent was pinned to (None: not pinned).
    pub agents_pinned_cpu: Option<usize>,
    /// The pairs/s per peer the agents probed at (their CPU governor holds
    /// the probe thread inside its budget by lowering the rate).
    pub probe_pairs_per_s_per_peer: RateStats,
    /// None when every host is an end of the load (nothing to count).
    pub bytes_per_s_per_agent: Option<f64>,
    /// The load's bulk flow, Mbit/s received (none on an idle fabric);
    /// with a load, `bytes_per_s_per_agent` leaves out its two ends.
    pub load_mbps: Option<f64>,
    /// The cross traffic (both rails, both ways), if any; with it,
    /// `bytes_per_s_per_agent` leaves out the flows' ends.
    pub cross_load: Option<CrossLoad>,
    /// The shipped link-contention playbook was deleted before the load
    /// (so railguard did not reshape it; runs before this field existed
    /// had it reshaped).
    pub contention_playbook_deleted: bool,
    pub goal: &'static str,
    pub goal_met: bool,
    pub errors: Vec<String>,
}

/// A host's injected clock error.
#[derive(Debug, Clone, Copy)]
struct Truth {
    offset_ns: i64,
    drift_ppb: i64,
}

/// The true `clock_b - clock_a` when `a`'s clock reads `t_a` (anchor `A`).
fn true_offset(a: Truth, b: Truth, anchor: i64, t_a: i64) -> f64 {
    // Solve clock_a(T) = t_a for the true time T (relative to the anchor).
    let ra = a.drift_ppb as f64 * 1e-9;
    let rb = b.drift_ppb as f64 * 1e-9;
    let x = ((t_a - anchor) as f64 - a.offset_ns as f64) / (1.0 + ra);
    (b.offset_ns - a.offset_ns) as f64 + (rb - ra) * x
}

/// CPU time (utime + stime, clock ticks) of a process or thread.
fn cpu_ticks(stat_path: &str) -> Option<u64> {
    cpu_split(stat_path).map(|(u, s)| u + s)
}

/// (utime, stime) in clock ticks of a process or thread.
fn cpu_split(stat_path: &str) -> Option<(u64, u64)> {
    let s = std::fs::read_to_string(stat_path).ok()?;
    // Fields after the parenthesised name: state is field 3; utime 14, stime 15.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some((f.get(11)?.parse().ok()?, f.get(12)?.parse().ok()?))
}

/// A probe thread's (utime, stime), its agent's CPU ticks and the thread's
/// run time (ns) at the start of the window.
type CpuStart = (Option<(u64, u64)>, Option<u64>, Option<u64>);

/// Time a thread has run on a CPU (ns, exact: `schedstat`).
fn run_ns(stat_path: &str) -> Option<u64> {
    let p = stat_path.strip_suffix("/stat")?;
    std::fs::read_to_string(format!("{p}/schedstat"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Pins every thread of `pid` to `cpu` (threads it starts later inherit
/// their creator's affinity).
fn pin_process(pid: u32, cpu: usize) -> anyhow::Result<()> {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET stays inside it
    // for cpu < CPU_SETSIZE (checked by the caller's range check).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    unsafe { libc::CPU_SET(cpu, &mut set) };
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let tid: libc::pid_t = e?.file_name().to_string_lossy().parse()?;
        // SAFETY: set is a valid cpu_set_t of the size passed.
        let r = unsafe { libc::sched_setaffinity(tid, std::mem::size_of_val(&set), &set) };
        if r != 0 {
            let err = std::io::Error::last_os_error();
            // A thread that exited meanwhile is not an error.
            if err.raw_os_error() != Some(libc::ESRCH) {
                return Err(err).with_context(|| format!("sched_setaffinity({tid})"));
            }
        }
    }
    Ok(())
}

/// The CPUs this process may run on (the agents' pin must be one of them).
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: as in pin_process; sched_getaffinity fills the set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    if r != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// The probe thread of agent `pid` (by its name).
fn probe_thread(pid: u32) -> Option<String> {
    for e in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let e = e.ok()?;
        let tid = e.file_name().to_string_lossy().to_string();
        let comm = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).ok()?;
        if comm.trim() == "probe-mesh" {
            return Some(format!("/proc/{pid}/task/{tid}/stat"));
        }
    }
    None
}

fn ticks_per_s() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

fn host_index(name: &str) -> Option<usize> {
    name.strip_prefix('h')?.parse().ok()
}

/// Errors of one `railguard clock` reading: per host (railguard, NTP) and
/// per edge (railguard, NTP), plus the claimed bounds and violations.
#[derive(Default)]
struct Sample {
    /// Host readings that were held over (not in the current solution, or
    /// the last solution standing in).
    held: usize,
    host_err: Vec<f64>,
    host_bound: Vec<f64>,
    ntp_err: Vec<f64>,
    edge_err: Vec<f64>,
    ntp_edge_err: Vec<f64>,
    /// Per edge (from, to, rail): both estimators' errors, when both are
    /// there.
    edge_pairs: Vec<((usize, usize, u64), f64, f64)>,
    /// Every host's probe rate (pairs/s per peer).
    rates: Vec<f64>,
    configured_rate: u64,
    cpu_budget_pct: f64,
}

fn evaluate(v: &Value, truth: &[Truth], anchor: i64) -> anyhow::Result<Sample> {
    let reference = v["reference"].as_str().context("no reference host")?;
    let r = host_index(reference).context("reference name")?;
    let at = v["solution"]["at_ns"].as_i64().context("no solution")?;
    let mut s = Sample::default();
    for h in v["hosts"].as_array().context("hosts")? {
        if let Some(rate) = h["probe"]["pairs_per_s"].as_f64() {
            s.rates.push(rate);
            s.configured_rate = h["probe"]["max_pairs_per_s"].as_u64().unwrap_or(0);
            s.cpu_budget_pct = h["probe"]["cpu_budget_pct"].as_f64().unwrap_or(f64::NAN);
        }
        let name = h["host"].as_str().unwrap_or_default();
        let Some(i) = host_index(name) else { continue };
        if i == r || i >= truth.len() {
            continue;
        }
        if let Some(off) = h["live"]["offset_ns"].as_f64() {
            s.held += usize::from(h["live"]["holdover_ms"].is_u64());
            s.host_err
                .push(off - true_offset(truth[r], truth[i], anchor, at));
            s.host_bound
                .push(h["live"]["error_bound_ns"].as_f64().unwrap_or(f64::NAN));
        }
        if let Some(hops) = h["ntp"]["hops"].as_array() {
            // Each hop judged at its own instant, on its reporter's clock.
            let mut err = 0.0;
            let mut ok = !hops.is_empty();
            for hop in hops {
                let (Some(f), Some(t), Some(rep), Some(at), Some(off)) = (
                    hop["from"].as_str().and_then(host_index),
                    hop["to"].as_str().and_then(host_index),
                    hop["reporter"].as_str().and_then(host_index),
                    hop["at_ns"].as_i64(),
                    hop["offset_ns"].as_f64(),
                ) else {
                    ok = false;
                    break;
                };
                if f >= truth.len() || t >= truth.len() || rep >= truth.len() {
                    ok = false;
                    break;
                }
                // The truth of clock_to - clock_from when the reporter's clock
                // reads at: go through the reporter.
                let other = if rep == f { t } else { f };
                let d = true_offset(truth[rep], truth[other], anchor, at);
                let tr = if rep == f { d } else { -d };
                err += off - tr;
            }
            if ok {
                s.ntp_err.push(err);
            }
        }
    }
    for e in v["edges"].as_array().context("edges")? {
        let (Some(f), Some(t)) = (
            e["from"].as_str().and_then(host_index),
            e["to"].as_str().and_then(host_index),
        ) else {
            continue;
        };
        if f >= truth.len() || t >= truth.len() {
            continue;
        }
        let rg = match (e["at_ns"].as_i64(), e["offset_ns"].as_f64()) {
            (Some(at), Some(off)) => Some(off - true_offset(truth[f], truth[t], anchor, at)),
            _ => None,
        };
        let ntp = match (e["ntp_at_ns"].as_i64(), e["ntp_offset_ns"].as_f64()) {
            (Some(at), Some(off)) => Some(off - true_offset(truth[f], truth[t], anchor, at)),
            _ => None,
        };
        s.edge_err.extend(rg);
        s.ntp_edge_err.extend(ntp);
        if let (Some(rg), Some(ntp), Some(rail)) = (rg, ntp, e["rail"].as_u64()) {
            s.edge_pairs.push(((f, t, rail), rg, ntp));
        }
    }
    Ok(s)
}

/// Runs the bench.
pub async fn run(p: ClockSyncRun) -> anyhow::Result<ClockSyncReport> {
    if !(2..=32).contains(&p.hosts) {
        bail!("--hosts takes 2..=32");
    }
    if (p.uplink_load_mbit > 0 || p.cross_load_mbit > 0) && p.hosts < 4 {
        bail!("a load needs --hosts >= 4 (two leaves of at least two hosts)");
    }
    if p.uplink_load_mbit > 0 && p.cross_load_mbit > 0 {
        bail!("one load at a time: the uplink load or the cross load");
    }
    if let Some(b) = p.probe_cpu_budget_pct {
        nodeagent::probe::governor::check_budget(b)?;
    }
    if let Some(cpu) = p.pin_agents_cpu {
        let allowed = allowed_cpus();
        if !allowed.contains(&cpu) {
            bail!("--pin-agents-cpu {cpu}: this process may run on CPUs {allowed:?} only");
        }
    }
    let max_rate = nodeagent::probe::mesh::MAX_PAIRS_PER_S;
    if p.probe_rate.is_some_and(|r| r == 0 || r > max_rate) {
        bail!("--probe-rate takes 1..={max_rate} pairs/s per peer");
    }
    let load_max = testbed::burst::MAX_LOAD.min(testbed::bulk::MAX_FLOW);
    if (p.uplink_load_mbit > 0 || p.cross_load_mbit > 0)
        && Duration::from_secs(p.seconds + 30) > load_max
    {
        bail!(
            "with a load, --seconds takes at most {} (a load runs the window plus 30 s, at most {load_max:?})",
            load_max.as_secs() - 30
        );
    }
    // The load's sender and receiver (leaf 0's first host, leaf 1's last).
    let load_ends = (p.uplink_load_mbit > 0).then_some((0, p.hosts - 1));
    let cross = if p.cross_load_mbit > 0 {
        cross_pairs(p.hosts)
    } else {
        Vec::new()
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(p.seed);
    let truth: Vec<Truth> = (0..p.hosts)
        .map(|_| Truth {
            offset_ns: rng.gen_range(-1_000_000_000..=1_000_000_000),
            drift_ppb: rng.gen_range(-200_000..=200_000),
        })
        .collect();
    let anchor = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos() as i64;
    let args: Vec<Vec<String>> = truth
        .iter()
        .map(|t| {
            let mut a = vec![
                format!("--test-clock-offset-ns={}", t.offset_ns),
                format!("--test-clock-drift-ppb={}", t.drift_ppb),
                format!("--test-clock-anchor-ns={anchor}"),
            ];
            if let Some(b) = p.probe_cpu_budget_pct {
                a.push(format!("--probe-cpu-budget-pct={b}"));
            }
            if let Some(r) = p.probe_rate {
                a.push(format!("--probe-rate={r}"));
            }
            a
        })
        .collect();
    eprintln!(
        "[clock-sync] {} hosts, offsets within ±1 s, drifts within ±200 ppm (seed {})",
        p.hosts, p.seed
    );
    let spec = TestbedSpec {
        supervisors: p.supervisors,
        hosts: p.hosts,
    };
    // Leaf 1 is the upper half of the hosts: with a random probe graph,
    // many probe paths of a loaded rail cross its uplink.
    let split = |rail: usize, mbit: u64| LeafSplit {
        rail,
        right: (p.hosts / 2..p.hosts).collect(),
        uplink_bps: mbit * 1_000_000,
    };
    let splits = if load_ends.is_some() {
        vec![split(LOAD_RAIL, p.uplink_load_mbit)]
    } else if !cross.is_empty() {
        (0..2).map(|r| split(r, p.cross_load_mbit)).collect()
    } else {
        Vec::new()
    };
    let mut c = NetCluster::start_opts(
        spec,
        NetClusterOptions {
            agent_args: args,
            leaf_splits: splits,
        },
    )
    .await?;
    let started = Instant::now();
    let mut errors = Vec::new();
    if let Some(cpu) = p.pin_agents_cpu {
        for h in 0..p.hosts {
            let pid = c.agent_pid(h).context("an agent without a pid")?;
            pin_process(pid, cpu).with_context(|| format!("pin h{h}'s agent to CPU {cpu}"))?;
        }
    }

    // Convergence: every host solved with a bound within 1 µs.
    let mut convergence_s = f64::NAN;
    while started.elapsed() < p.converge_timeout {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let Ok(v) = c.cli_json(&["clock"]) else {
            continue;
        };
        let hosts = v["hosts"].as_array().cloned().unwrap_or_default();
        let solved = hosts
            .iter()
            .filter(|h| {
                h["live"]["error_bound_ns"]
                    .as_f64()
                    .is_some_and(|b| b <= 1_000.0)
            })
            .count();
        if solved == p.hosts {
            convergence_s = started.elapsed().as_secs_f64();
            eprintln!("[clock-sync] converged after {convergence_s:.1} s");
            break;
        }
    }
    if convergence_s.is_nan() {
        errors.push(format!("no convergence within {:?}", p.converge_timeout));
    }

    // The window: CPU and bytes counters at both ends, a reading a second.
    let tck = ticks_per_s();
    let pids: Vec<u32> = (0..p.hosts).filter_map(|h| c.agent_pid(h)).collect();
    let threads: Vec<Option<String>> = pids.iter().map(|p| probe_thread(*p)).collect();
    let cpu0: Vec<CpuStart> = pids
        .iter()
        .zip(&threads)
        .map(|(p, t)| {
            (
                t.as_deref().and_then(cpu_split),
                cpu_ticks(&format!("/proc/{p}/stat")),
                t.as_deref().and_then(run_ns),
            )
        })
        .collect();
    let mut bytes0 = Vec::new();
    for h in 0..p.hosts {
        let ns = c.tb.hosts[h].name.clone();
        let mut b = 0;
        for r in 0..2 {
            b += c.tb.link_tx_bytes(&ns, &format!("rail{r}")).await?;
        }
        bytes0.push(b);
    }
    let load = if let Some((from, to)) = load_ends {
        // The bench measures clocks behind a queued uplink, not the cure:
        // the shipped contention playbook would reshape the flow to its
        // fair share and drain the very queue the load is for.
        c.disable_reshaping()?;
        eprintln!("[clock-sync] load: playbook {RESHAPING_PLAYBOOK} deleted (no reshaping)");
        eprintln!(
            "[clock-sync] load: bulk TCP h{from} -> h{to} across the {} Mbit/s rail{LOAD_RAIL} uplink",
            p.uplink_load_mbit
        );
        let max = Duration::from_secs(p.seconds + 30);
        let flow = BulkFlow::start(&c.tb, from, to, LOAD_RAIL, LOAD_PORT, max)
            .context("start the load")?;
        // Let the uplink's queue build before measuring.
        tokio::time::sleep(Duration::from_secs(3)).await;
        Some(flow)
    } else {
        None
    };
    let mut bursts = Vec::new();
    if !cross.is_empty() {
        c.disable_reshaping()?;
        eprintln!("[clock-sync] cross load: playbook {RESHAPING_PLAYBOOK} deleted (no reshaping)");
        let rate_bps = (p.cross_load_mbit as f64 * 1e6 * p.cross_load_util) as u64;
        for (i, &(from, to, rail)) in cross.iter().enumerate() {
            eprintln!(
                "[clock-sync] cross load: bursty UDP h{from} -> h{to} on rail{rail}, {:.1} Mbit/s across the {} Mbit/s uplink",
                rate_bps as f64 / 1e6,
                p.cross_load_mbit
            );
            let spec = BurstSpec {
                from,
                to,
                rail,
                port: CROSS_PORT,
                rate_bps,
                mean_burst: CROSS_MEAN_BURST,
                max: Duration::from_secs(p.seconds + 30),
                seed: p.seed.wrapping_add(i as u64 + 1),
            };
            bursts.push((
                (from, to, rail),
                BurstLoad::start(&c.tb, spec).context("start the cross load")?,
            ));
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let w0 = Instant::now();
    let mut all = Sample::default();
    let mut edge_series = EdgeSeries::new();
    let mut recent: VecDeque<String> = VecDeque::new();
    eprintln!("[clock-sync] measuring for {} s", p.seconds);
    for k in 0..p.seconds {
        let next = w0 + Duration::from_secs(k + 1);
        tokio::time::sleep_until(next.into()).await;
        match c.cli_json(&["clock"]).map(|v| evaluate(&v, &truth, anchor)) {
            Ok(Ok(s)) => {
                all.held += s.held;
                all.host_err.extend(s.host_err);
                all.host_bound.extend(s.host_bound);
                all.ntp_err.extend(s.ntp_err);
                all.edge_err.extend(s.edge_err);
                all.ntp_edge_err.extend(s.ntp_edge_err);
                for (key, rg, ntp) in s.edge_pairs {
                    edge_series.entry(key).or_default().push((k, rg, ntp));
                }
                all.rates.extend(s.rates);
                all.configured_rate = s.configured_rate;
                all.cpu_budget_pct = s.cpu_budget_pct;
            }
            Ok(Err(e)) | Err(e) => {
                if recent.len() < 5 {
                    recent.push_back(format!("{e:#}"));
                }
            }
        }
        if (k + 1) % 10 == 0 {
            let st = ErrorStats::of(all.host_err.clone());
            eprintln!(
                "[clock-sync] {:>3} s: {} samples, |error| p50 {:.0} ns p99 {:.0} ns",
                k + 1,
                st.samples,
                st.p50_ns,
                st.p99_ns
            );
        }
    }
    let window = w0.elapsed().as_secs_f64();
    let mut probe_cpu = Vec::new();
    let (mut user_max, mut sys_max): (f64, f64) = (0.0, 0.0);
    let mut agent_cpu: f64 = 0.0;
    for ((p, t), (t0, a0, r0)) in pids.iter().zip(&threads).zip(&cpu0) {
        if let (Some(r), Some(r0)) = (t.as_deref().and_then(run_ns), r0) {
            probe_cpu.push(100.0 * (r - r0) as f64 / 1e9 / window);
        }
        if let (Some((u, s)), Some((u0, s0))) = (t.as_deref().and_then(cpu_split), t0) {
            let pct = |d: u64| 100.0 * d as f64 / tck / window;
            user_max = user_max.max(pct(u - u0));
            sys_max = sys_max.max(pct(s - s0));
        }
        if let (Some(a), Some(a0)) = (cpu_ticks(&format!("/proc/{p}/stat")), a0) {
            agent_cpu = agent_cpu.max(100.0 * (a - a0) as f64 / tck / window);
        }
    }
    // The loads' ends also send their data (and acks) on their rails:
    // they are left out of the probe bytes.
    let is_load_end = |h: usize| {
        load_ends.is_some_and(|(a, b)| h == a || h == b)
            || cross.iter().any(|&(a, b, _)| h == a || h == b)
    };
    let mut bytes = 0u64;
    let mut counted = 0usize;
    for (h, b0) in bytes0.iter().enumerate() {
        if is_load_end(h) {
            continue;
        }
        counted += 1;
        let ns = c.tb.hosts[h].name.clone();
        let mut b = 0;
        for r in 0..2 {
            b += c.tb.link_tx_bytes(&ns, &format!("rail{r}")).await?;
        }
        bytes += b.saturating_sub(*b0);
    }
    errors.extend(recent);
    let load_mbps = match load.map(BulkFlow::stop) {
        None => None,
        Some(Ok(r)) => Some(r.mbps),
        Some(Err(e)) => {
            errors.push(format!("load: {e}"));
            None
        }
    };
    let mut flows = Vec::new();
    for ((from, to, rail), b) in bursts {
        match b.stop() {
            Ok(r) => flows.push(CrossFlow {
                from,
                to,
                rail,
                offered_mbps: r.offered_mbps,
                delivered_mbps: r.delivered_mbps,
            }),
            Err(e) => errors.push(format!("cross load: {e}")),
        }
    }
    let cross_load = (!cross.is_empty()).then_some(CrossLoad {
        uplink_mbit: p.cross_load_mbit,
        util: p.cross_load_util,
        mean_burst: CROSS_MEAN_BURST,
        flows,
    });

    let violations = all
        .host_err
        .iter()
        .zip(&all.host_bound)
        .filter(|(e, b)| e.abs() > **b)
        .count() as f64
        / all.host_err.len().max(1) as f64;
    let mut bounds = all.host_bound.clone();
    bounds.retain(|b| b.is_finite());
    bounds.sort_by(f64::total_cmp);
    let railguard = ErrorStats::of(all.host_err);
    let ntp_style = ErrorStats::of(all.ntp_err);
    let improvement_p99 = ntp_style.p99_ns / railguard.p99_ns;
    let probe_max = probe_cpu.iter().copied().fold(0.0, f64::max);
    let mut rates = all.rates.clone();
    rates.sort_by(f64::total_cmp);
    if rates.is_empty() {
        errors.push("no probe rates in the clock view".into());
    }
    let probe_rate = RateStats {
        configured: all.configured_rate,
        p50: rates.get(rates.len() / 2).copied().unwrap_or(f64::NAN),
        min: rates.first().copied().unwrap_or(f64::NAN),
        max: rates.last().copied().unwrap_or(f64::NAN),
        cpu_budget_pct: all.cpu_budget_pct,
    };
    let bytes_per_s = (counted > 0).then(|| bytes as f64 / window / counted as f64);
    let enough = railguard.samples >= (p.seconds as usize / 2) * (p.hosts - 1);
    let goal_met =
        enough && railguard.p99_ns <= 1_000.0 && improvement_p99 >= 10.0 && probe_max <= 1.0;
    let ok = errors.is_empty() && enough && probe_cpu.len() == p.hosts;
    if !ok {
        let logs = c.keep_logs();
        eprintln!("[clock-sync] logs kept in {}", logs.display());
    } else {
        c.tb.teardown();
    }
    Ok(ClockSyncReport {
        ok,
        bench: "clock-sync",
        hosts: p.hosts,
        seconds: p.seconds,
        held_over_samples: all.held,
        railguard,
        ntp_style,
        railguard_edges: ErrorStats::of(all.edge_err),
        ntp_style_edges: ErrorStats::of(all.ntp_edge_err),
        edge_error_split: ErrorSplit::of(&edge_series),
        improvement_p99,
        convergence_s,
        claimed_bound_p50_ns: bounds.get(bounds.len() / 2).copied().unwrap_or(f64::NAN),
        bound_violations: violations,
        probe_thread_cpu_pct: probe_cpu,
        probe_thread_cpu_pct_max: probe_max,
        probe_thread_user_pct_max: user_max,
        probe_thread_sys_pct_max: sys_max,
        agent_cpu_pct_max: agent_cpu,
        agents_pinned_cpu: p.pin_agents_cpu,
        probe_pairs_per_s_per_peer: probe_rate,
        bytes_per_s_per_agent: bytes_per_s,
        load_mbps,
        cross_load,
        contention_playbook_deleted: load_ends.is_some() || !cross.is_empty(),
        goal: "per-host p99 error <= 1 us, >= 10x better than NTP-style at p99, probe thread <= 1 % of a core",
        goal_met,
        errors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cross_traffic_runs_both_ways_on_each_rail_between_the_leaves() {
        for hosts in [4, 5, 8, 32] {
            let pairs = cross_pairs(hosts);
            assert_eq!(pairs.len(), 4);
            let half = hosts / 2;
            for &(a, b, rail) in &pairs {
                assert!(
                    (a < half) != (b < half),
                    "{hosts}: {a}->{b} crosses the leaves"
                );
                assert!(pairs.contains(&(b, a, rail)), "both ways");
            }
            // Distinct ends per rail.
            let ends = |r: usize| {
                pairs
                    .iter()
                    .find(|p| p.2 == r)
                    .map(|p| (p.0.min(p.1), p.0.max(p.1)))
            };
            assert_ne!(ends(0), ends(1), "{hosts}");
        }
    }

    #[test]
    fn true_offset_follows_the_linear_model() {
        let anchor = 1_700_000_000_000_000_000;
        let a = Truth {
            offset_ns: 1_000,
            drift_ppb: 0,
        };
        let b = Truth {
            offset_ns: 5_000,
            drift_ppb: 100_000,
        };
        // At the anchor: 4 µs; 1 s later (true) b gained 100 µs.
        assert!((true_offset(a, b, anchor, anchor + 1_000) - 4_000.0).abs() < 1e-3);
        let d = true_offset(a, b, anchor, anchor + 1_000 + 1_000_000_000);
        assert!((d - 104_000.0).abs() < 1e-3, "{d}");
        // Antisymmetric at the same true instant.
        let t_a = anchor + 1_000 + 1_000_000_000;
        let t_b = t_a + d as i64;
        assert!((true_offset(b, a, anchor, t_b) + d).abs() < 1.0);
    }

    #[test]
    fn evaluates_a_clock_reading() {
        let anchor = 0;
        let truth = [
            Truth {
                offset_ns: 0,
                drift_ppb: 0,
            },
            Truth {
                offset_ns: 300,
                drift_ppb: 0,
            },
        ];
        let v = serde_json::json!({
            "reference": "h0",
            "solution": {"at_ns": 10},
            "hosts": [
                {"host": "h0", "live": {"offset_ns": 0.0, "error_bound_ns": 5.0}},
                {"host": "h1", "live": {"offset_ns": 310.0, "error_bound_ns": 5.0},
                 "ntp": {"hops": [{"from": "h0", "to": "h1", "reporter": "h1", "at_ns": 400, "offset_ns": 250.0}]}}
            ],
            "edges": [{"from": "h1", "to": "h0", "rail": 1, "at_ns": 400, "offset_ns": -290.0,
                       "ntp_at_ns": 400, "ntp_offset_ns": -250.0}]
        });
        let s = evaluate(&v, &truth, anchor).unwrap();
        assert_eq!(s.host_err, vec![10.0]);
        assert_eq!(s.ntp_err, vec![-50.0]);
        assert_eq!(s.edge_err, vec![10.0]);
        assert_eq!(s.ntp_edge_err, vec![50.0]);
        assert_eq!(s.edge_pairs, vec![((1, 0, 1), 10.0, 50.0)]);
    }

    #[tokio::test]
    async fn bad_run_parameters_are_refused_before_any_testbed_is_built() {
        let good = ClockSyncRun::idle(8, 60, 1);
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty() && cpus.iter().all(|&c| c < libc::CPU_SETSIZE as usize));
        let not_allowed = (0..).find(|c| !cpus.contains(c)).unwrap();
        for (bad, says) in [
            (
                ClockSyncRun {
                    pin_agents_cpu: Some(not_allowed),
                    ..good.clone()
                },
                "--pin-agents-cpu",
            ),
            (
                ClockSyncRun {
                    hosts: 1,
                    ..good.clone()
                },
                "--hosts",
            ),
            (
                ClockSyncRun {
                    probe_rate: Some(0),
                    ..good.clone()
                },
                "--probe-rate",
            ),
        ] {
            let e = run(bad).await.expect_err("refused");
            assert!(format!("{e:#}").contains(says), "{e:#}");
        }
    }

    #[test]
    fn the_error_split_separates_a_shared_asymmetry_from_each_estimators_noise() {
        let mut series = EdgeSeries::new();
        // Four edges over 60 readings: a shared bias of 3·(edge + 1) ns and
        // per 6 s block a shared asymmetry of ±10·(edge + 1) ns (zero mean
        // over the run); within each block railguard's noise ±2 ns and the
        // NTP-style estimator's ±5 ns, alternating (zero mean).
        let mut slow = Vec::new();
        let mut biases = Vec::new();
        for e in 0..4u64 {
            let v = series.entry((e as usize, 0, e % 2)).or_default();
            for k in 0..60u64 {
                let b = k / SPLIT_BLOCK;
                let bias = 3.0 * (e + 1) as f64;
                let asym =
                    bias + 10.0 * (e + 1) as f64 * if b.is_multiple_of(2) { 1.0 } else { -1.0 };
                let sign = if k.is_multiple_of(2) { 1.0 } else { -1.0 };
                v.push((k, asym + 2.0 * sign, asym + 5.0 * sign));
                if k % SPLIT_BLOCK == 0 {
                    slow.push(asym);
                }
            }
            biases.push(3.0 * (e + 1) as f64);
        }
        // An edge with a single block is left out; so is a block with only
        // two readings (its mean is not slow).
        series
            .entry((7, 0, 0))
            .or_default()
            .extend((0..6).map(|k| (k, 100.0, -100.0)));
        series
            .entry((0, 0, 0))
            .or_default()
            .extend([(60, 1e6, 1e6), (61, -1e6, 1e6)]);
        let s = ErrorSplit::of(&series);
        let rms = |v: &[f64]| (v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64).sqrt();
        assert_eq!(s.edges, 4);
        assert_eq!(s.block_s, SPLIT_BLOCK);
        assert!((s.railguard_slow_rms_ns - rms(&slow)).abs() < 1e-9, "{s:?}");
        assert!((s.ntp_style_slow_rms_ns - rms(&slow)).abs() < 1e-9, "{s:?}");
        assert!((s.railguard_fast_rms_ns - 2.0).abs() < 1e-9, "{s:?}");
        assert!((s.ntp_style_fast_rms_ns - 5.0).abs() < 1e-9, "{s:?}");
        assert!(
            (s.railguard_bias_rms_ns - rms(&biases)).abs() < 1e-9,
            "{s:?}"
        );
        assert!(
            (s.ntp_style_bias_rms_ns - rms(&biases)).abs() < 1e-9,
            "{s:?}"
        );
        assert!((s.bias_correlation - 1.0).abs() < 1e-9, "{s:?}");

        // Biases of their own (orthogonal across the edges): uncorrelated.
        let mut series = EdgeSeries::new();
        let (b_rg, b_ntp) = ([5.0, -5.0, 5.0, -5.0], [5.0, 5.0, -5.0, -5.0]);
        for e in 0..4usize {
            let v = series.entry((e, 1, 0)).or_default();
            for k in 0..60u64 {
                let swing = if (k / SPLIT_BLOCK).is_multiple_of(2) {
                    8.0
                } else {
                    -8.0
                };
                v.push((k, b_rg[e] + swing, b_ntp[e] - swing));
            }
        }
        let s = ErrorSplit::of(&series);
        assert!(s.bias_correlation.abs() < 1e-9, "{s:?}");
        assert!((s.railguard_bias_rms_ns - 5.0).abs() < 1e-9, "{s:?}");
        assert!(s.railguard_fast_rms_ns < 1e-9 && s.ntp_style_fast_rms_ns < 1e-9);
        // Nothing to split.
        let s = ErrorSplit::of(&EdgeSeries::new());
        assert_eq!(s.edges, 0);
        assert!(s.bias_correlation.is_nan() && s.railguard_slow_rms_ns.is_nan());
    }
}
