//! Jobs in Raft apply: admin operations, leader decisions, rank exits and
//! checkpoints, restarts and their orders.

use crate::model::events::Event;
use crate::model::hosts::Liveness;
use crate::model::intents::Action;
use crate::model::jobs::place::{eligible, placement_cut, placement_rails_cut, well_formed};
use crate::model::jobs::types::{
    port_of, Exit, Job, JobCommand, JobOp, JobState, Rank, MAX_BACKOFF_MS, MAX_JOBS,
};
use crate::model::limits::MAX_REASON_LEN;
use crate::model::result::{CmdError, CmdOk, CmdResult};
use crate::model::state::ClusterState;
use std::collections::BTreeMap;

fn stale(job: &str, got: u64, now: u64) -> CmdError {
    CmdError::FailedPrecondition(format!("job {job:?} is at incarnation {now}, not {got}"))
}

fn check_reason(reason: &str) -> Result<(), CmdError> {
    if reason.len() > MAX_REASON_LEN {
        return Err(CmdError::InvalidArgument(format!(
            "reason is longer than {MAX_REASON_LEN} bytes"
        )));
    }
    Ok(())
}

impl ClusterState {
    pub(in crate::model) fn job(&self, name: &str) -> Result<&Job, CmdError> {
        self.jobs.get(name).ok_or_else(|| CmdError::NotFound {
            kind: "job".into(),
            name: name.into(),
        })
    }

    /// Validation of an admin job operation (nothing changes).
    pub(crate) fn validate_job_op(&self, op: &JobOp) -> Result<(), CmdError> {
        match op {
            JobOp::Submit { spec } => {
                spec.validate()?;
                // An ended job's name may be used again once nothing of it
                // runs; the new job replaces its record.
                if let Some(old) = self.jobs.get(&spec.name) {
                    if !old.state.is_final() {
                        return Err(CmdError::FailedPrecondition(format!(
                            "a job named {:?} is {:?}; cancel it or choose another name",
                            spec.name, old.state
                        )));
                    }
                    let busy = !old.stopping.is_empty()
                        || self
                            .open_intents()
                            .any(|i| i.action.job() == Some(spec.name.as_str()));
                    if busy {
                        return Err(CmdError::FailedPrecondition(format!(
                            "job {:?} ended but its ranks are still being stopped; submit again once they are",
                            spec.name
                        )));
                    }
                }
                if let Some(h) = spec.hosts.iter().find(|h| !self.hosts.contains_key(*h)) {
                    return Err(CmdError::NotFound {
                        kind: "host".into(),
                        name: h.clone(),
                    });
                }
                if self.jobs.len() >= MAX_JOBS && !self.jobs.values().any(|j| j.state.is_final()) {
                    return Err(CmdError::FailedPrecondition(format!(
                        "{MAX_JOBS} jobs are live; cancel some first"
                    )));
                }
                Ok(())
            }
            JobOp::Cancel { job } => {
                let j = self.job(job)?;
                if j.state.is_final() {
                    return Err(CmdError::FailedPrecondition(format!(
                        "job {job:?} already ended ({:?})",
                        j.state
                    )));
                }
                Ok(())
            }
            JobOp::Restart { job, reason } => {
                let j = self.job(job)?;
                check_reason(reason)?;
                if !matches!(j.state, JobState::Running | JobState::Checkpointing) {
                    return Err(CmdError::FailedPrecondition(format!(
                        "job {job:?} is {:?}; only a running job can be restarted",
                        j.state
                    )));
                }
                Ok(())
            }
            JobOp::Checkpoint { job } => {
                let j = self.job(job)?;
                match j.state {
                    JobState::Running if j.ranks.iter().all(|r| r.started) => Ok(()),
                    JobState::Running => Err(CmdError::FailedPrecondition(format!(
                        "job {job:?} is still starting its ranks"
                    ))),
                    JobState::Checkpointing => Err(CmdError::FailedPrecondition(format!(
                        "job {job:?} is already checkpointing"
                    ))),
                    s => Err(CmdError::FailedPrecondition(format!(
                        "job {job:?} is {s:?}; only a running job can checkpoint"
                    ))),
                }
            }
        }
    }

