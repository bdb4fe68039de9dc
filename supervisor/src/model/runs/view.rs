//! A run as `railguard playbook runs` shows it.

use crate::model::runs::types::{PlaybookRun, RunLogLine, RunState};
use crate::model::state::ClusterState;
use serde::{Deserialize, Serialize};

/// A run in `railguard playbook runs`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RunView {
    pub id: u64,
    pub incident: u64,
    pub incident_kind: String,
    pub host: String,
    pub nic: Option<String>,
    /// The other host of a path incident.
    #[serde(default)]
    pub peer: Option<String>,
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
            incident_kind: inc.map(|i| i.kind.to_string()).unwrap_or_default(),
            host: inc.map(|i| i.host.clone()).unwrap_or_default(),
            nic: inc.and_then(|i| i.nic.clone()),
            peer: inc.and_then(|i| i.peer.clone()),
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
