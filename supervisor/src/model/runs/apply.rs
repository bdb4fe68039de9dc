//! Runs in Raft apply: start, drive, attempts, escalation, and what an
//! incident's end does to its run.

use crate::model::events::Event;
use crate::model::hosts::NicState;
use crate::model::intents::Outcome;
use crate::model::result::{CmdError, CmdOk, CmdResult};
use crate::model::runs::steps::Begun;
use crate::model::runs::types::{
    clip, PlaybookRun, RunCommand, RunLogLine, RunState, MAX_CLOSED_RUNS, MAX_ESCALATIONS,
    MAX_RUN_LOG,
};
use crate::model::state::ClusterState;
use playbooks::IncidentKind;
use std::collections::VecDeque;

impl ClusterState {
    /// The incident as playbooks see it (host labels, NIC rail).
    pub fn incident_view(&self, id: u64) -> Option<playbooks::IncidentView> {
        let i = self.incidents.get(&id)?;
        let h = self.hosts.get(&i.host);
        Some(playbooks::IncidentView {
            kind: i.kind.to_string(),
            host: i.host.clone(),
            nic: i.nic.clone(),
            rail: i
                .nic
                .as_ref()
                .and_then(|n| h.and_then(|h| h.nics.get(n)))
                .and_then(|n| n.rail),
            job: None,
            peer: i.peer.clone(),
            labels: h.map(|h| h.labels.clone()).unwrap_or_default(),
            closed: i.closed_ms.is_some(),
        })
    }

