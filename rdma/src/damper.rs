//! Flap damping in the style of BGP route flap damping (RFC 2439).
//!
//! Every flap adds a fixed penalty; the penalty decays exponentially with a
//! half-life. A NIC whose penalty reaches the suppress threshold is
//! *suppressed* (Flapping: traffic stays off it) until the penalty decays
//! below the reuse threshold. The penalty is capped so that a suppressed NIC
//! is never held longer than `max_suppress` after its last flap.
//!
//! Time is passed in explicitly (`now`), so the maths is tested with a
//! controlled clock and the tracker can use the event's own timestamp.

use std::time::{Duration, Instant};

/// Damping parameters (DESIGN.md defaults).
#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DampingConfig {
    /// Penalty added per flap.
    pub penalty_per_flap: f64,
    /// Time for the penalty to halve.
    #[serde(with = "humantime_serde")]
    pub half_life: Duration,
    /// Suppress when the penalty reaches this.
    pub suppress: f64,
    /// Reusable again when the penalty falls below this.
    pub reuse: f64,
    /// Longest a NIC stays suppressed after its last flap (caps the penalty).
    #[serde(with = "humantime_serde")]
    pub max_suppress: Duration,
}

impl Default for DampingConfig {
    fn default() -> Self {
        Self {
            penalty_per_flap: 1000.0,
            half_life: Duration::from_secs(15),
            suppress: 2000.0,
            reuse: 750.0,
            max_suppress: Duration::from_secs(60),
        }
    }
}

/// Why a damping configuration is unusable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid flap damping settings: {0}")]
pub struct DampingConfigError(pub String);

impl DampingConfig {
    /// Checks the thresholds make sense together.
    pub fn validate(&self) -> Result<(), DampingConfigError> {
        let bad = |m: &str| Err(DampingConfigError(m.into()));
        if !(self.penalty_per_flap.is_finite() && self.penalty_per_flap > 0.0) {
            return bad("penalty_per_flap must be a positive number");
        }
        if self.half_life.is_zero() {
            return bad("half_life must be positive");
        }
        if !(self.reuse.is_finite() && self.reuse > 0.0) {
            return bad("reuse must be a positive number");
        }
        if !(self.suppress.is_finite() && self.suppress > self.reuse) {
            return bad("suppress must be greater than reuse");
        }
        if self.ceiling() < self.suppress {
            return bad("max_suppress is too short to ever reach the suppress threshold");
        }
        Ok(())
    }

    /// The penalty cap: the value that decays to `reuse` in `max_suppress`.
    pub fn ceiling(&self) -> f64 {
        self.reuse * 2f64.powf(self.max_suppress.as_secs_f64() / self.half_life.as_secs_f64())
    }
}

/// The damping state of one NIC.
#[derive(Debug, Clone)]
pub struct FlapDamper {
    cfg: DampingConfig,
    /// Penalty as of `at`.
    penalty: f64,
    at: Option<Instant>,
    suppressed: bool,
    flaps: u32,
}

impl FlapDamper {
    pub fn new(cfg: DampingConfig) -> Self {
        Self {
            cfg,
            penalty: 0.0,
            at: None,
            suppressed: false,
            flaps: 0,
        }
    }

    fn decayed(&self, now: Instant) -> f64 {
        match self.at {
            None => 0.0,
            Some(at) => {
                let dt = now.saturating_duration_since(at).as_secs_f64();
                self.penalty * 0.5f64.powf(dt / self.cfg.half_life.as_secs_f64())
            }
        }
    }

    /// Brings the penalty and the suppressed flag up to `now`.
    fn advance(&mut self, now: Instant) {
        self.penalty = self.decayed(now);
        self.at = Some(now);
        if self.suppressed && self.penalty < self.cfg.reuse {
            self.suppressed = false;
        }
    }

    /// Records one flap at `now`; returns whether the NIC is now suppressed.
    pub fn record_flap(&mut self, now: Instant) -> bool {
        self.advance(now);
        self.flaps = self.flaps.saturating_add(1);
        self.penalty = (self.penalty + self.cfg.penalty_per_flap).min(self.cfg.ceiling());
        if self.penalty >= self.cfg.suppress {
            self.suppressed = true;
        }
        self.suppressed
    }

