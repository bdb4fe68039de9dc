//! The agent's control socket: the server side of the job contract
//! ([`rdma::contract`]), the inventory of the jobs' connections, the reflex
//! and the execution of the supervisor's orders.
//!
//! **Who may connect.** The socket file is mode 0660, group
//! `[control] socket_group` (default: the default job user's primary
//! group), so root and ranks running as the job user may connect. A
//! connection's first line must be a `hello`, admitted only if the
//! connecting process (`SO_PEERCRED`) may speak for the rank it names
//! ([`RankEvents::admit`]: the launcher's rule, see [`crate::jobs`];
//! without one, only root and the agent's own user); a refused hello gets
//! an `error` line saying why and the connection closes, nothing changed.
//! Every later message speaks for that hello's rank only: a connection it
//! registers is of that job and rank, an `order_done` answers only an order
//! sent to that job and rank, a `checkpointed` counts for that rank.
//!
//! **Inventory.** Every connection a job registers (`conn_up`) is kept by
//! (job, rank, conn_id) with its current NIC and its *home* NIC (the NIC of
//! its home rail, else the NIC it first registered on); it has *moved* when
//! the two differ. Every change marks the connection dirty; the agent's
//! reporter takes the dirty set ([`Control::take_reports`]) and puts the
//! current placements into the outbox, so the supervisor records them
//! exactly once and in order (newest state wins). When a job's socket
//! closes its connections are kept for [`ORPHAN_GRACE`] (the client
//! reconnects and re-registers them), then reported closed.
//!
//! **Orders to jobs.** A `migrate` order goes to the socket that registered
//! the connections (split into orders of at most
//! [`rdma::contract::MAX_MIGRATE_CONNS`]); the job answers `order_done`
//! (after `conn_moved` for each connection). An order unanswered for
//! [`JOB_ORDER_TIMEOUT`] fails; an order whose job reconnects meanwhile is
//! pushed again to the new socket (the client delivers each id once).
//! [`Control::pace_job`] sends a `pace` order per connection of a job (for
//! the shaping orders, [`crate::shaping`]) the same way.
//!
//! **Reflex.** When the link tracker sees a NIC go down, every connection
//! still on it (and not already under an order) is ordered to the NIC's
//! backup if that is usable (else anywhere). The transport usually moves by
//! itself first; the order is the backstop. The outcome is logged and
//! reported (a `ReflexDone` event).
//!
//! **NICs held out of service.** An admin's failover holds its NIC out of
//! service for connections until an admin's failback: the leader says so
//! in the order and in every heartbeat reply, each with the Raft log index
//! of the set ([`Control::set_held_out`], [`Control::change_held`]; the
//! newest wins). Every job socket hears the whole set after its hello and
//! after each change (`held_out`) once the leader has told the agent (a
//! restarted agent says nothing until then: the jobs keep what they last
//! heard); the transport then leaves those NICs and does not fail back to
//! them.
//!
//! **Supervisor orders.** [`Control::execute`] carries out a failover (every
//! connection on the NIC moves to the target) or a failback (connections
//! whose home is the NIC and that are elsewhere move back), after giving
//! jobs [`RESYNC_GRACE`] to re-register when the agent has just started.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdma::contract::{
    self, AgentMessage, ConnUp, ContractError, Hello, JobMessage, LineReader, Order, OrderAnswer,
    OrderKind,
};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot, Notify};

use crate::config::NicConfig;
use crate::link::{unix_ns, LinkTransition, NicHealth};
use crate::outbox::{QpReport, ReflexReport, Report};

mod session;
mod socket;
pub use socket::{bind, ControlError};

/// Job sockets served at once.
pub const MAX_SESSIONS: usize = 256;
/// Sessions one rank may hold at once (a rank reconnecting briefly holds
/// two): one rank cannot take every session from the others.
pub const MAX_SESSIONS_PER_RANK: usize = 4;
/// Connections that have not said `hello` yet, at once; beyond it new
/// connections are closed at once.
pub const MAX_PENDING_HELLOS: usize = 64;
/// How long a new connection has to say `hello`.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a begun line may take to finish.
pub const LINE_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections tracked (the supervisor keeps as many per host).
pub const MAX_CONNS: usize = 4096;
/// Lines queued towards one job socket.
pub const SESSION_QUEUE: usize = 256;
/// How long a job has to answer an order.
pub const JOB_ORDER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the connections of a job whose socket closed are kept.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(10);
/// After the agent starts, supervisor orders wait this long for jobs to
/// re-register (clients reconnect within about a second).
pub const RESYNC_GRACE: Duration = Duration::from_secs(3);
/// Reflex outcomes waiting for the reporter.
const MAX_REFLEX_BACKLOG: usize = 64;
/// Closed connections waiting for the reporter.
const MAX_GRAVEYARD: usize = 2 * MAX_CONNS;
/// Longest detail sent to the supervisor (its limit).
pub const MAX_DETAIL: usize = 1024;

/// Identifies a connection: job, rank, connection id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnKey {
    pub job: String,
    pub rank: u32,
    pub conn_id: u64,
}

impl std::fmt::Display for ConnKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.job, self.rank, self.conn_id)
    }
}

