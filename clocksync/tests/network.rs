//! Network-effect solve on synthetic meshes with known truth. Run with
//! `--nocapture` to see the figures.

mod common;

use clocksync::{
    solve, solve_with, ClockState, EdgeEstimate, EdgeStatus, HostId, PairConfig, PairEstimator,
    Solution, SolveConfig,
};
use common::*;
use rand::rngs::StdRng;
use rand::Rng;

const REF: usize = 0;

/// Random host clocks: offsets ±0.5 s and drifts ±100 ppm around true time,
/// so pairwise up to ±1 s and ±200 ppm.
fn clocks(rng: &mut StdRng, n: usize) -> Vec<Clock> {
    (0..n).map(|_| Clock::random(rng, 0.5e9, 100e-6)).collect()
}

/// The exact edge a→b as measured when a's clock reads `t`.
fn exact_edge(c: &[Clock], a: usize, b: usize, t: i64) -> EdgeEstimate {
    EdgeEstimate {
        from: HostId(a as u32),
        to: HostId(b as u32),
        at_ns: t,
        offset_ns: true_offset(&c[a], &c[b], t),
        drift_ppb: true_drift_ppb(&c[a], &c[b]),
        offset_error_ns: 100.0,
        drift_error_ppb: 50.0,
    }
}

/// Truth: (offset, drift ppb) of host h relative to REF when REF's clock
/// reads `at`.
fn truth(c: &[Clock], h: usize, at: i64) -> (f64, f64) {
    let tau = c[REF].tau_at(at);
    (
        c[h].exact(tau) - c[REF].exact(tau),
        true_drift_ppb(&c[REF], &c[h]),
    )
}

/// Host offset errors vs truth, reference excluded.
fn host_errors(s: &Solution, c: &[Clock]) -> Vec<f64> {
    s.hosts
        .iter()
        .filter(|h| h.host != HostId(REF as u32))
        .map(|h| h.offset_ns - truth(c, h.host.0 as usize, s.at_ns).0)
        .collect()
}

/// A K=5 random regular mesh with edges measured at random times within
/// ±1 s of the solve instant, each with Gaussian noise of `sigma` ns on
/// the offset (and 50 ppb on the drift), stated as the edge's error.
fn noisy_mesh(rng: &mut StdRng, n: usize, sigma: f64) -> (Vec<Clock>, i64, Vec<EdgeEstimate>) {
    let c = clocks(rng, n);
    let at = c[REF].read(5e9);
    let edges = random_regular(rng, n, 5)
        .into_iter()
        .map(|(a, b)| {
            let (a, b) = if rng.gen() { (a, b) } else { (b, a) };
            let tau = c[REF].tau_at(at) + rng.gen_range(-1e9..1e9);
            let mut e = exact_edge(&c, a, b, c[a].read(tau));
            e.offset_ns += normal(rng, sigma);
            e.drift_ppb += normal(rng, 50.0);
            e.offset_error_ns = sigma;
            e
        })
        .collect();
    (c, at, edges)
}

#[test]
fn noise_free_regular_mesh_is_exact() {
    let mut rng = rng(11);
    let n = 64;
    let c = clocks(&mut rng, n);
    let at = c[REF].read(3e9);
    let edges: Vec<EdgeEstimate> = random_regular(&mut rng, n, 5)
        .into_iter()
        .map(|(a, b)| {
            let tau = c[REF].tau_at(at) + rng.gen_range(-1e9..1e9);
            exact_edge(&c, a, b, c[a].read(tau))
        })
        .collect();
    let s = solve(&edges, HostId(REF as u32), at).unwrap();
    assert_eq!(s.hosts.len(), n);
    for h in &s.hosts {
        let (x, d) = truth(&c, h.host.0 as usize, at);
        assert!((h.offset_ns - x).abs() < 0.01, "{h:?} vs {x}");
        assert!((h.drift_ppb - d).abs() < 1e-3, "{h:?} vs {d}");
        assert_eq!(h.state, ClockState::Synced);
    }
    let worst = s
        .edges
        .iter()
        .map(|e| e.residual_ns.abs())
        .fold(0.0, f64::max);
    println!("noise-free K=5 mesh, 64 hosts: worst loop residual {worst:.2e} ns");
    assert!(worst < 0.01);
    assert!(s.edges.iter().all(|e| e.status == EdgeStatus::Used));
}

