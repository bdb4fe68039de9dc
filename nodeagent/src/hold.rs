//! On-Ramp-style edge holding (NSDI'21): while the outgoing one-way delay
//! to a peer stands more than a threshold above its baseline, the shaped
//! jobs' connections to that peer are held at the sender (paced down to
//! [`HOLD_RATE_BYTES_PER_S`]) so the queue in the fabric drains instead of
//! growing; they are paced back once the queueing falls below half the
//! threshold.
//!
//! **Signal.** The probe mesh's outgoing queueing per peer NIC
//! ([`crate::probe::queueing::QueueingBoard`]); a sample older than
//! [`MAX_SAMPLE_AGE`] is stale, and stale means *release* (no evidence, no
//! hold).
//!
//! **Targets.** A [`HoldLoop`] serves one NIC shaped by a `ShapeNic` with
//! `hold_queueing_us > 0`. Its targets are the job connections currently on
//! that NIC whose job has a class labelled `job <name>` in the order and
//! whose peer address (the peer host's NIC on the NIC's rail, as the probe
//! plan gives it) is a destination of that class. Targets are re-read from
//! the inventory every [`TARGETS_EVERY`]; a held connection that stops
//! being a target is released.
//!
//! **Decisions** ([`decide`], pure): every [`CHECK_EVERY`], per connection,
//! hold when queueing > threshold, release when < threshold / 2 or stale.
//! Pace orders go out only on transitions, at most
//! [`MAX_TRANSITIONS_PER_S`] per connection per second (extra ones are
//! dropped and counted; the connection keeps its state until the next
//! allowed one). An order is awaited for at most [`ORDER_TIMEOUT`], never
//! retried.
//!
//! **Stopping.** [`HoldLoop::stop`] (a new order for the NIC, `ClearShape`)
//! releases every held connection and returns the loop's counters.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::control::{ConnKey, Control};
use crate::probe::queueing::QueueingBoard;

/// The pace of a held connection: 1 Mbit/s. The job contract's `pace`
/// takes `None` for unpaced, so a hold is never 0.
pub const HOLD_RATE_BYTES_PER_S: u64 = 125_000;
/// How often the loop looks at the queueing.
pub const CHECK_EVERY: Duration = Duration::from_millis(10);
/// How often the loop re-reads its target connections.
pub const TARGETS_EVERY: Duration = Duration::from_millis(100);
/// Samples older than this are stale (release).
pub const MAX_SAMPLE_AGE: Duration = Duration::from_millis(100);
/// Transitions per connection per second; more are dropped.
pub const MAX_TRANSITIONS_PER_S: u32 = 20;
/// How long one batch of pace orders is awaited.
pub const ORDER_TIMEOUT: Duration = Duration::from_millis(100);
/// How often the loop logs its counters.
pub const STATS_EVERY: Duration = Duration::from_secs(10);
/// How long stopping may take (the final releases included).
pub const STOP_TIMEOUT: Duration = Duration::from_secs(2);

/// A change of a connection's hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    Hold,
    Release,
}

/// One connection's hold state.
#[derive(Debug, Clone, Default)]
pub struct HoldState {
    /// Held since (None: released).
    pub held_since: Option<Instant>,
    /// Start of the current one-second transition window and the
    /// transitions in it.
    window: Option<Instant>,
    in_window: u32,
    /// Transitions dropped by the rate bound.
    pub dropped: u64,
}

impl HoldState {
    pub fn held(&self) -> bool {
        self.held_since.is_some()
    }
}

/// The hold decision for one connection at `now`: `queueing` is the
/// latest outgoing queueing to its peer (ns) and its age (None: no
/// sample). Hold above `threshold_ns`; release below half of it or when
/// the sample is stale or missing. Updates `state` and returns the
/// transition to carry out, if any (at most [`MAX_TRANSITIONS_PER_S`] per
/// second; a dropped one is counted in `state.dropped`).
pub fn decide(
    threshold_ns: i64,
    queueing: Option<(i64, Duration)>,
    state: &mut HoldState,
    now: Instant,
) -> Option<Transition> {
    let fresh = queueing.filter(|(_, age)| *age <= MAX_SAMPLE_AGE);
    let want_held = match (fresh, state.held()) {
        (None, _) => false,
        (Some((q, _)), false) => q > threshold_ns,
        (Some((q, _)), true) => q >= threshold_ns / 2,
    };
    if want_held == state.held() {
        return None;
    }
    let window_over = state
        .window
        .is_none_or(|w| now.saturating_duration_since(w) >= Duration::from_secs(1));
    if window_over {
        state.window = Some(now);
        state.in_window = 0;
    }
    if state.in_window >= MAX_TRANSITIONS_PER_S {
        state.dropped += 1;
        return None;
    }
    state.in_window += 1;
    if want_held {
        state.held_since = Some(now);
        Some(Transition::Hold)
    } else {
        state.held_since = None;
        Some(Transition::Release)
    }
}

