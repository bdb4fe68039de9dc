//! Per-pair accuracy on synthetic data with known truth.
//!
//! Every trial draws two clocks (relative offset up to ±1 s, relative drift
//! up to ±200 ppm), simulates 2 s of coded probe pairs at 100 pairs/s in
//! each direction over a path model (see `common`), and compares:
//!
//! * `huygens`: [`PairEstimator::estimate`] over the pure first-probes
//!   (purity threshold 1 µs), the intended use;
//! * `huygens raw`: the same estimator over every first probe (no purity
//!   filter);
//! * `ntp raw`: [`PairEstimator::ntp_estimate`] (min-RTT pairing) over every
//!   first probe, as NTP would see the path (it has no coded pairs);
//! * `ntp pure`: the same over the pure first-probes.
//!
//! Run with `--nocapture` to see the figures.

mod common;

use clocksync::{Direction, Estimate, PairConfig, PairError, PairEstimator};
use common::*;
use rand::Rng;

const PURITY_NS: u64 = 1_000;
const TRIALS: usize = 300;

#[derive(Default, Debug)]
struct Stats {
    huygens: Vec<f64>,
    huygens_raw: Vec<f64>,
    ntp_raw: Vec<f64>,
    ntp_pure: Vec<f64>,
    drift: Vec<f64>,
    bounds: Vec<f64>,
    /// |error| / error bound.
    ratios: Vec<f64>,
    half_gaps: Vec<f64>,
    /// |error| / half-gap.
    gap_ratios: Vec<f64>,
    samples: Vec<f64>,
    outliers: usize,
    failures: Vec<PairError>,
}

impl Stats {
    fn coverage(&self) -> f64 {
        self.ratios.iter().filter(|r| **r <= 1.0).count() as f64 / self.ratios.len() as f64
    }

    fn mean_err(&self) -> f64 {
        self.huygens.iter().sum::<f64>() / self.huygens.len() as f64
    }
}

fn run(seed: u64, fwd: Path, rev: Path, cfg: PairConfig) -> Stats {
    let mut rng = rng(seed);
    let mut s = Stats::default();
    for _ in 0..TRIALS {
        let a = Clock::random(&mut rng, 0.5e9, 100e-6);
        let b = Clock::random(&mut rng, 0.5e9, 100e-6);
        let t0 = rng.gen::<f64>() * 10e9;
        let stream = pair_stream(&mut rng, &a, &b, &fwd, &rev, t0, 2e9, 100.0);
        let mut pure = PairEstimator::new(cfg.clone()).unwrap();
        let mut raw = PairEstimator::new(cfg.clone()).unwrap();
        for (dir, p) in &stream {
            pure.add_pair(*dir, p, PURITY_NS).unwrap();
            match dir {
                Direction::Forward => raw.add_forward(p.first.tx_ns, p.first.rx_ns).unwrap(),
                Direction::Reverse => raw.add_reverse(p.first.tx_ns, p.first.rx_ns).unwrap(),
            }
        }
        let err = |e: &Estimate| e.offset_ns - true_offset(&a, &b, e.at_ns);
        match pure.estimate() {
            Ok(e) => {
                let x = err(&e);
                s.huygens.push(x);
                s.drift.push(e.drift_ppb - true_drift_ppb(&a, &b));
                s.bounds.push(e.error_bound_ns);
                s.ratios.push(x.abs() / e.error_bound_ns);
                s.half_gaps.push(e.half_gap_ns);
                s.gap_ratios.push(x.abs() / e.half_gap_ns);
                s.outliers += e.outliers;
                s.samples.push(e.samples as f64);
            }
            Err(e) => s.failures.push(e),
        }
        if let Ok(e) = raw.estimate() {
            s.huygens_raw.push(err(&e));
        }
        let ntp = raw.ntp_estimate(None).unwrap();
        s.ntp_raw
            .push(ntp.offset_ns - true_offset(&a, &b, ntp.at_ns));
        if let Ok(ntp) = pure.ntp_estimate(None) {
            s.ntp_pure
                .push(ntp.offset_ns - true_offset(&a, &b, ntp.at_ns));
        }
    }
    s
}

