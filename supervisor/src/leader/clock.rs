//! The leader's clock service: per-second probe summaries in, a network
//! clock solution, per-path one-way delays, probe evidence and committed
//! clock states out (DESIGN.md flow 3).
//!
//! Everything here is leader memory, never replicated: the latest
//! [`PeerClock`](proto::v1::PeerClock) per (reporter, peer, rail), a ring of
//! per-second [`PathStats`](proto::v1::PathStats) per directed path, and when
//! each host's probes were last received by a peer (the probe evidence
//! [`crate::leader::liveness`] needs before declaring a host Down). A new leader
//! starts empty and is rebuilt by the next summaries, within seconds; a
//! supervisor that stops leading forgets it all.
//!
//! **The solve** ([`run`], every second while leading): one edge per host
//! pair and rail from reports at most [`CLOCK_FRESH`] old — both ends report
//! the same probes, so the report of the host with the smaller id is used
//! when both are fresh (counting both would double their weight) — then
//! [`clocksync::solve`] with the lowest-id host that is not Down and has
//! edges as the reference. A host's committed [`ClockState`] is its
//! solution's classification (with a 25 % hysteresis margin before moving
//! to a worse state); hosts outside the solution are Unsynced unless held
//! over. Only changes of state go through Raft (`SetClockStates`), never
//! the figures.
//!
//! **Holdover:** a host that drops out of the solution (its paths too busy
//! for pure pairs, say) keeps its last solved clock, carried forward with
//! its drift, for up to [`MAX_HOLDOVER`] while the reference stays the
//! same and the host is registered and not Down; its error bound grows by
//! the drift's error over the time carried (no term for the drift itself
//! wandering: 30 s keeps that small) and its state follows that bound (the
//! view says how long it has been held: `holdover_ms`). After that, or
//! with a new reference, it is Unsynced.
//!
//! **A tick without a solution** (no fresh edges: the leader heard no
//! summaries for [`CLOCK_FRESH`], or the solve failed) does not unsync the
//! cluster: the last solution stands in, every clock in it aged — its bound
//! grown by the drift's error since that solution, its state following the
//! bound, `holdover_ms` set once it is [`STALE_AFTER`] old (the reference
//! host included), a Down host Unsynced at once — for up to
//! [`MAX_HOLDOVER`]; then every host is Unsynced. The next solution takes
//! over, holding the hosts it lacks as above (counted from their last
//! solution).
//!
//! **NTP-style baseline**, for comparison: every edge's min-RTT estimate,
//! composed hop by hop along a BFS tree from the reference like an NTP
//! stratum hierarchy (each hop at its own time, no alignment, no loop
//! correction).
//!
//! **Bounds:** a summary carries at most [`MAX_SUMMARY_CLOCKS`] clocks and
//! [`MAX_SUMMARY_PATHS`] paths; entries naming unknown peers, rails or NICs
//! are ignored, so stored keys are bounded by the model's hosts and NICs,
//! and each host further by [`MAX_CLOCKS_PER_HOST`] and
//! [`MAX_PATHS_PER_HOST`]; each path keeps [`PATH_SECONDS`] seconds.
//!
//! Lock order: the model's read lock may be held while taking this
//! service's lock, never the other way round.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clocksync::{EdgeEstimate, EdgeStatus, HostId, Solution, SolveConfig};
use proto::v1::ProbeSummary;

use crate::api::{
    ApiError, ClockEdgeView, ClockHostView, ClockView, Correction, EdgeFit, ErrorKind, LiveClock,
    NtpComposition, NtpHop, PathView, PathsView, ProbeLoad, SolutionInfo,
};
use crate::model::{ClockChange, ClockState, ClusterState, Command, Liveness, NodeId};
use crate::node::Supervisor;

/// Shaped NICs read from one summary.
pub const MAX_SUMMARY_SHAPED: usize = 16;
/// Shaped classes carrying this share of their rate are busy: the demand
/// that made the contention is still there.
pub const SHAPED_BUSY_SHARE: f64 = 0.5;
/// Most peer clocks in one summary.
pub const MAX_SUMMARY_CLOCKS: usize = 256;
/// Most path statistics in one summary.
pub const MAX_SUMMARY_PATHS: usize = 256;
/// Most (peer, rail) clock reports kept per reporting host.
pub const MAX_CLOCKS_PER_HOST: usize = 256;
/// Most directed paths kept per receiving host.
pub const MAX_PATHS_PER_HOST: usize = 256;
/// A peer clock older than this is not used in the solve.
pub const CLOCK_FRESH: Duration = Duration::from_secs(3);
/// Peer clocks older than this are forgotten.
pub const CLOCK_KEEP: Duration = Duration::from_secs(30);
/// Per-second summaries kept per path (the `paths` window).
pub const PATH_SECONDS: usize = 120;
/// Path summaries older than this are outside the window and forgotten.
pub const PATH_WINDOW: Duration = Duration::from_secs(120);
/// How often the leader solves and commits state changes.
pub const TICK: Duration = Duration::from_secs(1);
/// A new leader commits no clock state changes for this long: it starts
/// with no data, and without the warm-up every leader change would commit
/// every host Unsynced (and open `clock_unsynced` incidents) until the
/// agents' next summaries arrived.
pub const WARMUP: Duration = Duration::from_secs(5);
/// Most paths one `paths` call returns.
pub const MAX_PATHS_PER_CALL: usize = 10_000;
/// A host leaves a better state only when its bound exceeds that state's
/// threshold by this factor (no Raft write per second at a threshold).
const HYSTERESIS: f64 = 1.25;
/// Longest a host's clock is carried forward from its last solution.
pub const MAX_HOLDOVER: Duration = Duration::from_secs(30);
/// A solution this old has had ticks without a newer one: the view marks
/// its clocks held over (a fresh one is a tick old plus its solve time).
pub const STALE_AFTER: Duration = Duration::from_secs(3);
/// How `paths` combines per-second figures (also in the reply).
pub const AGGREGATION: &str = "min: min of the per-second minima; p50: median of the per-second \
     medians; p99: max of the per-second p99s; loss: 1 - sum(received)/sum(expected)";

/// Why a probe summary was refused. Nothing was stored.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SummaryError {
    /// The reporting host is not registered.
    #[error("host {0:?} is not registered; register first")]
    UnknownHost(String),
    /// Too many entries.
    #[error("a probe summary carries at most {max} {what}; this one has {got}")]
    TooLarge {
        what: &'static str,
        got: usize,
        max: usize,
    },
    /// A number or relation that cannot be right.
    #[error("{0}")]
    Malformed(String),
}

impl From<SummaryError> for ApiError {
    fn from(e: SummaryError) -> Self {
        let kind = match e {
            SummaryError::UnknownHost(_) => ErrorKind::NotFound,
            SummaryError::TooLarge { .. } | SummaryError::Malformed(_) => {
                ErrorKind::InvalidArgument
            }
        };
        ApiError::new(kind, e.to_string())
    }
}

/// The NTP-style estimate of a report.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NtpReport {
    /// On the reporter's clock (ns).
    pub at_ns: i64,
    /// `clock_peer - clock_reporter` (ns).
    pub offset_ns: f64,
    pub rtt_ns: i64,
}

/// A reporter's latest estimate of `clock_peer - clock_reporter` on one rail.
#[derive(Debug, Clone, PartialEq)]
pub struct ClockReport {
    /// On the reporter's clock (ns).
    pub at_ns: i64,
    pub offset_ns: f64,
    pub drift_ppb: f64,
    pub error_bound_ns: f64,
    pub drift_error_ppb: f64,
    pub samples: u32,
    pub ntp: Option<NtpReport>,
    /// When the leader received it.
    pub arrived: Instant,
}

/// One second of one directed path, as its receiver reported it.
#[derive(Debug, Clone, PartialEq)]
struct PathSecond {
    arrived: Instant,
    /// The receiver's clock reading the correction is evaluated at: the
    /// pair line's time, or the summary's send time for raw delays.
    at_ns: i64,
    expected: u32,
    received: u32,
    delays: u32,
    min_ns: i64,
    p50_ns: i64,
    p99_ns: i64,
    /// The pair line's offset (peer − receiver) the delays include; none
    /// when the delays are raw.
    line_offset_ns: Option<f64>,
}

/// A shaped NIC's traffic as last reported.
struct ShapedTrack {
    at: Instant,
    bytes: u64,
    busy_at: Option<Instant>,
}

/// A directed path into a receiving host.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct PathFrom {
    src: String,
    src_nic: String,
    dst_nic: String,
    rail: u32,
}

/// One edge chosen for the solve.
#[derive(Debug, Clone, PartialEq)]
pub struct SelectedEdge {
    /// The reporter (its clock is the time axis).
    pub from: String,
    pub to: String,
    pub from_id: u32,
    pub to_id: u32,
    pub rail: u32,
    pub report: ClockReport,
    /// Half this edge's minimum round trip beyond the smallest of its host
    /// pair's rails (ns; 0 on the pair's quietest rail or without round
    /// trips). Both rails join the same two clocks, so the excess is
    /// queueing that never drained on this rail within the window, and an
    /// offset taken from one-way floors can be biased by up to this much
    /// (half the difference of the directions' queueing).
    pub queueing_ns: f64,
}

impl SelectedEdge {
    /// The edge as the solve sees it: its error is the pair fit's bound
    /// and the possible queueing bias together, so a rail that stays
    /// queued weighs little next to a quiet rail between the same hosts.
    fn estimate(&self) -> EdgeEstimate {
        EdgeEstimate {
            from: HostId(self.from_id),
            to: HostId(self.to_id),
            at_ns: self.report.at_ns,
            offset_ns: self.report.offset_ns,
            drift_ppb: self.report.drift_ppb,
            offset_error_ns: self.report.error_bound_ns.hypot(self.queueing_ns),
            drift_error_ppb: self.report.drift_error_ppb,
        }
    }
}

/// What one solve produced.
#[derive(Debug, Clone)]
pub struct Solved {
    /// When it was solved (leader clock) and the wall-clock time.
    pub at: Instant,
    pub unix_ms: u64,
    pub reference: u32,
    /// The solve's input, in order (the solution's residuals follow it).
    pub edges: Vec<SelectedEdge>,
    pub solution: Option<Solution>,
    pub error: Option<String>,
    /// NTP-style composition per host id.
    pub ntp: BTreeMap<u32, NtpComposition>,
    /// Hosts held over from earlier solutions (see the module docs), by id;
    /// filled by [`ClockService::hold_over`].
    pub held: BTreeMap<u32, Held>,
}

