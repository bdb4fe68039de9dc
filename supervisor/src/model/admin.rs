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
            AdminOp::Job(op) => format!("job {op:?}"),
            AdminOp::Refused { request, needed } => {
                format!("refused: {request} (needs role {needed})")
            }
            AdminOp::Revoke { serial, reason } => format!("pki revoke {serial}: {reason}"),
            AdminOp::MemberAdded { id, addr } => format!("cluster add-member {id} {addr}"),
            AdminOp::MemberRemoved { id } => format!("cluster remove-member {id}"),
            op => format!("{op:?}"),
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
            | AdminOp::ShapeClear { host } => Some(host),
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
        }
    }
}
