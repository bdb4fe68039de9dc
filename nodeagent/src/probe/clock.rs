//! Test-only clock error, applied to every timestamp the agent takes.
//!
//! All hosts of the netns testbed share one kernel clock, so their true
//! offsets are zero. To measure synchronisation the agent can pretend its
//! clock is wrong: `t' = t + offset + drift·(t - anchor)`, applied to every
//! kernel and user-space timestamp of the probe mesh (and its summaries).
//! The truth is then known exactly: the benchmark compares the estimated
//! offsets against it. Steps ([`TestClock::with_step`]) add a jump at a
//! given true instant, as when an NTP daemon steps a clock, so a scenario
//! can check that a step is not mistaken for a link fault. Never set these
//! on a real cluster.

/// A linear clock error with up to [`MAX_TEST_STEPS`] steps (all zero and
/// no step: the identity).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TestClock {
    pub offset_ns: i64,
    /// Parts per billion; |drift| ≤ 1,000,000 (1000 ppm).
    pub drift_ppb: i64,
    /// The instant (true clock, Unix ns) at which the error equals `offset_ns`.
    pub anchor_ns: i64,
    /// Jumps of the clock: from true time `at_ns` on, `delta_ns` more.
    pub steps: [Option<ClockStep>; MAX_TEST_STEPS],
}

/// A step of the test clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockStep {
    /// True Unix time (ns) of the step.
    pub at_ns: i64,
    pub delta_ns: i64,
}

/// Most steps one test clock takes.
pub const MAX_TEST_STEPS: usize = 4;

impl std::str::FromStr for ClockStep {
    type Err = String;

    /// `AT_NS:DELTA_NS`, both signed integers.
    fn from_str(s: &str) -> Result<Self, String> {
        let (at, delta) = s
            .split_once(':')
            .ok_or_else(|| format!("clock step {s:?}: want AT_UNIX_NS:DELTA_NS"))?;
        let num = |v: &str, what: &str| {
            v.trim()
                .parse::<i64>()
                .map_err(|e| format!("clock step {s:?}: {what} {v:?}: {e}"))
        };
        Ok(ClockStep {
            at_ns: num(at, "instant")?,
            delta_ns: num(delta, "step")?,
        })
    }
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
            steps: [None; MAX_TEST_STEPS],
        })
    }

    /// Adds a step; refused past [`MAX_TEST_STEPS`] or when the offset
    /// with every step could leave ±[`MAX_TEST_OFFSET_NS`].
    pub fn with_step(mut self, step: ClockStep) -> Result<Self, String> {
        let slot = self
            .steps
            .iter_mut()
            .find(|s| s.is_none())
            .ok_or_else(|| format!("at most {MAX_TEST_STEPS} test clock steps"))?;
        *slot = Some(step);
        let reach = self
            .steps
            .iter()
            .flatten()
            .fold(i128::from(self.offset_ns).abs(), |acc, s| {
                acc + i128::from(s.delta_ns).abs()
            });
        if reach > i128::from(MAX_TEST_OFFSET_NS) {
            return Err(format!(
                "test clock offset and steps reach beyond ±{MAX_TEST_OFFSET_NS} ns"
            ));
        }
        Ok(self)
    }

    pub fn is_identity(&self) -> bool {
        self.offset_ns == 0 && self.drift_ppb == 0 && self.steps.iter().all(Option::is_none)
    }

    /// The sum of the steps taken by true time `t_ns`.
    fn stepped(&self, t_ns: i64) -> i128 {
        self.steps
            .iter()
            .flatten()
            .filter(|s| s.at_ns <= t_ns)
            .map(|s| i128::from(s.delta_ns))
            .sum()
    }

    /// The skewed reading of true time `t_ns` (exact integer arithmetic).
    pub fn apply(&self, t_ns: i64) -> i64 {
        if self.is_identity() {
            return t_ns;
        }
        let dt = i128::from(t_ns) - i128::from(self.anchor_ns);
        let skew = dt * i128::from(self.drift_ppb) / 1_000_000_000;
        let v = i128::from(t_ns) + i128::from(self.offset_ns) + skew + self.stepped(t_ns);
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
