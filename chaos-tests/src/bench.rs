//! `bench raft-commit`: committed events per second and commit latency of a
//! three-supervisor cluster on loopback with sled on disk.
//!
//! Each client is a simulated agent with its own `Report` stream to the
//! leader and one event in flight: it sends event `n`, waits for the ack
//! that says `n` is committed and applied, records the latency, and sends
//! `n + 1`. The supervisor folds events arriving from all streams into
//! shared Raft entries (its proposal batcher), which is what lets
//! throughput grow with the number of clients. A second table does the same
//! with unary admin writes (label updates) through the CLI's client.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use supervisor::api::AdminRequest;
use supervisor::model::AdminOp;

use testbed::agentsim::{nic_event, open_stream, register_host};
use testbed::cluster::SupervisorCluster;

/// One concurrency level's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Level {
    pub clients: usize,
    pub trials: usize,
    pub committed: u64,
    /// Median over trials.
    pub per_s: f64,
    /// Every trial's rate, for the spread.
    pub per_s_trials: Vec<f64>,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub errors: u64,
    /// CPU time (user + system) per committed event or write, pooled over
    /// the trials: the three supervisors' and the simulated clients'.
    pub server_cpu_us_per_op: f64,
    pub client_cpu_us_per_op: f64,
}

/// CPU time (user + system, µs) a process has used so far, from
/// `/proc/<pid>/stat`; 0 if it cannot be read.
fn cpu_us(pid: &str) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // The command name (field 2) may hold spaces; fields after ")" are
    // plain. utime and stime are fields 14 and 15.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|i| f.get(*i)?.parse::<u64>().ok())
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    ticks * 1_000_000 / hz
}

/// One trial's samples and errors, and the CPU it cost.
#[derive(Debug, Clone, Default)]
struct Trial {
    lat_us: Vec<u64>,
    errors: u64,
    server_cpu_us: u64,
    client_cpu_us: u64,
}

/// The bench's report.
#[derive(Debug, Clone, Serialize)]
pub struct RaftCommitReport {
    pub ok: bool,
    pub bench: &'static str,
    pub seconds_per_trial: f64,
    pub events: Vec<Level>,
    pub admin_writes: Vec<Level>,
    pub goal: &'static str,
    pub goal_met: bool,
}

/// Percentile (0..=100) of sorted microsecond samples, in ms.
pub fn percentile_ms(sorted_us: &[u64], p: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted_us.len() - 1) as f64).round() as usize;
    sorted_us[rank.min(sorted_us.len() - 1)] as f64 / 1000.0
}

/// Pools trials: latency percentiles over every sample, rate = median of the
/// trials' rates.
fn summarise(clients: usize, trials: Vec<Trial>, secs: f64) -> Level {
    let mut rates: Vec<f64> = trials
        .iter()
        .map(|t| t.lat_us.len() as f64 / secs)
        .collect();
    let errors = trials.iter().map(|t| t.errors).sum();
    let server_cpu: u64 = trials.iter().map(|t| t.server_cpu_us).sum();
    let client_cpu: u64 = trials.iter().map(|t| t.client_cpu_us).sum();
    let mut lat_us: Vec<u64> = trials.into_iter().flat_map(|t| t.lat_us).collect();
    let per_op = |us: u64| us as f64 / (lat_us.len().max(1) as f64);
    let (server_cpu_us_per_op, client_cpu_us_per_op) = (per_op(server_cpu), per_op(client_cpu));
    lat_us.sort_unstable();
    let per_s_trials = rates.clone();
    rates.sort_by(f64::total_cmp);
    Level {
        clients,
        trials: rates.len(),
        committed: lat_us.len() as u64,
        per_s: rates.get(rates.len() / 2).copied().unwrap_or(0.0),
        per_s_trials,
        p50_ms: percentile_ms(&lat_us, 50.0),
        p99_ms: percentile_ms(&lat_us, 99.0),
        max_ms: lat_us.last().map(|x| *x as f64 / 1000.0).unwrap_or(0.0),
        errors,
        server_cpu_us_per_op,
        client_cpu_us_per_op,
    }
}

