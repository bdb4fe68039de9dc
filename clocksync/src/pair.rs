//! Per-pair offset and drift estimation (one directed host pair A, B).
//!
//! # Model
//!
//! `clock_B = clock_A + offset + drift·(clock_A - at)`. Time is A's clock.
//! A forward probe (A→B, sent at A-time `t = tx_A`) gives
//! `d_f = rx_B - tx_A = owd_AB + offset(t)`; a reverse probe (B→A, received
//! at A-time `t = rx_A`) gives `d_r = rx_A - tx_B = owd_BA - offset(t)`.
//! One-way delays are at least some unknown floor, so the points `(t, d_f)`
//! lie on or above the line `offset(t) + floor_AB` and the points
//! `(t, -d_r)` on or below `offset(t) - floor_BA`.
//!
//! The offset moves by `drift·owd` during a probe's flight (200 ppm ×
//! 100 µs = 20 ns), but with forward probes placed at their send time and
//! reverse probes at their receive time (both A-side events) this cancels
//! exactly: both delays come out as `owd·(1 + rate error of B)`, so drift
//! only scales the half-gap, never the midline.
//!
//! # Fit
//!
//! The offset line is the midline of the widest strip separating the two
//! point sets: Huygens' maximum-margin (SVM) separator, with the margin taken
//! vertically. It is the exact optimum of a 3-variable LP and is computed by
//! a walk over the lower convex hull of the forward points and the upper
//! hull of the negated reverse points (see the crate-private `hull` module):
//! O(n log n) for the sort, O(n) for the rest, over at most
//! [`PairConfig::capacity`] points per direction. A whole
//! [`PairEstimator::estimate`] (fit, outlier checks, subset fits) over 200
//! samples per direction takes about 75 µs in a release build (about
//! 0.4 ms over 1000 per direction): recomputing at 10 Hz is negligible.
//!
//! Queueing only ever *adds* delay, so queued probes lie inside the strip's
//! complement and never touch the hulls: the fit is immune to them. The
//! opposite error — a sample *below* the true floor, from a timestamp taken
//! late on the sending side or early on the receiving side — would pull the
//! envelope down. Such points are peeled: after each fit, each supporting
//! point (and each side's j lowest points together, as outliers can hold
//! the envelope down for each other) is tentatively removed and the
//! strip refitted; if the removed points lie deeper below the new envelope
//! than both [`PairConfig::outlier_depth_ns`] and
//! [`PairConfig::outlier_spacing_factor`] times the usual spacing of the
//! lowest points (the q-th lowest clearance over q, q = n/4 ≥ 3: about μ/n
//! for a floor with exponential noise of mean μ), and if the new floor is
//! dense (at least max(8, n/4) points within a quarter of that depth of
//! it), they stood out from the floor and are discarded, at most
//! [`PairConfig::max_outliers`] of them. The last two tests keep sparse
//! windows, whose few floor points are naturally far apart and whose line
//! can tilt onto queued points once one is removed, from losing them.
//!
//! # Error bound
//!
//! The accepted samples of each direction are split, interleaved in time,
//! into [`PairConfig::error_subsets`] subsets; each subset is fitted on its
//! own, and the largest deviation of a subset's offset (and drift) from the
//! full fit, times [`PairConfig::error_bound_factor`] (default 2), is the
//! reported bound. An envelope estimate's error shrinks with the sample
//! count, so subsets (fewer samples, same time span) scatter at least as
//! widely as the full fit errs when the floor noise is queueing-like (error
//! ∝ 1/n); when Gaussian timestamp jitter dominates, the minimum converges
//! slowly and subsets scatter only about as widely as the full fit errs,
//! hence the factor. On the synthetic tests (see `tests/pair_accuracy.rs`)
//! the bound covers ≥ 99 % of errors in the jitter-dominated case and is
//! conservative (several times the error) in sparse windows. It never
//! exceeds the half-gap (below). A single bad sample lands in one subset
//! only and shows up as that subset's deviation. This is a statistical
//! bound under the symmetric-floor assumption. The hard, assumption-free
//! bound (only `owd ≥ 0`) is [`Estimate::half_gap_ns`]: the true offset
//! line lies inside the strip.
//!
//! # NTP-style comparison
//!
//! [`PairEstimator::ntp_estimate`]: with one-way probes in both directions
//! there are no native round trips, so each forward probe is paired with the
//! reverse probe nearest to it in A-time (within
//! [`PairConfig::ntp_max_pair_gap_ns`]); the pair with the least round-trip
//! delay `d_f + d_r` wins (NTP's clock filter) and gives
//! `offset = (d_f - d_r)/2`, which is exact for the offset at the midpoint
//! of the two probes' A-times when the two one-way delays are equal (the
//! offset is linear in time, so drift adds no error there).
//!
//! The round trip of such a pairing also carries `drift × gap`: the offset
//! moves between the two probes, which can be tens of ms apart, and at
//! 200 ppm that is µs, more than the delays on a quiet fabric. A real NTP
//! exchange has a µs server turnaround, so drift never enters its round
//! trip. To compare estimators and not pairing artefacts, the caller may
//! pass the drift to take out (the agent passes the pair fit's, as if NTP's
//! frequency discipline were perfect); the filter then ranks true round
//! trips.
//!
//! # What the synthetic tests show (`tests/pair_accuracy.rs`)
//!
//! * With idle periods on the path, the pure first-probes give p99 offset
//!   errors of a few hundred ns under 200 ns timestamp jitter; NTP-style
//!   min-RTT over the same stream finds idle pairs too and is only about 2×
//!   worse: jitter dominates both.
//! * Under heavy queueing (5 % idle) the estimate stays sub-µs while the
//!   NTP-style estimate is ≥ 10× worse at p99.
//! * On a saturated path (never idle) pure pairs are rare and random, so the
//!   purity filter starves the estimator (p99 several µs, flagged by a wide
//!   bound) while the envelope over *all* first probes stays sub-µs: the
//!   envelope does not need the filter to reject queued samples, only to
//!   reject single-probe timestamp glitches. The agent may feed all first
//!   probes when too few pairs are pure.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::hull::{fit_strip, Pt, Scratch, Strip, StripError};
use crate::probe::{purity_filter, ProbePair};

