//! The job runner: the agent launches, fences, stops and checkpoints the
//! ranks of jobs the supervisor places on this host.
//!
//! **Launch** ([`JobOrder::Start`], a `StartRank` order). The rank runs
//! `argv` (`argv[0]` resolved as given: a path, or a name looked up in the
//! agent's `PATH`) in its own process group (the group id is the rank's
//! pid), with stdin `/dev/null`, its working directory and log at
//! `<data dir>/jobs/<job>/<incarnation>/` (`<job>` as [`job_dir_name`]
//! writes it: the name itself unless it has bytes other than letters,
//! digits, `.`, `_`, `-`) and stdout and stderr through one pipe into
//! `rank-<r>.log` there (appended; at [`LOG_CAP`] a note is
//! written and further output is read and discarded, so the rank never
//! blocks on it). The environment is the agent's, plus the order's `env`
//! entries, plus (winning over both):
//!
//! | variable | value |
//! |---|---|
//! | `RAILGUARD_AGENT_SOCKET` | the agent's control socket |
//! | `RAILGUARD_JOB`, `RAILGUARD_INCARNATION`, `RAILGUARD_RANK` | the order's |
//! | `RAILGUARD_WORLD_SIZE` | the number of peers |
//! | `RAILGUARD_PEERS` | `host=addr0,addr1;…`, one entry per rank in rank order |
//! | `RAILGUARD_NICS` | this host's data NICs with a rail, in rail order: `name=addr,…` (addr empty if unknown) |
//! | `RAILGUARD_PORT` | the job's data port |
//! | `RAILGUARD_CHECKPOINT_DIR`, `RAILGUARD_CHECKPOINT_EVERY`, `RAILGUARD_RESUME_STEP` | the order's |
//!
//! **Who it runs as** ([`JobsPolicy`], `[jobs]` in the agent's
//! configuration). Never root by default: the rank runs as the order's
//! `user`, or the policy's `default_user` (`railguard-job`) when it names
//! none, with that user's groups (`setgroups` to its group list, `setgid`,
//! `setuid` between fork and exec, after the working directory and process
//! group are set) and `USER`, `LOGNAME`, `HOME` set to it (the order's
//! `env` may override them). The start is refused — a failed order with
//! one line saying why, nothing launched, created or recorded — when the
//! user does not exist on this host ("user railguard-job does not exist on
//! this host; create it (useradd --system railguard-job) or set [jobs]
//! default_user"), is neither the default user nor in `allowed_users`, or
//! is uid 0 without `allow_root = true`; and when `allowed_commands` is not
//! empty and `argv[0]` is not an absolute path (without `..`) under one of
//! its prefixes. The rank's incarnation directory and its log file are
//! given to the user. Its `checkpoint_dir` (relative: under the working
//! directory) is created if missing, and then it and the parents the agent
//! created are given to the user; an existing one must already be a
//! directory the user may write (mode bits), and the user must be able to
//! search every directory above it — else the start fails saying so.
//!
//! The order is answered ok with detail `pid=N` once the process runs and
//! its record is durable; a spawn failure answers ok=false with the OS
//! error. Starting a (job, incarnation, rank) that runs already answers
//! its pid again (whatever the order id); one that ran and exited is
//! refused. The agent keeps the newest [`KEEP_INCARNATION_LOGS`]
//! incarnations' log directories of a job.
//!
//! **Exits.** A reaper thread per rank waits for the rank's exit without
//! reaping it, kills what is left of its process group (SIGKILL, while the
//! zombie keeps the group id reserved), reaps it and reports a
//! `RankExited` event (exit code, or -1 and the signal; the detail says
//! why the agent stopped it, if it did) through the outbox, like every
//! other report: durable before its record is removed, sent until acknowledged.
//!
//! **Fencing.** Per job the agent keeps, in its sled database (tree
//! `job_fences`), the highest incarnation it has seen and the highest one a
//! `StopJob` covered. A `StartRank` or `CheckpointJob` of an older
//! incarnation than the highest is refused ("stale incarnation X < Y"), and
//! so is a `StartRank` of an incarnation a `StopJob` covered. A
//! `StartRank` of a newer incarnation records it first, then stops every
//! rank of the job's older incarnations on this host (and waits until they
//! are reaped) before it launches: two incarnations of a job never run
//! together on the host. Orders of one job run one at a time.
//!
//! **Stop** ([`JobOrder::Stop`]): every rank of the job with incarnation
//! <= the order's gets SIGTERM (to its process group), then SIGKILL after
//! [`STOP_GRACE`]; answered once they are reaped (failed if one survives
//! SIGKILL for [`KILL_WAIT`]). Nothing running: ok at once.
//!
//! **Checkpoint** ([`JobOrder::Checkpoint`]): `OrderKind::Checkpoint {
//! step: None, halt }` goes over the control socket to each running rank
//! of that incarnation ([`Control::order_ranks`](crate::control::Control::order_ranks); a rank not connected yet
//! gets it when it says hello); answered once every rank answered, within
//! [`CHECKPOINT_TIMEOUT`] in all. The detail is the ranks' common detail
//! (`step=N`), else `rank R: …` per rank. A successful answer is the typed
//! `OrderOutcome::Checkpointed { step }` (the step the detail names, sent as
//! `OrderResult.checkpoint_step`; the detail is kept for older
//! supervisors). For incarnation 0 with no rank launched here, the job's
//! connected ranks are ordered (a job the agent did not launch).
//!
//! **Who may speak for a rank** ([`Launcher`] as the control socket's
//! `RankEvents::admit`). A `hello` for a job with ranks running here is
//! admitted only from a process of the rank it names — in the rank's
//! process group, or descended from its leader (`SO_PEERCRED` pid) — and
//! only if the pid it claims is that process or in its process group;
//! else "pid P is not a rank of job J (rank R runs as process group G)"
//! and the connection closes, nothing changed. A job with no rank running
//! here (started by other means) is admitted only from root or from the
//! default or an allowed job user's uid.
//!
//! **Checkpointed.** A rank's `checkpointed {step}` becomes a
//! `RankCheckpoint` event (the incarnation of the rank the agent launched
//! for that job and rank; 0 for a rank it did not launch). The contract
//! client re-sends its newest step after a reconnect: a (job, incarnation,
//! rank, step) already reported by this agent process is not reported
//! again (the supervisor treats repeats as idempotent anyway).
//!
//! **Log tail** ([`Launcher::tail_log`]): the last `max_bytes` (at most
//! [`MAX_TAIL`]) of the newest incarnation's `rank-<r>.log`, as lossy UTF-8.
//!
//! **Agent restart.** Every launched rank is recorded (job, incarnation,
//! rank, pid, the process's start time from `/proc/<pid>/stat`) in the tree
//! `job_ranks` before the start is answered, and removed once its exit is
//! in the outbox. On start ([`Launcher::open`]) a recorded rank whose
//! process still runs (same start time) is killed (SIGKILL to its group)
//! and reported exited with code -1, signal 9, "agent restarted: rank
//! stopped"; one that is gone is reported with code -1, signal 0, "lost
//! while the agent was down". The supervisor restarts the job from its
//! checkpoint. At most [`MAX_RANKS`] ranks run (and are recorded) at once.
//!
//! **Agent shutdown** ([`Launcher::shutdown`], on SIGTERM or Ctrl-C): ranks
//!
//! # Layout
//! - `model`: limits, configuration, orders, rank keys, exits, job names.
//! - `launch`: [`Launcher`], the runner itself (start, stop, checkpoint,
//!   reap, recover, shut down) and the writer of rank events.
//! - `fence`: the durable job fences (`job_fences`).
//! - `records`: the durable rank records (`job_ranks`).
//! - `process`: `/proc` reads, group signals, waiting for an exit.
//! - `logs`: rank logs (capped copy, pruning, tails).
//! - `user`: the `[jobs]` policy, user and group lookups, dropping to the
//!   job user, the checkpoint directory.

mod fence;
mod launch;
mod logs;
mod model;
mod process;
mod records;
mod user;

pub use launch::{rank_env, Launcher};
pub use model::{
    check_job_name, job_dir_name, JobOrder, JobsConfig, JobsError, LogTail, RankExit, RankKey,
    CHECKPOINT_TIMEOUT, KEEP_INCARNATION_LOGS, KILL_WAIT, LOG_CAP, MAX_FENCES, MAX_JOB_NAME,
    MAX_RANKS, MAX_TAIL, STOP_GRACE,
};
pub use user::{lookup_group, lookup_user, JobUser, JobsPolicy, DEFAULT_JOB_USER};

#[cfg(test)]
mod access_tests;
#[cfg(test)]
mod tests;