/// Opens one report stream per host (retrying a few times: 256 connects
/// at once can overflow a listen backlog).
async fn open_streams(
    cluster: &SupervisorCluster,
    addr: &str,
    hosts: &[String],
) -> anyhow::Result<Vec<testbed::agentsim::EventStream>> {
    let mut tasks = Vec::new();
    for h in hosts {
        let addr = addr.to_string();
        let tls = cluster.agent_tls(h)?;
        tasks.push(tokio::spawn(async move {
            let mut last = None;
            for attempt in 0..5u64 {
                match open_stream(&addr, &tls).await {
                    Ok(s) => return Ok(s),
                    Err(e) => last = Some(e),
                }
                tokio::time::sleep(Duration::from_millis(100 * (attempt + 1))).await;
            }
            Err(last.expect("at least one attempt"))
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await??);
    }
    Ok(out)
}

/// One trial: every client sends one event at a time on its own stream.
async fn event_level(
    streams: &mut Vec<testbed::agentsim::EventStream>,
    hosts: &[String],
    seqs: &mut [u64],
    (start, end): (Instant, Instant),
) -> anyhow::Result<(Vec<u64>, u64)> {
    let mut tasks = Vec::new();
    for ((host, mut s), first) in hosts
        .iter()
        .cloned()
        .zip(std::mem::take(streams))
        .zip(seqs.iter().map(|q| q + 1))
    {
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut errors = 0u64;
            let mut seq = first - 1;
            while Instant::now() < end {
                seq += 1;
                let t0 = Instant::now();
                let up = seq.is_multiple_of(2);
                if s.tx.send(nic_event(&host, seq, "rail0", up)).await.is_err() {
                    errors += 1;
                    break;
                }
                match tokio::time::timeout(Duration::from_secs(5), s.acks.message()).await {
                    Ok(Ok(Some(ack))) if ack.error.is_empty() && ack.acked_through >= seq => {
                        if t0 >= start && Instant::now() <= end {
                            lat.push(t0.elapsed().as_micros() as u64);
                        }
                    }
                    other => {
                        eprintln!("[raft-commit] {host}: event {seq} not acked: {other:?}");
                        errors += 1;
                        break;
                    }
                }
            }
            (lat, errors, seq, s)
        }));
    }
    let mut lat = Vec::new();
    let mut errors = 0;
    for (i, t) in tasks.into_iter().enumerate() {
        let (l, e, last, s) = t.await?;
        lat.extend(l);
        errors += e;
        seqs[i] = last;
        streams.push(s);
    }
    Ok((lat, errors))
}

async fn admin_level(
    cluster: &SupervisorCluster,
    leader: u64,
    hosts: &[String],
    (start, end): (Instant, Instant),
) -> anyhow::Result<(Vec<u64>, u64)> {
    // One client per simulated operator, as 256 admins would be.
    let mut tasks = Vec::new();
    for (i, host) in hosts.iter().enumerate() {
        let client = cluster.client_for(leader, Duration::from_secs(5))?;
        let host = host.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut errors = 0u64;
            let mut n = 0u64;
            while Instant::now() < end {
                n += 1;
                let t0 = Instant::now();
                let req = AdminRequest::Write {
                    op: AdminOp::SetLabels {
                        host: host.clone(),
                        set: BTreeMap::from([(format!("bench{i}"), n.to_string())]),
                        remove: vec![],
                    },
                };
                match client.call(req, false).await {
                    Ok(_) => {
                        if t0 >= start && Instant::now() <= end {
                            lat.push(t0.elapsed().as_micros() as u64);
                        }
                    }
                    Err(e) => {
                        if errors == 0 {
                            eprintln!("[raft-commit] {host}: admin write failed: {e}");
                        }
                        errors += 1;
                    }
                }
            }
            (lat, errors)
        }));
    }
    let mut lat = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await?;
        lat.extend(l);
        errors += e;
    }
    Ok((lat, errors))
}

/// One cluster under the bench: three supervisors, `max` registered hosts,
/// each host's last acknowledged event sequence.
struct Rig {
    cluster: SupervisorCluster,
    leader: u64,
    leader_addr: String,
    hosts: Vec<String>,
    seqs: Vec<u64>,
    label: &'static str,
}

impl Rig {
    async fn start(max: usize, mtls: bool) -> anyhow::Result<Self> {
        let label = if mtls { "mutual TLS" } else { "--insecure" };
        eprintln!("[raft-commit] starting 3 supervisors (sled on disk, {label})");
        let cluster = SupervisorCluster::start_tls(3, &[], mtls)?;
        let leader = cluster.init().await.context("initialise")?;
        let hosts: Vec<String> = (0..max).map(|i| format!("bench{i}")).collect();
        eprintln!("[raft-commit] registering {max} hosts ({label})");
        for h in &hosts {
            register_host(&cluster.addrs(), h, &cluster.agent_tls(h)?).await?;
        }
        let leader_addr = cluster.addrs()[(leader - 1) as usize].clone();
        Ok(Self {
            cluster,
            leader,
            leader_addr,
            hosts,
            seqs: vec![0; max],
            label,
        })
    }