    /// Applies a validated admin job operation; returns what to log.
    pub(crate) fn apply_job_op(&mut self, at_ms: u64, op: &JobOp, actor: &str) -> String {
        match op {
            JobOp::Submit { spec } => {
                // A name used again continues its incarnations, so no order
                // or record of the ended job can be taken for the new one.
                let incarnation = self
                    .jobs
                    .remove(&spec.name)
                    .map_or(0, |old| old.incarnation);
                self.forget_finished_jobs();
                self.next_job_number += 1;
                let number = self.next_job_number;
                let job = Job {
                    name: spec.name.clone(),
                    placement: Vec::new(),
                    incarnation,
                    spec: spec.clone(),
                    state: JobState::Pending,
                    number,
                    port: port_of(number),
                    submitted_ms: at_ms,
                    state_since_ms: at_ms,
                    restarts: 0,
                    failures_in_a_row: 0,
                    not_before_ms: 0,
                    ranks: Vec::new(),
                    resume_step: 0,
                    checkpoints: BTreeMap::new(),
                    latest_checkpoint: None,
                    latest_checkpoint_ms: None,
                    stopping: BTreeMap::new(),
                    previous_placement: spec
                        .hosts
                        .iter()
                        .take(spec.host_count())
                        .flat_map(|h| std::iter::repeat_n(h.clone(), spec.ranks_per_host as usize))
                        .collect(),
                    halting: false,
                    fenced: BTreeMap::new(),
                    reason: String::new(),
                };
                self.jobs.insert(spec.name.clone(), job);
                format!("job {} submitted: {} ranks", spec.name, spec.ranks)
            }
            JobOp::Cancel { job } => {
                self.stop_job(
                    at_ms,
                    job,
                    JobState::Cancelled,
                    &format!("cancelled by {actor}"),
                );
                format!("job {job} cancelled")
            }
            JobOp::Restart { job, reason } => {
                let inc = self.jobs[job].incarnation;
                self.restart_job(at_ms, job, inc, &format!("{reason} (by {actor})"), true);
                format!("job {job} restart ordered: {reason}")
            }
            JobOp::Checkpoint { job } => {
                self.checkpoint_job(at_ms, job, false);
                format!("job {job} checkpoint ordered")
            }
        }
    }

    pub(in crate::model) fn forget_finished_jobs(&mut self) {
        while self.jobs.len() >= MAX_JOBS {
            let oldest = self
                .jobs
                .values()
                .filter(|j| j.state.is_final())
                .min_by_key(|j| (j.state_since_ms, j.number))
                .map(|j| j.name.clone());
            match oldest {
                Some(n) => {
                    self.jobs.remove(&n);
                }
                None => break,
            }
        }
    }

    pub(crate) fn validate_job_command(&self, c: &JobCommand) -> Result<(), CmdError> {
        match c {
            JobCommand::Place {
                job,
                incarnation,
                placement,
            } => {
                let j = self.job(job)?;
                if j.incarnation != *incarnation {
                    return Err(stale(job, *incarnation, j.incarnation));
                }
                if !matches!(j.state, JobState::Pending | JobState::Restarting) {
                    return Err(CmdError::FailedPrecondition(format!(
                        "job {job:?} is {:?}, not waiting for placement",
                        j.state
                    )));
                }
                if !j.stopping.is_empty() {
                    return Err(CmdError::FailedPrecondition(format!(
                        "job {job:?} still has ranks to stop"
                    )));
                }
                if placement.len() != j.spec.ranks as usize {
                    return Err(CmdError::InvalidArgument(format!(
                        "placement of {} hosts for {} ranks",
                        placement.len(),
                        j.spec.ranks
                    )));
                }
                if !well_formed(placement, j.spec.ranks_per_host as usize) {
                    return Err(CmdError::InvalidArgument(format!(
                        "placement {placement:?} does not put {} ranks on each of distinct hosts",
                        j.spec.ranks_per_host
                    )));
                }
                for h in placement {
                    if !eligible(self, h, &j.spec) {
                        return Err(CmdError::FailedPrecondition(format!(
                            "host {h:?} cannot take a rank of job {job:?}"
                        )));
                    }
                }
                if let Some((a, b)) = placement_cut(self, placement) {
                    return Err(CmdError::FailedPrecondition(format!(
                        "hosts {a:?} and {b:?} cannot talk (no common working data rail, or an open path incident keeps them apart); job {job:?} cannot span them"
                    )));
                }
                Ok(())
            }
            JobCommand::Restart {
                job, incarnation, ..
            }
            | JobCommand::Halt { job, incarnation } => {
                let j = self.job(job)?;
                if let JobCommand::Restart { reason, .. } = c {
                    check_reason(reason)?;
                }
                if j.incarnation != *incarnation {
                    return Err(stale(job, *incarnation, j.incarnation));
                }
                if !matches!(j.state, JobState::Running | JobState::Checkpointing) {
                    return Err(CmdError::FailedPrecondition(format!(
                        "job {job:?} is {:?}",
                        j.state
                    )));
                }
                Ok(())
            }
        }
    }

