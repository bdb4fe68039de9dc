//! The playbook executor: runs of stored playbooks for open incidents, in
//! the replicated model.
//!
//! **Start.** The leader proposes [`RunCommand::Start`] for an open
//! incident that has never had a run and that a stored playbook matches
//! (`playbooks::matching` on the incident, its host's labels and its NIC's
//! rail). Apply checks the incident is still open and run-less and the
//! playbook still at the proposed version, copies the parsed playbook into
//! the run (a run executes the version it started with) and evaluates the
//! guards at the proposal's leader time. At most one run per incident is
//! active: escalation ends the old run before the new one starts.
//!
//! **Steps.** Every attempt of a step is an intent
//! (`Action::PlaybookStep{run, step, attempt, host, op}`) committed in the
//! same Raft entry that decides it, with its model effects (cordon, drain,
//! checkpoint and restart orders, OWD flag, notify line) applied right
//! there. Steps done by agents (`migrate_qps`, `failback`) are orders whose
//! id is the intent id: the leader's [`crate::orders::OrderHub`] sends
//! every open one, a new leader finds the open intent in the state and
//! sends the same id again, and the agent answers a repeated id from its
//! order log instead of executing it twice. Steps that wait (checkpoint,
//! restart, drain, `wait_until`) are closed by the reconciler's
//! [`evaluate_step`] once their condition holds or their timeout passed.
//! The intent's close drives the run in apply: success follows `next`,
//! failure retries (`retries`), then follows `on_failure` (a step, `end`,
//! or escalation: a new run of the playbook's `on_failure` for the same
//! incident; without one the run is Failed and the incident is left to an
//! operator).
//!
//! **Resolution.** A completed run closes its incident. An incident whose
//! condition clears (its NIC recovered, its host is back) cancels its run
//! and the run's open step — except a run that is waiting (`wait_until`),
//! which keeps going: playbooks like nic-flapping wait for the recovery and
//! then fail back.
//!
//! Everything here is pure or runs inside Raft apply, with the proposal's
//! leader time as "now": no clock, no randomness, no I/O (not even
//! `tracing`: every replica and every log replay applies it; transitions
//! go to the run's log and the cluster event log, and the leader's
//! reconciler traces what it proposes).
//!
//! **Incidents** come from the model: `nic_down`/`nic_flapping` from NIC
//! states, `host_down` from liveness, `clock_unsynced` from committed clock
//! states (Synced or Degraded → Unsynced; Synced again closes it).
//!
//! **Webhooks.** A `notify` step with a webhook logs its line and waits:
//! the leader's [`crate::webhooks`] sender POSTs it (idempotency key = the
//! intent id, so a new leader re-sending after a crash is recognisable)
//! and closes the intent with the answer; the step's timeout bounds it.
//!
//! **Reshaping.** A `reshape_rate` step on a `link_contention` incident
//! computes the plan ([`crate::shaping::plan`]) and installs it as the
//! incident's desired shaping when the attempt starts; the attempt is done
//! when every sending host's agent confirmed its shape, failed when an
//! agent refused one [`crate::shaping::MAX_SHAPE_FAILURES`] times or on
//! its timeout. The shapes stay until the incident closes.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::jobs::JobState;
use crate::model::{
    Action, ClusterState, CmdError, CmdOk, CmdResult, Drain, DrainPhase, HostStatus, Intent,
    Liveness, Outcome,
};

/// Ended runs kept (oldest forgotten first).
pub const MAX_CLOSED_RUNS: usize = 1_000;
/// Log lines kept per run (the newest).
pub const MAX_RUN_LOG: usize = 64;
/// Longest escalation chain followed (set validation already forbids
/// cycles; this bounds hand-made states too).
pub const MAX_ESCALATIONS: u32 = 8;
/// Longest log line or reason recorded by a run.
pub const MAX_RUN_TEXT: usize = 1_024;

/// Where a run is.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Executing its current step.
    Running,
    /// Its current step is a `wait_until` that times out at `until_ms`.
    Waiting { until_ms: u64 },
    /// Every step ran (or a jump ended it); the incident was closed.
    Completed,
    /// A guard or a step failed for good and there is no escalation.
    Failed { why: String },
    /// Failed for good and escalated to `playbook` (the run `run`).
    Escalated { playbook: String, run: u64 },
    /// The incident's condition cleared while the run was acting.
    Cancelled { why: String },
}

impl RunState {
    /// Running or waiting.
    pub fn is_active(&self) -> bool {
        matches!(self, RunState::Running | RunState::Waiting { .. })
    }
}

/// One line of a run's log.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RunLogLine {
    pub at_ms: u64,
    pub line: String,
}

/// One execution of a playbook for an incident.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PlaybookRun {
    pub id: u64,
    pub incident: u64,
    pub playbook: String,
    pub playbook_version: u64,
    /// The playbook as it was when the run started.
    pub definition: playbooks::Playbook,
    /// Index of the current step.
    pub step: usize,
    /// Attempt of the current step (0: the first).
    pub attempt: u32,
    pub state: RunState,
    pub started_ms: u64,
    pub step_started_ms: u64,
    pub ended_ms: Option<u64>,
    /// The open intent of the current attempt, if it waits for one.
    pub step_intent: Option<u64>,
    /// The run this one escalated from.
    pub escalated_from: Option<u64>,
    /// Escalations before this run.
    pub depth: u32,
    /// What happened, newest last (bounded by [`MAX_RUN_LOG`]).
    pub log: VecDeque<RunLogLine>,
}

impl PlaybookRun {
    /// Id of the current step (empty once past the last one).
    pub fn step_id(&self) -> &str {
        self.definition
            .steps
            .get(self.step)
            .map_or("", |s| s.id.as_str())
    }
}

/// A job as a step found it: the incarnation it acted on and its latest
/// complete checkpoint then.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct JobMark {
    pub job: String,
    pub incarnation: u64,
    pub checkpoint: Option<u64>,
}

/// What one attempt of a step does, resolved when it starts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub enum StepOp {
    /// An order to the host's agent: move `nic`'s connections to `to`.
    Failover {
        nic: String,
        to: String,
    },
    /// An order to the host's agent: move connections back home to `nic`.
    Failback {
        nic: String,
    },
    /// Checkpoint orders went out; done when every job has a newer complete
    /// checkpoint than it had.
    CheckpointJobs {
        jobs: Vec<JobMark>,
    },
    /// The jobs were stopped for a restart; done when each runs again (a
    /// newer incarnation with every rank started).
    RestartJobs {
        jobs: Vec<JobMark>,
    },
    Cordon,
    /// The host was set draining with this deadline; done when Drained.
    Drain {
        deadline_ms: u64,
    },
    /// Done when the condition holds.
    WaitUntil {
        condition: String,
    },
    ExcludeFromOwd,
    IncludeInOwd,
    /// The rendered message; with a webhook the leader POSTs it there
    /// (see [`crate::webhooks`]) and the attempt waits for the answer.
    Notify {
        message: String,
        #[serde(default)]
        webhook: Option<String>,
    },
    /// The incident's desired shaping was set; done when applied.
    ReshapeRate {
        bits_per_sec: Option<u64>,
        /// On-Ramp-style edge holding threshold (µs of queueing).
        #[serde(default)]
        edge_hold_us: Option<u32>,
    },
}

impl StepOp {
    /// Whether the host's agent carries it out (an order).
    pub fn is_order(&self) -> bool {
        matches!(self, StepOp::Failover { .. } | StepOp::Failback { .. })
    }
}

/// Leader decisions about runs (checked again at apply).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum RunCommand {
    /// Start `playbook` (stored at `version`) for the open incident.
    Start {
        incident: u64,
        playbook: String,
        version: u64,
    },
}

/// How a step attempt that started ended at once (or that it waits).
enum Begun {
    Waits(u64),
    Ended(Result<String, String>),
}

