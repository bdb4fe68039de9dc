//! What the jobs call for now, as pure functions of the state: leader
//! decisions, orders without an intent, orders no longer worth doing.

use crate::model::hosts::{HostStatus, Liveness};
use crate::model::intents::Action;
use crate::model::jobs::place::place;
use crate::model::jobs::types::{JobCommand, JobState};
use crate::model::state::ClusterState;

/// Leader decisions the state calls for now (pure): placements, drain
/// moves, drain deadlines.
pub fn wanted_job_commands(st: &ClusterState, now_ms: u64) -> Vec<JobCommand> {
    let mut out = Vec::new();
    for j in st.jobs.values() {
        match j.state {
            JobState::Pending | JobState::Restarting
                if j.stopping.is_empty() && now_ms >= j.not_before_ms =>
            {
                if let Some(placement) = place(st, j) {
                    out.push(JobCommand::Place {
                        job: j.name.clone(),
                        incarnation: j.incarnation,
                        placement,
                    });
                }
            }
            JobState::Running | JobState::Checkpointing => {
                let draining: Vec<&crate::model::Host> = j
                    .hosts()
                    .into_iter()
                    .filter_map(|h| st.hosts.get(h))
                    .filter(|h| h.status() == HostStatus::Draining)
                    .collect();
                if draining.is_empty() {
                    continue;
                }
                let overdue = draining.iter().find(|h| {
                    h.drain
                        .as_ref()
                        .and_then(|d| d.deadline_ms)
                        .is_some_and(|d| now_ms >= d)
                });
                if let Some(h) = overdue {
                    out.push(JobCommand::Restart {
                        job: j.name.clone(),
                        incarnation: j.incarnation,
                        reason: format!("drain deadline of {} passed", h.name),
                        planned: true,
                    });
                } else if j.state == JobState::Running && j.ranks.iter().all(|r| r.started) {
                    out.push(JobCommand::Halt {
                        job: j.name.clone(),
                        incarnation: j.incarnation,
                    });
                }
            }
            _ => {}
        }
    }
    out
}

/// Orders the jobs call for that have no intent yet (pure).
pub fn wanted_job_actions(st: &ClusterState) -> Vec<Action> {
    let mut out = Vec::new();
    for j in st.jobs.values() {
        if j.state == JobState::Running || j.state == JobState::Checkpointing {
            for (r, rank) in j.ranks.iter().enumerate() {
                if !rank.started {
                    out.push(Action::StartRank {
                        job: j.name.clone(),
                        incarnation: j.incarnation,
                        rank: r as u32,
                        host: rank.host.clone(),
                    });
                }
            }
        }
        for (host, inc) in &j.stopping {
            out.push(Action::StopJob {
                job: j.name.clone(),
                incarnation: *inc,
                host: host.clone(),
            });
        }
    }
    out
}

/// Whether a job order is still worth carrying out (`Some(why)`: cancel it).
pub fn job_order_obsolete(st: &ClusterState, action: &Action) -> Option<String> {
    match action {
        Action::StartRank {
            job, incarnation, ..
        }
        | Action::CheckpointJob {
            job, incarnation, ..
        } => match st.jobs.get(job) {
            None => Some(format!("job {job} no longer exists")),
            Some(j) if j.incarnation != *incarnation => Some(format!(
                "job {job} moved on to incarnation {}",
                j.incarnation
            )),
            Some(j) if !matches!(j.state, JobState::Running | JobState::Checkpointing) => {
                Some(format!("job {job} is {:?}", j.state))
            }
            Some(_) => None,
        },
        Action::StopJob {
            job,
            incarnation,
            host,
        } => match st.jobs.get(job) {
            None => Some(format!("job {job} no longer exists")),
            Some(j) if j.stopping.get(host) != Some(incarnation) => {
                Some("nothing left to stop".into())
            }
            Some(_)
                if st
                    .hosts
                    .get(host)
                    .is_none_or(|h| h.liveness == Liveness::Down) =>
            {
                Some(format!(
                    "host {host} is down; its agent stops the ranks when it returns"
                ))
            }
            Some(_) => None,
        },
        _ => None,
    }
}