#[test]
fn noisy_mesh_network_effect() {
    let mut rng = rng(12);
    let sigma = 100.0;
    let mut all = Vec::new();
    let mut covered = 0;
    let mut hosts = 0;
    let mut chi2 = Vec::new();
    let mut rejected = 0;
    for _ in 0..20 {
        let (c, at, edges) = noisy_mesh(&mut rng, 64, sigma);
        let s = solve(&edges, HostId(REF as u32), at).unwrap();
        let errs = host_errors(&s, &c);
        for (h, e) in s.hosts.iter().filter(|h| h.host.0 != REF as u32).zip(&errs) {
            // error_bound_ns is a 1-σ scale in edge-error units; 3σ covers.
            if e.abs() <= 3.0 * h.error_bound_ns {
                covered += 1;
            }
            hosts += 1;
            assert_eq!(h.state, ClockState::Synced);
        }
        all.extend(errs);
        chi2.push(s.chi2_per_dof);
        rejected += s
            .edges
            .iter()
            .filter(|e| e.status == EdgeStatus::Rejected)
            .count();
    }
    let mean_chi2 = chi2.iter().sum::<f64>() / chi2.len() as f64;
    println!(
        "noisy K=5 mesh, 64 hosts, edge σ {sigma} ns: host |offset err| p50 {:.0} ns p99 {:.0} ns \
         (single edge would be σ); 3×bound covers {:.1} %; χ²/dof {mean_chi2:.2}; rejected edges {rejected}",
        pct(&all, 50.0),
        pct(&all, 99.0),
        100.0 * covered as f64 / hosts as f64,
    );
    assert!(pct(&all, 99.0) < 2.6 * sigma);
    assert!(covered as f64 >= 0.99 * hosts as f64);
    assert!((0.8..1.2).contains(&mean_chi2));
    assert!(rejected <= 2, "rejected {rejected} clean edges");
}

#[test]
fn corrupted_edge_is_found_by_its_loop_residual() {
    let mut rng = rng(13);
    let (c, at, mut edges) = noisy_mesh(&mut rng, 64, 100.0);
    let bad = 17;
    edges[bad].offset_ns += 20_000.0;

    // Without rejection: the bad edge has by far the largest |z|.
    let cfg = SolveConfig {
        reject_z: f64::INFINITY,
        ..SolveConfig::default()
    };
    let s = solve_with(&edges, HostId(REF as u32), at, &cfg).unwrap();
    let worst = (0..edges.len())
        .max_by(|&i, &j| s.edges[i].z.abs().total_cmp(&s.edges[j].z.abs()))
        .unwrap();
    let mut zs: Vec<f64> = s.edges.iter().map(|e| e.z.abs()).collect();
    zs.sort_by(f64::total_cmp);
    println!(
        "corrupted edge (+20 µs): |z| {:.1}, next worst {:.1}; residual {:.0} ns",
        s.edges[bad].z.abs(),
        zs[zs.len() - 2],
        s.edges[bad].residual_ns
    );
    assert_eq!(worst, bad);
    assert!(s.edges[bad].z.abs() > 20.0);
    assert!(s
        .suspect_edges(6.0)
        .any(|e| e.from == edges[bad].from && e.to == edges[bad].to));
    let polluted = pct(&host_errors(&s, &c), 100.0);

    // With rejection (the default): it is set aside and the hosts are clean.
    let s = solve(&edges, HostId(REF as u32), at).unwrap();
    assert_eq!(s.edges[bad].status, EdgeStatus::Rejected);
    assert!(s.edges[bad].z.abs() > 20.0);
    assert_eq!(
        s.edges
            .iter()
            .filter(|e| e.status == EdgeStatus::Rejected)
            .count(),
        1
    );
    let clean = pct(&host_errors(&s, &c), 100.0);
    println!("  worst host error with the edge {polluted:.0} ns, rejected {clean:.0} ns");
    assert!(clean < 400.0);
}

