//! Beginning one attempt of a step: its intent and its model effects.

use crate::model::events::Event;
use crate::model::hosts::{Drain, DrainPhase, HostStatus, Liveness};
use crate::model::intents::{Action, Outcome};
use crate::model::jobs::types::JobState;
use crate::model::runs::types::{clip, JobMark, StepOp};
use crate::model::state::ClusterState;

/// How a step attempt that started ended at once (or that it waits).
pub(in crate::model) enum Begun {
    Waits(u64),
    Ended(Result<String, String>),
}

impl ClusterState {
    /// Starts one attempt of `step`: opens its intent and applies its
    /// model effects. Steps that finish at once close their intent here.
    pub(in crate::model) fn begin_step(
        &mut self,
        at_ms: u64,
        run: u64,
        step: &playbooks::Step,
        inc: &playbooks::IncidentView,
    ) -> Begun {
        use playbooks::{Action as A, MigrateTarget};
        let r = &self.runs[&run];
        let (step_no, attempt, run_incident) = (r.step as u32, r.attempt, r.incident);
        let limits = r.definition.limits.clone();
        let pb_name = r.playbook.clone();
        let host = inc.host.clone();
        let no_nic = || Err::<StepOp, String>("the incident names no NIC".into());
        // Resolve the operation; `Err` fails the attempt at once.
        let resolved: Result<StepOp, String> = match &step.action {
            A::MigrateQps { to } => match &inc.nic {
                None => no_nic(),
                Some(nic) => match self.hosts.get(&host) {
                    None => Err(format!("host {host} is unknown")),
                    Some(h) => {
                        let to = match to {
                            MigrateTarget::Backup => None,
                            MigrateTarget::Nic(n) => Some(n.as_str()),
                        };
                        crate::model::failover_target(h, nic, to)
                            .map(|to| StepOp::Failover {
                                nic: nic.clone(),
                                to,
                            })
                            .map_err(|e| e.to_string())
                    }
                },
            },
            A::Failback => match &inc.nic {
                None => no_nic(),
                Some(nic) => match self.hosts.get(&host) {
                    None => Err(format!("host {host} is unknown")),
                    Some(h) => crate::model::check_failback(h, nic)
                        .map(|()| StepOp::Failback { nic: nic.clone() })
                        .map_err(|e| e.to_string()),
                },
            },
            A::ReshapeRate {
                bits_per_sec,
                edge_hold,
            } => Ok(StepOp::ReshapeRate {
                bits_per_sec: *bits_per_sec,
                edge_hold_us: edge_hold.map(|d| d.as_micros().min(u128::from(u32::MAX)) as u32),
            }),
            A::CheckpointJob => Ok(StepOp::CheckpointJobs {
                jobs: self.job_marks(&host, inc.peer.as_deref()),
            }),
            A::RestartJob => Ok(StepOp::RestartJobs {
                jobs: self.job_marks(&host, inc.peer.as_deref()),
            }),
            A::Cordon => Ok(StepOp::Cordon),
            A::ReturnToService => Ok(StepOp::ReturnToService),
            A::Drain { deadline } => {
                let total = self.hosts.len();
                let already = self.hosts.get(&host).is_some_and(|h| {
                    matches!(h.status(), HostStatus::Draining | HostStatus::Drained)
                });
                let drained = self
                    .hosts
                    .values()
                    .filter(|h| matches!(h.status(), HostStatus::Draining | HostStatus::Drained))
                    .count();
                let after = drained + usize::from(!already);
                let allowed = limits.allowed_drained(total);
                if !self.hosts.contains_key(&host) {
                    Err(format!("host {host} is unknown"))
                } else if after as u64 > allowed {
                    Err(format!(
                        "drain refused by the playbook's limits: {after} of {total} hosts would be \
                         draining or drained; max_drained_hosts = {}, max_drained_percent = {} \
                         allow {allowed}",
                        limits.max_drained_hosts, limits.max_drained_percent
                    ))
                } else {
                    Ok(StepOp::Drain {
                        deadline_ms: at_ms.saturating_add(deadline.as_millis() as u64),
                    })
                }
            }
            A::WaitUntil { condition } => Ok(StepOp::WaitUntil {
                condition: condition.to_string(),
            }),
            A::ExcludeFromOwd => Ok(StepOp::ExcludeFromOwd),
            A::IncludeInOwd => Ok(StepOp::IncludeInOwd),
            A::Notify { message, webhook } => {
                let pb = &self.runs[&run].definition;
                Ok(StepOp::Notify {
                    message: clip(playbooks::render_message(message, pb, inc)),
                    webhook: webhook.clone(),
                })
            }
        };
        let op = match resolved {
            Ok(op) => op,
            Err(why) => {
                // Recorded as an intent all the same (what was attempted).
                let op = match &step.action {
                    A::Drain { deadline } => StepOp::Drain {
                        deadline_ms: at_ms.saturating_add(deadline.as_millis() as u64),
                    },
                    A::Failback => StepOp::Failback {
                        nic: inc.nic.clone().unwrap_or_default(),
                    },
                    _ => StepOp::Failover {
                        nic: inc.nic.clone().unwrap_or_default(),
                        to: String::new(),
                    },
                };
                if self.hosts.contains_key(&host) {
                    let id = self.open_intent(
                        at_ms,
                        &Action::PlaybookStep {
                            run,
                            step: step_no,
                            attempt,
                            host: host.clone(),
                            op,
                        },
                    );
                    self.close_intent_now(at_ms, id, Outcome::Failed { error: why.clone() });
                }
                return Begun::Ended(Err(why));
            }
        };
        let action = Action::PlaybookStep {
            run,
            step: step_no,
            attempt,
            host: host.clone(),
            op: op.clone(),
        };
        if !self.hosts.contains_key(&host) {
            return Begun::Ended(Err(format!("host {host} is unknown")));
        }
        let id = self.open_intent(at_ms, &action);
        self.run_log(
            at_ms,
            run,
            format!(
                "step {} ({}) attempt {} started (intent {id})",
                step.id,
                step.action.name(),
                attempt + 1
            ),
        );
        // Model effects, in the entry that commits the intent.
        let ended: Option<Result<String, String>> = match &op {
            StepOp::Failback { nic } => self
                .hosts
                .get(&host)
                .and_then(|h| h.nics.get(nic))
                .and_then(|n| n.held_out.as_ref())
                .map(|h| {
                    // Automatic failback never undoes an admin's failover.
                    Ok(format!(
                        "not failing back: {nic} is held out of service (failed over by {}) \
                         until `railguard nic failback`",
                        h.by
                    ))
                }),
            StepOp::Failover { .. } => None,
            StepOp::CheckpointJobs { jobs } => {
                let mut bad = None;
                let mut stand = Vec::new();
                for m in jobs {
                    let Some(j) = self.jobs.get(&m.job) else {
                        continue;
                    };
                    // Ranks that cannot talk write no new checkpoint: the
                    // latest complete one stands, at once.
                    if let Some(why) = crate::model::jobs::place::ring_cut(self, j) {
                        let latest = j
                            .latest_checkpoint
                            .map_or("none yet".to_owned(), |s| format!("step {s}"));
                        stand.push(format!(
                            "{} ({why}; latest complete checkpoint: {latest})",
                            m.job
                        ));
                        continue;
                    }
                    match j.state {
                        JobState::Running if j.ranks.iter().all(|r| r.started) => {
                            self.checkpoint_job(at_ms, &m.job, false);
                        }
                        // Already checkpointing: its checkpoint counts.
                        JobState::Checkpointing => {}
                        s => {
                            bad = Some(format!("job {} is {s:?}; it cannot checkpoint now", m.job))
                        }
                    }
                }
                if !stand.is_empty() {
                    self.run_log(
                        at_ms,
                        run,
                        clip(format!(
                            "no new checkpoint possible for {}",
                            stand.join(", ")
                        )),
                    );
                }
                match (bad, jobs.is_empty()) {
                    (Some(why), _) => Some(Err(why)),
                    (None, true) => Some(Ok(format!("no jobs on {host}"))),
                    (None, false) if stand.len() == jobs.len() => Some(Ok(clip(format!(
                        "no new checkpoint possible; the latest complete ones stand: {}",
                        stand.join(", ")
                    )))),
                    (None, false) => None,
                }
            }
            StepOp::RestartJobs { jobs } => {
                if jobs.is_empty() {
                    Some(Ok(format!("no jobs on {host}")))
                } else {
                    // A failure restart when the host is gone, or when only
                    // the ranks' evidence (a stalled connection) says the
                    // placement broke; a planned move otherwise.
                    let failure = self
                        .hosts
                        .get(&host)
                        .is_some_and(|h| h.liveness == Liveness::Down)
                        || self
                            .incidents
                            .get(&run_incident)
                            .is_some_and(|i| i.stalled_job.is_some());
                    let why = format!("playbook {pb_name} (run {run}): {} on {host}", inc.kind);
                    for m in jobs {
                        self.restart_job(at_ms, &m.job, m.incarnation, &why, !failure);
                    }
                    None
                }
            }
            StepOp::Cordon => {
                let h = self.hosts.get_mut(&host).expect("checked");
                h.cordoned = true;
                Some(Ok(format!("host {host} cordoned")))
            }
            StepOp::ReturnToService => {
                let h = self.hosts.get_mut(&host).expect("checked");
                let mine = format!("playbook:{pb_name}");
                Some(Ok(match &h.drain {
                    Some(d) if d.by == mine => {
                        let by = d.by.clone();
                        h.cordoned = d.cordoned_before;
                        h.drain = None;
                        let still = if h.cordoned {
                            " (still cordoned: it was before the drain)"
                        } else {
                            ""
                        };
                        format!("host {host} back in service (drained by {by}){still}")
                    }
                    Some(d) => format!("host {host} stays drained: {} drained it", d.by),
                    None => format!("host {host} is not drained"),
                }))
            }
            StepOp::Drain { deadline_ms } => {
                let h = self.hosts.get_mut(&host).expect("checked");
                let cordoned_before = h.cordoned;
                h.cordoned = true;
                if h.drain.is_none() {
                    h.drain = Some(Drain {
                        phase: DrainPhase::Draining,
                        reason: format!("playbook {pb_name} (run {run})"),
                        deadline_ms: Some(*deadline_ms),
                        by: format!("playbook:{pb_name}"),
                        since_ms: at_ms,
                        cordoned_before,
                    });
                }
                None
            }
            StepOp::WaitUntil { .. } => {
                let view = self.playbook_view_of(at_ms, inc);
                let cond = match &step.action {
                    A::WaitUntil { condition } => condition,
                    _ => unreachable!("a wait_until op comes from a wait_until step"),
                };
                let check = playbooks::evaluate(cond, inc, &view);
                check.holds.then_some(Ok(check.reason))
            }
            StepOp::ExcludeFromOwd | StepOp::IncludeInOwd => {
                let exclude = op == StepOp::ExcludeFromOwd;
                self.hosts.get_mut(&host).expect("checked").owd_excluded = exclude;
                Some(Ok(format!(
                    "host {host} {} OWD-based decisions",
                    if exclude {
                        "excluded from"
                    } else {
                        "used again in"
                    }
                )))
            }
            StepOp::Notify { message, webhook } => {
                self.log_event(
                    at_ms,
                    Some(&host),
                    Event::Notify {
                        message: message.clone(),
                    },
                );
                // With a webhook the leader delivers it and closes the
                // intent with the endpoint's answer.
                webhook.is_none().then(|| Ok("logged".to_string()))
            }
            StepOp::ReshapeRate {
                bits_per_sec,
                edge_hold_us,
            } => {
                let incident = self.runs[&run].incident;
                let planned = match self.incidents.get(&incident) {
                    None => Err(format!("incident {incident} is gone")),
                    Some(i) => crate::model::shaping::plan(self, i, *bits_per_sec, *edge_hold_us),
                };
                match planned {
                    Err(e) => Some(Err(e)),
                    Ok(plan) => {
                        let summary: Vec<String> = plan
                            .iter()
                            .map(|(h, (nic, s))| {
                                let classes: Vec<String> = s
                                    .classes
                                    .iter()
                                    .map(|c| {
                                        format!("{} {} Mbit/s", c.label, c.rate_bps / 1_000_000)
                                    })
                                    .collect();
                                format!("{h}/{nic}: {}", classes.join(", "))
                            })
                            .collect();
                        let (set, skipped) = self.set_desired_shapes(incident, plan);
                        if set == 0 {
                            Some(Err(format!(
                                "every sending NIC ({skipped}) is shaped for another incident"
                            )))
                        } else {
                            self.log_event(
                                at_ms,
                                Some(&host),
                                Event::Reshaping {
                                    incident,
                                    summary: summary.join("; "),
                                    kept: skipped as u64,
                                },
                            );
                            None
                        }
                    }
                }
            }
        };
        match ended {
            None => Begun::Waits(id),
            Some(result) => {
                let outcome = match &result {
                    Ok(_) => Outcome::Done,
                    Err(e) => Outcome::Failed { error: e.clone() },
                };
                let detail = match &result {
                    Ok(d) | Err(d) => d.clone(),
                };
                let _ = self.close_intent(at_ms, id, outcome, &detail, None);
                Begun::Ended(result)
            }
        }
    }

    pub(in crate::model) fn close_intent_now(&mut self, at_ms: u64, id: u64, outcome: Outcome) {
        let _ = self.close_intent(at_ms, id, outcome, "", None);
    }

    /// The jobs with ranks on `host` that a step acts on.
    pub(in crate::model) fn job_marks(&self, host: &str, peer: Option<&str>) -> Vec<JobMark> {
        self.jobs_on(host)
            .filter(|j| matches!(j.state, JobState::Running | JobState::Checkpointing))
            // A path incident's: the jobs on both of its hosts.
            .filter(|j| peer.is_none_or(|p| j.placement.iter().any(|h| h == p)))
            .map(|j| JobMark {
                job: j.name.clone(),
                incarnation: j.incarnation,
                checkpoint: j.latest_checkpoint,
            })
            .collect()
    }
}
