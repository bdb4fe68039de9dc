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
//! reconciler hands the open ones to the [`crate::leader::orders::OrderHub`], which
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

use crate::leader::orders::OrderHub;
use crate::leader::webhooks::WebhookSender;
use crate::model::{Action, ClusterState, Command, DrainPhase, Intent, Outcome};
use crate::node::{now_ms, Supervisor};

/// How often the leader re-examines the state.
pub const TICK: Duration = Duration::from_millis(50);
/// An order without an answer this long after its intent opened fails.
pub const ORDER_DEADLINE_MS: u64 = 30_000;

/// Runs until the process exits; acts only while this node leads.
pub async fn run(sup: Arc<Supervisor>, orders: Arc<OrderHub>, webhooks: Arc<WebhookSender>) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        if !sup.leads() {
            orders.clear();
            webhooks.clear();
            continue;
        }
        if let Err(e) = step(&sup, &orders, &webhooks).await {
            tracing::warn!(error = %e, "reconciler step failed; retrying next tick");
        }
    }
}

/// Actions the state calls for that have no open intent yet.
pub fn wanted_actions(st: &ClusterState) -> Vec<Action> {
    let open: Vec<&Action> = st.open_intents().map(|i| &i.action).collect();
    st.hosts
        .values()
        .filter(|h| matches!(&h.drain, Some(d) if d.phase == DrainPhase::Draining))
        .map(|h| Action::CompleteDrain {
            host: h.name.clone(),
        })
        .chain(crate::jobs::wanted_job_actions(st))
        .chain(crate::shaping::wanted_shape_actions(st))
        .filter(|a| !open.contains(&a))
        .collect()
}

/// What to do about an open intent now: `Some(outcome)` closes it.
pub fn evaluate(st: &ClusterState, intent: &Intent, now_ms: u64) -> Option<Outcome> {
    match &intent.action {
        Action::CompleteDrain { host } => {
            let Some(h) = st.hosts.get(host) else {
                return Some(Outcome::Cancelled {
                    why: "host no longer exists".into(),
                });
            };
            let Some(drain) = &h.drain else {
                return Some(Outcome::Cancelled {
                    why: "host was undrained".into(),
                });
            };
            if drain.phase == DrainPhase::Drained {
                return Some(Outcome::Done);
            }
            let jobs_left = st.jobs_on(host).count();
            if jobs_left == 0 {
                return Some(Outcome::Done);
            }
            // Jobs are moved off by `jobs::wanted_job_commands` (halting
            // checkpoint, or a stop at the deadline).
            None
        }
        Action::StartRank { .. } | Action::StopJob { .. } | Action::CheckpointJob { .. } => {
            match crate::jobs::job_order_obsolete(st, &intent.action) {
                Some(why) => Some(Outcome::Cancelled { why }),
                None => unanswered(intent, now_ms),
            }
        }
        Action::PlaybookStep { .. } => crate::runs::evaluate_step(st, intent, now_ms),
        Action::ShapeNic { .. } | Action::ClearShape { .. } => {
            match crate::shaping::shape_order_obsolete(st, &intent.action) {
                Some(why) => Some(Outcome::Cancelled { why }),
                None => unanswered(intent, now_ms),
            }
        }
        Action::Failover { host, nic, .. } | Action::Failback { host, nic } => {
            let Some(h) = st.hosts.get(host) else {
                return Some(Outcome::Cancelled {
                    why: "host no longer exists".into(),
                });
            };
            if !h.nics.contains_key(nic) {
                return Some(Outcome::Cancelled {
                    why: format!("NIC {nic} is no longer registered"),
                });
            }
            if let Action::Failover { to, .. } = &intent.action {
                if !h.nics.contains_key(to) {
                    return Some(Outcome::Cancelled {
                        why: format!("NIC {to} is no longer registered"),
                    });
                }
            }
            // The agent answers (Agent.OrderDone); a host that is away gets
            // the order when it is back, within the deadline.
            unanswered(intent, now_ms)
        }
    }
}