#[test]
fn disconnected_mesh_marks_the_island_unsynced() {
    let mut rng = rng(14);
    let c = clocks(&mut rng, 8);
    let at = c[REF].read(0.0);
    let t = |h: usize| c[h].read(0.0);
    let edges = vec![
        exact_edge(&c, 0, 1, t(0)),
        exact_edge(&c, 1, 2, t(1)),
        exact_edge(&c, 2, 0, t(2)),
        exact_edge(&c, 5, 6, t(5)),
        exact_edge(&c, 6, 7, t(6)),
    ];
    let s = solve(&edges, HostId(0), at).unwrap();
    assert_eq!(s.unreachable, vec![HostId(5), HostId(6), HostId(7)]);
    for h in [5, 6, 7] {
        assert_eq!(s.state(HostId(h)), ClockState::Unsynced);
        assert!(s.host(HostId(h)).is_none());
    }
    assert_eq!(s.state(HostId(2)), ClockState::Synced);
    assert_eq!(s.edges[3].status, EdgeStatus::Unreachable);
}

/// End to end: coded probes on every edge of a K=5 mesh, per-pair Huygens
/// estimates, then the network solve.
#[test]
fn end_to_end_mesh() {
    let mut rng = rng(15);
    let n = 32;
    let c = clocks(&mut rng, n);
    let mut edges = Vec::new();
    let mut pair_errs = Vec::new();
    for (a, b) in random_regular(&mut rng, n, 5) {
        let mut p = Path::loaded();
        p.base_ns = rng.gen_range(10_000.0..20_000.0);
        let stream = pair_stream(&mut rng, &c[a], &c[b], &p, &p, 10e9, 2e9, 100.0);
        let mut e = PairEstimator::new(PairConfig::default()).unwrap();
        for (dir, pair) in &stream {
            e.add_pair(*dir, pair, 1_000).unwrap();
        }
        let est = e.estimate().unwrap();
        pair_errs.push(est.offset_ns - true_offset(&c[a], &c[b], est.at_ns));
        edges.push(EdgeEstimate::from_estimate(
            HostId(a as u32),
            HostId(b as u32),
            &est,
        ));
    }
    let at = c[REF].read(11e9);
    let s = solve(&edges, HostId(REF as u32), at).unwrap();
    let errs = host_errors(&s, &c);
    let bounds: Vec<f64> = s.hosts.iter().map(|h| h.error_bound_ns).collect();
    let derrs: Vec<f64> = s
        .hosts
        .iter()
        .map(|h| h.drift_ppb - truth(&c, h.host.0 as usize, at).1)
        .collect();
    println!(
        "end to end, {n} hosts K=5, loaded paths: per-pair |err| p50 {:.0} p99 {:.0} ns; \
         host |offset err| p50 {:.0} p99 {:.0} max {:.0} ns; host bound max {:.0} ns; \
         host |drift err| p99 {:.0} ppb; χ²/dof {:.2}",
        pct(&pair_errs, 50.0),
        pct(&pair_errs, 99.0),
        pct(&errs, 50.0),
        pct(&errs, 99.0),
        pct(&errs, 100.0),
        pct(&bounds, 100.0),
        pct(&derrs, 99.0),
        s.chi2_per_dof,
    );
    assert!(pct(&errs, 100.0) < 1_000.0);
    assert!(s.hosts.iter().all(|h| h.state == ClockState::Synced));
    assert!(pct(&derrs, 100.0) < 500.0);
}
