//! Coded probe pairs and the purity filter.
//!
//! A coded probe pair is two probes that A sends to B back to back, `gap`
//! apart (Huygens uses a gap of a few µs). Each probe carries its transmit
//! timestamp (A's clock) and gets a receive timestamp (B's clock). If the
//! receive gap equals the transmit gap, the two probes crossed the path with
//! the same queueing, which in practice means none: a queue that delays the
//! first probe almost never delays the second by exactly as much. Only such
//! *pure* pairs are kept, and of them only the first probe is used as a
//! delay sample.
//!
//! Clock drift changes the receive gap by `drift·gap` (200 ppm over 10 µs is
//! 2 ns), far below any useful threshold, so the filter needs no drift
//! correction. The threshold must exceed the timestamp jitter (four
//! timestamps enter the gap difference).

use serde::{Deserialize, Serialize};

/// One probe: transmit time on the sender's clock, receive time on the
/// receiver's clock, both in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probe {
    /// Transmit timestamp, sender's clock (ns).
    pub tx_ns: i64,
    /// Receive timestamp, receiver's clock (ns).
    pub rx_ns: i64,
}

impl Probe {
    /// Apparent one-way delay `rx - tx`: the true one-way delay plus the
    /// receiver's clock offset. `None` if it does not fit an `i64`.
    pub fn delay_ns(&self) -> Option<i64> {
        self.rx_ns.checked_sub(self.tx_ns)
    }
}

/// Two probes sent `gap` apart along the same path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbePair {
    /// The probe sent first.
    pub first: Probe,
    /// The probe sent second.
    pub second: Probe,
}

impl ProbePair {
    /// Transmit gap (second minus first, sender's clock).
    pub fn tx_gap_ns(&self) -> i128 {
        i128::from(self.second.tx_ns) - i128::from(self.first.tx_ns)
    }

    /// Receive gap (second minus first, receiver's clock).
    pub fn rx_gap_ns(&self) -> i128 {
        i128::from(self.second.rx_ns) - i128::from(self.first.rx_ns)
    }

    /// `|rx_gap - tx_gap|`: how much queueing one probe saw that the other
    /// did not (plus timestamp jitter).
    pub fn gap_error_ns(&self) -> u128 {
        (self.rx_gap_ns() - self.tx_gap_ns()).unsigned_abs()
    }
}

/// Keep the pair only if it is pure: the second probe was sent after the
/// first and `|rx_gap - tx_gap| <= threshold_ns`. Exact for any `i64`
/// timestamps (computed in `i128`).
pub fn purity_filter(pair: &ProbePair, threshold_ns: u64) -> bool {
    pair.tx_gap_ns() > 0 && pair.gap_error_ns() <= u128::from(threshold_ns)
}

#[cfg(test)]
mod tests {
    use crate::probe::*;

    fn pair(tx1: i64, rx1: i64, tx2: i64, rx2: i64) -> ProbePair {
        ProbePair {
            first: Probe {
                tx_ns: tx1,
                rx_ns: rx1,
            },
            second: Probe {
                tx_ns: tx2,
                rx_ns: rx2,
            },
        }
    }

    #[test]
    fn pure_pair_kept_queued_pair_dropped() {
        // 10 µs gap, B's clock 1 s ahead, 20 µs path.
        let base = 1_000_000_000;
        assert!(purity_filter(
            &pair(0, base + 20_000, 10_000, base + 30_000),
            100
        ));
        // Second probe queued 5 µs more than the first.
        assert!(!purity_filter(
            &pair(0, base + 20_000, 10_000, base + 35_000),
            100
        ));
        // First probe queued, second not (gap shrank).
        assert!(!purity_filter(
            &pair(0, base + 25_000, 10_000, base + 30_000),
            100
        ));
        // Within threshold, either sign.
        assert!(purity_filter(
            &pair(0, base + 20_000, 10_000, base + 30_090),
            100
        ));
        assert!(purity_filter(
            &pair(0, base + 20_000, 10_000, base + 29_900),
            100
        ));
        assert!(!purity_filter(
            &pair(0, base + 20_000, 10_000, base + 29_899),
            100
        ));
    }

    #[test]
    fn malformed_pairs_rejected() {
        // Not sent in order.
        assert!(!purity_filter(&pair(10, 20, 10, 20), 1_000));
        assert!(!purity_filter(&pair(10, 20, 5, 15), 1_000));
        // Reordered on the wire: rx gap negative.
        assert!(!purity_filter(&pair(0, 100, 10, 50), 20));
    }

    #[test]
    fn extreme_timestamps_do_not_overflow() {
        let p = pair(i64::MIN, i64::MAX, i64::MAX, i64::MIN);
        assert!(!purity_filter(&p, u64::MAX));
        assert_eq!(p.first.delay_ns(), None);
        let p = pair(i64::MIN, i64::MIN + 5, i64::MAX - 10, i64::MAX - 5);
        assert!(purity_filter(&p, 0));
    }
}
