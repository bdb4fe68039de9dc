//! [`JobModel`]: the sequential specification of one job name as the
//! admin-history scenarios submit, cancel and show it. The jobs ask for a
//! host label no host has, so they wait unplaced until cancelled: their
//! state changes only by what the clients do.

use super::model::Model;

/// Operations on one job name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum JobOp {
    /// `job submit` of a spec carrying the value (every submit its own):
    /// refused while a job of that name is live.
    Submit(u64),
    /// `job cancel`: refused when there is none, or it already ended.
    Cancel,
    /// `job show`: its value and whether it is live, or none.
    Read,
}

/// What an operation returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobResult {
    Ok,
    /// Refused by a precondition (or not found); no effect.
    Refused,
    Read(Option<(u64, bool)>),
}

/// The job of the name: its value and whether it is live (not ended).
pub struct JobModel;

impl Model for JobModel {
    type State = Option<(u64, bool)>;
    type Input = JobOp;
    type Output = JobResult;

    fn init(&self) -> Self::State {
        None
    }

    fn is_read(&self, input: &JobOp) -> bool {
        *input == JobOp::Read
    }

    fn is_refused(&self, out: &JobResult) -> bool {
        *out == JobResult::Refused
    }

    fn step(&self, s: &Self::State, input: &JobOp, out: Option<&JobResult>) -> Option<Self::State> {
        let ok = matches!(out, None | Some(JobResult::Ok));
        let refused = matches!(out, None | Some(JobResult::Refused));
        let live = matches!(s, Some((_, true)));
        match input {
            JobOp::Read => match out {
                None => Some(*s),
                Some(JobResult::Read(v)) if v == s => Some(*s),
                _ => None,
            },
            JobOp::Submit(_) if live => refused.then_some(*s),
            JobOp::Submit(v) => ok.then_some(Some((*v, true))),
            JobOp::Cancel if !live => refused.then_some(*s),
            JobOp::Cancel => ok.then_some(s.map(|(v, _)| (v, false))),
        }
    }
}

/// The spec of job `name` carrying `value`: one rank, on a host labelled
/// `lin=never` (none is), so it never leaves Pending by itself.
pub fn spec(name: &str, value: u64) -> supervisor::model::JobSpec {
    supervisor::model::JobSpec {
        name: name.into(),
        ranks: 1,
        hosts: Vec::new(),
        labels: [("lin".to_string(), "never".to_string())].into(),
        command: vec!["/bin/true".into(), format!("v{value}")],
        env: Default::default(),
        checkpoint_dir: "/tmp/railguard-lin".into(),
        checkpoint_every: 0,
        max_restarts: 0,
        backoff_ms: 1_000,
        user: None,
        ranks_per_host: 1,
    }
}

/// What [`spec`] put in a job, and whether the job is live.
pub fn observe(job: &supervisor::model::Job) -> Option<(u64, bool)> {
    let v = job.spec.command.get(1)?.strip_prefix('v')?.parse().ok()?;
    Some((v, !job.state.is_final()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linearizability::{check, Operation, Verdict};

    #[test]
    fn the_spec_is_valid() {
        spec("lin-job0", 7).validate().expect("valid");
    }

    #[test]
    fn submit_cancel_resubmit() {
        let good = [
            Operation::done(0, JobOp::Cancel, 0, 5, JobResult::Refused),
            Operation::done(0, JobOp::Submit(1), 10, 20, JobResult::Ok),
            Operation::done(1, JobOp::Submit(2), 30, 40, JobResult::Refused),
            Operation::done(1, JobOp::Read, 50, 60, JobResult::Read(Some((1, true)))),
            Operation::done(0, JobOp::Cancel, 70, 80, JobResult::Ok),
            Operation::done(1, JobOp::Read, 90, 95, JobResult::Read(Some((1, false)))),
            Operation::done(1, JobOp::Submit(3), 100, 110, JobResult::Ok),
        ];
        assert_eq!(check(&JobModel, &good, 100_000), Verdict::Linearizable);
        // Two submits of one name both accepted, one after the other.
        let twice = [
            Operation::done(0, JobOp::Submit(1), 0, 10, JobResult::Ok),
            Operation::done(1, JobOp::Submit(2), 20, 30, JobResult::Ok),
        ];
        assert!(matches!(
            check(&JobModel, &twice, 100_000),
            Verdict::NotLinearizable { .. }
        ));
    }
}