    pub(crate) fn apply_job_command(&mut self, at_ms: u64, c: &JobCommand) -> CmdResult {
        match c {
            JobCommand::Place { job, placement, .. } => {
                let j = self.jobs.get_mut(job).expect("validated");
                j.incarnation += 1;
                j.placement = placement.clone();
                j.ranks = placement
                    .iter()
                    .map(|h| Rank {
                        host: h.clone(),
                        started: false,
                        exit: None,
                    })
                    .collect();
                j.resume_step = j.latest_checkpoint.unwrap_or(0);
                j.state = JobState::Running;
                j.state_since_ms = at_ms;
                j.halting = false;
                let what = Event::JobPlaced {
                    job: job.clone(),
                    incarnation: j.incarnation,
                    hosts: placement.clone(),
                    resume_step: j.resume_step,
                };
                self.log_event(at_ms, None, what);
            }
            JobCommand::Restart {
                job,
                incarnation,
                reason,
                planned,
            } => self.restart_job(at_ms, job, *incarnation, reason, *planned),
            JobCommand::Halt { job, .. } => self.checkpoint_job(at_ms, job, true),
        }
        Ok(CmdOk::Done)
    }

    /// Opens a checkpoint order per host of the incarnation.
    pub(crate) fn checkpoint_job(&mut self, at_ms: u64, job: &str, halt: bool) {
        let j = self.jobs.get_mut(job).expect("validated");
        j.state = JobState::Checkpointing;
        j.state_since_ms = at_ms;
        j.halting = halt;
        let inc = j.incarnation;
        let hosts: Vec<String> = j.hosts().into_iter().map(str::to_owned).collect();
        for host in hosts {
            self.open_intent(
                at_ms,
                &Action::CheckpointJob {
                    job: job.to_owned(),
                    incarnation: inc,
                    host,
                    halt,
                },
            );
        }
    }

    /// Ends the incarnation: its hosts (those not Down) get stop orders.
    pub(in crate::model) fn stop_incarnation(&mut self, job: &str) {
        let hosts = &self.hosts;
        let j = self.jobs.get_mut(job).expect("job exists");
        for h in j.placement.iter() {
            match hosts.get(h) {
                Some(x) if x.liveness != Liveness::Down => {
                    j.stopping.insert(h.clone(), j.incarnation);
                }
                // Unreachable: its ranks may still run (a partition). They
                // cannot talk to the next incarnation (connection ids), and
                // the host is told to stop them when it is back.
                Some(_) => {
                    let e = j.fenced.entry(h.clone()).or_default();
                    *e = (*e).max(j.incarnation);
                }
                None => {}
            }
        }
        if !j.placement.is_empty() {
            j.previous_placement = std::mem::take(&mut j.placement);
        }
        j.halting = false;
    }

