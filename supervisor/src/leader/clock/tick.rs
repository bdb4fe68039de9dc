//! The clock loop: every [`TICK`] while this node leads, solve, hold over,
//! and commit clock state changes (after [`WARMUP`]); forget everything
//! when it does not lead.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use crate::leader::clock::records::{TICK, WARMUP};
use crate::leader::clock::service::ClockService;
use crate::leader::clock::states::clock_changes;
use crate::model::{Command, Liveness};
use crate::node::Supervisor;

/// Runs on every supervisor; solves and commits clock state changes every
/// [`TICK`] while it leads, forgets everything when it does not.
pub async fn run(sup: Arc<Supervisor>, clocks: Arc<ClockService>) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut leading = false;
    let mut leading_since = Instant::now();
    loop {
        tick.tick().await;
        if !sup.leads() {
            if leading {
                tracing::info!("no longer leading: clock data forgotten");
                leading = false;
            }
            clocks.clear();
            continue;
        }
        if !leading {
            tracing::info!("leader: clock service starts, rebuilt from the agents' next summaries");
            leading = true;
            leading_since = Instant::now();
        }
        let now = Instant::now();
        let input = sup.read(|st| clocks.solve_input(st, now));
        let cfg = clocks.config().clone();
        let solved = match input {
            None => None,
            Some(input) => {
                let unix_ms = crate::node::now_ms();
                let cfg = cfg.clone();
                match tokio::task::spawn_blocking(move || input.solve(&cfg, now, unix_ms)).await {
                    Ok(s) => Some(Ok(s)),
                    Err(e) => {
                        tracing::warn!(error = %e, "clock solve task failed");
                        Some(Err(format!("the solve task failed: {e}")))
                    }
                }
            }
        };
        match solved {
            Some(Ok(mut s)) => {
                let keep: BTreeSet<u32> = sup.read(|st| {
                    st.hosts
                        .values()
                        .filter(|h| h.liveness != Liveness::Down)
                        .map(|h| h.id)
                        .collect()
                });
                clocks.hold_over(&mut s, &keep, now);
                clocks.set_solved(Some(s), now);
            }
            Some(Err(why)) => clocks.set_solve_failed(why, now),
            None => clocks.set_solved(None, now),
        }
        let current = clocks.solved();
        let changes = sup.read(|st| clock_changes(st, current.as_deref(), &cfg, now));
        if changes.is_empty() || leading_since.elapsed() < WARMUP {
            continue;
        }
        for c in &changes {
            tracing::info!(host = %c.host, state = ?c.state, offset_ns = ?c.offset_ns, error_bound_ns = ?c.error_bound_ns, "host clock state changes");
        }
        if let Err(e) = sup.propose(Command::SetClockStates { changes }).await {
            tracing::warn!(error = %e, "cannot commit clock states");
        }
    }
}
