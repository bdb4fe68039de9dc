//! Jobs' types: the spec (validated), lifecycle states, ranks, exits,
//! checkpoints, and the leader's and admins' job commands.

use crate::model::result::CmdError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::collections::BTreeSet;

/// Most jobs kept (finished ones are forgotten oldest first beyond it).
pub const MAX_JOBS: usize = 1_024;

/// Most ranks of one job.
pub const MAX_RANKS: u32 = 1_024;

/// Most ranks of one job on one host.
pub const MAX_RANKS_PER_HOST: u32 = 64;

/// Longest command line (arguments, bytes in total) and environment.
pub const MAX_COMMAND_BYTES: usize = 16 << 10;

/// Most environment entries of a job.
pub const MAX_ENV: usize = 128;

/// Checkpoint steps remembered per job (the newest).
pub const MAX_CHECKPOINTS: usize = 16;

/// Longest restart backoff.
pub const MAX_BACKOFF_MS: u64 = 300_000;

/// Data ports are `PORT_BASE + job number % PORT_SPAN`.
pub const PORT_BASE: u16 = 20_000;

pub const PORT_SPAN: u64 = 20_000;

/// What `railguard job submit` asks for. Admins write it as a job file, so
/// its `serde(default)`s are the file's defaults (they act on JSON and TOML;
/// bincode, the Raft encoding, always carries every field).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    pub name: String,
    pub ranks: u32,
    /// Hosts the job may use (empty: any); the first `ranks /
    /// ranks_per_host` of them are preferred in rank order.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Placement constraint: hosts must carry these labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The rank's command line (argv).
    pub command: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Where ranks write checkpoints (absolute; shared by the hosts).
    pub checkpoint_dir: String,
    /// Steps between periodic checkpoints (0: only on order).
    #[serde(default)]
    pub checkpoint_every: u64,
    #[serde(default = "default_max_restarts")]
    pub max_restarts: u32,
    /// First restart delay; doubles with each failure in a row (without a
    /// new complete checkpoint between them) up to [`MAX_BACKOFF_MS`].
    #[serde(default = "default_backoff_ms")]
    pub backoff_ms: u64,
    /// The user the ranks run as on their hosts (None: each agent's
    /// `[jobs] default_user`). Agents refuse a user that does not exist
    /// there, that their `allowed_users` do not list, or root (unless they
    /// allow it). Last, so older bincode layouts differ only at the end.
    #[serde(default)]
    pub user: Option<String>,
    /// Ranks on each host (torchrun's `--nproc-per-node`): an incarnation
    /// takes `ranks / ranks_per_host` hosts, host `g` running ranks
    /// `g * ranks_per_host ..` in a row, each with its `LOCAL_RANK`.
    #[serde(default = "one")]
    pub ranks_per_host: u32,
}

fn one() -> u32 {
    1
}

/// Longest job user name (useradd's limit).
pub const MAX_USER_NAME: usize = 32;

/// A user name a job may ask for: 1 to [`MAX_USER_NAME`] bytes of ASCII
/// letters, digits, `_`, `.` and `-`, not starting with `-` or `.` and not
/// all digits (a number would read as a uid).
pub fn check_user_name(user: &str) -> Result<(), CmdError> {
    let ok = !user.is_empty()
        && user.len() <= MAX_USER_NAME
        && user
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        && !user.starts_with(['-', '.'])
        && !user.bytes().all(|b| b.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(CmdError::InvalidArgument(format!(
            "user {user:?} must be 1-{MAX_USER_NAME} bytes of letters, digits, _ . - (not first: - or .; not all digits)"
        )))
    }
}

fn default_max_restarts() -> u32 {
    3
}

fn default_backoff_ms() -> u64 {
    1_000
}

impl JobSpec {
    /// Hosts one incarnation takes.
    pub fn host_count(&self) -> usize {
        (self.ranks / self.ranks_per_host.max(1)) as usize
    }

