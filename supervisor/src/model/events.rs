//! What agents report (sequence-numbered events) and the cluster event log.

use crate::model::hosts::NicState;
use serde::{Deserialize, Serialize};

/// One agent event with its per-agent sequence number.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AgentEvent {
    pub seq: u64,
    pub at_unix_ns: u64,
    pub kind: AgentEventKind,
}

/// What an agent reports.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub enum AgentEventKind {
    NicState {
        nic: String,
        state: NicState,
        carrier_changes: u64,
        flaps: u32,
        damping_penalty: f64,
        /// Earlier transitions folded into this one by a full agent outbox.
        coalesced: u32,
        /// The link itself is up (independent of damping).
        link_up: bool,
        /// Down because probes stopped crossing the link while the link
        /// layer still said up.
        probes_lost: bool,
    },
    /// Where a job's connection runs (or that it closed).
    QpPlacement {
        job: String,
        rank: u32,
        conn_id: u64,
        nic: String,
        peer_host: String,
        peer_rank: u32,
        rail: u32,
        moved: bool,
        closed: bool,
    },
    /// The agent (re)started: forget the host's placements (live jobs
    /// register theirs again).
    QpReset,
    /// The agent's reflex ordered the connections off a NIC that went down.
    ReflexDone {
        nic: String,
        conns: u32,
        ok: bool,
        detail: String,
    },
    /// A rank the agent launched exited (`signal` 0: by itself).
    RankExited {
        job: String,
        incarnation: u64,
        rank: u32,
        exit_code: i32,
        signal: i32,
        detail: String,
    },
    /// A rank's checkpoint at `step` is durable.
    RankCheckpoint {
        job: String,
        incarnation: u64,
        rank: u32,
        step: u64,
    },
}

/// A line of the cluster's event log (`railguard events`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ClusterEvent {
    pub seq: u64,
    pub at_ms: u64,
    pub host: Option<String>,
    pub what: String,
    /// For events an agent reported: when the agent observed it (its wall
    /// clock, Unix ns).
    #[serde(default)]
    pub observed_unix_ns: Option<u64>,
}
