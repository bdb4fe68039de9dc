//! Unit tests of `probe::queueing`.

use super::*;

const MS: i64 = 1_000_000;

fn line(offset_ns: f64) -> Estimate {
    Estimate {
        at_ns: 0,
        offset_ns,
        drift_ppb: 0.0,
        error_bound_ns: 100.0,
        drift_error_ppb: 0.0,
        half_gap_ns: 100.0,
        samples: 100,
        forward_samples: 50,
        reverse_samples: 50,
        outliers: 0,
        bound_from_subsets: true,
    }
}

/// Feeds `n` samples 20 ms apart from `t_ns`, true delay `owd(k)`,
/// peer clock ahead by 5 ms; returns the next time.
fn feed(
    t: &mut OutgoingTracker,
    t_ns: i64,
    n: i64,
    owd: impl Fn(i64) -> i64,
    e: Option<&Estimate>,
) -> i64 {
    let base = Instant::now();
    for k in 0..n {
        let tx = t_ns + k * 20 * MS;
        t.add(tx, owd(k) + 5 * MS, e, base);
    }
    t_ns + n * 20 * MS
}

#[test]
fn queueing_appears_when_delays_rise_and_goes_when_they_fall() {
    let e = line(5.0 * MS as f64);
    let mut t = OutgoingTracker::default();
    let at = feed(&mut t, 0, 100, |k| 20_000 + (k % 7) * 1_000, Some(&e));
    let s = t.latest().unwrap();
    assert_eq!(s.baseline_ns, 20_000);
    assert!(s.queueing_ns <= 6_000, "{s:?}");
    // A 3 ms queue builds up.
    let at = feed(&mut t, at, 10, |_| 3_020_000, Some(&e));
    let s = t.take_fresh().unwrap();
    assert_eq!((s.baseline_ns, s.queueing_ns), (20_000, 3_000_000));
    assert_eq!(t.take_fresh(), None, "taken once");
    feed(&mut t, at, 1, |_| 21_000, Some(&e));
    assert_eq!(t.latest().unwrap().queueing_ns, 1_000);
}

#[test]
fn the_baseline_does_not_follow_a_standing_queue() {
    let e = line(5.0 * MS as f64);
    let mut t = OutgoingTracker::default();
    let at = feed(&mut t, 0, 100, |_| 20_000, Some(&e));
    // 2 ms of standing queue for 90 s: three windows long.
    let at = feed(&mut t, at, 4_500, |_| 2_020_000, Some(&e));
    let s = t.latest().unwrap();
    assert_eq!((s.baseline_ns, s.queueing_ns), (20_000, 2_000_000));
    // Past the hold time the path starts over (the route changed).
    let at = feed(&mut t, at, 15_000, |_| 2_020_000, Some(&e));
    let s = t.latest().unwrap();
    assert_eq!((s.baseline_ns, s.queueing_ns), (2_020_000, 0));
    // A lower delay is always calm: the baseline drops at once.
    feed(&mut t, at, 1, |_| 20_000, Some(&e));
    assert_eq!(t.latest().unwrap().baseline_ns, 20_000);
    assert!(t.buckets.len() <= MAX_BUCKETS);
}

#[test]
fn old_calm_samples_leave_the_window() {
    let e = line(5.0 * MS as f64);
    let mut t = OutgoingTracker::default();
    let at = feed(&mut t, 0, 10, |_| 10_000, Some(&e));
    // Slightly higher but calm (within the slack) for 40 s: the
    // minimum is the recent one.
    feed(&mut t, at, 2_000, |_| 40_000, Some(&e));
    let s = t.latest().unwrap();
    assert_eq!((s.baseline_ns, s.queueing_ns), (40_000, 0));
    assert!(t.buckets.len() <= MAX_BUCKETS, "{}", t.buckets.len());
}

#[test]
fn a_new_line_is_not_queueing() {
    let mut t = OutgoingTracker::default();
    // Raw first (no line): delays include the 5 ms offset.
    let at = feed(&mut t, 0, 50, |_| 20_000, None);
    assert_eq!(t.latest().unwrap().baseline_ns, 5_020_000);
    let e = line(5.0 * MS as f64);
    t.reline(None, Some(&e));
    let at = feed(&mut t, at, 5, |_| 20_000, Some(&e));
    let s = t.latest().unwrap();
    assert_eq!(
        (s.owd_ns, s.baseline_ns, s.queueing_ns),
        (20_000, 20_000, 0)
    );
    // A re-estimate 3 µs off moves the baseline with it.
    let e2 = line(5.0 * MS as f64 + 3_000.0);
    t.reline(Some(&e), Some(&e2));
    feed(&mut t, at, 1, |_| 20_000, Some(&e2));
    assert_eq!(t.latest().unwrap().queueing_ns, 0);
}

#[test]
fn the_board_keys_by_address_and_forgets_old_plans() {
    let b = QueueingBoard::new();
    let s = OutgoingSample {
        tx_ns: 1,
        owd_ns: 2,
        baseline_ns: 1,
        queueing_ns: 1,
        at: Instant::now(),
    };
    let a = Ipv4Addr::new(10, 0, 0, 2);
    b.publish(1, [(a, "h1", 0, s)]);
    assert_eq!(b.get(a).unwrap().peer, "h1");
    assert_eq!(b.find("h1", 0).unwrap().0, a);
    assert!(b.find("h1", 1).is_none());
    b.publish(2, []);
    assert!(b.get(a).is_none());
}
