//! The probe mesh's protocol state, without sockets (unit-testable).
//!
//! **Pairs.** On every *tick* (one wake-up for all peers) this host sends a
//! coded probe pair on each (peer, rail) path, over every rail both hosts
//! have. A peer with `n` such rails is due every `n / pairs_per_s`, so it
//! gets `pairs_per_s` pairs a second in all and each path
//! `pairs_per_s / n`; with two rails that is one wake-up per 20 ms at the
//! default rate instead of one per 10 ms, the same cadence on every path.
//! `pairs_per_s` is the rate in force ([`Mesh::rate`]): the configured one
//! unless the CPU governor lowered it ([`Mesh::set_rate`], never below
//! [`Mesh::min_rate`]). Hosts' ticks have independent phases. A pair has a sequence
//! number per (peer, rail), starting from the agent's start time in µs so a
//! restarted agent never reuses one.
//!
//! **Two-step stamps.** Transmit timestamps are known only after the send
//! (error queue), receive timestamps only at the receiver. Each probe
//! carries up to [`MAX_RECORDS`] records back to the same peer on the same
//! rail: `Tx` (my transmit stamps of an earlier pair of mine) and `Rx` (the
//! receive stamps of an earlier pair of the peer's). So both hosts end up
//! with all four stamps of every pair in both directions and each runs its
//! own [`PairEstimator`] per (peer, rail). A probe's first transmit stamp
//! is the one kept (see [`Mesh::on_tx_stamp`]).
//!
//! **Paths.** For the directed path peer → me on a rail this host counts
//! probes expected (from the peer's sequence numbers) and received, and
//! keeps the raw delays of completed pairs; the summary turns them into
//! one-way delays under the pair's clock line.
//!
//! **Outgoing queueing.** Each of my pairs that closes (its receive stamps
//! came back in an `Rx` record) is also one outgoing one-way delay sample
//! under the path's latest line; [`super::queueing`] keeps its baseline
//! and queueing, [`Mesh::publish_outgoing`] hands them to the agent.
//!
//! **Probe liveness of my NICs.** A NIC is *probe-dead* when nothing has
//! arrived on it for `silence` while at least two peers that have a NIC on
//! the same rail were heard on another rail within that time: they are
//! alive and probing, and all their probes to this NIC die (with one such
//! peer, its own dead NIC would look the same). One probe arriving revives
//! it. A host with one rail, or with fewer than two peers on the rail,
//! never declares a NIC probe-dead. A NIC whose netdev is down is not
//! judged, and one that came up is judged only by the silence since it came
//! up ([`Mesh::set_netdev`]): probes could not have arrived before; until
//! the first probe arrives after it came up (or since the mesh started),
//! the silence allowed is `up_grace` (2 s), not `silence`.
//!
//! Every queue here is bounded; a full one drops its oldest entry.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

use clocksync::{Direction, PairConfig, PairEstimator, Probe as Stamp, ProbePair};

use super::loss::{PeerCounts, RailCounts};
use super::queueing::{OutgoingTracker, QueueingBoard};
use super::wire::{Probe, Record, Records, MAX_RECORDS, PACKET_LEN, SETTLED_RAILS, SETTLED_VALID};

/// Pairs awaiting their other stamps, per path and direction.
const PENDING_PAIRS: usize = 64;
/// Records waiting to be carried back, per path and kind.
const PENDING_RECORDS: usize = 8;
/// Delay samples kept per path between summaries.
const MAX_DELAYS: usize = 4096;
/// Peers (with a NIC on the rail, heard on another) needed to call one of
/// this host's NICs probe-dead.
const MIN_WITNESSES: usize = 2;
/// Per-second window estimates kept per path for the drift fit (s).
const DRIFT_HISTORY: usize = 16;
/// Raw delays kept per path for the delay judge (its window at the
/// highest pair rate, [`MAX_PAIRS_PER_S`] over one rail, is a second).
const RECENT_DELAYS: usize = 1_024;

/// Tuning of the mesh.
#[derive(Debug, Clone)]
pub struct MeshConfig {
    /// Coded pairs per second to each peer (over all rails): the most the
    /// mesh sends; the CPU governor may lower it. Default 100.
    pub pairs_per_s: u32,
    /// CPU budget of the probe thread, % of one core (0: no governor; see
    /// [`super::governor`]). Default 1.
    pub cpu_budget_pct: f64,
    /// Purity threshold: |rx gap − tx gap| (ns). Default 2 µs.
    pub purity_ns: u64,
    /// Silence after which a NIC is probe-dead (see module docs). Default
    /// 400 ms.
    pub silence: Duration,
    /// After a NIC comes up, how long it may stay silent before a probe
    /// has reached it (the kernel activates a device's queue up to a second
    /// after carrier returns, and the peers' neighbour entries may need
    /// refreshing). Default 2 s; once a probe arrived, `silence` applies.
    pub up_grace: Duration,
    /// The per-pair estimator's settings.
    pub pair: PairConfig,
    /// When a NIC losing probes is Degraded ([`super::loss`]).
    pub loss: super::loss::LossConfig,
    /// When a NIC delaying probes unevenly is Degraded ([`super::jitter`]).
    pub jitter: super::jitter::JitterConfig,
}

