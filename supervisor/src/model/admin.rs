//! Admin operations as they are proposed and recorded.

use crate::model::jobs::types::JobOp;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Admin operations on hosts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum AdminOp {
    /// Mark the host unschedulable.
    Cordon {
        host: String,
    },
    /// Make the host schedulable again (not while it is draining).
    Uncordon {
        host: String,
    },
    /// Cordon, move the host's work away, then mark it Drained.
    Drain {
        host: String,
        reason: String,
        /// Unix ms after which remaining work is stopped.
        deadline_ms: Option<u64>,
    },
    /// Return a draining or drained host to service (also uncordons).
    Undrain {
        host: String,
    },
    /// Set and remove labels.
    SetLabels {
        host: String,
        set: BTreeMap<String, String>,
        remove: Vec<String>,
    },
    /// Move every connection off a NIC, to `to` (default: the NIC's backup).
    /// Opens a `Failover` intent; the leader orders the host's agent.
    NicFailover {
        host: String,
        nic: String,
        to: Option<String>,
    },
    /// Move the connections whose home is the NIC back to it (a `Failback`
    /// intent).
    NicFailback {
        host: String,
        nic: String,
    },
    /// Submit, cancel, restart or checkpoint a job.
    Job(JobOp),
    /// Store playbooks (atomically: all or none).
    PlaybookApply {
        files: Vec<crate::model::playbook_store::PlaybookFile>,
    },
    PlaybookDelete {
        name: String,
    },
    /// Drop every desired shape of the host; the reconciler then orders
    /// its agent to remove what it installed (the incident stays open).
    ShapeClear {
        host: String,
    },
    /// A call this actor's certificate does not allow: recorded in the
    /// history (no other effect). `request` names what was asked, `needed`
    /// the role it takes.
    Refused {
        request: String,
        needed: String,
    },
    /// Revoke a certificate by serial (lowercase hex): every supervisor
    /// refuses it from the next handshake and call on.
    Revoke {
        serial: String,
        reason: String,
    },
    /// A record (no other effect) of a membership change, which Raft makes
    /// through its own protocol: supervisor `id` at `addr` became a voter.
    /// Written by the leader after the change, never taken from a client.
    MemberAdded {
        id: u64,
        addr: String,
    },
    /// A record of supervisor `id` leaving the membership.
    MemberRemoved {
        id: u64,
    },
    /// Forget a decommissioned host: only a Drained or Down host with no
    /// job, rank or open order on it. Its open incidents close; an agent
    /// of that name that registers later is a new host.
    RemoveHost {
        host: String,
    },
}