    /// Checks what the types cannot.
    pub fn validate(&self) -> Result<(), CmdError> {
        let bad = |m: String| Err(CmdError::InvalidArgument(m));
        crate::model::check_name("job name", &self.name)?;
        if self.ranks == 0 || self.ranks > MAX_RANKS {
            return bad(format!("ranks must be 1..={MAX_RANKS}"));
        }
        if self.ranks_per_host == 0 || self.ranks_per_host > MAX_RANKS_PER_HOST {
            return bad(format!("ranks_per_host must be 1..={MAX_RANKS_PER_HOST}"));
        }
        if !self.ranks.is_multiple_of(self.ranks_per_host) {
            return bad(format!(
                "ranks ({}) must be a multiple of ranks_per_host ({})",
                self.ranks, self.ranks_per_host
            ));
        }
        if !self.hosts.is_empty() && self.hosts.len() < self.host_count() {
            return bad(format!(
                "{} ranks at {} per host need {} hosts; `hosts` lists {}",
                self.ranks,
                self.ranks_per_host,
                self.host_count(),
                self.hosts.len()
            ));
        }
        let mut seen = BTreeSet::new();
        for h in &self.hosts {
            crate::model::check_name("host name", h)?;
            if !seen.insert(h) {
                return bad(format!("host {h:?} is listed twice"));
            }
        }
        crate::model::check_labels(&self.labels, &[])?;
        if self.command.is_empty() || self.command[0].is_empty() {
            return bad("command must name a program".into());
        }
        let bytes: usize = self.command.iter().map(|a| a.len() + 1).sum::<usize>()
            + self
                .env
                .iter()
                .map(|(k, v)| k.len() + v.len() + 2)
                .sum::<usize>();
        if bytes > MAX_COMMAND_BYTES {
            return bad(format!(
                "command and environment take {bytes} bytes; at most {MAX_COMMAND_BYTES}"
            ));
        }
        if self.command.iter().any(|a| a.contains('\0')) {
            return bad("command arguments cannot contain NUL".into());
        }
        if self.env.len() > MAX_ENV {
            return bad(format!("at most {MAX_ENV} environment entries"));
        }
        for (k, v) in &self.env {
            let ok = !k.is_empty()
                && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !k.starts_with(|c: char| c.is_ascii_digit());
            if !ok || v.contains('\0') {
                return bad(format!(
                    "environment variable {k:?} needs a name of letters, digits and _ (not first) and a value without NUL"
                ));
            }
            if k.starts_with("RAILGUARD_") {
                return bad(format!(
                    "environment variable {k:?}: RAILGUARD_* is set by the agent"
                ));
            }
        }
        if !self.checkpoint_dir.starts_with('/') || self.checkpoint_dir.contains('\0') {
            return bad(format!(
                "checkpoint_dir must be an absolute path, got {:?}",
                self.checkpoint_dir
            ));
        }
        if self.checkpoint_dir.len() > 4096 {
            return bad("checkpoint_dir is longer than 4096 bytes".into());
        }
        if self.max_restarts > 1_000 {
            return bad("max_restarts must be at most 1000".into());
        }
        if let Some(u) = &self.user {
            check_user_name(u)?;
        }
        if self.backoff_ms > MAX_BACKOFF_MS {
            return bad(format!(
                "backoff must be at most {} s",
                MAX_BACKOFF_MS / 1000
            ));
        }
        Ok(())
    }
}

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Pending,
    Running,
    Checkpointing,
    Restarting,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobState {
    /// Succeeded, Failed or Cancelled: nothing more happens.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }
}

/// How a rank ended, as its agent reported.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Exit {
    pub code: i32,
    /// The signal that ended it (0: it exited by itself).
    pub signal: i32,
    pub detail: String,
}

impl Exit {
    pub fn success(&self) -> bool {
        self.code == 0 && self.signal == 0
    }

    pub(in crate::model) fn describe(&self) -> String {
        let how = if self.signal != 0 {
            format!("killed by signal {}", self.signal)
        } else {
            format!("exit code {}", self.code)
        };
        if self.detail.is_empty() {
            how
        } else {
            format!("{how} ({})", self.detail)
        }
    }
}

/// One rank of the current incarnation.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Rank {
    pub host: String,
    /// Its agent answered the start order.
    pub started: bool,
    pub exit: Option<Exit>,
}

