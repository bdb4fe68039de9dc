//! Property tests: exactness on noise-free data and invariances.

mod common;

use clocksync::{
    solve, solve_with, EdgeEstimate, EdgeStatus, HostId, PairConfig, PairEstimator, SolveConfig,
};
use common::*;
use proptest::prelude::*;
use rand::Rng;

/// Probes between clocks `a` and `b` with a constant one-way delay (no
/// noise), random send times over `span` ns, `n` per direction.
fn noise_free(a: &Clock, b: &Clock, owd: f64, span: f64, n: usize, seed: u64) -> PairEstimator {
    let mut rng = rng(seed);
    let mut e = PairEstimator::new(PairConfig::default()).unwrap();
    for _ in 0..n {
        let tau = rng.gen::<f64>() * span;
        e.add_forward(a.read(tau), b.read(tau + owd)).unwrap();
        let tau = rng.gen::<f64>() * span;
        e.add_reverse(b.read(tau), a.read(tau + owd)).unwrap();
    }
    e
}

/// Noisy probes (queueing, bursts, jitter), as raw timestamps:
/// (forward?, tx, rx).
fn noisy(seed: u64) -> Vec<(bool, i64, i64)> {
    let mut rng = rng(seed);
    let a = Clock::random(&mut rng, 0.5e9, 100e-6);
    let b = Clock::random(&mut rng, 0.5e9, 100e-6);
    let p = Path::loaded();
    pair_stream(&mut rng, &a, &b, &p, &p, 0.0, 2e9, 100.0)
        .into_iter()
        .filter(|(_, pair)| clocksync::purity_filter(pair, 1_000))
        .map(|(d, pair)| {
            (
                d == clocksync::Direction::Forward,
                pair.first.tx_ns,
                pair.first.rx_ns,
            )
        })
        .collect()
}

