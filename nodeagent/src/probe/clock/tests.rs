//! Unit tests of `probe::clock`.

use super::*;

#[test]
fn identity_and_linear_error() {
    let t0 = 1_700_000_000_000_000_000;
    assert_eq!(TestClock::default().apply(t0), t0);
    let c = TestClock::new(250_000, 100_000, t0).unwrap(); // +250 µs, 100 ppm
    assert_eq!(c.apply(t0), t0 + 250_000);
    // One second later the clock gained another 100 µs.
    assert_eq!(c.apply(t0 + 1_000_000_000), t0 + 1_000_000_000 + 350_000);
    let c = TestClock::new(-1_000_000_000, -200_000, t0).unwrap();
    assert_eq!(
        c.apply(t0 + 10_000_000_000),
        t0 + 10_000_000_000 - 1_002_000_000
    );
}

#[test]
fn refuses_absurd_settings() {
    assert!(TestClock::new(0, 2_000_000, 0).is_err());
    assert!(TestClock::new(i64::MAX, 0, 0).is_err());
}

#[test]
fn steps_jump_at_their_instant_and_are_bounded() {
    let t0 = 1_700_000_000_000_000_000;
    let c = TestClock::new(0, 0, t0)
        .unwrap()
        .with_step("1700000000500000000:1000000000".parse().unwrap())
        .unwrap()
        .with_step(ClockStep {
            at_ns: t0 + 2_000_000_000,
            delta_ns: -1_000_000_000,
        })
        .unwrap();
    assert!(!c.is_identity());
    assert_eq!(c.apply(t0 + 499_999_999), t0 + 499_999_999);
    assert_eq!(c.apply(t0 + 500_000_000), t0 + 1_500_000_000);
    assert_eq!(c.apply(t0 + 2_000_000_000), t0 + 2_000_000_000);
    // Bounds: a fifth step, a reach past an hour, a malformed step.
    let mut many = TestClock::default();
    for _ in 0..MAX_TEST_STEPS {
        many = many
            .with_step(ClockStep {
                at_ns: 0,
                delta_ns: 1,
            })
            .unwrap();
    }
    assert!(many
        .with_step(ClockStep {
            at_ns: 0,
            delta_ns: 1
        })
        .is_err());
    let big = ClockStep {
        at_ns: 0,
        delta_ns: MAX_TEST_OFFSET_NS,
    };
    assert!(TestClock::new(1, 0, 0).unwrap().with_step(big).is_err());
    assert!("12".parse::<ClockStep>().is_err());
    assert!("a:1".parse::<ClockStep>().is_err());
}