    /// Stops the job for good (`state` final).
    pub(in crate::model) fn stop_job(
        &mut self,
        at_ms: u64,
        job: &str,
        state: JobState,
        reason: &str,
    ) {
        self.stop_incarnation(job);
        self.stalled_evidence_spent(at_ms, job);
        let j = self.jobs.get_mut(job).expect("job exists");
        j.state = state;
        j.state_since_ms = at_ms;
        j.reason = reason.to_owned();
        self.log_event(
            at_ms,
            None,
            Event::JobEnded {
                job: job.to_owned(),
                state,
                reason: reason.to_owned(),
            },
        );
    }

    /// Stops the incarnation and schedules the next one (`planned`: no
    /// backoff, not counted). Stale incarnations and ended jobs are left
    /// alone.
    pub(crate) fn restart_job(
        &mut self,
        at_ms: u64,
        job: &str,
        incarnation: u64,
        reason: &str,
        planned: bool,
    ) {
        let Some(j) = self.jobs.get(job) else { return };
        if j.incarnation != incarnation
            || !matches!(j.state, JobState::Running | JobState::Checkpointing)
        {
            return;
        }
        if !planned && j.restarts >= j.spec.max_restarts {
            let why = format!("{reason}; gave up after {} restarts", j.restarts);
            self.stop_job(at_ms, job, JobState::Failed, &why);
            return;
        }
        self.stop_incarnation(job);
        self.stalled_evidence_spent(at_ms, job);
        let j = self.jobs.get_mut(job).expect("job exists");
        if !planned {
            j.restarts += 1;
            j.failures_in_a_row = j.failures_in_a_row.saturating_add(1);
            let shift = (j.failures_in_a_row - 1).min(16);
            let backoff = j
                .spec
                .backoff_ms
                .saturating_mul(1 << shift)
                .min(MAX_BACKOFF_MS);
            j.not_before_ms = at_ms.saturating_add(backoff);
        } else {
            j.not_before_ms = at_ms;
        }
        j.state = JobState::Restarting;
        j.state_since_ms = at_ms;
        j.reason = reason.to_owned();
        let what = Event::JobRestarting {
            job: job.to_owned(),
            incarnation,
            planned,
            restarts: j.restarts,
            reason: reason.to_owned(),
        };
        self.log_event(at_ms, None, what);
    }

    /// A host is back from Down: stop whatever older incarnations it may
    /// still run.
    pub(crate) fn jobs_host_back(&mut self, host: &str) {
        for j in self.jobs.values_mut() {
            if let Some(inc) = j.fenced.remove(host) {
                let e = j.stopping.entry(host.to_owned()).or_default();
                *e = (*e).max(inc);
            }
        }
    }

    pub(crate) fn apply_rank_exited(
        &mut self,
        at_ms: u64,
        host: &str,
        job: &str,
        incarnation: u64,
        rank: u32,
        exit: Exit,
    ) {
        let Some(j) = self.jobs.get_mut(job) else {
            return;
        };
        // A rank ends once: an agent that crashed between reporting an
        // exit and forgetting the rank reports it again after its restart.
        let current = j.incarnation == incarnation
            && matches!(j.state, JobState::Running | JobState::Checkpointing)
            && j.ranks
                .get(rank as usize)
                .is_some_and(|r| r.host == host && r.exit.is_none());
        let what = format!(
            "job {job} incarnation {incarnation} rank {rank} ended: {}",
            exit.describe()
        );
        let ended = Event::RankEnded {
            job: job.to_owned(),
            incarnation,
            rank,
            exit: exit.describe(),
            current,
        };
        if !current {
            self.log_event(at_ms, Some(host), ended);
            return;
        }
        let ok = exit.success();
        j.ranks[rank as usize].exit = Some(exit);
        let all_done = j
            .ranks
            .iter()
            .all(|r| r.exit.as_ref().is_some_and(Exit::success));
        self.log_event(at_ms, Some(host), ended);
        if all_done {
            let j = self.jobs.get_mut(job).expect("exists");
            j.state = JobState::Succeeded;
            j.state_since_ms = at_ms;
            j.previous_placement = std::mem::take(&mut j.placement);
            j.reason = "every rank finished".into();
            self.stalled_evidence_spent(at_ms, job);
            self.log_event(
                at_ms,
                None,
                Event::JobSucceeded {
                    job: job.to_owned(),
                },
            );
        } else if !ok {
            // A rank of a placement whose hosts the NIC states say can no
            // longer all talk failed because of the path, not of itself: a
            // planned move (the next placement avoids the pair), no budget
            // spent. (A stalled connection alone proves no such thing: a
            // dead peer stalls them too.)
            let placement = &self.jobs[job].placement;
            match placement_rails_cut(self, placement) {
                Some((a, b)) => {
                    let why = format!("{what}; {a} and {b} share no working data rail");
                    self.restart_job(at_ms, job, incarnation, &why, true);
                }
                None => self.restart_job(at_ms, job, incarnation, &what, false),
            }
        }
    }

