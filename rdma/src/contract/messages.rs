//! The contract's vocabulary: the messages a job and its agent exchange,
//! their `type` tags, the bounds every line and name respects, and the
//! checks the types cannot express.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::error::ContractError;

/// Where the agent listens unless configured otherwise.
pub const DEFAULT_SOCKET: &str = "/run/railguard/agent.sock";
/// Environment variable that names the socket (set for jobs the agent launches).
pub const SOCKET_ENV: &str = "RAILGUARD_AGENT_SOCKET";
/// The socket to use: `$RAILGUARD_AGENT_SOCKET`, else [`DEFAULT_SOCKET`].
pub fn socket_path() -> PathBuf {
    std::env::var_os(SOCKET_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET))
}

/// Longest line accepted in either direction (bytes, without the newline).
pub const MAX_LINE: usize = 64 << 10;
/// Longest job, NIC or host name.
pub const MAX_NAME_LEN: usize = 253;
/// Longest `order_done` detail (longer ones are cut by the client).
pub const MAX_DETAIL_LEN: usize = 1024;
/// Most connection ids in one `migrate` order (larger sets are split, which
/// keeps every order line far below [`MAX_LINE`]).
pub const MAX_MIGRATE_CONNS: usize = 1024;
/// Most connections one client registers.
pub const MAX_CONNS_PER_CLIENT: usize = 4096;

/// First message of a connection: who is talking.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub job: String,
    pub rank: u32,
    pub pid: u32,
}

/// A connection (queue pair) of a rank and where it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnUp {
    pub job: String,
    pub rank: u32,
    pub conn_id: u64,
    /// The NIC the connection uses now.
    pub nic: String,
    pub peer_host: String,
    pub peer_rank: u32,
    /// The connection's home rail.
    pub rail: u32,
}

/// A job's answer to an order (`order_done`). A checkpoint order's
/// success names the checkpoint's `step` in its own field: nothing reads
/// the detail for meaning.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderAnswer {
    pub order_id: u64,
    pub ok: bool,
    /// For people and logs (at most [`MAX_DETAIL_LEN`] bytes).
    #[serde(default)]
    pub detail: String,
    /// The step of the checkpoint written for a checkpoint order; only
    /// with `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
}

/// Job → agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum JobMessage {
    Hello(Hello),
    ConnUp(ConnUp),
    ConnMoved {
        conn_id: u64,
        nic: String,
    },
    ConnClosed {
        conn_id: u64,
    },
    OrderDone(OrderAnswer),
    /// This rank's checkpoint at `step` is durable.
    Checkpointed {
        step: u64,
    },
    /// The connection has had no path for a while: no rail it tried
    /// reached the peer. The agent tells the supervisor (once per
    /// connection and incarnation), which moves the job instead of
    /// waiting for the job's own timeout.
    ConnStalled {
        conn_id: u64,
    },
}

/// The `type` tags of [`JobMessage`].
pub const JOB_MESSAGE_TYPES: &[&str] = &[
    "hello",
    "conn_up",
    "conn_moved",
    "conn_closed",
    "order_done",
    "checkpointed",
    "conn_stalled",
];

/// What an order asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OrderKind {
    /// Move these connections to `to_nic` (None: any healthy NIC).
    Migrate {
        conn_ids: Vec<u64>,
        #[serde(default)]
        to_nic: Option<String>,
    },
    /// Limit a connection's rate (None: no limit).
    Pace {
        conn_id: u64,
        #[serde(default)]
        bytes_per_s: Option<u64>,
    },
    /// Write a checkpoint (at `step`, or the next one every rank can
    /// reach); with `halt`, compute nothing after it until stopped.
    Checkpoint {
        #[serde(default)]
        step: Option<u64>,
        #[serde(default)]
        halt: bool,
    },
    /// Stop the job.
    Stop,
}

/// An order for the job; answer it with
/// [`ContractClient::order_done`](super::ContractClient::order_done).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    pub order_id: u64,
    pub kind: OrderKind,
}

/// Agent → job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentMessage {
    Ok,
    Error {
        message: String,
    },
    Order(Order),
    /// The host's NICs out of service for connections: those an admin holds
    /// (`railguard nic failover`, until `nic failback`) and those the agent
    /// finds Degraded (losing packets, link up): the whole set, sent after
    /// every accepted hello and whenever it changes. Not an order: nothing
    /// answers it.
    HeldOut {
        nics: Vec<String>,
    },
}

/// The `type` tags of [`AgentMessage`].
pub const AGENT_MESSAGE_TYPES: &[&str] = &["ok", "error", "order", "held_out"];

/// Most NICs a `held_out` message names.
pub const MAX_HELD_OUT_NICS: usize = 64;

impl AgentMessage {
    /// Checks what the types cannot (names, lengths).
    pub fn validate(&self) -> Result<(), ContractError> {
        match self {
            AgentMessage::HeldOut { nics } => {
                if nics.len() > MAX_HELD_OUT_NICS {
                    return Err(ContractError::Invalid(format!(
                        "held_out names {} NICs; at most {MAX_HELD_OUT_NICS}",
                        nics.len()
                    )));
                }
                nics.iter().try_for_each(|n| check_name("nic", n))
            }
            AgentMessage::Ok | AgentMessage::Error { .. } | AgentMessage::Order(_) => Ok(()),
        }
    }
}

/// Checks a name (job, NIC, host): 1..=253 bytes, no whitespace or control
/// characters.
pub fn check_name(what: &str, s: &str) -> Result<(), ContractError> {
    if s.is_empty() || s.len() > MAX_NAME_LEN {
        return Err(ContractError::Invalid(format!(
            "{what} must be 1..={MAX_NAME_LEN} bytes"
        )));
    }
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ContractError::Invalid(format!(
            "{what} {s:?} contains whitespace or control characters"
        )));
    }
    Ok(())
}

impl JobMessage {
    /// Checks what the types cannot (names, lengths).
    pub fn validate(&self) -> Result<(), ContractError> {
        match self {
            JobMessage::Hello(h) => check_name("job", &h.job),
            JobMessage::ConnUp(c) => {
                check_name("job", &c.job)?;
                check_name("nic", &c.nic)?;
                check_name("peer_host", &c.peer_host)
            }
            JobMessage::ConnMoved { nic, .. } => check_name("nic", nic),
            JobMessage::ConnClosed { .. }
            | JobMessage::Checkpointed { .. }
            | JobMessage::ConnStalled { .. } => Ok(()),
            JobMessage::OrderDone(a) => {
                if a.detail.len() > MAX_DETAIL_LEN {
                    return Err(ContractError::Invalid(format!(
                        "detail longer than {MAX_DETAIL_LEN} bytes"
                    )));
                }
                if let (false, Some(step)) = (a.ok, a.step) {
                    return Err(ContractError::Invalid(format!(
                        "order {} failed but names checkpoint step {step}",
                        a.order_id
                    )));
                }
                Ok(())
            }
        }
    }
}

/// `s` cut to at most `max` bytes at a character boundary.
pub fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
