//! Agent events applied exactly once, in sequence: NIC states, connection
//! placements, reflex outcomes, rank exits and checkpoints.

use crate::model::events::Event;
use crate::model::events::{AgentEvent, AgentEventKind};
use crate::model::hosts::NicState;
use crate::model::incidents::IncidentKind;
use crate::model::limits::MAX_QPS_PER_HOST;
use crate::model::qps::{Qp, QpKey};
use crate::model::result::{CmdError, CmdOk, CmdResult};
use crate::model::state::ClusterState;
use std::collections::BTreeMap;

/// One NIC report as applied.
pub(in crate::model) struct NicReport {
    observed_unix_ns: u64,
    state: NicState,
    link_up: bool,
    carrier_changes: u64,
    flaps: u32,
    penalty: f64,
    probes_lost: bool,
}

impl ClusterState {
    pub(in crate::model) fn apply_agent_events(
        &mut self,
        at_ms: u64,
        host: &str,
        events: &[AgentEvent],
    ) -> CmdResult {
        let mut through = self.hosts[host].last_event_seq;
        for e in events {
            if e.seq <= through {
                continue; // already applied: exactly-once
            }
            if e.seq != through + 1 {
                return Err(CmdError::SequenceGap {
                    host: host.into(),
                    expected: through + 1,
                    got: e.seq,
                    acked: through,
                });
            }
            match &e.kind {
                AgentEventKind::NicState {
                    nic,
                    state,
                    carrier_changes,
                    flaps,
                    damping_penalty,
                    coalesced,
                    link_up,
                    probes_lost,
                } => {
                    if *coalesced > 0 {
                        self.log_event(
                            at_ms,
                            Some(host),
                            Event::NicCoalesced {
                                nic: nic.clone(),
                                transitions: *coalesced,
                            },
                        );
                    }
                    self.apply_nic_state(
                        at_ms,
                        host,
                        nic,
                        NicReport {
                            observed_unix_ns: e.at_unix_ns,
                            state: *state,
                            link_up: *link_up,
                            carrier_changes: *carrier_changes,
                            flaps: *flaps,
                            penalty: *damping_penalty,
                            probes_lost: *probes_lost,
                        },
                    )
                }
                AgentEventKind::QpPlacement {
                    job,
                    rank,
                    conn_id,
                    nic,
                    peer_host,
                    peer_rank,
                    rail,
                    moved,
                    closed,
                } => {
                    let qp = Qp {
                        job: job.clone(),
                        rank: *rank,
                        conn_id: *conn_id,
                        nic: nic.clone(),
                        peer_host: peer_host.clone(),
                        peer_rank: *peer_rank,
                        rail: *rail,
                        moved: *moved,
                        since_ms: at_ms,
                    };
                    self.apply_qp(at_ms, host, qp, *closed)
                }
                AgentEventKind::QpReset => {
                    let n = self.qps.remove(host).map_or(0, |t| t.len());
                    if n > 0 {
                        self.log_event(
                            at_ms,
                            Some(host),
                            Event::AgentRestarted {
                                placements_forgotten: n as u64,
                            },
                        );
                    }
                }
                AgentEventKind::ReflexDone {
                    nic,
                    conns,
                    ok,
                    detail,
                } => {
                    self.log_observed(
                        at_ms,
                        Some(host),
                        Event::Reflex {
                            nic: nic.clone(),
                            conns: *conns,
                            ok: *ok,
                            detail: detail.clone(),
                        },
                        Some(e.at_unix_ns),
                    );
                }
                AgentEventKind::RankExited {
                    job,
                    incarnation,
                    rank,
                    exit_code,
                    signal,
                    detail,
                } => self.apply_rank_exited(
                    at_ms,
                    host,
                    job,
                    *incarnation,
                    *rank,
                    crate::model::jobs::Exit {
                        code: *exit_code,
                        signal: *signal,
                        detail: detail.clone(),
                    },
                ),
                AgentEventKind::RankCheckpoint {
                    job,
                    incarnation,
                    rank,
                    step,
                } => self.apply_rank_checkpoint(at_ms, host, job, *incarnation, *rank, *step),
            }
            through = e.seq;
            self.hosts.get_mut(host).expect("validated").last_event_seq = through;
        }
        Ok(CmdOk::Acked { through })
    }

    /// Records (or with `closed` removes) one connection's placement.
    pub(in crate::model) fn apply_qp(&mut self, at_ms: u64, host: &str, mut qp: Qp, closed: bool) {
        let key = QpKey {
            job: qp.job.clone(),
            rank: qp.rank,
            conn_id: qp.conn_id,
        };
        let table = self.qps.entry(host.to_owned()).or_default();
        if closed {
            table.remove(&key);
            if table.is_empty() {
                self.qps.remove(host);
            }
            return;
        }
        match table.get(&key) {
            Some(prev) if prev.nic == qp.nic => qp.since_ms = prev.since_ms,
            Some(_) => {}
            None if table.len() >= MAX_QPS_PER_HOST => {
                self.log_event(
                    at_ms,
                    Some(host),
                    Event::QpNotRecorded {
                        job: key.job.clone(),
                        rank: key.rank,
                        conn_id: key.conn_id,
                        limit: MAX_QPS_PER_HOST as u64,
                    },
                );
                return;
            }
            None => {}
        }
        table.insert(key, qp);
    }

    pub(in crate::model) fn apply_nic_state(
        &mut self,
        at_ms: u64,
        host: &str,
        nic_name: &str,
        r: NicReport,
    ) {
        let nic = self
            .hosts
            .get_mut(host)
            .and_then(|h| h.nics.get_mut(nic_name))
            .expect("validated");
        let prev = nic.state;
        let state = r.state;
        let link_changed = nic.link_up != Some(r.link_up);
        if link_changed {
            nic.link_up = Some(r.link_up);
            nic.link_transitions += 1;
        }
        nic.state = state;
        nic.carrier_changes = r.carrier_changes;
        nic.flaps = r.flaps;
        nic.damping_penalty = r.penalty;
        let changed = prev != state;
        if changed {
            nic.last_change_ms = at_ms;
        }
        let kind = match state {
            NicState::Down => Some(IncidentKind::NicDown),
            NicState::Flapping => Some(IncidentKind::NicFlapping),
            _ => None,
        };
        // Recovery closes the NIC's open incidents.
        let to_close = if changed && state == NicState::Up {
            std::mem::take(&mut nic.open_incidents)
        } else {
            BTreeMap::new()
        };
        let open_new = kind.filter(|k| changed && !nic.open_incidents.contains_key(k));
        if link_changed {
            self.log_observed(
                at_ms,
                Some(host),
                Event::NicLink {
                    nic: nic_name.to_owned(),
                    up: r.link_up,
                    probes_lost: r.probes_lost,
                    from: prev,
                    to: state,
                },
                Some(r.observed_unix_ns),
            );
        } else if changed {
            self.log_event(
                at_ms,
                Some(host),
                Event::NicState {
                    nic: nic_name.to_owned(),
                    from: prev,
                    to: state,
                },
            );
        }
        for id in to_close.into_values() {
            self.close_incident(at_ms, id, "nic_recovered");
        }
        if let Some(kind) = open_new {
            let id = self.open_incident(
                at_ms,
                kind,
                host,
                Some(nic_name),
                format!("{prev:?} -> {state:?}"),
            );
            self.hosts
                .get_mut(host)
                .and_then(|h| h.nics.get_mut(nic_name))
                .expect("validated")
                .open_incidents
                .insert(kind, id);
        }
    }
}