    pub(crate) fn apply_rank_checkpoint(
        &mut self,
        at_ms: u64,
        host: &str,
        job: &str,
        incarnation: u64,
        rank: u32,
        step: u64,
    ) {
        let Some(j) = self.jobs.get_mut(job) else {
            return;
        };
        // Parts from any incarnation of the rank count (steps are
        // deterministic); the host must have run that rank at some point,
        // which the incarnation check approximates for the current one.
        if incarnation == j.incarnation && j.ranks.get(rank as usize).is_none_or(|r| r.host != host)
        {
            return;
        }
        if j.record_checkpoint(at_ms, rank, step) {
            self.log_event(
                at_ms,
                None,
                Event::CheckpointComplete {
                    job: job.to_owned(),
                    step,
                },
            );
        }
    }

    /// Effect of a closed job order intent.
    pub(crate) fn job_order_closed(
        &mut self,
        at_ms: u64,
        action: &Action,
        ok: bool,
        detail: &str,
        checkpoint_step: Option<u64>,
    ) {
        match action {
            Action::StartRank {
                job,
                incarnation,
                rank,
                host,
            } => {
                let Some(j) = self.jobs.get_mut(job) else {
                    return;
                };
                if j.incarnation != *incarnation {
                    return;
                }
                if ok {
                    if let Some(r) = j.ranks.get_mut(*rank as usize) {
                        r.started = true;
                    }
                } else {
                    let why = format!("rank {rank} could not start on {host}: {detail}");
                    self.restart_job(at_ms, job, *incarnation, &why, false);
                }
            }
            Action::StopJob {
                job,
                incarnation,
                host,
            } => {
                let Some(j) = self.jobs.get_mut(job) else {
                    return;
                };
                if j.stopping.get(host) == Some(incarnation) {
                    j.stopping.remove(host);
                }
            }
            Action::CheckpointJob {
                job,
                incarnation,
                host,
                ..
            } => {
                let Some(j) = self.jobs.get_mut(job) else {
                    return;
                };
                if j.incarnation != *incarnation || j.state != JobState::Checkpointing {
                    return;
                }
                if ok {
                    if let Some(step) = checkpoint_step {
                        let ranks: Vec<u32> = (0..j.ranks.len() as u32)
                            .filter(|r| j.ranks[*r as usize].host == *host)
                            .collect();
                        let mut complete = false;
                        for r in ranks {
                            complete |= j.record_checkpoint(at_ms, r, step);
                        }
                        if complete {
                            self.log_event(
                                at_ms,
                                None,
                                Event::CheckpointComplete {
                                    job: job.clone(),
                                    step,
                                },
                            );
                        }
                    }
                }
                let still_open = self.open_intents().any(|i| {
                    matches!(&i.action, Action::CheckpointJob { job: ij, incarnation: ii, .. } if ij == job && ii == incarnation)
                });
                if still_open {
                    return;
                }
                let j = self.jobs.get_mut(job).expect("exists");
                if j.halting {
                    // The ranks halted at the checkpoint (or the order
                    // failed): move the job from exactly there.
                    let why = if ok {
                        "moving off a draining host".to_string()
                    } else {
                        format!("moving off a draining host (checkpoint failed: {detail})")
                    };
                    self.restart_job(at_ms, job, *incarnation, &why, true);
                } else {
                    j.state = JobState::Running;
                    j.state_since_ms = at_ms;
                }
            }
            _ => {}
        }
    }
}
