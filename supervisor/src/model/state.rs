//! `ClusterState`, the whole replicated model, and the entry point of Raft
//! apply: one proposal at a time, each command validated again, results
//! remembered per client session.

use crate::model::admin::AdminRecord;
use crate::model::command::{Command, NodeId, Proposal, RequestId, Session, TypeConfig};
use crate::model::events::{ClusterEvent, Event};
use crate::model::hosts::Host;
use crate::model::incidents::Incident;
use crate::model::intents::{Intent, IntentStatus};
use crate::model::jobs::types::Job;
use crate::model::limits::{MAX_EVENT_LOG, MAX_SESSIONS, MAX_SESSION_RESULTS};
use crate::model::probe_graph::ProbeGraph;
use crate::model::qps::{Qp, QpKey};
use crate::model::result::{CmdError, CmdResult};
use crate::model::runs::types::PlaybookRun;
use openraft::LogId;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::collections::{BTreeMap, BTreeSet};

/// The format of the model's bincode: the first byte of every snapshot's
/// data and the model byte of every stored log entry (raft-store adds its
/// own store version around both). Bump it whenever a type inside
/// `ClusterState` or a `Command` changes its bincode layout, or applying a
/// command changes what it does.
/// 2: agent events carry `proto::agent::Report`; `JobSpec.user`;
/// `AdminOp::Refused`, `AdminOp::Revoke`; `revoked`.
/// 4: `JobSpec.ranks_per_host`.
/// 5: NICs held out of service (`Nic.held_out`, `Host.held_version`, the
/// versions of `Action::Failover`/`Failback`).
/// 6: path incidents (`Incident.peer`, `Event::PathIncidentStays`).
/// 7: `Report::ConnStalled`, `Event::ConnStalled`.
/// 8: `Host.path_incidents`.
/// 9: `Incident.shared_at_report`.
/// 10: `NicState::Degraded` (and the agents' `NicHealth::Degraded`); a
/// refused retry is remembered in its session, a first attempt older than
/// its session remembers is refused as forgotten.
/// 11: `ClassSpec.job` (a job's class says whose it is in a field, not in
/// its label).
/// 12: what applying does, not the layout: an entry that changes a NIC's
/// state opens the reroute orders the new state calls for (an older log
/// replayed by this build would open intents its writers did not, and
/// replicas would number their intents differently).
pub const MODEL_FORMAT_VERSION: u8 = 12;

/// The whole replicated model.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ClusterState {
    pub hosts: BTreeMap<String, Host>,
    pub jobs: BTreeMap<String, Job>,
    /// Open incidents and the most recently closed ones.
    pub incidents: BTreeMap<u64, Incident>,
    /// Closed incident ids, oldest first (bounds `incidents`).
    pub closed_incidents: VecDeque<u64>,
    /// Open intents and the most recently closed ones.
    pub intents: BTreeMap<u64, Intent>,
    /// Closed intent ids, oldest first (bounds `intents`).
    pub closed_intents: VecDeque<u64>,
    pub admin_history: VecDeque<AdminRecord>,
    /// Client sessions: results of recent requests, for exactly-once retries.
    pub sessions: BTreeMap<String, Session>,
    pub events: VecDeque<ClusterEvent>,
    pub next_event_seq: u64,
    pub next_incident_id: u64,
    pub next_intent_id: u64,
    /// Jobs submitted so far (numbers jobs: their data port).
    pub next_job_number: u64,
    /// Stored playbooks by name.
    pub playbooks: BTreeMap<String, crate::model::playbook_store::StoredPlaybook>,
    /// Bumped whenever a playbook changes.
    pub playbook_version: u64,
    /// Whether the shipped playbooks were installed (once per cluster).
    pub shipped_playbooks_installed: bool,
    /// Playbook runs: active ones and the most recently ended.
    pub runs: BTreeMap<u64, PlaybookRun>,
    /// Ended run ids, oldest first (bounds `runs`).
    pub closed_runs: VecDeque<u64>,
    pub next_run_id: u64,
    /// Index of the last applied log entry (for status output).
    pub last_log_index: u64,
    /// Connection placements per host (each host bounded by
    /// [`MAX_QPS_PER_HOST`]).
    pub qps: BTreeMap<String, BTreeMap<QpKey, Qp>>,
    /// Desired HTB shaping, host → NIC → shape ([`crate::model::shaping`]).
    pub shapes: BTreeMap<String, BTreeMap<String, crate::model::shaping::NicShape>>,
    /// What each agent confirmed installing: host → NIC → shape version.
    pub applied_shapes: BTreeMap<String, BTreeMap<String, u64>>,
    pub next_shape_version: u64,
    /// The next host id to give (ids are never reused).
    pub next_host_id: u32,
    /// Host names by id.
    pub host_ids: BTreeMap<u32, String>,
    /// Who probes whom: a random regular graph over host ids
    /// ([`crate::model::probe_graph`]).
    pub probe_graph: ProbeGraph,
    /// Bumped whenever the graph or a NIC's address or rail changes; agents
    /// compare it with their plan's.
    pub probe_plan_version: u64,
    /// Revoked certificate serials (lowercase hex), refused by every
    /// supervisor at the next handshake and the next call.
    pub revoked: std::collections::BTreeSet<String>,
    /// Per host: the detour routes its agent confirmed
    /// ([`crate::model::reroute`]).
    pub reroutes: BTreeMap<String, crate::model::reroute::record::RerouteRecord>,
    /// Which incidents and intents are open. Derived from `incidents` and
    /// `intents` (which also keep up to `MAX_CLOSED_RECORDS` closed ones
    /// each): kept by apply, rebuilt when a snapshot is read, never
    /// serialised. The leader's reconciler looks at what is open after
    /// every committed NIC report; without the index each look walked the
    /// whole history.
    #[serde(skip)]
    pub open: OpenIndex,
    /// Set while an entry is applied when a NIC's state changed: the
    /// entry's last step opens the reroute orders the state then calls for
    /// (once, however many NICs changed). Always false between entries;
    /// never serialised.
    #[serde(skip)]
    pub(crate) reroute_pending: bool,
}