/// A host's clock carried forward from the last solution that had it.
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    /// That solution's instant (reference clock, ns) and the host's clock
    /// in it.
    pub base_at_ns: i64,
    pub base: clocksync::HostClock,
    /// When that solution was made.
    pub since: Instant,
    /// The clock carried to this solution's instant.
    pub clock: clocksync::HostClock,
}

impl Solved {
    /// A host's clock as it stands at `now`: solved or held over, its bound
    /// grown by the drift's error since this solve (a reader extrapolates
    /// the offset with the drift from the solve's instant) and its state
    /// following that bound; with how long it has been held over (a held
    /// host, or every host once this solve is [`STALE_AFTER`] old). None
    /// after [`MAX_HOLDOVER`] without a solution for it.
    pub fn clock_at(
        &self,
        id: u32,
        now: Instant,
        cfg: &SolveConfig,
    ) -> Option<(clocksync::HostClock, Option<Duration>)> {
        let age = now.saturating_duration_since(self.at);
        let (c, held_for) = match self.clock_of(id)? {
            (c, Some(h)) => (c, Some(now.saturating_duration_since(h.since))),
            (c, None) => (c, (age >= STALE_AFTER).then_some(age)),
        };
        if held_for.is_some_and(|d| d > MAX_HOLDOVER) {
            return None;
        }
        let bound = c.error_bound_ns + c.drift_error_ppb.abs() * 1e-9 * age.as_nanos() as f64;
        if !(c.offset_ns.is_finite() && bound.is_finite()) {
            return None;
        }
        Some((
            clocksync::HostClock {
                error_bound_ns: bound,
                state: cfg.state_of(bound),
                ..c.clone()
            },
            held_for,
        ))
    }

    /// A host's clock in this solve: solved, or held over.
    pub fn clock_of(&self, id: u32) -> Option<(&clocksync::HostClock, Option<&Held>)> {
        if let Some(c) = self.solution.as_ref().and_then(|s| s.host(HostId(id))) {
            return Some((c, None));
        }
        self.held.get(&id).map(|h| (&h.clock, Some(h)))
    }
}

/// The inputs of one solve, taken from the store and the model.
#[derive(Debug, Clone)]
pub struct SolveInput {
    pub edges: Vec<SelectedEdge>,
    pub reference: u32,
    /// The reference clock's reading the solution is wanted at.
    pub at_ns: i64,
    names: BTreeMap<u32, String>,
}

impl SolveInput {
    /// Runs the network solve and the NTP composition (CPU-bound: O(n³)).
    pub fn solve(self, cfg: &SolveConfig, at: Instant, unix_ms: u64) -> Solved {
        let estimates: Vec<EdgeEstimate> = self.edges.iter().map(SelectedEdge::estimate).collect();
        let (solution, error) =
            match clocksync::solve_with(&estimates, HostId(self.reference), self.at_ns, cfg) {
                Ok(s) => (Some(s), None),
                Err(e) => (None, Some(e.to_string())),
            };
        let ntp = ntp_tree(&self.edges, self.reference, &self.names);
        Solved {
            at,
            unix_ms,
            reference: self.reference,
            edges: self.edges,
            solution,
            error,
            ntp,
            held: BTreeMap::new(),
        }
    }
}

/// What one summary contributed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ingested {
    pub clocks: usize,
    pub paths: usize,
    /// Entries naming unknown peers, rails or NICs.
    pub ignored: usize,
}

#[derive(Default)]
struct Store {
    /// reporter → (peer, rail) → latest report.
    clocks: HashMap<String, HashMap<(String, u32), ClockReport>>,
    /// receiver → path → recent seconds (oldest first).
    paths: HashMap<String, HashMap<PathFrom, VecDeque<PathSecond>>>,
    /// host → when a peer last reported receiving its probes.
    evidence: HashMap<String, Instant>,
    /// (host, NIC) → its shaped classes' traffic, as last reported.
    shaped: HashMap<(String, String), ShapedTrack>,
    /// host → its probe rate and cost, as last reported.
    /// (`age_ms` is filled in by the view.)
    probe_load: HashMap<String, (ProbeLoad, Instant)>,
    /// The latest solution (standing in while ticks bring none; see the
    /// module docs), or the latest failed solve when there is none.
    solved: Option<Arc<Solved>>,
    /// Why the latest tick brought no solution (none: it did).
    solve_error: Option<String>,
}

/// The leader's clock service (see the module docs).
pub struct ClockService {
    store: Mutex<Store>,
    cfg: SolveConfig,
}

impl Default for ClockService {
    fn default() -> Self {
        Self::new(SolveConfig::default())
    }
}

/// At most 64 characters of a name, for error messages and logs.
pub fn short(s: &str) -> String {
    s.chars().take(64).collect()
}

/// Checks a summary against the model without storing anything.
fn check_summary(st: &ClusterState, s: &ProbeSummary) -> Result<(), SummaryError> {
    if !st.hosts.contains_key(&s.host) {
        return Err(SummaryError::UnknownHost(short(&s.host)));
    }
    if s.clocks.len() > MAX_SUMMARY_CLOCKS {
        return Err(SummaryError::TooLarge {
            what: "peer clocks",
            got: s.clocks.len(),
            max: MAX_SUMMARY_CLOCKS,
        });
    }
    if s.paths.len() > MAX_SUMMARY_PATHS {
        return Err(SummaryError::TooLarge {
            what: "path statistics",
            got: s.paths.len(),
            max: MAX_SUMMARY_PATHS,
        });
    }
    for c in &s.clocks {
        let bad = |what: &str| {
            SummaryError::Malformed(format!(
                "clock of host {:?} against peer {:?} on rail {}: {what}",
                short(&s.host),
                short(&c.peer),
                c.rail
            ))
        };
        if c.peer == s.host {
            return Err(bad("a host cannot report a clock against itself"));
        }
        let numbers = [
            c.offset_ns,
            c.drift_ppb,
            c.error_bound_ns,
            c.drift_error_ppb,
        ];
        if numbers.iter().any(|x| !x.is_finite()) {
            return Err(bad("offset, drift and error bounds must be finite numbers"));
        }
        if c.error_bound_ns < 0.0 || c.drift_error_ppb < 0.0 {
            return Err(bad("error bounds must be ≥ 0"));
        }
        if c.drift_ppb.abs() >= 1e8 {
            return Err(bad("drift beyond ±10 %"));
        }
        // The NTP-style round trip may be negative: it pairs two one-way
        // probes up to tens of ms apart, so the clocks' relative drift
        // (up to hundreds of ppm) adds µs to it, and on a fabric with
        // µs-scale delays that can outweigh the delays themselves.
        if c.has_ntp && !c.ntp_offset_ns.is_finite() {
            return Err(bad("the NTP offset must be a finite number"));
        }
    }
    for p in &s.paths {
        let bad = |what: &str| {
            SummaryError::Malformed(format!(
                "path {:?}/{:?} -> {:?}/{:?} on rail {}: {what}",
                short(&p.peer),
                short(&p.peer_nic),
                short(&s.host),
                short(&p.nic),
                p.rail
            ))
        };
        if p.peer == s.host {
            return Err(bad("a host cannot report a path from itself"));
        }
        if !p.line_offset_ns.is_finite() {
            return Err(bad("the line offset must be a finite number"));
        }
        if p.delays > 0 && !(p.min_ns <= p.p50_ns && p.p50_ns <= p.p99_ns) {
            return Err(bad("delay quantiles must satisfy min ≤ p50 ≤ p99"));
        }
    }
    Ok(())
}

impl ClockService {
    /// A service classifying clocks with `cfg`'s thresholds.
    pub fn new(cfg: SolveConfig) -> Self {
        Self {
            store: Mutex::new(Store::default()),
            cfg,
        }
    }

    /// The solve configuration.
    pub fn config(&self) -> &SolveConfig {
        &self.cfg
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().expect("clock store poisoned")
    }

    /// Forgets everything (this supervisor stopped leading).
    pub fn clear(&self) {
        *self.lock() = Store::default();
    }

    /// When a peer last reported receiving each host's probes.
    pub fn probe_evidence(&self) -> HashMap<String, Instant> {
        self.lock().evidence.clone()
    }

    /// The latest solve, if any.
    pub fn solved(&self) -> Option<Arc<Solved>> {
        self.lock().solved.clone()
    }

