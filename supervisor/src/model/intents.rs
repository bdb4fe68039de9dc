//! Intents: what the leader is about to do (an `Action`) and how it ended.

use crate::model::runs::types::StepOp;
use serde::{Deserialize, Serialize};

/// Things the reconciler does; each is recorded as an intent first.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    /// Finish draining a host once no work remains on it (or its deadline
    /// passed and the remaining work was stopped).
    CompleteDrain { host: String },
    /// An admin's failover: order the host's agent to move every
    /// connection off `nic` to `to` (resolved when the intent opens: `--to`
    /// or the NIC's backup) and to hold `nic` out of service for
    /// connections as of Raft log index `version`.
    Failover {
        host: String,
        nic: String,
        to: String,
        version: u64,
    },
    /// An admin's failback: order the host's agent to put `nic` back in
    /// service (as of Raft log index `version`) and move connections whose
    /// home is `nic` back.
    Failback {
        host: String,
        nic: String,
        version: u64,
    },
    /// Order the host's agent to launch one rank of a job's incarnation.
    StartRank {
        job: String,
        incarnation: u64,
        rank: u32,
        host: String,
    },
    /// Order the host's agent to stop the job's ranks of this incarnation
    /// and older ones.
    StopJob {
        job: String,
        incarnation: u64,
        host: String,
    },
    /// Order the host's ranks of the incarnation to checkpoint (with
    /// `halt`: and compute nothing more).
    CheckpointJob {
        job: String,
        incarnation: u64,
        host: String,
        halt: bool,
    },
    /// One attempt of a playbook run's step ([`crate::model::runs`]): opened by
    /// the run in apply (never proposed on its own), with the operation
    /// resolved when the attempt started. `Failover`/`Failback` operations
    /// are orders to the host's agent, by intent id like the admin ones.
    PlaybookStep {
        run: u64,
        step: u32,
        attempt: u32,
        host: String,
        op: StepOp,
    },
    /// Order the host's agent to install the desired shape `version` on
    /// `nic` ([`crate::model::shaping`]).
    ShapeNic {
        host: String,
        nic: String,
        version: u64,
    },
    /// Order the host's agent to remove every shape from `nic`.
    ClearShape { host: String, nic: String },
    /// Order the host's agent to make its detour routes the desired set
    /// whose digest is `digest` ([`crate::model::reroute`]).
    Reroute { host: String, digest: u64 },
}

impl std::fmt::Display for Action {
    /// What `railguard events` and `intents` show: a sentence, not the
    /// structure (playbook steps and attempts counted from 1).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Action::CompleteDrain { host } => write!(f, "complete drain of {host}"),
            Action::Failover { host, nic, to, .. } => {
                write!(f, "failover of {host}/{nic} to {to}")
            }
            Action::Failback { host, nic, .. } => write!(f, "failback to {host}/{nic}"),
            Action::StartRank {
                job,
                incarnation,
                rank,
                host,
            } => write!(f, "start {job}#{incarnation} rank {rank} on {host}"),
            Action::StopJob {
                job,
                incarnation,
                host,
            } => write!(f, "stop {job}#{incarnation} (and older) on {host}"),
            Action::CheckpointJob {
                job,
                incarnation,
                host,
                halt,
            } => write!(
                f,
                "checkpoint {job}#{incarnation} on {host}{}",
                if *halt { " and halt" } else { "" }
            ),
            Action::PlaybookStep {
                run,
                step,
                attempt,
                host,
                op,
            } => write!(
                f,
                "run {run} step {} attempt {} on {host}: {op}",
                step + 1,
                attempt + 1
            ),
            Action::ShapeNic { host, nic, version } => {
                write!(f, "shape {host}/{nic} (version {version})")
            }
            Action::ClearShape { host, nic } => write!(f, "clear shapes of {host}/{nic}"),
            Action::Reroute { host, digest: 0 } => write!(f, "remove the detour routes of {host}"),
            Action::Reroute { host, digest } => {
                write!(f, "detour routes of {host} (set #{digest:016x})")
            }
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Done => write!(f, "done"),
            Outcome::Cancelled { why } => write!(f, "cancelled: {why}"),
            Outcome::Failed { error } => write!(f, "failed: {error}"),
        }
    }
}

impl Action {
    /// The host the action concerns.
    pub fn host(&self) -> &str {
        match self {
            Action::CompleteDrain { host }
            | Action::Failover { host, .. }
            | Action::Failback { host, .. }
            | Action::StartRank { host, .. }
            | Action::StopJob { host, .. }
            | Action::CheckpointJob { host, .. }
            | Action::PlaybookStep { host, .. }
            | Action::ShapeNic { host, .. }
            | Action::ClearShape { host, .. }
            | Action::Reroute { host, .. } => host,
        }
    }

    /// Whether the action is carried out by the host's agent (an order).
    pub fn is_order(&self) -> bool {
        match self {
            Action::CompleteDrain { .. } => false,
            Action::PlaybookStep { op, .. } => op.is_order(),
            _ => true,
        }
    }

    /// The job the action concerns, if any.
    pub fn job(&self) -> Option<&str> {
        match self {
            Action::StartRank { job, .. }
            | Action::StopJob { job, .. }
            | Action::CheckpointJob { job, .. } => Some(job),
            _ => None,
        }
    }
}

/// How an intent ended.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// Nothing to do any more (e.g. the host was undrained meanwhile).
    Cancelled {
        why: String,
    },
    Failed {
        error: String,
    },
}

/// Intent status.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum IntentStatus {
    Open,
    Closed(Outcome),
}

/// What the reconciler is about to do (or did), keyed by command id.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Intent {
    pub id: u64,
    pub action: Action,
    pub status: IntentStatus,
    pub opened_ms: u64,
    pub closed_ms: Option<u64>,
    /// What the outcome's author said (an agent's order answer).
    pub detail: String,
}

#[cfg(test)]
mod display_tests {
    use super::*;

    #[test]
    fn actions_and_outcomes_read_as_sentences() {
        let lines: Vec<String> = [
            Action::Reroute {
                host: "h1".into(),
                digest: 0xabc,
            },
            Action::Reroute {
                host: "h1".into(),
                digest: 0,
            },
            Action::PlaybookStep {
                run: 3,
                step: 1,
                attempt: 2,
                host: "h2".into(),
                op: StepOp::Failover {
                    nic: "rail0".into(),
                    to: "rail1".into(),
                },
            },
            Action::CheckpointJob {
                job: "llm".into(),
                incarnation: 4,
                host: "h0".into(),
                halt: true,
            },
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        assert_eq!(
            lines,
            [
                "detour routes of h1 (set #0000000000000abc)",
                "remove the detour routes of h1",
                "run 3 step 2 attempt 3 on h2: fail rail0 over to rail1",
                "checkpoint llm#4 on h0 and halt",
            ]
        );
        let failed = Outcome::Failed {
            error: "no NIC".into(),
        };
        assert_eq!(failed.to_string(), "failed: no NIC");
    }
}
