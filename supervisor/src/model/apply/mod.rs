//! Applying a validated command: the per-command dispatch and admin
//! operations on hosts.

mod agent_events;
mod incidents;
mod intents;
mod remove;

use crate::model::admin::{AdminOp, AdminRecord};
use crate::model::command::Command;
use crate::model::events::Event;
use crate::model::hosts::{
    failover_target, probe_view, Drain, DrainPhase, HeldOut, Host, HostClockRecord, Liveness, Nic,
    NicState,
};
use crate::model::incidents::IncidentKind;
use crate::model::intents::{Action, Outcome};
use crate::model::limits::MAX_ADMIN_HISTORY;
use crate::model::probe_graph::{join_seed, PROBE_DEGREE};
use crate::model::result::{CmdOk, CmdResult};
use crate::model::state::ClusterState;
use std::collections::BTreeMap;

impl ClusterState {
    pub(in crate::model) fn apply_valid(
        &mut self,
        index: u64,
        at_ms: u64,
        cmd: &Command,
    ) -> CmdResult {
        match cmd {
            Command::RegisterHost { host, nics, labels } => {
                let existing = self.hosts.get(host).cloned();
                let mut h = existing.clone().unwrap_or(Host {
                    name: host.clone(),
                    id: self.next_host_id,
                    labels: BTreeMap::new(),
                    nics: BTreeMap::new(),
                    cordoned: false,
                    drain: None,
                    liveness: Liveness::Ready,
                    registered_ms: at_ms,
                    last_event_seq: 0,
                    open_incident: None,
                    clock: HostClockRecord::default(),
                    owd_excluded: false,
                    clock_incident: None,
                    // Newer than any set an agent of an earlier host of
                    // this name may still hold.
                    held_version: index,
                    cut_off_incident: None,
                    path_incidents: Default::default(),
                });
                let probe_view_before = existing.as_ref().map(probe_view);
                let mut new_nics = BTreeMap::new();
                for spec in nics {
                    let mut nic = h.nics.remove(&spec.name).unwrap_or(Nic {
                        name: spec.name.clone(),
                        rail: None,
                        backup: None,
                        rdma_device: None,
                        addr: None,
                        state: NicState::Unknown,
                        flaps: 0,
                        damping_penalty: 0.0,
                        carrier_changes: 0,
                        last_change_ms: at_ms,
                        open_incidents: BTreeMap::new(),
                        link_up: None,
                        link_transitions: 0,
                        held_out: None,
                    });
                    nic.rail = spec.rail;
                    nic.backup = spec.backup.clone();
                    nic.rdma_device = spec.rdma_device.clone();
                    nic.addr = spec.addr.clone();
                    new_nics.insert(spec.name.clone(), nic);
                }
                let held_before = h.held_out_nics();
                h.nics = new_nics;
                if h.held_out_nics() != held_before {
                    h.held_version = index;
                }
                // The agent flushed its detour routes when it started.
                self.reroutes.remove(host);
                for (k, v) in labels {
                    h.labels.insert(k.clone(), v.clone());
                }
                let last = h.last_event_seq;
                let changed = existing.as_ref() != Some(&h);
                let host_name = host.clone();
                let id = h.id;
                if probe_view_before.as_ref() != Some(&probe_view(&h)) {
                    self.probe_plan_version += 1;
                }
                self.hosts.insert(host.clone(), h);
                if existing.is_none() {
                    self.next_host_id += 1;
                    self.host_ids.insert(id, host.clone());
                    let seed = join_seed(host, self.probe_graph.len());
                    let change = self.probe_graph.join(id, PROBE_DEGREE, seed);
                    self.log_event(
                        at_ms,
                        Some(host),
                        Event::HostRegistered {
                            nics: nics.len() as u32,
                            probe_id: id,
                            edges_added: change.added.len() as u32,
                            edges_split: change.removed.len() as u32,
                        },
                    );
                } else if changed {
                    self.log_event(at_ms, Some(host), Event::HostReRegistered);
                }
                // Its data NICs may have changed.
                self.cut_off_incidents(at_ms, &host_name);
                self.path_incidents(at_ms, &host_name);
                Ok(CmdOk::Registered {
                    last_applied_seq: last,
                })
            }
            Command::Admin { actor, op, .. } => {
                let Some(host_name) = op.host() else {
                    let what = match op {
                        AdminOp::Job(jop) => self.apply_job_op(at_ms, jop, actor),
                        AdminOp::PlaybookApply { files } => {
                            self.apply_playbooks(at_ms, actor, files)
                        }
                        AdminOp::PlaybookDelete { name } => {
                            self.playbooks.remove(name);
                            self.playbook_version += 1;
                            format!("playbook {name} deleted")
                        }
                        AdminOp::Refused { request, needed } => {
                            format!("refused {request}: needs role {needed}")
                        }
                        AdminOp::Revoke { serial, .. } => {
                            if self.revoked.insert(serial.clone()) {
                                format!("certificate {serial} revoked")
                            } else {
                                format!("certificate {serial} was already revoked")
                            }
                        }
                        AdminOp::MemberAdded { id, addr } => {
                            format!("supervisor {id} at {addr} joined as a voter")
                        }
                        AdminOp::MemberRemoved { id } => format!("supervisor {id} removed"),
                        _ => unreachable!("only cluster-wide operations have no host"),
                    };
                    self.record_admin(index, at_ms, actor, op);
                    let event = Event::Admin {
                        action: op.action(),
                        what,
                        by: actor.clone(),
                    };
                    self.log_event(at_ms, None, event);
                    return Ok(CmdOk::Done);
                };
                if let AdminOp::RemoveHost { host } = op {
                    let closed = self.remove_host(at_ms, host);
                    self.record_admin(index, at_ms, actor, op);
                    self.log_event(
                        at_ms,
                        Some(host),
                        Event::Admin {
                            action: op.action(),
                            what: format!(
                                "removed from the cluster ({closed} open incidents closed)"
                            ),
                            by: actor.clone(),
                        },
                    );
                    return Ok(CmdOk::Done);
                }
                if let AdminOp::ShapeClear { host } = op {
                    let dropped = self.clear_host_shapes(host);
                    let applied = self.applied_shapes.get(host).map_or(0, |m| m.len());
                    self.record_admin(index, at_ms, actor, op);
                    self.log_event(
                        at_ms,
                        Some(host),
                        Event::ShapesCleared {
                            dropped: dropped as u64,
                            to_remove: applied as u64,
                            by: actor.clone(),
                        },
                    );
                    return Ok(CmdOk::Done);
                }
                let host = self.hosts.get_mut(host_name).expect("validated");
                let mut order = None;
                let what = match op {
                    AdminOp::Cordon { .. } => {
                        host.cordoned = true;
                        "cordoned".to_string()
                    }
                    AdminOp::Uncordon { .. } => {
                        host.cordoned = false;
                        "uncordoned".to_string()
                    }
                    AdminOp::Drain {
                        reason,
                        deadline_ms,
                        ..
                    } => {
                        let cordoned_before = host.cordoned;
                        host.cordoned = true;
                        if host.drain.is_none() {
                            host.drain = Some(Drain {
                                phase: DrainPhase::Draining,
                                reason: reason.clone(),
                                deadline_ms: *deadline_ms,
                                by: actor.clone(),
                                since_ms: at_ms,
                                cordoned_before,
                            });
                            format!("draining: {reason}")
                        } else {
                            "drain requested again (already draining)".to_string()
                        }
                    }
                    AdminOp::Undrain { .. } => {
                        host.cordoned = false;
                        host.drain = None;
                        "undrained, back in service".to_string()
                    }
                    AdminOp::SetLabels { set, remove, .. } => {
                        for k in remove {
                            host.labels.remove(k);
                        }
                        for (k, v) in set {
                            host.labels.insert(k.clone(), v.clone());
                        }
                        format!("labels: {} set, {} removed", set.len(), remove.len())
                    }
                    AdminOp::NicFailover { nic, to, .. } => {
                        let target = failover_target(host, nic, to.as_deref()).expect("validated");
                        let n = host.nics.get_mut(nic).expect("validated");
                        if n.held_out.is_none() {
                            n.held_out = Some(HeldOut {
                                by: actor.clone(),
                                since_ms: at_ms,
                            });
                            host.held_version = index;
                        }
                        let what = format!(
                            "failover of NIC {nic} to {target} ordered; {nic} held out of \
                             service until `nic failback`"
                        );
                        order = Some(Action::Failover {
                            host: host.name.clone(),
                            nic: nic.clone(),
                            to: target,
                            version: host.held_version,
                        });
                        what
                    }
                    AdminOp::NicFailback { nic, .. } => {
                        let n = host.nics.get_mut(nic).expect("validated");
                        let released = n.held_out.take().is_some();
                        if released {
                            host.held_version = index;
                        }
                        order = Some(Action::Failback {
                            host: host.name.clone(),
                            nic: nic.clone(),
                            version: host.held_version,
                        });
                        if released {
                            format!("failback to NIC {nic} ordered; {nic} back in service")
                        } else {
                            format!("failback to NIC {nic} ordered")
                        }
                    }
                    AdminOp::Job(_)
                    | AdminOp::PlaybookApply { .. }
                    | AdminOp::PlaybookDelete { .. }
                    | AdminOp::Refused { .. }
                    | AdminOp::Revoke { .. }
                    | AdminOp::MemberAdded { .. }
                    | AdminOp::MemberRemoved { .. } => {
                        unreachable!("cluster-wide operations have no host")
                    }
                    AdminOp::ShapeClear { .. } | AdminOp::RemoveHost { .. } => {
                        unreachable!("applied above")
                    }
                };
                let host_name = host_name.to_owned();
                self.record_admin(index, at_ms, actor, op);
                self.log_event(
                    at_ms,
                    Some(&host_name),
                    Event::Admin {
                        action: op.action(),
                        what,
                        by: actor.clone(),
                    },
                );
                match order {
                    Some(action) => Ok(CmdOk::IntentOpened {
                        id: self.open_intent(at_ms, &action),
                    }),
                    None => Ok(CmdOk::Done),
                }
            }
            Command::AgentEvents { host, events } => self.apply_agent_events(at_ms, host, events),
            Command::SetLiveness { host, liveness } => {
                let h = self.hosts.get_mut(host).expect("validated");
                let prev = h.liveness;
                if prev == *liveness {
                    return Ok(CmdOk::Done);
                }
                h.liveness = *liveness;
                let open = h.open_incident.take();
                self.log_event(
                    at_ms,
                    Some(host),
                    Event::Liveness {
                        from: prev,
                        to: *liveness,
                    },
                );
                match liveness {
                    Liveness::Down => {
                        let id = self.open_incident(
                            at_ms,
                            IncidentKind::HostDown,
                            host,
                            None,
                            "missed heartbeats and no probe evidence".into(),
                        );
                        self.hosts.get_mut(host).expect("validated").open_incident = Some(id);
                        // The playbook for host_down (the shipped
                        // host-down.toml restarts the jobs) handles it;
                        // nothing is hard-wired beside it.
                        let what = Event::HostDownHandled {
                            playbook: self.playbook_for(id).map(|(pb, _)| pb.name),
                        };
                        self.log_event(at_ms, Some(host), what);
                    }
                    _ => {
                        if let Some(id) = open {
                            self.close_incident(at_ms, id, "host is back");
                        }
                        if prev == Liveness::Down {
                            self.jobs_host_back(host);
                        }
                    }
                }
                Ok(CmdOk::Done)
            }
            Command::SetClockStates { changes } => {
                for c in changes {
                    let h = self.hosts.get_mut(&c.host).expect("validated");
                    let prev = h.clock.state;
                    if prev == c.state {
                        continue;
                    }
                    h.clock = HostClockRecord {
                        state: c.state,
                        offset_ns: c.offset_ns,
                        error_bound_ns: c.error_bound_ns,
                        changed_ms: at_ms,
                    };
                    self.log_event(
                        at_ms,
                        Some(&c.host),
                        Event::Clock {
                            from: prev,
                            to: c.state,
                            offset_ns: c.offset_ns,
                            error_bound_ns: c.error_bound_ns,
                        },
                    );
                    self.clock_incidents(at_ms, &c.host, prev, c.state);
                }
                Ok(CmdOk::Done)
            }
            Command::OpenIntent { action } => Ok(CmdOk::IntentOpened {
                id: self.open_intent(at_ms, action),
            }),
            Command::CloseIntent { id, outcome } => {
                self.close_intent(at_ms, *id, outcome.clone(), "", None)
            }
            Command::OrderDone { id, outcome, .. } => {
                let closed = if outcome.ok() {
                    Outcome::Done
                } else {
                    Outcome::Failed {
                        error: outcome.detail().to_owned(),
                    }
                };
                self.close_intent(at_ms, *id, closed, outcome.detail(), outcome.step())
            }
            Command::Job(c) => self.apply_job_command(at_ms, c),
            Command::Playbook(c) => self.apply_run_command(at_ms, c),
            Command::InstallShippedPlaybooks { files } => {
                self.install_shipped_playbooks(at_ms, files);
                Ok(CmdOk::Done)
            }
            Command::WebhookDone { id, ok, detail } => {
                let outcome = if *ok {
                    Outcome::Done
                } else {
                    Outcome::Failed {
                        error: detail.clone(),
                    }
                };
                self.close_intent(at_ms, *id, outcome, detail, None)
            }
            Command::Contention(c) => {
                crate::model::shaping::apply(self, at_ms, c);
                Ok(CmdOk::Done)
            }
        }
    }

    pub(in crate::model) fn record_admin(
        &mut self,
        index: u64,
        at_ms: u64,
        actor: &str,
        op: &AdminOp,
    ) {
        self.admin_history.push_back(AdminRecord {
            at_ms,
            actor: actor.to_owned(),
            op: op.clone(),
            log_index: index,
        });
        while self.admin_history.len() > MAX_ADMIN_HISTORY {
            self.admin_history.pop_front();
        }
    }
}
