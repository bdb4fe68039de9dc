//! What applying a command returns: success values, typed refusals, and the
//! small checks every area shares (names, labels).

use crate::model::limits::{MAX_LABELS, MAX_NAME_LEN};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Result of one command.
pub type CmdResult = Result<CmdOk, CmdError>;

/// Successful command results.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub enum CmdOk {
    Done,
    /// Registration applied; the agent resends events after this sequence.
    Registered {
        last_applied_seq: u64,
    },
    /// Events applied (or already applied) through this sequence.
    Acked {
        through: u64,
    },
    /// Intent recorded (or the same action was already open under this id).
    IntentOpened {
        id: u64,
    },
    /// A playbook run started (it may have ended at once: failed guards).
    RunStarted {
        id: u64,
    },
}

/// Why a command was refused. Nothing was changed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, thiserror::Error)]
pub enum CmdError {
    /// The command names a host, NIC, job, intent, incident or playbook
    /// the model does not have (`kind` says which).
    #[error("{kind} {name:?} not found")]
    NotFound { kind: String, name: String },
    /// The command itself is malformed: a bad name, a value out of range,
    /// a field over its bound (the message says which).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The command is well formed but the state does not allow it now (a
    /// draining host uncordoned, a failover to a NIC that is down, …).
    #[error("{0}")]
    FailedPrecondition(String),
    /// A retried request is older than what its session remembers: it may or
    /// may not have been applied.
    #[error("request {serial} of client {client:?} is too old to tell whether it was applied")]
    RequestForgotten { client: String, serial: u64 },
    /// Events must arrive in sequence; the agent resends after `acked`.
    #[error("event sequence gap for host {host:?}: expected {expected}, got {got}")]
    SequenceGap {
        host: String,
        expected: u64,
        got: u64,
        acked: u64,
    },
}

pub(in crate::model) fn not_found(kind: &str, name: &str) -> CmdError {
    CmdError::NotFound {
        kind: kind.into(),
        name: name.into(),
    }
}

pub(crate) fn check_name(what: &str, s: &str) -> Result<(), CmdError> {
    if s.is_empty() {
        return Err(CmdError::InvalidArgument(format!(
            "{what} must not be empty"
        )));
    }
    if s.len() > MAX_NAME_LEN {
        return Err(CmdError::InvalidArgument(format!(
            "{what} is longer than {MAX_NAME_LEN} bytes"
        )));
    }
    if s.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(CmdError::InvalidArgument(format!(
            "{what} {s:?} contains whitespace or control characters"
        )));
    }
    Ok(())
}

pub(crate) fn check_labels(
    set: &BTreeMap<String, String>,
    existing: &[&BTreeMap<String, String>],
) -> Result<(), CmdError> {
    for (k, v) in set {
        check_name("label key", k)?;
        if v.len() > MAX_NAME_LEN {
            return Err(CmdError::InvalidArgument(format!(
                "label value for {k:?} is longer than {MAX_NAME_LEN} bytes"
            )));
        }
    }
    let mut keys: std::collections::BTreeSet<&String> = set.keys().collect();
    for e in existing {
        keys.extend(e.keys());
    }
    if keys.len() > MAX_LABELS {
        return Err(CmdError::InvalidArgument(format!(
            "a host may carry at most {MAX_LABELS} labels"
        )));
    }
    Ok(())
}
