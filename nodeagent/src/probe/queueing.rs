//! Outgoing queueing per (peer NIC, rail): how far the one-way delay of
//! this host's probes to a peer stands above that path's calm baseline
//! (the edge-holding signal, see [`crate::hold`]).
//!
//! **Samples.** Every closed pair of this host's probes to a peer (its two
//! transmit stamps, the peer's two receive stamps from an `Rx` record)
//! gives one outgoing one-way delay: `rx₀ − tx₀ − offset(tx₀)` under the
//! path's current pair line (raw `rx₀ − tx₀` while there is none).
//!
//! **Baseline.** The minimum over the last [`BASELINE_WINDOW`] of *calm*
//! samples: those at most [`CALM_SLACK_NS`] above the baseline so far (any
//! sample while there is none). The minimum is kept per
//! [`BUCKET_NS`]-long bucket, so the window costs a fixed
//! [`MAX_BUCKETS`] entries. A standing queue produces no calm samples, so
//! the baseline does not climb onto it: when the window has no calm sample
//! left, the last baseline is kept for up to [`BASELINE_HOLD_NS`], after
//! which the path starts over (a route that really became longer).
//! When the pair line changes, every stored delay is re-expressed under the
//! new line, so a clock re-estimate does not look like queueing.
//!
//! **Publishing.** The probe thread copies each path's latest sample into a
//! [`QueueingBoard`] once per tick (a small map behind a mutex, keyed by
//! the peer NIC's address); readers take a copy of one entry.

use std::collections::{BTreeMap, VecDeque};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use clocksync::Estimate;

/// How long the rolling minimum looks back (ns).
pub const BASELINE_WINDOW_NS: i64 = 30_000_000_000;
/// [`BASELINE_WINDOW_NS`] as a duration.
pub const BASELINE_WINDOW: Duration = Duration::from_secs(30);
/// One bucket of the rolling minimum (ns).
pub const BUCKET_NS: i64 = 1_000_000_000;
/// Buckets kept (the window plus the bucket being filled).
pub const MAX_BUCKETS: usize = (BASELINE_WINDOW_NS / BUCKET_NS) as usize + 1;
/// A sample at most this far above the baseline is calm (ns).
pub const CALM_SLACK_NS: i64 = 50_000;
/// How long a baseline without calm samples is kept (ns).
pub const BASELINE_HOLD_NS: i64 = 300_000_000_000;

/// The latest outgoing sample of one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutgoingSample {
    /// This host's transmit stamp of the pair (ns, its clock).
    pub tx_ns: i64,
    /// The one-way delay (ns) under the line (raw without one).
    pub owd_ns: i64,
    /// The baseline it was compared with (ns).
    pub baseline_ns: i64,
    /// `owd_ns − baseline_ns`, at least 0.
    pub queueing_ns: i64,
    /// When the pair closed (its receive stamps came back).
    pub at: Instant,
}

/// Rolling baseline and latest sample of one directed path me → peer.
#[derive(Debug, Clone, Default)]
pub struct OutgoingTracker {
    /// (bucket index, time of its minimum (ns), minimum delay (ns)) of calm
    /// samples, oldest first.
    buckets: VecDeque<(i64, i64, i64)>,
    /// The last baseline and the time of the last calm sample (ns).
    held: Option<(i64, i64)>,
    latest: Option<OutgoingSample>,
    /// `latest` not yet published.
    fresh: bool,
}

impl OutgoingTracker {
    /// The baseline at `t_ns` (None: no calm sample within
    /// [`BASELINE_HOLD_NS`]).
    fn baseline(&self, t_ns: i64) -> Option<i64> {
        let in_window = self
            .buckets
            .iter()
            .filter(|b| b.1 > t_ns.saturating_sub(BASELINE_WINDOW_NS))
            .map(|b| b.2)
            .min();
        in_window.or_else(|| {
            self.held
                .filter(|&(_, last)| t_ns.saturating_sub(last) <= BASELINE_HOLD_NS)
                .map(|(b, _)| b)
        })
    }

    /// One closed pair: transmit stamp `tx_ns`, raw delay `raw_ns`
    /// (`rx − tx`, mixed clocks), under `line`.
    pub fn add(&mut self, tx_ns: i64, raw_ns: i64, line: Option<&Estimate>, now: Instant) {
        let owd = match line {
            Some(e) => raw_ns.saturating_sub(e.offset_at(tx_ns).round() as i64),
            None => raw_ns,
        };
        let before = self.baseline(tx_ns);
        if before.is_none() {
            self.buckets.clear();
            self.held = None;
        }
        let calm = before.is_none_or(|b| owd <= b.saturating_add(CALM_SLACK_NS));
        if calm {
            let idx = tx_ns.div_euclid(BUCKET_NS);
            match self.buckets.back_mut() {
                Some(b) if b.0 == idx => {
                    if owd < b.2 {
                        *b = (idx, tx_ns, owd);
                    }
                }
                _ => {
                    if self.buckets.len() >= MAX_BUCKETS {
                        self.buckets.pop_front();
                    }
                    self.buckets.push_back((idx, tx_ns, owd));
                }
            }
            let cutoff = tx_ns.saturating_sub(BASELINE_WINDOW_NS);
            while self.buckets.front().is_some_and(|b| b.1 <= cutoff) {
                self.buckets.pop_front();
            }
        }
        let baseline = self.baseline(tx_ns).unwrap_or(owd);
        if calm {
            self.held = Some((baseline, tx_ns));
        }
        self.latest = Some(OutgoingSample {
            tx_ns,
            owd_ns: owd,
            baseline_ns: baseline,
            queueing_ns: owd.saturating_sub(baseline).max(0),
            at: now,
        });
        self.fresh = true;
    }

