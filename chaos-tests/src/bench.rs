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
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use supervisor::api::{AdminReply, AdminRequest};
use supervisor::model::AdminOp;

use crate::etcd::{EtcdClient, EtcdCluster};
use testbed::agentsim::{nic_event, open_stream, register_host, EventStream};
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
pub fn percentile_ms<T: Copy + Into<i128>>(sorted_us: &[T], p: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted_us.len() - 1) as f64).round() as usize;
    sorted_us[rank.min(sorted_us.len() - 1)].into() as f64 / 1000.0
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

/// Runs one closed-loop client per element of `clients` over the window:
/// each calls `op` with its state and its operation number, waits for the
/// answer and calls again, until the window ends. Latencies of operations
/// begun and answered inside the window are kept. A failed operation counts
/// as an error; the client pauses 10 ms and goes on (`op` finds the leader
/// again itself), so a leadership change costs errors, not the run.
async fn closed_loop<C, F, Fut>(
    clients: Vec<C>,
    (start, end): (Instant, Instant),
    op: F,
) -> anyhow::Result<(Vec<u64>, u64, Vec<C>)>
where
    C: Send + 'static,
    F: Fn(C, u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = (C, Result<(), String>)> + Send + 'static,
{
    let mut tasks = Vec::new();
    for (i, mut c) in clients.into_iter().enumerate() {
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let (mut lat, mut errors, mut n) = (Vec::new(), 0u64, 0u64);
            while Instant::now() < end {
                n += 1;
                let t0 = Instant::now();
                let (back, r) = op(c, n).await;
                c = back;
                match r {
                    Ok(()) if t0 >= start && Instant::now() <= end => {
                        lat.push(t0.elapsed().as_micros() as u64);
                    }
                    Ok(()) => {}
                    Err(e) => {
                        if errors == 0 {
                            eprintln!("[raft-commit] client {i}: {e}");
                        }
                        errors += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            (lat, errors, c)
        }));
    }
    let (mut lat, mut errors, mut back) = (Vec::new(), 0, Vec::new());
    for t in tasks {
        let (l, e, c) = t.await?;
        lat.extend(l);
        errors += e;
        back.push(c);
    }
    Ok((lat, errors, back))
}

/// A simulated agent: its report stream to the leader (opened again, on
/// whichever member leads, after an error) and its last acknowledged event.
struct EventClient {
    host: String,
    addrs: Vec<String>,
    tls: pki::ClientTls,
    stream: Option<EventStream>,
    acked: u64,
}

impl EventClient {
    /// Sends the next event and waits until it is committed and applied.
    /// After an error the same event is sent again on a new stream: the
    /// supervisor applies each sequence number once and acknowledges a
    /// repeat.
    async fn next(&mut self) -> Result<(), String> {
        let seq = self.acked + 1;
        let mut s = match self.stream.take() {
            Some(s) => s,
            None => open_leader_stream(&self.addrs, &self.tls, 1).await?,
        };
        let up = seq.is_multiple_of(2);
        s.tx.send(nic_event(&self.host, seq, "rail0", up))
            .await
            .map_err(|_| format!("{}: report stream closed", self.host))?;
        match tokio::time::timeout(Duration::from_secs(5), s.acks.message()).await {
            Ok(Ok(Some(ack))) if ack.error.is_empty() && ack.acked_through >= seq => {
                self.acked = seq;
                self.stream = Some(s);
                Ok(())
            }
            other => Err(format!("{}: event {seq} not acked: {other:?}", self.host)),
        }
    }
}

/// A report stream to whichever of `addrs` leads (followers refuse one),
/// trying them all `rounds` times, 100 ms more between rounds each time
/// (256 connects at once can overflow a listen backlog).
async fn open_leader_stream(
    addrs: &[String],
    tls: &pki::ClientTls,
    rounds: u64,
) -> Result<EventStream, String> {
    let mut last = String::new();
    for round in 0..rounds {
        if round > 0 {
            tokio::time::sleep(Duration::from_millis(100 * round)).await;
        }
        for a in addrs {
            match open_stream(a, tls).await {
                Ok(s) => return Ok(s),
                Err(e) => last = format!("{e:#}"),
            }
        }
    }
    Err(last)
}

/// One cluster under the bench: three supervisors, `max` registered hosts,
/// each host's simulated agent.
struct Rig {
    cluster: SupervisorCluster,
    leader: u64,
    hosts: Vec<String>,
    agents: Vec<EventClient>,
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
        let mut agents = Vec::new();
        for h in &hosts {
            let tls = cluster.agent_tls(h)?;
            register_host(&cluster.addrs(), h, &tls).await?;
            // The leader first: the others refuse a report stream.
            let mut addrs = cluster.addrs();
            addrs.rotate_left((leader - 1) as usize);
            agents.push(EventClient {
                host: h.clone(),
                addrs,
                tls,
                stream: None,
                acked: 0,
            });
        }
        Ok(Self {
            cluster,
            leader,
            hosts,
            agents,
            label,
        })
    }

    /// Opens the first `clients` agents' report streams.
    async fn open(&mut self, clients: usize) -> anyhow::Result<()> {
        let mut tasks = Vec::new();
        for a in &self.agents[..clients] {
            let (addrs, tls) = (a.addrs.clone(), a.tls.clone());
            tasks.push(tokio::spawn(async move {
                open_leader_stream(&addrs, &tls, 5).await
            }));
        }
        for (a, t) in self.agents.iter_mut().zip(tasks) {
            let s = t.await?.map_err(|e| anyhow::anyhow!("{}: {e}", a.host))?;
            a.stream = Some(s);
        }
        Ok(())
    }

    async fn events(&mut self, clients: usize, secs: f64) -> anyhow::Result<Trial> {
        let (window, cpu) = cpu_window(self.pids(), secs);
        // The first `clients` agents run; they come back to their places.
        let agents: Vec<EventClient> = self.agents.drain(..clients).collect();
        let (lat, errors, agents) = closed_loop(agents, window, |mut a: EventClient, _| async {
            let r = a.next().await;
            (a, r)
        })
        .await?;
        self.agents.splice(0..0, agents);
        trial((lat, errors), cpu).await
    }

    /// One client per simulated operator, as 256 admins would be, each
    /// labelling a host of its own; writes reach the leader from any
    /// member (forwarded), so a leadership change does not stop them.
    async fn admin(&self, clients: usize, secs: f64) -> anyhow::Result<Trial> {
        let (window, cpu) = cpu_window(self.pids(), secs);
        let mut admins = Vec::new();
        for (i, host) in self.hosts[..clients].iter().enumerate() {
            let c = self.cluster.client(
                &format!("bench{i}"),
                (self.leader - 1) as usize,
                Duration::from_secs(5),
            )?;
            admins.push((c, host.clone(), i));
        }
        let (lat, errors, _) = closed_loop(admins, window, |(c, host, i), n| async move {
            let req = AdminRequest::Write {
                op: AdminOp::SetLabels {
                    host: host.clone(),
                    set: BTreeMap::from([(format!("bench{i}"), n.to_string())]),
                    remove: vec![],
                },
            };
            let r = c.call(req, false).await;
            let r = r
                .map(|_| ())
                .map_err(|e| format!("{host}: admin write failed: {e}"));
            ((c, host, i), r)
        })
        .await?;
        trial((lat, errors), cpu).await
    }

    fn pids(&self) -> Vec<u32> {
        self.cluster.nodes.iter().filter_map(|n| n.pid()).collect()
    }

    /// The current Raft term, as the leader reports it.
    async fn term(&mut self) -> anyhow::Result<u64> {
        self.leader = self.cluster.wait_leader(Duration::from_secs(10)).await?;
        let c = self
            .cluster
            .client_for(self.leader, Duration::from_secs(3))?;
        match c.call(AdminRequest::Status, true).await? {
            AdminReply::Status(s) => Ok(s.term),
            other => anyhow::bail!("status answered {other:?}"),
        }
    }
}