impl Default for MeshConfig {
    fn default() -> Self {
        Self {
            pairs_per_s: 100,
            cpu_budget_pct: 1.0,
            purity_ns: 2_000,
            silence: Duration::from_millis(400),
            up_grace: Duration::from_secs(2),
            pair: PairConfig {
                // Software stamps jitter by more than a veth round trip.
                max_overlap_ns: 2_000.0,
                ..PairConfig::default()
            },
            loss: super::loss::LossConfig::default(),
            jitter: super::jitter::JitterConfig::default(),
        }
    }
}

/// Most pairs per second per peer accepted.
pub const MAX_PAIRS_PER_S: u32 = 1_000;
/// Pairs/s each path needs at least (the CPU governor's floor is this times
/// the most paths a peer has): 20 pure pairs per 2 s estimator window at
/// full purity, a pair every 100 ms against the 400 ms probe-dead silence.
pub const MIN_PAIRS_PER_PATH: u32 = 10;

/// A peer's data NIC on one rail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerNic {
    pub nic: String,
    pub addr: SocketAddrV4,
}

/// A peer as the plan gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSpec {
    pub host: String,
    pub id: u32,
    pub nics: BTreeMap<u32, PeerNic>,
}

/// Whom to probe.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    pub self_id: u32,
    pub version: u64,
    pub peers: Vec<PeerSpec>,
}

/// One of this host's data NICs.
#[derive(Debug, Clone)]
pub struct LocalNic {
    pub name: String,
    pub rail: u32,
}

/// Two probes to put on the wire.
#[derive(Debug, Clone)]
pub struct SendOp {
    pub rail: u32,
    pub to: SocketAddrV4,
    pub packets: [[u8; PACKET_LEN]; 2],
}

/// A change of a NIC's probe liveness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicLiveness {
    pub nic: String,
    pub alive: bool,
}

/// Counters of what the mesh saw (for logs and tests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    pub probes_sent: u64,
    pub probes_received: u64,
    pub pairs_pure: u64,
    pub pairs_impure: u64,
    pub refused: u64,
    /// Further transmit stamps of a probe whose pair was still pending
    /// (ignored: see [`Mesh::on_tx_stamp`]; repeats arriving after the pair
    /// closed are dropped uncounted with any other stray stamp).
    pub tx_stamps_repeated: u64,
}

#[derive(Debug, Clone)]
struct OutPair {
    seq: u64,
    tx: [Option<i64>; 2],
    rx: Option<[i64; 2]>,
}

#[derive(Debug, Clone)]
struct InPair {
    seq: u64,
    rx: [Option<i64>; 2],
    tx: Option<[i64; 2]>,
}

/// One (peer, rail) path, both directions.
struct PathState {
    next_seq: u64,
    out: VecDeque<OutPair>,
    inc: VecDeque<InPair>,
    tx_records: VecDeque<(u64, [i64; 2])>,
    rx_records: VecDeque<(u64, [i64; 2])>,
    est: PairEstimator,
    /// Highest sequence seen from the peer on this path, and when.
    last_in_seq: u64,
    last_in_at: Option<Instant>,
    /// The peer's pair rate on this path (pairs/s, smoothed).
    in_rate: f64,
    /// Probes already counted as expected during a silence that the next
    /// arrival's sequence number will account for again.
    presumed: u64,
    expected: u64,
    received: u64,
    /// `expected` and `received` since the path began, never reset (the
    /// loss judge's windows, [`super::loss`]).
    tot_expected: u64,
    tot_received: u64,
    /// (rx time, raw delay rx − tx) of the peer's first probes.
    delays: Vec<(i64, i64)>,
    /// (when completed, raw delay) of the peer's latest pairs, for the
    /// delay judge ([`super::jitter`]).
    recent: VecDeque<(Instant, i64)>,
    /// The last [`DRIFT_HISTORY`] window estimates (centre, offset).
    history: VecDeque<(i64, f64)>,
    /// The latest disciplined line (from the last summary).
    line: Option<clocksync::Estimate>,
    /// Outgoing delays me → peer, baseline and queueing.
    outgoing: OutgoingTracker,
}

impl PathState {
    fn new(cfg: &PairConfig, first_seq: u64) -> Self {
        Self {
            next_seq: first_seq,
            out: VecDeque::new(),
            inc: VecDeque::new(),
            tx_records: VecDeque::new(),
            rx_records: VecDeque::new(),
            est: PairEstimator::new(cfg.clone()).expect("validated pair config"),
            last_in_seq: 0,
            last_in_at: None,
            in_rate: 0.0,
            presumed: 0,
            expected: 0,
            received: 0,
            tot_expected: 0,
            tot_received: 0,
            delays: Vec::new(),
            recent: VecDeque::new(),
            history: VecDeque::new(),
            line: None,
            outgoing: OutgoingTracker::default(),
        }
    }

