//! Opening and closing intents, and what a closed intent changes.

use crate::model::events::Event;
use crate::model::hosts::DrainPhase;
use crate::model::intents::{Action, Intent, IntentStatus, Outcome};
use crate::model::limits::MAX_CLOSED_RECORDS;
use crate::model::result::{CmdOk, CmdResult};
use crate::model::state::ClusterState;

impl ClusterState {
    /// Records an intent (or finds the open one for the same action).
    pub(crate) fn open_intent(&mut self, at_ms: u64, action: &Action) -> u64 {
        if let Some(existing) = self.open_intents().find(|i| &i.action == action) {
            return existing.id;
        }
        self.next_intent_id += 1;
        let id = self.next_intent_id;
        self.open.intents.insert(id);
        self.intents.insert(
            id,
            Intent {
                id,
                action: action.clone(),
                status: IntentStatus::Open,
                opened_ms: at_ms,
                closed_ms: None,
                detail: String::new(),
            },
        );
        self.log_event(
            at_ms,
            Some(action.host()),
            Event::IntentOpened {
                id,
                action: action.clone(),
            },
        );
        id
    }

    /// Closes an open intent with its outcome and applies the effect
    /// (`checkpoint_step`: the step an agent's checkpoint answer carries);
    /// closing a closed intent changes nothing.
    pub(crate) fn close_intent(
        &mut self,
        at_ms: u64,
        id: u64,
        outcome: Outcome,
        detail: &str,
        checkpoint_step: Option<u64>,
    ) -> CmdResult {
        let intent = self.intents.get(&id).expect("validated").clone();
        if intent.status != IntentStatus::Open {
            // Idempotent by id: closing twice changes nothing.
            return Ok(CmdOk::Done);
        }
        let mut outcome = outcome;
        if outcome == Outcome::Done {
            match &intent.action {
                Action::CompleteDrain { host } => {
                    let h = self.hosts.get_mut(host).expect("validated");
                    match &mut h.drain {
                        Some(d) if d.phase == DrainPhase::Draining => {
                            d.phase = DrainPhase::Drained;
                        }
                        _ => {
                            outcome = Outcome::Cancelled {
                                why: "host is no longer draining".into(),
                            }
                        }
                    }
                }
                // The agent moved the connections; their placements arrive
                // as agent events.
                Action::Failover { .. } | Action::Failback { .. } => {}
                Action::StartRank { .. }
                | Action::StopJob { .. }
                | Action::CheckpointJob { .. } => {}
                // Step effects were applied when the attempt started.
                Action::PlaybookStep { .. } => {}
                Action::ShapeNic { .. } | Action::ClearShape { .. } => {}
                Action::Reroute { .. } => {}
            }
        }
        self.shape_order_closed(&intent.action, &outcome);
        self.reroute_order_closed(&intent.action, &outcome);
        let host = intent.action.host().to_owned();
        let e = self.intents.get_mut(&id).expect("validated");
        e.status = IntentStatus::Closed(outcome.clone());
        self.open.intents.remove(&id);
        e.closed_ms = Some(at_ms);
        e.detail = detail.to_owned();
        self.prune_closed_intents(id);
        if intent.action.job().is_some() {
            self.job_order_closed(
                at_ms,
                &intent.action,
                outcome == Outcome::Done,
                detail,
                checkpoint_step,
            );
        }
        if let Action::PlaybookStep { run, .. } = &intent.action {
            // Logged first so the run's lines follow the intent's.
            let what = Event::IntentClosed {
                id,
                outcome: outcome.clone(),
            };
            self.log_event(at_ms, Some(&host), what);
            self.run_step_closed(at_ms, *run, id, &outcome);
            return Ok(CmdOk::Done);
        }
        let what = match (&intent.action, &outcome) {
            (Action::CompleteDrain { .. }, Outcome::Done) => Event::Drained { intent: id },
            (Action::Failover { nic, to, .. }, Outcome::Done) => Event::FailoverDone {
                intent: id,
                nic: nic.clone(),
                to: to.clone(),
                detail: detail.to_owned(),
            },
            (Action::Failback { nic, .. }, Outcome::Done) => Event::FailbackDone {
                intent: id,
                nic: nic.clone(),
                detail: detail.to_owned(),
            },
            (_, o) => Event::IntentClosed {
                id,
                outcome: o.clone(),
            },
        };
        self.log_event(at_ms, Some(&host), what);
        Ok(CmdOk::Done)
    }

    pub(in crate::model) fn prune_closed_intents(&mut self, closed: u64) {
        self.closed_intents.push_back(closed);
        while self.closed_intents.len() > MAX_CLOSED_RECORDS {
            if let Some(old) = self.closed_intents.pop_front() {
                self.intents.remove(&old);
            }
        }
    }
}