/// The ids of the open incidents and intents, ascending (the order of the
/// maps they index).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OpenIndex {
    pub incidents: BTreeSet<u64>,
    pub intents: BTreeSet<u64>,
}

impl raft_store::StateModel<TypeConfig> for ClusterState {
    const FORMAT_VERSION: u8 = MODEL_FORMAT_VERSION;

    fn apply(&mut self, log_id: &LogId<NodeId>, data: &Proposal) -> Vec<CmdResult> {
        self.apply_proposal(log_id, data)
    }

    fn non_app_response(&mut self, log_id: &LogId<NodeId>) -> Vec<CmdResult> {
        self.last_log_index = log_id.index;
        Vec::new()
    }

    /// [`MODEL_FORMAT_VERSION`], then bincode of the model.
    fn encode(&self) -> Result<Vec<u8>, String> {
        let mut out = vec![MODEL_FORMAT_VERSION];
        bincode::serialize_into(&mut out, self).map_err(|e| e.to_string())?;
        Ok(out)
    }

    /// Refuses a snapshot of another model format (or none) instead of
    /// guessing at its fields.
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        match bytes.split_first() {
            Some((&MODEL_FORMAT_VERSION, body)) => {
                let mut st: ClusterState = bincode::deserialize(body).map_err(|e| e.to_string())?;
                st.rebuild_open_index();
                Ok(st)
            }
            Some((v, _)) => Err(format!(
                "model snapshot has format version {v}; this build reads only version {MODEL_FORMAT_VERSION}"
            )),
            None => Err("model snapshot is empty".into()),
        }
    }
}

impl ClusterState {
    /// Applies one proposal; returns one result per command.
    pub fn apply_proposal(&mut self, log_id: &LogId<NodeId>, p: &Proposal) -> Vec<CmdResult> {
        self.last_log_index = log_id.index;
        let results = p
            .cmds
            .iter()
            .map(|c| {
                let request = match c {
                    Command::Admin {
                        request: Some(r), ..
                    } => Some(r),
                    _ => None,
                };
                if let Some(done) = request.and_then(|r| self.session_result(r)) {
                    return done;
                }
                let res = match self.validate(c) {
                    Ok(()) => self.apply_valid(log_id.index, p.at_ms, c),
                    Err(e) => Err(e),
                };
                if let Some(r) = request {
                    self.remember(r, p.at_ms, &res);
                }
                // Every model test checks the index after every command.
                #[cfg(test)]
                self.check_open_index();
                res
            })
            .collect();
        if std::mem::take(&mut self.reroute_pending) {
            self.open_reroute_orders(p.at_ms);
            #[cfg(test)]
            self.check_open_index();
        }
        results
    }

