//! The leader's decisions, as one pure function of the state and the
//! leader's clock: [`decide`] returns the commands one reconciler tick
//! proposes, in the order it proposes them. The leader loop
//! (`reconciler.rs`) only proposes them and does the I/O that is not a
//! command (order streams, webhooks); tests drive the model with the same
//! function, so the order of decisions lives in one place.
//!
//! A decision the state outran by the time it is applied is refused by
//! validation at apply (or, for intents, opens nothing new: an open intent
//! for the same action is reused); the next tick decides again.

use crate::model::command::Command;
use crate::model::hosts::DrainPhase;
use crate::model::intents::{Action, Intent, Outcome};
use crate::model::playbook_store::shipped_files;
use crate::model::state::ClusterState;

/// An order without an answer this long after its intent opened fails.
pub const ORDER_DEADLINE_MS: u64 = 30_000;

/// The commands one reconciler tick proposes, in order: job decisions
/// (placements, restarts, drain moves), the shipped playbooks for a new
/// cluster, playbook run starts, intents for wanted actions, then the
/// closes of open intents that are done, obsolete or unanswered.
pub fn decide(st: &ClusterState, now_ms: u64) -> Vec<Command> {
    let mut out: Vec<Command> = crate::model::jobs::wanted_job_commands(st, now_ms)
        .into_iter()
        .map(Command::Job)
        .collect();
    if !st.shipped_playbooks_installed {
        out.push(Command::InstallShippedPlaybooks {
            files: shipped_files(),
        });
    }
    out.extend(
        crate::model::runs::wanted_run_commands(st)
            .into_iter()
            .map(Command::Playbook),
    );
    out.extend(
        wanted_actions(st)
            .into_iter()
            .map(|action| Command::OpenIntent { action }),
    );
    out.extend(st.open_intents().filter_map(|i| {
        evaluate(st, i, now_ms).map(|outcome| Command::CloseIntent { id: i.id, outcome })
    }));
    out
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
        .chain(crate::model::jobs::wanted_job_actions(st))
        .chain(crate::model::shaping::wanted_shape_actions(st))
        .chain(crate::model::reroute::wanted_reroute_actions(st))
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
            match crate::model::jobs::job_order_obsolete(st, &intent.action) {
                Some(why) => Some(Outcome::Cancelled { why }),
                None => unanswered(intent, now_ms),
            }
        }
        Action::PlaybookStep { .. } => crate::model::runs::evaluate_step(st, intent, now_ms),
        Action::ShapeNic { .. } | Action::ClearShape { .. } => {
            match crate::model::shaping::shape_order_obsolete(st, &intent.action) {
                Some(why) => Some(Outcome::Cancelled { why }),
                None => unanswered(intent, now_ms),
            }
        }
        Action::Reroute { .. } => {
            match crate::model::reroute::reroute_order_obsolete(st, &intent.action) {
                Some(why) => Some(Outcome::Cancelled { why }),
                None => unanswered(intent, now_ms),
            }
        }
        Action::Failover { host, nic, .. } | Action::Failback { host, nic, .. } => {
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
                nics: vec![NicSpec::named("rail0").on_rail(0)],
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
                .filter(|e| matches!(e.event, crate::model::Event::Drained { .. }))
                .count(),
            1
        );
    }

    /// An order intent stays open (and is resent) until the agent answers;
    /// it fails after the deadline and is cancelled when its NIC is gone.
    #[test]
    fn order_intents_wait_for_the_agent_then_fail_or_cancel() {
        let mut st = ClusterState::default();
        let nic = |name: &str, backup: &str| NicSpec::named(name).backed_by(backup);
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
        apply(&mut st, 3, register(vec![NicSpec::named("rail0")])).unwrap();
        assert!(matches!(
            evaluate(&st, &intent, intent.opened_ms + 1_000),
            Some(Outcome::Cancelled { .. })
        ));
    }

    #[test]
    fn drain_waits_for_jobs_and_is_cancelled_by_undrain() {
        let mut st = drained_state();
        st.jobs.insert(
            "j".into(),
            crate::model::testkit::placed_for_test("j", &["h0"]),
        );
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
