//! Test-only clock error, applied to every timestamp the agent takes.
//!
//! All hosts of the netns testbed share one kernel clock, so their true
//! offsets are zero. To measure synchronisation the agent can pretend its
//! clock is wrong: `t' = t + offset + drift·(t - anchor)`, applied to every
//! kernel and user-space timestamp of the probe mesh (and its summaries).
//! The truth is then known exactly: the benchmark compares the estimated
//! offsets against it. Never set these on a real cluster.

/// A linear clock error (all zero: the identity).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TestClock {
    pub offset_ns: i64,
    /// Parts per billion; |drift| ≤ 1,000,000 (1000 ppm).
    pub drift_ppb: i64,
    /// The instant (true clock, Unix ns) at which the error equals `offset_ns`.
    pub anchor_ns: i64,
}

/// Largest drift accepted (ppb).
pub const MAX_TEST_DRIFT_PPB: i64 = 1_000_000;
/// Largest offset accepted (ns): one hour.
pub const MAX_TEST_OFFSET_NS: i64 = 3_600_000_000_000;

impl TestClock {
    /// Validates the settings.
    pub fn new(offset_ns: i64, drift_ppb: i64, anchor_ns: i64) -> Result<Self, String> {
        if offset_ns.unsigned_abs() > MAX_TEST_OFFSET_NS as u64 {
            return Err(format!(
                "test clock offset {offset_ns} ns is beyond ±{MAX_TEST_OFFSET_NS} ns"
            ));
        }
        if drift_ppb.unsigned_abs() > MAX_TEST_DRIFT_PPB as u64 {
            return Err(format!(
                "test clock drift {drift_ppb} ppb is beyond ±{MAX_TEST_DRIFT_PPB} ppb"
            ));
        }
        Ok(Self {
            offset_ns,
            drift_ppb,
            anchor_ns,
        })
    }

    pub fn is_identity(&self) -> bool {
        self.offset_ns == 0 && self.drift_ppb == 0
    }

    /// The skewed reading of true time `t_ns` (exact integer arithmetic).
    pub fn apply(&self, t_ns: i64) -> i64 {
        if self.is_identity() {
            return t_ns;
        }
        let dt = i128::from(t_ns) - i128::from(self.anchor_ns);
        let skew = dt * i128::from(self.drift_ppb) / 1_000_000_000;
        let v = i128::from(t_ns) + i128::from(self.offset_ns) + skew;
        v.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
    }
}

/// The current Unix time in ns (`CLOCK_REALTIME`, like kernel software
/// timestamps).
pub fn realtime_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests;
