//! Jobs in the replicated model: spec, lifecycle, placement, checkpoints,
//! restarts, and the drain that moves them.
//!
//! **Lifecycle.** `Pending` (submitted, waiting for hosts) → `Running` (an
//! incarnation is placed; its ranks are started by `StartRank` orders) ⇄
//! `Checkpointing` (a `CheckpointJob` order per host is open) → `Succeeded`
//! when every rank exited 0. A rank that fails, a host that goes Down, a
//! failed start or `job restart` make it `Restarting`: the incarnation's
//! hosts get `StopJob` orders, and once they are answered (and the backoff
//! passed) the job is placed again — spares first, surviving hosts kept —
//! as the next incarnation, resuming from its latest complete checkpoint.
//! More than `max_restarts` failures: `Failed`. `job cancel`: `Cancelled`.
//!
//! **Fencing.** Every order carries the incarnation; orders of an older
//! incarnation are cancelled here, refused by agents, and the ranks of two
//! incarnations cannot talk (their connection ids differ).
//!
//! **Checkpoints.** A checkpoint at step N is complete once every rank
//! reported its part (agent `RankCheckpoint` events, or the typed step
//! answer of a checkpoint order); only complete checkpoints are restart
//! points. Steps are deterministic, so parts written by different
//! incarnations of the same rank are the same part.
//!
//! **Drain.** A job with a rank on a draining host is checkpointed with
//! `halt` (its ranks agree on a step, write it and compute nothing more),
//! then restarted off the host from exactly that step: no step is lost and
//! the move does not count as a failure. At the drain deadline whatever is
//! still there is stopped and restarted from the latest complete checkpoint.
//!
//! Everything here runs inside Raft apply or as a pure function of the
//! state: no clock, no randomness, no I/O.

pub(crate) mod apply;
pub(crate) mod decide;
pub(crate) mod place;
#[cfg(test)]
mod tests;
pub(crate) mod types;

pub use decide::{job_order_obsolete, wanted_job_actions, wanted_job_commands};
pub use place::place;
pub use place::waiting_reason;
pub use types::{
    port_of, Exit, Job, JobCommand, JobOp, JobSpec, JobState, Rank, MAX_BACKOFF_MS,
    MAX_CHECKPOINTS, MAX_COMMAND_BYTES, MAX_ENV, MAX_JOBS, MAX_RANKS, MAX_USER_NAME, PORT_BASE,
    PORT_SPAN,
};