    /// The pair line changed from `old` to `new`: re-expresses every stored
    /// delay under `new`.
    pub fn reline(&mut self, old: Option<&Estimate>, new: Option<&Estimate>) {
        let off = |e: Option<&Estimate>, t: i64| e.map_or(0, |e| e.offset_at(t).round() as i64);
        // owd = raw − old(t)  →  raw − new(t) = owd + old(t) − new(t)
        let shift = |t: i64| off(old, t).saturating_sub(off(new, t));
        for b in &mut self.buckets {
            b.2 = b.2.saturating_add(shift(b.1));
        }
        if let Some((b, t)) = &mut self.held {
            *b = b.saturating_add(shift(*t));
        }
    }

    /// The latest sample, if not taken since it was made.
    pub fn take_fresh(&mut self) -> Option<OutgoingSample> {
        if std::mem::take(&mut self.fresh) {
            self.latest
        } else {
            None
        }
    }

    /// The latest sample.
    pub fn latest(&self) -> Option<OutgoingSample> {
        self.latest
    }
}

/// One path's entry on the board.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerQueueing {
    /// The peer's host name (as the probe plan gives it).
    pub peer: String,
    pub rail: u32,
    pub sample: OutgoingSample,
}

impl PeerQueueing {
    /// The sample's age at `now`.
    pub fn age(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.sample.at)
    }
}

/// The latest outgoing queueing of every probed path, keyed by the peer
/// NIC's address. Written by the probe thread once per tick; read by the
/// hold loops. Holds at most one entry per path of the current plan.
#[derive(Debug, Default)]
pub struct QueueingBoard {
    inner: Mutex<Board>,
}

#[derive(Debug, Default)]
struct Board {
    plan_version: u64,
    paths: BTreeMap<Ipv4Addr, PeerQueueing>,
}

impl QueueingBoard {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn lock(&self) -> MutexGuard<'_, Board> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes fresh samples; a new plan version first drops every entry
    /// (paths that left the plan must not linger).
    pub fn publish<'a>(
        &self,
        plan_version: u64,
        samples: impl IntoIterator<Item = (Ipv4Addr, &'a str, u32, OutgoingSample)>,
    ) {
        let mut b = self.lock();
        if b.plan_version != plan_version {
            b.paths.clear();
            b.plan_version = plan_version;
        }
        for (addr, peer, rail, sample) in samples {
            match b.paths.get_mut(&addr) {
                Some(e) if e.peer == peer && e.rail == rail => e.sample = sample,
                _ => {
                    b.paths.insert(
                        addr,
                        PeerQueueing {
                            peer: peer.to_owned(),
                            rail,
                            sample,
                        },
                    );
                }
            }
        }
    }

    /// The entry of the peer NIC at `addr`.
    pub fn get(&self, addr: Ipv4Addr) -> Option<PeerQueueing> {
        self.lock().paths.get(&addr).cloned()
    }

    /// The address and entry of `peer`'s NIC on `rail`.
    pub fn find(&self, peer: &str, rail: u32) -> Option<(Ipv4Addr, PeerQueueing)> {
        self.lock()
            .paths
            .iter()
            .find(|(_, e)| e.peer == peer && e.rail == rail)
            .map(|(a, e)| (*a, e.clone()))
    }

    /// The queueing (ns) to the peer NIC at `addr` and its sample's age at
    /// `now` (no allocation).
    pub fn queueing(&self, addr: Ipv4Addr, now: Instant) -> Option<(i64, Duration)> {
        self.lock()
            .paths
            .get(&addr)
            .map(|e| (e.sample.queueing_ns, e.age(now)))
    }

    /// The address of `peer`'s NIC on `rail` (no allocation).
    pub fn address_of(&self, peer: &str, rail: u32) -> Option<Ipv4Addr> {
        self.lock()
            .paths
            .iter()
            .find(|(_, e)| e.peer == peer && e.rail == rail)
            .map(|(a, _)| *a)
    }

    /// Every entry (for logs and tests).
    pub fn snapshot(&self) -> Vec<(Ipv4Addr, PeerQueueing)> {
        self.lock()
            .paths
            .iter()
            .map(|(a, e)| (*a, e.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests;