    /// Disciplines the window estimate with the recent ones: a least-squares
    /// line through the last windows' offsets gives the drift over up to
    /// [`DRIFT_HISTORY`] s (a 2 s window alone measures it poorly, and its
    /// error, times the extrapolation to "now", dominates the offset error)
    /// and a less noisy offset at the newest window's centre. A jump
    /// (a clock step) restarts the history.
    fn discipline(&mut self, e: clocksync::Estimate) -> clocksync::Estimate {
        if let Some(&(t, o)) = self.history.back() {
            let predicted = o + e.drift_ppb * 1e-9 * (e.at_ns - t) as f64;
            if (e.offset_ns - predicted).abs() > 10.0 * e.error_bound_ns + 10_000.0 || e.at_ns <= t
            {
                self.history.clear();
            }
        }
        push_bounded(&mut self.history, DRIFT_HISTORY, (e.at_ns, e.offset_ns));
        let n = self.history.len();
        if n < 4 {
            return e;
        }
        // Times in seconds relative to the newest window (f64-safe).
        let pts: Vec<(f64, f64)> = self
            .history
            .iter()
            .map(|&(t, o)| ((t - e.at_ns) as f64 * 1e-9, o - e.offset_ns))
            .collect();
        let nf = n as f64;
        let mx = pts.iter().map(|p| p.0).sum::<f64>() / nf;
        let my = pts.iter().map(|p| p.1).sum::<f64>() / nf;
        let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
        if sxx <= 0.0 {
            return e;
        }
        let slope = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum::<f64>() / sxx;
        let intercept = my - slope * mx; // at the newest centre
        let resid: f64 = pts
            .iter()
            .map(|p| (p.1 - intercept - slope * p.0).powi(2))
            .sum::<f64>()
            / (nf - 2.0);
        let se_slope = (resid / sxx).sqrt();
        clocksync::Estimate {
            offset_ns: e.offset_ns + intercept,
            drift_ppb: slope, // ns per s = ppb
            drift_error_ppb: 2.0 * se_slope,
            ..e
        }
    }
}

/// Whether a peer's announced settled rails include `rail` (a peer that
/// does not say, and a rail the bitmap cannot name, count as settled).
fn settled_on(bits: u32, rail: u32) -> bool {
    bits & SETTLED_VALID == 0 || rail >= SETTLED_RAILS || bits & (1 << rail) != 0
}

/// How often a peer with `paths` paths is due (one pair on each) for it to
/// get `pairs_per_s` pairs a second in all.
fn interval(pairs_per_s: u32, paths: usize) -> Duration {
    Duration::from_secs_f64(paths.max(1) as f64 / f64::from(pairs_per_s.max(1)))
}

fn push_bounded<T>(q: &mut VecDeque<T>, cap: usize, v: T) {
    if q.len() >= cap {
        q.pop_front();
    }
    q.push_back(v);
}

struct PeerState {
    spec: PeerSpec,
    next_due: Instant,
    last_heard: Option<Instant>,
    /// The peer's settled rails, from its latest probe ([`Probe::settled`]).
    settled: u32,
    paths: BTreeMap<u32, PathState>,
}

/// The per-(peer, rail) outputs of a summary.
#[derive(Debug, Clone, PartialEq)]
pub struct PathSummary {
    pub peer: String,
    pub rail: u32,
    pub nic: String,
    pub peer_nic: String,
    pub estimate: Option<clocksync::Estimate>,
    pub ntp: Option<clocksync::NtpEstimate>,
    pub expected: u64,
    pub received: u64,
    /// One-way delays (ns) under the pair line, sorted; raw when
    /// `estimate` is None.
    pub delays_ns: Vec<i64>,
}

/// The mesh.
pub struct Mesh {
    cfg: MeshConfig,
    self_id: u32,
    plan_version: u64,
    local: BTreeMap<u32, LocalNic>,
    last_rx: BTreeMap<u32, Instant>,
    probe_dead: BTreeMap<u32, bool>,
    /// Per rail, what netlink says of the NIC ([`Mesh::set_netdev`]): up
    /// since when (`Some`), or down (`None`); absent: up since `started`.
    netdev: BTreeMap<u32, Option<Instant>>,
    peers: BTreeMap<u32, PeerState>,
    /// The rate probed at now (≤ `cfg.pairs_per_s`; see [`Mesh::set_rate`]).
    rate: u32,
    /// Ticks that sent something: rotates the order of a tick's pairs.
    rounds: u64,
    first_seq: u64,
    started: Instant,
    pub counters: Counters,
    pub bytes_sent: u64,
}

