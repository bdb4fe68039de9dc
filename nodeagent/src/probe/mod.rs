//! The probe mesh: coded probe pairs over every data NIC to the peers the
//! supervisor assigns, kernel timestamps, per-pair clock estimation,
//! one-way delays, probe loss, and probe evidence of dead NICs.
//!
//! * [`wire`]: the fixed-size probe packet.
//! * [`sock`]: the timestamping UDP socket of one NIC (the only `unsafe`).
//! * [`mesh`]: the protocol state (pairs, two-step stamps, estimators,
//!   loss, NIC probe liveness), without sockets.
//! * [`loss`]: gray links: a NIC that loses a share of its probes while
//!   its link stays up is Degraded (loss evidence to the link tracker).
//! * [`jitter`]: gray links that delay: a NIC that holds back a share of
//!   every peer's probes, on that NIC alone, is Degraded too (delay
//!   evidence).
//! * [`clock`]: the test-only clock error.
//! * [`governor`]: the CPU budget of the probe thread (lowers the rate).
//!
//! **Threads.** The sockets are served by one dedicated OS thread
//! ([`ProbeRunner`]): it wakes once per tick (see [`mesh`]; every 20 ms at
//! the full default rate with two rails, longer while the governor holds
//! the rate down),
//! drains every socket's stamps and datagrams (the kernel timestamped them
//! on arrival, so reading late costs nothing), sends the tick's pairs with
//! one `sendmmsg` per NIC and sleeps again: a handful of syscalls per tick
//! and no async machinery on the hot path. It talks to the async agent
//! through bounded channels: plans in (a `watch`), NIC probe liveness out
//! (the link tracker's evidence channel) and per-second summaries out
//! (sent to the leader by the agent's summary loop in `agent.rs`, dropped
//! when the leader cannot be reached: summaries are not state, the next
//! one supersedes them).
//! After each tick's reads it copies the paths' fresh outgoing queueing
//! samples onto the runner's [`QueueingBoard`] ([`ProbeRunner::queueing`]).
//! At each summary it reads its own CPU clock for the [`governor`], which
//! lowers the mesh's rate when the thread exceeds its CPU budget (default
//! 1 % of a core) and raises it back, never above the configured rate.

pub mod clock;
pub mod governor;
pub mod jitter;
pub mod loss;
pub mod mesh;
pub mod queueing;
pub mod sock;
pub mod wire;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use crate::link::{Evidence, Period, PortEvent};
use clock::TestClock;
use governor::Governor;
use mesh::{LocalNic, Mesh, MeshConfig, PathSummary, Plan};
use queueing::QueueingBoard;
use sock::{RecvBufs, TsMode, TsSocket};
use wire::Probe;

/// Default UDP port of the probe sockets.
pub const DEFAULT_PORT: u16 = 7947;
/// How often the mesh summarises (and the agent reports) its paths.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(1);
/// How often NIC probe liveness is evaluated.
const LIVENESS_EVERY: Duration = Duration::from_millis(50);
/// Longest sleep of the probe thread (it also checks for a stop).
const MAX_SLEEP: Duration = Duration::from_millis(50);
/// `recvmmsg` rounds per socket per wake-up (bounds one wake-up's work).
const MAX_DRAIN_ROUNDS: usize = 64;

/// When this host last received each peer's probes, refreshed by the probe
/// thread at every liveness check (every 50 ms) and read by the heartbeat.
#[derive(Debug, Default)]
pub struct HeardBoard(std::sync::Mutex<Vec<(String, Instant)>>);

impl HeardBoard {
    fn publish(&self, heard: Vec<(String, Instant)>) {
        *self.0.lock().expect("heard board") = heard;
    }

    /// Each peer heard and how long before `now` (at most [`proto::MAX_PEERS_HEARD`],
    /// the most recently heard first).
    pub fn ages(&self, now: Instant) -> Vec<proto::v1::PeerHeard> {
        let mut heard = self.0.lock().expect("heard board").clone();
        heard.sort_by_key(|h| std::cmp::Reverse(h.1));
        heard
            .into_iter()
            .take(proto::MAX_PEERS_HEARD)
            .map(|(host, at)| proto::v1::PeerHeard {
                host,
                age_ms: u32::try_from(now.saturating_duration_since(at).as_millis())
                    .unwrap_or(u32::MAX),
            })
            .collect()
    }
}