fn clip(mut s: String) -> String {
    if s.len() > MAX_RUN_TEXT {
        let mut cut = MAX_RUN_TEXT;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

impl ClusterState {
    /// The incident as playbooks see it (host labels, NIC rail).
    pub fn incident_view(&self, id: u64) -> Option<playbooks::IncidentView> {
        let i = self.incidents.get(&id)?;
        let h = self.hosts.get(&i.host);
        Some(playbooks::IncidentView {
            kind: i.kind.clone(),
            host: i.host.clone(),
            nic: i.nic.clone(),
            rail: i
                .nic
                .as_ref()
                .and_then(|n| h.and_then(|h| h.nics.get(n)))
                .and_then(|n| n.rail),
            job: None,
            labels: h.map(|h| h.labels.clone()).unwrap_or_default(),
            closed: i.closed_ms.is_some(),
        })
    }

    /// The stored playbook that handles the incident now, with its version.
    pub fn playbook_for(&self, incident: u64) -> Option<(playbooks::Playbook, u64)> {
        let view = self.incident_view(incident)?;
        let set = self.playbook_set();
        let pb = playbooks::matching(&set, &view)?.clone();
        let version = self.playbooks.get(&pb.name)?.version;
        Some((pb, version))
    }

    /// The active run of an incident, if any.
    pub fn active_run_of(&self, incident: u64) -> Option<&PlaybookRun> {
        let id = self.incidents.get(&incident)?.run?;
        self.runs.get(&id).filter(|r| r.state.is_active())
    }

    pub(crate) fn validate_run_command(&self, c: &RunCommand) -> Result<(), CmdError> {
        match c {
            RunCommand::Start {
                incident,
                playbook,
                version,
            } => {
                let i = self
                    .incidents
                    .get(incident)
                    .ok_or_else(|| CmdError::NotFound {
                        kind: "incident".into(),
                        name: incident.to_string(),
                    })?;
                if i.closed_ms.is_some() {
                    return Err(CmdError::FailedPrecondition(format!(
                        "incident {incident} is closed"
                    )));
                }
                if let Some(r) = i.run {
                    return Err(CmdError::FailedPrecondition(format!(
                        "incident {incident} already has run {r}"
                    )));
                }
                let stored = self
                    .playbooks
                    .get(playbook)
                    .ok_or_else(|| CmdError::NotFound {
                        kind: "playbook".into(),
                        name: playbook.clone(),
                    })?;
                if stored.version != *version {
                    return Err(CmdError::FailedPrecondition(format!(
                        "playbook {playbook} is at version {}, not {version}",
                        stored.version
                    )));
                }
                if stored.parsed().is_none() {
                    return Err(CmdError::FailedPrecondition(format!(
                        "stored playbook {playbook} does not parse"
                    )));
                }
                Ok(())
            }
        }
    }

    pub(crate) fn apply_run_command(&mut self, at_ms: u64, c: &RunCommand) -> CmdResult {
        match c {
            RunCommand::Start {
                incident, playbook, ..
            } => {
                let id = self.start_run(at_ms, *incident, playbook, None, 0);
                Ok(CmdOk::RunStarted { id })
            }
        }
    }

    /// Creates a run of the stored `playbook` for the incident, checks its
    /// guards and drives it. The caller checked the playbook exists.
    fn start_run(
        &mut self,
        at_ms: u64,
        incident: u64,
        playbook: &str,
        escalated_from: Option<u64>,
        depth: u32,
    ) -> u64 {
        let stored = &self.playbooks[playbook];
        let version = stored.version;
        let definition = stored.parsed().expect("validated: stored playbooks parse");
        self.next_run_id += 1;
        let id = self.next_run_id;
        self.runs.insert(
            id,
            PlaybookRun {
                id,
                incident,
                playbook: playbook.to_owned(),
                playbook_version: version,
                definition: definition.clone(),
                step: 0,
                attempt: 0,
                state: RunState::Running,
                started_ms: at_ms,
                step_started_ms: at_ms,
                ended_ms: None,
                step_intent: None,
                escalated_from,
                depth,
                log: VecDeque::new(),
            },
        );
        if let Some(i) = self.incidents.get_mut(&incident) {
            i.run = Some(id);
        }
        let how = match escalated_from {
            Some(from) => format!(" (escalated from run {from})"),
            None => String::new(),
        };
        self.run_log(
            at_ms,
            id,
            format!("playbook {playbook} v{version} started for incident {incident}{how}"),
        );
        let view = self.playbook_view(at_ms);
        let inc = self.incident_view(incident).expect("exists");
        for g in &definition.guards {
            let check = playbooks::evaluate(g, &inc, &view);
            if !check.holds {
                self.run_failed(
                    at_ms,
                    id,
                    format!("guard {g} does not hold: {}", check.reason),
                );
                return id;
            }
        }
        self.drive_run(at_ms, id);
        id
    }

    /// Appends to the run's log and to the cluster's event log.
    fn run_log(&mut self, at_ms: u64, run: u64, line: String) {
        let line = clip(line);
        let Some(r) = self.runs.get_mut(&run) else {
            return;
        };
        r.log.push_back(RunLogLine {
            at_ms,
            line: line.clone(),
        });
        while r.log.len() > MAX_RUN_LOG {
            r.log.pop_front();
        }
        let host = self.incidents.get(&r.incident).map(|i| i.host.clone());
        self.log_event(at_ms, host.as_deref(), format!("run {run}: {line}"));
    }

    /// Runs steps until one waits or the run ends (bounded: jumps go
    /// forward and every step has at most 11 attempts).
    fn drive_run(&mut self, at_ms: u64, run: u64) {
        let bound = playbooks::types::bounds::MAX_STEPS
            * (playbooks::types::bounds::MAX_RETRIES as usize + 2);
        for _ in 0..bound {
            let Some(r) = self.runs.get(&run) else { return };
            if !r.state.is_active() || r.step_intent.is_some() {
                return;
            }
            let Some(step) = r.definition.steps.get(r.step).cloned() else {
                self.run_completed(at_ms, run, "every step ran".into());
                return;
            };
            let attempt = r.attempt;
            let incident = r.incident;
            let Some(inc) = self.incident_view(incident) else {
                self.run_failed(at_ms, run, format!("incident {incident} was forgotten"));
                return;
            };
            if attempt == 0 {
                if let Some(when) = &step.when {
                    let view = self.playbook_view(at_ms);
                    let check = playbooks::evaluate(when, &inc, &view);
                    if !check.holds {
                        self.run_log(
                            at_ms,
                            run,
                            format!(
                                "step {} skipped: {when} is false ({})",
                                step.id, check.reason
                            ),
                        );
                        let r = self.runs.get_mut(&run).expect("exists");
                        r.step += 1;
                        r.step_started_ms = at_ms;
                        continue;
                    }
                }
            }
            let r = self.runs.get_mut(&run).expect("exists");
            r.step_started_ms = at_ms;
            r.state = RunState::Running;
            match self.begin_step(at_ms, run, &step, &inc) {
                Begun::Waits(intent) => {
                    let r = self.runs.get_mut(&run).expect("exists");
                    r.step_intent = Some(intent);
                    if matches!(step.action, playbooks::Action::WaitUntil { .. }) {
                        r.state = RunState::Waiting {
                            until_ms: at_ms.saturating_add(step.timeout.as_millis() as u64),
                        };
                    }
                    return;
                }
                Begun::Ended(result) => self.attempt_ended(at_ms, run, None, result),
            }
        }
        self.run_failed(at_ms, run, "the run did not settle (bound reached)".into());
    }

    /// Starts one attempt of `step`: opens its intent and applies its
    /// model effects. Steps that finish at once close their intent here.
    fn begin_step(
        &mut self,
        at_ms: u64,
        run: u64,
        step: &playbooks::Step,
        inc: &playbooks::IncidentView,
    ) -> Begun {
        use playbooks::{Action as A, MigrateTarget};
        let r = &self.runs[&run];
        let (step_no, attempt) = (r.step as u32, r.attempt);
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
                jobs: self.job_marks(&host),
            }),
            A::RestartJob => Ok(StepOp::RestartJobs {
                jobs: self.job_marks(&host),
            }),
            A::Cordon => Ok(StepOp::Cordon),
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
            StepOp::Failover { .. } | StepOp::Failback { .. } => None,
            StepOp::CheckpointJobs { jobs } => {
                let mut bad = None;
                for m in jobs {
                    let Some(j) = self.jobs.get(&m.job) else {
                        continue;
                    };
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
                match (bad, jobs.is_empty()) {
                    (Some(why), _) => Some(Err(why)),
                    (None, true) => Some(Ok(format!("no jobs on {host}"))),
                    (None, false) => None,
                }
            }
            StepOp::RestartJobs { jobs } => {
                if jobs.is_empty() {
                    Some(Ok(format!("no jobs on {host}")))
                } else {
                    let down = self
                        .hosts
                        .get(&host)
                        .is_some_and(|h| h.liveness == Liveness::Down);
                    let why = format!("playbook {pb_name} (run {run}): {} on {host}", inc.kind);
                    for m in jobs {
                        // A failure restart when the host is gone, a planned
                        // move otherwise.
                        self.restart_job(at_ms, &m.job, m.incarnation, &why, !down);
                    }
                    None
                }
            }
            StepOp::Cordon => {
                let h = self.hosts.get_mut(&host).expect("checked");
                h.cordoned = true;
                Some(Ok(format!("host {host} cordoned")))
            }
            StepOp::Drain { deadline_ms } => {
                let h = self.hosts.get_mut(&host).expect("checked");
                h.cordoned = true;
                if h.drain.is_none() {
                    h.drain = Some(Drain {
                        phase: DrainPhase::Draining,
                        reason: format!("playbook {pb_name} (run {run})"),
                        deadline_ms: Some(*deadline_ms),
                        by: format!("playbook:{pb_name}"),
                        since_ms: at_ms,
                    });
                }
                None
            }
            StepOp::WaitUntil { .. } => {
                let view = self.playbook_view(at_ms);
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
                self.log_event(at_ms, Some(&host), format!("notify: {message}"));
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
                    Some(i) => crate::shaping::plan(self, i, *bits_per_sec, *edge_hold_us),
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
                                format!(
                                    "reshaping for incident {incident}: {} ({skipped} NICs kept for other incidents)",
                                    summary.join("; ")
                                ),
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
                let _ = self.close_intent(at_ms, id, outcome, &detail);
                Begun::Ended(result)
            }
        }
    }

    fn close_intent_now(&mut self, at_ms: u64, id: u64, outcome: Outcome) {
        let _ = self.close_intent(at_ms, id, outcome, "");
    }

    /// The jobs with ranks on `host` that a step acts on.
    fn job_marks(&self, host: &str) -> Vec<JobMark> {
        self.jobs_on(host)
            .filter(|j| matches!(j.state, JobState::Running | JobState::Checkpointing))
            .map(|j| JobMark {
                job: j.name.clone(),
                incarnation: j.incarnation,
                checkpoint: j.latest_checkpoint,
            })
            .collect()
    }

    /// An attempt ended: follow `next`, retry, or follow `on_failure`.
    /// The caller drives the run on.
    /// `intent`: the attempt's step intent, if it had one (named in the
    /// log, so an action can be traced to the order id the agent saw).
    fn attempt_ended(
        &mut self,
        at_ms: u64,
        run: u64,
        intent: Option<u64>,
        result: Result<String, String>,
    ) {
        use playbooks::Jump;
        let r = self.runs.get_mut(&run).expect("exists");
        r.step_intent = None;
        if r.state != RunState::Running {
            r.state = RunState::Running;
        }
        let step = r.definition.steps[r.step].clone();
        let attempt = r.attempt;
        let goto = |pb: &playbooks::Playbook, id: &str| pb.step_index(id);
        match result {
            Ok(detail) => {
                let line = match intent {
                    Some(i) => format!("step {} done (intent {i}): {detail}", step.id),
                    None => format!("step {} done: {detail}", step.id),
                };
                self.run_log(at_ms, run, line);
                let r = self.runs.get_mut(&run).expect("exists");
                match &step.next {
                    None => {
                        r.step += 1;
                        r.attempt = 0;
                    }
                    Some(Jump::Step(id)) => match goto(&r.definition, id) {
                        Some(i) if i > r.step => {
                            r.step = i;
                            r.attempt = 0;
                        }
                        _ => {
                            self.run_failed(at_ms, run, format!("bad jump to {id:?}"));
                        }
                    },
                    Some(Jump::End) => {
                        self.run_completed(at_ms, run, format!("step {} ended it", step.id))
                    }
                    Some(Jump::Escalate) => self.run_failed(
                        at_ms,
                        run,
                        format!("step {} escalates on success", step.id),
                    ),
                }
            }
            Err(why) => {
                if attempt < step.retries {
                    self.run_log(
                        at_ms,
                        run,
                        format!(
                            "step {} attempt {} failed: {why}; retrying ({} left)",
                            step.id,
                            attempt + 1,
                            step.retries - attempt
                        ),
                    );
                    self.runs.get_mut(&run).expect("exists").attempt += 1;
                    return;
                }
                self.run_log(
                    at_ms,
                    run,
                    format!("step {} failed for good: {why}", step.id),
                );
                let r = self.runs.get_mut(&run).expect("exists");
                match step.on_failure.clone().unwrap_or(Jump::Escalate) {
                    Jump::Step(id) => match goto(&r.definition, &id) {
                        Some(i) if i > r.step => {
                            r.step = i;
                            r.attempt = 0;
                        }
                        _ => self.run_failed(at_ms, run, format!("bad jump to {id:?}")),
                    },
                    Jump::End => self.run_completed(
                        at_ms,
                        run,
                        format!("step {} failed; on_failure = end", step.id),
                    ),
                    Jump::Escalate => {
                        self.run_failed(at_ms, run, format!("step {} failed: {why}", step.id))
                    }
                }
            }
        }
    }

    fn end_run(&mut self, at_ms: u64, run: u64, state: RunState) {
        let r = self.runs.get_mut(&run).expect("exists");
        r.state = state;
        r.ended_ms = Some(at_ms);
        r.step_intent = None;
        self.closed_runs.push_back(run);
        while self.closed_runs.len() > MAX_CLOSED_RUNS {
            if let Some(old) = self.closed_runs.pop_front() {
                self.runs.remove(&old);
            }
        }
    }

    /// Every step ran: the run is complete and its incident resolved.
    fn run_completed(&mut self, at_ms: u64, run: u64, why: String) {
        let Some(r) = self.runs.get(&run) else { return };
        if !r.state.is_active() {
            return;
        }
        let (incident, playbook) = (r.incident, r.playbook.clone());
        self.run_log(at_ms, run, format!("completed: {why}"));
        self.end_run(at_ms, run, RunState::Completed);
        // A link's contention is over when the detector sees it quiet, not
        // when the reshaping is in place: the incident (and its shapes)
        // stay until then.
        if self
            .incidents
            .get(&incident)
            .is_some_and(|i| i.link.is_some())
        {
            self.log_event(
                at_ms,
                None,
                format!(
                    "incident {incident} stays open until its link is quiet (the contention detector closes it)"
                ),
            );
            return;
        }
        self.resolve_incident(
            at_ms,
            incident,
            &format!("resolved by playbook {playbook} (run {run})"),
        );
    }

    /// Failed for good: escalate to the playbook's `on_failure`, or fail.
    fn run_failed(&mut self, at_ms: u64, run: u64, why: String) {
        let Some(r) = self.runs.get(&run) else { return };
        if !r.state.is_active() {
            return;
        }
        let (incident, depth) = (r.incident, r.depth);
        let target = r.definition.on_failure.clone();
        let why = clip(why);
        let escalate = target.filter(|t| {
            depth < MAX_ESCALATIONS && self.playbooks.get(t).is_some_and(|s| s.parsed().is_some())
        });
        match escalate {
            Some(t) => {
                self.run_log(at_ms, run, format!("failed: {why}; escalating to {t}"));
                let next = self.next_run_id + 1;
                self.end_run(
                    at_ms,
                    run,
                    RunState::Escalated {
                        playbook: t.clone(),
                        run: next,
                    },
                );
                let started = self.start_run(at_ms, incident, &t, Some(run), depth + 1);
                debug_assert_eq!(started, next);
            }
            None => {
                self.run_log(
                    at_ms,
                    run,
                    format!("failed: {why}; no escalation, left to an operator"),
                );
                self.end_run(at_ms, run, RunState::Failed { why });
            }
        }
    }

    /// Closes an incident its playbook resolved (the NIC's or host's open
    /// incident slot is freed: a new failure opens a new incident).
    fn resolve_incident(&mut self, at_ms: u64, id: u64, why: &str) {
        let Some(i) = self.incidents.get(&id) else {
            return;
        };
        if i.closed_ms.is_some() {
            return;
        }
        let (host, nic, kind) = (i.host.clone(), i.nic.clone(), i.kind.clone());
        if let Some(h) = self.hosts.get_mut(&host) {
            if h.open_incident == Some(id) {
                h.open_incident = None;
            }
            if h.clock_incident == Some(id) {
                h.clock_incident = None;
            }
            if let Some(n) = nic.and_then(|n| h.nics.get_mut(&n)) {
                if n.open_incidents.get(&kind) == Some(&id) {
                    n.open_incidents.remove(&kind);
                }
            }
        }
        self.close_incident(at_ms, id, why);
    }

    /// The incident's condition cleared: cancel its run unless it waits.
    pub(crate) fn incident_cleared(&mut self, at_ms: u64, incident: u64) {
        let Some(run) = self.active_run_of(incident).map(|r| r.id) else {
            return;
        };
        let r = &self.runs[&run];
        if matches!(r.state, RunState::Waiting { .. }) {
            self.run_log(
                at_ms,
                run,
                "incident cleared; the run keeps waiting on its condition".into(),
            );
            return;
        }
        let open = r.step_intent;
        self.run_log(at_ms, run, "incident cleared: run cancelled".into());
        self.end_run(
            at_ms,
            run,
            RunState::Cancelled {
                why: "the incident's condition cleared".into(),
            },
        );
        if let Some(id) = open {
            self.close_intent_now(
                at_ms,
                id,
                Outcome::Cancelled {
                    why: "the incident's condition cleared".into(),
                },
            );
        }
    }

    /// A playbook step's intent closed (called from `close_intent`).
    pub(crate) fn run_step_closed(&mut self, at_ms: u64, run: u64, intent: u64, outcome: &Outcome) {
        let Some(r) = self.runs.get(&run) else { return };
        if !r.state.is_active() || r.step_intent != Some(intent) {
            return; // an attempt the run already left
        }
        let result = match outcome {
            Outcome::Done => Ok(self.intents[&intent].detail.clone()),
            Outcome::Failed { error } => Err(error.clone()),
            Outcome::Cancelled { why } => Err(why.clone()),
        };
        self.attempt_ended(at_ms, run, Some(intent), result);
        self.drive_run(at_ms, run);
    }

    /// Runs, optionally only active ones, oldest first.
    pub fn runs_list(&self, open_only: bool) -> impl Iterator<Item = &PlaybookRun> {
        self.runs
            .values()
            .filter(move |r| !open_only || r.state.is_active())
    }
}

