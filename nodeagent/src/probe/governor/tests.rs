//! Unit tests of `probe::governor`.

use super::*;

/// A thread whose CPU share is `fixed + per_pair · rate`, read once a
/// second.
struct Sim {
    g: Governor,
    t: Instant,
    cpu: f64,
}

impl Sim {
    fn new(g: Governor) -> Self {
        let mut s = Self {
            g,
            t: Instant::now(),
            cpu: 0.0,
        };
        s.g.observe(s.t, 0);
        s
    }

    /// Runs `secs` seconds; the rate after each.
    fn run(&mut self, fixed: f64, per_pair: f64, secs: u64) -> Vec<u32> {
        (0..secs)
            .map(|_| {
                self.cpu += (fixed + per_pair * f64::from(self.g.rate())) * 1e9;
                self.t += Duration::from_secs(1);
                self.g.observe(self.t, self.cpu as u64);
                self.g.rate()
            })
            .collect()
    }
}

#[test]
fn an_expensive_mesh_is_brought_under_its_budget_and_stays_there() {
    // 1.25 % of a core at 100 pairs/s (as on the 2-core netns testbed),
    // a 1 % budget.
    let mut sim = Sim::new(Governor::new(1.0, 100).unwrap());
    let rates = sim.run(0.001, 0.000115, 60);
    let last = *rates.last().unwrap();
    let usage = 0.001 + 0.000115 * f64::from(last);
    assert!(usage <= 0.01, "usage {usage} at rate {last}");
    assert!(usage >= 0.008, "not cut further than needed: {usage}");
    // Settled: the last 30 s hold one rate.
    assert!(rates[30..].iter().all(|r| *r == last), "{rates:?}");
}

#[test]
fn the_rate_comes_back_when_the_cost_drops_and_never_passes_the_configured_one() {
    let mut sim = Sim::new(Governor::new(1.0, 100).unwrap());
    sim.run(0.0, 0.00025, 30);
    assert_eq!(sim.g.rate(), 36, "0.9 % / 0.025 % per pair");
    let rates = sim.run(0.0, 0.00005, 30);
    assert_eq!(*rates.last().unwrap(), 100);
    assert!(rates.iter().all(|r| *r <= 100));
    // Rises are gentle: at most +25 % per window.
    for w in rates.windows(2) {
        assert!(f64::from(w[1]) <= f64::from(w[0]) * 1.25 + 1.0, "{rates:?}");
    }
}

#[test]
fn a_budget_that_cannot_be_met_stops_at_the_floor() {
    let mut sim = Sim::new(Governor::new(0.5, 100).unwrap());
    let rates = sim.run(0.02, 0.0001, 40);
    assert_eq!(sim.g.min_rate(), 25);
    assert_eq!(*rates.last().unwrap(), 25);
    // One window cuts at most by half.
    assert!(rates[0] >= 50 && rates[1] >= 25, "{rates:?}");
    // Eight rails: each path needs its share, so the floor is the
    // mesh's (80), not the governor's own (25).
    sim.g.set_path_floor(80);
    assert_eq!(sim.g.rate(), 80);
    sim.run(0.02, 0.0001, 10);
    assert_eq!(sim.g.rate(), 80);
    sim.g.set_path_floor(500);
    assert_eq!(sim.g.min_rate(), 100, "never above the configured rate");
    sim.g.set_path_floor(0);
    assert_eq!(sim.g.min_rate(), 25);
    // A low configured rate is its own floor.
    let mut sim = Sim::new(Governor::new(0.5, 10).unwrap());
    sim.run(0.02, 0.0001, 10);
    assert_eq!(sim.g.rate(), 10);
}

#[test]
fn off_and_short_windows_change_nothing() {
    let mut sim = Sim::new(Governor::new(0.0, 100).unwrap());
    let rates = sim.run(0.5, 0.01, 10);
    assert!(rates.iter().all(|r| *r == 100));
    assert!(sim.g.usage().unwrap() > 0.5, "usage is still measured");
    let mut g = Governor::new(1.0, 100).unwrap();
    let t0 = Instant::now();
    assert_eq!(g.observe(t0, 0), None, "the first reading opens a window");
    assert_eq!(
        g.observe(t0 + Duration::from_secs(1), 1_000_000_000),
        None,
        "under {WINDOW:?}: no verdict"
    );
    let v = g.observe(t0 + WINDOW, 1_000_000_000).unwrap();
    assert!((v.usage - 0.5).abs() < 1e-9);
    assert_eq!((v.rate_before, v.rate), (100, 50), "cut by half at most");
}

#[test]
fn bad_budgets_are_refused() {
    for b in [-1.0, 100.5, f64::NAN, f64::INFINITY] {
        assert!(Governor::new(b, 100).is_err(), "{b}");
    }
    assert!(Governor::new(100.0, 100).is_ok());
}
