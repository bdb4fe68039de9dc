//! The Raft entry (`Proposal`), the typed commands in it, and client
//! request ids for exactly-once admin writes.

use crate::model::admin::AdminOp;
use crate::model::events::AgentEvent;
use crate::model::hosts::{ClockChange, Liveness, NicSpec};
use crate::model::intents::{Action, Outcome};
use crate::model::jobs::types::JobCommand;
use crate::model::result::CmdResult;
use crate::model::runs::types::RunCommand;
use proto::agent::OrderOutcome;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Cursor;

/// Supervisor node id (Raft member id).
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// The Raft type configuration of the supervisor cluster.
    pub TypeConfig:
        D = Proposal,
        R = Vec<CmdResult>,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
);

/// One Raft entry: a batch of commands stamped by the leader.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Proposal {
    /// Leader wall-clock time in Unix milliseconds when the batch was formed.
    pub at_ms: u64,
    /// Commands applied in order; each gets its own result.
    pub cmds: Vec<Command>,
}

/// A typed, validated state change.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub enum Command {
    /// An agent (re-)registers its host and NICs. Idempotent: NIC state and
    /// history survive a re-registration; NICs no longer reported are removed.
    RegisterHost {
        host: String,
        nics: Vec<NicSpec>,
        labels: BTreeMap<String, String>,
    },
    /// An admin operation, recorded with who asked for it. With a request
    /// id it is applied at most once however often it is retried (client
    /// sessions, Raft dissertation §6.3): a retry gets the first result.
    Admin {
        actor: String,
        op: AdminOp,
        request: Option<RequestId>,
    },
    /// A batch of sequence-numbered events from one agent.
    AgentEvents {
        host: String,
        events: Vec<AgentEvent>,
    },
    /// The leader's liveness detector changes a host's liveness.
    SetLiveness { host: String, liveness: Liveness },
    /// The leader's clock service commits hosts whose clock state changed
    /// (the figures alone never go through Raft). All or nothing: an
    /// unknown host refuses the whole command.
    SetClockStates { changes: Vec<ClockChange> },
    /// Record an intent (what is about to be done) before doing it.
    OpenIntent { action: Action },
    /// Record an intent's outcome and apply its effect.
    CloseIntent { id: u64, outcome: Outcome },
    /// A host's agent answers an order (an order intent): closes the
    /// intent Done or Failed with the agent's typed outcome (a checkpoint
    /// order's answer carries its step). Only the host the order was for
    /// may answer it; answering twice is a no-op.
    OrderDone {
        host: String,
        id: u64,
        outcome: OrderOutcome,
    },
    /// A leader decision about a job (placement, restart, drain move).
    Job(JobCommand),
    /// A leader decision about playbook runs (start one for an incident).
    Playbook(RunCommand),
    /// The first leader of a new cluster installs the shipped playbooks
    /// (`playbooks::SHIPPED`) once. Files naming a playbook already stored
    /// are skipped (an admin's own version wins); a second install is a
    /// no-op.
    InstallShippedPlaybooks {
        files: Vec<crate::model::playbook_store::PlaybookFile>,
    },
    /// The leader's webhook sender closes a `notify` step's intent with
    /// the endpoint's answer (see `webhooks.rs`); a second answer is a
    /// no-op.
    WebhookDone { id: u64, ok: bool, detail: String },
    /// The leader's contention detector opens or closes a
    /// `link_contention` incident ([`crate::model::shaping`]).
    Contention(crate::model::shaping::ContentionCommand),
}

/// Identifies one client request across retries: the client's session id
/// (random per client instance) and a serial unique within it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RequestId {
    pub client: String,
    pub serial: u64,
    /// Set on every attempt after the first. A first attempt cannot have
    /// been applied before, so it is never refused as forgotten (requests
    /// of one session may arrive out of order when a client has several in
    /// flight). Defaults to false in a JSON request (clients that never
    /// retry may leave it out); bincode always carries it.
    #[serde(default)]
    pub retry: bool,
}

/// What the model remembers of one client session.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Session {
    /// Leader time of the last request applied in this session.
    pub last_used_ms: u64,
    /// Results of the most recent requests, by serial.
    pub results: BTreeMap<u64, CmdResult>,
    /// Every serial at or below this one may have been forgotten.
    pub forgotten_through: u64,
}
