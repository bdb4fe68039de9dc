//! Holdover: a host missing from a solve keeps its last solved clock,
//! carried forward with its drift (its bound growing by the drift's error)
//! for at most [`MAX_HOLDOVER`] under the same reference; a tick without a
//! solution lets the last one stand in, every clock in it aged the same
//! way ([`Solved::clock_at`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clocksync::{HostId, SolveConfig};

use crate::leader::clock::records::{Held, Solved, Store, MAX_HOLDOVER, STALE_AFTER};

impl Solved {
    /// A host's clock as it stands at `now`: solved or held over, its bound
    /// grown by the drift's error since this solve (a reader extrapolates
    /// the offset with the drift from the solve's instant) and its state
    /// following that bound; with how long it has been held over (a held
    /// host, or every host once this solve is [`STALE_AFTER`] old). None
    /// after [`MAX_HOLDOVER`] without a solution for it.
    pub fn clock_at(
        &self,
        id: u32,
        now: Instant,
        cfg: &SolveConfig,
    ) -> Option<(clocksync::HostClock, Option<Duration>)> {
        let age = now.saturating_duration_since(self.at);
        let (c, held_for) = match self.clock_of(id)? {
            (c, Some(h)) => (c, Some(now.saturating_duration_since(h.since))),
            (c, None) => (c, (age >= STALE_AFTER).then_some(age)),
        };
        if held_for.is_some_and(|d| d > MAX_HOLDOVER) {
            return None;
        }
        let bound = c.error_bound_ns + c.drift_error_ppb.abs() * 1e-9 * age.as_nanos() as f64;
        if !(c.offset_ns.is_finite() && bound.is_finite()) {
            return None;
        }
        Some((
            clocksync::HostClock {
                error_bound_ns: bound,
                state: cfg.state_of(bound),
                ..c.clone()
            },
            held_for,
        ))
    }

    /// A host's clock in this solve: solved, or held over.
    pub fn clock_of(&self, id: u32) -> Option<(&clocksync::HostClock, Option<&Held>)> {
        if let Some(c) = self.solution.as_ref().and_then(|s| s.host(HostId(id))) {
            return Some((c, None));
        }
        self.held.get(&id).map(|h| (&h.clock, Some(h)))
    }
}

/// Carries forward, into `new`, the clocks of hosts that the previous
/// solve had (solved or held) and `new` lacks: for at most
/// [`MAX_HOLDOVER`] since their last solution, and only while the
/// reference is the same (offsets against another reference mean
/// nothing), and only for hosts in `keep` (registered, not Down). The
/// bound grows by the drift's error over the time carried.
pub(super) fn hold_over(
    prev: Option<&Solved>,
    new: &mut Solved,
    keep: &BTreeSet<u32>,
    now: Instant,
    cfg: &SolveConfig,
) {
    let Some(prev) = prev else { return };
    let (Some(prev_sol), Some(new_sol)) = (prev.solution.as_ref(), new.solution.as_ref()) else {
        return;
    };
    if prev.reference != new.reference {
        return;
    }
    let mut bases: BTreeMap<u32, (i64, clocksync::HostClock, Instant)> = prev
        .held
        .iter()
        .map(|(id, h)| (*id, (h.base_at_ns, h.base.clone(), h.since)))
        .collect();
    for c in &prev_sol.hosts {
        bases.insert(c.host.0, (prev_sol.at_ns, c.clone(), prev.at));
    }
    let mut held = BTreeMap::new();
    for (id, (base_at_ns, base, since)) in bases {
        if new_sol.host(HostId(id)).is_some()
            || !keep.contains(&id)
            || now.saturating_duration_since(since) > MAX_HOLDOVER
        {
            continue;
        }
        let dt = (i128::from(new_sol.at_ns) - i128::from(base_at_ns)) as f64;
        let offset_ns = base.offset_ns + base.drift_ppb * 1e-9 * dt;
        let error_bound_ns = base.error_bound_ns + base.drift_error_ppb * 1e-9 * dt.abs();
        if !(offset_ns.is_finite() && error_bound_ns.is_finite()) {
            continue;
        }
        let clock = clocksync::HostClock {
            offset_ns,
            error_bound_ns,
            state: cfg.state_of(error_bound_ns),
            ..base.clone()
        };
        held.insert(
            id,
            Held {
                base_at_ns,
                base,
                since,
                clock,
            },
        );
    }
    if !held.is_empty() {
        tracing::debug!(hosts = ?held.keys().collect::<Vec<_>>(), "clocks held over");
    }
    new.held = held;
}

/// Records a tick's solve (none: no fresh edges) and why it brought no
/// solution (none: it did); a solution at most [`MAX_HOLDOVER`] old stands
/// in for a tick without one.
pub(super) fn settle(
    store: &mut Store,
    solved: Option<Solved>,
    error: Option<String>,
    now: Instant,
) {
    if error != store.solve_error {
        match &error {
            Some(e) => tracing::warn!(error = %e, "no clock solution this tick"),
            None => tracing::info!("clock solutions again"),
        }
    }
    let stands_in = |p: &Arc<Solved>| {
        p.solution.is_some() && now.saturating_duration_since(p.at) <= MAX_HOLDOVER
    };
    let had = store.solved.as_ref().is_some_and(|p| p.solution.is_some());
    if error.is_none() || !store.solved.as_ref().is_some_and(stands_in) {
        if had && error.is_some() {
            tracing::warn!(
                after = ?MAX_HOLDOVER,
                "the last clock solution is too old to stand in: clocks unsynced"
            );
        }
        store.solved = solved.map(Arc::new);
    }
    store.solve_error = error;
}
