//! The leader's reconciler loop: every tick it proposes what
//! [`crate::model::decide::decide`] calls for, then hands the open orders to
//! the agents' order streams ([`crate::leader::orders::OrderHub`]) and the
//! open `notify` steps to the webhook sender. All the deciding is in the
//! model (pure, tested there); this loop only does the I/O.
//!
//! **Protocol.** (1) Commit `OpenIntent{action}` (deduplicated by action, so
//! a retried or concurrent open yields the same id). (2) Carry out the action;
//! actions are idempotent by intent id. (3) Commit `CloseIntent{id, outcome}`
//! (closing twice is a no-op). A new leader finds every open intent in the
//! replicated state and resumes it from step 2, so nothing is forgotten and
//! nothing takes effect twice.

use std::sync::Arc;
use std::time::Duration;

use crate::leader::orders::OrderHub;
use crate::leader::webhooks::WebhookSender;
use crate::model::decide::decide;
use crate::model::Command;
use crate::node::{now_ms, Supervisor};

/// How often the leader re-examines the state.
pub const TICK: Duration = Duration::from_millis(50);

/// Runs until the process exits; acts only while this node leads. Steps
/// every [`TICK`], and at once when `nudge` is notified (at most one step
/// per [`MIN_STEP_GAP`]).
pub async fn run(
    sup: Arc<Supervisor>,
    orders: Arc<OrderHub>,
    webhooks: Arc<WebhookSender>,
    nudge: Arc<tokio::sync::Notify>,
) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = nudge.notified() => {}
        }
        if !sup.leads() {
            orders.clear();
            webhooks.clear();
            continue;
        }
        if let Err(e) = step(&sup, &orders, &webhooks).await {
            tracing::warn!(error = %e, "reconciler step failed; retrying next tick");
        }
        tokio::time::sleep(MIN_STEP_GAP).await;
    }
}

/// The least time between two steps, however often the reconciler is
/// nudged.
pub const MIN_STEP_GAP: Duration = Duration::from_millis(2);

/// Most rounds of decisions in one tick. A decision's consequence (a
/// placement's start orders, a run's first step) is decided in the same
/// tick, as the state after it calls for; a state that keeps calling for
/// more cannot hold the loop.
const MAX_ROUNDS: usize = 4;

async fn step(
    sup: &Arc<Supervisor>,
    orders: &OrderHub,
    webhooks: &WebhookSender,
) -> Result<(), crate::api::ApiError> {
    let now = now_ms();
    let mut last: Vec<Command> = Vec::new();
    for _ in 0..MAX_ROUNDS {
        let cmds = sup.read(|st| decide(st, now));
        // Nothing new to decide, or only what was just refused.
        if cmds.is_empty() || cmds == last {
            break;
        }
        // Every decision of a round was taken from the same state, so none
        // waits for another's commit: queued together, in order, they share
        // Raft entries (a playbook start no longer holds back the detour
        // orders decided beside it).
        for cmd in &cmds {
            match cmd {
                Command::InstallShippedPlaybooks { files } => tracing::info!(
                    files = files.len(),
                    "a new cluster: installing the shipped playbooks"
                ),
                Command::Job(_) | Command::Playbook(_) => {
                    tracing::info!(decision = ?cmd, "leader decision")
                }
                _ => tracing::info!(decision = ?cmd, "intent decision"),
            }
        }
        let results = futures::future::join_all(cmds.iter().cloned().map(|c| sup.propose(c))).await;
        let mut refused = false;
        for (cmd, result) in cmds.iter().zip(results) {
            match (cmd, result) {
                (_, Ok(_)) => {}
                // A decision the state outran is refused at apply; the next
                // tick decides again from the new state.
                (Command::Job(_) | Command::Playbook(_), Err(e)) => {
                    tracing::info!(error = %e, "leader decision refused");
                    refused = true;
                }
                (_, Err(e)) => return Err(e),
            }
        }
        if refused {
            break;
        }
        last = cmds;
    }
    webhooks.dispatch(sup);
    send_open_orders(sup, orders);
    Ok(())
}

/// Hands every open order to its agent's order stream (an order already
/// sent waits for its resend time), stamped with this leader's term; a
/// node that does not lead sends nothing and ends the streams. Called by
/// the reconciler's step and as soon as a NIC report commits.
pub fn send_open_orders(sup: &Supervisor, orders: &OrderHub) {
    // The term read with the role before the orders: a leader that has
    // just heard of a newer term sends nothing.
    let Some(term) = sup.leading_term() else {
        orders.clear();
        return;
    };
    let read = || {
        let mut open = sup.read(crate::leader::orders::open_orders);
        for (_, o) in &mut open {
            o.term = term;
        }
        open
    };
    orders.dispatch(read, std::time::Instant::now());
}