fn report(name: &str, s: &Stats) {
    let failures: Vec<String> = s.failures.iter().map(|e| e.to_string()).collect();
    println!(
        "--- {name}: {} estimates, {} failed {:?}\n  \
         pure samples/window p50 {:.0}; outliers peeled {}\n  \
         huygens      |offset err| p50 {:>6.0} ns  p99 {:>6.0} ns  max {:>6.0} ns  (mean err {:+.0} ns)\n  \
         huygens raw  |offset err| p50 {:>6.0} ns  p99 {:>6.0} ns\n  \
         ntp raw      |offset err| p50 {:>6.0} ns  p99 {:>6.0} ns\n  \
         ntp pure     |offset err| p50 {:>6.0} ns  p99 {:>6.0} ns\n  \
         |drift err| p50 {:.0} ppb  p99 {:.0} ppb\n  \
         error bound p50 {:.0} ns, covers {:.1} % (|err|/bound p99 {:.2}, max {:.2}); half-gap p50 {:.0} ns",
        s.huygens.len(),
        s.failures.len(),
        failures.first(),
        pct(&s.samples, 50.0),
        s.outliers,
        pct(&s.huygens, 50.0),
        pct(&s.huygens, 99.0),
        pct(&s.huygens, 100.0),
        s.mean_err(),
        pct(&s.huygens_raw, 50.0),
        pct(&s.huygens_raw, 99.0),
        pct(&s.ntp_raw, 50.0),
        pct(&s.ntp_raw, 99.0),
        pct(&s.ntp_pure, 50.0),
        pct(&s.ntp_pure, 99.0),
        pct(&s.drift, 50.0),
        pct(&s.drift, 99.0),
        pct(&s.bounds, 50.0),
        100.0 * s.coverage(),
        pct(&s.ratios, 99.0),
        pct(&s.ratios, 100.0),
        pct(&s.half_gaps, 50.0),
    );
}

/// A loaded veth-like path with idle periods: sub-µs at p99, unbiased,
/// honest error bounds. NTP-style min-RTT also finds idle pairs here, so it
/// is only ~2× worse: timestamp jitter dominates both.
#[test]
fn loaded_symmetric_path_is_sub_microsecond() {
    let p = Path::loaded();
    let s = run(1, p, p, PairConfig::default());
    report(
        "loaded, symmetric (20 % idle, exp queueing 20 µs, 1 % ms bursts, 200 ns jitter)",
        &s,
    );
    assert!(s.failures.is_empty());
    assert!(pct(&s.huygens, 99.0) < 1_000.0);
    assert!(pct(&s.huygens, 50.0) < 200.0);
    assert!(s.mean_err().abs() < 30.0, "biased: {}", s.mean_err());
    assert!(
        pct(&s.drift, 99.0) < 1_000.0,
        "drift p99 {}",
        pct(&s.drift, 99.0)
    );
    assert!(s.coverage() >= 0.99, "coverage {}", s.coverage());
    // Bounds are tight enough to call the pair synced (≤ 1 µs).
    assert!(pct(&s.bounds, 99.0) < 1_000.0);
}

/// Heavy queueing (5 % idle, gamma(2) mean 50 µs): the purity filter and the
/// envelope keep the error sub-µs; NTP-style min-RTT over the same probe
/// stream is ≥ 10× worse.
#[test]
fn heavy_queueing_ntp_style_is_ten_times_worse() {
    let mut p = Path::loaded();
    p.p_idle = 0.05;
    p.queue_shape = 2;
    p.queue_mean_ns = 50_000.0;
    let s = run(3, p, p, PairConfig::default());
    report("heavy queueing (5 % idle, gamma(2) mean 50 µs)", &s);
    let (h, n) = (pct(&s.huygens, 99.0), pct(&s.ntp_raw, 99.0));
    println!("  p99 ratio ntp raw / huygens = {:.1}", n / h);
    assert!(h < 1_000.0, "huygens p99 {h}");
    assert!(n >= 10.0 * h, "ntp p99 {n} vs huygens p99 {h}");
    // Few pure samples per window: some windows cannot be estimated, and
    // the bound is loose but honest.
    assert!(s.failures.len() <= TRIALS / 10);
    assert!(s.coverage() >= 0.99);
}

/// A saturated path (never idle): pure pairs are rare and random, so the
/// purity filter starves the estimator; the envelope over all probes stays
/// sub-µs. The bound reflects the sparse data.
#[test]
fn saturated_path_starves_the_purity_filter() {
    let mut p = Path::loaded();
    p.p_idle = 0.0;
    let s = run(2, p, p, PairConfig::default());
    report("saturated (never idle, exp queueing 20 µs)", &s);
    assert!(pct(&s.huygens_raw, 99.0) < 1_000.0);
    assert!(pct(&s.huygens_raw, 99.0) * 2.0 < pct(&s.ntp_raw, 99.0));
    assert!(s.coverage() >= 0.99);
}