    /// The stored playbook that handles the incident now, with its version.
    pub fn playbook_for(&self, incident: u64) -> Option<(playbooks::Playbook, u64)> {
        let view = self.incident_view(incident)?;
        let set = self.playbook_set();
        let pb = playbooks::matching(set.iter().copied(), &view)?.clone();
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
                // Decided before its host was cut off: its NIC incidents
                // wait until it is reachable again.
                if let Some(cut) = i
                    .nic
                    .as_ref()
                    .and_then(|_| self.hosts.get(&i.host)?.cut_off_incident)
                {
                    return Err(CmdError::FailedPrecondition(format!(
                        "incident {incident}: host {} is cut off (incident {cut})",
                        i.host
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
    pub(in crate::model) fn start_run(
        &mut self,
        at_ms: u64,
        incident: u64,
        playbook: &str,
        escalated_from: Option<u64>,
        depth: u32,
    ) -> u64 {
        let stored = &self.playbooks[playbook];
        let version = stored.version;
        let definition = stored
            .parsed()
            .expect("validated: stored playbooks parse")
            .clone();
        let guards = definition.guards.clone();
        self.next_run_id += 1;
        let id = self.next_run_id;
        self.runs.insert(
            id,
            PlaybookRun {
                id,
                incident,
                playbook: playbook.to_owned(),
                playbook_version: version,
                definition,
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
        let inc = self.incident_view(incident).expect("exists");
        let view = self.playbook_view_of(at_ms, &inc);
        for g in &guards {
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
    pub(in crate::model) fn run_log(&mut self, at_ms: u64, run: u64, line: String) {
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
        self.log_event(at_ms, host.as_deref(), Event::Run { run, line });
    }

    /// Runs steps until one waits or the run ends (bounded: jumps go
    /// forward and every step has at most 11 attempts).
    pub(in crate::model) fn drive_run(&mut self, at_ms: u64, run: u64) {
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
                    let view = self.playbook_view_of(at_ms, &inc);
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

    /// An attempt ended: follow `next`, retry, or follow `on_failure`.
    /// The caller drives the run on.
    /// `intent`: the attempt's step intent, if it had one (named in the
    /// log, so an action can be traced to the order id the agent saw).
    pub(in crate::model) fn attempt_ended(
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

    pub(in crate::model) fn end_run(&mut self, at_ms: u64, run: u64, state: RunState) {
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
    pub(in crate::model) fn run_completed(&mut self, at_ms: u64, run: u64, why: String) {
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
            self.log_event(at_ms, None, Event::LinkIncidentStays { incident });
            return;
        }
        // Likewise a NIC's incident is over when the NIC is usable again,
        // not when its playbook moved the work off it: the NIC's recovery
        // closes it (`nic_recovered`).
        // A cut-off host's incident is over when a data rail works again.
        let cut_off = self.incidents.get(&incident).is_some_and(|i| {
            i.kind == IncidentKind::HostCutOff
                && self.hosts.get(&i.host).is_some_and(|h| !h.reconnected())
        });
        if cut_off {
            self.log_event(at_ms, None, Event::HostIncidentStays { incident });
            return;
        }
        // A path incident is over when its two hosts share a rail again
        // (one on the ranks' evidence is spent with its run).
        let path_cut = self.incidents.get(&incident).is_some_and(|i| {
            i.stalled_job.is_none() && {
                let hosts = (
                    self.hosts.get(&i.host),
                    i.peer.as_ref().and_then(|p| self.hosts.get(p)),
                );
                matches!(hosts, (Some(a), Some(b)) if !crate::model::paths::path_restored(a, b))
            }
        });
        if path_cut {
            self.log_event(at_ms, None, Event::PathIncidentStays { incident });
            return;
        }
        if self.nic_still_unusable(incident) {
            self.log_event(at_ms, None, Event::NicIncidentStays { incident });
            return;
        }
        self.resolve_incident(
            at_ms,
            incident,
            &format!("resolved by playbook {playbook} (run {run})"),
        );
    }

    /// Failed for good: escalate to the playbook's `on_failure`, or fail.
    pub(in crate::model) fn run_failed(&mut self, at_ms: u64, run: u64, why: String) {
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
                // A path incident on the ranks' evidence has nothing left
                // to wait for: it goes with its run (else it would keep the
                // pair apart for good).
                if self
                    .incidents
                    .get(&incident)
                    .is_some_and(|i| i.stalled_job.is_some())
                {
                    self.close_incident(at_ms, incident, "its run failed; the evidence is spent");
                }
            }
        }
    }

    /// Whether `incident` is a NIC's (down or flapping) whose NIC is not
    /// up now.
    fn nic_still_unusable(&self, incident: u64) -> bool {
        let Some(i) = self.incidents.get(&incident) else {
            return false;
        };
        if !matches!(i.kind, IncidentKind::NicDown | IncidentKind::NicFlapping) {
            return false;
        }
        i.nic
            .as_ref()
            .and_then(|n| self.hosts.get(&i.host)?.nics.get(n))
            .is_some_and(|n| n.state != NicState::Up)
    }

    /// Closes an incident its playbook resolved (the NIC's or host's open
    /// incident slot is freed: a new failure opens a new incident).
    pub(in crate::model) fn resolve_incident(&mut self, at_ms: u64, id: u64, why: &str) {
        let Some(i) = self.incidents.get(&id) else {
            return;
        };
        if i.closed_ms.is_some() {
            return;
        }
        let (host, nic, kind) = (i.host.clone(), i.nic.clone(), i.kind);
        if let Some(h) = self.hosts.get_mut(&host) {
            if h.open_incident == Some(id) {
                h.open_incident = None;
            }
            if h.cut_off_incident == Some(id) {
                h.cut_off_incident = None;
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

    /// A NIC incident whose host is cut off (incident `by`): a run acting
    /// on it is cancelled and the incident left without a run, so a new one
    /// starts once the host is reachable again (a waiting run goes on).
    pub(in crate::model) fn set_aside_run(&mut self, at_ms: u64, incident: u64, by: u64) {
        let Some(run) = self.active_run_of(incident).map(|r| r.id) else {
            return;
        };
        let r = &self.runs[&run];
        if matches!(r.state, RunState::Waiting { .. }) {
            return;
        }
        let open = r.step_intent;
        let why = format!("the host is cut off (incident {by}); its playbook moves the jobs");
        self.run_log(at_ms, run, format!("set aside: {why}"));
        self.end_run(at_ms, run, RunState::Cancelled { why: why.clone() });
        if let Some(id) = open {
            self.close_intent_now(at_ms, id, Outcome::Cancelled { why });
        }
        if let Some(i) = self.incidents.get_mut(&incident) {
            i.run = None;
        }
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