fn feed(probes: &[(bool, i64, i64)], shift_a: i64, shift_b: i64) -> clocksync::Estimate {
    let mut e = PairEstimator::new(PairConfig::default()).unwrap();
    for &(fwd, tx, rx) in probes {
        if fwd {
            e.add_forward(tx + shift_a, rx + shift_b).unwrap();
        } else {
            e.add_reverse(tx + shift_b, rx + shift_a).unwrap();
        }
    }
    e.estimate().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Noise-free probes give the true offset and drift (up to the 1 ns
    /// rounding of timestamps), any offset and drift, symmetric delay.
    #[test]
    fn pair_exact_without_noise(
        theta_a in -1e9..1e9f64, theta_b in -1e9..1e9f64,
        ppm_a in -200.0..200.0f64, ppm_b in -200.0..200.0f64,
        owd in 1_000.0..200_000.0f64,
        span in 0.2e9..2e9f64,
        n in 10usize..150,
        seed in any::<u64>(),
    ) {
        let a = Clock { theta: theta_a, rho: ppm_a * 1e-6 };
        let b = Clock { theta: theta_b, rho: ppm_b * 1e-6 };
        let e = noise_free(&a, &b, owd, span, n, seed);
        let est = e.estimate().unwrap();
        let err = est.offset_ns - true_offset(&a, &b, est.at_ns);
        prop_assert!(err.abs() < 2.0, "offset err {err}");
        let derr = est.drift_ppb - true_drift_ppb(&a, &b);
        prop_assert!(derr.abs() < 50.0, "drift err {derr}");
        // Both delays are read on B's rate; the midline is unaffected.
        prop_assert!((est.half_gap_ns - owd * (1.0 + b.rho)).abs() < 2.0);
        // The NTP-style estimate is exact too without noise.
        let ntp = e.ntp_estimate(None).unwrap();
        prop_assert!((ntp.offset_ns - true_offset(&a, &b, ntp.at_ns)).abs() < 2.0);
    }

    /// Stepping B's clock by c moves the offset by exactly c; stepping both
    /// clocks by T moves only the reference time. Nothing else changes.
    #[test]
    fn pair_translation_invariance(
        seed in any::<u64>(),
        c in -2_000_000_000i64..2_000_000_000,
        t in -1_000_000_000_000i64..1_000_000_000_000,
    ) {
        let probes = noisy(seed);
        let base = feed(&probes, 0, 0);
        let shifted_b = feed(&probes, 0, c);
        prop_assert!((shifted_b.offset_ns - base.offset_ns - c as f64).abs() < 1e-6);
        prop_assert_eq!(shifted_b.drift_ppb, base.drift_ppb);
        prop_assert_eq!(shifted_b.error_bound_ns, base.error_bound_ns);
        let shifted_both = feed(&probes, t, t);
        prop_assert_eq!(shifted_both.at_ns, base.at_ns + t);
        prop_assert!((shifted_both.offset_ns - base.offset_ns).abs() < 1e-6);
        prop_assert_eq!(shifted_both.drift_ppb, base.drift_ppb);
    }

    /// On noise-free edges of any connected graph (random tree plus random
    /// extra edges, either direction, measured at random times), the solve
    /// recovers every host exactly and all loop residuals vanish.
    #[test]
    fn network_exact_without_noise(
        n in 2usize..24,
        extra in 0usize..40,
        seed in any::<u64>(),
    ) {
        let (c, at, edges) = graph(n, extra, seed, 0.0);
        let s = solve(&edges, HostId(0), at).unwrap();
        prop_assert_eq!(s.hosts.len(), n);
        let tau = c[0].tau_at(at);
        for h in &s.hosts {
            let i = h.host.0 as usize;
            let x = c[i].exact(tau) - c[0].exact(tau);
            prop_assert!((h.offset_ns - x).abs() < 1e-3, "host {} err {}", i, h.offset_ns - x);
            prop_assert!((h.drift_ppb - true_drift_ppb(&c[0], &c[i])).abs() < 1e-3);
        }
        for e in &s.edges {
            prop_assert!(e.residual_ns.abs() < 1e-3);
            prop_assert_eq!(e.status, EdgeStatus::Used);
        }
    }

    /// Shifting every host's clock by its own constant shifts each solved
    /// offset by (c_h - c_ref); reversing edges changes nothing; choosing
    /// another reference subtracts that host's offset.
    #[test]
    fn network_invariances(
        n in 3usize..16,
        extra in 0usize..20,
        seed in any::<u64>(),
        shifts in proptest::collection::vec(-1_000_000_000i64..1_000_000_000, 16),
        new_ref in 1usize..16,
    ) {
        let (_, at, edges) = graph(n, extra, seed, 1.0);
        let base = solve(&edges, HostId(0), at).unwrap();

        let shifted: Vec<EdgeEstimate> = edges.iter().map(|e| EdgeEstimate {
            at_ns: e.at_ns + shifts[e.from.0 as usize],
            offset_ns: e.offset_ns + (shifts[e.to.0 as usize] - shifts[e.from.0 as usize]) as f64,
            ..e.clone()
        }).collect();
        let s = solve(&shifted, HostId(0), at + shifts[0]).unwrap();
        for (h, h0) in s.hosts.iter().zip(&base.hosts) {
            let want = h0.offset_ns + (shifts[h.host.0 as usize] - shifts[0]) as f64;
            prop_assert!((h.offset_ns - want).abs() < 1e-3, "{} vs {}", h.offset_ns, want);
            prop_assert!((h.error_bound_ns - h0.error_bound_ns).abs() <= 1e-5 * h0.error_bound_ns);
        }

        // Reverse every edge: b→a, measured at the same instant (b's clock
        // reads t + o there, rounded to whole ns), offset negated (moved by
        // the reverse drift over the rounding), drift inverted.
        let reversed: Vec<EdgeEstimate> = edges.iter().map(|e| {
            let d = e.drift_ppb * 1e-9;
            let d_rev = 1.0 / (1.0 + d) - 1.0;
            let rounding = e.offset_ns.round() - e.offset_ns;
            EdgeEstimate {
                from: e.to,
                to: e.from,
                at_ns: e.at_ns + e.offset_ns.round() as i64,
                offset_ns: -e.offset_ns + d_rev * rounding,
                drift_ppb: d_rev * 1e9,
                ..e.clone()
            }
        }).collect();
        // Rejection off: a z-score at the threshold may tip either way
        // under the perturbation below.
        let keep_all = SolveConfig { reject_z: f64::INFINITY, ..SolveConfig::default() };
        let b = solve_with(&edges, HostId(0), at, &keep_all).unwrap();
        let r = solve_with(&reversed, HostId(0), at, &keep_all).unwrap();
        // Equal up to the weights: an edge's age (which scales its drift
        // error into offset error) is now read on the other clock, a
        // relative change of up to the drift (2e-4); against ≤ 500 ns of edge
        // noise that moves the solution by hundredths of a ns.
        for (h, h0) in r.hosts.iter().zip(&b.hosts) {
            prop_assert!((h.offset_ns - h0.offset_ns).abs() < 0.5,
                "{} vs {}", h.offset_ns, h0.offset_ns);
            prop_assert!((h.drift_ppb - h0.drift_ppb).abs() < 1e-3);
        }

        // Another reference: its clock reads at + x_new at the same instant
        // (rounded to whole ns; the drift over < 1 ns is below 1e-3 ns).
        let new_ref = HostId((new_ref % n) as u32);
        let x_new = base.host(new_ref).unwrap().offset_ns;
        let other = solve(&edges, new_ref, at + x_new.round() as i64).unwrap();
        for h in &other.hosts {
            let want = base.host(h.host).unwrap().offset_ns - x_new;
            prop_assert!((h.offset_ns - want).abs() < 1e-3, "{} vs {}", h.offset_ns, want);
        }
    }
}

/// A random connected graph on `n` hosts with exact edges plus, scaled by
/// `noise` (0 or 1), Gaussian offset noise of the edge's stated error
/// (random in 20..500 ns).
fn graph(n: usize, extra: usize, seed: u64, noise: f64) -> (Vec<Clock>, i64, Vec<EdgeEstimate>) {
    let mut rng = rng(seed);
    let c: Vec<Clock> = (0..n)
        .map(|_| Clock::random(&mut rng, 0.5e9, 100e-6))
        .collect();
    let at = c[0].read(2e9);
    let mut pairs: Vec<(usize, usize)> = (1..n).map(|i| (rng.gen_range(0..i), i)).collect();
    for _ in 0..extra {
        let a = rng.gen_range(0..n);
        let b = rng.gen_range(0..n);
        if a != b {
            pairs.push((a, b));
        }
    }
    let edges = pairs
        .into_iter()
        .map(|(a, b)| {
            let (a, b) = if rng.gen() { (a, b) } else { (b, a) };
            let tau = c[0].tau_at(at) + rng.gen_range(-1e9..1e9);
            let t = c[a].read(tau);
            let err = rng.gen_range(20.0..500.0);
            EdgeEstimate {
                from: HostId(a as u32),
                to: HostId(b as u32),
                at_ns: t,
                offset_ns: true_offset(&c[a], &c[b], t) + noise * normal(&mut rng, err),
                drift_ppb: true_drift_ppb(&c[a], &c[b]),
                offset_error_ns: err,
                drift_error_ppb: rng.gen_range(10.0..100.0),
            }
        })
        .collect();
    (c, at, edges)
}