impl Mesh {
    /// `first_seq`: where this run's sequence numbers start (the agent uses
    /// its start time in µs).
    pub fn new(
        cfg: MeshConfig,
        local: Vec<LocalNic>,
        first_seq: u64,
        now: Instant,
    ) -> Result<Self, String> {
        if cfg.pairs_per_s == 0 || cfg.pairs_per_s > MAX_PAIRS_PER_S {
            return Err(format!(
                "probe rate {} pairs/s per peer: want 1..={MAX_PAIRS_PER_S}",
                cfg.pairs_per_s
            ));
        }
        super::governor::check_budget(cfg.cpu_budget_pct).map_err(|e| e.to_string())?;
        PairEstimator::new(cfg.pair.clone()).map_err(|e| e.to_string())?;
        let rate = cfg.pairs_per_s;
        let local: BTreeMap<u32, LocalNic> = local.into_iter().map(|n| (n.rail, n)).collect();
        Ok(Self {
            probe_dead: local.keys().map(|r| (*r, false)).collect(),
            netdev: BTreeMap::new(),
            last_rx: BTreeMap::new(),
            cfg,
            self_id: u32::MAX,
            plan_version: 0,
            local,
            peers: BTreeMap::new(),
            rate,
            rounds: 0,
            first_seq: first_seq.max(1),
            started: now,
            counters: Counters::default(),
            bytes_sent: 0,
        })
    }

    pub fn plan_version(&self) -> u64 {
        self.plan_version
    }

    pub fn self_id(&self) -> u32 {
        self.self_id
    }

    /// The lowest rate (pairs/s per peer) that still gives every path
    /// [`MIN_PAIRS_PER_PATH`] (capped at the configured rate).
    pub fn min_rate(&self) -> u32 {
        let paths = self
            .peers
            .values()
            .map(|p| p.paths.len())
            .max()
            .unwrap_or(1);
        (MIN_PAIRS_PER_PATH * paths.max(1) as u32).min(self.cfg.pairs_per_s)
    }

    /// The mesh's settings.
    pub fn config(&self) -> &MeshConfig {
        &self.cfg
    }

    /// The pairs/s per peer the mesh probes at now.
    pub fn rate(&self) -> u32 {
        self.rate
    }

    /// Probes at `pairs_per_s` per peer from now on (clamped to
    /// 1..=the configured rate). Each peer's next pair keeps its due time;
    /// the new cadence applies from the one after.
    pub fn set_rate(&mut self, pairs_per_s: u32) {
        self.rate = pairs_per_s.clamp(1, self.cfg.pairs_per_s);
    }

    /// Adopts a plan: peers that stay keep their state (estimators,
    /// sequence numbers); new ones start with a random phase.
    pub fn set_plan(&mut self, plan: &Plan, now: Instant) {
        if plan.self_id != self.self_id {
            // A new identity invalidates every path.
            self.peers.clear();
        }
        self.self_id = plan.self_id;
        self.plan_version = plan.version;
        // New peers join the current tick schedule (one wake-up for all).
        let first = interval(self.rate, self.local.len());
        let tick = self
            .peers
            .values()
            .map(|p| p.next_due)
            .min()
            .unwrap_or_else(|| now + first.mul_f64(rand::random::<f64>()));
        let mut next = BTreeMap::new();
        for spec in &plan.peers {
            if spec.id == plan.self_id {
                continue;
            }
            let mut p = self.peers.remove(&spec.id).unwrap_or_else(|| PeerState {
                spec: spec.clone(),
                next_due: tick,
                last_heard: None,
                settled: 0,
                paths: BTreeMap::new(),
            });
            p.spec = spec.clone();
            let rails: Vec<u32> = self
                .local
                .keys()
                .filter(|r| spec.nics.contains_key(r))
                .copied()
                .collect();
            p.paths.retain(|r, _| rails.contains(r));
            for r in rails {
                p.paths
                    .entry(r)
                    .or_insert_with(|| PathState::new(&self.cfg.pair, self.first_seq));
            }
            next.insert(spec.id, p);
        }
        self.peers = next;
    }

    /// When the next pair is due (None: nobody to probe).
    pub fn next_due(&self) -> Option<Instant> {
        self.peers
            .values()
            .filter(|p| !p.paths.is_empty())
            .map(|p| p.next_due)
            .min()
    }

