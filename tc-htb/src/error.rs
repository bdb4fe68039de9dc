//! [`ShapeError`]: what can go wrong validating, sending or dumping a shape
//! set.

use crate::model::{
    FlowMatch, DEFAULT_MINOR, MAX_MATCHES_PER_CLASS, MAX_RATE_BPS, MAX_SHAPES, MIN_RATE_BPS,
    REQUEST_TIMEOUT,
};

/// Errors of HTB shaping. Validation errors name the bad value; nothing is
/// sent to the kernel when validation fails.
#[derive(Debug, thiserror::Error)]
pub enum ShapeError {
    /// A rate or ceiling outside [`MIN_RATE_BPS`]..=[`MAX_RATE_BPS`]; `what`
    /// names which one (the default rate, or a class's rate or ceil).
    #[error("{what} {bps} bit/s is out of range ({MIN_RATE_BPS}..={MAX_RATE_BPS} bit/s)")]
    RateOutOfRange { what: String, bps: u64 },
    /// A class whose ceiling is below its guaranteed rate.
    #[error("class 1:{minor:x}: ceil {ceil_bps} bit/s is below its rate {rate_bps} bit/s")]
    CeilBelowRate {
        minor: u16,
        rate_bps: u64,
        ceil_bps: u64,
    },
    /// A shape asked for minor 0, the root class's or the default class's.
    #[error("class minor {minor} (1:{minor:x}) is reserved (0, 1 and {DEFAULT_MINOR} are taken)")]
    ReservedMinor { minor: u16 },
    /// Two shapes asked for the same class minor.
    #[error("class minor {minor} (1:{minor:x}) is used by more than one shape")]
    DuplicateMinor { minor: u16 },
    /// One flow match listed twice (in one shape or in two).
    #[error("match `{flow}` is used more than once")]
    DuplicateMatch { flow: FlowMatch },
    /// A shape without any flow match.
    #[error("class 1:{minor:x} has no flow match (it needs 1..={MAX_MATCHES_PER_CLASS})")]
    NoMatches { minor: u16 },
    /// A shape with more than [`MAX_MATCHES_PER_CLASS`] flow matches.
    #[error("class 1:{minor:x} has {count} flow matches, at most {MAX_MATCHES_PER_CLASS}")]
    TooManyMatches { minor: u16, count: usize },
    /// A match whose source and destination ports name different protocols
    /// (one u32 node matches one protocol byte).
    #[error("class 1:{minor:x}: match `{flow}` gives its source and destination ports different protocols")]
    MixedProtocols { minor: u16, flow: FlowMatch },
    /// More than [`MAX_SHAPES`] shapes for one interface.
    #[error("{count} shapes, at most {MAX_SHAPES} per interface")]
    TooManyShapes { count: usize },
    /// The kernel refused a request; `source` carries its errno
    /// (see [`ShapeError::errno`]).
    #[error("{op} on ifindex {ifindex}: kernel said: {source}")]
    Kernel {
        op: String,
        ifindex: u32,
        #[source]
        source: std::io::Error,
    },
    /// The kernel did not answer a request or finish a dump within
    /// [`REQUEST_TIMEOUT`].
    #[error("{op} on ifindex {ifindex}: no answer within {REQUEST_TIMEOUT:?}")]
    Timeout { op: String, ifindex: u32 },
    /// A netlink exchange that could not be sent, or an answer that could
    /// not be parsed (`detail` says what was wrong).
    #[error("{op} on ifindex {ifindex}: {detail}")]
    Protocol {
        op: String,
        ifindex: u32,
        detail: String,
    },
}

impl ShapeError {
    /// The kernel's errno, for a [`ShapeError::Kernel`].
    pub fn errno(&self) -> Option<i32> {
        match self {
            ShapeError::Kernel { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}
