//! What the runs call for now, as pure functions of the state: runs to
//! start, waiting steps to close.

use crate::model::hosts::DrainPhase;
use crate::model::intents::{Action, Intent, Outcome};
use crate::model::jobs::types::JobState;
use crate::model::runs::types::{RunCommand, StepOp};
use crate::model::state::ClusterState;

/// Runs the state calls for (pure): open incidents that never had a run
/// and that a stored playbook matches.
pub fn wanted_run_commands(st: &ClusterState) -> Vec<RunCommand> {
    let candidates: Vec<u64> = st
        .open_incidents()
        .filter(|i| i.run.is_none())
        // A cut-off host's NIC incidents wait for it to be reachable.
        .filter(|i| {
            i.nic.is_none()
                || st
                    .hosts
                    .get(&i.host)
                    .is_none_or(|h| h.cut_off_incident.is_none())
        })
        .map(|i| i.id)
        .collect();
    if candidates.is_empty() || st.playbooks.is_empty() {
        return Vec::new();
    }
    let set = st.playbook_set();
    candidates
        .into_iter()
        .filter_map(|id| {
            let view = st.incident_view(id)?;
            let pb = playbooks::matching(set.iter().copied(), &view)?;
            Some(RunCommand::Start {
                incident: id,
                playbook: pb.name.clone(),
                version: st.playbooks.get(&pb.name)?.version,
            })
        })
        .collect()
}

/// What to do about an open playbook step intent now (`Some`: close it).
pub fn evaluate_step(st: &ClusterState, intent: &Intent, now_ms: u64) -> Option<Outcome> {
    let Action::PlaybookStep { run, host, op, .. } = &intent.action else {
        return None;
    };
    let Some(r) = st.runs.get(run) else {
        return Some(Outcome::Cancelled {
            why: format!("run {run} was forgotten"),
        });
    };
    if !r.state.is_active() || r.step_intent != Some(intent.id) {
        return Some(Outcome::Cancelled {
            why: format!("run {run} moved on"),
        });
    }
    let step = r.definition.steps.get(r.step)?;
    let deadline = intent
        .opened_ms
        .saturating_add(step.timeout.as_millis() as u64);
    let timed_out = now_ms >= deadline;
    let timeout = || {
        Some(Outcome::Failed {
            error: format!(
                "step {} timed out after {}",
                step.id,
                humantime::format_duration(step.timeout)
            ),
        })
    };
    let Some(h) = st.hosts.get(host) else {
        return Some(Outcome::Failed {
            error: format!("host {host} no longer exists"),
        });
    };
    match op {
        StepOp::Failover { .. } | StepOp::Failback { .. } => {
            let nics: &[&String] = match op {
                StepOp::Failover { nic, to } => &[nic, to],
                StepOp::Failback { nic } => &[nic],
                _ => unreachable!("matched above"),
            };
            if let Some(n) = nics.iter().find(|n| !h.nics.contains_key(n.as_str())) {
                return Some(Outcome::Failed {
                    error: format!("NIC {n} is no longer registered"),
                });
            }
            // The agent answers (Agent.OrderDone).
            if timed_out {
                return timeout();
            }
            None
        }
        StepOp::CheckpointJobs { jobs } => {
            let mut pending = false;
            for m in jobs {
                match st.jobs.get(&m.job) {
                    None => {
                        return Some(Outcome::Failed {
                            error: format!("job {} no longer exists", m.job),
                        })
                    }
                    Some(j) if j.latest_checkpoint > m.checkpoint => {}
                    // Its ranks can no longer all talk: no new checkpoint
                    // will come; the latest complete one stands.
                    Some(j) if crate::model::jobs::place::ring_cut(st, j).is_some() => {}
                    Some(j) if j.state.is_final() => {
                        return Some(Outcome::Failed {
                            error: format!("job {} is {:?}", m.job, j.state),
                        })
                    }
                    Some(_) => pending = true,
                }
            }
            if !pending {
                return Some(Outcome::Done);
            }
            if timed_out {
                return timeout();
            }
            None
        }
        StepOp::RestartJobs { jobs } => {
            let mut pending = false;
            for m in jobs {
                match st.jobs.get(&m.job) {
                    None => {}
                    Some(j) if j.state == JobState::Failed => {
                        return Some(Outcome::Failed {
                            error: format!("job {} failed: {}", m.job, j.reason),
                        })
                    }
                    Some(j) if j.state.is_final() => {}
                    Some(j)
                        if j.incarnation > m.incarnation
                            && matches!(j.state, JobState::Running | JobState::Checkpointing)
                            && j.ranks.iter().all(|r| r.started) => {}
                    Some(_) => pending = true,
                }
            }
            if !pending {
                return Some(Outcome::Done);
            }
            if timed_out {
                return timeout();
            }
            None
        }
        StepOp::Drain { .. } => match &h.drain {
            None => Some(Outcome::Failed {
                error: format!("host {host} was undrained"),
            }),
            Some(d) if d.phase == DrainPhase::Drained => Some(Outcome::Done),
            Some(_) if timed_out => timeout(),
            Some(_) => None,
        },
        StepOp::WaitUntil { .. } => {
            let playbooks::Action::WaitUntil { condition } = &step.action else {
                return Some(Outcome::Failed {
                    error: "the step is not a wait_until".into(),
                });
            };
            let inc = st.incident_view(r.incident)?;
            let view = st.playbook_view_of(now_ms, &inc);
            let check = playbooks::evaluate(condition, &inc, &view);
            if check.holds {
                return Some(Outcome::Done);
            }
            if timed_out {
                return Some(Outcome::Failed {
                    error: format!(
                        "timed out after {} waiting for {condition} ({})",
                        humantime::format_duration(step.timeout),
                        check.reason
                    ),
                });
            }
            None
        }
        // The leader's webhook sender answers; only the timeout is ours.
        StepOp::Notify {
            webhook: Some(_), ..
        } => timed_out.then(timeout).flatten(),
        StepOp::ReshapeRate { .. } => {
            let refused = st.shapes.values().flat_map(|m| m.iter()).find(|(_, s)| {
                s.incident == r.incident && s.failures >= crate::model::shaping::MAX_SHAPE_FAILURES
            });
            if let Some((nic, _)) = refused {
                return Some(Outcome::Failed {
                    error: format!(
                        "an agent refused the shape of {nic} {} times",
                        crate::model::shaping::MAX_SHAPE_FAILURES
                    ),
                });
            }
            match st.shapes_applied(r.incident) {
                Some(true) => Some(Outcome::Done),
                None => Some(Outcome::Failed {
                    error: "the incident's shapes are gone (incident closed?)".into(),
                }),
                Some(false) if timed_out => timeout(),
                Some(false) => None,
            }
        }
        // Closed when they start.
        StepOp::Cordon
        | StepOp::ReturnToService
        | StepOp::ExcludeFromOwd
        | StepOp::IncludeInOwd
        | StepOp::Notify { webhook: None, .. } => Some(Outcome::Done),
    }
}
