//! The probe CPU governor: keeps the probe thread inside a CPU budget.
//!
//! The rate bound (`pairs_per_s`) caps what the mesh sends; the budget caps
//! what it costs. The probe thread reads its own CPU time
//! (`CLOCK_THREAD_CPUTIME_ID`: syscalls, the thread's share of the kernel's
//! network work, its own code) and hands it to [`Governor::observe`] about
//! once a second. Over each window of at least [`WINDOW`] the governor
//! takes the thread's share of a core, `u`, and adjusts the rate `r`:
//!
//! * over the budget `b`: `r ← r · 0.9 b / u` (the cost is close to
//!   proportional to the rate: per-probe kernel work dominates it), at most
//!   halving per window, so one noisy window cannot collapse the rate;
//! * under `0.8 b` with the rate below the configured one: `r ← r · 0.9 b /
//!   u`, at most +25 % per window (probing back up is gentle);
//! * in between: unchanged (a dead band, so the rate does not hunt).
//!
//! The rate never leaves `[floor, configured]`, the floor being a quarter
//! of the configured rate but at least [`MIN_RATE`], and at least what the
//! mesh needs per path ([`Governor::set_path_floor`]: a peer's rate is split
//! over the rails both hosts have, and every path needs enough pure pairs
//! per estimator window and enough probes for liveness) — or the
//! configured rate, if that is lower: even a thread that cannot meet its
//! budget keeps every path probed often enough for loss, liveness and
//! clocks. A budget of 0 turns the governor off.

use std::time::{Duration, Instant};

/// Shortest window the governor judges the thread's CPU share over.
pub const WINDOW: Duration = Duration::from_secs(2);
/// Lowest governed rate (pairs/s per peer), unless configured lower.
pub const MIN_RATE: u32 = 25;
/// The share of the budget the governor aims at.
const TARGET: f64 = 0.9;
/// Below this share of the budget the rate may rise.
const RAISE_BELOW: f64 = 0.8;
/// Largest cut (factor) and rise (factor) per window.
const MAX_CUT: f64 = 0.5;
const MAX_RISE: f64 = 1.25;
/// Largest budget (% of one core) accepted.
pub const MAX_BUDGET_PCT: f64 = 100.0;

/// A budget that cannot be a budget.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "probe CPU budget {0}% of a core: want 0 (off) or more than 0 and at most {MAX_BUDGET_PCT}"
)]
pub struct BadBudget(pub f64);

/// Checks a budget (% of one core; 0: off).
pub fn check_budget(pct: f64) -> Result<(), BadBudget> {
    if pct.is_finite() && (0.0..=MAX_BUDGET_PCT).contains(&pct) {
        Ok(())
    } else {
        Err(BadBudget(pct))
    }
}

/// What one window found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verdict {
    /// The thread's share of one core over the window (0.012: 1.2 %).
    pub usage: f64,
    pub rate_before: u32,
    pub rate: u32,
}

/// The governor (see the module docs).
#[derive(Debug, Clone)]
pub struct Governor {
    /// Fraction of one core (0: off).
    budget: f64,
    max_rate: u32,
    /// The floor from the configured rate alone, and the one in force
    /// (raised by [`Governor::set_path_floor`]).
    base_min: u32,
    min_rate: u32,
    rate: f64,
    /// Start of the current window: (wall, thread CPU ns).
    mark: Option<(Instant, u64)>,
    /// The last window's share of a core.
    usage: Option<f64>,
}

impl Governor {
    /// `budget_pct`: % of one core (0: off); `max_rate`: the configured
    /// pairs/s per peer (≥ 1).
    pub fn new(budget_pct: f64, max_rate: u32) -> Result<Self, BadBudget> {
        check_budget(budget_pct)?;
        let max_rate = max_rate.max(1);
        let base_min = (max_rate / 4).max(MIN_RATE).min(max_rate);
        Ok(Self {
            budget: budget_pct / 100.0,
            max_rate,
            base_min,
            min_rate: base_min,
            rate: f64::from(max_rate),
            mark: None,
            usage: None,
        })
    }

    /// Raises the floor to `pairs_per_s` per peer (what the mesh's paths
    /// need; never above the configured rate), or lowers it back to the
    /// governor's own floor. The rate follows at once.
    pub fn set_path_floor(&mut self, pairs_per_s: u32) {
        self.min_rate = self.base_min.max(pairs_per_s).min(self.max_rate);
        self.rate = self
            .rate
            .clamp(f64::from(self.min_rate), f64::from(self.max_rate));
    }

    /// The rate to probe at now (pairs/s per peer).
    pub fn rate(&self) -> u32 {
        (self.rate.round() as u32).clamp(self.min_rate, self.max_rate)
    }

    pub fn max_rate(&self) -> u32 {
        self.max_rate
    }

    pub fn min_rate(&self) -> u32 {
        self.min_rate
    }

    /// The last window's share of one core, once a window has closed.
    pub fn usage(&self) -> Option<f64> {
        self.usage
    }

    /// The budget, % of one core (0: off).
    pub fn budget_pct(&self) -> f64 {
        100.0 * self.budget
    }

    pub fn enabled(&self) -> bool {
        self.budget > 0.0
    }

    /// Feeds the thread's CPU time (ns) read at `now`. Returns the verdict
    /// when this closed a window (the rate may be unchanged).
    pub fn observe(&mut self, now: Instant, cpu_ns: u64) -> Option<Verdict> {
        let Some((t0, c0)) = self.mark else {
            self.mark = Some((now, cpu_ns));
            return None;
        };
        let wall = now.saturating_duration_since(t0);
        if wall < WINDOW {
            return None;
        }
        self.mark = Some((now, cpu_ns));
        // A clock that went backwards (it cannot) is a window of nothing.
        let usage = cpu_ns.saturating_sub(c0) as f64 / wall.as_nanos() as f64;
        self.usage = Some(usage);
        let before = self.rate();
        if self.enabled() {
            let want = self.rate * TARGET * self.budget / usage.max(1e-9);
            if usage > self.budget {
                self.rate = want.max(self.rate * MAX_CUT);
            } else if usage < RAISE_BELOW * self.budget && before < self.max_rate {
                self.rate = want.min(self.rate * MAX_RISE);
            }
            self.rate = self
                .rate
                .clamp(f64::from(self.min_rate), f64::from(self.max_rate));
        }
        Some(Verdict {
            usage,
            rate_before: before,
            rate: self.rate(),
        })
    }
}

#[cfg(test)]
mod tests;
