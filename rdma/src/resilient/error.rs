//! Why a connection call failed.

use std::time::Duration;

/// Why a connection call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConnError {
    #[error("invalid connection settings: {0}")]
    Config(String),
    #[error("message of {len} bytes exceeds the maximum of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("no usable rail for {0:?}: the connection failed; undelivered messages were not dropped silently, they are reported here")]
    NoPath(Duration),
    #[error("the peer broke the protocol: {0}")]
    Protocol(String),
    #[error("the connection is closed")]
    Closed,
    #[error("{0}")]
    Endpoint(String),
}
