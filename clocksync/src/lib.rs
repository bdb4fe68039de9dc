//! Software clock synchronisation in the style of Huygens (Geng et al.,
//! NSDI'18): pure math, no I/O, no async, bounded memory everywhere.
//!
//! The pipeline, as the node agent and the supervisor use it:
//!
//! 1. [`probe`]: A sends *coded probe pairs* to B (two probes `gap` apart).
//!    [`probe::purity_filter`] keeps a pair only when the receive gap equals
//!    the send gap within a threshold: then neither probe saw queueing that
//!    the other did not, and the first probe's delay is a good sample of the
//!    path's floor.
//! 2. [`pair::PairEstimator`] holds the pure first-probes of one host pair in
//!    both directions over a sliding window (default 2 s) and fits the offset
//!    line `clock_B - clock_A = offset + drift·(t - at)` as the maximum-margin
//!    separator between forward delays (above the line) and negated reverse
//!    delays (below it), solved exactly through convex hulls. It also has an
//!    NTP-style min-RTT estimator over the same probes, for comparison.
//! 3. [`network::solve`] takes the per-edge estimates of the whole probe mesh
//!    and applies the *network effect*: weighted least squares on the graph
//!    with one reference host fixed at zero, so offsets (and log-rates) around
//!    every loop sum to zero; the per-edge loop residuals expose bad edges.
//!
//! Conventions: timestamps are `i64` nanoseconds of the host clock that took
//! them; the offset of B relative to A is `clock_B - clock_A`; drift is
//! `d(clock_B - clock_A)/d(clock_A)`, in parts per billion (ppb).
//!
//! ```
//! use clocksync::{solve, EdgeEstimate, HostId, PairConfig, PairEstimator};
//!
//! // Host A probes B: B's clock is 250 µs ahead, paths take 20 µs each way.
//! let mut pair = PairEstimator::new(PairConfig::default())?;
//! for k in 0..100i64 {
//!     let t = 1_700_000_000_000_000_000 + k * 10_000_000; // A's clock, 100 Hz
//!     pair.add_forward(t, t + 20_000 + 250_000)?; // A→B: tx on A, rx on B
//!     let t = t + 5_000_000;
//!     pair.add_reverse(t - 20_000 + 250_000, t)?; // B→A: tx on B, rx on A
//! }
//! let est = pair.estimate()?;
//! assert!((est.offset_ns - 250_000.0).abs() < 1.0);
//!
//! // The supervisor combines the mesh's edges, host 0 as the reference.
//! let edge = EdgeEstimate::from_estimate(HostId(0), HostId(1), &est);
//! let solution = solve(&[edge], HostId(0), est.at_ns)?;
//! let b = solution.host(HostId(1)).unwrap();
//! assert!((b.offset_ns - 250_000.0).abs() < 1.0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A fundamental limit of every two-way method, this one included: a
//! difference between the forward and reverse *minimum* one-way delays
//! (path asymmetry) is indistinguishable from an offset and biases the
//! estimate by half the asymmetry. The error bounds reported here are
//! statistical bounds under the symmetric-floor assumption; the
//! assumption-free bound is [`pair::Estimate::half_gap_ns`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod host;
mod hull;
mod linalg;
pub mod network;
pub mod pair;
pub mod probe;
mod timestamp;

pub use host::HostId;
pub use network::{
    solve, solve_with, ClockState, EdgeEstimate, EdgeResidual, EdgeStatus, HostClock, NetworkError,
    Solution, SolveConfig,
};
pub use pair::{Direction, Estimate, NtpEstimate, PairConfig, PairError, PairEstimator};
pub use probe::{purity_filter, Probe, ProbePair};
