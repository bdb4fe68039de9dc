//! The admin API: JSON request and reply bodies carried in `Admin.Call`, and
//! the error type every supervisor API returns.
//!
//! One request enum covers every admin operation so that forwarding to the
//! leader is a single code path: a follower forwards the whole [`AdminCall`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::{AdminOp, AdminRecord, ClusterEvent, Host, Incident, Intent, NodeId, Qp};

/// One admin call.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AdminCall {
    /// Who is asking (recorded with every write).
    pub actor: String,
    /// Serve a read from this supervisor's state without a leader round trip.
    #[serde(default)]
    pub stale: bool,
    /// Set by a follower that forwarded the call; the leader never forwards
    /// again (one hop at most).
    #[serde(default)]
    pub forwarded: bool,
    /// Makes a `Write` retry-safe: the cluster applies a request id at most
    /// once and answers a retry with the first result.
    #[serde(default)]
    pub request_id: Option<crate::model::RequestId>,
    pub request: AdminRequest,
}

/// Every admin operation.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
pub enum AdminRequest {
    Status,
    ClusterInit,
    ClusterMembers,
    AddMember {
        id: NodeId,
        addr: String,
    },
    RemoveMember {
        id: NodeId,
    },
    TransferLeader {
        id: NodeId,
    },
    NodeList,
    NodeShow {
        host: String,
    },
    Write {
        op: AdminOp,
    },
    Incidents {
        open_only: bool,
    },
    /// Every NIC of every host, optionally only those in one state.
    NicList {
        state: Option<crate::model::NicState>,
    },
    Events {
        since: u64,
        limit: u32,
    },
    AdminHistory {
        limit: u32,
    },
    /// Connection placements, optionally of one host and/or one job.
    QpList {
        host: Option<String>,
        job: Option<String>,
    },
    /// Intents, most recent last.
    Intents {
        open_only: bool,
        limit: u32,
    },
    /// One intent (e.g. to wait for an order's outcome).
    IntentShow {
        id: u64,
    },
}

impl AdminRequest {
    /// Whether the request changes state (and so must reach the leader).
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            AdminRequest::ClusterInit
                | AdminRequest::AddMember { .. }
                | AdminRequest::RemoveMember { .. }
                | AdminRequest::TransferLeader { .. }
                | AdminRequest::Write { .. }
        )
    }
}

/// A supervisor as seen in `status` and `cluster members`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MemberView {
    pub id: NodeId,
    pub addr: String,
    pub voter: bool,
    pub leader: bool,
    /// Highest log index known replicated to it (leader's view; None if unknown).
    pub matched: Option<u64>,
}

/// `railguard status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusView {
    pub answered_by: NodeId,
    pub leader: Option<NodeId>,
    pub term: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    /// Last log index covered by this node's latest snapshot.
    pub snapshot_index: Option<u64>,
    /// Log entries up to this index have been compacted away on this node.
    pub purged_index: Option<u64>,
    pub members: Vec<MemberView>,
    pub hosts_by_status: BTreeMap<String, usize>,
    pub open_incidents: Vec<Incident>,
    pub open_intents: Vec<Intent>,
}

/// A connection placement with its host.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct QpView {
    pub host: String,
    #[serde(flatten)]
    pub qp: Qp,
}

/// Every reply body.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum AdminReply {
    Status(StatusView),
    Members {
        members: Vec<MemberView>,
    },
    Hosts {
        hosts: Vec<Host>,
    },
    Host {
        host: Host,
        jobs: Vec<String>,
    },
    Incidents {
        incidents: Vec<Incident>,
    },
    Nics {
        nics: Vec<(String, crate::model::Nic)>,
    },
    Events {
        events: Vec<ClusterEvent>,
    },
    History {
        records: Vec<AdminRecord>,
    },
    /// A write was committed at this log index.
    Committed {
        log_index: u64,
        detail: String,
    },
    Qps {
        qps: Vec<QpView>,
        /// More matched than one reply carries.
        truncated: bool,
    },
    Intents {
        intents: Vec<Intent>,
    },
    Intent {
        intent: Intent,
    },
    /// A write that opened an intent (an order) was committed.
    IntentOpened {
        id: u64,
        log_index: u64,
        detail: String,
    },
}

/// Error categories, mapped onto gRPC status codes on the wire.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum ErrorKind {
    InvalidArgument,
    NotFound,
    FailedPrecondition,
    /// No leader is reachable right now; nothing was written.
    Unavailable,
    /// The write may or may not have been committed (e.g. leadership changed
    /// after it was proposed). Read before retrying a non-idempotent write.
    Unknown,
    Internal,
}

/// An API error with a one-line message.
#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error, PartialEq, Eq)]
#[error("{message}")]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
    pub fn unknown(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unknown, message)
    }

    /// Whether the error guarantees nothing was written.
    pub fn is_definite(&self) -> bool {
        !matches!(self.kind, ErrorKind::Unknown | ErrorKind::Internal)
    }
}

impl From<crate::model::CmdError> for ApiError {
    fn from(e: crate::model::CmdError) -> Self {
        use crate::model::CmdError as E;
        let kind = match &e {
            E::NotFound { .. } => ErrorKind::NotFound,
            E::InvalidArgument(_) => ErrorKind::InvalidArgument,
            E::FailedPrecondition(_) | E::SequenceGap { .. } => ErrorKind::FailedPrecondition,
            E::RequestForgotten { .. } => ErrorKind::Unknown,
        };
        ApiError::new(kind, e.to_string())
    }
}

impl From<ApiError> for tonic::Status {
    fn from(e: ApiError) -> Self {
        let code = match e.kind {
            ErrorKind::InvalidArgument => tonic::Code::InvalidArgument,
            ErrorKind::NotFound => tonic::Code::NotFound,
            ErrorKind::FailedPrecondition => tonic::Code::FailedPrecondition,
            ErrorKind::Unavailable => tonic::Code::Unavailable,
            ErrorKind::Unknown => tonic::Code::Unknown,
            ErrorKind::Internal => tonic::Code::Internal,
        };
        let mut status = tonic::Status::new(code, e.message);
        if let Ok(v) = tonic::metadata::MetadataValue::try_from(format!("{:?}", e.kind)) {
            status.metadata_mut().insert(ERROR_KIND_HEADER, v);
        }
        status
    }
}

/// Metadata key naming the [`ErrorKind`] of an error the supervisor itself
/// produced. A status without it came from the transport (connection reset,
/// timeout...), where a write's outcome is unknown.
pub const ERROR_KIND_HEADER: &str = "rg-error-kind";

impl From<tonic::Status> for ApiError {
    fn from(s: tonic::Status) -> Self {
        let from_server = s
            .metadata()
            .get(ERROR_KIND_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if let Some(kind) = from_server {
            let kind = match kind.as_str() {
                "InvalidArgument" => ErrorKind::InvalidArgument,
                "NotFound" => ErrorKind::NotFound,
                "FailedPrecondition" => ErrorKind::FailedPrecondition,
                "Unavailable" => ErrorKind::Unavailable,
                "Internal" => ErrorKind::Internal,
                _ => ErrorKind::Unknown,
            };
            return ApiError::new(kind, s.message().to_string());
        }
        // Errors tonic raises itself for bad messages (decode failure, size
        // limits) are definite: the handler never ran.
        let kind = match s.code() {
            tonic::Code::InvalidArgument
            | tonic::Code::OutOfRange
            | tonic::Code::ResourceExhausted => ErrorKind::InvalidArgument,
            _ => ErrorKind::Unknown,
        };
        ApiError::new(kind, s.message().to_string())
    }
}