/// The probe mesh's settings.
#[derive(Debug, Clone)]
pub struct ProbeOptions {
    pub port: u16,
    pub mesh: MeshConfig,
    pub timestamps: TsMode,
    /// Test only: the clock error applied to every timestamp.
    pub test_clock: TestClock,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        Self {
            port: DEFAULT_PORT,
            mesh: MeshConfig::default(),
            timestamps: TsMode::Software,
            test_clock: TestClock::default(),
        }
    }
}

/// One summary from the probe thread.
#[derive(Debug, Clone)]
pub struct Summary {
    /// This host's clock (test error applied) when it was taken.
    pub at_ns: i64,
    pub plan_version: u64,
    pub paths: Vec<PathSummary>,
    pub bytes_sent: u64,
    /// Pairs/s per peer now, and the configured rate.
    pub pairs_per_s: u32,
    pub max_pairs_per_s: u32,
    /// The probe thread's share of a core over the governor's last window
    /// (%), and its budget (%; 0: no governor).
    pub cpu_pct: Option<f64>,
    pub cpu_budget_pct: f64,
}

impl Summary {
    /// The wire form for the leader.
    pub fn to_wire(&self, host: &str) -> proto::v1::ProbeSummary {
        let mut clocks = Vec::new();
        let mut paths = Vec::new();
        for p in &self.paths {
            if let Some(e) = &p.estimate {
                clocks.push(proto::v1::PeerClock {
                    peer: p.peer.clone(),
                    rail: p.rail,
                    at_ns: e.at_ns,
                    offset_ns: e.offset_ns,
                    drift_ppb: e.drift_ppb,
                    error_bound_ns: e.error_bound_ns,
                    drift_error_ppb: e.drift_error_ppb,
                    samples: e.samples as u32,
                    has_ntp: p.ntp.is_some(),
                    ntp_at_ns: p.ntp.as_ref().map_or(0, |n| n.at_ns),
                    ntp_offset_ns: p.ntp.as_ref().map_or(0.0, |n| n.offset_ns),
                    ntp_rtt_ns: p.ntp.as_ref().map_or(0, |n| n.rtt_ns),
                });
            }
            let q = |f: f64| -> i64 {
                if p.delays_ns.is_empty() {
                    return 0;
                }
                let i = ((p.delays_ns.len() - 1) as f64 * f).round() as usize;
                p.delays_ns[i.min(p.delays_ns.len() - 1)]
            };
            paths.push(proto::v1::PathStats {
                peer: p.peer.clone(),
                rail: p.rail,
                nic: p.nic.clone(),
                peer_nic: p.peer_nic.clone(),
                expected: p.expected.min(u64::from(u32::MAX)) as u32,
                received: p.received.min(u64::from(u32::MAX)) as u32,
                delays: p.delays_ns.len() as u32,
                min_ns: p.delays_ns.first().copied().unwrap_or(0),
                p50_ns: q(0.5),
                p99_ns: q(0.99),
                line_at_ns: p.estimate.as_ref().map_or(0, |e| e.at_ns),
                line_offset_ns: p.estimate.as_ref().map_or(0.0, |e| e.offset_ns),
                corrected: p.estimate.is_some(),
            });
        }
        proto::v1::ProbeSummary {
            host: host.into(),
            sent_ns: self.at_ns,
            plan_version: self.plan_version,
            clocks,
            paths,
            bytes_sent: self.bytes_sent,
            // Filled by the agent's summary loop (crate::shaping).
            shaped: Vec::new(),
            pairs_per_s: self.pairs_per_s,
            max_pairs_per_s: self.max_pairs_per_s,
            probe_cpu_pct: self.cpu_pct,
            probe_cpu_budget_pct: self.cpu_budget_pct,
        }
    }
}

/// The wire plan as the mesh takes it: peers' NICs on the rails with a
/// valid IPv4 address (others are skipped with a warning).
pub fn plan_from_wire(p: &proto::v1::ProbePlan, port: u16) -> Plan {
    let peers = p
        .peers
        .iter()
        .map(|peer| mesh::PeerSpec {
            host: peer.host.clone(),
            id: peer.host_id,
            nics: peer
                .nics
                .iter()
                .filter_map(|n| match n.addr.parse::<Ipv4Addr>() {
                    Ok(a) => Some((
                        n.rail,
                        mesh::PeerNic {
                            nic: n.nic.clone(),
                            addr: SocketAddrV4::new(a, port),
                        },
                    )),
                    Err(_) => {
                        tracing::warn!(peer = %peer.host, nic = %n.nic, addr = %n.addr, "peer NIC without a usable IPv4 address; not probing it");
                        None
                    }
                })
                .collect(),
        })
        .collect();
    Plan {
        self_id: p.host_id,
        version: p.version,
        peers,
    }
}