    /// The pairs due at `now`, ready to send. Call [`Mesh::on_sent`] for
    /// each afterwards.
    pub fn due(&mut self, now: Instant) -> Vec<SendOp> {
        let mut out = Vec::new();
        let self_id = self.self_id;
        let settled = self.settled_rails(now);
        let rate = self.rate;
        for p in self.peers.values_mut() {
            if p.next_due > now || p.paths.is_empty() {
                continue;
            }
            // Keep the cadence; never burst to catch up (every peer is
            // reset alike, so the schedule stays shared).
            let every = interval(rate, p.paths.len());
            p.next_due += every;
            if p.next_due <= now {
                p.next_due = now + every;
            }
            for (&rail, path) in p.paths.iter_mut() {
                let Some(nic) = p.spec.nics.get(&rail) else {
                    continue;
                };
                let to = nic.addr;
                let seq = path.next_seq;
                path.next_seq += 1;
                let mut records = Records::new();
                while records.len() < MAX_RECORDS {
                    let before = records.len();
                    if let Some((s, ts)) = path.tx_records.pop_front() {
                        records.push(Record::Tx { seq: s, ts });
                    }
                    if records.len() < MAX_RECORDS {
                        if let Some((s, ts)) = path.rx_records.pop_front() {
                            records.push(Record::Rx { seq: s, ts });
                        }
                    }
                    if records.len() == before {
                        break;
                    }
                }
                push_bounded(
                    &mut path.out,
                    PENDING_PAIRS,
                    OutPair {
                        seq,
                        tx: [None, None],
                        rx: None,
                    },
                );
                let probe = |index: u8| Probe {
                    index,
                    rail: rail as u8,
                    from: self_id,
                    to: p.spec.id,
                    seq,
                    records: records.clone(),
                    settled,
                };
                out.push(SendOp {
                    rail,
                    to,
                    packets: [probe(0).encode(), probe(1).encode()],
                });
            }
        }
        // The first pair of a batch fares worst (its stamps take the cold
        // path, and the receiver's softirq often splits it): always putting
        // the same peer first left that peer with few pure pairs, so its
        // clock never converged. Rotating spreads the cost over all peers.
        if !out.is_empty() {
            let k = (self.rounds % out.len() as u64) as usize;
            out.rotate_left(k);
            self.rounds = self.rounds.wrapping_add(1);
        }
        out
    }

    /// Records how many probes left.
    pub fn on_sent(&mut self, probes: usize) {
        self.counters.probes_sent += probes as u64;
        self.bytes_sent += (probes * PACKET_LEN) as u64;
    }

    /// A transmit timestamp from the error queue of the socket on `rail`.
    ///
    /// Only a probe's first stamp counts. The kernel stamps a datagram in
    /// every driver that transmits it while it still belongs to the
    /// socket, and a datagram keeps its socket across veth into other
    /// namespaces: when the fabric is in the same kernel (the netns
    /// testbed) the sender gets one stamp per veth on the way, the last
    /// taken after the fabric's queues. The stamps of one datagram are
    /// queued in hop order, so the first is the one the socket's own
    /// device took, which is what the probe measures from. (An agent whose
    /// socket sits behind devices of its own host, say in a container
    /// behind the host's bridge, would want the last one; the agent runs
    /// in the host's namespace on the data NIC itself.) A first stamp the
    /// error queue had no room for would let the next one stand in:
    /// [`super::sock::RCVBUF_BYTES`] keeps that room.
    pub fn on_tx_stamp(&mut self, rail: u32, probe: &Probe, ts: i64, now: Instant) {
        if probe.from != self.self_id || u32::from(probe.rail) != rail {
            return;
        }
        let purity = self.cfg.purity_ns;
        let Some(path) = self
            .peers
            .get_mut(&probe.to)
            .and_then(|p| p.paths.get_mut(&rail))
        else {
            return;
        };
        let Some(i) = path.out.iter().position(|o| o.seq == probe.seq) else {
            return;
        };
        let slot = &mut path.out[i].tx[usize::from(probe.index)];
        if slot.is_some() {
            self.counters.tx_stamps_repeated += 1;
            return;
        }
        *slot = Some(ts);
        if let [Some(a), Some(b)] = path.out[i].tx {
            push_bounded(&mut path.tx_records, PENDING_RECORDS, (probe.seq, [a, b]));
            if let Some(rx) = path.out[i].rx {
                path.out.remove(i);
                forward_pair(path, &mut self.counters, [a, b], rx, purity, now);
            }
        }
    }

