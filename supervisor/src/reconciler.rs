//! The leader's reconciler: turns desired state into actions, each recorded
//! as an intent before it is carried out.
//!
//! **Protocol.** (1) Commit `OpenIntent{action}` (deduplicated by action, so
//! a retried or concurrent open yields the same id). (2) Carry out the action;
//! actions are idempotent by intent id. (3) Commit `CloseIntent{id, outcome}`
//! (closing twice is a no-op). A new leader finds every open intent in the
//! replicated state and resumes it from step 2, so nothing is forgotten and
//! nothing takes effect twice.
//!
//! Drain is the first user: a Draining host gets a `CompleteDrain` intent
//! that closes (host → Drained) once no job runs on it. Stopping work at the
//! drain deadline and moving jobs arrive with the jobs issue.
//!
//! Orders are the second: `nic failover`/`nic failback` commit a
//! `Failover`/`Failback` intent (the admin write itself); every tick the
//! reconciler hands the open ones to the [`crate::orders::OrderHub`], which
//! sends them to the host's agent (and again until answered). The agent's
//! answer (`Agent.OrderDone`) closes the intent Done or Failed; the
//! reconciler closes what can no longer happen (host or NIC gone: Cancelled)
//! or got no answer within [`ORDER_DEADLINE_MS`] (Failed).
//!
//! Playbook runs are the third ([`crate::runs`]): each tick proposes a run
//! for every open incident a stored playbook matches; the run opens its
//! step intents in apply, and [`evaluate`] closes the waiting ones (orders
//! are answered by agents like the admin ones; checkpoints, restarts,
//! drains and `wait_until` conditions are checked here, each with its
//! step's timeout).

use std::sync::Arc;
use std::time::Duration;

use crate::model::decide::decide;
pub use crate::model::decide::{evaluate, wanted_actions, ORDER_DEADLINE_MS};
use crate::model::Command;
use crate::node::{now_ms, Supervisor};

/// How often the leader re-examines the state.
pub const TICK: Duration = Duration::from_millis(50);

/// Runs until the process exits; acts only while this node leads.
pub async fn run(sup: Arc<Supervisor>) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        if !sup.leads() {
            sup.orders.clear();
            sup.webhooks.clear();
            continue;
        }
        if let Err(e) = step(&sup).await {
            tracing::warn!(error = %e, "reconciler step failed; retrying next tick");
        }
    }
}

/// Most rounds of decisions in one tick. A decision's consequence (a
/// placement's start orders, a run's first step) is decided in the same
/// tick, as the state after it calls for; a state that keeps calling for
/// more cannot hold the loop.
const MAX_ROUNDS: usize = 4;

async fn step(sup: &Arc<Supervisor>) -> Result<(), crate::api::ApiError> {
    let now = now_ms();
    let mut last: Vec<Command> = Vec::new();
    for _ in 0..MAX_ROUNDS {
        let cmds = sup.read(|st| decide(st, now));
        // Nothing new to decide, or only what was just refused.
        if cmds.is_empty() || cmds == last {
            break;
        }
        let mut refused = false;
        for cmd in cmds.iter().cloned() {
            match &cmd {
                Command::Job(_) | Command::Playbook(_) => {
                    tracing::info!(decision = ?cmd, "leader decision");
                    // A decision the state outran is refused at apply; the
                    // next tick decides again from the new state.
                    if let Err(e) = sup.propose(cmd).await {
                        tracing::info!(error = %e, "leader decision refused");
                        refused = true;
                    }
                }
                Command::InstallShippedPlaybooks { files } => {
                    tracing::info!(
                        files = files.len(),
                        "a new cluster: installing the shipped playbooks"
                    );
                    sup.propose(cmd).await?;
                }
                _ => {
                    tracing::info!(decision = ?cmd, "intent decision");
                    sup.propose(cmd).await?;
                }
            }
        }
        if refused {
            break;
        }
        last = cmds;
    }
    sup.webhooks.dispatch(sup);
    let open = sup.read(crate::orders::open_orders);
    sup.orders.dispatch(&open, std::time::Instant::now());
    Ok(())
}