/// Runs the state calls for (pure): open incidents that never had a run
/// and that a stored playbook matches.
pub fn wanted_run_commands(st: &ClusterState) -> Vec<RunCommand> {
    let candidates: Vec<u64> = st
        .incidents
        .values()
        .filter(|i| i.closed_ms.is_none() && i.run.is_none())
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
            let pb = playbooks::matching(&set, &view)?;
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
            let check = playbooks::evaluate(condition, &inc, &st.playbook_view(now_ms));
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
                s.incident == r.incident && s.failures >= crate::shaping::MAX_SHAPE_FAILURES
            });
            if let Some((nic, _)) = refused {
                return Some(Outcome::Failed {
                    error: format!(
                        "an agent refused the shape of {nic} {} times",
                        crate::shaping::MAX_SHAPE_FAILURES
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
        | StepOp::ExcludeFromOwd
        | StepOp::IncludeInOwd
        | StepOp::Notify { webhook: None, .. } => Some(Outcome::Done),
    }
}

/// A run in `railguard playbook runs`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RunView {
    pub id: u64,
    pub incident: u64,
    pub incident_kind: String,
    pub host: String,
    pub nic: Option<String>,
    pub playbook: String,
    pub playbook_version: u64,
    /// 0-based index and id of the current step.
    pub step: usize,
    pub step_id: String,
    pub attempt: u32,
    pub state: RunState,
    pub started_ms: u64,
    pub step_started_ms: u64,
    pub ended_ms: Option<u64>,
    pub step_intent: Option<u64>,
    pub escalated_from: Option<u64>,
    pub log: Vec<RunLogLine>,
}

impl RunView {
    pub fn of(st: &ClusterState, r: &PlaybookRun) -> RunView {
        let inc = st.incidents.get(&r.incident);
        RunView {
            id: r.id,
            incident: r.incident,
            incident_kind: inc.map(|i| i.kind.clone()).unwrap_or_default(),
            host: inc.map(|i| i.host.clone()).unwrap_or_default(),
            nic: inc.and_then(|i| i.nic.clone()),
            playbook: r.playbook.clone(),
            playbook_version: r.playbook_version,
            step: r.step,
            step_id: r.step_id().to_owned(),
            attempt: r.attempt,
            state: r.state.clone(),
            started_ms: r.started_ms,
            step_started_ms: r.step_started_ms,
            ended_ms: r.ended_ms,
            step_intent: r.step_intent,
            escalated_from: r.escalated_from,
            log: r.log.iter().cloned().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::jobs::{JobOp, JobSpec};
    use crate::model::{
        AdminOp, AgentEvent, AgentEventKind, Command, IntentStatus, NicState, Proposal,
    };
    use openraft::{CommittedLeaderId, LogId};
    use proto::v1::agent_order;

    /// The replicated state plus a simulated leader loop and agents that
    /// execute each order id at most once (answering repeats from their
    /// order log, as `nodeagent`'s `OrderLog` does).
    struct World {
        st: ClusterState,
        now: u64,
        index: u64,
        seq: BTreeMap<String, u64>,
        /// Outcomes of executed orders by id (the agents' order logs).
        executed: BTreeMap<u64, (bool, String)>,
        /// Orders delivered to agents (ids; repeats included).
        delivered: Vec<u64>,
    }

    impl World {
        fn new(hosts: &[&str], with_playbooks: bool) -> Self {
            let mut w = World {
                st: ClusterState::default(),
                now: 1_000,
                index: 0,
                seq: BTreeMap::new(),
                executed: BTreeMap::new(),
                delivered: Vec::new(),
            };
            for (i, h) in hosts.iter().enumerate() {
                w.ok(crate::jobs::register_two_rails_for_test(i, h));
            }
            if with_playbooks {
                // What a new cluster's first leader does.
                w.ok(Command::InstallShippedPlaybooks {
                    files: crate::playbook_store::shipped_files(),
                });
                assert_eq!(w.st.playbooks.len(), playbooks::SHIPPED.len());
            }
            w
        }

        fn apply(&mut self, cmd: Command) -> CmdResult {
            self.index += 1;
            self.now += 1;
            let lid = LogId::new(CommittedLeaderId::new(1, 1), self.index);
            self.st
                .apply_proposal(
                    &lid,
                    &Proposal {
                        at_ms: self.now,
                        cmds: vec![cmd],
                    },
                )
                .remove(0)
        }

        fn ok(&mut self, cmd: Command) -> CmdOk {
            let r = self.apply(cmd.clone());
            r.unwrap_or_else(|e| panic!("{cmd:?} refused: {e}"))
        }

        fn admin(&mut self, op: AdminOp) -> CmdOk {
            self.ok(Command::Admin {
                actor: "t".into(),
                op,
                request: None,
            })
        }

        fn nic(&mut self, host: &str, nic: &str, state: NicState) {
            let seq = self.seq.entry(host.into()).or_default();
            *seq += 1;
            let e = AgentEvent {
                seq: *seq,
                at_unix_ns: 0,
                kind: AgentEventKind::NicState {
                    nic: nic.into(),
                    state,
                    carrier_changes: 0,
                    flaps: 0,
                    damping_penalty: 0.0,
                    coalesced: 0,
                    link_up: state == NicState::Up,
                    probes_lost: false,
                },
            };
            self.ok(Command::AgentEvents {
                host: host.into(),
                events: vec![e],
            });
        }

        /// One pass of the leader's reconciler (as `reconciler::step`
        /// does it), then the agents get the open orders; `agent` decides
        /// the outcome of an order the first time its id arrives (`None`:
        /// no answer yet). Returns whether anything was committed.
        fn tick(&mut self, agent: &mut impl FnMut(&Action) -> Option<(bool, String)>) -> bool {
            let now = self.now;
            let mut progressed = false;
            for c in crate::jobs::wanted_job_commands(&self.st, now) {
                progressed |= self.apply(Command::Job(c)).is_ok();
            }
            for c in wanted_run_commands(&self.st) {
                progressed |= self.apply(Command::Playbook(c)).is_ok();
            }
            for a in crate::reconciler::wanted_actions(&self.st) {
                self.ok(Command::OpenIntent { action: a });
                progressed = true;
            }
            let open: Vec<Intent> = self.st.open_intents().cloned().collect();
            for i in open {
                if let Some(o) = crate::reconciler::evaluate(&self.st, &i, now) {
                    self.ok(Command::CloseIntent {
                        id: i.id,
                        outcome: o,
                    });
                    progressed = true;
                }
            }
            progressed |= self.deliver(agent);
            progressed
        }

        /// Sends every open order (what the `OrderHub` would send).
        fn deliver(&mut self, agent: &mut impl FnMut(&Action) -> Option<(bool, String)>) -> bool {
            let mut progressed = false;
            for (host, order) in crate::orders::open_orders(&self.st) {
                let id = order.order_id;
                self.delivered.push(id);
                let action = self.st.intents[&id].action.clone();
                let answer = match self.executed.get(&id) {
                    Some(done) => Some(done.clone()),
                    None => agent(&action).inspect(|a| {
                        self.executed.insert(id, a.clone());
                    }),
                };
                if let Some((ok, detail)) = answer {
                    self.ok(Command::OrderDone {
                        host,
                        id,
                        ok,
                        detail,
                    });
                    progressed = true;
                }
            }
            progressed
        }

        fn settle(&mut self, mut agent: impl FnMut(&Action) -> Option<(bool, String)>) {
            for _ in 0..100 {
                if !self.tick(&mut agent) {
                    return;
                }
            }
            panic!("the world did not settle");
        }

        fn advance(&mut self, ms: u64) {
            self.now += ms;
        }

        fn run(&self, id: u64) -> &PlaybookRun {
            &self.st.runs[&id]
        }

        fn step_intents(&self, run: u64) -> Vec<&Intent> {
            self.st
                .intents
                .values()
                .filter(|i| matches!(&i.action, Action::PlaybookStep { run: r, .. } if *r == run))
                .collect()
        }

        fn events_with(&self, text: &str) -> usize {
            self.st
                .events
                .iter()
                .filter(|e| e.what.contains(text))
                .count()
        }
    }

    fn obey(a: &Action) -> Option<(bool, String)> {
        Some((
            true,
            match a {
                Action::CheckpointJob { .. } => "step=40".into(),
                Action::PlaybookStep { .. } => "moved 2 connections".into(),
                _ => "pid=1".into(),
            },
        ))
    }

    /// h0's rail0 goes down while its backup rail1 is up.
    fn nic_down_world() -> World {
        let mut w = World::new(&["h0", "h1"], true);
        w.nic("h0", "rail1", NicState::Up);
        w.nic("h0", "rail0", NicState::Down);
        assert_eq!(w.st.incidents.len(), 1);
        w
    }

    #[test]
    fn a_nic_down_incident_runs_the_migrate_step_as_a_failover_order() {
        let mut w = nic_down_world();
        assert_eq!(
            wanted_run_commands(&w.st),
            vec![RunCommand::Start {
                incident: 1,
                playbook: "nic-down".into(),
                version: w.st.playbooks["nic-down"].version,
            }]
        );
        w.tick(&mut |_| None);
        let run = w.run(1);
        assert_eq!(
            (run.playbook.as_str(), run.step, run.attempt),
            ("nic-down", 0, 0)
        );
        assert_eq!(run.state, RunState::Running);
        let intent = run
            .step_intent
            .expect("the migrate step waits for its order");
        let orders = crate::orders::open_orders(&w.st);
        assert_eq!(orders.len(), 1);
        assert_eq!(orders[0].0, "h0");
        assert_eq!(
            orders[0].1.order_id, intent,
            "the order id is the intent id"
        );
        let Some(agent_order::Kind::Failover(f)) = &orders[0].1.kind else {
            panic!("{orders:?}");
        };
        assert_eq!((f.nic.as_str(), f.to.as_str()), ("rail0", "rail1"));
        w.settle(obey);
        let run = w.run(1);
        assert_eq!(run.state, RunState::Completed);
        assert!(
            w.st.incidents[&1].closed_ms.is_some(),
            "a completed playbook resolves its incident"
        );
        assert!(w.st.hosts["h0"].nics["rail0"].open_incidents.is_empty());
        assert_eq!(
            w.events_with("notify: nic_down on h0: nic-down finished for h0 rail0"),
            1
        );
        // Skipped steps: checkpoint and drain were jumped over by `next`.
        let steps: Vec<u32> = w
            .step_intents(1)
            .iter()
            .map(|i| match &i.action {
                Action::PlaybookStep { step, .. } => *step,
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(steps, vec![0, 3], "migrate, then announce");
        assert!(w
            .step_intents(1)
            .iter()
            .all(|i| i.status == IntentStatus::Closed(Outcome::Done)));
        // Runs and their step intents are part of snapshots.
        let back: ClusterState = bincode::deserialize(&bincode::serialize(&w.st).unwrap()).unwrap();
        assert_eq!(back, w.st);
        // And of the admin JSON.
        let reply = crate::api::AdminReply::PlaybookRuns {
            runs: vec![RunView::of(&w.st, w.run(1))],
            truncated: false,
        };
        let text = serde_json::to_string(&reply).unwrap();
        let back: crate::api::AdminReply = serde_json::from_str(&text).unwrap();
        let crate::api::AdminReply::PlaybookRuns { runs, .. } = back else {
            panic!("{text}");
        };
        assert_eq!(runs[0].state, RunState::Completed);
        assert_eq!(runs[0].playbook, "nic-down");
    }

    /// The leader dies after committing the step's intent, before sending
    /// the order (or after sending it, the agent's answer lost): the state
    /// is all the next leader has. It starts nothing again and sends the
    /// same order id; the agent executes it once.
    #[test]
    fn a_new_leader_resumes_the_open_step_with_the_same_order_id() {
        let mut w = nic_down_world();
        for c in wanted_run_commands(&w.st) {
            w.ok(Command::Playbook(c));
        }
        let intent = w.run(1).step_intent.unwrap();
        // --- the old leader dies here (maybe it proposed the start twice) ---
        let again = RunCommand::Start {
            incident: 1,
            playbook: "nic-down".into(),
            version: w.st.playbooks["nic-down"].version,
        };
        assert!(matches!(
            w.apply(Command::Playbook(again)),
            Err(CmdError::FailedPrecondition(_))
        ));
        assert!(
            wanted_run_commands(&w.st).is_empty(),
            "one run per incident"
        );
        assert!(crate::reconciler::wanted_actions(&w.st).is_empty());
        assert_eq!(w.st.runs.len(), 1);
        // The new leader sends the open order; the answer is lost, so it is
        // sent again after the resend period; the agent executes it once.
        let mut executions = 0;
        let mut lose_first_answer = true;
        for _ in 0..3 {
            let orders = crate::orders::open_orders(&w.st);
            assert!(orders.len() <= 1);
            for (_, o) in &orders {
                assert_eq!(o.order_id, intent);
                w.delivered.push(o.order_id);
                if w.executed
                    .insert(o.order_id, (true, "moved".into()))
                    .is_none()
                {
                    executions += 1;
                }
                if lose_first_answer {
                    lose_first_answer = false;
                    continue;
                }
                let (ok, detail) = w.executed[&o.order_id].clone();
                w.ok(Command::OrderDone {
                    host: "h0".into(),
                    id: o.order_id,
                    ok,
                    detail: detail.clone(),
                });
                // A late duplicate answer changes nothing.
                let before = w.st.runs.clone();
                w.ok(Command::OrderDone {
                    host: "h0".into(),
                    id: o.order_id,
                    ok,
                    detail,
                });
                assert_eq!(w.st.runs, before);
            }
        }
        assert_eq!(executions, 1);
        assert_eq!(w.delivered, vec![intent, intent], "one id, sent twice");
        w.settle(obey);
        assert_eq!(w.run(1).state, RunState::Completed);
        let migrate_intents = w
            .step_intents(1)
            .iter()
            .filter(|i| matches!(i.action, Action::PlaybookStep { step: 0, .. }))
            .count();
        assert_eq!(migrate_intents, 1);
    }

    #[test]
    fn a_failing_step_is_retried_then_escalated() {
        let mut w = World::new(&["h0", "h1"], true);
        w.nic("h0", "rail1", NicState::Up);
        w.nic("h0", "rail0", NicState::Flapping);
        w.settle(|a| match a {
            Action::PlaybookStep { .. } => Some((false, "job j rank 0 did not answer".into())),
            _ => Some((true, String::new())),
        });
        let first = w.run(1);
        assert_eq!(first.playbook, "nic-flapping");
        assert_eq!(
            first.state,
            RunState::Escalated {
                playbook: "nic-flapping-stuck".into(),
                run: 2
            }
        );
        let attempts: Vec<(u32, IntentStatus)> = w
            .step_intents(1)
            .iter()
            .map(|i| match &i.action {
                Action::PlaybookStep { attempt, .. } => (*attempt, i.status.clone()),
                _ => unreachable!(),
            })
            .collect();
        let failed = IntentStatus::Closed(Outcome::Failed {
            error: "job j rank 0 did not answer".into(),
        });
        assert_eq!(
            attempts,
            vec![(0, failed.clone()), (1, failed.clone()), (2, failed)],
            "retries = 2: three attempts, each its own order"
        );
        let second = w.run(2);
        assert_eq!(second.playbook, "nic-flapping-stuck");
        assert_eq!(second.escalated_from, Some(1));
        assert_eq!(second.state, RunState::Completed);
        assert_eq!(w.events_with("notify: h0 rail0 (rail 0) still flaps"), 1);
        assert_eq!(
            w.st.runs.values().filter(|r| r.state.is_active()).count(),
            0
        );
    }

    #[test]
    fn a_wait_until_step_fails_at_its_timeout() {
        let mut w = World::new(&["h0", "h1"], true);
        w.nic("h0", "rail1", NicState::Up);
        w.nic("h0", "rail0", NicState::Flapping);
        w.settle(obey);
        let run = w.run(1);
        assert_eq!(run.step_id(), "wait-reusable");
        let RunState::Waiting { until_ms } = run.state else {
            panic!("{:?}", run.state);
        };
        assert_eq!(until_ms, run.step_started_ms + 30 * 60 * 1000);
        w.advance(29 * 60 * 1000);
        w.settle(obey);
        assert!(matches!(w.run(1).state, RunState::Waiting { .. }));
        w.advance(60 * 1000);
        w.settle(obey);
        let run = w.run(1);
        assert!(
            matches!(&run.state, RunState::Escalated { playbook, .. } if playbook == "nic-flapping-stuck"),
            "{:?}",
            run.state
        );
        assert!(
            run.log.iter().any(|l| l
                .line
                .contains("timed out after 30m waiting for nic_reusable")),
            "{:?}",
            run.log
        );
        assert_eq!(w.run(2).state, RunState::Completed);
    }

    #[test]
    fn a_waiting_run_outlives_its_cleared_incident_and_fails_back() {
        let mut w = World::new(&["h0", "h1"], true);
        w.nic("h0", "rail1", NicState::Up);
        w.nic("h0", "rail0", NicState::Flapping);
        w.settle(obey);
        assert!(matches!(w.run(1).state, RunState::Waiting { .. }));
        w.nic("h0", "rail0", NicState::Up);
        assert!(w.st.incidents[&1].closed_ms.is_some());
        w.settle(obey);
        let run = w.run(1);
        assert_eq!(run.state, RunState::Completed, "{:?}", run.log);
        let failback = w.step_intents(1).into_iter().any(|i| {
            matches!(&i.action, Action::PlaybookStep { op: StepOp::Failback { nic }, .. } if nic == "rail0")
                && i.status == IntentStatus::Closed(Outcome::Done)
        });
        assert!(failback);
    }

    #[test]
    fn a_drain_beyond_the_limits_fails_the_step() {
        // rail1 never reported: no healthy backup, so nic-down skips the
        // migration, checkpoints (no jobs) and drains.
        let refused = |drained_first: bool| {
            let mut w = World::new(&["h0", "h1", "h2", "h3"], true);
            if drained_first {
                w.admin(AdminOp::Drain {
                    host: "h3".into(),
                    reason: "maintenance".into(),
                    deadline_ms: None,
                });
            }
            w.nic("h0", "rail0", NicState::Down);
            w.settle(obey);
            w
        };
        let w = refused(true);
        let run = w.run(1);
        assert!(
            matches!(&run.state, RunState::Failed { why } if why.contains("limits")),
            "{:?}",
            run.state
        );
        assert!(run
            .log
            .iter()
            .any(|l| l.line.contains("skipped: backup_nic_healthy is false")));
        assert_eq!(w.st.hosts["h0"].drain, None, "nothing drained");
        assert!(
            w.st.incidents[&1].closed_ms.is_none(),
            "left to an operator"
        );
        assert!(w.step_intents(1).iter().any(|i| matches!(
            (&i.action, &i.status),
            (Action::PlaybookStep { op: StepOp::Drain { .. }, .. }, IntentStatus::Closed(Outcome::Failed { error }))
                if error.contains("max_drained_hosts = 1")
        )));
        // Within the limits the drain runs and the playbook completes.
        let w = refused(false);
        assert_eq!(w.run(1).state, RunState::Completed, "{:?}", w.run(1).log);
        let d = w.st.hosts["h0"].drain.as_ref().unwrap();
        assert_eq!(d.phase, DrainPhase::Drained);
        assert_eq!(d.by, "playbook:nic-down");
        assert!(w.st.incidents[&1].closed_ms.is_some());
    }

    #[test]
    fn an_incident_cleared_mid_run_cancels_the_run_and_its_order() {
        let mut w = nic_down_world();
        w.settle(|_| None);
        let intent = w.run(1).step_intent.unwrap();
        assert_eq!(crate::orders::open_orders(&w.st).len(), 1);
        w.nic("h0", "rail0", NicState::Up);
        let run = w.run(1);
        assert!(
            matches!(run.state, RunState::Cancelled { .. }),
            "{:?}",
            run.state
        );
        assert_eq!(run.step_intent, None);
        assert!(matches!(
            w.st.intents[&intent].status,
            IntentStatus::Closed(Outcome::Cancelled { .. })
        ));
        assert!(crate::orders::open_orders(&w.st).is_empty());
        // A late answer to the cancelled order changes nothing.
        let before = w.st.runs.clone();
        w.ok(Command::OrderDone {
            host: "h0".into(),
            id: intent,
            ok: true,
            detail: "moved".into(),
        });
        assert_eq!(w.st.runs, before);
        assert!(wanted_run_commands(&w.st).is_empty());
    }

    fn spec(ranks: u32) -> JobSpec {
        JobSpec {
            name: "j".into(),
            ranks,
            hosts: vec![],
            labels: BTreeMap::new(),
            command: vec!["/bin/true".into()],
            env: BTreeMap::new(),
            checkpoint_dir: "/tmp/ckpt".into(),
            checkpoint_every: 10,
            max_restarts: 3,
            backoff_ms: 100,
        }
    }

    #[test]
    fn the_shipped_library_is_installed_once_and_an_admins_version_wins() {
        let mut w = World::new(&["h0"], false);
        let mine = "name = \"host-down\"\n[trigger]\nincidents = [\"host_down\"]\n\n[[steps]]\nid = \"say\"\naction = \"notify\"\nmessage = \"mine\"\n";
        w.admin(AdminOp::PlaybookApply {
            files: vec![crate::playbook_store::PlaybookFile {
                file: "mine.toml".into(),
                text: mine.into(),
            }],
        });
        let files = crate::playbook_store::shipped_files();
        w.ok(Command::InstallShippedPlaybooks {
            files: files.clone(),
        });
        assert!(w.st.shipped_playbooks_installed);
        assert_eq!(w.st.playbooks.len(), playbooks::SHIPPED.len());
        assert_eq!(
            w.st.playbooks["host-down"].source, mine,
            "the admin's stays"
        );
        assert_eq!(
            w.st.playbooks["nic-down"].applied_by,
            crate::playbook_store::SHIPPED_ACTOR
        );
        // Deleted by an admin, not brought back by a repeated install.
        w.admin(AdminOp::PlaybookDelete {
            name: "nic-down".into(),
        });
        let version = w.st.playbook_version;
        w.ok(Command::InstallShippedPlaybooks { files });
        assert!(!w.st.playbooks.contains_key("nic-down"));
        assert_eq!(w.st.playbook_version, version);
    }

    #[test]
    fn webhook_notifications_wait_for_the_leaders_post() {
        let mut w = World::new(&["h0"], false);
        let pb = "name = \"hook\"\n[trigger]\nincidents = [\"nic_down\"]\n\n[[steps]]\nid = \"tell\"\naction = \"notify\"\nmessage = \"{host} {nic} down\"\nwebhook = \"http://127.0.0.1:9/hook\"\ntimeout = \"10s\"\nretries = 1\n";
        w.admin(AdminOp::PlaybookApply {
            files: vec![crate::playbook_store::PlaybookFile {
                file: "hook.toml".into(),
                text: pb.into(),
            }],
        });
        w.nic("h0", "rail0", NicState::Down);
        w.settle(obey);
        // Logged at once; the intent waits for the POST.
        assert_eq!(w.events_with("notify: h0 rail0 down"), 1);
        let open = crate::webhooks::open_webhooks(&w.st);
        assert_eq!(open.len(), 1, "{open:?}");
        let first = open[0].clone();
        assert_eq!(first.url, "http://127.0.0.1:9/hook");
        assert_eq!(
            first.body.key,
            crate::webhooks::idempotency_key(first.intent)
        );
        assert_eq!(first.body.incident_kind, "nic_down");
        // Only webhook intents can be answered this way.
        let other = w.apply(Command::WebhookDone {
            id: first.intent + 100,
            ok: true,
            detail: String::new(),
        });
        assert!(other.is_err());
        // A failed POST: the step is retried with a new intent (new key).
        w.ok(Command::WebhookDone {
            id: first.intent,
            ok: false,
            detail: "webhook answered 503".into(),
        });
        w.settle(obey);
        let open = crate::webhooks::open_webhooks(&w.st);
        assert_eq!(open.len(), 1);
        assert_ne!(open[0].intent, first.intent);
        assert_eq!(w.run(1).attempt, 1);
        // A late answer for the old attempt changes nothing.
        w.ok(Command::WebhookDone {
            id: first.intent,
            ok: true,
            detail: "late".into(),
        });
        assert!(w.run(1).state.is_active());
        w.ok(Command::WebhookDone {
            id: open[0].intent,
            ok: true,
            detail: "webhook answered 204".into(),
        });
        w.settle(obey);
        let run = w.run(1);
        assert_eq!(run.state, RunState::Completed, "{:?}", run.log);
        assert!(run
            .log
            .iter()
            .any(|l| l.line.contains("done (intent") && l.line.contains("answered 204")));
        assert!(crate::webhooks::open_webhooks(&w.st).is_empty());
        // Unanswered past the step's timeout (both attempts): the run fails.
        w.nic("h0", "rail0", NicState::Up);
        w.nic("h0", "rail0", NicState::Down);
        w.settle(obey);
        w.advance(11_000);
        w.settle(obey);
        w.advance(11_000);
        w.settle(obey);
        let run = w.run(2);
        assert!(
            matches!(run.state, RunState::Failed { .. }),
            "{:?}",
            run.state
        );
        assert!(crate::webhooks::open_webhooks(&w.st).is_empty());
    }

    fn job_world(with_playbooks: bool) -> World {
        let mut w = World::new(&["h0", "h1", "h2"], with_playbooks);
        w.admin(AdminOp::Job(JobOp::Submit { spec: spec(2) }));
        w.settle(obey);
        assert_eq!(w.st.jobs["j"].placement, vec!["h0", "h1"]);
        w
    }

    #[test]
    fn host_down_goes_through_the_host_down_playbook_when_one_is_stored() {
        let mut w = job_world(true);
        w.ok(Command::SetLiveness {
            host: "h1".into(),
            liveness: Liveness::Down,
        });
        assert_eq!(
            w.st.jobs["j"].state,
            JobState::Running,
            "not restarted by the hard-wired path"
        );
        assert_eq!(w.events_with("host_down handled by playbook host-down"), 1);
        w.settle(obey);
        assert_eq!(w.st.jobs["j"].state, JobState::Restarting, "backoff");
        assert_eq!(w.run(1).step_id(), "restart");
        w.advance(1_000);
        w.settle(obey);
        let run = w.run(1);
        assert_eq!(run.playbook, "host-down");
        assert_eq!(run.state, RunState::Completed, "{:?}", run.log);
        let j = &w.st.jobs["j"];
        assert_eq!(j.incarnation, 2);
        assert_eq!(j.state, JobState::Running);
        assert_eq!(j.placement, vec!["h0", "h2"]);
        assert_eq!(j.restarts, 1, "a lost host is a failure restart");
        assert!(w.st.incidents[&1].closed_ms.is_some());
        assert_eq!(
            w.events_with("notify: h1 is down: its jobs were restarted elsewhere"),
            1
        );

        // Without a host_down playbook nothing is hard-wired: the jobs wait
        // for an operator (and the log says so).
        let mut w = job_world(false);
        w.ok(Command::SetLiveness {
            host: "h1".into(),
            liveness: Liveness::Down,
        });
        assert!(wanted_run_commands(&w.st).is_empty());
        w.settle(obey);
        assert_eq!(w.st.jobs["j"].state, JobState::Running);
        assert_eq!(w.st.jobs["j"].incarnation, 1);
        assert_eq!(
            w.events_with("no playbook handles host_down: its jobs wait for an operator"),
            1
        );
    }

    #[test]
    fn checkpoint_steps_wait_for_a_new_complete_checkpoint() {
        // rail1 never reported: nic-down checkpoints the host's jobs.
        let mut w = job_world(true);
        w.nic("h0", "rail0", NicState::Down);
        // Checkpoint orders go unanswered: the step waits.
        w.settle(|a| match a {
            Action::CheckpointJob { .. } => None,
            _ => Some((true, "pid=1".into())),
        });
        assert_eq!(w.run(1).step_id(), "checkpoint");
        assert_eq!(w.st.jobs["j"].state, JobState::Checkpointing);
        // Answered with step=40 by both hosts: a complete checkpoint, the
        // step is done and the drain (within limits: 1 of 3) starts.
        w.settle(obey);
        assert_eq!(w.st.jobs["j"].latest_checkpoint, Some(40));
        let run = w.run(1);
        assert!(
            run.log
                .iter()
                .any(|l| l.line.contains("step checkpoint done")),
            "{:?}",
            run.log
        );
        assert_eq!(run.state, RunState::Completed, "{:?}", run.log);
        assert_eq!(
            w.st.hosts["h0"].drain.as_ref().map(|d| d.phase),
            Some(DrainPhase::Drained)
        );
        assert!(!w.st.jobs["j"].placement.contains(&"h0".to_string()));
    }

    fn contention_world() -> (World, u64) {
        use crate::shaping::{ContentionCommand, HostNic, LinkContention};
        let mut w = World::new(&["h0", "h1", "h2", "h3"], true);
        let a = crate::jobs::placed_for_test("a", &["h0", "h2"]);
        let mut b = crate::jobs::placed_for_test("b", &["h1", "h3"]);
        b.port = a.port + 1;
        w.st.jobs.insert("a".into(), a);
        w.st.jobs.insert("b".into(), b);
        let hn = |h: &str| HostNic {
            host: h.into(),
            nic: "rail0".into(),
        };
        let info = LinkContention {
            link: crate::topology::DirLink {
                link: "up".into(),
                from: "l0".into(),
                to: "l1".into(),
            },
            rate_bps: Some(400_000_000),
            senders: vec![hn("h0"), hn("h1")],
            receivers: vec![hn("h2"), hn("h3")],
            paths: vec!["h0/rail0→h2/rail0".into(), "h1/rail0→h3/rail0".into()],
            queueing_p99_us: 12_000.0,
        };
        let open = Command::Contention(ContentionCommand::Open {
            host: "h0".into(),
            info,
        });
        w.ok(open.clone());
        // A second open for the same link while one is open: no-op.
        w.ok(open);
        let incs: Vec<u64> =
            w.st.incidents
                .values()
                .filter(|i| i.kind == "link_contention")
                .map(|i| i.id)
                .collect();
        assert_eq!(incs.len(), 1);
        (w, incs[0])
    }

    /// The whole reshaping lifecycle in the model: the incident's playbook
    /// plans fair shares, orders every sending host's agent, the step is
    /// done when all confirmed; closing the incident orders every shape
    /// removed, and nothing is left desired or applied.
    #[test]
    fn a_link_contention_incident_reshapes_and_its_close_clears_every_shape() {
        use crate::shaping::ContentionCommand;
        let (mut w, inc) = contention_world();
        w.settle(obey);
        let run = w.st.runs.values().find(|r| r.incident == inc).unwrap();
        assert_eq!(run.state, RunState::Completed, "{:?}", run.state);
        let evs: Vec<&str> = w.st.events.iter().map(|e| e.what.as_str()).collect();
        assert_eq!(w.st.shapes.len(), 2, "h0 and h1 send across: {evs:#?}");
        assert_eq!(w.st.shapes_applied(inc), Some(true));
        let h0 = &w.st.shapes["h0"]["rail0"];
        let labels: Vec<&str> = h0.classes.iter().map(|c| c.label.as_str()).collect();
        assert_eq!(
            labels,
            ["job a", "other"],
            "job classes first, the rest last"
        );
        // 400 Mbit/s × 0.95: 5 % for the rest (split between the two
        // senders), the jobs share what is left fairly.
        assert_eq!(h0.classes[0].rate_bps, 180_500_000);
        assert_eq!(h0.classes[1].rate_bps, 9_500_000);
        let total: u64 =
            w.st.shapes
                .values()
                .flat_map(|m| m.values())
                .flat_map(|s| s.classes.iter())
                .map(|c| c.ceil_bps)
                .sum();
        assert!(
            total <= 380_000_000,
            "never more than the usable rate: {total}"
        );
        let a_port = w.st.jobs["a"].port;
        let dst: std::net::Ipv4Addr = "10.0.0.3".parse().unwrap();
        assert!(h0.classes[0]
            .flows
            .iter()
            .any(|f| f.dst == dst && f.dst_port == a_port));
        assert!(h0.classes[0]
            .flows
            .iter()
            .any(|f| f.dst == dst && f.src_port == a_port));
        assert_eq!(h0.pace.get("a"), Some(&180_500_000));
        let orders = |w: &World, clear: bool| {
            w.st.intents
                .values()
                .filter(|i| match &i.action {
                    Action::ShapeNic { .. } => !clear,
                    Action::ClearShape { .. } => clear,
                    _ => false,
                })
                .filter(|i| i.status == IntentStatus::Closed(Outcome::Done))
                .count()
        };
        assert_eq!(orders(&w, false), 2, "one shape order per sender, once");
        // Settled: nothing more is ordered.
        w.settle(obey);
        assert_eq!(orders(&w, false), 2);

        w.ok(Command::Contention(ContentionCommand::Close {
            incident: inc,
            why: "quiet".into(),
        }));
        assert!(w.st.shapes.is_empty());
        w.settle(obey);
        assert!(w.st.applied_shapes.is_empty(), "{:?}", w.st.applied_shapes);
        assert_eq!(orders(&w, true), 2, "every applied shape removed");
        // Closing twice changes nothing.
        w.ok(Command::Contention(ContentionCommand::Close {
            incident: inc,
            why: "again".into(),
        }));
        w.settle(obey);
        assert_eq!(orders(&w, true), 2);
    }

    /// An agent that refuses its shape: retried a bounded number of
    /// times, then the step fails; the incident's close still clears the
    /// shape that another agent applied.
    #[test]
    fn a_refused_shape_is_retried_a_bounded_number_of_times() {
        use crate::shaping::{ContentionCommand, MAX_SHAPE_FAILURES};
        let (mut w, inc) = contention_world();
        let refuse = |a: &Action| match a {
            Action::ShapeNic { host, .. } if host == "h1" => {
                Some((false, "rail0: no such device".to_string()))
            }
            other => obey(other),
        };
        w.settle(refuse);
        let refused =
            w.st.intents
                .values()
                .filter(|i| matches!(&i.action, Action::ShapeNic { host, .. } if host == "h1"))
                .count();
        assert_eq!(
            refused as u32,
            MAX_SHAPE_FAILURES * 2,
            "two step attempts, each retried"
        );
        let run = w.st.runs.values().find(|r| r.incident == inc).unwrap();
        assert!(
            matches!(&run.state, RunState::Failed { why } if why.contains("refused")),
            "{:?}",
            run.state
        );
        assert!(w.st.applied_shapes.contains_key("h0"));
        w.ok(Command::Contention(ContentionCommand::Close {
            incident: inc,
            why: "quiet".into(),
        }));
        w.settle(obey);
        assert!(w.st.applied_shapes.is_empty() && w.st.shapes.is_empty());
    }

    /// `railguard shape clear HOST`: the host's shapes go, others stay.
    #[test]
    fn an_admin_clears_one_hosts_shapes() {
        let (mut w, _) = contention_world();
        w.settle(obey);
        w.admin(AdminOp::ShapeClear { host: "h0".into() });
        w.settle(obey);
        assert!(!w.st.applied_shapes.contains_key("h0"));
        assert!(w.st.applied_shapes.contains_key("h1"));
        let e = w
            .apply(Command::Admin {
                actor: "t".into(),
                op: AdminOp::ShapeClear {
                    host: "nope".into(),
                },
                request: None,
            })
            .unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
    }

    #[test]
    fn model_only_steps_and_unavailable_actions() {
        // clock-unsynced: the clock state changes open and close the
        // incident; the playbook excludes, notifies, waits, includes.
        let mut w = World::new(&["h0", "h1"], true);
        let clock = |host: &str, state| Command::SetClockStates {
            changes: vec![crate::model::ClockChange {
                host: host.into(),
                state,
                offset_ns: None,
                error_bound_ns: None,
            }],
        };
        use crate::model::ClockState::{Degraded, Synced, Unsynced};
        // Unsynced at registration → Synced → Degraded: no incident.
        w.ok(clock("h0", Synced));
        w.ok(clock("h0", Degraded));
        assert!(w.st.incidents.is_empty());
        w.ok(clock("h0", Unsynced));
        let inc = w.st.hosts["h0"].clock_incident.expect("an incident");
        assert_eq!(w.st.incidents[&inc].kind, "clock_unsynced");
        // Still Unsynced: no second incident.
        w.ok(clock("h0", Degraded));
        w.ok(clock("h0", Unsynced));
        assert_eq!(w.st.incidents.len(), 1);
        w.settle(obey);
        assert!(w.st.hosts["h0"].owd_excluded);
        let run = w.run(1);
        assert_eq!(run.step_id(), "wait-synced");
        w.ok(clock("h0", Synced));
        assert!(w.st.incidents[&inc].closed_ms.is_some());
        assert_eq!(w.st.hosts["h0"].clock_incident, None);
        w.settle(obey);
        assert_eq!(w.run(1).state, RunState::Completed);
        assert!(!w.st.hosts["h0"].owd_excluded);
        // A Down host losing sync gets no clock incident (host_down says
        // more); back up and synced, then unsynced again: a new one.
        w.ok(clock("h1", Synced));
        w.ok(Command::SetLiveness {
            host: "h1".into(),
            liveness: Liveness::Down,
        });
        w.ok(clock("h1", Unsynced));
        assert_eq!(w.st.hosts["h1"].clock_incident, None);
        w.ok(Command::SetLiveness {
            host: "h1".into(),
            liveness: Liveness::Ready,
        });
        w.ok(clock("h1", Synced));
        w.ok(clock("h1", Unsynced));
        assert!(w.st.hosts["h1"].clock_incident.is_some());
        // link-contention without a link (not one the detector opened):
        // reshape_rate fails, is retried, then the run fails (no
        // escalation target).
        let inc =
            w.st.open_incident(w.now, "link_contention", "h0", None, "test".into());
        w.settle(obey);
        let run = w.st.runs.values().find(|r| r.incident == inc).unwrap();
        assert!(
            matches!(&run.state, RunState::Failed { why } if why.contains("names no link")),
            "{:?}",
            run.state
        );
        assert_eq!(w.step_intents(run.id).len(), 2, "retries = 1: two attempts");
    }
}
