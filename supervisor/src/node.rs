//! One supervisor's Raft node: start-up, leadership (`leads`, `leader`),
//! the read paths, the proposal batcher and membership. The leader-memory
//! services that act on it (clock, contention, orders, webhooks, liveness,
//! the reconciler) live in `leader/` and depend on this node, never
//! the other way round.
//!
//! **Write path.** A command is validated against the local state, queued on
//! the bounded proposal queue, and the batcher packs everything queued into
//! one Raft entry ([`Proposal`]) stamped with the leader's clock. Entries are
//! handed to openraft in queue order (`client_write_ff`), so commands from one
//! caller are committed in the order they were submitted. At most
//! [`MAX_INFLIGHT_PROPOSALS`] entries are in flight, each for at most
//! [`INFLIGHT_HOLD`]: openraft answers a proposal when its entry is applied
//! or truncated, never when a snapshot from a newer leader replaces the log
//! it sat in (a deposed leader's entries), so an unanswered one must not
//! hold its slot for ever. An answer for an entry of another term than the
//! one proposed in is not taken as this proposal's.
//!
//! **Read path.** Linearizable reads use openraft's read index
//! (`ensure_linearizable`) on the leader; `--stale` reads use local state.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers, Raft, ServerState};
use raft_store::SharedApplied;
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::api::{ApiError, ErrorKind, MemberView};
use crate::config::SupervisorConfig;
use crate::election_gate::{ElectionGate, VoteRefusals};
use crate::model::{ClusterState, CmdOk, Command, NodeId, Proposal, TypeConfig};
use crate::network::PeerNetworkFactory;
use crate::replica::Replica;
use proto::v1::raft_peer_client::RaftPeerClient;
use tonic::transport::Channel;

/// Most commands packed into one Raft entry.
pub const MAX_BATCH: usize = 2048;
/// Capacity of the proposal queue; callers wait (bounded) when it is full.
pub const PROPOSAL_QUEUE: usize = 16_384;
/// Raft entries proposed but not yet answered.
pub const MAX_INFLIGHT_PROPOSALS: usize = 4;
/// How long a caller waits for its write to commit.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest an entry holds one of the in-flight slots (its callers have
/// given up by then).
pub const INFLIGHT_HOLD: Duration = Duration::from_secs(6);

type Reply = oneshot::Sender<Result<CmdOk, ApiError>>;

/// Wall-clock time in Unix milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A running supervisor node.
pub struct Supervisor {
    pub id: NodeId,
    pub config: SupervisorConfig,
    pub raft: Raft<TypeConfig>,
    state: SharedApplied<TypeConfig, Replica>,
    proposals: mpsc::Sender<(Command, Reply)>,
    /// How this node dials its peers (its own certificate).
    pub client_tls: crate::network::ClientTls,
    /// The revoked serials the TLS server refuses, kept equal to the
    /// replicated `ClusterState::revoked` ([`sync_revocations`]).
    pub revocations: pki::Revocations,
    /// One channel per peer address, shared by Raft, forwarding and
    /// leadership transfer.
    peer_clients: crate::network::PeerClients,
    /// The term in which this node last confirmed its leadership with a
    /// quorum (0: never); see [`Supervisor::leads`].
    confirmed_term: Arc<AtomicU64>,
    /// When this node may campaign.
    pub election_gate: ElectionGate,
}

