//! The job runner's vocabulary: its limits, configuration, orders, rank
//! keys, exits and log tails, and the job-name rules.

use std::path::PathBuf;
use std::time::Duration;

use proto::v1::StartRank;

use super::user::JobsPolicy;
use crate::config::NicConfig;
use crate::outbox::OutboxError;
use crate::store_format::FormatError;

/// Between SIGTERM and SIGKILL when the agent stops a rank.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// How long a rank may take to disappear after SIGKILL.
pub const KILL_WAIT: Duration = Duration::from_secs(5);
/// Most bytes of a rank's output kept in its log.
pub const LOG_CAP: u64 = 64 << 20;
/// Most bytes a log tail returns.
pub const MAX_TAIL: usize = 128 << 10;
/// How long a checkpoint order waits for every rank's answer.
pub const CHECKPOINT_TIMEOUT: Duration = Duration::from_secs(30);
/// Ranks running (and recorded) at once on this host.
pub const MAX_RANKS: usize = 256;
/// Jobs whose fence is remembered (beyond it, the least recently updated
/// job with nothing running is forgotten).
pub const MAX_FENCES: usize = 4096;
/// Log directories (incarnations) kept per job.
pub const KEEP_INCARNATION_LOGS: usize = 8;
/// Exited ranks remembered (for idempotent starts and checkpoint events).
pub(crate) const MAX_EXITED: usize = 1024;
/// (rank, step) checkpoints and (rank, connection) stalls remembered to
/// drop repeats.
pub(crate) const MAX_CHECKPOINTS_SEEN: usize = 4096;
/// Events waiting for the outbox.
pub(crate) const EVENT_QUEUE: usize = 1024;
/// Longest job name (its directory name may be three times as long, within
/// the usual 255-byte limit only for plain names; the supervisor allows 253).
pub const MAX_JOB_NAME: usize = 253;

pub(crate) const FENCE_TREE: &str = "job_fences";
pub(crate) const RANK_TREE: &str = "job_ranks";

/// Job runner failures (its storage).
#[derive(Debug, thiserror::Error)]
pub enum JobsError {
    /// The outbox (shared database) failed.
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    /// The job trees of the database at `path` could not be read.
    #[error("job store at {path}: {source}")]
    Sled {
        /// The database directory.
        path: String,
        /// What sled said.
        #[source]
        source: sled::Error,
    },
    /// The jobs directory (logs) could not be made.
    #[error("jobs directory {path}: {source}")]
    Io {
        /// The directory.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A job tree (`job_fences`, `job_ranks`) has a format this agent does
    /// not read.
    #[error(transparent)]
    Format(#[from] FormatError),
}

/// What the launcher needs from the agent's configuration.
#[derive(Debug, Clone)]
pub struct JobsConfig {
    /// The agent's data directory (logs go under `jobs/` in it).
    pub data_dir: PathBuf,
    /// The control socket ranks talk to.
    pub control_socket: PathBuf,
    /// The data NICs (with their addresses, for `RAILGUARD_NICS`).
    pub nics: Vec<NicConfig>,
    /// Most bytes kept per rank log ([`LOG_CAP`]).
    pub log_cap: u64,
    /// Who ranks run as and what they may run (`[jobs]`).
    pub policy: JobsPolicy,
}

impl JobsConfig {
    pub fn new(data_dir: PathBuf, control_socket: PathBuf, nics: Vec<NicConfig>) -> Self {
        Self {
            data_dir,
            control_socket,
            nics,
            log_cap: LOG_CAP,
            policy: JobsPolicy::default(),
        }
    }

    /// The same with the `[jobs]` policy `policy`.
    pub fn with_policy(mut self, policy: JobsPolicy) -> Self {
        self.policy = policy;
        self
    }
}

/// A job order from the supervisor.
#[derive(Debug, Clone, PartialEq)]
pub enum JobOrder {
    Start(StartRank),
    Stop {
        job: String,
        incarnation: u64,
    },
    Checkpoint {
        job: String,
        incarnation: u64,
        halt: bool,
    },
}

/// One rank of one incarnation of a job.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RankKey {
    pub job: String,
    pub incarnation: u64,
    pub rank: u32,
}

impl std::fmt::Display for RankKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "job {} incarnation {} rank {}",
            self.job, self.incarnation, self.rank
        )
    }
}

/// How a rank ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankExit {
    /// The exit code (-1: ended by a signal, or unknown).
    pub exit_code: i32,
    /// The signal that ended it (0: none).
    pub signal: i32,
    pub detail: String,
}

/// The end of a rank's log, or the bytes after an offset of it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogTail {
    pub ok: bool,
    /// The log's bytes (ok) or why there are none.
    pub text: String,
    /// The incarnation whose log it is (0 when none was found).
    pub incarnation: u64,
    /// The byte of that log just after `text`.
    pub end_offset: u64,
    /// The newest incarnation with a log of the rank here.
    pub newest: u64,
}

/// A job name: 1 to [`MAX_JOB_NAME`] bytes without control characters (the
/// supervisor's rule is stricter: no whitespace either). Its directory name
/// is [`job_dir_name`].
pub fn check_job_name(job: &str) -> Result<(), String> {
    if job.is_empty() || job.len() > MAX_JOB_NAME || job.chars().any(char::is_control) {
        return Err(format!(
            "job name {job:?} must be 1-{MAX_JOB_NAME} bytes without control characters"
        ));
    }
    Ok(())
}

/// The directory of a job's logs under `jobs/`: the name itself when it is
/// only letters, digits, `_`, `-` and (not first) `.`; any other byte is
/// written `%XX` (so `a/b` is `a%2Fb`, `..` is `%2E.`; one name, one
/// directory).
pub fn job_dir_name(job: &str) -> String {
    let mut out = String::with_capacity(job.len());
    for (i, b) in job.bytes().enumerate() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || (b == b'.' && i > 0) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
