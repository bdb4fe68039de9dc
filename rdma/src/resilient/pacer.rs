//! Pacing of a connection's writes: a token bucket over bytes, set by
//! [`super::ConnControl::set_rate`] (the rate-reshaping hook).

use std::time::{Duration, Instant};

/// Token bucket over bytes.
pub(super) struct Pacer {
    rate: f64,
    tokens: f64,
    burst: f64,
    last: Instant,
}

impl Pacer {
    pub(super) fn new(rate: u64) -> Self {
        let rate = rate.max(1) as f64;
        // A burst of 10 ms worth, at least one 64 KiB chunk.
        let burst = (rate / 100.0).max(65_536.0);
        Self {
            rate,
            tokens: burst,
            burst,
            last: Instant::now(),
        }
    }
    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        self.last = now;
    }
    /// When `bytes` may go (now if the bucket has anything left: a frame may
    /// overdraw, and the debt delays the next one).
    pub(super) fn ready_at(&mut self, now: Instant) -> Instant {
        self.refill(now);
        if self.tokens > 0.0 {
            now
        } else {
            now + Duration::from_secs_f64(-self.tokens / self.rate + 1e-6)
        }
    }
    pub(super) fn take(&mut self, bytes: usize) {
        self.tokens -= bytes as f64;
    }
}