/// What one hold loop did (for order details and logs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HoldCounters {
    pub holds: u64,
    pub releases: u64,
    /// Total time connections spent held (summed over connections).
    pub held: Duration,
    /// Transitions dropped by the rate bound.
    pub dropped: u64,
    /// Pace orders not confirmed in time or refused.
    pub order_failures: u64,
    /// Connections held now.
    pub held_now: usize,
    /// Target connections at the last look.
    pub targets: usize,
}

impl std::fmt::Display for HoldCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} holds, {} releases, held {} ms, {} dropped, {} order failures",
            self.holds,
            self.releases,
            self.held.as_millis(),
            self.dropped,
            self.order_failures
        )
    }
}

/// One job's part of a hold: the destinations of its class and the pace to
/// go back to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobHold {
    pub dsts: BTreeSet<Ipv4Addr>,
    /// Bytes/s per connection from the order (None: unpaced).
    pub release_bytes_per_s: Option<u64>,
}

/// What a hold loop serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldSpec {
    pub nic: String,
    pub rail: u32,
    pub threshold_ns: i64,
    pub jobs: BTreeMap<String, JobHold>,
}

/// A target connection.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    addr: Ipv4Addr,
    peer: String,
    release: Option<u64>,
}

/// A running hold loop (one per NIC).
pub struct HoldLoop {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    counters: Arc<Mutex<HoldCounters>>,
}

impl HoldLoop {
    /// Starts the loop for `spec`.
    pub fn start(spec: HoldSpec, control: Arc<Control>, board: Arc<QueueingBoard>) -> Self {
        let (stop, stop_rx) = watch::channel(false);
        let counters = Arc::new(Mutex::new(HoldCounters::default()));
        tracing::info!(nic = %spec.nic, rail = spec.rail, threshold_us = spec.threshold_ns / 1_000, jobs = spec.jobs.len(), "edge holding on");
        let task = tokio::spawn(run(spec, control, board, counters.clone(), stop_rx));
        Self {
            stop,
            task,
            counters,
        }
    }