/// Start-up failures.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The Raft log or state machine cannot be opened.
    #[error(transparent)]
    Store(#[from] raft_store::StoreError),
    /// openraft refused the configuration or failed to start.
    #[error("raft: {0}")]
    Raft(String),
    /// This supervisor's TLS files cannot be used as a client.
    #[error("TLS: {0}")]
    Tls(#[from] pki::PkiError),
    /// The audit archive (`DATA_DIR/archive`) cannot be opened, or its
    /// thread cannot start.
    #[error(transparent)]
    Archive(#[from] crate::archive::ArchiveError),
}

impl Supervisor {
    /// Opens the store in `config.data_dir` and starts the Raft node. The
    /// caller must already hold the data directory lock.
    /// `revocations` is the TLS server's handle, kept equal to the
    /// replicated revocation list.
    pub async fn start(
        config: SupervisorConfig,
        revocations: pki::Revocations,
    ) -> Result<Arc<Self>, StartError> {
        let raft_config = openraft::Config {
            cluster_name: "railguard".into(),
            heartbeat_interval: config.raft.heartbeat_ms,
            election_timeout_min: config.raft.election_min_ms,
            election_timeout_max: config.raft.election_max_ms,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(config.raft.snapshot_every),
            // Keep a tail for slow followers, never more than one interval.
            max_in_snapshot_log_to_keep: config.raft.snapshot_every.min(1_000),
            max_payload_entries: 256,
            // A follower that fell behind the last snapshot (cut off for a
            // few seconds under load) gets the snapshot in chunks, each
            // sent, and the last also installed, within the timeout.
            // openraft's defaults (one 3 MiB chunk, 200 ms) never finished
            // a 1.9 MB snapshot on a loaded machine: every retry restarted
            // it, reset an HTTP/2 stream, and the peer connection went down
            // with the resets (found by the partitions scenario: no commit
            // for minutes after the split healed).
            snapshot_max_chunk_size: SNAPSHOT_CHUNK_BYTES,
            install_snapshot_timeout: SNAPSHOT_CHUNK_TIMEOUT_MS,
            ..Default::default()
        }
        .validate()
        .map_err(|e| StartError::Raft(e.to_string()))?;
        let client_tls = crate::network::ClientTls::from_mode(&config.tls)?;
        let peer_clients = crate::network::PeerClients::new(client_tls.clone());
        let refusals = Arc::new(VoteRefusals::default());
        let (log, sm) = raft_store::open::<TypeConfig, Replica>(&config.data_dir.join("raft"))?;
        let archiver = crate::archive::Archiver::open(&config.data_dir.join("archive"))?;
        let state = sm.shared();
        let raft = Raft::new(
            config.id,
            Arc::new(raft_config),
            PeerNetworkFactory {
                clients: peer_clients.clone(),
                refusals: refusals.clone(),
            },
            log,
            sm,
        )
        .await
        .map_err(|e| StartError::Raft(e.to_string()))?;
        let (tx, rx) = mpsc::channel(PROPOSAL_QUEUE);
        let sup = Arc::new(Self {
            id: config.id,
            config,
            raft: raft.clone(),
            state,
            proposals: tx,
            client_tls,
            revocations,
            peer_clients,
            confirmed_term: Arc::new(AtomicU64::new(0)),
            election_gate: ElectionGate::new(raft.clone(), refusals),
        });
        tokio::spawn(run_election_gate(Arc::downgrade(&sup)));
        tokio::spawn(run_batcher(raft.clone(), sup.id, rx));
        tokio::spawn(sync_revocations(Arc::downgrade(&sup)));
        tokio::spawn(confirm_leadership(raft, sup.confirmed_term.clone()));
        let dir = archiver.dir().to_owned();
        let weak = Arc::downgrade(&sup);
        crate::archive::spawn(archiver, move |cursor| {
            let s = weak.upgrade()?;
            let batch = s.read(|st| crate::archive::Batch::collect(cursor, st));
            Some(batch)
        })
        .map_err(|source| crate::archive::ArchiveError::Io { path: dir, source })?;
        Ok(sup)
    }

    /// This node's advertised address.
    pub fn addr(&self) -> String {
        self.config.listen.to_string()
    }

    /// The leader this node currently knows of.
    pub fn leader(&self) -> Option<NodeId> {
        self.raft.metrics().borrow().current_leader
    }

    /// Whether this node is the leader right now.
    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow().state == ServerState::Leader
    }

    /// Whether this node leads and has confirmed it with a quorum in its
    /// current term. The leader-side services (reconciler, liveness, clock,
    /// contention) act only then: a restarted leader that openraft restores
    /// into its old term believes it leads until it hears of the newer
    /// term, and must not decide anything from its stale state meanwhile.
    pub fn leads(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.state == ServerState::Leader
            && self.confirmed_term.load(Ordering::Acquire) == m.current_term
    }

    /// The term in which this node leads with a quorum's confirmation
    /// (what agents fence orders by), read together with the role: `None`
    /// while it does not, so a woken deposed leader that has just heard a
    /// newer term never stamps its stale orders with it.
    pub fn leading_term(&self) -> Option<u64> {
        let m = self.raft.metrics();
        let m = m.borrow();
        (m.state == ServerState::Leader
            && self.confirmed_term.load(Ordering::Acquire) == m.current_term)
            .then_some(m.current_term)
    }

    /// Address of the leader, if known.
    pub fn leader_addr(&self) -> Option<String> {
        let m = self.raft.metrics().borrow().clone();
        let leader = m.current_leader?;
        m.membership_config
            .membership()
            .get_node(&leader)
            .map(|n| n.addr.clone())
    }

    /// A (cached, lazily connecting) client for the peer at `addr`,
    /// dialled again after this supervisor's certificate was reloaded.
    pub fn peer(&self, addr: &str) -> Result<RaftPeerClient<Channel>, ApiError> {
        self.peer_clients
            .get(addr)
            .map_err(|e| ApiError::internal(format!("bad peer address {addr}: {e}")))
    }

    /// Address of member `id`, if it is one.
    pub fn member_addr(&self, id: NodeId) -> Option<String> {
        self.raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .get_node(&id)
            .map(|n| n.addr.clone())
    }

    /// Reads the local (possibly stale) state.
    pub fn read<T>(&self, f: impl FnOnce(&ClusterState) -> T) -> T {
        let st = self.state.read().expect("state lock poisoned");
        f(&st.model.state)
    }

    /// Reads the local state with this member's apply times beside it
    /// ([`Replica`]).
    pub fn read_replica<T>(&self, f: impl FnOnce(&Replica) -> T) -> T {
        let st = self.state.read().expect("state lock poisoned");
        f(&st.model)
    }

    /// Reads the state linearizably: waits until this leader has applied
    /// everything committed before the call. Errors with `Unavailable` if
    /// this node is not the leader.
    pub async fn read_linearizable<T>(
        &self,
        f: impl FnOnce(&ClusterState) -> T,
    ) -> Result<T, ApiError> {
        self.linearizable_barrier("linearizable read").await?;
        Ok(self.read(f))
    }

    /// Returns once this node has confirmed with a quorum that it leads and
    /// has applied every entry acknowledged before the call, so local state
    /// read afterwards is linearizable. `Unavailable` if it does not lead.
    ///
    /// `is_leader()` alone is not enough: openraft restores a restarted
    /// leader whose persisted vote is committed as leader of its old term at
    /// once, and until it hears of the newer term it answers from a state
    /// that may miss writes the cluster has acknowledged since (found by the
    /// leader-kill scenario: an uncordon refused as "draining" after the
    /// undrain was acknowledged).
    pub async fn linearizable_barrier(&self, what: &'static str) -> Result<(), ApiError> {
        // Everything in the leader's log when the barrier starts, which
        // includes every write acknowledged before it.
        let last_log = self.raft.metrics().borrow().last_log_index;
        self.raft.ensure_linearizable().await.map_err(|e| match e {
            RaftError::APIError(e) => ApiError::unavailable(format!("not the leader: {e}")),
            RaftError::Fatal(e) => ApiError::internal(format!("raft stopped: {e}")),
        })?;
        // openraft's read index is max(noop, committed). A leader that
        // restarts into the same term (its persisted vote says it leads)
        // reuses its old noop and a committed id that may be stale, so the
        // read index alone can be behind writes it acknowledged before the
        // crash (found by the cluster-crash scenario). Waiting for the log
        // as of the barrier's start closes that gap without a flush per
        // commit.
        self.raft
            .wait(Some(WRITE_TIMEOUT))
            .applied_index_at_least(last_log, what)
            .await
            .map_err(|e| ApiError::unavailable(format!("{what} not served: {e}")))?;
        Ok(())
    }

    /// Validates and proposes one command; resolves when it is applied.
    ///
    /// Errors: the command's own validation error (nothing written);
    /// `Unavailable` when this node is not the leader (nothing written);
    /// `Unknown` when the outcome cannot be known (e.g. a timeout).
    ///
    /// A command with a request id that was already applied is answered with
    /// its first result and not proposed again.
    pub async fn propose(&self, cmd: Command) -> Result<CmdOk, ApiError> {
        if !self.is_leader() {
            return Err(ApiError::unavailable("this supervisor is not the leader"));
        }
        let request = match &cmd {
            Command::Admin {
                request: Some(r), ..
            } => Some(r.clone()),
            _ => None,
        };
        let mut checked = self.read(|st| precheck(st, request.as_ref(), &cmd));
        if matches!(checked, Precheck::Refused(_) | Precheck::Remembered(Err(_))) {
            // A refusal is an answer about the state, so it must be as
            // linearizable as a read: confirm leadership and catch up with
            // the whole log (a retry whose first attempt is committed but
            // not yet applied here would otherwise fail validation against
            // the state before it), then decide again.
            self.linearizable_barrier("validation").await?;
            checked = self.read(|st| precheck(st, request.as_ref(), &cmd));
        }
        match checked {
            Precheck::Remembered(done) => return done.map_err(ApiError::from),
            // A retry refused by validation goes through the log, so that
            // its session remembers the refusal: an earlier copy of the
            // same request may still be on its way (a forward held up by a
            // partition) and must find the refusal, not apply after the
            // caller was told "refused" (found by the partitions scenario
            // as a linearizability violation). A first attempt has no
            // other copy: refused here.
            Precheck::Refused(e) if !request.as_ref().is_some_and(|r| r.retry) => {
                return Err(ApiError::from(e))
            }
            Precheck::Refused(_) | Precheck::Propose => {}
        }
        let rx = self.enqueue(cmd).await?;
        match tokio::time::timeout(WRITE_TIMEOUT, rx).await {
            Err(_) => Err(ApiError::unknown(
                "the write did not commit within 5 s; its outcome is unknown",
            )),
            Ok(Err(_)) => Err(ApiError::unknown(
                "the supervisor stopped before the write was answered; its outcome is unknown",
            )),
            Ok(Ok(r)) => r,
        }
    }

    /// Queues a command without validation or waiting; the receiver yields
    /// its result. Used by streams that pipeline many commands in order.
    pub async fn enqueue(
        &self,
        cmd: Command,
    ) -> Result<oneshot::Receiver<Result<CmdOk, ApiError>>, ApiError> {
        let (tx, rx) = oneshot::channel();
        match tokio::time::timeout(WRITE_TIMEOUT, self.proposals.send((cmd, tx))).await {
            Ok(Ok(())) => Ok(rx),
            Ok(Err(_)) => Err(ApiError::unavailable("supervisor is shutting down")),
            Err(_) => Err(ApiError::unavailable(
                "proposal queue full for 5 s; the cluster is overloaded",
            )),
        }
    }

    /// Whether this node hears the vote request of `candidate`, whose log
    /// ends at `candidate_last` (index): it must be a voter of the applied
    /// membership, or ahead of this node in the log (its log may then
    /// hold a membership this node has not applied: the leader that
    /// committed it died before telling this node; openraft's own log
    /// check decides then). openraft takes a configuration in effect the
    /// moment it is appended, so a member holding one that never
    /// committed (a promotion or an add its leader appended just before
    /// it paused) votes for a spare that is a voter there alone; that
    /// spare, refused by everyone else, campaigns without end, and the
    /// higher terms it hands the voting member reach the others through
    /// its answers: every election is cut short and no leader emerges
    /// (`scenario pause-leader`, 2 runs of 2 with 12 pauses). Such a
    /// spare's log is no longer than the member's, which had it from the
    /// same leader. Refusing a vote never breaks Raft's safety. A node
    /// with no membership applied yet (a new cluster's first election)
    /// hears every candidate.
    pub fn hears_candidate(&self, candidate: NodeId, candidate_last: Option<u64>) -> bool {
        let mine = self.raft.metrics().borrow().last_log_index;
        if candidate_last > mine {
            return true;
        }
        self.is_committed_voter(candidate)
    }

    /// Whether `id` is a voter of the applied membership (any node is
    /// while none is applied).
    pub fn is_committed_voter(&self, id: NodeId) -> bool {
        let st = self.state.read().expect("state lock poisoned");
        let mem = st.membership.membership();
        mem.nodes().next().is_none() || mem.voter_ids().any(|v| v == id)
    }

    /// Members as this node sees them.
    pub fn members(&self) -> Vec<MemberView> {
        let m = self.raft.metrics().borrow().clone();
        // The applied membership, not openraft's effective one: a
        // configuration is in effect from the moment it is appended, and
        // one that never commits (its leader died first) must never have
        // been shown, so a read after the barrier answers from what is
        // applied (hence committed).
        let mem = self
            .state
            .read()
            .expect("state lock poisoned")
            .membership
            .membership()
            .clone();
        let voters: BTreeSet<NodeId> = mem.voter_ids().collect();
        let repl = m.replication.clone().unwrap_or_default();
        mem.nodes()
            .map(|(id, node)| MemberView {
                id: *id,
                addr: node.addr.clone(),
                voter: voters.contains(id),
                leader: m.current_leader == Some(*id),
                matched: if *id == m.id && m.state == ServerState::Leader {
                    m.last_log_index
                } else {
                    repl.get(id).cloned().flatten().map(|l| l.index)
                },
            })
            .collect()
    }

    /// Initialises a new cluster with this node and its configured peers.
    pub async fn initialize(&self) -> Result<(), ApiError> {
        if self.raft.is_initialized().await.unwrap_or(false) {
            let m = self.raft.metrics().borrow().membership_config.clone();
            let ids: Vec<String> = m.membership().voter_ids().map(|i| i.to_string()).collect();
            return Err(ApiError::new(
                ErrorKind::FailedPrecondition,
                format!(
                    "the cluster is already initialized (members {}); nothing changed",
                    ids.join(", ")
                ),
            ));
        }
        let mut nodes = BTreeMap::new();
        nodes.insert(self.id, BasicNode { addr: self.addr() });
        for (id, addr) in &self.config.peers {
            nodes.insert(
                *id,
                BasicNode {
                    addr: addr.to_string(),
                },
            );
        }
        self.raft.initialize(nodes).await.map_err(|e| {
            ApiError::new(
                ErrorKind::FailedPrecondition,
                format!("cannot initialize: {e}"),
            )
        })
    }

    /// Adds a voter: first as a learner, waits (at most
    /// [`LEARNER_CATCH_UP`]) until the leader has replicated its log to
    /// it, then promotes it. When the new member never catches up (not
    /// running, unreachable, refusing the leader's certificate) or the
    /// promotion fails, a learner this call added is removed again, so a
    /// refused `add-member` changes nothing.
    pub async fn add_member(&self, id: NodeId, addr: String) -> Result<u64, ApiError> {
        if addr.parse::<std::net::SocketAddr>().is_err() {
            return Err(ApiError::invalid(format!(
                "member address {addr:?} is not IP:port"
            )));
        }
        if id == 0 {
            return Err(ApiError::invalid("member id must be a positive integer"));
        }
        let known = self
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .get_node(&id)
            .map(|n| n.addr.clone());
        let same = |at: &String| at.parse::<std::net::SocketAddr>().ok() == addr.parse().ok();
        if let Some(at) = known.as_ref().filter(|at| !same(at)) {
            return Err(ApiError::invalid(format!(
                "supervisor {id} is already a member at {at}, not {addr}; remove it first"
            )));
        }
        let known_before = known.is_some();
        let added = self
            .raft
            .add_learner(id, BasicNode { addr: addr.clone() }, false)
            .await
            .map_err(membership_err)?;
        let promoted = match self.learner_caught_up(id, added.log_id.index).await {
            Ok(()) => self
                .raft
                .change_membership(ChangeMembers::AddVoterIds([id].into()), true)
                .await
                .map_err(membership_err),
            Err(why) => Err(why),
        };
        let e = match promoted {
            Ok(r) => return Ok(r.log_id.index),
            Err(e) => e,
        };
        if e.kind == ErrorKind::Unavailable {
            // Leadership moved mid-call: the learner entry may stand, and
            // only the new leader could take it back.
            return Err(ApiError::new(
                ErrorKind::Unknown,
                format!(
                    "supervisor {id} at {addr}: leadership moved while it was being added ({}); \
                     it may remain a learner: see `cluster members`, and `cluster remove-member \
                     {id}` or add it again",
                    e.message
                ),
            ));
        }
        let undo = if known_before {
            "it stays as it was".to_string()
        } else {
            match self
                .raft
                .change_membership(ChangeMembers::RemoveNodes([id].into()), false)
                .await
            {
                Ok(_) => "the learner was removed again: nothing changed".to_string(),
                Err(u) => format!("removing the learner again failed too ({u}): remove it with `cluster remove-member {id}`"),
            }
        };
        tracing::warn!(member = id, %addr, error = %e.message, undo = %undo, "add-member refused");
        Err(ApiError::new(
            e.kind,
            format!(
                "supervisor {id} at {addr} was not added: {}; {undo}",
                e.message
            ),
        ))
    }

    /// Removes a member (voter or learner).
    pub async fn remove_member(&self, id: NodeId) -> Result<u64, ApiError> {
        let m = self.raft.metrics().borrow().clone();
        let mem = m.membership_config.membership();
        if mem.get_node(&id).is_none() {
            return Err(ApiError::new(
                ErrorKind::NotFound,
                format!("supervisor {id} is not a member"),
            ));
        }
        let is_voter = mem.voter_ids().any(|v| v == id);
        let change = if is_voter {
            ChangeMembers::RemoveVoters([id].into())
        } else {
            ChangeMembers::RemoveNodes([id].into())
        };
        let r = self
            .raft
            .change_membership(change, false)
            .await
            .map_err(membership_err)?;
        Ok(r.log_id.index)
    }

    /// Waits until the leader's replication to learner `id` has reached
    /// `index` (the log entry that added it), at most [`LEARNER_CATCH_UP`]
    /// in all (below the CLI's timeout, so the rollback runs before the
    /// caller gives up). `Unavailable` when this node stopped leading.
    async fn learner_caught_up(&self, id: NodeId, index: u64) -> Result<(), ApiError> {
        let mut metrics = self.raft.metrics();
        let deadline = tokio::time::Instant::now() + LEARNER_CATCH_UP;
        loop {
            let matched = {
                let m = metrics.borrow_and_update();
                match &m.replication {
                    None => return Err(ApiError::unavailable("this supervisor stopped leading")),
                    Some(r) => r.get(&id).cloned().flatten().map(|l| l.index),
                }
            };
            if matched.is_some_and(|i| i >= index) {
                return Ok(());
            }
            match tokio::time::timeout_at(deadline, metrics.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(ApiError::unavailable("raft stopped")),
                Err(_) => {
                    return Err(ApiError::new(
                        ErrorKind::FailedPrecondition,
                        format!(
                            "it did not catch up with the leader's log within {} s (is it \
                             running, reachable, and holding a supervisor certificate of this \
                             cluster's CA?)",
                            LEARNER_CATCH_UP.as_secs()
                        ),
                    ))
                }
            }
        }
    }
}

/// What the leader knows of a command before proposing it.
enum Precheck {
    /// The result of the request, already applied in its session.
    Remembered(crate::model::CmdResult),
    /// Refused by validation against the current state (nothing written).
    Refused(crate::model::CmdError),
    /// Valid now: to be proposed.
    Propose,
}

fn precheck(
    st: &ClusterState,
    request: Option<&crate::model::RequestId>,
    cmd: &Command,
) -> Precheck {
    match request.and_then(|r| st.session_result(r)) {
        Some(done) => Precheck::Remembered(done),
        None => match st.validate(cmd) {
            Ok(()) => Precheck::Propose,
            Err(e) => Precheck::Refused(e),
        },
    }
}

fn membership_err(e: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>) -> ApiError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(_)) => {
            ApiError::unavailable("this supervisor is not the leader")
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            ApiError::new(ErrorKind::FailedPrecondition, e.to_string())
        }
        RaftError::Fatal(e) => ApiError::internal(e.to_string()),
    }
}

