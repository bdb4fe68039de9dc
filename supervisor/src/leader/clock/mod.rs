//! The leader's clock service: per-second probe summaries in, a network
//! clock solution, per-path one-way delays, probe evidence and committed
//! clock states out (DESIGN.md flow 3).
//!
//! Everything here is leader memory, never replicated: the latest
//! [`PeerClock`](proto::v1::PeerClock) per (reporter, peer, rail), a ring of
//! per-second [`PathStats`](proto::v1::PathStats) per directed path, and when
//! each host's probes were last received by a peer (the probe evidence
//! [`crate::leader::liveness`] needs before declaring a host Down). A new leader
//! starts empty and is rebuilt by the next summaries, within seconds; a
//! supervisor that stops leading forgets it all.
//!
//! **The solve** ([`run`], every second while leading): one edge per host
//! pair and rail from reports at most [`CLOCK_FRESH`] old — both ends report
//! the same probes, so the report of the host with the smaller id is used
//! when both are fresh (counting both would double their weight) — then
//! [`clocksync::solve`] with the lowest-id host that is not Down and has
//! edges as the reference. A host's committed [`ClockState`] is its
//! solution's classification (with a 25 % hysteresis margin before moving
//! to a worse state); hosts outside the solution are Unsynced unless held
//! over. Only changes of state go through Raft (`SetClockStates`), never
//! the figures.
//!
//! **Holdover:** a host that drops out of the solution (its paths too busy
//! for pure pairs, say) keeps its last solved clock, carried forward with
//! its drift, for up to [`MAX_HOLDOVER`] while the reference stays the
//! same and the host is registered and not Down; its error bound grows by
//! the drift's error over the time carried (no term for the drift itself
//! wandering: 30 s keeps that small) and its state follows that bound (the
//! view says how long it has been held: `holdover_ms`). After that, or
//! with a new reference, it is Unsynced.
//!
//! **A tick without a solution** (no fresh edges: the leader heard no
//! summaries for [`CLOCK_FRESH`], or the solve failed) does not unsync the
//! cluster: the last solution stands in, every clock in it aged — its bound
//! grown by the drift's error since that solution, its state following the
//! bound, `holdover_ms` set once it is [`STALE_AFTER`] old (the reference
//! host included), a Down host Unsynced at once — for up to
//! [`MAX_HOLDOVER`]; then every host is Unsynced. The next solution takes
//! over, holding the hosts it lacks as above (counted from their last
//! solution).
//!
//! **NTP-style baseline**, for comparison: every edge's min-RTT estimate,
//! composed hop by hop along a BFS tree from the reference like an NTP
//! stratum hierarchy (each hop at its own time, no alignment, no loop
//! correction).
//!
//! **Bounds:** a summary carries at most [`MAX_SUMMARY_CLOCKS`] clocks and
//! [`MAX_SUMMARY_PATHS`] paths; entries naming unknown peers, rails or NICs
//! are ignored, so stored keys are bounded by the model's hosts and NICs,
//! and each host further by [`MAX_CLOCKS_PER_HOST`] and
//! [`MAX_PATHS_PER_HOST`]; each path keeps [`PATH_SECONDS`] seconds.
//!
//! Lock order: the model's read lock may be held while taking this
//! service's lock, never the other way round.
//!
//! # Layout
//! - `records`: bounds, windows and the types stored and handed out (a leaf).
//! - `ingest`: validating and storing summaries, pruning.
//! - `paths`: per-path statistics and their correction.
//! - `solve`: edge selection, the reference, the solve, the NTP baseline.
//! - `holdover`: clocks carried forward; the last solution standing in.
//! - `states`: committed clock states and their changes.
//! - `views`: `railguard clock` and `railguard paths`.
//! - `service`: [`ClockService`], the store behind its lock.
//! - `tick`: the leader loop ([`run`]).

mod holdover;
mod ingest;
mod paths;
mod records;
mod service;
mod solve;
mod states;
mod tick;
mod views;

pub use ingest::SummaryError;
pub use paths::network_offset;
pub use records::{
    short, ClockReport, Held, Ingested, NtpReport, PathSample, SelectedEdge, SolveInput, Solved,
    AGGREGATION, CLOCK_FRESH, CLOCK_KEEP, MAX_CLOCKS_PER_HOST, MAX_HOLDOVER, MAX_PATHS_PER_CALL,
    MAX_PATHS_PER_HOST, MAX_SUMMARY_CLOCKS, MAX_SUMMARY_PATHS, MAX_SUMMARY_SHAPED, PATH_SECONDS,
    PATH_WINDOW, SHAPED_BUSY_SHARE, STALE_AFTER, TICK, WARMUP,
};
pub use service::ClockService;
pub use solve::{ntp_tree, pick_reference, select_edges};
pub use states::{classify, clock_changes};
pub use tick::run;

#[cfg(test)]
mod tests;
