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
