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
//! id is the intent id: the leader's [`crate::leader::orders::OrderHub`] sends
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
//! the leader's [`crate::leader::webhooks`] sender POSTs it (idempotency key = the
//! intent id, so a new leader re-sending after a crash is recognisable)
//! and closes the intent with the answer; the step's timeout bounds it.
//!
//! **Reshaping.** A `reshape_rate` step on a `link_contention` incident
//! computes the plan ([`crate::model::shaping::plan`]) and installs it as the
//! incident's desired shaping when the attempt starts; the attempt is done
//! when every sending host's agent confirmed its shape, failed when an
//! agent refused one [`crate::model::shaping::MAX_SHAPE_FAILURES`] times or on
//! its timeout. The shapes stay until the incident closes.

pub(crate) mod apply;
pub(crate) mod decide;
pub(crate) mod steps;
#[cfg(test)]
mod tests;
pub(crate) mod types;
pub(crate) mod view;

pub use decide::{evaluate_step, wanted_run_commands};
pub use types::{
    JobMark, PlaybookRun, RunCommand, RunLogLine, RunState, StepOp, MAX_CLOSED_RUNS,
    MAX_ESCALATIONS, MAX_RUN_LOG, MAX_RUN_TEXT,
};
pub use view::RunView;
