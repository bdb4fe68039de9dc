//! Contract failures, on either side of the socket.

use std::time::Duration;

/// Contract failures.
#[derive(Debug, thiserror::Error)]
pub enum ContractError {
    /// A line (either direction) is longer than the limit; the stream is out
    /// of step after it and is closed.
    #[error("line longer than {max} bytes")]
    LineTooLong {
        /// The limit ([`MAX_LINE`](super::MAX_LINE)).
        max: usize,
    },
    /// A line was begun but not finished within the reader's line timeout
    /// (a peer holding a partial line open); the stream is closed.
    #[error("a line was not finished within {ms} ms")]
    LineTimeout {
        /// The timeout, in milliseconds.
        ms: u64,
    },
    /// A line is not a JSON object with a string `type`, its fields do not
    /// fit that type, the stream ended inside a line, or the agent's
    /// connection broke (the reason).
    #[error("malformed message: {0}")]
    Malformed(String),
    /// A line's `type` tag is not one this side knows.
    #[error("unknown message type {found:?} (expected one of {})", expected.join(", "))]
    UnknownType {
        /// The tag found.
        found: String,
        /// The tags this side knows.
        expected: &'static [&'static str],
    },
    /// A well-formed message breaks a rule its types cannot express (a
    /// name's length or characters, a detail's length, a bound on
    /// connections or ids).
    #[error("invalid message: {0}")]
    Invalid(String),
    /// The agent's socket could not be reached.
    #[error("agent socket {path}: {source}")]
    Io {
        /// The socket's path.
        path: String,
        /// Why connecting failed.
        #[source]
        source: std::io::Error,
    },
    /// Reading or writing the socket failed.
    #[error("{0}")]
    Transport(#[from] std::io::Error),
    /// The agent answered the call with `error` (its message).
    #[error("the agent refused: {0}")]
    Refused(String),
    /// The client's background task has stopped, or it gave up reaching the
    /// agent on connect.
    #[error("the contract client has stopped")]
    Closed,
    /// The call was not answered within the client's call timeout.
    #[error("no answer from the agent within {0:?}")]
    Timeout(Duration),
}