/// A training job.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Job {
    pub name: String,
    /// Host of each rank of the current incarnation (empty while none is
    /// placed).
    pub placement: Vec<String>,
    /// Bumped each time the job is placed; every order carries it.
    pub incarnation: u64,
    pub spec: JobSpec,
    pub state: JobState,
    /// Submission number (gives the data port).
    pub number: u64,
    pub port: u16,
    pub submitted_ms: u64,
    pub state_since_ms: u64,
    /// Restarts after failures (planned moves are not counted).
    pub restarts: u32,
    /// Failures since the job last completed a checkpoint: the backoff's
    /// exponent (a job that makes progress between failures keeps a short
    /// backoff, as Kubernetes resets CrashLoopBackOff after a good run).
    pub failures_in_a_row: u32,
    /// No placement before this leader time (restart backoff).
    pub not_before_ms: u64,
    pub ranks: Vec<Rank>,
    /// The step the current incarnation resumed from (0: from scratch).
    pub resume_step: u64,
    /// Ranks whose part of the checkpoint at each step is durable (the
    /// newest [`MAX_CHECKPOINTS`] steps). A list of pairs on the wire: the
    /// admin JSON is an internally tagged enum, which cannot read integer
    /// map keys back.
    #[serde(with = "pairs")]
    pub checkpoints: BTreeMap<u64, BTreeSet<u32>>,
    /// The newest complete checkpoint.
    pub latest_checkpoint: Option<u64>,
    /// When it became complete (leader time).
    pub latest_checkpoint_ms: Option<u64>,
    /// Hosts whose ranks of an older incarnation must be stopped before the
    /// job is placed again (host → that incarnation).
    pub stopping: BTreeMap<String, u64>,
    /// The placement before the last stop (kept hosts are preferred).
    pub previous_placement: Vec<String>,
    /// The current checkpoint order halts the ranks (a drain moves the job).
    pub halting: bool,
    /// Hosts that were Down when an incarnation of theirs ended: they get
    /// a stop order when they are back (host → newest such incarnation).
    pub fenced: BTreeMap<String, u64>,
    /// Why the job last restarted, failed or was cancelled.
    pub reason: String,
}

impl Job {
    /// Hosts of the current incarnation, each once.
    pub fn hosts(&self) -> BTreeSet<&str> {
        self.placement.iter().map(String::as_str).collect()
    }

    pub(in crate::model) fn record_checkpoint(&mut self, at_ms: u64, rank: u32, step: u64) -> bool {
        if step == 0 || rank >= self.spec.ranks {
            return false;
        }
        let e = self.checkpoints.entry(step).or_default();
        e.insert(rank);
        while self.checkpoints.len() > MAX_CHECKPOINTS {
            self.checkpoints.pop_first();
        }
        let complete = self
            .checkpoints
            .get(&step)
            .is_some_and(|r| r.len() == self.spec.ranks as usize);
        if complete && self.latest_checkpoint.is_none_or(|s| s < step) {
            self.latest_checkpoint = Some(step);
            self.latest_checkpoint_ms = Some(at_ms);
            self.failures_in_a_row = 0;
            return true;
        }
        false
    }
}

/// A map as a sequence of (key, value) pairs.
mod pairs {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<K, V, S>(m: &BTreeMap<K, V>, s: S) -> Result<S::Ok, S::Error>
    where
        K: Serialize,
        V: Serialize,
        S: Serializer,
    {
        s.collect_seq(m.iter())
    }

    pub fn deserialize<'de, K, V, D>(d: D) -> Result<BTreeMap<K, V>, D::Error>
    where
        K: Deserialize<'de> + Ord,
        V: Deserialize<'de>,
        D: Deserializer<'de>,
    {
        Ok(Vec::<(K, V)>::deserialize(d)?.into_iter().collect())
    }
}

/// The data port of the `number`th job.
pub fn port_of(number: u64) -> u16 {
    PORT_BASE + (number % PORT_SPAN) as u16
}

/// Leader decisions about jobs (proposed by the reconciler, checked again
/// at apply).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum JobCommand {
    /// Place the job's next incarnation (`incarnation` is the current one).
    Place {
        job: String,
        incarnation: u64,
        placement: Vec<String>,
    },
    /// Stop the incarnation and place the job again (`planned`: a move
    /// that does not count as a failure and waits no backoff).
    Restart {
        job: String,
        incarnation: u64,
        reason: String,
        planned: bool,
    },
    /// Checkpoint the incarnation with `halt` (a drain moves it).
    Halt { job: String, incarnation: u64 },
}

/// Admin operations on jobs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum JobOp {
    Submit { spec: JobSpec },
    Cancel { job: String },
    Restart { job: String, reason: String },
    Checkpoint { job: String },
}

impl JobOp {
    pub fn job(&self) -> &str {
        match self {
            JobOp::Submit { spec } => &spec.name,
            JobOp::Cancel { job } | JobOp::Restart { job, .. } | JobOp::Checkpoint { job } => job,
        }
    }
}