/// A data NIC the mesh probes over.
#[derive(Debug, Clone)]
pub struct MeshNic {
    pub name: String,
    pub rail: u32,
    pub addr: Ipv4Addr,
}

/// The running probe thread. Dropping it stops the thread.
pub struct ProbeRunner {
    plan: watch::Sender<Option<Plan>>,
    queueing: Arc<QueueingBoard>,
    heard: Arc<HeardBoard>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ProbeRunner {
    /// Opens a socket per NIC and starts the thread. `evidence` receives
    /// NIC probe-liveness changes, `summaries` one [`Summary`] per second.
    pub fn start(
        opts: ProbeOptions,
        nics: &[MeshNic],
        evidence: mpsc::Sender<PortEvent>,
        summaries: mpsc::Sender<Summary>,
    ) -> Result<Self, sock::SockError> {
        Self::start_with_netdevs(opts, nics, evidence, summaries, Arc::default())
    }

    /// [`ProbeRunner::start`], judging each NIC only while `netdevs` has it
    /// up and by its silence since it came up (the link tracker fills it).
    pub fn start_with_netdevs(
        opts: ProbeOptions,
        nics: &[MeshNic],
        evidence: mpsc::Sender<PortEvent>,
        summaries: mpsc::Sender<Summary>,
        netdevs: Arc<crate::link::NetdevEpochs>,
    ) -> Result<Self, sock::SockError> {
        let mut sockets = Vec::new();
        for n in nics {
            let s = TsSocket::open(&n.name, n.addr, opts.port, opts.timestamps)?;
            sockets.push((n.rail, s));
        }
        let local = nics
            .iter()
            .map(|n| LocalNic {
                name: n.name.clone(),
                rail: n.rail,
            })
            .collect();
        let first_seq = (clock::realtime_ns() / 1_000).max(1) as u64;
        let invalid = |e: String| sock::SockError::Io {
            nic: String::new(),
            addr: SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, opts.port),
            op: "configure",
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
        };
        let mesh =
            Mesh::new(opts.mesh.clone(), local, first_seq, Instant::now()).map_err(invalid)?;
        let governor = Governor::new(opts.mesh.cpu_budget_pct, opts.mesh.pairs_per_s)
            .map_err(|e| invalid(e.to_string()))?;
        let (plan_tx, plan_rx) = watch::channel(None);
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let queueing = QueueingBoard::new();
        let board = queueing.clone();
        let heard = Arc::new(HeardBoard::default());
        let heard_board = heard.clone();
        let thread = std::thread::Builder::new()
            .name("probe-mesh".into())
            .spawn(move || {
                run_thread(
                    mesh,
                    governor,
                    sockets,
                    opts.test_clock,
                    plan_rx,
                    evidence,
                    summaries,
                    Boards {
                        queueing: board,
                        heard: heard_board,
                    },
                    st,
                    netdevs,
                )
            })
            .map_err(|e| sock::SockError::Io {
                nic: String::new(),
                addr: SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, opts.port),
                op: "spawn thread",
                source: e,
            })?;
        Ok(Self {
            plan: plan_tx,
            queueing,
            heard,
            stop,
            thread: Some(thread),
        })
    }

    /// The outgoing queueing of every path, updated once per tick.
    pub fn queueing(&self) -> Arc<QueueingBoard> {
        self.queueing.clone()
    }

    /// When each peer's probes were last received, updated every 50 ms.
    pub fn heard(&self) -> Arc<HeardBoard> {
        self.heard.clone()
    }

    /// Hands the thread a new plan (ignored if unchanged).
    pub fn set_plan(&self, plan: Plan) {
        self.plan.send_if_modified(|cur| {
            if cur.as_ref() == Some(&plan) {
                false
            } else {
                *cur = Some(plan);
                true
            }
        });
    }
}

impl Drop for ProbeRunner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the probe thread publishes for the agent's other tasks.
struct Boards {
    queueing: Arc<QueueingBoard>,
    heard: Arc<HeardBoard>,
}