    /// The counters so far.
    pub fn counters(&self) -> HoldCounters {
        self.counters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Stops the loop after it released every held connection (at most
    /// [`STOP_TIMEOUT`]; then it is aborted) and returns its counters.
    pub async fn stop(mut self) -> HoldCounters {
        let _ = self.stop.send(true);
        if tokio::time::timeout(STOP_TIMEOUT, &mut self.task)
            .await
            .is_err()
        {
            tracing::warn!("edge hold loop did not stop in time; aborted");
            self.task.abort();
        }
        self.counters()
    }
}

/// The current targets: connections on the NIC of a held job whose peer
/// address is one of the job's destinations.
fn targets(spec: &HoldSpec, control: &Control, board: &QueueingBoard) -> BTreeMap<ConnKey, Target> {
    let mut out = BTreeMap::new();
    for r in control.conns() {
        let c = &r.conn;
        if c.nic != spec.nic {
            continue;
        }
        let Some(job) = spec.jobs.get(&c.job) else {
            continue;
        };
        let Some(addr) = board.address_of(&c.peer_host, spec.rail) else {
            continue;
        };
        if !job.dsts.contains(&addr) {
            continue;
        }
        out.insert(
            ConnKey {
                job: c.job.clone(),
                rank: c.rank,
                conn_id: c.conn_id,
            },
            Target {
                addr,
                peer: c.peer_host.clone(),
                release: job.release_bytes_per_s,
            },
        );
    }
    out
}

async fn run(
    spec: HoldSpec,
    control: Arc<Control>,
    board: Arc<QueueingBoard>,
    counters: Arc<Mutex<HoldCounters>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut states: BTreeMap<ConnKey, HoldState> = BTreeMap::new();
    let mut tgts: BTreeMap<ConnKey, Target> = BTreeMap::new();
    let mut next_targets = Instant::now();
    let mut next_stats = Instant::now() + STATS_EVERY;
    let mut last_logged = HoldCounters::default();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => break,
        }
        let now = Instant::now();
        // (transition, release pace) → connections
        let mut batches: BTreeMap<(bool, Option<u64>), Vec<ConnKey>> = BTreeMap::new();
        if now >= next_targets {
            next_targets = now + TARGETS_EVERY;
            tgts = targets(&spec, &control, &board);
            // Held connections that are no longer targets go back.
            let gone: Vec<ConnKey> = states
                .keys()
                .filter(|k| !tgts.contains_key(*k))
                .cloned()
                .collect();
            for k in gone {
                if let Some(st) = states.remove(&k) {
                    if let Some(since) = st.held_since {
                        let mut c = counters.lock().unwrap_or_else(|e| e.into_inner());
                        c.releases += 1;
                        c.held += now.saturating_duration_since(since);
                        // Its release pace is no longer known: the
                        // inventory lost it or it left the NIC; unpace.
                        batches.entry((false, None)).or_default().push(k);
                    }
                }
            }
        }
        // One board read per peer address per tick.
        let mut seen: BTreeMap<Ipv4Addr, Option<(i64, Duration)>> = BTreeMap::new();
        for (k, t) in &tgts {
            let q = *seen
                .entry(t.addr)
                .or_insert_with(|| board.queueing(t.addr, now));
            let st = states.entry(k.clone()).or_default();
            let since = st.held_since;
            let dropped = st.dropped;
            let Some(tr) = decide(spec.threshold_ns, q, st, now) else {
                if st.dropped != dropped {
                    counters.lock().unwrap_or_else(|e| e.into_inner()).dropped += 1;
                }
                continue;
            };
            let mut c = counters.lock().unwrap_or_else(|e| e.into_inner());
            let queueing_us = q.map(|(q, _)| q / 1_000);
            let age_ms = q.map(|(_, a)| a.as_millis() as u64);
            match tr {
                Transition::Hold => {
                    c.holds += 1;
                    tracing::info!(nic = %spec.nic, conn = %k, peer = %t.peer, addr = %t.addr, queueing_us = ?queueing_us, threshold_us = spec.threshold_ns / 1_000, "edge hold: connection held");
                    batches
                        .entry((true, Some(HOLD_RATE_BYTES_PER_S)))
                        .or_default()
                        .push(k.clone());
                }
                Transition::Release => {
                    c.releases += 1;
                    let held = since.map_or(Duration::ZERO, |s| now.saturating_duration_since(s));
                    c.held += held;
                    tracing::info!(nic = %spec.nic, conn = %k, peer = %t.peer, addr = %t.addr, queueing_us = ?queueing_us, sample_age_ms = ?age_ms, held_ms = held.as_millis() as u64, "edge hold: connection released");
                    batches
                        .entry((false, t.release))
                        .or_default()
                        .push(k.clone());
                }
            }
        }
        send(&control, &spec.nic, batches, &counters).await;
        {
            let mut c = counters.lock().unwrap_or_else(|e| e.into_inner());
            c.held_now = states.values().filter(|s| s.held()).count();
            c.targets = tgts.len();
            if now >= next_stats {
                next_stats = now + STATS_EVERY;
                if *c != last_logged {
                    tracing::info!(nic = %spec.nic, holds = c.holds, releases = c.releases, held_ms = c.held.as_millis() as u64, dropped = c.dropped, order_failures = c.order_failures, held_now = c.held_now, targets = c.targets, "edge hold counters");
                    last_logged = c.clone();
                } else {
                    tracing::debug!(nic = %spec.nic, targets = c.targets, "edge hold: nothing new");
                }
            }
        }
    }
    // Release everything still held.
    let now = Instant::now();
    let mut batches: BTreeMap<(bool, Option<u64>), Vec<ConnKey>> = BTreeMap::new();
    let mut c = counters.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for (k, st) in &states {
        if let Some(since) = st.held_since {
            c.releases += 1;
            c.held += now.saturating_duration_since(since);
            let release = tgts.get(k).and_then(|t| t.release);
            batches.entry((false, release)).or_default().push(k.clone());
        }
    }
    c.held_now = 0;
    *counters.lock().unwrap_or_else(|e| e.into_inner()) = c.clone();
    send(&control, &spec.nic, batches, &counters).await;
    let c = counters.lock().unwrap_or_else(|e| e.into_inner()).clone();
    tracing::info!(nic = %spec.nic, holds = c.holds, releases = c.releases, held_ms = c.held.as_millis() as u64, dropped = c.dropped, order_failures = c.order_failures, "edge holding off; every connection released");
}