    async fn open(&self, clients: usize) -> anyhow::Result<Vec<testbed::agentsim::EventStream>> {
        open_streams(&self.cluster, &self.leader_addr, &self.hosts[..clients]).await
    }

    async fn events(
        &mut self,
        streams: &mut Vec<testbed::agentsim::EventStream>,
        secs: f64,
    ) -> anyhow::Result<Trial> {
        let c = streams.len();
        let (window, cpu) = self.window(secs);
        let run = event_level(streams, &self.hosts[..c], &mut self.seqs[..c], window).await?;
        trial(run, cpu).await
    }

    async fn admin(&self, clients: usize, secs: f64) -> anyhow::Result<Trial> {
        let (window, cpu) = self.window(secs);
        let run = admin_level(&self.cluster, self.leader, &self.hosts[..clients], window).await?;
        trial(run, cpu).await
    }

    /// A measured window after a warm-up of half a second, and a task that
    /// reads the CPU time this cluster's supervisors and this process (the
    /// clients) use within it.
    fn window(&self, secs: f64) -> ((Instant, Instant), tokio::task::JoinHandle<(u64, u64)>) {
        let start = Instant::now() + Duration::from_millis(500);
        let end = start + Duration::from_secs_f64(secs);
        let pids: Vec<String> = self
            .cluster
            .nodes
            .iter()
            .filter_map(|n| n.pid())
            .map(|p| p.to_string())
            .collect();
        let cpu = tokio::spawn(async move {
            let read = |pids: &[String]| -> (u64, u64) {
                (pids.iter().map(|p| cpu_us(p)).sum(), cpu_us("self"))
            };
            tokio::time::sleep_until(start.into()).await;
            let a = read(&pids);
            tokio::time::sleep_until(end.into()).await;
            let b = read(&pids);
            (b.0.saturating_sub(a.0), b.1.saturating_sub(a.1))
        });
        ((start, end), cpu)
    }
}

/// A trial's samples and errors with the CPU its window cost.
async fn trial(
    (lat_us, errors): (Vec<u64>, u64),
    cpu: tokio::task::JoinHandle<(u64, u64)>,
) -> anyhow::Result<Trial> {
    let (server_cpu_us, client_cpu_us) = cpu.await?;
    Ok(Trial {
        lat_us,
        errors,
        server_cpu_us,
        client_cpu_us,
    })
}

fn report_level(kind: &str, label: &str, l: &Level) {
    eprintln!(
        "[raft-commit] {kind:<6} clients={:>3}  {:>9.0}/s (median of {:?})  p50 {:.2} ms  p99 {:.2} ms  errors {}  cpu/op {:.0} µs servers + {:.0} µs clients  ({label})",
        l.clients,
        l.per_s,
        l.per_s_trials.iter().map(|r| r.round()).collect::<Vec<_>>(),
        l.p50_ms,
        l.p99_ms,
        l.errors,
        l.server_cpu_us_per_op,
        l.client_cpu_us_per_op,
    );
}

fn report(events: Vec<Level>, admin_writes: Vec<Level>, secs: f64) -> RaftCommitReport {
    let top = events.iter().find(|l| l.clients == 256);
    let goal_met = top.is_some_and(|l| l.per_s >= 20_000.0 && l.p99_ms <= 20.0);
    let ok = events
        .iter()
        .chain(&admin_writes)
        .all(|l| l.errors == 0 && l.committed > 0);
    RaftCommitReport {
        ok,
        bench: "raft-commit",
        seconds_per_trial: secs,
        events,
        admin_writes,
        goal: ">= 20000 committed events/s at 256 clients with p99 <= 20 ms",
        goal_met,
    }
}