/// A connection as the agent knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnRecord {
    /// The latest registration, with the current NIC.
    pub conn: ConnUp,
    /// Its home NIC.
    pub home: String,
    /// The job socket that registered it (None: that socket closed).
    session: Option<u64>,
    orphaned_at: Option<Instant>,
    /// A migrate order covering it is outstanding.
    in_order: Option<u64>,
}

impl ConnRecord {
    /// Off its home NIC.
    pub fn moved(&self) -> bool {
        self.conn.nic != self.home
    }
}

/// The process at the other end of a job socket, as the kernel says
/// (`SO_PEERCRED`, taken when it connected).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub pid: u32,
    pub uid: u32,
}

/// Where the control socket hands what jobs say about their ranks (the
/// job launcher, [`crate::jobs::Launcher`]).
pub trait RankEvents: Send + Sync {
    /// Whether `peer` may speak for the rank its `hello` names (Err: why
    /// not, one line for the job). Called before the hello changes
    /// anything, without the inventory locked.
    fn admit(&self, hello: &Hello, peer: &Peer) -> Result<(), String>;

    /// `job`'s rank `rank` (process `pid`, as its hello said) has a durable
    /// checkpoint at `step`. Called with the inventory locked: must not
    /// block or call back into [`Control`].
    fn checkpointed(&self, job: &str, rank: u32, pid: u32, step: u64);

    /// `job`'s rank `rank` (process `pid`) says connection `conn` has had
    /// no path for a while. Called with the inventory locked, like
    /// [`checkpointed`](Self::checkpointed).
    fn conn_stalled(&self, job: &str, rank: u32, pid: u32, conn: &ConnUp);
}

/// One rank's answer to an order sent with [`Control::order_ranks`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankAnswer {
    pub rank: u32,
    pub ok: bool,
    pub detail: String,
    /// The checkpoint step a checkpoint order's answer names.
    pub step: Option<u64>,
}

/// What [`Control::pace_job`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PaceOutcome {
    /// Ranks of the job connected to the control socket.
    pub ranks: usize,
    /// The job's connections on this host.
    pub conns: usize,
    /// Connections whose rank confirmed the pace order.
    pub paced: usize,
    /// Why the others were not paced, one line each.
    pub failed: Vec<String>,
}

/// A change of one NIC's hold out of service, from an admin's failover
/// (`held`) or failback, as of Raft log index `version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldChange {
    pub nic: String,
    pub version: u64,
    pub held: bool,
}

/// Heartbeat replies in a row with an older held-set version after which
/// the agent takes theirs (2 s at the 250 ms heartbeat).
pub const HELD_OLDER_TAKEN: u32 = 8;

/// An order from the supervisor, as the agent executes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SupervisorOrder {
    Failover { nic: String, to: String },
    Failback { nic: String },
}

struct Session {
    hello: Hello,
    tx: mpsc::Sender<AgentMessage>,
    /// The held-out set this socket last took (None: not yet).
    held_sent: Option<BTreeSet<String>>,
    /// Whether the socket has had its `ok` to the hello: held-out sets go
    /// to it only from then on, so none overtakes the answer or a set
    /// read earlier ([`Control::greet`]).
    greeted: bool,
    /// Connection ids registered on this socket.
    conns: BTreeMap<u64, ConnKey>,
}

struct Pending {
    /// Who the order is for (the hello of the socket it was sent to).
    job: String,
    rank: u32,
    order: Order,
    conns: Vec<ConnKey>,
    reply: Option<oneshot::Sender<OrderAnswer>>,
    /// It reached a job socket at least once.
    delivered: bool,
}

impl Inventory {
    /// The key of connection `conn_id` registered on session `id`.
    fn session_conn(&self, id: u64, conn_id: u64) -> Result<ConnKey, String> {
        self.sessions[&id]
            .conns
            .get(&conn_id)
            .cloned()
            .ok_or_else(|| format!("connection {conn_id} is not registered on this connection"))
    }
}

#[derive(Default)]
struct Inventory {
    sessions: HashMap<u64, Session>,
    conns: BTreeMap<ConnKey, ConnRecord>,
    pending: HashMap<u64, Pending>,
    health: BTreeMap<String, NicHealth>,
    dirty: BTreeSet<ConnKey>,
    /// Last state of closed connections not yet reported.
    graveyard: BTreeMap<ConnKey, ConnUp>,
    reflexes: VecDeque<ReflexReport>,
    /// NICs held out of service, as of Raft log index `held_version`.
    held: BTreeSet<String>,
    held_version: u64,
    /// Heartbeat replies in a row with an older version than ours.
    held_older_in_a_row: u32,
}

impl Inventory {
    fn mark(&mut self, key: ConnKey) {
        self.dirty.insert(key);
    }

    fn bury(&mut self, key: ConnKey, last: ConnUp) {
        if self.graveyard.len() >= MAX_GRAVEYARD {
            tracing::warn!(conn = %key, "too many closed connections waiting to be reported; this close is not reported");
            return;
        }
        self.graveyard.insert(key.clone(), last);
        self.dirty.insert(key);
    }
}