impl AdminOp {
    /// One line for replies and `railguard history` (file texts and job
    /// specs are summarised, not dumped).
    pub fn summary(&self) -> String {
        match self {
            AdminOp::PlaybookApply { files } => format!(
                "playbook apply: {}",
                files
                    .iter()
                    .map(|f| f.file.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            AdminOp::PlaybookDelete { name } => format!("playbook delete {name}"),
            AdminOp::Job(JobOp::Submit { spec }) => format!(
                "job submit {} ({} ranks: {})",
                spec.name,
                spec.ranks,
                spec.command.join(" ")
            ),
            AdminOp::Job(JobOp::Cancel { job }) => format!("job cancel {job}"),
            AdminOp::Job(JobOp::Restart { job, reason }) => format!("job restart {job}: {reason}"),
            AdminOp::Job(JobOp::Checkpoint { job }) => format!("job checkpoint {job}"),
            AdminOp::Cordon { host } => format!("node cordon {host}"),
            AdminOp::Uncordon { host } => format!("node uncordon {host}"),
            AdminOp::Drain {
                host,
                reason,
                deadline_ms,
            } => match deadline_ms {
                Some(ms) => format!(
                    "node drain {host}: {reason} (deadline {})",
                    utc_seconds(*ms)
                ),
                None => format!("node drain {host}: {reason}"),
            },
            AdminOp::Undrain { host } => format!("node undrain {host}"),
            AdminOp::SetLabels { host, set, remove } => {
                let mut parts: Vec<String> = set.iter().map(|(k, v)| format!("{k}={v}")).collect();
                parts.extend(remove.iter().map(|k| format!("-{k}")));
                format!("node label {host} {}", parts.join(" "))
            }
            AdminOp::NicFailover { host, nic, to } => match to {
                Some(to) => format!("nic failover {host}/{nic} to {to}"),
                None => format!("nic failover {host}/{nic}"),
            },
            AdminOp::NicFailback { host, nic } => format!("nic failback {host}/{nic}"),
            AdminOp::ShapeClear { host } => format!("shape clear {host}"),
            AdminOp::Refused { request, needed } => {
                format!("refused: {request} (needs role {needed})")
            }
            AdminOp::Revoke { serial, reason } => format!("pki revoke {serial}: {reason}"),
            AdminOp::MemberAdded { id, addr } => format!("cluster add-member {id} {addr}"),
            AdminOp::MemberRemoved { id } => format!("cluster remove-member {id}"),
            AdminOp::RemoveHost { host } => format!("node remove {host}"),
        }
    }

    /// The host the operation targets (none for job operations).
    pub fn host(&self) -> Option<&str> {
        match self {
            AdminOp::Cordon { host }
            | AdminOp::Uncordon { host }
            | AdminOp::Drain { host, .. }
            | AdminOp::Undrain { host }
            | AdminOp::SetLabels { host, .. }
            | AdminOp::NicFailover { host, .. }
            | AdminOp::NicFailback { host, .. }
            | AdminOp::ShapeClear { host }
            | AdminOp::RemoveHost { host } => Some(host),
            AdminOp::Job(_)
            | AdminOp::PlaybookApply { .. }
            | AdminOp::PlaybookDelete { .. }
            | AdminOp::Refused { .. }
            | AdminOp::Revoke { .. }
            | AdminOp::MemberAdded { .. }
            | AdminOp::MemberRemoved { .. } => None,
        }
    }

    /// Operations the supervisor records itself (a refusal, a membership
    /// change): an admin may not write them, or the history could be
    /// forged.
    pub fn is_record_only(&self) -> bool {
        matches!(
            self,
            AdminOp::Refused { .. } | AdminOp::MemberAdded { .. } | AdminOp::MemberRemoved { .. }
        )
    }
}

/// One admin operation as recorded (who, when, what).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AdminRecord {
    pub at_ms: u64,
    pub actor: String,
    pub op: AdminOp,
    pub log_index: u64,
}

/// Which admin operation an event records (the operation without its
/// arguments, so the event log does not copy playbook texts).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AdminAction {
    Cordon,
    Uncordon,
    Drain,
    Undrain,
    SetLabels,
    NicFailover,
    NicFailback,
    Job,
    PlaybookApply,
    PlaybookDelete,
    ShapeClear,
    Refused,
    Revoke,
    MemberAdded,
    MemberRemoved,
    RemoveHost,
}

impl AdminOp {
    /// The operation without its arguments.
    pub fn action(&self) -> AdminAction {
        match self {
            AdminOp::Cordon { .. } => AdminAction::Cordon,
            AdminOp::Uncordon { .. } => AdminAction::Uncordon,
            AdminOp::Drain { .. } => AdminAction::Drain,
            AdminOp::Undrain { .. } => AdminAction::Undrain,
            AdminOp::SetLabels { .. } => AdminAction::SetLabels,
            AdminOp::NicFailover { .. } => AdminAction::NicFailover,
            AdminOp::NicFailback { .. } => AdminAction::NicFailback,
            AdminOp::Job(_) => AdminAction::Job,
            AdminOp::PlaybookApply { .. } => AdminAction::PlaybookApply,
            AdminOp::PlaybookDelete { .. } => AdminAction::PlaybookDelete,
            AdminOp::Refused { .. } => AdminAction::Refused,
            AdminOp::Revoke { .. } => AdminAction::Revoke,
            AdminOp::MemberAdded { .. } => AdminAction::MemberAdded,
            AdminOp::MemberRemoved { .. } => AdminAction::MemberRemoved,
            AdminOp::ShapeClear { .. } => AdminAction::ShapeClear,
            AdminOp::RemoveHost { .. } => AdminAction::RemoveHost,
        }
    }
}

/// Unix ms as RFC 3339 to the second, UTC.
fn utc_seconds(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_admin_op_reads_as_a_command_not_debug_text() {
        let ops = [
            AdminOp::Drain {
                host: "h3".into(),
                reason: "bad fan".into(),
                deadline_ms: Some(1_795_572_192_860),
            },
            AdminOp::SetLabels {
                host: "h1".into(),
                set: BTreeMap::from([("rack".to_string(), "a".to_string())]),
                remove: vec!["old".into()],
            },
            AdminOp::NicFailover {
                host: "h1".into(),
                nic: "rail0".into(),
                to: None,
            },
            AdminOp::Job(JobOp::Cancel { job: "llm".into() }),
        ];
        let lines: Vec<String> = ops.iter().map(AdminOp::summary).collect();
        assert_eq!(
            lines,
            [
                "node drain h3: bad fan (deadline 2026-11-25T02:03:12Z)",
                "node label h1 rack=a -old",
                "nic failover h1/rail0",
                "job cancel llm",
            ]
        );
        assert!(lines.iter().all(|l| !l.contains('{')));
    }
}
