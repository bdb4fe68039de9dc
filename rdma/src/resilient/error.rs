//! Why a connection call failed.

use std::time::Duration;

/// Why a connection call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConnError {
    /// The [`ConnConfig`](super::ConnConfig) is unusable on this endpoint
    /// (what is wrong).
    #[error("invalid connection settings: {0}")]
    Config(String),
    /// A message is larger than the connection's `max_message`; nothing
    /// was sent.
    #[error("message of {len} bytes exceeds the maximum of {max}")]
    TooLarge {
        /// The message's size.
        len: usize,
        /// The connection's `max_message`.
        max: usize,
    },
    /// No rail carried a path for longer than `stall_timeout` (how long):
    /// the connection failed, loudly, with its undelivered messages.
    #[error("no usable rail for {0:?}: the connection failed; undelivered messages were not dropped silently, they are reported here")]
    NoPath(Duration),
    /// The peer broke the sequencing protocol (a gap, an impossible ack, a
    /// hello on an established path): exactly-once cannot continue.
    #[error("the peer broke the protocol: {0}")]
    Protocol(String),
    /// The connection was closed (its handle or its receiver dropped).
    #[error("the connection is closed")]
    Closed,
    /// The endpoint refused the connection (say, its id is in use) or
    /// closed.
    #[error("{0}")]
    Endpoint(String),
}