/// One job order being waited for.
struct Wait {
    who: String,
    order_id: u64,
    conns: usize,
    rx: oneshot::Receiver<OrderAnswer>,
}

/// Outcome of sending migrate orders: what to wait for, and what already
/// failed.
#[derive(Default)]
struct Sent {
    waits: Vec<Wait>,
    failed: Vec<String>,
    failed_conns: usize,
}

/// The control plane of one agent.
pub struct Control {
    nics: Vec<NicConfig>,
    inv: Mutex<Inventory>,
    next_session: AtomicU64,
    next_order: AtomicU64,
    started: Instant,
    changed: Notify,
    ranks: Option<Arc<dyn RankEvents>>,
    /// How long a new connection has to say hello, and a begun line to end
    /// ([`HELLO_TIMEOUT`], [`LINE_TIMEOUT`]; shorter in tests).
    hello_timeout: Duration,
    line_timeout: Duration,
}

impl Control {
    pub fn new(nics: Vec<NicConfig>) -> Arc<Control> {
        Self::with_rank_events(nics, None)
    }

    /// A control plane that hands ranks' checkpoints to `ranks`.
    pub fn with_rank_events(
        nics: Vec<NicConfig>,
        ranks: Option<Arc<dyn RankEvents>>,
    ) -> Arc<Control> {
        // Job order ids start from the clock (µs) so they do not repeat
        // across agent restarts.
        let first = unix_ns() / 1_000;
        Arc::new(Control {
            nics,
            inv: Mutex::new(Inventory::default()),
            next_session: AtomicU64::new(1),
            next_order: AtomicU64::new(first.max(1)),
            started: Instant::now(),
            changed: Notify::new(),
            ranks,
            hello_timeout: HELLO_TIMEOUT,
            line_timeout: LINE_TIMEOUT,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inventory> {
        self.inv.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn nic(&self, name: &str) -> Option<&NicConfig> {
        self.nics.iter().find(|n| n.name == name)
    }

    fn check_nic(&self, name: &str) -> Result<(), String> {
        if self.nic(name).is_some() {
            return Ok(());
        }
        let have: Vec<&str> = self.nics.iter().map(|n| n.name.as_str()).collect();
        Err(format!(
            "NIC {name:?} is not a data NIC of this host (it has {})",
            have.join(", ")
        ))
    }

    fn home_of(&self, rail: u32) -> Option<String> {
        self.nics
            .iter()
            .find(|n| n.rail == Some(rail))
            .map(|n| n.name.clone())
    }

    fn usable(inv: &Inventory, nic: &str) -> Result<(), NicHealth> {
        match inv.health.get(nic) {
            Some(h) if !h.usable() => Err(*h),
            _ => Ok(()),
        }
    }

    /// The NICs held out of service and the version of that set.
    pub fn held_out(&self) -> (u64, BTreeSet<String>) {
        let inv = self.lock();
        (inv.held_version, inv.held.clone())
    }

    /// Takes the leader's whole set of NICs held out of service as of
    /// `version`, unless the agent already has a newer one (names of NICs
    /// this agent does not have are left out), and passes it on to every
    /// job socket that has not taken it yet. Whether the set changed.
    pub fn set_held_out(&self, version: u64, nics: Vec<String>) -> bool {
        let mut inv = self.lock();
        let mut changed = false;
        // Older versions again and again: the supervisors' log began anew
        // (a rebuilt cluster), not a stale reply; take theirs.
        if version < inv.held_version {
            inv.held_older_in_a_row += 1;
        } else {
            inv.held_older_in_a_row = 0;
        }
        if version >= inv.held_version || inv.held_older_in_a_row >= HELD_OLDER_TAKEN {
            inv.held_older_in_a_row = 0;
            let set: BTreeSet<String> =
                nics.into_iter().filter(|n| self.nic(n).is_some()).collect();
            changed = set != inv.held;
            if changed {
                tracing::info!(version, held_out = ?set, "NICs held out of service changed");
            }
            inv.held = set;
            inv.held_version = version;
        }
        Self::tell_held(&mut inv);
        changed
    }

    /// Applies one NIC's hold change from an order, unless the agent
    /// already has the set as of `version` or newer.
    pub fn change_held(&self, c: &HeldChange) {
        let mut inv = self.lock();
        // Before the leader's whole set (a restarted agent) one change
        // would make a partial set: the next heartbeat brings it all.
        if inv.held_version == 0 || c.version <= inv.held_version || self.nic(&c.nic).is_none() {
            return;
        }
        let changed = if c.held {
            inv.held.insert(c.nic.clone())
        } else {
            inv.held.remove(&c.nic)
        };
        inv.held_version = c.version;
        if changed {
            tracing::info!(nic = %c.nic, held = c.held, version = c.version, "NIC hold changed by order");
        }
        Self::tell_held(&mut inv);
    }

    /// The NICs out of service for the jobs' connections: the admin's holds
    /// and this host's Degraded NICs. None while the leader has not said
    /// what is held: a job takes the set as the whole one and keeps what
    /// it last heard (an agent that has just restarted must not release
    /// an admin's hold by telling only its Degraded NICs).
    fn out_of_service(inv: &Inventory) -> Option<BTreeSet<String>> {
        if inv.held_version == 0 {
            return None;
        }
        let mut set: BTreeSet<String> = inv
            .health
            .iter()
            .filter(|(_, h)| **h == NicHealth::Degraded)
            .map(|(n, _)| n.clone())
            .collect();
        set.extend(inv.held.iter().cloned());
        Some(set)
    }

    /// Sends the held-out set to every socket that has not taken it (a
    /// socket whose queue is full takes it at the next heartbeat): the
    /// admin's holds and this host's Degraded NICs (losing or holding back packets: the
    /// connections leave them the same way). Nothing before the leader has
    /// said what is held.
    fn tell_held(inv: &mut Inventory) {
        let Some(held) = Self::out_of_service(inv) else {
            return;
        };
        for s in inv.sessions.values_mut() {
            if !s.greeted || s.held_sent.as_ref() == Some(&held) {
                continue;
            }
            let msg = AgentMessage::HeldOut {
                nics: held.iter().cloned().collect(),
            };
            if s.tx.try_send(msg).is_ok() {
                s.held_sent = Some(held.clone());
            }
        }
    }

    /// After the `ok` to session `id`'s hello: from now on held-out sets go
    /// to it, starting with the current one, queued under the lock that
    /// orders every set sent (a set read before the answer and sent after
    /// it could land behind a newer one and stay). A full queue leaves it
    /// to the next heartbeat's [`Self::tell_held`].
    pub(crate) fn greet(&self, id: u64) {
        let mut inv = self.lock();
        if let Some(s) = inv.sessions.get_mut(&id) {
            s.greeted = true;
            Self::tell_held(&mut inv);
        }
    }

    /// Resolves when placements or reflex outcomes wait to be reported.
    pub async fn changed(&self) {
        self.changed.notified().await
    }

    /// Takes what is to be reported: the current placement of every
    /// changed connection (or its closing), then reflex outcomes.
    pub fn take_reports(&self) -> Vec<Report> {
        let mut inv = self.lock();
        let dirty = std::mem::take(&mut inv.dirty);
        let now = unix_ns();
        let mut out = Vec::with_capacity(dirty.len());
        for key in dirty {
            let (conn, moved, closed) = match inv.conns.get(&key) {
                Some(r) => (r.conn.clone(), r.moved(), false),
                None => match inv.graveyard.remove(&key) {
                    Some(c) => (c, false, true),
                    None => continue,
                },
            };
            out.push(Report::Qp(QpReport {
                job: conn.job,
                rank: conn.rank,
                conn_id: conn.conn_id,
                nic: conn.nic,
                peer_host: conn.peer_host,
                peer_rank: conn.peer_rank,
                rail: conn.rail,
                moved,
                closed,
                at_unix_ns: now,
            }));
        }
        out.extend(inv.reflexes.drain(..).map(Report::Reflex));
        out
    }

    /// Every connection known, by key.
    pub fn conns(&self) -> Vec<ConnRecord> {
        self.lock().conns.values().cloned().collect()
    }

    /// Handles one valid message; returns lines to send after the `ok`.
    fn handle(
        &self,
        sid: &mut Option<u64>,
        tx: &mpsc::Sender<AgentMessage>,
        msg: JobMessage,
    ) -> Result<Vec<AgentMessage>, String> {
        let mut inv = self.lock();
        let id = match (&msg, *sid) {
            (JobMessage::Hello(h), None) => {
                if inv.sessions.len() >= MAX_SESSIONS {
                    return Err(format!(
                        "the agent serves at most {MAX_SESSIONS} job connections"
                    ));
                }
                let same_rank = inv
                    .sessions
                    .values()
                    .filter(|s| s.hello.job == h.job && s.hello.rank == h.rank)
                    .count();
                if same_rank >= MAX_SESSIONS_PER_RANK {
                    return Err(format!(
                        "job {} rank {} already holds {MAX_SESSIONS_PER_RANK} connections to the agent",
                        h.job, h.rank
                    ));
                }
                let id = self.next_session.fetch_add(1, Ordering::Relaxed);
                inv.sessions.insert(
                    id,
                    Session {
                        hello: h.clone(),
                        tx: tx.clone(),
                        held_sent: None,
                        greeted: false,
                        conns: BTreeMap::new(),
                    },
                );
                *sid = Some(id);
                tracing::info!(session = id, job = %h.job, rank = h.rank, pid = h.pid, "job connected");
                // The orders this job has not answered yet (to the new
                // socket), after the held-out set `greet` sends.
                let again = inv
                    .pending
                    .values_mut()
                    .filter(|p| p.job == h.job && p.rank == h.rank)
                    .map(|p| {
                        p.delivered = true;
                        AgentMessage::Order(p.order.clone())
                    })
                    .collect();
                return Ok(again);
            }
            (JobMessage::Hello(_), Some(_)) => {
                return Err("hello was already said on this connection".into())
            }
            (_, None) => return Err("say hello first".into()),
            (_, Some(id)) => id,
        };
        let (job, rank) = {
            let s = &inv.sessions[&id];
            (s.hello.job.clone(), s.hello.rank)
        };
        match msg {
            JobMessage::Hello(_) => unreachable!("handled above"),
            JobMessage::Checkpointed { step } => {
                let pid = inv.sessions[&id].hello.pid;
                tracing::info!(job = %job, rank, step, pid, "rank checkpointed");
                if let Some(r) = &self.ranks {
                    r.checkpointed(&job, rank, pid, step);
                }
            }
            JobMessage::ConnUp(c) => {
                if c.job != job || c.rank != rank {
                    return Err(format!(
                        "connection of job {:?} rank {} on the connection of job {job:?} rank {rank}",
                        c.job, c.rank
                    ));
                }
                self.check_nic(&c.nic)?;
                let key = ConnKey {
                    job: c.job.clone(),
                    rank: c.rank,
                    conn_id: c.conn_id,
                };
                if let Some(k) = inv.sessions[&id].conns.get(&c.conn_id) {
                    if *k != key {
                        return Err(format!(
                            "connection id {} is already registered for rank {} on this connection",
                            c.conn_id, k.rank
                        ));
                    }
                }
                let home = self.home_of(c.rail);
                let live_owner = |s: Option<u64>| s.filter(|o| *o != id);
                match inv.conns.get(&key).map(|r| live_owner(r.session)) {
                    Some(Some(other)) if inv.sessions.contains_key(&other) => {
                        let pid = inv.sessions[&other].hello.pid;
                        return Err(format!(
                            "connection {key} is registered by another live connection (pid {pid})"
                        ));
                    }
                    None if inv.conns.len() >= MAX_CONNS => {
                        return Err(format!("the agent tracks at most {MAX_CONNS} connections"));
                    }
                    _ => {}
                }
                let rec = match inv.conns.remove(&key) {
                    Some(mut r) => {
                        r.home = home.unwrap_or(r.home);
                        r.conn = c.clone();
                        r.session = Some(id);
                        r.orphaned_at = None;
                        r
                    }
                    None => ConnRecord {
                        home: home.unwrap_or_else(|| c.nic.clone()),
                        conn: c.clone(),
                        session: Some(id),
                        orphaned_at: None,
                        in_order: None,
                    },
                };
                inv.conns.insert(key.clone(), rec);
                inv.graveyard.remove(&key);
                if let Some(s) = inv.sessions.get_mut(&id) {
                    s.conns.insert(c.conn_id, key.clone());
                }
                inv.mark(key);
            }
            JobMessage::ConnMoved { conn_id, nic } => {
                self.check_nic(&nic)?;
                let key = inv.session_conn(id, conn_id)?;
                let r = inv.conns.get_mut(&key).expect("registered on the session");
                if r.conn.nic != nic {
                    tracing::info!(conn = %key, from = %r.conn.nic, to = %nic, "connection moved");
                    r.conn.nic = nic;
                    inv.mark(key);
                }
            }
            JobMessage::ConnStalled { conn_id } => {
                let key = inv.session_conn(id, conn_id)?;
                let conn = &inv.conns.get(&key).expect("registered on the session").conn;
                let pid = inv.sessions[&id].hello.pid;
                tracing::warn!(
                    job = %job,
                    rank,
                    conn_id,
                    peer_host = %conn.peer_host,
                    peer_rank = conn.peer_rank,
                    "connection stalled: no path to its peer"
                );
                if let Some(r) = &self.ranks {
                    r.conn_stalled(&job, rank, pid, conn);
                }
            }
            JobMessage::ConnClosed { conn_id } => {
                let key = inv
                    .sessions
                    .get_mut(&id)
                    .and_then(|s| s.conns.remove(&conn_id))
                    .ok_or_else(|| {
                        format!("connection {conn_id} is not registered on this connection")
                    })?;
                if let Some(r) = inv.conns.remove(&key) {
                    inv.bury(key, r.conn);
                }
            }
            JobMessage::OrderDone(answer) => {
                let order_id = answer.order_id;
                match inv.pending.get(&order_id) {
                    Some(p) if p.job == job && p.rank == rank => {}
                    Some(_) => {
                        return Err(format!(
                            "order {order_id} is not for job {job:?} rank {rank}"
                        ))
                    }
                    None => {
                        return Err(format!(
                            "order {order_id} is not pending (answered already, timed out, or from before an agent restart)"
                        ))
                    }
                }
                let p = inv.pending.remove(&order_id).expect("checked");
                tracing::info!(order_id, job = %job, rank, ok = answer.ok, step = ?answer.step, detail = %answer.detail, "job answered an order");
                for k in &p.conns {
                    if let Some(r) = inv.conns.get_mut(k) {
                        if r.in_order == Some(order_id) {
                            r.in_order = None;
                        }
                    }
                }
                if let Some(reply) = p.reply {
                    let _ = reply.send(answer);
                }
            }
        }
        drop(inv);
        self.changed.notify_one();
        Ok(Vec::new())
    }

    fn end_session(&self, id: u64) {
        let mut inv = self.lock();
        let Some(s) = inv.sessions.remove(&id) else {
            return;
        };
        let now = Instant::now();
        for key in s.conns.values() {
            if let Some(r) = inv.conns.get_mut(key) {
                if r.session == Some(id) {
                    r.session = None;
                    r.orphaned_at = Some(now);
                }
            }
        }
        tracing::info!(session = id, job = %s.hello.job, rank = s.hello.rank, conns = s.conns.len(), "job disconnected");
    }

    /// Orders the connections `keys` to `to`, grouped by the socket that
    /// registered them.
    fn send_migrate(&self, inv: &mut Inventory, keys: &[ConnKey], to: Option<&str>) -> Sent {
        let mut sent = Sent::default();
        let mut by_session: BTreeMap<u64, Vec<ConnKey>> = BTreeMap::new();
        for k in keys {
            match inv.conns.get(k).and_then(|r| r.session) {
                Some(s) if inv.sessions.contains_key(&s) => {
                    by_session.entry(s).or_default().push(k.clone())
                }
                _ => {
                    sent.failed
                        .push(format!("{k}: its job is not connected to the agent"));
                    sent.failed_conns += 1;
                }
            }
        }
        for (sid, keys) in by_session {
            let (job, rank, tx) = {
                let s = &inv.sessions[&sid];
                (s.hello.job.clone(), s.hello.rank, s.tx.clone())
            };
            for chunk in keys.chunks(contract::MAX_MIGRATE_CONNS) {
                let order_id = self.next_order.fetch_add(1, Ordering::Relaxed);
                let order = Order {
                    order_id,
                    kind: OrderKind::Migrate {
                        conn_ids: chunk.iter().map(|k| k.conn_id).collect(),
                        to_nic: to.map(str::to_owned),
                    },
                };
                let who = format!("job {job} rank {rank}");
                if tx.try_send(AgentMessage::Order(order.clone())).is_err() {
                    sent.failed
                        .push(format!("{who}: its socket is backed up or closed"));
                    sent.failed_conns += chunk.len();
                    continue;
                }
                let (reply, rx) = oneshot::channel();
                for k in chunk {
                    if let Some(r) = inv.conns.get_mut(k) {
                        r.in_order = Some(order_id);
                    }
                }
                inv.pending.insert(
                    order_id,
                    Pending {
                        job: job.clone(),
                        rank,
                        order,
                        conns: chunk.to_vec(),
                        reply: Some(reply),
                        delivered: true,
                    },
                );
                tracing::info!(order_id, job = %job, rank, conns = chunk.len(), to = ?to, "migrate order sent to job");
                sent.waits.push(Wait {
                    who,
                    order_id,
                    conns: chunk.len(),
                    rx,
                });
            }
        }
        sent
    }

    /// Waits (bounded) for the job orders; returns (ok, detail).
    async fn await_orders(&self, sent: Sent, what: &str) -> (bool, String) {
        let Sent {
            waits,
            mut failed,
            failed_conns,
        } = sent;
        let total = waits.iter().map(|w| w.conns).sum::<usize>() + failed_conns;
        let deadline = tokio::time::Instant::now() + JOB_ORDER_TIMEOUT;
        let mut moved = 0usize;
        for w in waits {
            match tokio::time::timeout_at(deadline, w.rx).await {
                Ok(Ok(a)) if a.ok => moved += w.conns,
                Ok(Ok(a)) => failed.push(format!("{}: {}", w.who, a.detail)),
                Ok(Err(_)) => failed.push(format!("{}: the order was dropped", w.who)),
                Err(_) => failed.push(format!(
                    "{} did not answer within {} s",
                    w.who,
                    JOB_ORDER_TIMEOUT.as_secs()
                )),
            }
            self.forget_order(w.order_id);
        }
        let detail = if failed.is_empty() {
            format!("{moved} connections moved {what}")
        } else {
            format!(
                "{} of {total} connections not moved {what}: {}",
                total - moved,
                failed.join("; ")
            )
        };
        (
            failed.is_empty(),
            contract::truncate(&detail, MAX_DETAIL).to_owned(),
        )
    }

    /// Paces the connections of `job` on this host that are on `nic` (the
    /// shaped NIC's, not the job's other rails) at `bytes_per_s` (`None`:
    /// unpaced): one job-contract `pace`
    /// order per connection, sent to the socket that registered it, all
    /// awaited together for at most [`JOB_ORDER_TIMEOUT`]. Bounded by the
    /// inventory ([`MAX_CONNS`]). Like [`Control::execute`], waits until
    /// jobs had [`RESYNC_GRACE`] to re-register after the agent started.
    pub async fn pace_job(&self, job: &str, nic: &str, bytes_per_s: Option<u64>) -> PaceOutcome {
        tokio::time::sleep_until((self.started + RESYNC_GRACE).into()).await;
        let (ranks, keys) = {
            let inv = self.lock();
            let ranks = inv
                .sessions
                .values()
                .filter(|s| s.hello.job == job)
                .map(|s| s.hello.rank)
                .collect::<BTreeSet<u32>>()
                .len();
            let keys: Vec<ConnKey> = inv
                .conns
                .iter()
                .filter(|(k, r)| k.job == job && r.conn.nic == nic)
                .map(|(k, _)| k.clone())
                .collect();
            (ranks, keys)
        };
        let mut out = self.pace_conns(&keys, bytes_per_s, JOB_ORDER_TIMEOUT).await;
        out.ranks = ranks;
        tracing::info!(job = %job, bytes_per_s = ?bytes_per_s, conns = out.conns, paced = out.paced, "job paced");
        out
    }

    /// Paces the connections `keys` at `bytes_per_s` (`None`: unpaced): one
    /// job-contract `pace` order per connection, sent to the socket that
    /// registered it, all awaited together for at most `timeout` (an order
    /// not answered by then is forgotten, not retried; the rank may still
    /// carry it out). Keys no longer in the inventory are skipped. Does not
    /// wait for [`RESYNC_GRACE`]; `ranks` of the outcome is 0.
    pub async fn pace_conns(
        &self,
        keys: &[ConnKey],
        bytes_per_s: Option<u64>,
        timeout: Duration,
    ) -> PaceOutcome {
        let mut out = PaceOutcome::default();
        let mut waits = Vec::new();
        {
            let mut inv = self.lock();
            let keys: Vec<(ConnKey, Option<u64>)> = keys
                .iter()
                .filter_map(|k| inv.conns.get(k).map(|r| (k.clone(), r.session)))
                .collect();
            out.conns = keys.len();
            for (key, session) in keys {
                let Some(tx) = session
                    .and_then(|s| inv.sessions.get(&s))
                    .map(|s| s.tx.clone())
                else {
                    out.failed
                        .push(format!("{key}: its rank is not connected to the agent"));
                    continue;
                };
                let order_id = self.next_order.fetch_add(1, Ordering::Relaxed);
                let order = Order {
                    order_id,
                    kind: OrderKind::Pace {
                        conn_id: key.conn_id,
                        bytes_per_s,
                    },
                };
                if tx.try_send(AgentMessage::Order(order.clone())).is_err() {
                    out.failed
                        .push(format!("{key}: its socket is backed up or closed"));
                    continue;
                }
                let (reply, rx) = oneshot::channel();
                inv.pending.insert(
                    order_id,
                    Pending {
                        job: key.job.clone(),
                        rank: key.rank,
                        order,
                        conns: Vec::new(),
                        reply: Some(reply),
                        delivered: true,
                    },
                );
                waits.push((key, order_id, rx));
            }
        }
        tracing::debug!(bytes_per_s = ?bytes_per_s, conns = out.conns, sent = waits.len(), "pace orders sent");
        let deadline = tokio::time::Instant::now() + timeout;
        for (key, order_id, rx) in waits {
            match tokio::time::timeout_at(deadline, rx).await {
                Ok(Ok(a)) if a.ok => out.paced += 1,
                Ok(Ok(a)) => out.failed.push(format!("{key}: {}", a.detail)),
                Ok(Err(_)) => out.failed.push(format!("{key}: the order was dropped")),
                Err(_) => out.failed.push(format!(
                    "{key}: no answer within {} ms",
                    timeout.as_millis()
                )),
            }
            self.forget_order(order_id);
        }
        out
    }

    /// The ranks of `job` connected to the control socket now.
    pub fn connected_ranks(&self, job: &str) -> BTreeSet<u32> {
        self.lock()
            .sessions
            .values()
            .filter(|s| s.hello.job == job)
            .map(|s| s.hello.rank)
            .collect()
    }

    /// Sends `kind` to each of `job`'s `ranks` and waits (at most
    /// `timeout` in all) for their answers. A rank that is not connected
    /// yet gets the order when it says hello; every socket of the rank gets
    /// it (the client delivers an id once). The answers come in the order
    /// of `ranks`.
    pub async fn order_ranks(
        &self,
        job: &str,
        ranks: &[u32],
        kind: OrderKind,
        timeout: Duration,
    ) -> Vec<RankAnswer> {
        let mut waits = Vec::with_capacity(ranks.len());
        {
            let mut inv = self.lock();
            for &rank in ranks {
                let order_id = self.next_order.fetch_add(1, Ordering::Relaxed);
                let order = Order {
                    order_id,
                    kind: kind.clone(),
                };
                let mut delivered = false;
                for s in inv.sessions.values() {
                    if s.hello.job == job
                        && s.hello.rank == rank
                        && s.tx.try_send(AgentMessage::Order(order.clone())).is_ok()
                    {
                        delivered = true;
                    }
                }
                let (reply, rx) = oneshot::channel();
                inv.pending.insert(
                    order_id,
                    Pending {
                        job: job.to_owned(),
                        rank,
                        order,
                        conns: Vec::new(),
                        reply: Some(reply),
                        delivered,
                    },
                );
                tracing::info!(order_id, job = %job, rank, delivered, kind = ?kind, "order sent to rank");
                waits.push((rank, order_id, rx));
            }
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let mut out = Vec::with_capacity(waits.len());
        for (rank, order_id, rx) in waits {
            let (ok, detail, step) = match tokio::time::timeout_at(deadline, rx).await {
                Ok(Ok(a)) => (a.ok, a.detail, a.step),
                Ok(Err(_)) => (false, "the order was dropped".to_owned(), None),
                Err(_) => {
                    let delivered = self
                        .lock()
                        .pending
                        .get(&order_id)
                        .is_some_and(|p| p.delivered);
                    let why = if delivered {
                        format!("did not answer within {} s", timeout.as_secs())
                    } else {
                        format!(
                            "not connected to the agent's control socket within {} s",
                            timeout.as_secs()
                        )
                    };
                    (false, why, None)
                }
            };
            self.forget_order(order_id);
            out.push(RankAnswer {
                rank,
                ok,
                detail,
                step,
            });
        }
        out
    }

    fn forget_order(&self, order_id: u64) {
        let mut inv = self.lock();
        if let Some(p) = inv.pending.remove(&order_id) {
            for k in &p.conns {
                if let Some(r) = inv.conns.get_mut(k) {
                    if r.in_order == Some(order_id) {
                        r.in_order = None;
                    }
                }
            }
        }
    }

    /// Feeds a link transition: remembers the NIC's health and, when its
    /// link went down, orders the connections still on it away (the reflex).
    pub fn on_link(self: &Arc<Self>, t: &LinkTransition) {
        let mut inv = self.lock();
        let was = inv.health.insert(t.nic.clone(), t.health);
        if (was == Some(NicHealth::Degraded)) != (t.health == NicHealth::Degraded) {
            // In or out of service for the jobs' connections.
            tracing::info!(nic = %t.nic, health = ?t.health, "degraded NIC set changed; telling the job sockets");
            Self::tell_held(&mut inv);
        }
        if t.link_up {
            return;
        }
        let keys: Vec<ConnKey> = inv
            .conns
            .iter()
            .filter(|(_, r)| r.conn.nic == t.nic && r.in_order.is_none())
            .map(|(k, _)| k.clone())
            .collect();
        if keys.is_empty() {
            return;
        }
        let to = self
            .nic(&t.nic)
            .and_then(|n| n.backup.clone())
            // A held backup still takes them: better than no NIC (their
            // transport leaves it once a NIC in service is up).
            .filter(|b| Self::usable(&inv, b).is_ok());
        let sent = self.send_migrate(&mut inv, &keys, to.as_deref());
        drop(inv);
        let what = match &to {
            Some(b) => format!("off {} to {b}", t.nic),
            None => format!("off {} (to any healthy NIC)", t.nic),
        };
        tracing::info!(nic = %t.nic, conns = keys.len(), to = ?to, "reflex: NIC down, ordering its connections away");
        let this = self.clone();
        let nic = t.nic.clone();
        tokio::spawn(async move {
            let (ok, detail) = this.await_orders(sent, &what).await;
            if ok {
                tracing::info!(nic = %nic, conns = keys.len(), detail = %detail, "reflex done");
            } else {
                tracing::warn!(nic = %nic, conns = keys.len(), detail = %detail, "reflex failed");
            }
            let mut inv = this.lock();
            if inv.reflexes.len() >= MAX_REFLEX_BACKLOG {
                inv.reflexes.pop_front();
            }
            inv.reflexes.push_back(ReflexReport {
                nic,
                conns: keys.len() as u32,
                ok,
                detail,
                at_unix_ns: unix_ns(),
            });
            drop(inv);
            this.changed.notify_one();
        });
    }

    /// Carries out a supervisor order; returns (ok, detail).
    pub async fn execute(&self, order: &SupervisorOrder) -> (bool, String) {
        tokio::time::sleep_until((self.started + RESYNC_GRACE).into()).await;
        let (keys, to, what) = {
            let inv = self.lock();
            match order {
                SupervisorOrder::Failover { nic, to } => {
                    if let Err(e) = self.check_nic(nic) {
                        return (false, e);
                    }
                    if to == nic || self.nic(to).is_none() {
                        return (
                            false,
                            format!("target {to:?} is not another data NIC of this host"),
                        );
                    }
                    // A target whose link is back and settling
                    // (Recovering) takes them: better than a dead NIC.
                    if let Err(h) = Self::usable(&inv, to) {
                        if h != NicHealth::Recovering {
                            return (false, format!("target NIC {to} is {h:?}"));
                        }
                    }
                    let keys: Vec<ConnKey> = inv
                        .conns
                        .iter()
                        .filter(|(_, r)| r.conn.nic == *nic)
                        .map(|(k, _)| k.clone())
                        .collect();
                    if keys.is_empty() {
                        return (true, format!("no connections on {nic}"));
                    }
                    (keys, to.clone(), format!("off {nic} to {to}"))
                }
                SupervisorOrder::Failback { nic } => {
                    if let Err(e) = self.check_nic(nic) {
                        return (false, e);
                    }
                    if let Err(h) = Self::usable(&inv, nic) {
                        return (false, format!("NIC {nic} is {h:?}; not failing back"));
                    }
                    let keys: Vec<ConnKey> = inv
                        .conns
                        .iter()
                        .filter(|(_, r)| r.home == *nic && r.conn.nic != *nic)
                        .map(|(k, _)| k.clone())
                        .collect();
                    if keys.is_empty() {
                        return (true, format!("no connections away from {nic}"));
                    }
                    (keys, nic.clone(), format!("back to {nic}"))
                }
            }
        };
        let sent = {
            let mut inv = self.lock();
            self.send_migrate(&mut inv, &keys, Some(&to))
        };
        self.await_orders(sent, &what).await
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests;