/// Bytes per InstallSnapshot chunk.
const SNAPSHOT_CHUNK_BYTES: u64 = 256 << 10;
/// How long one snapshot chunk may take (sending; the last one also
/// installing: decoding and a synced write of the whole state).
const SNAPSHOT_CHUNK_TIMEOUT_MS: u64 = 5_000;

/// How long `add-member` waits for the new member to catch up before it
/// removes the learner again (below the CLI's default 10 s timeout).
const LEARNER_CATCH_UP: Duration = Duration::from_secs(6);

/// How long one leadership confirmation may take before it is tried again.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(1);
/// Pause after a refused confirmation before the next try.
const CONFIRM_RETRY: Duration = Duration::from_millis(50);

/// Re-evaluates the election gate while the node lives.
async fn run_election_gate(sup: std::sync::Weak<Supervisor>) {
    let mut tick = tokio::time::interval(crate::election_gate::TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(s) = sup.upgrade() else { return };
        s.election_gate.evaluate(s.is_committed_voter(s.id));
    }
}

/// Confirms leadership once per term (a read-index round with a quorum)
/// and records the term in `confirmed`, for [`Supervisor::leads`].
async fn confirm_leadership(raft: Raft<TypeConfig>, confirmed: Arc<AtomicU64>) {
    // Server metrics change with the role, vote or membership only, not
    // with every append and commit (as the full metrics do).
    let mut metrics = raft.server_metrics();
    loop {
        let (leader, term) = {
            let m = metrics.borrow_and_update();
            (m.state == ServerState::Leader, m.vote.leader_id().term)
        };
        if leader && confirmed.load(Ordering::Acquire) != term {
            match tokio::time::timeout(CONFIRM_TIMEOUT, raft.ensure_linearizable()).await {
                Ok(Ok(_)) => {
                    confirmed.store(term, Ordering::Release);
                    tracing::info!(term, "leadership confirmed by a quorum");
                }
                Ok(Err(RaftError::Fatal(e))) => {
                    tracing::warn!(error = %e, "raft stopped; leadership never confirmed");
                    return;
                }
                Ok(Err(e)) => {
                    tracing::debug!(term, error = %e, "leadership not confirmed");
                    tokio::time::sleep(CONFIRM_RETRY).await;
                }
                Err(_) => tracing::debug!(term, "leadership confirmation timed out"),
            }
            // Re-examine: the term or the role may have changed meanwhile.
            continue;
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// Packs queued commands into Raft entries, in queue order.
async fn run_batcher(raft: Raft<TypeConfig>, me: NodeId, mut rx: mpsc::Receiver<(Command, Reply)>) {
    let inflight = Arc::new(Semaphore::new(MAX_INFLIGHT_PROPOSALS));
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        let Ok(permit) = inflight.clone().acquire_owned().await else {
            return;
        };
        let (cmds, replies): (Vec<Command>, Vec<Reply>) = batch.into_iter().unzip();
        let n = cmds.len();
        let proposal = Proposal {
            at_ms: now_ms(),
            cmds,
        };
        let term = raft.metrics().borrow().current_term;
        match raft.client_write_ff(proposal).await {
            Err(fatal) => {
                for r in replies {
                    let _ = r.send(Err(ApiError::internal(format!("raft stopped: {fatal}"))));
                }
            }
            Ok(resp_rx) => {
                tokio::spawn(async move {
                    let Ok(outcome) = tokio::time::timeout(INFLIGHT_HOLD, resp_rx).await else {
                        drop(permit);
                        tracing::warn!(term, commands = n, "a proposal got no answer from raft within its hold (its entry was likely replaced by a newer leader's snapshot); its slot is freed");
                        for r in replies {
                            let _ = r.send(Err(ApiError::unknown(
                                "raft did not answer the write; its outcome is unknown",
                            )));
                        }
                        return;
                    };
                    drop(permit);
                    match outcome {
                        // openraft keys its answers by log index alone: an
                        // entry another leader (even of the same term:
                        // leaders are (term, node)) wrote at this index is
                        // not this proposal's.
                        Ok(Ok(resp))
                            if resp.log_id.leader_id.term != term
                                || resp.log_id.leader_id.node_id != me
                                || resp.data.len() != n =>
                        {
                            tracing::warn!(term, entry_leader = %resp.log_id.leader_id, commands = n, results = resp.data.len(), "an answer for an entry this node did not propose; not taken as this proposal's");
                            for r in replies {
                                let _ = r.send(Err(ApiError::unknown(
                                    "raft answered for an entry this supervisor did not propose; the write's outcome is unknown",
                                )));
                            }
                        }
                        Ok(Ok(resp)) => {
                            for (r, res) in replies.into_iter().zip(resp.data) {
                                let _ = r.send(res.map_err(ApiError::from));
                            }
                        }
                        Ok(Err(ClientWriteError::ForwardToLeader(_))) => {
                            for r in replies {
                                let _ = r.send(Err(ApiError::unavailable(
                                    "leadership changed; the write was not committed",
                                )));
                            }
                        }
                        Ok(Err(e)) => {
                            for r in replies {
                                let _ = r.send(Err(ApiError::internal(e.to_string())));
                            }
                        }
                        Err(_) => {
                            for r in replies {
                                let _ = r.send(Err(ApiError::unknown(
                                    "raft dropped the write; its outcome is unknown",
                                )));
                            }
                        }
                    }
                });
            }
        }
    }
}

/// Keeps `revocations` equal to the replicated list: after every apply,
/// the serials committed since are refused from the next handshake and
/// the next call on. The list only grows (a serial is never un-revoked), so
/// its length tells whether it changed: an apply that revokes nothing costs
/// one comparison, not a copy. Ends with the node.
async fn sync_revocations(sup: std::sync::Weak<Supervisor>) {
    let mut metrics = match sup.upgrade() {
        Some(s) => s.raft.metrics(),
        None => return,
    };
    let mut seen = 0usize;
    loop {
        let Some(s) = sup.upgrade() else { return };
        let changed = s.read(|st| (st.revoked.len() != seen).then(|| st.revoked.clone()));
        if let Some(want) = changed {
            seen = want.len();
            let parsed: BTreeSet<pki::Serial> =
                want.iter().filter_map(|x| x.parse().ok()).collect();
            tracing::info!(revoked = parsed.len(), "revocation list changed");
            s.revocations.replace(parsed);
        }
        drop(s);
        if metrics.changed().await.is_err() {
            return;
        }
    }
}
