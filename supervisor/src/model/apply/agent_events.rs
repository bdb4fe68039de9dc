//! Agent events applied exactly once, in sequence: NIC states, connection
//! placements, reflex outcomes, rank exits and checkpoints.

use crate::model::events::{AgentEvent, Event};
#[cfg(doc)]
use crate::model::hosts::Nic;
use crate::model::limits::MAX_QPS_PER_HOST;
use crate::model::qps::{Qp, QpKey};
use crate::model::result::{CmdError, CmdOk, CmdResult};
use crate::model::state::ClusterState;
use proto::agent::{NicReport, Report};

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
            match &e.report {
                Report::Nic(r) => self.apply_nic_report(at_ms, host, r),
                Report::Qp(q) => {
                    let qp = Qp {
                        job: q.job.clone(),
                        rank: q.rank,
                        conn_id: q.conn_id,
                        nic: q.nic.clone(),
                        peer_host: q.peer_host.clone(),
                        peer_rank: q.peer_rank,
                        rail: q.rail,
                        moved: q.moved,
                        since_ms: at_ms,
                    };
                    self.apply_qp(at_ms, host, qp, q.closed)
                }
                Report::QpReset { .. } => {
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
                Report::Reflex(r) => {
                    self.log_observed(
                        at_ms,
                        Some(host),
                        Event::Reflex {
                            nic: r.nic.clone(),
                            conns: r.conns,
                            ok: r.ok,
                            detail: r.detail.clone(),
                        },
                        Some(r.at_unix_ns),
                    );
                }
                Report::RankExited(r) => self.apply_rank_exited(
                    at_ms,
                    host,
                    &r.job,
                    r.incarnation,
                    r.rank,
                    crate::model::jobs::Exit {
                        code: r.exit_code,
                        signal: r.signal,
                        detail: r.detail.clone(),
                    },
                ),
                Report::RankCheckpoint(c) => {
                    self.apply_rank_checkpoint(at_ms, host, &c.job, c.incarnation, c.rank, c.step)
                }
                Report::ConnStalled(c) => self.conn_stalled(at_ms, host, c),
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

    /// Applies a NIC report to its NIC ([`Nic::apply_report`]) and then
    /// the effects it returns: log lines, incidents closed and opened.
    fn apply_nic_report(&mut self, at_ms: u64, host: &str, r: &NicReport) {
        let nic = self
            .hosts
            .get_mut(host)
            .and_then(|h| h.nics.get_mut(&r.nic))
            .expect("validated");
        let t = nic.apply_report(at_ms, r);
        if r.coalesced > 0 {
            self.log_event(
                at_ms,
                Some(host),
                Event::NicCoalesced {
                    nic: r.nic.clone(),
                    transitions: r.coalesced,
                },
            );
        }
        if t.link_changed {
            self.log_observed(
                at_ms,
                Some(host),
                Event::NicLink {
                    nic: r.nic.clone(),
                    up: r.link_up,
                    probes_lost: r.probes_lost,
                    from: t.from,
                    to: t.to,
                },
                Some(r.at_unix_ns),
            );
        } else if t.from != t.to {
            self.log_event(
                at_ms,
                Some(host),
                Event::NicState {
                    nic: r.nic.clone(),
                    from: t.from,
                    to: t.to,
                },
            );
        }
        for id in t.close.into_values() {
            self.close_incident(at_ms, id, "nic_recovered");
        }
        if let Some(kind) = t.open {
            let detail = format!("{:?} -> {:?}", t.from, t.to);
            let id = self.open_incident(at_ms, kind, host, Some(&r.nic), detail);
            self.hosts
                .get_mut(host)
                .and_then(|h| h.nics.get_mut(&r.nic))
                .expect("validated")
                .open_incidents
                .insert(kind, id);
        }
        if t.from != t.to {
            self.cut_off_incidents(at_ms, host);
            self.path_incidents(at_ms, host);
            // The peers' detours in the same entry (opened once, at its
            // end): a connection through this NIC stalls until they are
            // in, and a round of its own would cost a second commit.
            self.reroute_pending = true;
        }
    }
}
