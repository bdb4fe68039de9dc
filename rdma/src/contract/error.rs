//! Contract failures, on either side of the socket.

use std::time::Duration;

/// Contract failures.
#[derive(Debug, thiserror::Error)]
pub enum ContractError {
    #[error("line longer than {max} bytes")]
    LineTooLong { max: usize },
    #[error("malformed message: {0}")]
    Malformed(String),
    #[error("unknown message type {found:?} (expected one of {})", expected.join(", "))]
    UnknownType {
        found: String,
        expected: &'static [&'static str],
    },
    #[error("invalid message: {0}")]
    Invalid(String),
    #[error("agent socket {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Transport(#[from] std::io::Error),
    #[error("the agent refused: {0}")]
    Refused(String),
    #[error("the contract client has stopped")]
    Closed,
    #[error("no answer from the agent within {0:?}")]
    Timeout(Duration),
}
