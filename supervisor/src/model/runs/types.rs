//! Playbook runs' types: run state and log, step operations, the leader's
//! run command.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

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
    /// (see [`crate::leader::webhooks`]) and the attempt waits for the answer.
    Notify {
        message: String,
        webhook: Option<String>,
    },
    /// The incident's desired shaping was set; done when applied.
    ReshapeRate {
        bits_per_sec: Option<u64>,
        /// On-Ramp-style edge holding threshold (µs of queueing).
        edge_hold_us: Option<u32>,
    },
    /// A playbook's drain of the host undone (an admin's stays).
    ReturnToService,
}

impl std::fmt::Display for StepOp {
    /// What `railguard events` and `intents` show.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let jobs = |js: &[JobMark]| {
            js.iter()
                .map(|j| format!("{} #{}", j.job, j.incarnation))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            StepOp::Failover { nic, to } => write!(f, "fail {nic} over to {to}"),
            StepOp::Failback { nic } => write!(f, "fail back to {nic}"),
            StepOp::CheckpointJobs { jobs: js } => write!(f, "checkpoint {}", jobs(js)),
            StepOp::RestartJobs { jobs: js } => write!(f, "restart {}", jobs(js)),
            StepOp::Cordon => write!(f, "cordon"),
            StepOp::ReturnToService => write!(f, "return to service"),
            StepOp::Drain { .. } => write!(f, "drain"),
            StepOp::WaitUntil { condition } => write!(f, "wait until {condition}"),
            StepOp::ExcludeFromOwd => write!(f, "exclude from one-way-delay detection"),
            StepOp::IncludeInOwd => write!(f, "include in one-way-delay detection"),
            StepOp::Notify { message, webhook } => match webhook {
                Some(w) => write!(f, "notify {w}: {message}"),
                None => write!(f, "notify: {message}"),
            },
            StepOp::ReshapeRate {
                bits_per_sec,
                edge_hold_us,
            } => {
                write!(f, "reshape")?;
                if let Some(b) = bits_per_sec {
                    write!(f, " to {b} bit/s")?;
                }
                if let Some(us) = edge_hold_us {
                    write!(f, ", hold at the edge above {us} µs")?;
                }
                Ok(())
            }
        }
    }
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

pub(in crate::model) fn clip(mut s: String) -> String {
    if s.len() > MAX_RUN_TEXT {
        let mut cut = MAX_RUN_TEXT;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}
