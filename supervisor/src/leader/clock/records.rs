//! What the clock service keeps and hands out: its bounds and windows,
//! the per-reporter clock reports, the per-second path records, shaped NIC
//! traffic, probe load, the solve's input and output ([`SelectedEdge`],
//! [`Solved`], [`Held`]) and the corrected path seconds the contention
//! detector reads ([`PathSample`]). Types only (a leaf of `clock/`).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clocksync::Solution;

use crate::api::{Correction, NtpComposition, ProbeLoad};
use crate::model::ClockState;

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
/// Longest a host's clock is carried forward from its last solution.
pub const MAX_HOLDOVER: Duration = Duration::from_secs(30);
/// A solution this old has had ticks without a newer one: the view marks
/// its clocks held over (a fresh one is a tick old plus its solve time).
pub const STALE_AFTER: Duration = Duration::from_secs(3);
/// How `paths` combines per-second figures (also in the reply).
pub const AGGREGATION: &str = "min: min of the per-second minima; p50: median of the per-second \
     medians; p99: max of the per-second p99s; loss: 1 - sum(received)/sum(expected)";

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
pub(super) struct PathSecond {
    pub(super) arrived: Instant,
    /// The receiver's clock reading the correction is evaluated at: the
    /// pair line's time, or the summary's send time for raw delays.
    pub(super) at_ns: i64,
    pub(super) expected: u32,
    pub(super) received: u32,
    pub(super) delays: u32,
    pub(super) min_ns: i64,
    pub(super) p50_ns: i64,
    pub(super) p99_ns: i64,
    /// The pair line's offset (peer − receiver) the delays include; none
    /// when the delays are raw.
    pub(super) line_offset_ns: Option<f64>,
}

/// A shaped NIC's traffic as last reported.
pub(super) struct ShapedTrack {
    pub(super) at: Instant,
    pub(super) bytes: u64,
    pub(super) busy_at: Option<Instant>,
}

/// A directed path into a receiving host.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct PathFrom {
    pub(super) src: String,
    pub(super) src_nic: String,
    pub(super) dst_nic: String,
    pub(super) rail: u32,
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

/// The inputs of one solve, taken from the store and the model.
#[derive(Debug, Clone)]
pub struct SolveInput {
    pub edges: Vec<SelectedEdge>,
    pub reference: u32,
    /// The reference clock's reading the solution is wanted at.
    pub at_ns: i64,
    pub(super) names: BTreeMap<u32, String>,
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
pub(super) struct Store {
    /// reporter → (peer, rail) → latest report.
    pub(super) clocks: HashMap<String, HashMap<(String, u32), ClockReport>>,
    /// receiver → path → recent seconds (oldest first).
    pub(super) paths: HashMap<String, HashMap<PathFrom, VecDeque<PathSecond>>>,
    /// host → when a peer last reported receiving its probes.
    pub(super) evidence: HashMap<String, Instant>,
    /// (host, NIC) → its shaped classes' traffic, as last reported.
    pub(super) shaped: HashMap<(String, String), ShapedTrack>,
    /// host → its probe rate and cost, as last reported.
    /// (`age_ms` is filled in by the view.)
    pub(super) probe_load: HashMap<String, (ProbeLoad, Instant)>,
    /// The latest solution (standing in while ticks bring none; see the
    /// module docs), or the latest failed solve when there is none.
    pub(super) solved: Option<Arc<Solved>>,
    /// Why the latest tick brought no solution (none: it did).
    pub(super) solve_error: Option<String>,
}

impl Store {
    /// `host`'s probes were received at `at`: keeps the newer of that and
    /// what the store knew.
    pub(super) fn heard(&mut self, host: String, at: Instant) {
        let e = self.evidence.entry(host).or_insert(at);
        *e = (*e).max(at);
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

/// At most 64 characters of a name, for error messages and logs.
pub fn short(s: &str) -> String {
    s.chars().take(64).collect()
}

pub(super) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

pub(super) fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

pub(super) fn model_state(s: clocksync::ClockState) -> ClockState {
    match s {
        clocksync::ClockState::Synced => ClockState::Synced,
        clocksync::ClockState::Degraded => ClockState::Degraded,
        clocksync::ClockState::Unsynced => ClockState::Unsynced,
    }
}