#[allow(clippy::too_many_arguments)]
fn run_thread(
    mut mesh: Mesh,
    mut governor: Governor,
    sockets: Vec<(u32, TsSocket)>,
    tc: TestClock,
    mut plan_rx: watch::Receiver<Option<Plan>>,
    evidence: mpsc::Sender<PortEvent>,
    summaries: mpsc::Sender<Summary>,
    boards: Boards,
    stop: Arc<AtomicBool>,
    netdevs: Arc<crate::link::NetdevEpochs>,
) {
    let mut bufs = RecvBufs::default();
    let mut rx = Vec::new();
    let mut tx = Vec::new();
    let mut unsent: Vec<PortEvent> = Vec::new();
    // Each NIC's up period as last shared by the link tracker.
    let mut periods: std::collections::BTreeMap<String, Option<Instant>> =
        std::collections::BTreeMap::new();
    let mut loss = loss::LossJudge::new(mesh.config().loss.clone());
    let mut jitter = jitter::JitterJudge::new(mesh.config().jitter.clone());
    let mut next_liveness = Instant::now() + LIVENESS_EVERY;
    let mut next_summary = Instant::now() + SUMMARY_EVERY;
    let mut send_errors = 0u64;
    let mut no_stamp = 0u64;
    let mut told_repeats = false;
    let mut over_budget = false;
    tracing::info!(nics = sockets.len(), "probe mesh running");
    while !stop.load(Ordering::Relaxed) {
        if plan_rx.has_changed().unwrap_or(false) {
            if let Some(p) = plan_rx.borrow_and_update().clone() {
                tracing::info!(
                    version = p.version,
                    self_id = p.self_id,
                    peers = p.peers.len(),
                    "probe plan adopted"
                );
                mesh.set_plan(&p, Instant::now());
                // Every path keeps its share at the governor's floor.
                governor.set_path_floor(mesh.min_rate());
                mesh.set_rate(governor.rate());
            }
        }
        // Sleep to the next tick. Nothing wakes the thread in between:
        // stamps are taken by the kernel, so reading them a tick late
        // costs no accuracy, and one wake-up serves every peer and socket.
        // While probing, the liveness check and the summary ride on the
        // ticks (at most a tick late) instead of waking the thread too.
        let now = Instant::now();
        let until = match mesh.next_due() {
            Some(tick) => tick,
            None => next_liveness.min(next_summary),
        };
        std::thread::sleep(until.min(now + MAX_SLEEP).saturating_duration_since(now));
        let now = Instant::now();
        for (rail, s) in &sockets {
            drain(
                s,
                *rail,
                &mut bufs,
                &mut tx,
                &mut rx,
                &mut mesh,
                &tc,
                now,
                &mut no_stamp,
            );
        }
        mesh.publish_outgoing(&boards.queueing);
        let ops = mesh.due(now);
        for (rail, s) in &sockets {
            let batch: Vec<(SocketAddrV4, &[u8; wire::PACKET_LEN])> = ops
                .iter()
                .filter(|op| op.rail == *rail)
                .flat_map(|op| [(op.to, &op.packets[0]), (op.to, &op.packets[1])])
                .collect();
            let mut at = 0;
            // Bounded: every round sends at least one or skips one.
            while at < batch.len() {
                match s.send_batch(&batch[at..]) {
                    Ok(0) => break,
                    Ok(n) => {
                        mesh.on_sent(n);
                        at += n;
                    }
                    Err(e) => {
                        // A NIC that is down refuses sends (ENETDOWN and the
                        // like); its silence is what the peers measure.
                        send_errors += 1;
                        if send_errors.is_power_of_two() {
                            tracing::debug!(rail, to = %batch[at].0, error = %e, send_errors, "probe send failed");
                        }
                        at += 1;
                    }
                }
            }
        }
        if now >= next_liveness {
            next_liveness = now + LIVENESS_EVERY;
            for (nic, up_since) in netdevs.snapshot() {
                mesh.set_netdev(&nic, up_since);
                periods.insert(nic, up_since);
            }
            // Each verdict names the up period it was judged in.
            let period = |nic: &str| Period::UpSince(periods.get(nic).copied().flatten());
            boards.heard.publish(mesh.heard());
            for c in mesh.check_liveness(now) {
                if c.alive {
                    tracing::warn!(nic = %c.nic, "probe evidence: the NIC carries probes again");
                } else {
                    tracing::warn!(nic = %c.nic, "probe evidence: the NIC is silent while its peers are alive");
                }
                unsent.push(PortEvent {
                    period: period(&c.nic),
                    netdev: c.nic,
                    active: c.alive,
                    source: Evidence::Probes,
                });
            }
            let counts = mesh.loss_counts(now);
            let verdicts = loss
                .observe(now, &counts)
                .into_iter()
                .map(|c| {
                    if c.lossy {
                        tracing::warn!(nic = %c.nic, loss_pct = c.loss_pct, peers = c.peers, lossy_peers = c.lossy_peers, "probe evidence: the NIC loses probes (gray link)");
                    } else {
                        tracing::warn!(nic = %c.nic, loss_pct = c.loss_pct, peers = c.peers, "probe evidence: the NIC no longer loses probes");
                    }
                    (c.nic, !c.lossy, Evidence::Loss)
                })
                .chain(jitter.observe(now, &counts).into_iter().map(|c| {
                    if c.delayed {
                        tracing::warn!(nic = %c.nic, late_pct = c.late_pct, peers = c.peers, delayed_peers = c.delayed_peers, "probe evidence: the NIC holds probes back (gray link)");
                    } else {
                        tracing::warn!(nic = %c.nic, late_pct = c.late_pct, peers = c.peers, "probe evidence: the NIC no longer holds probes back");
                    }
                    (c.nic, !c.delayed, Evidence::Delay)
                }));
            for (netdev, active, source) in verdicts {
                unsent.push(PortEvent {
                    period: period(&netdev),
                    netdev,
                    active,
                    source,
                });
            }
            // The tracker may be busy: keep what it could not take (only
            // the newest per NIC and kind of evidence matters).
            let mut keep = Vec::new();
            for e in unsent.drain(..) {
                match evidence.try_send(e) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(e)) => {
                        keep.retain(|k: &PortEvent| k.netdev != e.netdev || k.source != e.source);
                        keep.push(e);
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => return,
                }
            }
            unsent = keep;
        }
        if now >= next_summary {
            // Keep the period (a tick late at most), without bursts after
            // a stall.
            next_summary += SUMMARY_EVERY;
            if next_summary <= now {
                next_summary = now + SUMMARY_EVERY;
            }
            govern(&mut governor, &mut mesh, &mut over_budget, now);
            let s = Summary {
                at_ns: tc.apply(clock::realtime_ns()),
                plan_version: mesh.plan_version(),
                paths: mesh.summarise(now),
                bytes_sent: mesh.bytes_sent,
                pairs_per_s: mesh.rate(),
                max_pairs_per_s: governor.max_rate(),
                cpu_pct: governor.usage().map(|u| 100.0 * u),
                cpu_budget_pct: governor.budget_pct(),
            };
            tracing::debug!(counters = ?mesh.counters, no_stamp, send_errors, "probe mesh summary");
            if mesh.counters.tx_stamps_repeated > 0 && !told_repeats {
                told_repeats = true;
                tracing::info!(
                    repeated = mesh.counters.tx_stamps_repeated,
                    "probes are stamped more than once by devices in this kernel (veths into other namespaces); each probe's first transmit stamp is used"
                );
            }
            if let Err(mpsc::error::TrySendError::Closed(_)) = summaries.try_send(s) {
                return;
            }
        }
    }
    tracing::info!("probe mesh stopped");
}

