//! Path statistics: per-second one-way delays of a directed path corrected
//! with the network clock solution (or the pair line, or raw), folded over
//! the window for `railguard paths`, and read back as fresh corrected
//! seconds by the contention detector.

use std::collections::HashMap;
use std::time::Instant;

use clocksync::{HostId, Solution};

use crate::api::{Correction, PathView};
use crate::leader::clock::records::{finite, PathFrom, PathSample, PathSecond, Store, PATH_WINDOW};
use crate::model::ClusterState;

/// The shift that corrects a second's delays, and how: owd_net =
/// owd_pair + (θ_net − line_offset); raw delays are owd − θ, so they take
/// θ whole. `theta` is the network solution's `clock_src − clock_dst` at
/// the second's time, if known.
pub(super) fn correction(s: &PathSecond, theta: Option<f64>) -> (f64, Correction) {
    match (s.line_offset_ns, theta) {
        (Some(line), Some(t)) => (t - line, Correction::Network),
        (Some(_), None) => (0.0, Correction::Pair),
        (None, Some(t)) => (t, Correction::Network),
        (None, None) => (0.0, Correction::Raw),
    }
}

/// Per-second figures of one path folded over the window.
#[derive(Default)]
pub(super) struct PathAggregate {
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
    pub(super) fn add(&mut self, s: &PathSecond, theta: Option<f64>) {
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

    pub(super) fn finish(mut self, k: &PathFrom, dst: &str, age_ms: u64) -> PathView {
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

/// Every path's seconds that arrived after `after` (all without),
/// oldest first per path, with the delays corrected like `paths`
/// does: what the contention detector ([`crate::leader::contention`]) reads.
pub(super) fn path_seconds_after(
    store: &Store,
    st: &ClusterState,
    after: Option<Instant>,
    now: Instant,
) -> Vec<PathSample> {
    let hosts: HashMap<&str, u32> = st.hosts.values().map(|h| (h.name.as_str(), h.id)).collect();
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
