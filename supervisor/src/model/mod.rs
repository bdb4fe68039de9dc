//! The replicated cluster model: what every supervisor agrees on through Raft.
//!
//! Everything here is deterministic: [`ClusterState::apply`] depends only on
//! the state and the [`Proposal`] (whose timestamp the leader sets before
//! proposing), never on clocks or I/O, so every replica reaches the same state.
//!
//! Commands are validated by [`ClusterState::validate`] twice: on the leader
//! before proposing (a bad command is never written to the log) and again at
//! apply time (the state may have moved since); a command that fails either
//! check changes nothing and reports a typed [`CmdError`].
//!
//! # Layout
//! Types by area, each a leaf: [`command`] (the Raft entry and commands),
//! [`result`] (results, refusals, shared name checks), [`limits`],
//! [`admin`], [`hosts`], [`events`], [`intents`], [`incidents`], [`qps`],
//! [`paths`] (which hosts share a working data rail);
//! the areas with their own rooms: [`jobs`], [`runs`] (playbook runs),
//! [`shaping`] (link contention), [`playbook_store`], [`probe_graph`].
//! Behaviour: [`state`] (`ClusterState` and Raft apply's entry point),
//! `validate` (every command checked), `apply` (the per-command effects).

pub mod admin;
mod apply;
pub mod command;
pub mod decide;
pub mod events;
pub mod hosts;
pub mod incidents;
pub mod intents;
pub mod jobs;
pub mod limits;
pub mod paths;
pub mod playbook_store;
pub mod probe_graph;
pub mod qps;
pub mod reroute;
pub mod result;
pub mod runs;
pub mod shaping;
pub mod state;
#[cfg(test)]
pub(crate) mod testkit;
#[cfg(test)]
mod tests;
mod validate;

pub use admin::{AdminAction, AdminOp, AdminRecord};
pub use command::{Command, NodeId, Proposal, RequestId, Session, TypeConfig};
pub use events::{AgentEvent, ClusterEvent, Event};
pub(crate) use hosts::{check_failback, failover_target};
pub use hosts::{
    ClockChange, ClockState, Drain, DrainPhase, HeldOut, Host, HostClockRecord, HostStatus,
    Liveness, Nic, NicSpec, NicState,
};
pub use incidents::{Incident, IncidentKind};
pub use intents::{Action, Intent, IntentStatus, Outcome};
pub use jobs::{Job, JobCommand, JobOp, JobSpec, JobState};
pub use limits::{
    MAX_ADMIN_HISTORY, MAX_CLOCK_CHANGES, MAX_CLOSED_RECORDS, MAX_EVENT_LOG, MAX_LABELS,
    MAX_NAME_LEN, MAX_NICS, MAX_QPS_PER_HOST, MAX_REASON_LEN, MAX_SESSIONS, MAX_SESSION_RESULTS,
};
pub use qps::{Qp, QpKey};
pub(crate) use result::{check_labels, check_name};
pub use result::{CmdError, CmdOk, CmdResult};
pub use runs::{PlaybookRun, RunCommand, RunState, StepOp};
pub use state::ClusterState;