/// An order intent still open [`ORDER_DEADLINE_MS`] after it opened:
/// Failed (its agent never answered).
fn unanswered(intent: &Intent, now_ms: u64) -> Option<Outcome> {
    (now_ms >= intent.opened_ms.saturating_add(ORDER_DEADLINE_MS)).then(|| Outcome::Failed {
        error: format!(
            "the agent of {} did not answer within {} s",
            intent.action.host(),
            ORDER_DEADLINE_MS / 1000
        ),
    })
}

async fn step(
    sup: &Arc<Supervisor>,
    orders: &OrderHub,
    webhooks: &WebhookSender,
) -> Result<(), crate::api::ApiError> {
    let now = now_ms();
    for cmd in sup.read(|st| crate::jobs::wanted_job_commands(st, now)) {
        tracing::info!(decision = ?cmd, "job decision");
        // A decision the state outran is refused at apply; the next tick
        // decides again from the new state.
        if let Err(e) = sup.propose(Command::Job(cmd)).await {
            tracing::info!(error = %e, "job decision refused");
        }
    }
    if !sup.read(|st| st.shipped_playbooks_installed) {
        tracing::info!(
            files = playbooks::SHIPPED.len(),
            "a new cluster: installing the shipped playbooks"
        );
        sup.propose(Command::InstallShippedPlaybooks {
            files: crate::playbook_store::shipped_files(),
        })
        .await?;
    }
    for cmd in sup.read(crate::runs::wanted_run_commands) {
        tracing::info!(decision = ?cmd, "starting a playbook run");
        // A start the state outran (incident closed, playbook changed) is
        // refused at apply; the next tick decides again.
        if let Err(e) = sup.propose(Command::Playbook(cmd)).await {
            tracing::info!(error = %e, "playbook run start refused");
        }
    }
    webhooks.dispatch(sup);
    for action in sup.read(wanted_actions) {
        tracing::info!(action = ?action, "opening intent");
        sup.propose(Command::OpenIntent { action }).await?;
    }
    let closes: Vec<(u64, Outcome)> = sup.read(|st| {
        st.open_intents()
            .filter_map(|i| evaluate(st, i, now).map(|o| (i.id, o)))
            .collect()
    });
    for (id, outcome) in closes {
        tracing::info!(intent = id, outcome = ?outcome, "closing intent");
        sup.propose(Command::CloseIntent { id, outcome }).await?;
    }
    let open = sup.read(crate::leader::orders::open_orders);
    orders.dispatch(&open, std::time::Instant::now());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{AdminOp, NicSpec, Proposal};
    use openraft::{CommittedLeaderId, LogId};

    fn apply(st: &mut ClusterState, i: u64, cmd: Command) -> crate::model::CmdResult {
        let lid = LogId::new(CommittedLeaderId::new(1, 1), i);
        st.apply_proposal(
            &lid,
            &Proposal {
                at_ms: i,
                cmds: vec![cmd],
            },
        )
        .remove(0)
    }

    fn drained_state() -> ClusterState {
        let mut st = ClusterState::default();
        apply(
            &mut st,
            1,
            Command::RegisterHost {
                host: "h0".into(),
                nics: vec![NicSpec {
                    name: "rail0".into(),
                    rail: Some(0),
                    backup: None,
                    rdma_device: None,
                    addr: None,
                }],
                labels: Default::default(),
            },
        )
        .unwrap();
        apply(
            &mut st,
            2,
            Command::Admin {
                actor: "a".into(),
                op: AdminOp::Drain {
                    host: "h0".into(),
                    reason: "r".into(),
                    deadline_ms: None,
                },

                request: None,
            },
        )
        .unwrap();
        st
    }

    /// A leader that died between committing an intent and closing it leaves
    /// the intent open in the replicated state; the next leader neither opens
    /// a second one nor forgets it, and closing it is idempotent.
    #[test]
    fn new_leader_resumes_an_open_intent_once() {
        let mut st = drained_state();
        let wanted = wanted_actions(&st);
        assert_eq!(wanted, vec![Action::CompleteDrain { host: "h0".into() }]);
        apply(
            &mut st,
            3,
            Command::OpenIntent {
                action: wanted[0].clone(),
            },
        )
        .unwrap();
        // --- old leader dies here; the state is all the new leader has ---
        assert!(
            wanted_actions(&st).is_empty(),
            "no second intent for the same action"
        );
        let open: Vec<_> = st.open_intents().cloned().collect();
        assert_eq!(open.len(), 1);
        let outcome = evaluate(&st, &open[0], 10).expect("no jobs: drain completes");
        assert_eq!(outcome, Outcome::Done);
        apply(
            &mut st,
            4,
            Command::CloseIntent {
                id: open[0].id,
                outcome: outcome.clone(),
            },
        )
        .unwrap();
        apply(
            &mut st,
            5,
            Command::CloseIntent {
                id: open[0].id,
                outcome,
            },
        )
        .unwrap();
        assert_eq!(
            st.hosts["h0"].drain.as_ref().unwrap().phase,
            DrainPhase::Drained
        );
        assert_eq!(
            st.events
                .iter()
                .filter(|e| e.what.starts_with("drained"))
                .count(),
            1
        );
    }

    /// An order intent stays open (and is resent) until the agent answers;
    /// it fails after the deadline and is cancelled when its NIC is gone.
    #[test]
    fn order_intents_wait_for_the_agent_then_fail_or_cancel() {
        let mut st = ClusterState::default();
        let nic = |name: &str, backup: &str| NicSpec {
            name: name.into(),
            rail: None,
            backup: Some(backup.into()),
            rdma_device: None,
            addr: None,
        };
        let register = |nics| Command::RegisterHost {
            host: "h0".into(),
            nics,
            labels: Default::default(),
        };
        apply(
            &mut st,
            1,
            register(vec![nic("rail0", "rail1"), nic("rail1", "rail0")]),
        )
        .unwrap();
        let r = apply(
            &mut st,
            2,
            Command::Admin {
                actor: "a".into(),
                op: AdminOp::NicFailover {
                    host: "h0".into(),
                    nic: "rail0".into(),
                    to: None,
                },
                request: None,
            },
        );
        assert_eq!(r, Ok(crate::model::CmdOk::IntentOpened { id: 1 }));
        assert!(wanted_actions(&st).is_empty(), "orders come from admins");
        let intent = st.open_intents().next().unwrap().clone();
        let orders = crate::leader::orders::open_orders(&st);
        assert_eq!(orders.len(), 1);
        assert_eq!(orders[0].0, "h0");
        assert_eq!(orders[0].1.order_id, 1);
        assert_eq!(evaluate(&st, &intent, intent.opened_ms + 1_000), None);
        assert!(matches!(
            evaluate(&st, &intent, intent.opened_ms + ORDER_DEADLINE_MS),
            Some(Outcome::Failed { .. })
        ));
        // The agent re-registers without rail1 (and rail0 without backup).
        apply(
            &mut st,
            3,
            register(vec![NicSpec {
                name: "rail0".into(),
                rail: None,
                backup: None,
                rdma_device: None,
                addr: None,
            }]),
        )
        .unwrap();
        assert!(matches!(
            evaluate(&st, &intent, intent.opened_ms + 1_000),
            Some(Outcome::Cancelled { .. })
        ));
    }

    #[test]
    fn drain_waits_for_jobs_and_is_cancelled_by_undrain() {
        let mut st = drained_state();
        st.jobs
            .insert("j".into(), crate::jobs::placed_for_test("j", &["h0"]));
        apply(
            &mut st,
            3,
            Command::OpenIntent {
                action: Action::CompleteDrain { host: "h0".into() },
            },
        )
        .unwrap();
        let intent = st.open_intents().next().unwrap().clone();
        assert_eq!(evaluate(&st, &intent, 10), None, "a job still runs on h0");
        apply(
            &mut st,
            4,
            Command::Admin {
                actor: "a".into(),
                op: AdminOp::Undrain { host: "h0".into() },
                request: None,
            },
        )
        .unwrap();
        assert!(matches!(
            evaluate(&st, &intent, 10),
            Some(Outcome::Cancelled { .. })
        ));
    }
}