    /// A probe received on the socket of `rail` from `from` at `rx_ts`
    /// (this host's clock).
    pub fn on_probe(
        &mut self,
        rail: u32,
        from: SocketAddrV4,
        probe: &Probe,
        rx_ts: i64,
        now: Instant,
    ) {
        let purity = self.cfg.purity_ns;
        let ok = probe.to == self.self_id
            && u32::from(probe.rail) == rail
            && self
                .peers
                .get(&probe.from)
                .and_then(|p| p.spec.nics.get(&rail))
                .is_some_and(|n| n.addr.ip() == from.ip());
        if !ok {
            self.counters.refused += 1;
            return;
        }
        self.counters.probes_received += 1;
        self.last_rx.insert(rail, now);
        let p = self.peers.get_mut(&probe.from).expect("checked above");
        p.last_heard = Some(now);
        p.settled = probe.settled;
        let Some(path) = p.paths.get_mut(&rail) else {
            return;
        };
        // Loss accounting by sequence number.
        if probe.seq > path.last_in_seq {
            let new = if path.last_in_seq == 0 {
                1
            } else {
                (probe.seq - path.last_in_seq).min(1_000_000)
            };
            if let Some(last) = path.last_in_at {
                let dt = now.saturating_duration_since(last).as_secs_f64();
                if dt > 0.0 {
                    let inst = new as f64 / dt;
                    path.in_rate = if path.in_rate == 0.0 {
                        inst
                    } else {
                        0.9 * path.in_rate + 0.1 * inst
                    };
                }
            }
            let more = (2 * new).saturating_sub(path.presumed);
            path.expected += more;
            path.tot_expected += more;
            path.presumed = 0;
            path.last_in_seq = probe.seq;
            path.last_in_at = Some(now);
        } else if path.last_in_seq - probe.seq > PENDING_PAIRS as u64 * 16 {
            // The peer restarted with lower numbers (its clock stepped
            // back): start over.
            path.inc.clear();
            path.last_in_seq = probe.seq;
            path.expected += 2;
            path.tot_expected += 2;
        }
        path.received += 1;
        path.tot_received += 1;
        let i = match path.inc.iter().position(|x| x.seq == probe.seq) {
            Some(i) => i,
            None => {
                push_bounded(
                    &mut path.inc,
                    PENDING_PAIRS,
                    InPair {
                        seq: probe.seq,
                        rx: [None, None],
                        tx: None,
                    },
                );
                path.inc.len() - 1
            }
        };
        path.inc[i].rx[usize::from(probe.index)] = Some(rx_ts);
        if let [Some(a), Some(b)] = path.inc[i].rx {
            if !path.rx_records.iter().any(|(s, _)| *s == probe.seq) {
                push_bounded(&mut path.rx_records, PENDING_RECORDS, (probe.seq, [a, b]));
            }
            if let Some(tx) = path.inc[i].tx {
                path.inc.remove(i);
                reverse_pair(path, &mut self.counters, tx, [a, b], purity, now);
            }
        }
        for r in &probe.records {
            match *r {
                Record::Tx { seq, ts } => {
                    let Some(j) = path.inc.iter().position(|x| x.seq == seq) else {
                        continue;
                    };
                    if let [Some(a), Some(b)] = path.inc[j].rx {
                        path.inc.remove(j);
                        reverse_pair(path, &mut self.counters, ts, [a, b], purity, now);
                    } else {
                        path.inc[j].tx = Some(ts);
                    }
                }
                Record::Rx { seq, ts } => {
                    let Some(j) = path.out.iter().position(|x| x.seq == seq) else {
                        continue;
                    };
                    if let [Some(a), Some(b)] = path.out[j].tx {
                        path.out.remove(j);
                        forward_pair(path, &mut self.counters, [a, b], ts, purity, now);
                    } else {
                        path.out[j].rx = Some(ts);
                    }
                }
            }
        }
    }

    /// What netlink says of one of this host's NICs: up since `up_since`,
    /// or down (`None`). A NIC is judged only while it is up, and its
    /// silence counts from when it came up at the earliest: probes cannot
    /// have arrived before (a repaired NIC is not condemned for the
    /// outage). While it is down its verdict is dropped, without a report:
    /// the link tracker forgets it too when the NIC comes back.
    pub fn set_netdev(&mut self, nic: &str, up_since: Option<Instant>) {
        let Some(rail) = self
            .local
            .iter()
            .find(|(_, n)| n.name == nic)
            .map(|(r, _)| *r)
        else {
            return;
        };
        if up_since.is_none() {
            self.probe_dead.insert(rail, false);
        }
        self.netdev.insert(rail, up_since);
    }

    /// This host's settled rails, as its probes announce them
    /// ([`Probe::settled`]): those whose NIC netlink has had up for the up
    /// grace at least (one netlink never reported counts as settled:
    /// nothing says otherwise). A NIC just up may
    /// not carry probes yet — its peers may still be resolving its address
    /// or its own, after an outage that lost their requests — so its peers
    /// do not call their own NIC on that rail silent for want of its
    /// probes.
    fn settled_rails(&self, now: Instant) -> u32 {
        let mut bits = SETTLED_VALID;
        for rail in self.local.keys().filter(|r| **r < SETTLED_RAILS) {
            let settled = match self.netdev.get(rail) {
                Some(None) => false,
                Some(Some(up)) => now.saturating_duration_since(*up) >= self.cfg.up_grace,
                None => true,
            };
            if settled {
                bits |= 1 << rail;
            }
        }
        bits
    }