    /// Validates and stores one summary received at `now`. A refused
    /// summary stores nothing; entries naming unknown peers, rails or NICs
    /// are skipped (logged at debug).
    pub fn ingest(
        &self,
        st: &ClusterState,
        s: &ProbeSummary,
        now: Instant,
    ) -> Result<Ingested, SummaryError> {
        check_summary(st, s)?;
        let reporter = &st.hosts[&s.host];
        let rails: BTreeSet<u32> = reporter.nics.values().filter_map(|n| n.rail).collect();
        let mut out = Ingested::default();
        let mut store = self.lock();
        let store = &mut *store;
        // Older agents leave these zero: nothing to show then; nonsense
        // (a rate above the configured one, a budget that is not a
        // percentage) is not shown either.
        let load_ok = s.pairs_per_s <= s.max_pairs_per_s
            && s.probe_cpu_budget_pct.is_finite()
            && (0.0..=100.0).contains(&s.probe_cpu_budget_pct);
        if s.max_pairs_per_s > 0 && !load_ok {
            tracing::debug!(host = %s.host, pairs_per_s = s.pairs_per_s, max_pairs_per_s = s.max_pairs_per_s, budget_pct = s.probe_cpu_budget_pct, "probe load report ignored");
        }
        if s.max_pairs_per_s > 0 && load_ok {
            store.probe_load.insert(
                s.host.clone(),
                (
                    ProbeLoad {
                        pairs_per_s: s.pairs_per_s,
                        max_pairs_per_s: s.max_pairs_per_s,
                        cpu_pct: s.probe_cpu_pct.filter(|c| c.is_finite() && *c >= 0.0),
                        cpu_budget_pct: s.probe_cpu_budget_pct,
                        age_ms: 0,
                    },
                    now,
                ),
            );
        }
        for c in &s.clocks {
            if !st.hosts.contains_key(&c.peer) {
                tracing::debug!(host = %s.host, peer = %short(&c.peer), "clock against an unknown peer ignored");
                out.ignored += 1;
                continue;
            }
            if !rails.contains(&c.rail) {
                tracing::debug!(host = %s.host, rail = c.rail, "clock on a rail the host has no NIC on ignored");
                out.ignored += 1;
                continue;
            }
            let table = store.clocks.entry(s.host.clone()).or_default();
            let key = (c.peer.clone(), c.rail);
            if !table.contains_key(&key) && table.len() >= MAX_CLOCKS_PER_HOST {
                let oldest = table
                    .iter()
                    .min_by_key(|(_, r)| r.arrived)
                    .map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    table.remove(&k);
                }
            }
            table.insert(
                key,
                ClockReport {
                    at_ns: c.at_ns,
                    offset_ns: c.offset_ns,
                    drift_ppb: c.drift_ppb,
                    error_bound_ns: c.error_bound_ns,
                    drift_error_ppb: c.drift_error_ppb,
                    samples: c.samples,
                    ntp: c.has_ntp.then_some(NtpReport {
                        at_ns: c.ntp_at_ns,
                        offset_ns: c.ntp_offset_ns,
                        rtt_ns: c.ntp_rtt_ns,
                    }),
                    arrived: now,
                },
            );
            out.clocks += 1;
        }
        for sh in s.shaped.iter().take(MAX_SUMMARY_SHAPED) {
            if !reporter.nics.contains_key(&sh.nic) {
                out.ignored += 1;
                continue;
            }
            let key = (s.host.clone(), sh.nic.clone());
            let t = store.shaped.entry(key).or_insert(ShapedTrack {
                at: now,
                bytes: sh.shaped_bytes,
                busy_at: None,
            });
            let secs = now.saturating_duration_since(t.at).as_secs_f64();
            if sh.shaped_bytes >= t.bytes && secs > 0.0 {
                let bps = (sh.shaped_bytes - t.bytes) as f64 * 8.0 / secs;
                if bps >= SHAPED_BUSY_SHARE * sh.limit_bps as f64 {
                    t.busy_at = Some(now);
                }
            }
            t.at = now;
            t.bytes = sh.shaped_bytes;
        }
        for p in &s.paths {
            let Some(peer) = st.hosts.get(&p.peer) else {
                tracing::debug!(host = %s.host, peer = %short(&p.peer), "path from an unknown peer ignored");
                out.ignored += 1;
                continue;
            };
            if p.received > 0 {
                store.evidence.insert(p.peer.clone(), now);
            }
            if !reporter.nics.contains_key(&p.nic) || !peer.nics.contains_key(&p.peer_nic) {
                tracing::debug!(host = %s.host, nic = %short(&p.nic), peer = %p.peer, peer_nic = %short(&p.peer_nic), "path naming an unknown NIC ignored");
                out.ignored += 1;
                continue;
            }
            let key = PathFrom {
                src: p.peer.clone(),
                src_nic: p.peer_nic.clone(),
                dst_nic: p.nic.clone(),
                rail: p.rail,
            };
            let table = store.paths.entry(s.host.clone()).or_default();
            if !table.contains_key(&key) && table.len() >= MAX_PATHS_PER_HOST {
                let stalest = table
                    .iter()
                    .min_by_key(|(_, r)| r.back().map(|x| x.arrived))
                    .map(|(k, _)| k.clone());
                if let Some(k) = stalest {
                    table.remove(&k);
                }
            }
            let ring = table.entry(key).or_default();
            ring.push_back(PathSecond {
                arrived: now,
                at_ns: if p.corrected { p.line_at_ns } else { s.sent_ns },
                expected: p.expected,
                received: p.received,
                delays: p.delays,
                min_ns: p.min_ns,
                p50_ns: p.p50_ns,
                p99_ns: p.p99_ns,
                line_offset_ns: p.corrected.then_some(p.line_offset_ns),
            });
            while ring.len() > PATH_SECONDS {
                ring.pop_front();
            }
            out.paths += 1;
        }
        Ok(out)
    }

    /// Drops what is too old to matter or whose hosts are gone.
    fn prune(store: &mut Store, st: &ClusterState, now: Instant) {
        let old = |t: Instant, keep: Duration| now.saturating_duration_since(t) > keep;
        store.clocks.retain(|h, t| {
            t.retain(|(peer, _), r| !old(r.arrived, CLOCK_KEEP) && st.hosts.contains_key(peer));
            !t.is_empty() && st.hosts.contains_key(h)
        });
        store.paths.retain(|h, t| {
            t.retain(|k, ring| {
                while ring.front().is_some_and(|s| old(s.arrived, PATH_WINDOW)) {
                    ring.pop_front();
                }
                !ring.is_empty() && st.hosts.contains_key(&k.src)
            });
            !t.is_empty() && st.hosts.contains_key(h)
        });
        store.evidence.retain(|h, _| st.hosts.contains_key(h));
        store
            .shaped
            .retain(|(h, _), t| st.hosts.contains_key(h) && !old(t.at, PATH_WINDOW));
        store
            .probe_load
            .retain(|h, (_, at)| st.hosts.contains_key(h) && !old(*at, CLOCK_KEEP));
    }

    /// Prunes the store and gathers the next solve's input (none without
    /// fresh edges).
    pub fn solve_input(&self, st: &ClusterState, now: Instant) -> Option<SolveInput> {
        let mut store = self.lock();
        Self::prune(&mut store, st, now);
        let edges = select_edges(st, &store.clocks, now);
        let reference = pick_reference(st, &edges)?;
        let at_ns = reference_time(&edges, reference)?;
        let names = st.hosts.values().map(|h| (h.id, h.name.clone())).collect();
        Some(SolveInput {
            edges,
            reference,
            at_ns,
            names,
        })
    }

    /// Every path's seconds that arrived after `after` (all without),
    /// oldest first per path, with the delays corrected like `paths`
    /// does: what the contention detector ([`crate::leader::contention`]) reads.
    pub fn path_seconds_after(
        &self,
        st: &ClusterState,
        after: Option<Instant>,
        now: Instant,
    ) -> Vec<PathSample> {
        let hosts: HashMap<&str, u32> =
            st.hosts.values().map(|h| (h.name.as_str(), h.id)).collect();
        let store = self.lock();
        let sol = store.solved.as_ref().and_then(|s| s.solution.as_ref());
        let mut out = Vec::new();
        for (dst, table) in &store.paths {
            for (k, ring) in table {
                // Rings are in arrival order: read back only what is new.
                let fresh = ring
                    .iter()
                    .rev()
                    .take_while(|s| after.is_none_or(|a| s.arrived > a));
                for s in fresh {
                    if now.saturating_duration_since(s.arrived) > PATH_WINDOW || s.delays == 0 {
                        continue;
                    }
                    let theta = match (sol, hosts.get(dst.as_str()), hosts.get(k.src.as_str())) {
                        (Some(sol), Some(d), Some(src)) => network_offset(sol, *d, *src, s.at_ns),
                        _ => None,
                    };
                    let (shift, correction) = correction(s, theta);
                    out.push(PathSample {
                        src: k.src.clone(),
                        src_nic: k.src_nic.clone(),
                        dst: dst.clone(),
                        dst_nic: k.dst_nic.clone(),
                        rail: k.rail,
                        arrived: s.arrived,
                        min_ns: s.min_ns as f64 + shift,
                        p50_ns: s.p50_ns as f64 + shift,
                        p99_ns: s.p99_ns as f64 + shift,
                        correction,
                    });
                }
            }
        }
        out.sort_by_key(|p| p.arrived);
        out
    }

    /// When `host`'s shaped classes on `nic` last carried at least
    /// [`SHAPED_BUSY_SHARE`] of their rate (none: not since reported).
    pub fn shaped_busy(&self, host: &str, nic: &str) -> Option<Instant> {
        self.lock()
            .shaped
            .get(&(host.to_owned(), nic.to_owned()))
            .and_then(|t| t.busy_at)
    }

    /// Carries forward, into `new`, the clocks of hosts that the previous
    /// solve had (solved or held) and `new` lacks: for at most
    /// [`MAX_HOLDOVER`] since their last solution, and only while the
    /// reference is the same (offsets against another reference mean
    /// nothing), and only for hosts in `keep` (registered, not Down). The
    /// bound grows by the drift's error over the time carried.
    pub fn hold_over(&self, new: &mut Solved, keep: &BTreeSet<u32>, now: Instant) {
        let Some(prev) = self.solved() else { return };
        let (Some(prev_sol), Some(new_sol)) = (prev.solution.as_ref(), new.solution.as_ref())
        else {
            return;
        };
        if prev.reference != new.reference {
            return;
        }
        let mut bases: BTreeMap<u32, (i64, clocksync::HostClock, Instant)> = prev
            .held
            .iter()
            .map(|(id, h)| (*id, (h.base_at_ns, h.base.clone(), h.since)))
            .collect();
        for c in &prev_sol.hosts {
            bases.insert(c.host.0, (prev_sol.at_ns, c.clone(), prev.at));
        }
        let mut held = BTreeMap::new();
        for (id, (base_at_ns, base, since)) in bases {
            if new_sol.host(HostId(id)).is_some()
                || !keep.contains(&id)
                || now.saturating_duration_since(since) > MAX_HOLDOVER
            {
                continue;
            }
            let dt = (i128::from(new_sol.at_ns) - i128::from(base_at_ns)) as f64;
            let offset_ns = base.offset_ns + base.drift_ppb * 1e-9 * dt;
            let error_bound_ns = base.error_bound_ns + base.drift_error_ppb * 1e-9 * dt.abs();
            if !(offset_ns.is_finite() && error_bound_ns.is_finite()) {
                continue;
            }
            let clock = clocksync::HostClock {
                offset_ns,
                error_bound_ns,
                state: self.cfg.state_of(error_bound_ns),
                ..base.clone()
            };
            held.insert(
                id,
                Held {
                    base_at_ns,
                    base,
                    since,
                    clock,
                },
            );
        }
        if !held.is_empty() {
            tracing::debug!(hosts = ?held.keys().collect::<Vec<_>>(), "clocks held over");
        }
        new.held = held;
    }

    /// Keeps the latest solve made at `now` (none: no fresh edges). One
    /// without a solution does not replace the last solution while that
    /// is at most [`MAX_HOLDOVER`] old: it stands in (see the module docs).
    pub fn set_solved(&self, solved: Option<Solved>, now: Instant) {
        let error = match &solved {
            Some(s) if s.solution.is_some() => None,
            Some(s) => Some(
                s.error
                    .clone()
                    .unwrap_or_else(|| "the solve found no solution".into()),
            ),
            None => Some(format!(
                "no fresh probe edges (none reported within {CLOCK_FRESH:?}) or no host to be the reference"
            )),
        };
        self.settle(solved, error, now);
    }

    /// Records a tick whose solve could not run (`why`), like a failed
    /// solve: the last solution stands in.
    pub fn set_solve_failed(&self, why: String, now: Instant) {
        self.settle(None, Some(why), now);
    }

    fn settle(&self, solved: Option<Solved>, error: Option<String>, now: Instant) {
        let mut store = self.lock();
        if error != store.solve_error {
            match &error {
                Some(e) => tracing::warn!(error = %e, "no clock solution this tick"),
                None => tracing::info!("clock solutions again"),
            }
        }
        let stands_in = |p: &Arc<Solved>| {
            p.solution.is_some() && now.saturating_duration_since(p.at) <= MAX_HOLDOVER
        };
        let had = store.solved.as_ref().is_some_and(|p| p.solution.is_some());
        if error.is_none() || !store.solved.as_ref().is_some_and(stands_in) {
            if had && error.is_some() {
                tracing::warn!(
                    after = ?MAX_HOLDOVER,
                    "the last clock solution is too old to stand in: clocks unsynced"
                );
            }
            store.solved = solved.map(Arc::new);
        }
        store.solve_error = error;
    }

    /// `railguard clock`.
    pub fn clock_view(&self, st: &ClusterState, leader: NodeId, now: Instant) -> ClockView {
        let solved = self.solved();
        let (probe_load, solve_error) = {
            let store = self.lock();
            (store.probe_load.clone(), store.solve_error.clone())
        };
        let mut hosts: Vec<&crate::model::Host> = st.hosts.values().collect();
        hosts.sort_by_key(|h| h.id);
        let sol = solved.as_ref().and_then(|s| s.solution.as_ref());
        let hosts = hosts
            .into_iter()
            .map(|h| ClockHostView {
                host: h.name.clone(),
                id: h.id,
                state: h.clock.state,
                state_changed_ms: h.clock.changed_ms,
                live: solved
                    .as_ref()
                    .and_then(|s| host_clock(s, h, now, &self.cfg))
                    .and_then(|(c, held_for)| {
                        let all = [
                            c.offset_ns,
                            c.drift_ppb,
                            c.error_bound_ns,
                            c.drift_error_ppb,
                        ];
                        all.iter().all(|x| x.is_finite()).then(|| LiveClock {
                            offset_ns: c.offset_ns,
                            drift_ppb: c.drift_ppb,
                            error_bound_ns: c.error_bound_ns,
                            drift_error_ppb: c.drift_error_ppb,
                            state: model_state(c.state),
                            holdover_ms: held_for.map(ms),
                        })
                    }),
                ntp: solved.as_ref().and_then(|s| s.ntp.get(&h.id).cloned()),
                probe: probe_load.get(&h.name).map(|(r, at)| ProbeLoad {
                    age_ms: ms(now.saturating_duration_since(*at)),
                    ..r.clone()
                }),
            })
            .collect();
        let Some(solved) = solved.as_deref() else {
            return ClockView {
                answered_by: leader,
                reference: None,
                reference_id: None,
                solution: None,
                solve_error,
                hosts,
                edges: Vec::new(),
            };
        };
        let edges = solved
            .edges
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let fit = sol.and_then(|s| s.edges.get(i));
                ClockEdgeView {
                    from: e.from.clone(),
                    to: e.to.clone(),
                    from_id: e.from_id,
                    to_id: e.to_id,
                    rail: e.rail,
                    at_ns: e.report.at_ns,
                    offset_ns: e.report.offset_ns,
                    drift_ppb: e.report.drift_ppb,
                    error_bound_ns: e.report.error_bound_ns,
                    drift_error_ppb: e.report.drift_error_ppb,
                    samples: e.report.samples,
                    report_age_ms: ms(now.saturating_duration_since(e.report.arrived)),
                    ntp_at_ns: e.report.ntp.map(|n| n.at_ns),
                    ntp_offset_ns: e.report.ntp.map(|n| n.offset_ns),
                    ntp_rtt_ns: e.report.ntp.map(|n| n.rtt_ns),
                    queueing_ns: e.queueing_ns,
                    residual_ns: fit.and_then(|f| finite(f.residual_ns)),
                    z: fit.and_then(|f| finite(f.z)),
                    drift_residual_ppb: fit.and_then(|f| finite(f.drift_residual_ppb)),
                    status: fit.map(|f| match f.status {
                        EdgeStatus::Used => EdgeFit::Used,
                        EdgeStatus::Rejected => EdgeFit::Rejected,
                        EdgeStatus::Unreachable => EdgeFit::Unreachable,
                    }),
                }
            })
            .collect();
        ClockView {
            answered_by: leader,
            reference: st.host_ids.get(&solved.reference).cloned(),
            reference_id: Some(solved.reference),
            solution: sol.map(|s| SolutionInfo {
                at_ns: s.at_ns,
                solved_unix_ms: solved.unix_ms,
                age_ms: ms(now.saturating_duration_since(solved.at)),
                chi2_per_dof: finite(s.chi2_per_dof),
                dof: s.dof,
                edges_used: s
                    .edges
                    .iter()
                    .filter(|e| e.status == EdgeStatus::Used)
                    .count(),
                edges_rejected: s
                    .edges
                    .iter()
                    .filter(|e| e.status == EdgeStatus::Rejected)
                    .count(),
                hosts_solved: s.hosts.len(),
            }),
            solve_error,
            hosts,
            edges,
        }
    }

    /// `railguard paths`: paths touching `host` (all without), worst p99
    /// first, at most `top`.
    pub fn paths_view(
        &self,
        st: &ClusterState,
        leader: NodeId,
        host: Option<&str>,
        top: Option<u32>,
        now: Instant,
    ) -> Result<PathsView, ApiError> {
        if top == Some(0) {
            return Err(ApiError::invalid("--top must be at least 1"));
        }
        if let Some(h) = host {
            if !st.hosts.contains_key(h) {
                return Err(ApiError::new(
                    ErrorKind::NotFound,
                    format!("host {h:?} not found"),
                ));
            }
        }
        let store = self.lock();
        let sol = store.solved.as_ref().and_then(|s| {
            s.solution
                .as_ref()
                .map(|x| (x, now.saturating_duration_since(s.at)))
        });
        let mut paths = Vec::new();
        for (dst, table) in &store.paths {
            let Some(dh) = st.hosts.get(dst) else {
                continue;
            };
            for (k, ring) in table {
                let Some(sh) = st.hosts.get(&k.src) else {
                    continue;
                };
                if host.is_some_and(|f| f != dst && f != k.src) {
                    continue;
                }
                let seconds: Vec<&PathSecond> = ring
                    .iter()
                    .filter(|s| now.saturating_duration_since(s.arrived) <= PATH_WINDOW)
                    .collect();
                let Some(last) = seconds.last() else {
                    continue;
                };
                let theta = |at_ns| sol.and_then(|(s, _)| network_offset(s, dh.id, sh.id, at_ns));
                let mut agg = PathAggregate::default();
                for s in &seconds {
                    agg.add(s, theta(s.at_ns));
                }
                paths.push(agg.finish(k, dst, ms(now.saturating_duration_since(last.arrived))));
            }
        }
        paths.sort_by(|a, b| {
            b.p99_us
                .unwrap_or(f64::NEG_INFINITY)
                .total_cmp(&a.p99_us.unwrap_or(f64::NEG_INFINITY))
                .then_with(|| {
                    (&a.src, &a.src_nic, &a.dst, &a.dst_nic, a.rail)
                        .cmp(&(&b.src, &b.src_nic, &b.dst, &b.dst_nic, b.rail))
                })
        });
        let total = paths.len();
        let limit = top.map_or(MAX_PATHS_PER_CALL, |t| (t as usize).min(MAX_PATHS_PER_CALL));
        paths.truncate(limit);
        Ok(PathsView {
            answered_by: leader,
            window_s: PATH_WINDOW.as_secs(),
            aggregation: AGGREGATION.into(),
            solution_age_ms: sol.map(|(_, age)| ms(age)),
            total,
            paths,
        })
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

fn model_state(s: clocksync::ClockState) -> ClockState {
    match s {
        clocksync::ClockState::Synced => ClockState::Synced,
        clocksync::ClockState::Degraded => ClockState::Degraded,
        clocksync::ClockState::Unsynced => ClockState::Unsynced,
    }
}

/// One path's second for the contention detector: one-way delays (ns)
/// after correction.
#[derive(Debug, Clone, PartialEq)]
pub struct PathSample {
    pub src: String,
    pub src_nic: String,
    pub dst: String,
    pub dst_nic: String,
    pub rail: u32,
    pub arrived: Instant,
    pub min_ns: f64,
    pub p50_ns: f64,
    pub p99_ns: f64,
    pub correction: Correction,
}

/// The shift that corrects a second's delays, and how: owd_net =
/// owd_pair + (θ_net − line_offset); raw delays are owd − θ, so they take
/// θ whole. `theta` is the network solution's `clock_src − clock_dst` at
/// the second's time, if known.
fn correction(s: &PathSecond, theta: Option<f64>) -> (f64, Correction) {
    match (s.line_offset_ns, theta) {
        (Some(line), Some(t)) => (t - line, Correction::Network),
        (Some(_), None) => (0.0, Correction::Pair),
        (None, Some(t)) => (t, Correction::Network),
        (None, None) => (0.0, Correction::Raw),
    }
}

/// Per-second figures of one path folded over the window.
#[derive(Default)]
struct PathAggregate {
    min: Option<f64>,
    p50s: Vec<f64>,
    p99: Option<f64>,
    expected: u64,
    received: u64,
    samples: u64,
    seconds: usize,
    correction: Option<Correction>,
}

impl PathAggregate {
    /// Adds one second; `theta` is the network solution's
    /// `clock_src − clock_dst` at the second's time, if known.
    fn add(&mut self, s: &PathSecond, theta: Option<f64>) {
        self.seconds += 1;
        self.expected += u64::from(s.expected);
        self.received += u64::from(s.received);
        let (shift, how) = correction(s, theta);
        self.correction = Some(self.correction.map_or(how, |c| c.min(how)));
        if s.delays == 0 {
            return;
        }
        self.samples += u64::from(s.delays);
        let min = s.min_ns as f64 + shift;
        let p99 = s.p99_ns as f64 + shift;
        self.min = Some(self.min.map_or(min, |m| m.min(min)));
        self.p99 = Some(self.p99.map_or(p99, |m| m.max(p99)));
        self.p50s.push(s.p50_ns as f64 + shift);
    }

    fn finish(mut self, k: &PathFrom, dst: &str, age_ms: u64) -> PathView {
        self.p50s.sort_by(f64::total_cmp);
        let n = self.p50s.len();
        let p50 = match n {
            0 => None,
            _ if n % 2 == 1 => Some(self.p50s[n / 2]),
            _ => Some((self.p50s[n / 2 - 1] + self.p50s[n / 2]) / 2.0),
        };
        let us = |x: Option<f64>| x.map(|v| v / 1_000.0).and_then(finite);
        PathView {
            src: k.src.clone(),
            src_nic: k.src_nic.clone(),
            dst: dst.to_owned(),
            dst_nic: k.dst_nic.clone(),
            rail: k.rail,
            min_us: us(self.min),
            p50_us: us(p50),
            p99_us: us(self.p99),
            loss_pct: (self.expected > 0).then(|| {
                let got = self.received.min(self.expected) as f64;
                100.0 * (1.0 - got / self.expected as f64)
            }),
            expected: self.expected,
            received: self.received,
            samples: self.samples,
            seconds: self.seconds,
            age_ms,
            correction: self.correction.unwrap_or(Correction::Raw),
        }
    }
}

/// The network solution's `clock_peer − clock_self` when `self`'s clock
/// reads `t_self_ns` (none unless both are in the solution).
pub fn network_offset(sol: &Solution, self_id: u32, peer_id: u32, t_self_ns: i64) -> Option<f64> {
    let me = sol.host(HostId(self_id))?;
    let peer = sol.host(HostId(peer_id))?;
    // The reference reads t_self − x_self then; two fixed-point passes
    // (each shrinks the error by the drift, ≤ 1e-3).
    let mut t_ref = t_self_ns;
    for _ in 0..2 {
        let x = me.offset_at(sol.at_ns, t_ref);
        t_ref = t_self_ns.saturating_sub(x.round() as i64);
    }
    Some(peer.offset_at(sol.at_ns, t_ref) - me.offset_at(sol.at_ns, t_ref))
}

/// One edge per host pair and rail from fresh reports, the smaller-id
/// reporter's when both ends' are fresh; ordered by (pair, rail).
pub fn select_edges(
    st: &ClusterState,
    clocks: &HashMap<String, HashMap<(String, u32), ClockReport>>,
    now: Instant,
) -> Vec<SelectedEdge> {
    let mut best: BTreeMap<(u32, u32, u32), SelectedEdge> = BTreeMap::new();
    for (reporter, table) in clocks {
        let Some(rh) = st.hosts.get(reporter) else {
            continue;
        };
        for ((peer, rail), r) in table {
            if now.saturating_duration_since(r.arrived) > CLOCK_FRESH {
                continue;
            }
            let Some(ph) = st.hosts.get(peer) else {
                continue;
            };
            let key = (rh.id.min(ph.id), rh.id.max(ph.id), *rail);
            if best.get(&key).is_some_and(|e| e.from_id < rh.id) {
                continue;
            }
            best.insert(
                key,
                SelectedEdge {
                    from: reporter.clone(),
                    to: peer.clone(),
                    from_id: rh.id,
                    to_id: ph.id,
                    rail: *rail,
                    report: r.clone(),
                    queueing_ns: 0.0,
                },
            );
        }
    }
    let mut quietest: BTreeMap<(u32, u32), i64> = BTreeMap::new();
    for ((a, b, _), e) in &best {
        if let Some(n) = e.report.ntp {
            let q = quietest.entry((*a, *b)).or_insert(n.rtt_ns);
            *q = (*q).min(n.rtt_ns);
        }
    }
    best.into_iter()
        .map(|((a, b, _), mut e)| {
            if let (Some(n), Some(q)) = (e.report.ntp, quietest.get(&(a, b))) {
                e.queueing_ns = (n.rtt_ns.saturating_sub(*q)) as f64 / 2.0;
            }
            e
        })
        .collect()
}

/// The lowest-id host that is not Down and is on an edge.
pub fn pick_reference(st: &ClusterState, edges: &[SelectedEdge]) -> Option<u32> {
    let on_edge: BTreeSet<u32> = edges.iter().flat_map(|e| [e.from_id, e.to_id]).collect();
    on_edge.into_iter().find(|id| {
        st.host_ids
            .get(id)
            .and_then(|n| st.hosts.get(n))
            .is_some_and(|h| h.liveness != Liveness::Down)
    })
}

/// The median time among the reference's edges, on the reference's clock
/// (an edge reported by a peer is converted with its offset).
fn reference_time(edges: &[SelectedEdge], reference: u32) -> Option<i64> {
    let mut times: Vec<i64> = edges
        .iter()
        .filter_map(|e| {
            if e.from_id == reference {
                Some(e.report.at_ns)
            } else if e.to_id == reference {
                Some(
                    e.report
                        .at_ns
                        .saturating_add(e.report.offset_ns.round() as i64),
                )
            } else {
                None
            }
        })
        .collect();
    // The median: each estimate holds best at its own window's centre, so
    // the instant closest to most of them keeps the drift extrapolation
    // (and its error) smallest.
    times.sort_unstable();
    times.get(times.len() / 2).copied()
}

/// The NTP-style composition per host: BFS from the reference over edges
/// with an NTP estimate (the smallest round trip per pair), neighbours in
/// id order; each host's offset is the sum of its hops.
pub fn ntp_tree(
    edges: &[SelectedEdge],
    reference: u32,
    names: &BTreeMap<u32, String>,
) -> BTreeMap<u32, NtpComposition> {
    let mut best: BTreeMap<(u32, u32), (&SelectedEdge, NtpReport)> = BTreeMap::new();
    for e in edges {
        let Some(n) = e.report.ntp else { continue };
        let key = (e.from_id.min(e.to_id), e.from_id.max(e.to_id));
        if best.get(&key).is_none_or(|(_, b)| n.rtt_ns < b.rtt_ns) {
            best.insert(key, (e, n));
        }
    }
    let mut adj: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    for &(a, b) in best.keys() {
        adj.entry(a).or_default().insert(b);
        adj.entry(b).or_default().insert(a);
    }
    let name = |id: u32| names.get(&id).cloned().unwrap_or_else(|| id.to_string());
    let mut out = BTreeMap::new();
    out.insert(
        reference,
        NtpComposition {
            offset_ns: 0.0,
            hops: Vec::new(),
        },
    );
    let mut queue = VecDeque::from([reference]);
    while let Some(parent) = queue.pop_front() {
        let base = out[&parent].clone();
        for &child in adj.get(&parent).into_iter().flatten() {
            if out.contains_key(&child) {
                continue;
            }
            let (e, n) = best[&(parent.min(child), parent.max(child))];
            // The report says clock_to − clock_from.
            let offset_ns = if e.from_id == parent {
                n.offset_ns
            } else {
                -n.offset_ns
            };
            let mut hops = base.hops.clone();
            hops.push(NtpHop {
                from: name(parent),
                to: name(child),
                rail: e.rail,
                reporter: e.from.clone(),
                at_ns: n.at_ns,
                offset_ns,
                rtt_ns: n.rtt_ns,
            });
            out.insert(
                child,
                NtpComposition {
                    offset_ns: base.offset_ns + offset_ns,
                    hops,
                },
            );
            queue.push_back(child);
        }
    }
    out
}

/// The state a host with error bound `bound_ns` should have, given its
/// committed state: leaving a better state needs the bound to exceed that
/// state's threshold by [`HYSTERESIS`].
pub fn classify(prev: ClockState, bound_ns: f64, cfg: &SolveConfig) -> ClockState {
    let plain = model_state(cfg.state_of(bound_ns));
    match prev {
        ClockState::Synced if bound_ns <= cfg.synced_ns * HYSTERESIS => ClockState::Synced,
        ClockState::Synced | ClockState::Degraded
            if plain == ClockState::Unsynced && bound_ns <= cfg.degraded_ns * HYSTERESIS =>
        {
            ClockState::Degraded
        }
        _ => plain,
    }
}

/// The clock state changes to commit: every host whose state from
/// `solved` (solved or held over; Unsynced when absent) differs from its
/// committed one.
/// `h`'s clock at `now` ([`Solved::clock_at`]), except that a Down host
/// is not held over (not from an earlier solution, nor while the last
/// solution stands in).
fn host_clock(
    solved: &Solved,
    h: &crate::model::Host,
    now: Instant,
    cfg: &SolveConfig,
) -> Option<(clocksync::HostClock, Option<Duration>)> {
    solved
        .clock_at(h.id, now, cfg)
        .filter(|(_, held)| held.is_none() || h.liveness != Liveness::Down)
}

pub fn clock_changes(
    st: &ClusterState,
    solved: Option<&Solved>,
    cfg: &SolveConfig,
    now: Instant,
) -> Vec<ClockChange> {
    st.hosts
        .values()
        .filter_map(|h| {
            let solved = solved
                .and_then(|s| host_clock(s, h, now, cfg))
                .map(|(c, _)| c);
            let (state, offset_ns, error_bound_ns) = match solved {
                Some(c) => (
                    classify(h.clock.state, c.error_bound_ns, cfg),
                    Some(c.offset_ns),
                    Some(c.error_bound_ns),
                ),
                None => (ClockState::Unsynced, None, None),
            };
            (state != h.clock.state).then(|| ClockChange {
                host: h.name.clone(),
                state,
                offset_ns,
                error_bound_ns,
            })
        })
        .collect()
}

/// Runs on every supervisor; solves and commits clock state changes every
/// [`TICK`] while it leads, forgets everything when it does not.
pub async fn run(sup: Arc<Supervisor>, clocks: Arc<ClockService>) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut leading = false;
    let mut leading_since = Instant::now();
    loop {
        tick.tick().await;
        if !sup.leads() {
            if leading {
                tracing::info!("no longer leading: clock data forgotten");
                leading = false;
            }
            clocks.clear();
            continue;
        }
        if !leading {
            tracing::info!("leader: clock service starts, rebuilt from the agents' next summaries");
            leading = true;
            leading_since = Instant::now();
        }
        let now = Instant::now();
        let input = sup.read(|st| clocks.solve_input(st, now));
        let cfg = clocks.config().clone();
        let solved = match input {
            None => None,
            Some(input) => {
                let unix_ms = crate::node::now_ms();
                let cfg = cfg.clone();
                match tokio::task::spawn_blocking(move || input.solve(&cfg, now, unix_ms)).await {
                    Ok(s) => Some(Ok(s)),
                    Err(e) => {
                        tracing::warn!(error = %e, "clock solve task failed");
                        Some(Err(format!("the solve task failed: {e}")))
                    }
                }
            }
        };
        match solved {
            Some(Ok(mut s)) => {
                let keep: BTreeSet<u32> = sup.read(|st| {
                    st.hosts
                        .values()
                        .filter(|h| h.liveness != Liveness::Down)
                        .map(|h| h.id)
                        .collect()
                });
                clocks.hold_over(&mut s, &keep, now);
                clocks.set_solved(Some(s), now);
            }
            Some(Err(why)) => clocks.set_solve_failed(why, now),
            None => clocks.set_solved(None, now),
        }
        let current = clocks.solved();
        let changes = sup.read(|st| clock_changes(st, current.as_deref(), &cfg, now));
        if changes.is_empty() || leading_since.elapsed() < WARMUP {
            continue;
        }
        for c in &changes {
            tracing::info!(host = %c.host, state = ?c.state, offset_ns = ?c.offset_ns, error_bound_ns = ?c.error_bound_ns, "host clock state changes");
        }
        if let Err(e) = sup.propose(Command::SetClockStates { changes }).await {
            tracing::warn!(error = %e, "cannot commit clock states");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{NicSpec, Proposal};
    use openraft::{CommittedLeaderId, LogId};
    use proto::v1::{PathStats, PeerClock};

    /// Hosts `h0..hn` with one data NIC `rail0` on rail 0.
    fn state(n: usize) -> ClusterState {
        state_with_rails(n, 1)
    }

    /// Hosts `h0..hn` with data NICs `rail0..rail<rails>`, one per rail.
    fn state_with_rails(n: usize, rails: u32) -> ClusterState {
        let mut st = ClusterState::default();
        for i in 0..n {
            let cmd = Command::RegisterHost {
                host: format!("h{i}"),
                nics: (0..rails)
                    .map(|r| NicSpec {
                        name: format!("rail{r}"),
                        rail: Some(r),
                        backup: None,
                        rdma_device: None,
                        addr: Some(format!("10.{r}.0.{i}")),
                    })
                    .collect(),
                labels: Default::default(),
            };
            st.apply_proposal(
                &LogId::new(CommittedLeaderId::new(1, 1), i as u64 + 1),
                &Proposal {
                    at_ms: 1,
                    cmds: vec![cmd],
                },
            );
        }
        st
    }

    const T0: i64 = 1_700_000_000_000_000_000;

    /// True clocks: host i is `offsets[i]` ns ahead of the reference h0,
    /// without drift.
    fn peer_clock(offsets: &[f64], me: usize, peer: usize, err: f64) -> PeerClock {
        PeerClock {
            peer: format!("h{peer}"),
            rail: 0,
            at_ns: T0 + offsets[me] as i64,
            offset_ns: offsets[peer] - offsets[me],
            drift_ppb: 0.0,
            error_bound_ns: err,
            drift_error_ppb: 1.0,
            samples: 100,
            has_ntp: true,
            ntp_at_ns: T0 + offsets[me] as i64,
            ntp_offset_ns: offsets[peer] - offsets[me] + 500.0,
            ntp_rtt_ns: 40_000,
        }
    }

    /// Every host reports a clock to every other (a complete graph) with
    /// error bound `err`, received at `at`.
    fn report_all(svc: &ClockService, st: &ClusterState, offsets: &[f64], err: f64, at: Instant) {
        let n = offsets.len();
        for me in 0..n {
            let clocks = (0..n)
                .filter(|&p| p != me)
                .map(|p| peer_clock(offsets, me, p, err))
                .collect();
            svc.ingest(st, &summary(&format!("h{me}"), clocks, vec![]), at)
                .unwrap();
        }
    }

    fn summary(host: &str, clocks: Vec<PeerClock>, paths: Vec<PathStats>) -> ProbeSummary {
        ProbeSummary {
            host: host.into(),
            sent_ns: T0,
            plan_version: 1,
            clocks,
            paths,
            bytes_sent: 0,
            shaped: Vec::new(),
            pairs_per_s: 80,
            max_pairs_per_s: 100,
            probe_cpu_pct: Some(0.9),
            probe_cpu_budget_pct: 1.0,
        }
    }

    fn path(peer: &str, received: u32) -> PathStats {
        PathStats {
            peer: peer.into(),
            rail: 0,
            nic: "rail0".into(),
            peer_nic: "rail0".into(),
            expected: 100,
            received,
            delays: received,
            min_ns: 10_000,
            p50_ns: 12_000,
            p99_ns: 20_000,
            line_at_ns: T0,
            line_offset_ns: 0.0,
            corrected: true,
        }
    }

    fn is_empty(svc: &ClockService) -> bool {
        let s = svc.lock();
        s.clocks.is_empty() && s.paths.is_empty() && s.evidence.is_empty()
    }

    #[test]
    fn malformed_summaries_are_refused_and_store_nothing() {
        let st = state(3);
        let svc = ClockService::default();
        let now = Instant::now();
        let offsets = [0.0, 100.0, -50.0];
        let good = || peer_clock(&offsets, 0, 1, 100.0);
        let cases: Vec<(ProbeSummary, &str)> = vec![
            (
                summary("ghost", vec![good()], vec![]),
                "\"ghost\" is not registered",
            ),
            (
                summary("h0", vec![good(); MAX_SUMMARY_CLOCKS + 1], vec![]),
                "at most 256 peer clocks",
            ),
            (
                summary("h0", vec![], vec![path("h1", 1); MAX_SUMMARY_PATHS + 1]),
                "at most 256 path statistics",
            ),
            (
                summary(
                    "h0",
                    vec![PeerClock {
                        offset_ns: f64::NAN,
                        ..good()
                    }],
                    vec![path("h1", 5)],
                ),
                "must be finite",
            ),
            (
                summary(
                    "h0",
                    vec![PeerClock {
                        error_bound_ns: f64::INFINITY,
                        ..good()
                    }],
                    vec![],
                ),
                "must be finite",
            ),
            (
                summary(
                    "h0",
                    vec![PeerClock {
                        error_bound_ns: -1.0,
                        ..good()
                    }],
                    vec![],
                ),
                "≥ 0",
            ),
            (
                summary(
                    "h0",
                    vec![PeerClock {
                        ntp_offset_ns: f64::NAN,
                        ..good()
                    }],
                    vec![],
                ),
                "NTP offset",
            ),
            (
                summary(
                    "h0",
                    vec![PeerClock {
                        peer: "h0".into(),
                        ..good()
                    }],
                    vec![],
                ),
                "against itself",
            ),
            (
                summary(
                    "h0",
                    vec![good()],
                    vec![PathStats {
                        line_offset_ns: f64::NEG_INFINITY,
                        ..path("h1", 5)
                    }],
                ),
                "line offset",
            ),
            (
                summary(
                    "h0",
                    vec![good()],
                    vec![PathStats {
                        p50_ns: 1,
                        ..path("h1", 5)
                    }],
                ),
                "min ≤ p50 ≤ p99",
            ),
        ];
        for (i, (s, want)) in cases.into_iter().enumerate() {
            let e = svc.ingest(&st, &s, now).unwrap_err();
            assert!(e.to_string().contains(want), "case {i}: {e}");
            let api = ApiError::from(e);
            let kind = if i == 0 {
                ErrorKind::NotFound
            } else {
                ErrorKind::InvalidArgument
            };
            assert_eq!(api.kind, kind, "case {i}");
            assert!(is_empty(&svc), "case {i}: nothing stored");
        }
    }

    /// Two hosts, both rails: rail 0 stays queued one way (its offset is
    /// 3 µs off, its round trip 6 µs longer). The two edges are parallel,
    /// so no loop can expose either; the round-trip excess gives rail 0 a
    /// 3 µs error and the solve follows the quiet rail.
    #[test]
    fn a_rail_that_stays_queued_weighs_little_next_to_a_quiet_one() {
        let st = state_with_rails(2, 2);
        let svc = ClockService::default();
        let now = Instant::now();
        let offsets = [0.0, 100.0];
        let clean = peer_clock(&offsets, 0, 1, 10.0);
        let queued = PeerClock {
            rail: 0,
            offset_ns: clean.offset_ns + 3_000.0,
            ntp_rtt_ns: clean.ntp_rtt_ns + 6_000,
            ..clean.clone()
        };
        let quiet = PeerClock { rail: 1, ..clean };
        svc.ingest(&st, &summary("h0", vec![queued, quiet], vec![]), now)
            .unwrap();
        let input = svc.solve_input(&st, now).expect("fresh edges");
        let q: Vec<(u32, f64)> = input
            .edges
            .iter()
            .map(|e| (e.rail, e.queueing_ns))
            .collect();
        assert_eq!(q, vec![(0, 3_000.0), (1, 0.0)]);
        let solved = input.solve(&SolveConfig::default(), now, 0);
        let sol = solved.solution.expect("solved");
        let h1 = sol.host(HostId(1)).expect("h1 solved");
        // Equal weights would land half way, 1.5 µs off.
        assert!((h1.offset_ns - 100.0).abs() < 5.0, "{h1:?}");
    }

    /// Regression: a negative NTP-style round trip (relative drift over
    /// the gap between the paired one-way probes) once made the leader
    /// refuse whole summaries, and with them every clock, path and probe
    /// evidence of the host.
    #[test]
    fn a_negative_ntp_round_trip_is_a_measurement_not_malformed() {
        let st = state(3);
        let svc = ClockService::default();
        let now = Instant::now();
        let offsets = [0.0, 100.0, -50.0];
        let s = summary(
            "h0",
            vec![
                PeerClock {
                    ntp_rtt_ns: -1_500,
                    ..peer_clock(&offsets, 0, 1, 100.0)
                },
                peer_clock(&offsets, 0, 2, 100.0),
            ],
            vec![path("h1", 0)],
        );
        let got = svc.ingest(&st, &s, now).unwrap();
        assert_eq!((got.clocks, got.paths, got.ignored), (2, 1, 0));
        let input = svc.solve_input(&st, now).expect("fresh edges");
        assert_eq!(input.edges.len(), 2);
        let ntp = input.edges[0].report.ntp.expect("the NTP estimate is kept");
        assert_eq!(ntp.rtt_ns, -1_500);
    }

    #[test]
    fn unknown_peers_rails_and_nics_are_ignored_and_evidence_needs_received_probes() {
        let st = state(3);
        let svc = ClockService::default();
        let now = Instant::now();
        let offsets = [0.0, 100.0, -50.0];
        let s = summary(
            "h0",
            vec![
                peer_clock(&offsets, 0, 1, 100.0),
                PeerClock {
                    peer: "ghost".into(),
                    ..peer_clock(&offsets, 0, 1, 100.0)
                },
                PeerClock {
                    rail: 7,
                    ..peer_clock(&offsets, 0, 2, 100.0)
                },
            ],
            vec![
                path("h1", 0),
                path("h2", 3),
                path("ghost", 3),
                PathStats {
                    nic: "eth9".into(),
                    ..path("h1", 3)
                },
            ],
        );
        let got = svc.ingest(&st, &s, now).unwrap();
        assert_eq!(
            got,
            Ingested {
                clocks: 1,
                paths: 2,
                ignored: 4
            }
        );
        let ev = svc.probe_evidence();
        // h1's probes: 0 received on rail0, 3 on a path naming an unknown
        // NIC (still evidence that h1 is alive); h2's: 3 received.
        assert_eq!(
            ev.keys().collect::<BTreeSet<_>>(),
            BTreeSet::from([&"h1".to_string(), &"h2".to_string()])
        );
        let s = summary("h1", vec![], vec![path("h0", 0)]);
        svc.ingest(&st, &s, now).unwrap();
        assert!(
            !svc.probe_evidence().contains_key("h0"),
            "nothing received is no evidence"
        );
    }

    #[test]
    fn both_ends_report_one_edge_the_smaller_id_preferred_while_fresh() {
        let st = state(3);
        let svc = ClockService::default();
        let t = Instant::now();
        let offsets = [0.0, 100.0, -50.0];
        svc.ingest(
            &st,
            &summary("h1", vec![peer_clock(&offsets, 1, 0, 90.0)], vec![]),
            t,
        )
        .unwrap();
        svc.ingest(
            &st,
            &summary("h0", vec![peer_clock(&offsets, 0, 1, 80.0)], vec![]),
            t + Duration::from_millis(500),
        )
        .unwrap();
        let store = svc.lock();
        let edges = select_edges(&st, &store.clocks, t + Duration::from_secs(1));
        assert_eq!(edges.len(), 1);
        assert_eq!((edges[0].from_id, edges[0].to_id), (0, 1));
        // Both go stale; then only h1 reports again, and its report is used.
        let edges = select_edges(&st, &store.clocks, t + Duration::from_millis(3_600));
        assert_eq!(edges.len(), 0, "both stale");
        drop(store);
        svc.ingest(
            &st,
            &summary("h1", vec![peer_clock(&offsets, 1, 0, 90.0)], vec![]),
            t + Duration::from_secs(4),
        )
        .unwrap();
        let store = svc.lock();
        let edges = select_edges(&st, &store.clocks, t + Duration::from_millis(4_100));
        assert_eq!((edges[0].from_id, edges[0].to_id), (1, 0));
        assert_eq!(edges[0].report.offset_ns, -100.0);
    }

    /// A 5-host mesh with known offsets, every host reporting its
    /// neighbours: the solve recovers the offsets, every host is Synced,
    /// the NTP composition sums its hops.
    #[test]
    fn a_consistent_mesh_solves_synced_with_an_ntp_baseline() {
        let mut st = state(5);
        let svc = ClockService::default();
        let now = Instant::now();
        let offsets = [0.0, 1_000.0, -2_500.0, 40_000.0, 7.0];
        report_all(&svc, &st, &offsets, 200.0, now);
        // The reference skips a Down host.
        st.hosts.get_mut("h0").unwrap().liveness = Liveness::Down;
        let input = svc.solve_input(&st, now).unwrap();
        assert_eq!(input.reference, 1);
        assert_eq!(input.edges.len(), 10, "one edge per pair");
        st.hosts.get_mut("h0").unwrap().liveness = Liveness::Ready;
        let input = svc.solve_input(&st, now).unwrap();
        assert_eq!(input.reference, 0);
        assert_eq!(input.at_ns, T0);
        let solved = input.solve(svc.config(), now, 0);
        let sol = solved.solution.as_ref().expect("solved");
        for (i, want) in offsets.iter().enumerate() {
            let got = sol.host(HostId(i as u32)).unwrap();
            assert!(
                (got.offset_ns - want).abs() < 1.0,
                "h{i}: {}",
                got.offset_ns
            );
            assert!(got.error_bound_ns < 200.0);
            let ntp = &solved.ntp[&(i as u32)];
            let sum: f64 = ntp.hops.iter().map(|h| h.offset_ns).sum();
            assert_eq!(ntp.offset_ns, sum);
            assert_eq!(
                ntp.hops.len(),
                usize::from(i != 0),
                "complete graph: one hop"
            );
            if i > 0 {
                // h0 reports every edge to it; each carries a +500 ns bias.
                assert_eq!(ntp.offset_ns, want + 500.0);
            }
        }
        let changes = clock_changes(&st, Some(&solved), svc.config(), now);
        assert_eq!(changes.len(), 5);
        assert!(changes.iter().all(|c| c.state == ClockState::Synced));
        // Views.
        svc.set_solved(Some(solved), now);
        let v = svc.clock_view(&st, 1, now);
        assert_eq!(v.reference.as_deref(), Some("h0"));
        assert_eq!(v.edges.len(), 10);
        assert!(v.edges.iter().all(|e| e.status == Some(EdgeFit::Used)));
        assert!(v.hosts.iter().all(|h| h.live.is_some() && h.ntp.is_some()));
        // Each host's probe rate and cost, as its summary gave them.
        assert!(
            v.hosts.iter().all(|h| h.probe
                == Some(ProbeLoad {
                    pairs_per_s: 80,
                    max_pairs_per_s: 100,
                    cpu_pct: Some(0.9),
                    cpu_budget_pct: 1.0,
                    age_ms: 0,
                })),
            "{:?}",
            v.hosts
        );
        // The JSON parses back (no NaN/inf anywhere; serde_json's float
        // parsing may differ in the last bit, so compare the shape).
        let json = serde_json::to_string(&crate::api::AdminReply::Clock(v.clone())).unwrap();
        let back: crate::api::AdminReply = serde_json::from_str(&json).unwrap();
        let crate::api::AdminReply::Clock(b) = back else {
            panic!("not a clock reply: {json}");
        };
        assert_eq!(
            (b.reference, b.edges.len(), b.hosts.len()),
            (v.reference, 10, 5)
        );
    }

    #[test]
    fn a_host_that_drops_out_is_held_over_with_a_growing_bound_then_unsynced() {
        let mut st = state(4);
        let svc = ClockService::default();
        let t0 = Instant::now();
        let offsets = [0.0, 1_000.0, -2_500.0, 40_000.0];
        report_all(&svc, &st, &offsets, 200.0, t0);
        let first = svc.solve_input(&st, t0).unwrap().solve(svc.config(), t0, 0);
        for c in clock_changes(&st, Some(&first), svc.config(), t0) {
            st.hosts.get_mut(&c.host).unwrap().clock.state = c.state;
        }
        let base = first
            .solution
            .as_ref()
            .unwrap()
            .host(HostId(3))
            .unwrap()
            .clone();
        svc.set_solved(Some(first.clone()), t0);
        // 5 s later h3 is missing from the solution (its paths too busy).
        let later = |secs: u64, drop: bool| {
            let mut s = first.clone();
            let sol = s.solution.as_mut().unwrap();
            sol.at_ns += secs as i64 * 1_000_000_000;
            if drop {
                sol.hosts.retain(|c| c.host != HostId(3));
            }
            s.at = t0 + Duration::from_secs(secs);
            s
        };
        let all: BTreeSet<u32> = (0..4).collect();
        // A Down host is not held over.
        let mut down = later(5, true);
        let not_h3: BTreeSet<u32> = (0..3).collect();
        svc.hold_over(&mut down, &not_h3, t0 + Duration::from_secs(5));
        assert!(down.held.is_empty(), "h3 Down: not held");
        let mut second = later(5, true);
        let now = t0 + Duration::from_secs(5);
        svc.hold_over(&mut second, &all, now);
        let held = second.held.get(&3).expect("h3 held over");
        let want = base.offset_ns + base.drift_ppb * 5.0;
        assert!((held.clock.offset_ns - want).abs() < 1e-6, "{held:?}");
        let grown = base.error_bound_ns + base.drift_error_ppb * 5.0;
        assert!((held.clock.error_bound_ns - grown).abs() < 1e-6, "{held:?}");
        assert!(held.clock.error_bound_ns >= base.error_bound_ns);
        assert_eq!(second.held.len(), 1, "only the host that dropped out");
        assert!(
            clock_changes(&st, Some(&second), svc.config(), now).is_empty(),
            "h3 keeps its state while its bound allows"
        );
        svc.set_solved(Some(second), now);
        let v = svc.clock_view(&st, 1, now);
        let h3 = v.hosts.iter().find(|h| h.host == "h3").unwrap();
        let live = h3.live.as_ref().expect("held clock shown");
        assert_eq!(live.holdover_ms, Some(5_000));
        assert!(v
            .hosts
            .iter()
            .filter(|h| h.host != "h3")
            .all(|h| h.live.as_ref().is_some_and(|l| l.holdover_ms.is_none())));
        // Still missing after the longest holdover: Unsynced.
        let mut third = later(31, true);
        svc.hold_over(&mut third, &all, t0 + Duration::from_secs(31));
        assert!(third.held.is_empty(), "held at most {MAX_HOLDOVER:?}");
        let c = clock_changes(
            &st,
            Some(&third),
            svc.config(),
            t0 + Duration::from_secs(31),
        );
        assert_eq!(c.len(), 1);
        assert_eq!(
            (c[0].host.as_str(), c[0].state),
            ("h3", ClockState::Unsynced)
        );
        // Another reference: nothing carries over.
        let mut other = later(6, true);
        other.reference = 1;
        svc.hold_over(&mut other, &all, t0 + Duration::from_secs(6));
        assert!(other.held.is_empty());
        // Back in the solution: solved again, not held.
        let mut back = later(7, false);
        svc.hold_over(&mut back, &all, t0 + Duration::from_secs(7));
        assert!(back.held.is_empty());
    }

    #[test]
    fn ticks_without_a_solution_let_the_last_one_stand_in_aged_then_unsync() {
        let mut st = state(4);
        let svc = ClockService::default();
        let t0 = Instant::now();
        let offsets = [0.0, 1_000.0, -2_500.0, 40_000.0];
        report_all(&svc, &st, &offsets, 200.0, t0);
        let mut first = svc.solve_input(&st, t0).unwrap().solve(svc.config(), t0, 0);
        // h2's drift is known to 50 ppm only: its bound grows fast.
        let sol = first.solution.as_mut().unwrap();
        sol.hosts
            .iter_mut()
            .find(|c| c.host == HostId(2))
            .unwrap()
            .drift_error_ppb = 50_000.0;
        svc.set_solved(Some(first), t0);
        for c in clock_changes(&st, svc.solved().as_deref(), svc.config(), t0) {
            st.hosts.get_mut(&c.host).unwrap().clock.state = c.state;
        }
        assert!(st
            .hosts
            .values()
            .all(|h| h.clock.state == ClockState::Synced));
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        // 5 s of summaries lost (no fresh edges), then a failing solve:
        // the last solution stands in; nobody is unsynced for it.
        svc.set_solved(None, at(5));
        let failed = Solved {
            solution: None,
            error: Some("singular".into()),
            at: at(6),
            ..(*svc.solved().unwrap()).clone()
        };
        svc.set_solve_failed("the solve task failed: panicked".into(), at(6));
        assert_eq!(
            svc.clock_view(&st, 1, at(6)).solve_error.as_deref(),
            Some("the solve task failed: panicked")
        );
        svc.set_solved(Some(failed), at(6));
        let standing = svc.solved().unwrap();
        assert!(standing.solution.is_some(), "the last solution stands in");
        let changes = clock_changes(&st, Some(&standing), svc.config(), at(6));
        // ...but its bounds age: h2's by 50 ppm × 6 s = 300 µs (Unsynced),
        // the others' by their ppb-level drift errors (still Synced).
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert_eq!(
            (changes[0].host.as_str(), changes[0].state),
            ("h2", ClockState::Unsynced)
        );
        let v = svc.clock_view(&st, 1, at(6));
        assert_eq!(v.solve_error.as_deref(), Some("singular"));
        assert_eq!(v.solution.as_ref().map(|s| s.age_ms), Some(6_000));
        for h in v.hosts.iter().filter(|h| h.host != "h0") {
            let live = h.live.as_ref().expect("aged clock shown");
            assert_eq!(live.holdover_ms, Some(6_000), "{h:?}");
        }
        let h2 = v.hosts.iter().find(|h| h.host == "h2").unwrap();
        let b = h2.live.as_ref().unwrap().error_bound_ns;
        assert!((300_000.0..301_000.0).contains(&b), "{b}");
        // A host that goes Down meanwhile is not held.
        st.hosts.get_mut("h1").unwrap().liveness = Liveness::Down;
        let changes = clock_changes(&st, Some(&standing), svc.config(), at(6));
        assert!(changes
            .iter()
            .any(|c| c.host == "h1" && c.state == ClockState::Unsynced));
        let v = svc.clock_view(&st, 1, at(6));
        assert!(v.hosts.iter().any(|h| h.host == "h1" && h.live.is_none()));
        st.hosts.get_mut("h1").unwrap().liveness = Liveness::Ready;
        // A solution again: it takes over, fresh.
        let fresh = svc
            .solve_input(&st, at(2))
            .unwrap()
            .solve(svc.config(), at(7), 0);
        svc.set_solved(Some(fresh), at(7));
        let v = svc.clock_view(&st, 1, at(7));
        assert_eq!(v.solve_error, None);
        assert!(v
            .hosts
            .iter()
            .all(|h| h.live.as_ref().is_some_and(|l| l.holdover_ms.is_none())));
        // Nothing for longer than the longest holdover: every host Unsynced.
        svc.set_solved(None, at(20));
        assert!(
            svc.solved().unwrap().solution.is_some(),
            "13 s old: stands in"
        );
        svc.set_solved(None, at(38));
        assert!(svc.solved().is_none(), "31 s old: gone");
        let c = clock_changes(&st, svc.solved().as_deref(), svc.config(), at(38));
        assert_eq!(c.len(), 4);
        assert!(c.iter().all(|c| c.state == ClockState::Unsynced));
    }

    #[test]
    fn probe_load_reports_from_old_agents_or_with_nonsense_are_not_shown() {
        let st = state(3);
        let svc = ClockService::default();
        let now = Instant::now();
        let mut old = summary("h0", vec![], vec![]);
        (old.pairs_per_s, old.max_pairs_per_s, old.probe_cpu_pct) = (0, 0, None);
        old.probe_cpu_budget_pct = 0.0;
        svc.ingest(&st, &old, now).unwrap();
        let mut nan = summary("h1", vec![], vec![]);
        nan.probe_cpu_budget_pct = f64::NAN;
        svc.ingest(&st, &nan, now).unwrap();
        let mut over = summary("h2", vec![], vec![]);
        over.pairs_per_s = 500;
        svc.ingest(&st, &over, now).unwrap();
        let v = svc.clock_view(&st, 1, now);
        assert!(v.hosts.iter().all(|h| h.probe.is_none()), "{:?}", v.hosts);
        // The JSON stays parseable (no NaN).
        let json = serde_json::to_string(&crate::api::AdminReply::Clock(v)).unwrap();
        serde_json::from_str::<crate::api::AdminReply>(&json).unwrap();
        // A sound one is shown.
        svc.ingest(&st, &summary("h2", vec![], vec![]), now)
            .unwrap();
        let v = svc.clock_view(&st, 1, now);
        assert!(v.hosts.iter().any(|h| h.host == "h2" && h.probe.is_some()));
    }

    #[test]
    fn no_edges_leave_every_host_unsynced() {
        let mut st = state(1);
        let svc = ClockService::default();
        assert!(svc.solve_input(&st, Instant::now()).is_none());
        assert!(
            clock_changes(&st, None, svc.config(), Instant::now()).is_empty(),
            "already Unsynced"
        );
        st.hosts.get_mut("h0").unwrap().clock.state = ClockState::Synced;
        let c = clock_changes(&st, None, svc.config(), Instant::now());
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].state, c[0].offset_ns), (ClockState::Unsynced, None));
    }

    #[test]
    fn classification_has_hysteresis() {
        let cfg = SolveConfig::default();
        use ClockState::*;
        assert_eq!(classify(Unsynced, 900.0, &cfg), Synced);
        assert_eq!(classify(Synced, 1_200.0, &cfg), Synced);
        assert_eq!(classify(Synced, 1_300.0, &cfg), Degraded);
        assert_eq!(classify(Degraded, 1_100.0, &cfg), Degraded);
        assert_eq!(classify(Degraded, 1_000.0, &cfg), Synced);
        assert_eq!(classify(Degraded, 120_000.0, &cfg), Degraded);
        assert_eq!(classify(Synced, 120_000.0, &cfg), Degraded);
        assert_eq!(classify(Degraded, 130_000.0, &cfg), Unsynced);
        assert_eq!(classify(Unsynced, 110_000.0, &cfg), Unsynced);
    }

    #[test]
    fn paths_are_network_corrected_aggregated_sorted_and_filtered() {
        let st = state(3);
        let svc = ClockService::default();
        let now = Instant::now();
        // h1 is 1 µs ahead of h0, h2 3 µs behind. True OWD h1 → h0 = 10 µs.
        let offsets = [0.0, 1_000.0, -3_000.0];
        report_all(&svc, &st, &offsets, 50.0, now);
        let solved = svc
            .solve_input(&st, now)
            .unwrap()
            .solve(svc.config(), now, 0);
        svc.set_solved(Some(solved), now);
        // h0 receives from h1 on a pair line 200 ns off (it thinks h1 is
        // 1.2 µs ahead): owd_pair = raw + line = 10 µs + 200 ns.
        for k in 0..3 {
            let p = PathStats {
                received: 90 + k,
                delays: 90 + k,
                min_ns: 10_200,
                p50_ns: 11_200 + 1_000 * i64::from(k),
                p99_ns: 20_200 + 1_000 * i64::from(k),
                line_at_ns: T0,
                line_offset_ns: 1_200.0,
                ..path("h1", 0)
            };
            svc.ingest(&st, &summary("h0", vec![], vec![p]), now)
                .unwrap();
        }
        // h2 → h0: raw delays (no pair line): raw = owd − θ = 50 µs + 3 µs.
        let raw = PathStats {
            received: 100,
            delays: 100,
            min_ns: 53_000,
            p50_ns: 53_000,
            p99_ns: 53_000,
            corrected: false,
            line_offset_ns: 0.0,
            ..path("h2", 0)
        };
        svc.ingest(&st, &summary("h0", vec![], vec![raw]), now)
            .unwrap();
        let v = svc.paths_view(&st, 1, None, None, now).unwrap();
        assert_eq!(v.total, 2);
        let first = &v.paths[0];
        assert_eq!((first.src.as_str(), first.dst.as_str()), ("h2", "h0"));
        assert_eq!(first.correction, Correction::Network);
        assert!((first.min_us.unwrap() - 50.0).abs() < 0.01, "{first:?}");
        let p = &v.paths[1];
        assert_eq!((p.src.as_str(), p.dst.as_str(), p.rail), ("h1", "h0", 0));
        assert_eq!(p.correction, Correction::Network);
        assert!((p.min_us.unwrap() - 10.0).abs() < 0.01, "{p:?}");
        assert!(
            (p.p50_us.unwrap() - 12.0).abs() < 0.01,
            "median of 11, 12, 13: {p:?}"
        );
        assert!(
            (p.p99_us.unwrap() - 22.0).abs() < 0.01,
            "max of the p99s: {p:?}"
        );
        assert_eq!(
            (p.expected, p.received, p.samples, p.seconds),
            (300, 273, 273, 3)
        );
        assert!((p.loss_pct.unwrap() - 9.0).abs() < 1e-9);
        // --top, --host and their errors.
        let v = svc.paths_view(&st, 1, None, Some(1), now).unwrap();
        assert_eq!((v.total, v.paths.len()), (2, 1));
        let v = svc.paths_view(&st, 1, Some("h2"), None, now).unwrap();
        assert_eq!(v.paths.len(), 1);
        assert_eq!(
            svc.paths_view(&st, 1, Some("ghost"), None, now)
                .unwrap_err()
                .kind,
            ErrorKind::NotFound
        );
        assert_eq!(
            svc.paths_view(&st, 1, None, Some(0), now).unwrap_err().kind,
            ErrorKind::InvalidArgument
        );
        // Without a solution (the last one too old to stand in): the pair
        // line only, or raw.
        svc.set_solved(None, now + MAX_HOLDOVER + Duration::from_secs(1));
        let v = svc.paths_view(&st, 1, None, None, now).unwrap();
        let by_src = |s: &str| v.paths.iter().find(|p| p.src == s).unwrap().clone();
        assert_eq!(by_src("h1").correction, Correction::Pair);
        assert!((by_src("h1").min_us.unwrap() - 10.2).abs() < 0.01);
        assert_eq!(by_src("h2").correction, Correction::Raw);
        // Old seconds leave the window.
        let later = now + PATH_WINDOW + Duration::from_secs(1);
        assert_eq!(svc.paths_view(&st, 1, None, None, later).unwrap().total, 0);
    }
}