/// Forward floor 4 µs longer than reverse: every two-way method reads half
/// the asymmetry as offset. The statistical bound cannot see it; the
/// half-gap (assumption-free) bound does cover it.
#[test]
fn asymmetry_biases_by_half_of_it() {
    let f = Path::loaded();
    let mut r = f;
    r.base_ns += 4_000.0;
    let s = run(5, f, r, PairConfig::default());
    report("asymmetric floors (reverse +4 µs)", &s);
    // offset_est = offset + (owd_f - owd_r)/2 = offset - 2 µs.
    assert!(
        (s.mean_err() + 2_000.0).abs() < 50.0,
        "mean err {}",
        s.mean_err()
    );
    let ntp_mean = s.ntp_raw.iter().sum::<f64>() / s.ntp_raw.len() as f64;
    assert!(
        (ntp_mean + 2_000.0).abs() < 300.0,
        "ntp mean err {ntp_mean}"
    );
    assert!(s.coverage() < 0.05);
    assert!(s.gap_ratios.iter().all(|r| *r <= 1.0));
}

/// Rare too-small samples (both receive timestamps of a pair 5 µs early, so
/// the pair passes the purity filter) are peeled; without peeling they cost
/// microseconds.
#[test]
fn too_small_samples_are_peeled() {
    let mut p = Path::loaded();
    p.outlier_prob = 0.005;
    p.outlier_ns = 5_000.0;
    let s = run(4, p, p, PairConfig::default());
    report("too-small outliers (0.5 % of pairs, 5 µs)", &s);
    let off = run(
        4,
        p,
        p,
        PairConfig {
            max_outliers: 0,
            ..PairConfig::default()
        },
    );
    report("  same, peeling off", &off);
    assert!(s.outliers > 0);
    assert!(pct(&s.huygens, 99.0) < 1_000.0);
    assert!(pct(&off.huygens, 99.0) > 2_000.0);
    assert!(s.coverage() >= 0.98);
}

/// Peeling must not touch clean windows, dense or sparse.
#[test]
fn peeling_leaves_clean_windows_alone() {
    let off = PairConfig {
        max_outliers: 0,
        ..PairConfig::default()
    };
    let mut sparse = Path::loaded();
    sparse.p_idle = 0.05;
    sparse.queue_shape = 2;
    sparse.queue_mean_ns = 50_000.0;
    for (seed, p) in [(1, Path::loaded()), (3, sparse)] {
        let with = run(seed, p, p, PairConfig::default());
        let without = run(seed, p, p, off.clone());
        assert_eq!(with.huygens, without.huygens);
        assert_eq!(with.outliers, 0);
    }
}

/// Larger drifts and offsets than the design's (±500 ppm, ±10 s) still fit.
#[test]
fn extreme_clocks() {
    let mut rng = rng(9);
    let p = Path::loaded();
    let mut errs = Vec::new();
    for _ in 0..50 {
        let a = Clock::random(&mut rng, 5e9, 250e-6);
        let b = Clock::random(&mut rng, 5e9, 250e-6);
        let stream = pair_stream(&mut rng, &a, &b, &p, &p, 0.0, 2e9, 100.0);
        let mut e = PairEstimator::new(PairConfig::default()).unwrap();
        for (dir, pair) in &stream {
            e.add_pair(*dir, pair, PURITY_NS).unwrap();
        }
        let est = e.estimate().unwrap();
        errs.push(est.offset_ns - true_offset(&a, &b, est.at_ns));
        let derr = est.drift_ppb - true_drift_ppb(&a, &b);
        assert!(derr.abs() < 1_000.0, "drift err {derr}");
        // Extrapolating 1 s ahead stays within the extrapolated bound.
        let later = est.at_ns + 1_000_000_000;
        let x = est.offset_at(later) - true_offset(&a, &b, later);
        assert!(
            x.abs() <= est.error_at(later) + 200.0,
            "{x} vs {}",
            est.error_at(later)
        );
    }
    println!(
        "extreme clocks: |offset err| p99 {:.0} ns",
        pct(&errs, 99.0)
    );
    assert!(pct(&errs, 99.0) < 1_000.0);
}