    /// Probe-liveness changes of this host's NICs at `now`.
    pub fn check_liveness(&mut self, now: Instant) -> Vec<NicLiveness> {
        let silence = self.cfg.silence;
        let mut out = Vec::new();
        if self.local.len() < 2 || now.saturating_duration_since(self.started) < silence {
            return out;
        }
        for (rail, nic) in &self.local {
            let up_since = match self.netdev.get(rail) {
                // Down: netlink speaks for it.
                Some(None) => continue,
                Some(Some(t)) => *t,
                None => self.started,
            };
            let last_rx = self.last_rx.get(rail).copied();
            // Until a probe has arrived since the NIC came up, the longer
            // grace: the path may not carry anything yet.
            let limit = if last_rx.is_some_and(|r| r >= up_since) {
                silence
            } else {
                silence.max(self.cfg.up_grace)
            };
            let last = last_rx.unwrap_or(self.started).max(up_since);
            let silent = now.saturating_duration_since(last) >= limit;
            // At least two peers on this rail heard recently (on another
            // rail): one peer alone cannot tell its dead NIC from ours. A
            // peer whose own NIC on the rail is not settled (just up, by
            // its latest probe) is no witness: its probes may not be able
            // to arrive yet.
            let witnesses = self
                .peers
                .values()
                .filter(|p| {
                    p.spec.nics.contains_key(rail)
                        && p.last_heard
                            .is_some_and(|h| now.saturating_duration_since(h) < silence)
                        && settled_on(p.settled, *rail)
                })
                .count();
            let evidence = witnesses >= MIN_WITNESSES;
            let dead = silent && evidence;
            let was = self.probe_dead.get(rail).copied().unwrap_or(false);
            // Revival needs a probe (not just the evidence going away).
            let now_dead = if was { silent } else { dead };
            if now_dead != was {
                self.probe_dead.insert(*rail, now_dead);
                out.push(NicLiveness {
                    nic: nic.name.clone(),
                    alive: !now_dead,
                });
            }
        }
        out
    }

    /// Per rail of this host, what the loss and delay judges
    /// ([`super::loss`], [`super::jitter`]) need: since when the NIC is up
    /// (None: down), whether it may be judged now (up for the up grace at
    /// least, not probe-dead: silence is [`Mesh::check_liveness`]'s to
    /// judge), and each peer's probe totals and the raw delays of its pairs
    /// of the delay window on the rail, with whether it is a witness (heard
    /// lately on any rail, its own NIC on the rail settled).
    pub fn loss_counts(&self, now: Instant) -> Vec<RailCounts> {
        let silence = self.cfg.silence;
        let window = self.cfg.jitter.window;
        self.local
            .iter()
            .map(|(rail, nic)| {
                let up_since = match self.netdev.get(rail) {
                    Some(t) => *t,
                    None => Some(self.started),
                };
                let judged = up_since
                    .is_some_and(|t| now.saturating_duration_since(t) >= self.cfg.up_grace)
                    && !self.probe_dead.get(rail).copied().unwrap_or(false);
                let peers = self
                    .peers
                    .iter()
                    .filter_map(|(id, p)| {
                        let path = p.paths.get(rail)?;
                        let witness = p
                            .last_heard
                            .is_some_and(|h| now.saturating_duration_since(h) < silence)
                            && settled_on(p.settled, *rail);
                        let delays = super::jitter::samples(&path.recent, now, window);
                        Some(PeerCounts {
                            peer: *id,
                            expected: path.tot_expected,
                            received: path.tot_received,
                            witness,
                            delays,
                        })
                    })
                    .collect();
                RailCounts {
                    rail: *rail,
                    nic: nic.name.clone(),
                    up_since,
                    judged,
                    peers,
                }
            })
            .collect()
    }

    /// Each peer whose probes this host has received: its host name and
    /// when the last one arrived (on any rail).
    pub fn heard(&self) -> Vec<(String, Instant)> {
        self.peers
            .values()
            .filter_map(|p| Some((p.spec.host.clone(), p.last_heard?)))
            .collect()
    }