    /// Whether the NIC is suppressed at `now`.
    pub fn is_suppressed(&mut self, now: Instant) -> bool {
        self.advance(now);
        self.suppressed
    }

    /// The penalty at `now` (without changing state).
    pub fn penalty(&self, now: Instant) -> f64 {
        self.decayed(now)
    }

    /// Flaps recorded so far.
    pub fn flaps(&self) -> u32 {
        self.flaps
    }

    /// When a suppressed NIC becomes reusable (if no further flap happens);
    /// `None` when it is not suppressed.
    pub fn reusable_in(&mut self, now: Instant) -> Option<Duration> {
        if !self.is_suppressed(now) {
            return None;
        }
        let halvings = (self.penalty / self.cfg.reuse).log2();
        Some(self.cfg.half_life.mul_f64(halvings.max(0.0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t0() -> Instant {
        Instant::now()
    }

    #[test]
    fn penalty_halves_every_half_life() {
        let base = t0();
        let mut d = FlapDamper::new(DampingConfig::default());
        d.record_flap(base);
        let p = d.penalty(base + Duration::from_secs(15));
        assert!((p - 500.0).abs() < 1e-6, "{p}");
        let p = d.penalty(base + Duration::from_secs(30));
        assert!((p - 250.0).abs() < 1e-6, "{p}");
    }

    #[test]
    fn three_quick_flaps_suppress_and_decay_releases() {
        let base = t0();
        let ms = Duration::from_millis;
        let mut d = FlapDamper::new(DampingConfig::default());
        assert!(!d.record_flap(base), "one flap is not enough");
        assert!(
            !d.record_flap(base + ms(100)),
            "1995 < 2000: two flaps 100 ms apart are not"
        );
        assert!(
            d.record_flap(base + ms(200)),
            "the third quick flap suppresses"
        );
        // 2982.2 decays below 750 after 15 s * log2(2982.2 / 750) ≈ 29.87 s.
        let wait = d.reusable_in(base + ms(200)).unwrap();
        assert!((wait.as_secs_f64() - 29.87).abs() < 0.05, "{wait:?}");
        assert!(d.is_suppressed(base + Duration::from_secs(29)));
        assert!(!d.is_suppressed(base + Duration::from_secs(31)));
        assert_eq!(d.reusable_in(base + Duration::from_secs(31)), None);
    }

    #[test]
    fn hysteresis_between_suppress_and_reuse() {
        let base = t0();
        let mut d = FlapDamper::new(DampingConfig::default());
        d.record_flap(base);
        d.record_flap(base);
        // 2000 -> ~1000 after 15 s: below suppress but above reuse: still suppressed.
        assert!(d.is_suppressed(base + Duration::from_secs(15)));
        // Flaps spaced a half-life apart never accumulate to 2000.
        let mut slow = FlapDamper::new(DampingConfig::default());
        for i in 0..20 {
            assert!(
                !slow.record_flap(base + Duration::from_secs(15 * i)),
                "flap {i}"
            );
        }
        assert_eq!(slow.flaps(), 20);
    }

    #[test]
    fn ceiling_bounds_suppression_after_the_last_flap() {
        let base = t0();
        let cfg = DampingConfig::default();
        let mut d = FlapDamper::new(cfg);
        for i in 0..200 {
            d.record_flap(base + Duration::from_millis(i));
        }
        let last = base + Duration::from_millis(199);
        assert!(d.penalty(last) <= cfg.ceiling() + 1e-6);
        let wait = d.reusable_in(last).unwrap();
        assert!(wait <= cfg.max_suppress, "{wait:?}");
        assert!(!d.is_suppressed(last + cfg.max_suppress + Duration::from_millis(1)));
    }

    #[test]
    fn config_validation_names_the_problem() {
        let mut c = DampingConfig::default();
        assert!(c.validate().is_ok());
        c.reuse = 3000.0;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("greater than reuse"));
        let c = DampingConfig {
            half_life: Duration::ZERO,
            ..Default::default()
        };
        assert!(c.validate().is_err());
        let c = DampingConfig {
            max_suppress: Duration::from_secs(1),
            ..Default::default()
        };
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("max_suppress"));
    }
}
