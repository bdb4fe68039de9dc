//! Checks a shape set before anything is sent to the kernel.

use crate::error::ShapeError;
use crate::model::{
    Shape, DEFAULT_MINOR, MAX_MATCHES_PER_CLASS, MAX_RATE_BPS, MAX_SHAPES, MIN_RATE_BPS, ROOT_MINOR,
};

fn check_rate(what: impl FnOnce() -> String, bps: u64) -> Result<(), ShapeError> {
    if (MIN_RATE_BPS..=MAX_RATE_BPS).contains(&bps) {
        Ok(())
    } else {
        Err(ShapeError::RateOutOfRange { what: what(), bps })
    }
}

/// Checks a shape set; [`apply`](crate::apply()) calls it before sending anything: at most
/// [`MAX_SHAPES`] shapes with distinct, unreserved minors, rates in range
/// and ceil ≥ rate, 1..=[`MAX_MATCHES_PER_CLASS`] matches per shape, no
/// match used twice (in any shape), ports of one match on one protocol.
pub fn validate(shapes: &[Shape], default_rate_bps: u64) -> Result<(), ShapeError> {
    if shapes.len() > MAX_SHAPES {
        return Err(ShapeError::TooManyShapes {
            count: shapes.len(),
        });
    }
    check_rate(|| "default rate".into(), default_rate_bps)?;
    let mut minors = std::collections::BTreeSet::new();
    let mut flows = std::collections::BTreeSet::new();
    for s in shapes {
        let m = s.class_minor;
        if m == 0 || m == ROOT_MINOR || m == DEFAULT_MINOR {
            return Err(ShapeError::ReservedMinor { minor: m });
        }
        if !minors.insert(m) {
            return Err(ShapeError::DuplicateMinor { minor: m });
        }
        check_rate(|| format!("class 1:{m:x} rate"), s.rate_bps)?;
        check_rate(|| format!("class 1:{m:x} ceil"), s.ceil_bps)?;
        if s.ceil_bps < s.rate_bps {
            return Err(ShapeError::CeilBelowRate {
                minor: m,
                rate_bps: s.rate_bps,
                ceil_bps: s.ceil_bps,
            });
        }
        if s.matches.is_empty() {
            return Err(ShapeError::NoMatches { minor: m });
        }
        if s.matches.len() > MAX_MATCHES_PER_CLASS {
            return Err(ShapeError::TooManyMatches {
                minor: m,
                count: s.matches.len(),
            });
        }
        for f in &s.matches {
            if f.src_port.is_some() && f.dst_port.is_some() && f.proto().is_none() {
                return Err(ShapeError::MixedProtocols { minor: m, flow: *f });
            }
            if !flows.insert(*f) {
                return Err(ShapeError::DuplicateMatch { flow: *f });
            }
        }
    }
    Ok(())
}
