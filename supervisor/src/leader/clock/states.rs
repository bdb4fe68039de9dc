//! Committed clock states: each host's state from the solution (solved or
//! held over; Unsynced when absent), with hysteresis before a worse state,
//! and the changes the leader commits (`SetClockStates`).

use std::time::{Duration, Instant};

use clocksync::SolveConfig;

use crate::leader::clock::records::{model_state, Solved};
use crate::model::{ClockChange, ClockState, ClusterState, Liveness};

/// A host leaves a better state only when its bound exceeds that state's
/// threshold by this factor (no Raft write per second at a threshold).
const HYSTERESIS: f64 = 1.25;

/// The state a host with error bound `bound_ns` should have, given its
/// committed state: leaving a better state needs the bound to exceed that
/// state's threshold by [`HYSTERESIS`].
pub fn classify(prev: ClockState, bound_ns: f64, cfg: &SolveConfig) -> ClockState {
    let plain = model_state(cfg.state_of(bound_ns));
    match prev {
        ClockState::Synced if bound_ns <= cfg.synced_ns * HYSTERESIS => ClockState::Synced,
        ClockState::Synced | ClockState::Degraded
            if plain == ClockState::Unsynced && bound_ns <= cfg.degraded_ns * HYSTERESIS =>
        {
            ClockState::Degraded
        }
        _ => plain,
    }
}

/// `h`'s clock at `now` ([`Solved::clock_at`]), except that a Down host
/// is not held over (not from an earlier solution, nor while the last
/// solution stands in).
pub(super) fn host_clock(
    solved: &Solved,
    h: &crate::model::Host,
    now: Instant,
    cfg: &SolveConfig,
) -> Option<(clocksync::HostClock, Option<Duration>)> {
    solved
        .clock_at(h.id, now, cfg)
        .filter(|(_, held)| held.is_none() || h.liveness != Liveness::Down)
}

/// The clock state changes to commit: every host whose state from
/// `solved` (solved or held over; Unsynced when absent) differs from its
/// committed one.
pub fn clock_changes(
    st: &ClusterState,
    solved: Option<&Solved>,
    cfg: &SolveConfig,
    now: Instant,
) -> Vec<ClockChange> {
    st.hosts
        .values()
        .filter_map(|h| {
            let solved = solved
                .and_then(|s| host_clock(s, h, now, cfg))
                .map(|(c, _)| c);
            let (state, offset_ns, error_bound_ns) = match solved {
                Some(c) => (
                    classify(h.clock.state, c.error_bound_ns, cfg),
                    Some(c.offset_ns),
                    Some(c.error_bound_ns),
                ),
                None => (ClockState::Unsynced, None, None),
            };
            (state != h.clock.state).then(|| ClockChange {
                host: h.name.clone(),
                state,
                offset_ns,
                error_bound_ns,
            })
        })
        .collect()
}