/// A measured window after a warm-up of half a second, and a task that
/// reads the CPU time the processes `pids` (the servers) and this process
/// (the clients) use within it.
fn cpu_window(
    pids: Vec<u32>,
    secs: f64,
) -> ((Instant, Instant), tokio::task::JoinHandle<(u64, u64)>) {
    let start = Instant::now() + Duration::from_millis(500);
    let end = start + Duration::from_secs_f64(secs);
    let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
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
/// With `etcd`, its trials of the same level take turns with the rigs'
/// event trials.
async fn run_levels(
    rigs: &mut [Rig],
    mut etcd: Option<&mut EtcdRig>,
    levels: &[usize],
    secs: f64,
    trials: usize,
) -> anyhow::Result<Vec<RaftCommitReport>> {
    let n = rigs.len();
    let mut events: Vec<Vec<Level>> = vec![Vec::new(); n];
    let mut admin: Vec<Vec<Level>> = vec![Vec::new(); n];
    for &c in levels {
        for r in rigs.iter_mut() {
            r.open(c).await?;
        }
        if let Some(e) = etcd.as_deref_mut() {
            e.open(c).await?;
        }
        let mut runs: Vec<Vec<Trial>> = vec![Vec::new(); n];
        let mut etcd_runs = Vec::new();
        for t in 0..trials {
            let etcd_first = t % 2 == 1;
            if let (true, Some(e)) = (etcd_first, etcd.as_deref_mut()) {
                etcd_runs.push(e.puts(secs).await?);
            }
            for k in 0..n {
                let i = if t % 2 == 0 { k } else { n - 1 - k };
                runs[i].push(rigs[i].events(c, secs).await?);
            }
            if let (false, Some(e)) = (etcd_first, etcd.as_deref_mut()) {
                etcd_runs.push(e.puts(secs).await?);
            }
        }
        for (i, r) in runs.into_iter().enumerate() {
            let l = summarise(c, r, secs);
            report_level("events", rigs[i].label, &l);
            events[i].push(l);
        }
        if let Some(e) = etcd.as_deref_mut() {
            let l = summarise(c, etcd_runs, secs);
            report_level("put", "etcd", &l);
            e.levels.push(l);
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

/// Per level (paired in order): `num`'s rate over `den`'s (0 where `den`
/// committed nothing).
fn rate_ratios(num: &[Level], den: &[Level]) -> Vec<(usize, f64)> {
    num.iter()
        .zip(den)
        .map(|(n, d)| {
            let r = if d.per_s > 0.0 {
                n.per_s / d.per_s
            } else {
                0.0
            };
            (n.clients, r)
        })
        .collect()
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
    let mut reports = run_levels(&mut rigs, None, levels, secs, trials).await?;
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
    let mut reports = run_levels(&mut rigs, None, levels, secs, trials).await?;
    let tls = reports.pop().context("the mutual-TLS report")?;
    let plain = reports.pop().context("the plain-text report")?;
    let events_ratio = rate_ratios(&tls.events, &plain.events);
    let admin_ratio = rate_ratios(&tls.admin_writes, &plain.admin_writes);
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

/// etcd under the same load: one closed-loop client per level's client
/// count, each with its own connection to the leader, writing a key of its
/// own (a small value, as a label update is).
struct EtcdRig {
    cluster: Arc<EtcdCluster>,
    clients: Vec<PutClient>,
    levels: Vec<Level>,
}

/// An etcd client: its connection to the leader (made again, to whichever
/// member then leads, after an error) and its key.
struct PutClient {
    cluster: Arc<EtcdCluster>,
    conn: Option<EtcdClient>,
    key: Vec<u8>,
}

impl PutClient {
    async fn put(&mut self, n: u64) -> Result<(), String> {
        let mut c = match self.conn.take() {
            Some(c) => c,
            None => {
                let (leader, _) = self
                    .cluster
                    .leader(Duration::from_secs(3))
                    .await
                    .map_err(|e| format!("{e:#}"))?;
                self.cluster
                    .client(leader)
                    .await
                    .map_err(|e| format!("{e:#}"))?
            }
        };
        c.put(self.key.clone(), n.to_string().into_bytes())
            .await
            .map_err(|e| format!("etcd put: {}", e.message()))?;
        self.conn = Some(c);
        Ok(())
    }
}

impl EtcdRig {
    async fn start() -> anyhow::Result<Self> {
        eprintln!("[raft-commit] starting 3 etcd members (mutual TLS)");
        let cluster = Arc::new(EtcdCluster::start(3).await?);
        eprintln!("[raft-commit] etcd {} is up", cluster.version);
        Ok(Self {
            cluster,
            clients: Vec::new(),
            levels: Vec::new(),
        })
    }

    /// Connects `clients` clients to the leader.
    async fn open(&mut self, clients: usize) -> anyhow::Result<()> {
        let (leader, _) = self.cluster.leader(Duration::from_secs(10)).await?;
        self.clients.clear();
        for i in 0..clients {
            self.clients.push(PutClient {
                cluster: self.cluster.clone(),
                conn: Some(self.cluster.client(leader).await?),
                key: format!("bench/{i}").into_bytes(),
            });
        }
        Ok(())
    }

    async fn puts(&mut self, secs: f64) -> anyhow::Result<Trial> {
        let (window, cpu) = cpu_window(self.cluster.pids(), secs);
        let clients = std::mem::take(&mut self.clients);
        let (lat, errors, clients) =
            closed_loop(clients, window, |mut c: PutClient, n| async move {
                let r = c.put(n).await;
                (c, r)
            })
            .await?;
        self.clients = clients;
        trial((lat, errors), cpu).await
    }

    async fn term(&self) -> anyhow::Result<u64> {
        Ok(self.cluster.leader(Duration::from_secs(10)).await?.1)
    }
}

/// `bench raft-commit --peer etcd`: railguard's cluster (mutual TLS, as it
/// runs) and etcd's (mutual TLS too), both up for the whole run on this
/// machine, driven by the same closed-loop clients, trial by trial in
/// alternating order.
#[derive(Debug, Serialize)]
pub struct EtcdPeerReport {
    pub ok: bool,
    pub bench: &'static str,
    pub etcd_version: String,
    pub seconds_per_trial: f64,
    pub railguard: RaftCommitReport,
    /// etcd `Put`s, one client per connection, one write in flight each.
    pub etcd: Vec<Level>,
    /// Per level: railguard's events/s over etcd's puts/s.
    pub events_ratio: Vec<(usize, f64)>,
    /// Per level: railguard's admin writes/s over etcd's puts/s.
    pub admin_ratio: Vec<(usize, f64)>,
    /// Per level: railguard's event p99 at most etcd's put p99.
    pub events_p99_no_worse: Vec<(usize, bool)>,
    pub admin_p99_no_worse: Vec<(usize, bool)>,
    /// Elections during the measured run (Raft terms that went by).
    pub railguard_elections: u64,
    pub etcd_elections: u64,
    pub goal: &'static str,
    pub goal_met: bool,
}

/// Runs the levels on railguard and on etcd, and compares.
pub async fn raft_commit_vs_etcd(
    levels: &[usize],
    secs: f64,
    trials: usize,
) -> anyhow::Result<EtcdPeerReport> {
    let max = levels.iter().copied().max().unwrap_or(1);
    let mut etcd = EtcdRig::start().await?;
    let mut rigs = [Rig::start(max, true).await?];
    let (rg_term0, etcd_term0) = (rigs[0].term().await?, etcd.term().await?);
    let mut reports = run_levels(&mut rigs, Some(&mut etcd), levels, secs, trials).await?;
    let (rg_term1, etcd_term1) = (rigs[0].term().await?, etcd.term().await?);
    let railguard = reports.remove(0);
    let no_worse = |ours: &[Level]| -> Vec<(usize, bool)> {
        ours.iter()
            .zip(&etcd.levels)
            .map(|(o, e)| (o.clients, o.p99_ms <= e.p99_ms))
            .collect()
    };
    let events_ratio = rate_ratios(&railguard.events, &etcd.levels);
    let admin_ratio = rate_ratios(&railguard.admin_writes, &etcd.levels);
    let events_p99_no_worse = no_worse(&railguard.events);
    let admin_p99_no_worse = no_worse(&railguard.admin_writes);
    for ((c, e), (_, a)) in events_ratio.iter().zip(&admin_ratio) {
        eprintln!(
            "[raft-commit] railguard/etcd at {c:>3} clients: events {e:.2}, admin writes {a:.2}"
        );
    }
    let railguard_elections = rg_term1.saturating_sub(rg_term0);
    let etcd_elections = etcd_term1.saturating_sub(etcd_term0);
    let goal_met = events_ratio.iter().all(|(_, r)| *r >= 1.5)
        && events_p99_no_worse.iter().all(|(_, b)| *b)
        && railguard_elections == 0;
    let etcd_ok = etcd.levels.iter().all(|l| l.errors == 0 && l.committed > 0);
    Ok(EtcdPeerReport {
        ok: railguard.ok && etcd_ok,
        bench: "raft-commit-vs-etcd",
        etcd_version: etcd.cluster.version.clone(),
        seconds_per_trial: secs,
        etcd: std::mem::take(&mut etcd.levels),
        railguard,
        events_ratio,
        admin_ratio,
        events_p99_no_worse,
        admin_p99_no_worse,
        railguard_elections,
        etcd_elections,
        goal: "railguard commits >= 1.5x etcd's writes/s at every level, p99 no worse, no election under load",
        goal_met,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Needs the supervisor binary (`cargo build --workspace --bins`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn event_clients_follow_a_new_leader() {
        let mut rig = Rig::start(4, true).await.expect("cluster");
        rig.open(4).await.expect("streams");
        let before = rig.events(4, 1.0).await.expect("trial");
        assert!(
            before.errors == 0 && !before.lat_us.is_empty(),
            "{before:?}"
        );
        let old = rig.leader;
        rig.cluster.kill(old);
        let after = rig.events(4, 4.0).await.expect("trial");
        assert!(
            !after.lat_us.is_empty(),
            "no event committed after the leader {old} was killed"
        );
        let new = rig
            .cluster
            .wait_leader(Duration::from_secs(10))
            .await
            .unwrap();
        assert_ne!(new, old);
        // Every agent's events went on past the kill, one number each.
        for a in &rig.agents {
            assert!(a.acked > 1, "{} stopped at {}", a.host, a.acked);
        }
    }

    /// Needs Debian's etcd-server (`scripts/setup.sh`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn put_clients_follow_a_new_etcd_leader() {
        let mut etcd = EtcdRig::start().await.expect("etcd");
        assert!(
            etcd.cluster.version.starts_with("3."),
            "{}",
            etcd.cluster.version
        );
        etcd.open(4).await.expect("clients");
        let before = etcd.puts(1.0).await.expect("trial");
        assert!(
            before.errors == 0 && !before.lat_us.is_empty(),
            "{before:?}"
        );
        let (old, term) = etcd.cluster.leader(Duration::from_secs(5)).await.unwrap();
        etcd.cluster.kill(old);
        let after = etcd.puts(6.0).await.expect("trial");
        assert!(
            after.errors > 0 && !after.lat_us.is_empty(),
            "the clients did not go on after etcd's leader was killed: {} errors, {} puts",
            after.errors,
            after.lat_us.len()
        );
        let (new, term2) = etcd.cluster.leader(Duration::from_secs(5)).await.unwrap();
        assert!(new != old && term2 > term, "{old}@{term} -> {new}@{term2}");
    }
}