/// Feeds the thread's CPU clock to the governor and applies its rate.
/// `stuck`: whether the thread was last seen over its budget at the
/// lowest rate (said once, not every window).
fn govern(g: &mut Governor, mesh: &mut Mesh, stuck: &mut bool, now: Instant) {
    let cpu = match sock::thread_cpu_ns() {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(error = %e, "thread CPU clock unreadable; rate unchanged");
            return;
        }
    };
    let Some(v) = g.observe(now, cpu) else {
        return;
    };
    let over_at_floor = g.enabled() && v.rate == g.min_rate() && 100.0 * v.usage > g.budget_pct();
    if over_at_floor && !*stuck {
        tracing::warn!(
            cpu_pct = 100.0 * v.usage,
            budget_pct = g.budget_pct(),
            rate = v.rate,
            "probe thread over its CPU budget at the lowest governed rate"
        );
    }
    *stuck = over_at_floor;
    if v.rate != v.rate_before {
        mesh.set_rate(v.rate);
        tracing::info!(
            cpu_pct = 100.0 * v.usage,
            budget_pct = g.budget_pct(),
            from = v.rate_before,
            to = v.rate,
            max = g.max_rate(),
            "probe rate governed (pairs/s per peer)"
        );
    }
}

/// Reads every waiting transmit stamp and datagram of one socket into the
/// mesh (bounded rounds).
#[allow(clippy::too_many_arguments)]
fn drain(
    s: &TsSocket,
    rail: u32,
    bufs: &mut RecvBufs,
    tx: &mut Vec<sock::TxStamp>,
    rx: &mut Vec<sock::Received>,
    mesh: &mut Mesh,
    tc: &TestClock,
    now: Instant,
    no_stamp: &mut u64,
) {
    // Stamps first: a peer's Rx record may close a pair sent last tick.
    for _ in 0..MAX_DRAIN_ROUNDS {
        tx.clear();
        match s.recv_tx_stamps(bufs, tx) {
            Ok(n) => {
                for t in tx.iter() {
                    if let Ok(p) = Probe::decode(&t.tail) {
                        mesh.on_tx_stamp(rail, &p, tc.apply(t.ts_ns), now);
                    }
                }
                if n < sock::BATCH {
                    break;
                }
            }
            Err(e) => {
                tracing::debug!(rail, error = %e, "error queue read failed");
                break;
            }
        }
    }
    for _ in 0..MAX_DRAIN_ROUNDS {
        rx.clear();
        match s.recv_batch(bufs, rx) {
            Ok(n) => {
                for r in rx.iter() {
                    let Some(ts) = r.ts_ns else {
                        *no_stamp += 1;
                        continue;
                    };
                    match Probe::decode(&r.data[..r.len.min(wire::PACKET_LEN)]) {
                        Ok(p) if r.len == wire::PACKET_LEN => {
                            mesh.on_probe(rail, r.from, &p, tc.apply(ts), now)
                        }
                        _ => mesh.counters.refused += 1,
                    }
                }
                if n < sock::BATCH {
                    break;
                }
            }
            Err(e) => {
                tracing::debug!(rail, error = %e, "probe receive failed");
                break;
            }
        }
    }
}