    /// The summary of every path since the last call (counters reset).
    ///
    /// A path that has gone silent while its peer is still heard on another
    /// rail counts the probes it should have carried (at the rate it had)
    /// as lost now, not only once a probe arrives again: a dead path shows
    /// 100 % loss while it is dead.
    pub fn summarise(&mut self, now: Instant) -> Vec<PathSummary> {
        let mut out = Vec::new();
        let silence = self.cfg.silence;
        for p in self.peers.values_mut() {
            let peer_alive = p
                .last_heard
                .is_some_and(|h| now.saturating_duration_since(h) < silence);
            for (rail, path) in p.paths.iter_mut() {
                if let (true, Some(last)) = (peer_alive, path.last_in_at) {
                    let silent = now.saturating_duration_since(last).as_secs_f64();
                    // One pair interval of slack for the one in flight.
                    let missing = ((silent * path.in_rate).floor() as u64).saturating_sub(1) * 2;
                    if missing > path.presumed {
                        path.expected += missing - path.presumed;
                        path.tot_expected += missing - path.presumed;
                        path.presumed = missing;
                    }
                }
                let estimate = match path.est.estimate() {
                    Ok(e) => Some(path.discipline(e)),
                    Err(clocksync::PairError::NotSeparable { .. }) => {
                        // Inconsistent samples (a clock step): start over.
                        tracing::warn!(peer = %p.spec.host, rail, "clock samples inconsistent; restarting the estimate");
                        path.est.clear();
                        path.history.clear();
                        None
                    }
                    Err(e) => {
                        tracing::debug!(peer = %p.spec.host, rail, error = %e, "no clock estimate on this path this second");
                        None
                    }
                };
                if estimate != path.line {
                    path.outgoing.reline(path.line.as_ref(), estimate.as_ref());
                    path.line = estimate.clone();
                }
                let ntp = path
                    .est
                    .ntp_estimate(estimate.as_ref().map(|e| e.drift_ppb))
                    .ok();
                let mut delays_ns: Vec<i64> = path
                    .delays
                    .drain(..)
                    .map(|(t, raw)| match &estimate {
                        // raw = owd − (peer − me); add the line back.
                        Some(e) => raw.saturating_add(e.offset_at(t).round() as i64),
                        None => raw,
                    })
                    .collect();
                delays_ns.sort_unstable();
                out.push(PathSummary {
                    peer: p.spec.host.clone(),
                    rail: *rail,
                    nic: self
                        .local
                        .get(rail)
                        .map(|n| n.name.clone())
                        .unwrap_or_default(),
                    peer_nic: p
                        .spec
                        .nics
                        .get(rail)
                        .map(|n| n.nic.clone())
                        .unwrap_or_default(),
                    estimate,
                    ntp,
                    expected: std::mem::take(&mut path.expected),
                    received: std::mem::take(&mut path.received),
                    delays_ns,
                });
            }
        }
        out
    }

    /// Copies every path's outgoing sample made since the last call onto
    /// `board` (one lock; no allocation for paths already on it).
    pub fn publish_outgoing(&mut self, board: &QueueingBoard) {
        let version = self.plan_version;
        let fresh = self.peers.values_mut().flat_map(|p| {
            let spec = &p.spec;
            p.paths.iter_mut().filter_map(move |(rail, path)| {
                let s = path.outgoing.take_fresh()?;
                let addr = *spec.nics.get(rail)?.addr.ip();
                Some((addr, spec.host.as_str(), *rail, s))
            })
        });
        board.publish(version, fresh);
    }

    /// The latest outgoing sample of the path to `peer` on `rail`.
    pub fn outgoing(&self, peer: u32, rail: u32) -> Option<super::queueing::OutgoingSample> {
        self.peers.get(&peer)?.paths.get(&rail)?.outgoing.latest()
    }

    /// Peers and rails with a path (for tests and logs).
    pub fn paths(&self) -> Vec<(u32, u32)> {
        self.peers
            .iter()
            .flat_map(|(id, p)| p.paths.keys().map(move |r| (*id, *r)))
            .collect()
    }
}

/// A coded pair from its two transmit and two receive stamps.
fn coded(tx: [i64; 2], rx: [i64; 2]) -> ProbePair {
    let stamp = |i: usize| Stamp {
        tx_ns: tx[i],
        rx_ns: rx[i],
    };
    ProbePair {
        first: stamp(0),
        second: stamp(1),
    }
}

/// My pair to the peer is complete: a forward sample and an outgoing
/// delay.
fn forward_pair(
    path: &mut PathState,
    counters: &mut Counters,
    tx: [i64; 2],
    rx: [i64; 2],
    purity: u64,
    now: Instant,
) {
    if let Some(raw) = rx[0].checked_sub(tx[0]) {
        path.outgoing.add(tx[0], raw, path.line.as_ref(), now);
    }
    add(path, counters, Direction::Forward, &coded(tx, rx), purity);
}

/// The peer's pair to me is complete: a reverse sample and a delay.
fn reverse_pair(
    path: &mut PathState,
    counters: &mut Counters,
    tx: [i64; 2],
    rx: [i64; 2],
    purity: u64,
    now: Instant,
) {
    if let Some(d) = rx[0].checked_sub(tx[0]) {
        if path.delays.len() < MAX_DELAYS {
            path.delays.push((rx[0], d));
        }
        push_bounded(&mut path.recent, RECENT_DELAYS, (now, d));
    }
    add(path, counters, Direction::Reverse, &coded(tx, rx), purity);
}

fn add(
    path: &mut PathState,
    counters: &mut Counters,
    dir: Direction,
    pair: &ProbePair,
    purity: u64,
) {
    match path.est.add_pair(dir, pair, purity) {
        Ok(true) => counters.pairs_pure += 1,
        Ok(false) => counters.pairs_impure += 1,
        Err(e) => tracing::debug!(error = %e, "probe sample not used"),
    }
}

#[cfg(test)]
mod tests;
