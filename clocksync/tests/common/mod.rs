//! A synthetic probe-mesh simulator with known truth, shared by the
//! integration tests.
//!
//! Time: `tau` is true time in ns since the experiment's start (f64, so
//! sub-ns exact over minutes). A host clock reads
//! `BASE + theta + (1 + rho)·tau`, rounded to whole ns.

#![allow(dead_code)]

use clocksync::{Direction, Probe, ProbePair};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// An epoch-like clock base, so timestamps have realistic magnitude.
pub const BASE: i64 = 1_700_000_000_000_000_000;

/// Gap between the two probes of a coded pair (true ns).
pub const GAP_NS: f64 = 10_000.0;

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

pub fn exp(rng: &mut StdRng, mean: f64) -> f64 {
    -mean * (1.0 - rng.gen::<f64>()).ln()
}

/// Gamma with integer shape `k` and the given mean.
pub fn gamma(rng: &mut StdRng, k: u32, mean: f64) -> f64 {
    (0..k).map(|_| exp(rng, mean / k as f64)).sum()
}

pub fn normal(rng: &mut StdRng, sigma: f64) -> f64 {
    let u1: f64 = 1.0 - rng.gen::<f64>();
    let u2: f64 = rng.gen();
    sigma * (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

#[derive(Debug, Clone, Copy)]
pub struct Clock {
    /// Offset at tau = 0 (ns).
    pub theta: f64,
    /// Rate error (e.g. 1e-4 = 100 ppm).
    pub rho: f64,
}

impl Clock {
    pub fn random(rng: &mut StdRng, max_offset_ns: f64, max_rho: f64) -> Self {
        Self {
            theta: rng.gen_range(-max_offset_ns..=max_offset_ns),
            rho: rng.gen_range(-max_rho..=max_rho),
        }
    }

    pub fn exact(&self, tau: f64) -> f64 {
        self.theta + (1.0 + self.rho) * tau
    }

    pub fn read(&self, tau: f64) -> i64 {
        BASE + self.exact(tau).round() as i64
    }

    /// True time at which this clock reads `t`.
    pub fn tau_at(&self, t: i64) -> f64 {
        ((t - BASE) as f64 - self.theta) / (1.0 + self.rho)
    }
}

/// True `clock_b - clock_a` when clock `a` reads `t`.
pub fn true_offset(a: &Clock, b: &Clock, t: i64) -> f64 {
    let tau = a.tau_at(t);
    b.exact(tau) - a.exact(tau)
}

/// True `d(clock_b - clock_a)/d(clock_a)` in ppb.
pub fn true_drift_ppb(a: &Clock, b: &Clock) -> f64 {
    ((1.0 + b.rho) / (1.0 + a.rho) - 1.0) * 1e9
}

/// One direction of a path.
#[derive(Debug, Clone, Copy)]
pub struct Path {
    /// Propagation + stack floor (ns).
    pub base_ns: f64,
    /// Probability a probe finds the queue empty.
    pub p_idle: f64,
    /// Mean queueing delay when not idle (ns).
    pub queue_mean_ns: f64,
    /// Gamma shape of the queueing delay (1 = exponential).
    pub queue_shape: u32,
    /// Probability of a big queueing burst (1–5 ms).
    pub burst_prob: f64,
    /// Gaussian jitter of every timestamp (ns).
    pub jitter_ns: f64,
    /// Probability that a pair's receive timestamps are both taken too early
    /// by `outlier_ns` (a too-small sample that passes the purity filter).
    pub outlier_prob: f64,
    pub outlier_ns: f64,
}

impl Path {
    /// A veth-like path under load: 15 µs floor, queueing on 80 % of
    /// probes (exponential, mean 20 µs), 1 % bursts, 200 ns jitter.
    pub fn loaded() -> Self {
        Self {
            base_ns: 15_000.0,
            p_idle: 0.2,
            queue_mean_ns: 20_000.0,
            queue_shape: 1,
            burst_prob: 0.01,
            jitter_ns: 200.0,
            outlier_prob: 0.0,
            outlier_ns: 0.0,
        }
    }

    fn queue(&self, rng: &mut StdRng) -> f64 {
        let mut q = if rng.gen::<f64>() < self.p_idle {
            0.0
        } else {
            gamma(rng, self.queue_shape, self.queue_mean_ns)
        };
        if rng.gen::<f64>() < self.burst_prob {
            q += rng.gen_range(1e6..5e6);
        }
        q
    }
}

/// One coded probe pair sent at true time `tau` from `src` to `dst`.
pub fn coded_pair(rng: &mut StdRng, src: &Clock, dst: &Clock, path: &Path, tau: f64) -> ProbePair {
    let q1 = path.queue(rng);
    // The second probe sees the same queue 10 µs later: if it was empty it
    // most likely still is; if not, it has drained by the gap and refilled
    // by new arrivals, almost never to exactly the same delay.
    let q2 = if q1 == 0.0 && rng.gen::<f64>() < 0.8 {
        0.0
    } else {
        (q1 - GAP_NS + exp(rng, path.queue_mean_ns)).max(0.0)
    };
    let glitch = if rng.gen::<f64>() < path.outlier_prob {
        path.outlier_ns
    } else {
        0.0
    };
    let mut probe = |t_send: f64, q: f64| {
        let t_recv = t_send + path.base_ns + q;
        Probe {
            tx_ns: src.read(t_send) + normal(rng, path.jitter_ns).round() as i64,
            rx_ns: dst.read(t_recv) + normal(rng, path.jitter_ns).round() as i64
                - glitch.round() as i64,
        }
    };
    let first = probe(tau, q1);
    let second = probe(tau + GAP_NS, q2);
    ProbePair { first, second }
}

/// Coded pairs in both directions between A and B over `[t0, t0 + dur)`
/// (true ns), `rate_hz` pairs per second per direction at randomised
/// times, merged in send order.
#[allow(clippy::too_many_arguments)]
pub fn pair_stream(
    rng: &mut StdRng,
    a: &Clock,
    b: &Clock,
    fwd: &Path,
    rev: &Path,
    t0: f64,
    dur: f64,
    rate_hz: f64,
) -> Vec<(Direction, ProbePair)> {
    let period = 1e9 / rate_hz;
    let n = (dur / period) as usize;
    let mut out = Vec::with_capacity(2 * n);
    for k in 0..n {
        for dir in [Direction::Forward, Direction::Reverse] {
            let tau = t0 + (k as f64 + rng.gen::<f64>()) * period;
            let p = match dir {
                Direction::Forward => coded_pair(rng, a, b, fwd, tau),
                Direction::Reverse => coded_pair(rng, b, a, rev, tau),
            };
            out.push((dir, p));
        }
    }
    out
}

/// Percentile (0..=100) of absolute values.
pub fn pct(v: &[f64], p: f64) -> f64 {
    let mut a: Vec<f64> = v.iter().map(|x| x.abs()).collect();
    a.sort_by(f64::total_cmp);
    let i = ((p / 100.0) * (a.len() - 1) as f64).round() as usize;
    a[i]
}

/// A random K-regular simple graph on `n` vertices (configuration model
/// with restarts).
pub fn random_regular(rng: &mut StdRng, n: usize, k: usize) -> Vec<(usize, usize)> {
    assert!((n * k).is_multiple_of(2) && k < n);
    'retry: loop {
        let mut stubs: Vec<usize> = (0..n).flat_map(|v| std::iter::repeat_n(v, k)).collect();
        let mut edges = Vec::new();
        let mut seen = std::collections::HashSet::new();
        while !stubs.is_empty() {
            let mut tries = 0;
            loop {
                tries += 1;
                if tries > 100 {
                    continue 'retry;
                }
                let i = rng.gen_range(0..stubs.len());
                let j = rng.gen_range(0..stubs.len());
                let (u, v) = (stubs[i], stubs[j]);
                if i == j || u == v || seen.contains(&(u.min(v), u.max(v))) {
                    continue;
                }
                seen.insert((u.min(v), u.max(v)));
                edges.push((u, v));
                let (hi, lo) = (i.max(j), i.min(j));
                stubs.swap_remove(hi);
                stubs.swap_remove(lo);
                break;
            }
        }
        return edges;
    }
}