/// The IPv4 address of each named interface (the first one if several).
pub async fn interface_addrs(names: &[String]) -> Result<BTreeMap<String, Ipv4Addr>, String> {
    use futures::TryStreamExt;
    use netlink_packet_route::address::AddressAttribute;
    use netlink_packet_route::link::LinkAttribute;
    let (conn, handle, _) = rtnetlink::new_connection().map_err(|e| e.to_string())?;
    let task = tokio::spawn(conn);
    let mut index = BTreeMap::new();
    let mut links = handle.link().get().execute();
    while let Some(m) = links.try_next().await.map_err(|e| e.to_string())? {
        for a in &m.attributes {
            if let LinkAttribute::IfName(n) = a {
                if names.contains(n) {
                    index.insert(m.header.index, n.clone());
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    let mut addrs = handle.address().get().execute();
    while let Some(m) = addrs.try_next().await.map_err(|e| e.to_string())? {
        let Some(name) = index.get(&m.header.index) else {
            continue;
        };
        for a in &m.attributes {
            if let AddressAttribute::Address(std::net::IpAddr::V4(v4)) = a {
                out.entry(name.clone()).or_insert(*v4);
            }
        }
    }
    task.abort();
    Ok(out)
}

#[cfg(test)]
mod heard_tests {
    use super::*;

    #[test]
    fn the_heard_board_gives_ages_newest_first_and_at_most_the_cap() {
        let b = HeardBoard::default();
        let t0 = Instant::now();
        assert!(b.ages(t0).is_empty());
        b.publish(vec![
            ("h1".into(), t0),
            ("h2".into(), t0 + Duration::from_millis(30)),
        ]);
        let ages = b.ages(t0 + Duration::from_millis(100));
        let got: Vec<(&str, u32)> = ages.iter().map(|p| (p.host.as_str(), p.age_ms)).collect();
        assert_eq!(got, vec![("h2", 70), ("h1", 100)]);
        b.publish((0..200).map(|i| (format!("h{i}"), t0)).collect());
        assert_eq!(b.ages(t0).len(), proto::MAX_PEERS_HEARD);
    }
}