/// Which way a probe travelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Direction {
    /// A → B: tx on A's clock, rx on B's.
    Forward,
    /// B → A: tx on B's clock, rx on A's.
    Reverse,
}

/// Tuning of a [`PairEstimator`]. Defaults follow Huygens (2 s windows) and
/// the design (100 probe pairs/s per peer).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairConfig {
    /// Sliding window length on A's clock (ns). Default 2 s.
    pub window_ns: i64,
    /// Most samples kept per direction (oldest dropped first). Default 1024.
    pub capacity: usize,
    /// Fewest samples per direction for an estimate. Default 8.
    pub min_samples: usize,
    /// Largest |drift| considered (ppb); an optimum at this bound means the
    /// data do not determine the drift. Default 1,000,000 (1000 ppm).
    pub max_drift_ppb: f64,
    /// Peel a supporting point if it lies more than this (ns) below the
    /// envelope of the other points... Default 500.
    pub outlier_depth_ns: f64,
    /// ...and more than this many times the usual spacing of the lowest
    /// points (see the module docs). Default 8.
    pub outlier_spacing_factor: f64,
    /// Most points peeled per estimate (both directions). Default 3.
    pub max_outliers: usize,
    /// Interleaved subsets for the error bound (≥ 2). Default 4.
    pub error_subsets: usize,
    /// The error bound is this times the largest subset deviation.
    /// Default 2 (see the module docs for its calibration).
    pub error_bound_factor: f64,
    /// Largest A-time distance between a forward and a reverse probe paired
    /// by the NTP-style estimator (ns). Default 50 ms.
    pub ntp_max_pair_gap_ns: i64,
    /// Largest overlap of the two envelopes (ns) still fitted (with the
    /// least-violating line, its bound widened by half the overlap) rather
    /// than refused as [`PairError::NotSeparable`]. Software timestamps on
    /// a path whose round trip is shorter than their jitter (veth, one
    /// kernel) overlap by a few hundred ns. Default 0 (strict).
    #[serde(default)]
    pub max_overlap_ns: f64,
}

impl Default for PairConfig {
    fn default() -> Self {
        Self {
            window_ns: 2_000_000_000,
            capacity: 1024,
            min_samples: 8,
            max_drift_ppb: 1_000_000.0,
            outlier_depth_ns: 500.0,
            outlier_spacing_factor: 8.0,
            max_outliers: 3,
            error_subsets: 4,
            error_bound_factor: 2.0,
            ntp_max_pair_gap_ns: 50_000_000,
            max_overlap_ns: 0.0,
        }
    }
}

/// Errors of the per-pair estimator.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PairError {
    /// A configuration value is out of range.
    #[error("invalid pair config: {0}")]
    InvalidConfig(&'static str),
    /// A timestamp difference does not fit an i64.
    #[error("timestamps too far apart (tx {tx_ns}, rx {rx_ns})")]
    Overflow {
        /// Transmit timestamp.
        tx_ns: i64,
        /// Receive timestamp.
        rx_ns: i64,
    },
    /// The sample is older than the window (A-time `t_ns`, window starts
    /// at `cutoff_ns`). A's clock stepped back, or the sample is late.
    #[error("sample at {t_ns} ns is older than the window start {cutoff_ns} ns")]
    Stale {
        /// The sample's A-time.
        t_ns: i64,
        /// The window's start.
        cutoff_ns: i64,
    },
    /// Too few samples in the window.
    #[error("too few samples: {forward} forward, {reverse} reverse (need {min} each)")]
    InsufficientSamples {
        /// Forward samples in the window.
        forward: usize,
        /// Reverse samples in the window.
        reverse: usize,
        /// Required per direction.
        min: usize,
    },
    /// The best fit's drift sits at ±`max_drift_ppb`: the two directions'
    /// samples do not interleave in time, or the drift really is that large.
    #[error(
        "drift not determined within ±{max_drift_ppb} ppb (directions do not interleave in time?)"
    )]
    DriftOutOfRange {
        /// The configured bound.
        max_drift_ppb: f64,
    },
    /// Forward delays dip below negated reverse delays by `overlap_ns`: no
    /// linear clock model explains the window (a clock step, or timestamp
    /// noise larger than the round-trip time). Clear the estimator.
    #[error("forward and reverse envelopes overlap by {overlap_ns:.0} ns: no linear clock fits")]
    NotSeparable {
        /// How far the envelopes overlap.
        overlap_ns: f64,
    },
}