/// Runs the bench on `rigs` side by side: per level, every trial runs on
/// each rig in turn, the order alternating from trial to trial, so drift
/// over the run (disk write-back, a neighbour's load) falls on all alike.
async fn run_levels(
    rigs: &mut [Rig],
    levels: &[usize],
    secs: f64,
    trials: usize,
) -> anyhow::Result<Vec<RaftCommitReport>> {
    let n = rigs.len();
    let mut events: Vec<Vec<Level>> = vec![Vec::new(); n];
    let mut admin: Vec<Vec<Level>> = vec![Vec::new(); n];
    for &c in levels {
        let mut streams = Vec::new();
        for r in rigs.iter() {
            streams.push(r.open(c).await?);
        }
        let mut runs: Vec<Vec<Trial>> = vec![Vec::new(); n];
        for t in 0..trials {
            for k in 0..n {
                let i = if t % 2 == 0 { k } else { n - 1 - k };
                runs[i].push(rigs[i].events(&mut streams[i], secs).await?);
            }
        }
        for (i, r) in runs.into_iter().enumerate() {
            let l = summarise(c, r, secs);
            report_level("events", rigs[i].label, &l);
            events[i].push(l);
        }
    }
    for &c in levels {
        let mut runs: Vec<Vec<Trial>> = vec![Vec::new(); n];
        for t in 0..trials {
            for k in 0..n {
                let i = if t % 2 == 0 { k } else { n - 1 - k };
                runs[i].push(rigs[i].admin(c, secs).await?);
            }
        }
        for (i, r) in runs.into_iter().enumerate() {
            let l = summarise(c, r, secs);
            report_level("admin", rigs[i].label, &l);
            admin[i].push(l);
        }
    }
    Ok(events
        .into_iter()
        .zip(admin)
        .map(|(e, a)| report(e, a, secs))
        .collect())
}

/// Runs the bench with `levels` client counts for `secs` each.
pub async fn raft_commit(
    levels: &[usize],
    secs: f64,
    trials: usize,
    mtls: bool,
) -> anyhow::Result<RaftCommitReport> {
    let max = levels.iter().copied().max().unwrap_or(1);
    let mut rigs = [Rig::start(max, mtls).await?];
    let mut reports = run_levels(&mut rigs, levels, secs, trials).await?;
    Ok(reports.remove(0))
}

/// `bench raft-commit --tls`: the same levels on a plain-text cluster and
/// a mutual-TLS one (both running on this machine for the whole bench),
/// trial by trial in alternating order.
#[derive(Debug, Serialize)]
pub struct TlsCostReport {
    pub ok: bool,
    pub bench: &'static str,
    pub plain: RaftCommitReport,
    pub tls: RaftCommitReport,
    /// Per level: TLS events/s over plain events/s.
    pub events_ratio: Vec<(usize, f64)>,
    /// Per level: TLS admin writes/s over plain.
    pub admin_ratio: Vec<(usize, f64)>,
    /// The lowest of all ratios.
    pub min_ratio: f64,
    pub goal: &'static str,
    pub goal_met: bool,
}

/// Runs the levels on a plain-text and a mutual-TLS cluster, and compares.
pub async fn raft_commit_tls_cost(
    levels: &[usize],
    secs: f64,
    trials: usize,
) -> anyhow::Result<TlsCostReport> {
    let max = levels.iter().copied().max().unwrap_or(1);
    let mut rigs = [Rig::start(max, false).await?, Rig::start(max, true).await?];
    let mut reports = run_levels(&mut rigs, levels, secs, trials).await?;
    let tls = reports.pop().context("the mutual-TLS report")?;
    let plain = reports.pop().context("the plain-text report")?;
    let ratios = |a: &[Level], b: &[Level]| -> Vec<(usize, f64)> {
        a.iter()
            .zip(b)
            .map(|(p, t)| {
                (
                    p.clients,
                    if p.per_s > 0.0 {
                        t.per_s / p.per_s
                    } else {
                        0.0
                    },
                )
            })
            .collect()
    };
    let events_ratio = ratios(&plain.events, &tls.events);
    let admin_ratio = ratios(&plain.admin_writes, &tls.admin_writes);
    let min_ratio = events_ratio
        .iter()
        .chain(&admin_ratio)
        .map(|(_, r)| *r)
        .fold(f64::INFINITY, f64::min);
    for ((c, e), (_, a)) in events_ratio.iter().zip(&admin_ratio) {
        eprintln!("[raft-commit] TLS/plain at {c:>3} clients: events {e:.2}, admin writes {a:.2}");
    }
    Ok(TlsCostReport {
        ok: plain.ok && tls.ok,
        bench: "raft-commit-tls",
        goal: "mutual TLS keeps >= 0.85 of plain-text throughput at every level",
        goal_met: min_ratio >= 0.85,
        plain,
        tls,
        events_ratio,
        admin_ratio,
        min_ratio,
    })
}
