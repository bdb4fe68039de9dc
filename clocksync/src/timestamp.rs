//! Arithmetic on `i64` nanosecond timestamps that stays exact at epoch scale.

/// `a - b` in ns as f64, exact before the final rounding (epoch-scale
/// timestamps must not be converted to f64 before subtracting: at 1.7e18 an
/// f64 resolves only 256 ns).
pub(crate) fn ns_diff(a: i64, b: i64) -> f64 {
    (i128::from(a) - i128::from(b)) as f64
}