/// A per-pair estimate of B's clock relative to A's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// Reference time (A's clock, ns): the middle of the samples' span.
    pub at_ns: i64,
    /// `clock_B - clock_A` at `at_ns` (ns).
    pub offset_ns: f64,
    /// `d(clock_B - clock_A)/d(clock_A)` in ppb.
    pub drift_ppb: f64,
    /// Statistical error bound of `offset_ns` (ns), assuming equal forward
    /// and reverse delay floors (see the module docs).
    pub error_bound_ns: f64,
    /// Statistical error bound of `drift_ppb`.
    pub drift_error_ppb: f64,
    /// Half the gap between the two envelopes (≈ half the minimum RTT): the
    /// offset is within this of the estimate whatever the path asymmetry.
    pub half_gap_ns: f64,
    /// Samples used (both directions, after peeling).
    pub samples: usize,
    /// Forward samples used.
    pub forward_samples: usize,
    /// Reverse samples used.
    pub reverse_samples: usize,
    /// Samples peeled as too-small outliers.
    pub outliers: usize,
    /// False if the subset fits failed (too few samples) and the error bound
    /// fell back to `half_gap_ns`.
    pub bound_from_subsets: bool,
}

impl Estimate {
    /// The fitted offset at A-time `t_ns`.
    pub fn offset_at(&self, t_ns: i64) -> f64 {
        self.offset_ns + self.drift_ppb * 1e-9 * crate::timestamp::ns_diff(t_ns, self.at_ns)
    }

    /// The error bound at A-time `t_ns` (grows with the drift's error away
    /// from `at_ns`).
    pub fn error_at(&self, t_ns: i64) -> f64 {
        self.error_bound_ns
            + self.drift_error_ppb * 1e-9 * crate::timestamp::ns_diff(t_ns, self.at_ns).abs()
    }
}

/// An NTP-style estimate: the min-RTT forward/reverse probe pairing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NtpEstimate {
    /// A-time midway between the chosen forward and reverse probes (ns).
    pub at_ns: i64,
    /// `clock_B - clock_A` at `at_ns` (ns), assuming symmetric delays.
    pub offset_ns: f64,
    /// The chosen pairing's round-trip delay `d_f + d_r` (ns).
    pub rtt_ns: i64,
    /// Pairings considered.
    pub pairs: usize,
}

/// Sliding-window estimator for one host pair (A, B), probes both ways.
///
/// Memory is bounded by `2 × capacity` samples of 16 bytes.
#[derive(Debug)]
pub struct PairEstimator {
    cfg: PairConfig,
    /// Forward samples: `(t = tx_A, y = rx_B - tx_A)`, in arrival order.
    fwd: VecDeque<Pt>,
    /// Reverse samples: `(t = rx_A, y = tx_B - rx_A)`, in arrival order.
    rev: VecDeque<Pt>,
    newest: Option<i64>,
}