    /// Invariant: [`OpenIndex`] names exactly the open incidents and
    /// intents. Panics naming the difference.
    pub fn check_open_index(&self) {
        assert_eq!(
            self.open,
            self.open_index_from_maps(),
            "the open index (left) differs from the maps (right)"
        );
    }

    /// The result of a request already applied in its session, if any; a
    /// request older than what the session remembers gets
    /// [`CmdError::RequestForgotten`] — a retry, and a first attempt too:
    /// clients number their requests in order and never leave one that far
    /// behind unanswered (`SerialWindow`), so such a copy was delayed (a
    /// forward held up by a partition) and may already have been applied.
    pub fn session_result(&self, r: &RequestId) -> Option<CmdResult> {
        let s = self.sessions.get(&r.client)?;
        match s.results.get(&r.serial) {
            Some(res) => Some(res.clone()),
            None if r.serial <= s.forgotten_through => Some(Err(CmdError::RequestForgotten {
                client: r.client.clone(),
                serial: r.serial,
            })),
            None => None,
        }
    }

    pub(in crate::model) fn remember(&mut self, r: &RequestId, at_ms: u64, res: &CmdResult) {
        if !self.sessions.contains_key(&r.client) && self.sessions.len() >= MAX_SESSIONS {
            // Forget the least recently used session (ties: smallest id).
            if let Some(victim) = self
                .sessions
                .iter()
                .min_by_key(|(_, s)| s.last_used_ms)
                .map(|(k, _)| k.clone())
            {
                self.sessions.remove(&victim);
            }
        }
        let s = self.sessions.entry(r.client.clone()).or_default();
        s.last_used_ms = s.last_used_ms.max(at_ms);
        s.results.insert(r.serial, res.clone());
        while s.results.len() > MAX_SESSION_RESULTS {
            if let Some((old, _)) = s.results.pop_first() {
                s.forgotten_through = s.forgotten_through.max(old);
            }
        }
    }

    /// Appends `event` to the event log (bounded: the oldest go).
    pub(crate) fn log_event(&mut self, at_ms: u64, host: Option<&str>, event: Event) {
        self.log_observed(at_ms, host, event, None);
    }

    /// Appends an event an agent observed at `observed_unix_ns`.
    pub(in crate::model) fn log_observed(
        &mut self,
        at_ms: u64,
        host: Option<&str>,
        event: Event,
        observed_unix_ns: Option<u64>,
    ) {
        self.next_event_seq += 1;
        self.events.push_back(ClusterEvent {
            seq: self.next_event_seq,
            at_ms,
            host: host.map(str::to_owned),
            what: event.to_string(),
            event,
            observed_unix_ns,
        });
        while self.events.len() > MAX_EVENT_LOG {
            self.events.pop_front();
        }
    }

    /// Open intents, oldest first.
    pub fn open_intents(&self) -> impl Iterator<Item = &Intent> {
        self.open
            .intents
            .iter()
            .filter_map(|id| self.intents.get(id))
    }

    /// The open incidents, by id.
    pub fn open_incidents(&self) -> impl Iterator<Item = &Incident> {
        self.open
            .incidents
            .iter()
            .filter_map(|id| self.incidents.get(id))
    }

    /// Builds [`OpenIndex`] from the maps (after a snapshot is read).
    pub fn rebuild_open_index(&mut self) {
        self.open = self.open_index_from_maps();
    }

    fn open_index_from_maps(&self) -> OpenIndex {
        OpenIndex {
            incidents: self
                .incidents
                .values()
                .filter(|i| i.closed_ms.is_none())
                .map(|i| i.id)
                .collect(),
            intents: self
                .intents
                .values()
                .filter(|i| i.status == IntentStatus::Open)
                .map(|i| i.id)
                .collect(),
        }
    }

    /// Jobs with a rank on `host`.
    pub fn jobs_on(&self, host: &str) -> impl Iterator<Item = &Job> {
        let host = host.to_owned();
        self.jobs
            .values()
            .filter(move |j| j.placement.contains(&host))
    }
}