/// Sends the batches' pace orders (one wait of at most [`ORDER_TIMEOUT`]
/// per batch) and counts the failures.
async fn send(
    control: &Control,
    nic: &str,
    batches: BTreeMap<(bool, Option<u64>), Vec<ConnKey>>,
    counters: &Mutex<HoldCounters>,
) {
    for ((hold, rate), keys) in batches {
        let o = control.pace_conns(&keys, rate, ORDER_TIMEOUT).await;
        let failed = (keys.len() - o.paced.min(keys.len())) as u64;
        if failed > 0 {
            counters
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .order_failures += failed;
            tracing::warn!(nic = %nic, hold, bytes_per_s = ?rate, conns = keys.len(), paced = o.paced, failed = ?o.failed, "edge hold: pace orders not confirmed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: i64 = 1_000_000; // 1 ms

    fn q(ns: i64, age_ms: u64) -> Option<(i64, Duration)> {
        Some((ns, Duration::from_millis(age_ms)))
    }

    #[test]
    fn holds_above_the_threshold_and_releases_below_half() {
        let mut s = HoldState::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert_eq!(decide(T, q(900_000, 5), &mut s, at(0)), None);
        assert_eq!(decide(T, q(T, 5), &mut s, at(10)), None, "not above");
        assert_eq!(
            decide(T, q(1_200_000, 5), &mut s, at(20)),
            Some(Transition::Hold)
        );
        assert_eq!(s.held_since, Some(at(20)));
        // Hysteresis: between half and the threshold it stays held.
        assert_eq!(decide(T, q(600_000, 5), &mut s, at(30)), None);
        assert_eq!(decide(T, q(T / 2, 5), &mut s, at(40)), None);
        assert!(s.held());
        assert_eq!(
            decide(T, q(400_000, 5), &mut s, at(50)),
            Some(Transition::Release)
        );
        // And between half and the threshold it stays released.
        assert_eq!(decide(T, q(800_000, 5), &mut s, at(60)), None);
        assert!(!s.held());
    }

    #[test]
    fn stale_or_missing_samples_release() {
        let t0 = Instant::now();
        let mut s = HoldState::default();
        assert_eq!(decide(T, q(5 * T, 5), &mut s, t0), Some(Transition::Hold));
        assert_eq!(
            decide(T, q(5 * T, 101), &mut s, t0 + Duration::from_millis(10)),
            Some(Transition::Release),
            "stale"
        );
        assert_eq!(
            decide(T, q(5 * T, 150), &mut s, t0 + Duration::from_millis(20)),
            None,
            "a stale sample never holds"
        );
        assert_eq!(
            decide(T, q(5 * T, 100), &mut s, t0 + Duration::from_millis(30)),
            Some(Transition::Hold),
            "100 ms old is still fresh"
        );
        assert_eq!(
            decide(T, None, &mut s, t0 + Duration::from_millis(40)),
            Some(Transition::Release)
        );
    }

    #[test]
    fn transitions_are_bounded_per_second() {
        let t0 = Instant::now();
        let mut s = HoldState::default();
        let mut done = 0;
        // Flapping every 10 ms for a second: 100 wanted transitions.
        for i in 0..100u64 {
            let v = if i % 2 == 0 { 2 * T } else { 0 };
            if decide(T, q(v, 1), &mut s, t0 + Duration::from_millis(i * 10)).is_some() {
                done += 1;
            }
        }
        assert_eq!(done, MAX_TRANSITIONS_PER_S);
        // After the 20th (a release) every wanted hold is dropped: 40.
        assert_eq!(s.dropped, 40);
        // A new second allows more.
        let v = if s.held() { 0 } else { 2 * T };
        assert!(decide(T, q(v, 1), &mut s, t0 + Duration::from_millis(1_000)).is_some());
    }

    #[test]
    fn counters_read_well() {
        let c = HoldCounters {
            holds: 3,
            releases: 2,
            held: Duration::from_millis(1_500),
            dropped: 1,
            ..Default::default()
        };
        assert_eq!(
            c.to_string(),
            "3 holds, 2 releases, held 1500 ms, 1 dropped, 0 order failures"
        );
    }
}
