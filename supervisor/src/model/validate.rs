//! `ClusterState::validate`: every command checked against the state
//! without changing anything (before proposing, and again at apply).

use crate::model::admin::AdminOp;
use crate::model::command::Command;
use crate::model::hosts::{check_failback, failover_target};
use crate::model::intents::Action;
use crate::model::limits::{
    MAX_CLOCK_CHANGES, MAX_NAME_LEN, MAX_NICS, MAX_REASON_LEN, MAX_REVOKED,
};
use crate::model::result::{check_labels, check_name, not_found, CmdError};
use crate::model::state::ClusterState;
use proto::agent::Report;

impl ClusterState {
    /// Checks a command against the current state without changing anything.
    pub fn validate(&self, cmd: &Command) -> Result<(), CmdError> {
        match cmd {
            Command::RegisterHost { host, nics, labels } => {
                check_name("host name", host)?;
                if !self.hosts.contains_key(host) && self.next_host_id == u32::MAX {
                    return Err(CmdError::FailedPrecondition(
                        "no host ids left to give".into(),
                    ));
                }
                if nics.len() > MAX_NICS {
                    return Err(CmdError::InvalidArgument(format!(
                        "a host may register at most {MAX_NICS} NICs"
                    )));
                }
                let mut seen = std::collections::BTreeSet::new();
                for n in nics {
                    check_name("NIC name", &n.name)?;
                    if !seen.insert(n.name.as_str()) {
                        return Err(CmdError::InvalidArgument(format!(
                            "NIC {:?} listed twice",
                            n.name
                        )));
                    }
                    if let Some(a) = &n.addr {
                        if a.parse::<std::net::IpAddr>().is_err() {
                            return Err(CmdError::InvalidArgument(format!(
                                "address {a:?} of NIC {:?} is not an IP address",
                                n.name
                            )));
                        }
                    }
                }
                for n in nics {
                    if let Some(b) = &n.backup {
                        if !seen.contains(b.as_str()) || b == &n.name {
                            return Err(CmdError::InvalidArgument(format!(
                                "backup {b:?} of NIC {:?} is not another NIC of the host",
                                n.name
                            )));
                        }
                    }
                }
                check_labels(labels, &[])
            }
            Command::Admin {
                actor, op, request, ..
            } => {
                if let Some(r) = request {
                    if r.client.is_empty() || r.client.len() > MAX_NAME_LEN {
                        return Err(CmdError::InvalidArgument(
                            "request client id must be 1..253 bytes".into(),
                        ));
                    }
                }
                if actor.is_empty() || actor.len() > MAX_NAME_LEN {
                    return Err(CmdError::InvalidArgument(
                        "actor must be 1..253 bytes".into(),
                    ));
                }
                let Some(host_name) = op.host() else {
                    return match op {
                        AdminOp::Job(jop) => self.validate_job_op(jop),
                        AdminOp::PlaybookApply { files } => {
                            self.playbooks_after_apply(files).map(|_| ())
                        }
                        AdminOp::PlaybookDelete { name } => self.validate_playbook_delete(name),
                        AdminOp::Revoke { serial, reason } => {
                            let hex = !serial.is_empty()
                                && serial.len() <= 40
                                && serial
                                    .chars()
                                    .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c));
                            if !hex {
                                return Err(CmdError::InvalidArgument(format!(
                                    "serial {serial:?} is not a certificate serial (lowercase hex, at most 40 digits; `railguard pki show FILE` prints it)"
                                )));
                            }
                            if reason.len() > MAX_REASON_LEN {
                                return Err(CmdError::InvalidArgument(format!(
                                    "reason is longer than {MAX_REASON_LEN} bytes"
                                )));
                            }
                            if self.revoked.len() >= MAX_REVOKED && !self.revoked.contains(serial) {
                                return Err(CmdError::FailedPrecondition(format!(
                                    "{MAX_REVOKED} serials are revoked already; rotate the cluster CA instead"
                                )));
                            }
                            Ok(())
                        }
                        AdminOp::MemberAdded { addr, .. } => {
                            if addr.len() > MAX_REASON_LEN {
                                return Err(CmdError::InvalidArgument(format!(
                                    "a member address is longer than {MAX_REASON_LEN} bytes"
                                )));
                            }
                            Ok(())
                        }
                        AdminOp::MemberRemoved { .. } => Ok(()),
                        AdminOp::Refused { request, needed } => {
                            if request.len() > MAX_REASON_LEN || needed.len() > MAX_REASON_LEN {
                                return Err(CmdError::InvalidArgument(format!(
                                    "a refusal's text is longer than {MAX_REASON_LEN} bytes"
                                )));
                            }
                            Ok(())
                        }
                        _ => unreachable!("only cluster-wide operations have no host"),
                    };
                };
                let host = self
                    .hosts
                    .get(host_name)
                    .ok_or_else(|| not_found("host", host_name))?;
                match op {
                    AdminOp::Uncordon { .. } if host.drain.is_some() => {
                        Err(CmdError::FailedPrecondition(format!(
                            "host {:?} is {}; use `node undrain` to return it to service",
                            host.name,
                            host.status()
                        )))
                    }
                    AdminOp::Drain { reason, .. } => {
                        if reason.trim().is_empty() {
                            Err(CmdError::InvalidArgument(
                                "drain needs a non-empty reason".into(),
                            ))
                        } else if reason.len() > MAX_REASON_LEN {
                            Err(CmdError::InvalidArgument(format!(
                                "drain reason is longer than {MAX_REASON_LEN} bytes"
                            )))
                        } else {
                            Ok(())
                        }
                    }
                    AdminOp::SetLabels { set, remove, .. } => {
                        for k in remove {
                            check_name("label key", k)?;
                        }
                        check_labels(set, &[&host.labels])
                    }
                    AdminOp::NicFailover { nic, to, .. } => {
                        failover_target(host, nic, to.as_deref()).map(|_| ())
                    }
                    // A held NIC may be released whatever its state (the
                    // agent moves nothing back to a NIC that is down).
                    AdminOp::NicFailback { nic, .. }
                        if host.nics.get(nic).is_some_and(|n| n.held_out.is_some()) =>
                    {
                        Ok(())
                    }
                    AdminOp::NicFailback { nic, .. } => check_failback(host, nic),
                    AdminOp::RemoveHost { .. } => self.check_removable(host),
                    _ => Ok(()),
                }
            }
            Command::AgentEvents { host, events } => {
                let h = self
                    .hosts
                    .get(host)
                    .ok_or_else(|| not_found("host", host))?;
                for e in events {
                    match &e.report {
                        Report::Nic(r) => {
                            if !h.nics.contains_key(&r.nic) {
                                return Err(not_found("NIC", &format!("{host}/{}", r.nic)));
                            }
                        }
                        Report::Qp(q) => {
                            check_name("job name", &q.job)?;
                            check_name("NIC name", &q.nic)?;
                            check_name("peer host", &q.peer_host)?;
                        }
                        Report::QpReset { .. } => {}
                        Report::Reflex(r) => {
                            check_name("NIC name", &r.nic)?;
                            if r.detail.len() > MAX_REASON_LEN {
                                return Err(CmdError::InvalidArgument(format!(
                                    "reflex detail is longer than {MAX_REASON_LEN} bytes"
                                )));
                            }
                        }
                        Report::RankExited(r) => {
                            check_name("job name", &r.job)?;
                            if r.detail.len() > MAX_REASON_LEN {
                                return Err(CmdError::InvalidArgument(format!(
                                    "exit detail is longer than {MAX_REASON_LEN} bytes"
                                )));
                            }
                        }
                        Report::RankCheckpoint(r) => {
                            check_name("job name", &r.job)?;
                        }
                        Report::ConnStalled(r) => {
                            check_name("job name", &r.job)?;
                            check_name("peer host", &r.peer_host)?;
                        }
                    }
                }
                Ok(())
            }
            Command::SetLiveness { host, .. } => {
                if !self.hosts.contains_key(host) {
                    return Err(not_found("host", host));
                }
                Ok(())
            }
            Command::SetClockStates { changes } => {
                if changes.len() > MAX_CLOCK_CHANGES {
                    return Err(CmdError::InvalidArgument(format!(
                        "at most {MAX_CLOCK_CHANGES} clock changes per command"
                    )));
                }
                let mut seen = std::collections::BTreeSet::new();
                for c in changes {
                    if !self.hosts.contains_key(&c.host) {
                        return Err(not_found("host", &c.host));
                    }
                    if !seen.insert(c.host.as_str()) {
                        return Err(CmdError::InvalidArgument(format!(
                            "clock change for host {:?} listed twice",
                            c.host
                        )));
                    }
                    let finite = |v: Option<f64>| v.is_none_or(f64::is_finite);
                    if !finite(c.offset_ns)
                        || !finite(c.error_bound_ns)
                        || c.error_bound_ns.is_some_and(|b| b < 0.0)
                    {
                        return Err(CmdError::InvalidArgument(format!(
                            "clock figures of host {:?} must be finite (error bound ≥ 0)",
                            c.host
                        )));
                    }
                }
                Ok(())
            }
            Command::OpenIntent { action } => {
                let host = self
                    .hosts
                    .get(action.host())
                    .ok_or_else(|| not_found("host", action.host()))?;
                match action {
                    Action::CompleteDrain { .. } => Ok(()),
                    Action::Failover { nic, to, .. } => {
                        failover_target(host, nic, Some(to)).map(|_| ())
                    }
                    Action::Failback { nic, .. } => check_failback(host, nic),
                    Action::StartRank { job, .. }
                    | Action::StopJob { job, .. }
                    | Action::CheckpointJob { job, .. } => {
                        if !self.jobs.contains_key(job) {
                            return Err(not_found("job", job));
                        }
                        Ok(())
                    }
                    Action::PlaybookStep { .. } => Err(CmdError::InvalidArgument(
                        "playbook steps are opened by their run, not on their own".into(),
                    )),
                    Action::ShapeNic { nic, .. } | Action::ClearShape { nic, .. } => {
                        if !host.nics.contains_key(nic) {
                            return Err(not_found("NIC", nic));
                        }
                        Ok(())
                    }
                    Action::Reroute { host, digest } => {
                        let want = crate::model::reroute::order_digest(self, host);
                        if want != *digest {
                            return Err(CmdError::FailedPrecondition(format!(
                                "the detour routes of {host} are no longer the set #{digest:016x}"
                            )));
                        }
                        Ok(())
                    }
                }
            }
            Command::CloseIntent { id, .. } => match self.intents.get(id) {
                None => Err(not_found("intent", &id.to_string())),
                Some(_) => Ok(()),
            },
            Command::OrderDone { host, id, outcome } => {
                if outcome.detail().len() > MAX_REASON_LEN {
                    return Err(CmdError::InvalidArgument(format!(
                        "order detail is longer than {MAX_REASON_LEN} bytes"
                    )));
                }
                let intent = self
                    .intents
                    .get(id)
                    .ok_or_else(|| not_found("intent", &id.to_string()))?;
                if !intent.action.is_order() || intent.action.host() != host {
                    return Err(CmdError::InvalidArgument(format!(
                        "intent {id} is not an order for host {host:?}"
                    )));
                }
                Ok(())
            }
            Command::Job(c) => self.validate_job_command(c),
            Command::Playbook(c) => self.validate_run_command(c),
            Command::InstallShippedPlaybooks { .. } => Ok(()),
            Command::Contention(c) => {
                crate::model::shaping::validate(self, c).map_err(CmdError::InvalidArgument)
            }
            Command::WebhookDone { id, detail, .. } => {
                if detail.len() > MAX_REASON_LEN {
                    return Err(CmdError::InvalidArgument(format!(
                        "webhook detail is longer than {MAX_REASON_LEN} bytes"
                    )));
                }
                let intent = self
                    .intents
                    .get(id)
                    .ok_or_else(|| not_found("intent", &id.to_string()))?;
                match &intent.action {
                    Action::PlaybookStep {
                        op:
                            crate::model::runs::StepOp::Notify {
                                webhook: Some(_), ..
                            },
                        ..
                    } => Ok(()),
                    _ => Err(CmdError::InvalidArgument(format!(
                        "intent {id} is not a webhook notification"
                    ))),
                }
            }
        }
    }
}