impl PairEstimator {
    /// A new, empty estimator.
    pub fn new(cfg: PairConfig) -> Result<Self, PairError> {
        if cfg.window_ns <= 0 {
            return Err(PairError::InvalidConfig("window_ns must be > 0"));
        }
        if cfg.capacity < 2 || cfg.capacity > 1 << 20 {
            return Err(PairError::InvalidConfig("capacity must be in 2..=2^20"));
        }
        if cfg.min_samples < 2 || cfg.min_samples > cfg.capacity {
            return Err(PairError::InvalidConfig(
                "min_samples must be in 2..=capacity",
            ));
        }
        if !(cfg.max_drift_ppb > 0.0 && cfg.max_drift_ppb <= 1e8) {
            return Err(PairError::InvalidConfig(
                "max_drift_ppb must be in (0, 1e8]",
            ));
        }
        if !cfg.outlier_depth_ns.is_finite()
            || cfg.outlier_depth_ns < 0.0
            || !cfg.outlier_spacing_factor.is_finite()
            || cfg.outlier_spacing_factor < 0.0
        {
            return Err(PairError::InvalidConfig(
                "outlier thresholds must be finite and ≥ 0",
            ));
        }
        if !cfg.error_bound_factor.is_finite() || cfg.error_bound_factor <= 0.0 {
            return Err(PairError::InvalidConfig(
                "error_bound_factor must be finite and > 0",
            ));
        }
        if !(2..=64).contains(&cfg.error_subsets) {
            return Err(PairError::InvalidConfig("error_subsets must be in 2..=64"));
        }
        if cfg.ntp_max_pair_gap_ns < 0 {
            return Err(PairError::InvalidConfig("ntp_max_pair_gap_ns must be ≥ 0"));
        }
        if !(cfg.max_overlap_ns.is_finite() && cfg.max_overlap_ns >= 0.0) {
            return Err(PairError::InvalidConfig(
                "max_overlap_ns must be finite and ≥ 0",
            ));
        }
        Ok(Self {
            fwd: VecDeque::with_capacity(cfg.capacity.min(4096)),
            rev: VecDeque::with_capacity(cfg.capacity.min(4096)),
            cfg,
            newest: None,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &PairConfig {
        &self.cfg
    }

    /// Add a forward probe (A→B): `tx_a` on A's clock, `rx_b` on B's.
    pub fn add_forward(&mut self, tx_a: i64, rx_b: i64) -> Result<(), PairError> {
        let y = rx_b.checked_sub(tx_a).ok_or(PairError::Overflow {
            tx_ns: tx_a,
            rx_ns: rx_b,
        })?;
        self.push(Direction::Forward, Pt { t: tx_a, y })
    }

    /// Add a reverse probe (B→A): `tx_b` on B's clock, `rx_a` on A's.
    pub fn add_reverse(&mut self, tx_b: i64, rx_a: i64) -> Result<(), PairError> {
        let y = tx_b.checked_sub(rx_a).ok_or(PairError::Overflow {
            tx_ns: tx_b,
            rx_ns: rx_a,
        })?;
        self.push(Direction::Reverse, Pt { t: rx_a, y })
    }

    /// Apply [`purity_filter`] to a coded pair and, if pure, add its first
    /// probe. Returns whether the pair was kept.
    pub fn add_pair(
        &mut self,
        dir: Direction,
        pair: &ProbePair,
        threshold_ns: u64,
    ) -> Result<bool, PairError> {
        if !purity_filter(pair, threshold_ns) {
            return Ok(false);
        }
        let p = pair.first;
        match dir {
            Direction::Forward => self.add_forward(p.tx_ns, p.rx_ns)?,
            Direction::Reverse => self.add_reverse(p.tx_ns, p.rx_ns)?,
        }
        Ok(true)
    }

    fn cutoff(&self) -> Option<i64> {
        self.newest.map(|n| n.saturating_sub(self.cfg.window_ns))
    }

    fn push(&mut self, dir: Direction, p: Pt) -> Result<(), PairError> {
        if let Some(cutoff) = self.cutoff() {
            if p.t < cutoff {
                return Err(PairError::Stale {
                    t_ns: p.t,
                    cutoff_ns: cutoff,
                });
            }
        }
        self.newest = Some(self.newest.map_or(p.t, |n| n.max(p.t)));
        let q = match dir {
            Direction::Forward => &mut self.fwd,
            Direction::Reverse => &mut self.rev,
        };
        if q.len() >= self.cfg.capacity {
            q.pop_front();
        }
        q.push_back(p);
        let cutoff = self.cutoff().unwrap_or(i64::MIN);
        for q in [&mut self.fwd, &mut self.rev] {
            while q.front().is_some_and(|f| f.t < cutoff) {
                q.pop_front();
            }
        }
        Ok(())
    }

    /// Samples held (forward, reverse), including late ones not yet evicted.
    pub fn len(&self) -> (usize, usize) {
        (self.fwd.len(), self.rev.len())
    }

    /// True if no sample is held.
    pub fn is_empty(&self) -> bool {
        self.fwd.is_empty() && self.rev.is_empty()
    }

    /// Forget every sample (after a clock step, or [`PairError::NotSeparable`]).
    pub fn clear(&mut self) {
        self.fwd.clear();
        self.rev.clear();
        self.newest = None;
    }

    /// The window's samples, sorted by `(t, y)`.
    fn window(&self) -> (Vec<Pt>, Vec<Pt>) {
        let cutoff = self.cutoff().unwrap_or(i64::MIN);
        let take = |q: &VecDeque<Pt>| {
            let mut v: Vec<Pt> = q.iter().copied().filter(|p| p.t >= cutoff).collect();
            v.sort_unstable();
            v
        };
        (take(&self.fwd), take(&self.rev))
    }

    /// The maximum-margin estimate over the current window.
    pub fn estimate(&self) -> Result<Estimate, PairError> {
        let (fwd, rev) = self.window();
        let min = self.cfg.min_samples;
        if fwd.len() < min || rev.len() < min {
            return Err(PairError::InsufficientSamples {
                forward: fwd.len(),
                reverse: rev.len(),
                min,
            });
        }
        // Relative coordinates: t around the span's middle, y around the
        // first forward delay. Differences of a 2 s window and of delays
        // that share the same offset are far below 2^53: exact in f64.
        let t_lo = fwd[0].t.min(rev[0].t);
        let t_hi = fwd[fwd.len() - 1].t.max(rev[rev.len() - 1].t);
        let at_ns = ((i128::from(t_lo) + i128::from(t_hi)) / 2) as i64;
        let y_base = fwd[0].y;
        let rel = |v: &[Pt]| -> Result<Vec<Pt>, PairError> {
            v.iter()
                .map(|p| {
                    let t = p.t.checked_sub(at_ns);
                    let y = p.y.checked_sub(y_base);
                    match (t, y) {
                        (Some(t), Some(y)) => Ok(Pt { t, y }),
                        _ => Err(PairError::Overflow {
                            tx_ns: p.t,
                            rx_ns: p.y,
                        }),
                    }
                })
                .collect()
        };
        let (fwd, rev) = (rel(&fwd)?, rel(&rev)?);
        let max_slope = self.cfg.max_drift_ppb * 1e-9;
        let mut scratch = Scratch::default();
        let mut sel_a: Vec<usize> = (0..fwd.len()).collect();
        let mut sel_b: Vec<usize> = (0..rev.len()).collect();

        let fit = |sa: &[usize], sb: &[usize], scratch: &mut Scratch| {
            fit_strip(&fwd, sa, &rev, sb, max_slope, scratch).map_err(|e| match e {
                StripError::SlopeAtBound { .. } | StripError::Empty => PairError::DriftOutOfRange {
                    max_drift_ppb: self.cfg.max_drift_ppb,
                },
            })
        };

        // Fit, peeling too-small outliers.
        let mut strip = fit(&sel_a, &sel_b, &mut scratch)?;
        let mut outliers = 0;
        while outliers < self.cfg.max_outliers {
            // (score, side, selection without the candidates, its fit)
            let mut best: Option<(f64, bool, Vec<usize>, Strip)> = None;
            let sides = [
                (true, strip.above_contacts.clone()),
                (false, strip.below_contacts.clone()),
            ];
            for (above, contacts) in sides {
                let (pts, sel) = if above {
                    (&fwd, &sel_a)
                } else {
                    (&rev, &sel_b)
                };
                // Candidates: each supporting point alone, and this side's
                // j lowest points together for j ≥ 2 (outliers can hold the
                // envelope down for each other: removing one alone, the
                // next takes its place).
                let mut groups: Vec<Vec<usize>> = contacts.iter().map(|&c| vec![c]).collect();
                let budget = self.cfg.max_outliers - outliers;
                if budget >= 2 {
                    let mut by_clearance: Vec<(f64, usize)> = sel
                        .iter()
                        .enumerate()
                        .map(|(p, &i)| (clearance(&strip, pts[i], above), p))
                        .collect();
                    let j = budget.min(by_clearance.len());
                    by_clearance.select_nth_unstable_by(j - 1, |x, y| x.0.total_cmp(&y.0));
                    by_clearance[..j].sort_by(|x, y| x.0.total_cmp(&y.0));
                    for j in 2..=j {
                        groups.push(by_clearance[..j].iter().map(|x| x.1).collect());
                    }
                }
                for group in groups {
                    if sel.len() < min + group.len()
                        || outliers + group.len() > self.cfg.max_outliers
                    {
                        continue;
                    }
                    let trial: Vec<usize> = sel
                        .iter()
                        .enumerate()
                        .filter(|(p, _)| !group.contains(p))
                        .map(|(_, &i)| i)
                        .collect();
                    let r = if above {
                        fit(&trial, &sel_b, &mut scratch)
                    } else {
                        fit(&sel_a, &trial, &mut scratch)
                    };
                    let Ok(t) = r else { continue };
                    // How far the candidates sit below the others' envelope,
                    // against the absolute threshold and against the usual
                    // spacing of the lowest points (sparse data have wide
                    // spacings and must not lose their floor points).
                    let depth = group
                        .iter()
                        .map(|&p| -clearance(&t, pts[sel[p]], above))
                        .fold(f64::INFINITY, f64::min);
                    let spacing = floor_spacing(&t, pts, &trial, above);
                    let scale = self
                        .cfg
                        .outlier_depth_ns
                        .max(self.cfg.outlier_spacing_factor * spacing);
                    // Without the candidates a sparse side's line can tilt
                    // onto queued points that then look like a floor: the
                    // new floor must be dense, with at least max(8, n/4)
                    // points within a quarter of the depth of it.
                    let near = trial
                        .iter()
                        .filter(|&&i| clearance(&t, pts[i], above) <= 0.25 * depth)
                        .count();
                    let dense = near >= (trial.len() / 4).max(8);
                    let score = if dense { depth / scale } else { 0.0 };
                    if best.as_ref().is_none_or(|b| score > b.0) {
                        best = Some((score, above, trial, t));
                    }
                }
            }
            match best {
                Some((score, above, trial, t)) if score > 1.0 => {
                    let sel = if above { &mut sel_a } else { &mut sel_b };
                    outliers += sel.len() - trial.len();
                    *sel = trial;
                    strip = t;
                }
                _ => break,
            }
        }
        let overlap = (-2.0 * strip.half_gap).max(0.0);
        if overlap > self.cfg.max_overlap_ns {
            return Err(PairError::NotSeparable {
                overlap_ns: overlap,
            });
        }

        // Error bound from interleaved subsets.
        let k = self.cfg.error_subsets;
        let mut dev_off: f64 = 0.0;
        let mut dev_slope: f64 = 0.0;
        let mut from_subsets = sel_a.len() >= 2 * k && sel_b.len() >= 2 * k;
        if from_subsets {
            for s in 0..k {
                let sa: Vec<usize> = sel_a.iter().copied().skip(s).step_by(k).collect();
                let sb: Vec<usize> = sel_b.iter().copied().skip(s).step_by(k).collect();
                match fit_strip(&fwd, &sa, &rev, &sb, max_slope, &mut scratch) {
                    Ok(sub) => {
                        dev_off = dev_off.max((sub.intercept - strip.intercept).abs());
                        dev_slope = dev_slope.max((sub.slope - strip.slope).abs());
                    }
                    Err(_) => {
                        from_subsets = false;
                        break;
                    }
                }
            }
        }
        let (error_bound_ns, drift_error_ppb) = if from_subsets {
            // Capped by the half-gap: the offset line lies inside the strip
            // whatever the noise (timestamp jitter aside).
            let f = self.cfg.error_bound_factor;
            if overlap > 0.0 {
                // Jitter beyond the round trip: no strip caps the error.
                (f * dev_off + overlap / 2.0, f * dev_slope * 1e9)
            } else {
                ((f * dev_off).min(strip.half_gap), f * dev_slope * 1e9)
            }
        } else {
            // Fallback: the assumption-free half-gap, and the drift range
            // that keeps the line inside the strip over the span.
            let span = (t_hi - t_lo).max(1) as f64;
            let hg = strip.half_gap.abs();
            (hg, 2.0 * hg / span * 1e9)
        };

        Ok(Estimate {
            at_ns,
            offset_ns: y_base as f64 + strip.intercept,
            drift_ppb: strip.slope * 1e9,
            error_bound_ns,
            drift_error_ppb,
            half_gap_ns: strip.half_gap,
            samples: sel_a.len() + sel_b.len(),
            forward_samples: sel_a.len(),
            reverse_samples: sel_b.len(),
            outliers,
            bound_from_subsets: from_subsets,
        })
    }

    /// The NTP-style min-RTT estimate over the current window (see the
    /// module docs). `drift_ppb` is the relative drift taken out of each
    /// pairing's round trip before the smallest is chosen, as NTP's own
    /// frequency discipline would have it; `None` ranks the round trips as
    /// measured, drift and all.
    pub fn ntp_estimate(&self, drift_ppb: Option<f64>) -> Result<NtpEstimate, PairError> {
        let (fwd, rev) = self.window();
        if fwd.is_empty() || rev.is_empty() {
            return Err(PairError::InsufficientSamples {
                forward: fwd.len(),
                reverse: rev.len(),
                min: 1,
            });
        }
        let max_gap = i128::from(self.cfg.ntp_max_pair_gap_ns);
        let mut best: Option<(i128, Pt, Pt)> = None;
        let mut pairs = 0;
        for f in &fwd {
            // Nearest reverse sample in A-time.
            let k = rev.partition_point(|r| r.t < f.t);
            let cand = [k.checked_sub(1), (k < rev.len()).then_some(k)];
            let nearest = cand
                .into_iter()
                .flatten()
                .map(|k| rev[k])
                .min_by_key(|r| (i128::from(r.t) - i128::from(f.t)).abs());
            let Some(r) = nearest else { continue };
            if (i128::from(r.t) - i128::from(f.t)).abs() > max_gap {
                continue;
            }
            pairs += 1;
            // y_f - y_r = d_f + d_r + drift·(t_f - t_r) (y_r is the negated
            // reverse delay): the drift term is what the offset moved
            // between the two probes.
            let moved = drift_ppb.map_or(0, |d| (d * (f.t - r.t) as f64 / 1e9).round() as i128);
            let rtt = i128::from(f.y) - i128::from(r.y) - moved;
            if best.as_ref().is_none_or(|b| rtt < b.0) {
                best = Some((rtt, *f, r));
            }
        }
        let Some((rtt, f, r)) = best else {
            return Err(PairError::InsufficientSamples {
                forward: fwd.len(),
                reverse: 0,
                min: 1,
            });
        };
        Ok(NtpEstimate {
            at_ns: ((i128::from(f.t) + i128::from(r.t)) / 2) as i64,
            offset_ns: (f.y as f64 + r.y as f64) / 2.0,
            rtt_ns: rtt.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64,
            pairs,
        })
    }
}

/// How far `p` lies above the strip's forward line (`above`) or below its
/// reverse line; negative if it violates the strip.
fn clearance(s: &Strip, p: Pt, above: bool) -> f64 {
    let mid = s.intercept + s.slope * p.t as f64;
    if above {
        p.y as f64 - (mid + s.half_gap)
    } else {
        (mid - s.half_gap) - p.y as f64
    }
}

/// The typical spacing of one side's lowest clearances: the q-th smallest
/// clearance over q (q = a quarter of the points, at least 3). For a floor
/// with exponential noise of mean μ over n points this is about μ/n; when
/// only a few points sit at the floor and the rest are queued, it is large,
/// so a sparse floor is never mistaken for outliers.
fn floor_spacing(s: &Strip, pts: &[Pt], sel: &[usize], above: bool) -> f64 {
    let mut r: Vec<f64> = sel
        .iter()
        .map(|&i| clearance(s, pts[i], above).max(0.0))
        .collect();
    if r.len() < 2 {
        return f64::INFINITY;
    }
    r.sort_by(f64::total_cmp);
    let q = (r.len() / 4).max(3).min(r.len() - 1);
    r[q] / q as f64
}

#[cfg(test)]
mod tests {
    use crate::pair::*;

    /// Noise-free symmetric data: B = A + off + drift·t, owd 10 µs.
    fn feed(e: &mut PairEstimator, off: i64, drift_ppb: i64, n: i64) {
        for k in 0..n {
            let t = 1_000_000_000_000 + k * 10_000_000;
            let o = |t: i64| off + drift_ppb * (t - 1_000_000_000_000) / 1_000_000_000;
            e.add_forward(t, t + 10_000 + o(t)).unwrap();
            let tr = t + 5_000_000;
            e.add_reverse(tr - 10_000 + o(tr), tr).unwrap();
        }
    }

    #[test]
    fn exact_on_noise_free_data() {
        let mut e = PairEstimator::new(PairConfig::default()).unwrap();
        feed(&mut e, -123_456_789, 150_000, 150);
        let est = e.estimate().unwrap();
        let truth = -123_456_789.0 + 150_000.0 * 1e-9 * (est.at_ns - 1_000_000_000_000) as f64;
        assert!((est.offset_ns - truth).abs() < 2.0, "{est:?} truth {truth}");
        assert!((est.drift_ppb - 150_000.0).abs() < 10.0, "{est:?}");
        assert!((est.half_gap_ns - 10_000.0).abs() < 2.0);
        let ntp = e.ntp_estimate(None).unwrap();
        let ntp_truth = -123_456_789.0 + 150_000.0 * 1e-9 * (ntp.at_ns - 1_000_000_000_000) as f64;
        assert!((ntp.offset_ns - ntp_truth).abs() < 2.0, "{ntp:?}");
    }

    /// With 200 ppm between the clocks, a far pairing with queued delays
    /// has the smallest measured round trip; with the drift taken out, the
    /// filter picks the close pairing with the true minimum delays.
    #[test]
    fn ntp_filter_ranks_true_round_trips_given_the_drift() {
        let drift = 200_000i64;
        let o = |t: i64| drift * t / 1_000_000_000;
        let mut e = PairEstimator::new(PairConfig::default()).unwrap();
        let t0 = 1_000_000_000;
        // Close pairing (1 ms apart), minimum delays 5 µs both ways.
        e.add_forward(t0, t0 + 5_000 + o(t0)).unwrap();
        let tr = t0 + 1_000_000;
        e.add_reverse(tr - 5_000 + o(tr), tr).unwrap();
        // Far pairing (reverse 40 ms after): 9 µs forward and 5 µs back;
        // drift takes 8 µs off its measured round trip.
        let tf = t0 + 200_000_000;
        e.add_forward(tf, tf + 9_000 + o(tf)).unwrap();
        let trr = tf + 40_000_000;
        e.add_reverse(trr - 5_000 + o(trr), trr).unwrap();
        let err = |n: &NtpEstimate| n.offset_ns - o(n.at_ns) as f64;

        let raw = e.ntp_estimate(None).unwrap();
        assert_eq!(raw.rtt_ns, 6_000, "{raw:?}");
        assert!((err(&raw) - 2_000.0).abs() < 2.0, "{raw:?}");

        let fair = e.ntp_estimate(Some(drift as f64)).unwrap();
        assert_eq!(fair.rtt_ns, 10_000, "{fair:?}");
        assert!(err(&fair).abs() < 2.0, "{fair:?}");
    }

    #[test]
    fn too_small_sample_is_peeled() {
        let mut e = PairEstimator::new(PairConfig::default()).unwrap();
        for k in 0..100i64 {
            let t = k * 10_000_000;
            // Some queueing so the floor is not perfectly flat.
            let q = (k * 7919 % 13) * 300;
            let glitch = if k == 40 { 5_000 } else { 0 };
            e.add_forward(t, t + 10_000 + q - glitch).unwrap();
            e.add_reverse(t + 5_000_000 - 10_000 - q, t + 5_000_000)
                .unwrap();
        }
        let est = e.estimate().unwrap();
        assert_eq!(est.outliers, 1, "{est:?}");
        assert!(est.offset_ns.abs() < 1.0, "{est:?}");
    }

    #[test]
    fn window_and_capacity_bound_memory() {
        let cfg = PairConfig {
            capacity: 64,
            ..PairConfig::default()
        };
        let mut e = PairEstimator::new(cfg).unwrap();
        feed(&mut e, 0, 0, 1000);
        let (f, r) = e.len();
        assert!(f <= 64 && r <= 64);
        let mut e = PairEstimator::new(PairConfig::default()).unwrap();
        feed(&mut e, 0, 0, 1000); // 10 s of samples at 100/s
        let (f, r) = e.len();
        assert!(f <= 201 && r <= 201, "{f} {r}");
        // Older than the window: refused.
        assert!(matches!(
            e.add_forward(0, 10_000),
            Err(PairError::Stale { .. })
        ));
    }

    #[test]
    fn errors_are_clear() {
        let mut e = PairEstimator::new(PairConfig::default()).unwrap();
        assert!(matches!(
            e.estimate(),
            Err(PairError::InsufficientSamples { .. })
        ));
        assert!(e.ntp_estimate(None).is_err());
        // Forward only in the first half, reverse only in the second: the
        // drift is not determined.
        for k in 0..20 {
            e.add_forward(k * 1_000_000, k * 1_000_000 + 10_000)
                .unwrap();
        }
        for k in 20..40 {
            e.add_reverse(k * 1_000_000 - 10_000, k * 1_000_000)
                .unwrap();
        }
        assert!(matches!(
            e.estimate(),
            Err(PairError::DriftOutOfRange { .. })
        ));
        assert!(matches!(
            e.add_forward(i64::MIN, i64::MAX),
            Err(PairError::Overflow { .. })
        ));
        assert!(PairEstimator::new(PairConfig {
            window_ns: 0,
            ..PairConfig::default()
        })
        .is_err());
    }

    #[test]
    fn jitter_beyond_the_round_trip_is_fitted_within_the_tolerance() {
        // 200 ns one-way delays with ±300 ns timestamp jitter: the
        // envelopes overlap. Strict config refuses; a tolerance fits the
        // least-violating line, close to the truth, with a widened bound.
        let strict = PairEstimator::new(PairConfig::default()).unwrap();
        let mut tolerant = PairEstimator::new(PairConfig {
            max_overlap_ns: 2_000.0,
            ..PairConfig::default()
        })
        .unwrap();
        let mut strict = strict;
        let mut x: u64 = 7;
        let mut jitter = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 601) as i64 - 300
        };
        let offset = 40_000;
        for k in 0..200i64 {
            let t = k * 5_000_000;
            let (jf, jr) = (jitter(), jitter());
            for e in [&mut strict, &mut tolerant] {
                e.add_forward(t, t + 200 + offset + jf).unwrap();
                e.add_reverse(t + 2_000_000 - 200 + offset + jr, t + 2_000_000)
                    .unwrap();
            }
        }
        assert!(matches!(
            strict.estimate(),
            Err(PairError::NotSeparable { .. })
        ));
        let est = tolerant.estimate().unwrap();
        assert!((est.offset_ns - offset as f64).abs() < 300.0, "{est:?}");
        assert!(est.half_gap_ns < 0.0);
        assert!(est.error_bound_ns >= -est.half_gap_ns, "{est:?}");
        assert!(PairEstimator::new(PairConfig {
            max_overlap_ns: f64::NAN,
            ..PairConfig::default()
        })
        .is_err());
    }

    #[test]
    fn clock_step_is_not_separable() {
        let mut e = PairEstimator::new(PairConfig::default()).unwrap();
        for k in 0..100i64 {
            let t = k * 10_000_000;
            // B steps 50 µs forward and back: no line separates that (a
            // single step could be absorbed by a steep drift instead).
            let off = if (33..66).contains(&k) { 50_000 } else { 0 };
            e.add_forward(t, t + 10_000 + off).unwrap();
            e.add_reverse(t + 5_000_000 - 10_000 + off, t + 5_000_000)
                .unwrap();
        }
        let r = e.estimate();
        assert!(matches!(r, Err(PairError::NotSeparable { .. })), "{r:?}");
        e.clear();
        assert!(e.is_empty());
    }
}
