//! The resilient connection: one logical, exactly-once, in-order message
//! channel between two ranks over an ordered set of rails (a local NIC and
//! the peer's address on the same rail), primary first.
//!
//! At any moment at most one *path* (a soft QP: a NIC-bound TCP connection,
//! see [`crate::soft`]) carries the frames of [`crate::seq`]. When the path
//! is lost both ends move to another rail and carry on where they were: the
//! side that opens the new path sends a `Hello` with a higher *epoch* and
//! the sequence it delivered through, the other side answers with its own,
//! and each replays what the other has not delivered from its bounded send
//! window. Nothing is lost, duplicated or reordered, across any number of
//! migrations.
//!
//! **Triggers.** A local link-down (the endpoint's link state, fed by netlink
//! or RDMA port events: the reflex, no supervisor round trip), an order
//! ([`ResilientConnection::migrate`], from the agent), and transport errors
//! (the path breaks, or stays silent past `dead_after` although both sides
//! ping every `ping_interval`).
//!
//! **Who dials.** Either side may open a path; when both do at once for the
//! same epoch, side A's path wins (B accepts A's hello at an equal epoch, A
//! refuses B's), so the two always converge on one path.
//!
//! **Failback.** With [`Failback::WhenReusable`], once the primary NIC is up,
//! its flap damper says it is reusable and it has stayed up for `hold`, the
//! connection moves back to it. Arriving on a backup restarts that `hold`
//! (on both sides), so a migrate order is never undone at once. A side refuses a new path on a rail whose
//! local NIC is down or suppressed unless it has no path at all.
//!
//! **No NIC left.** Sends fill the window (bounded) and then wait; the
//! connection keeps trying every rail and resumes when one returns. After
//! `stall_timeout` without a path it fails loudly: every pending and later
//! call returns [`ConnError::NoPath`]. It never drops a message silently.
//!
//! **Pacing.** [`ResilientConnection::set_rate`] limits the bytes per second
//! the connection puts on the wire (the rate-reshaping hook).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::damper::{DampingConfig, FlapDamper};
use crate::seq::{Decoded, Frame, Receiver as SeqReceiver, SendWindow, Verdict};
use crate::soft::{dial, Endpoint, IncomingPath, NicStatus};

/// One rail of a connection: the local NIC (index into the endpoint's NICs)
/// and the peer's listening address on the same rail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rail {
    pub nic: usize,
    pub remote: SocketAddr,
}

/// Which end of the connection this is (decides simultaneous dials).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

/// When to move back to the primary rail.
#[derive(Debug, Clone, PartialEq)]
pub enum Failback {
    /// Stay where the last migration left the connection.
    Never,
    /// Move back once the primary NIC is up, not suppressed by its damper and
    /// has been up for `hold`.
    WhenReusable {
        damping: DampingConfig,
        hold: Duration,
    },
}

/// Settings of one connection.
#[derive(Debug, Clone)]
pub struct ConnConfig {
    /// Identifies the connection on both ends (same value on both).
    pub conn_id: u64,
    pub side: Side,
    /// Rails in order of preference; `rails[0]` is the primary.
    pub rails: Vec<Rail>,
    /// Largest message accepted by `send`.
    pub max_message: usize,
    /// Bounds of the unacknowledged-send window.
    pub window_msgs: usize,
    pub window_bytes: usize,
    /// Messages delivered but not yet taken by `recv`.
    pub recv_queue: usize,
    /// Without any path for this long, the connection fails.
    pub stall_timeout: Duration,
    /// Limit of one connect attempt and of the hello exchange.
    pub connect_timeout: Duration,
    pub ping_interval: Duration,
    /// A path silent for this long is dead.
    pub dead_after: Duration,
    pub failback: Failback,
}

impl ConnConfig {
    /// Defaults for everything but identity and rails.
    pub fn new(conn_id: u64, side: Side, rails: Vec<Rail>) -> Self {
        Self {
            conn_id,
            side,
            rails,
            max_message: 64 << 20,
            window_msgs: 4096,
            window_bytes: 256 << 20,
            recv_queue: 256,
            stall_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_millis(250),
            ping_interval: Duration::from_millis(50),
            dead_after: Duration::from_millis(500),
            failback: Failback::WhenReusable {
                damping: DampingConfig::default(),
                hold: Duration::from_secs(1),
            },
        }
    }

    fn validate(&self, endpoint: &Endpoint) -> Result<(), ConnError> {
        let bad = |m: String| Err(ConnError::Config(m));
        if self.rails.is_empty() {
            return bad("a connection needs at least one rail".into());
        }
        for r in &self.rails {
            if r.nic >= endpoint.nics().len() {
                return bad(format!(
                    "rail uses NIC #{} the endpoint does not have",
                    r.nic
                ));
            }
        }
        if self.max_message == 0 || self.max_message > crate::seq::MAX_PAYLOAD {
            return bad(format!(
                "max_message must be 1..={} bytes",
                crate::seq::MAX_PAYLOAD
            ));
        }
        if self.window_bytes < self.max_message || self.window_msgs == 0 {
            return bad("the window must hold at least one largest message".into());
        }
        if self.recv_queue == 0 {
            return bad("recv_queue must be positive".into());
        }
        if self.ping_interval.is_zero() || self.dead_after <= self.ping_interval {
            return bad("dead_after must be longer than a positive ping_interval".into());
        }
        if let Failback::WhenReusable { damping, .. } = &self.failback {
            damping
                .validate()
                .map_err(|e| ConnError::Config(e.to_string()))?;
        }
        Ok(())
    }
}

/// Why a connection call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConnError {
    #[error("invalid connection settings: {0}")]
    Config(String),
    #[error("message of {len} bytes exceeds the maximum of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("no usable rail for {0:?}: the connection failed; undelivered messages were not dropped silently, they are reported here")]
    NoPath(Duration),
    #[error("the peer broke the protocol: {0}")]
    Protocol(String),
    #[error("the connection is closed")]
    Closed,
    #[error("{0}")]
    Endpoint(String),
}

/// Why the connection moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MoveReason {
    Initial,
    LinkDown,
    Order,
    TransportError,
    Failback,
    PeerMoved,
}

/// What the connection reports about itself.
#[derive(Debug, Clone, Default)]
pub struct ConnStats {
    /// Epoch of the current (or last) path.
    pub epoch: u32,
    /// Rail index of the current path; `None` while there is none.
    pub rail: Option<usize>,
    /// Path changes after the first path.
    pub migrations: u64,
    /// Messages queued for sending (the highest sequence number used).
    pub sent: u64,
    /// Messages the peer has acknowledged.
    pub acked_through: u64,
    /// Messages delivered to this side's application queue.
    pub delivered: u64,
    /// Messages sent again after a migration.
    pub replayed: u64,
    pub last_reason: Option<MoveReason>,
    /// When the current path was established.
    pub path_since: Option<Instant>,
    /// When the connection lost its last path (`None` while it has one).
    pub stalled_since: Option<Instant>,
}

/// A delivered message and the path that carried it.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub payload: Bytes,
    pub epoch: u32,
    pub rail: usize,
}

enum Order {
    Migrate(Option<usize>),
    Rate(Option<u64>),
}

/// Sends on a connection; clones share the connection's order.
#[derive(Clone)]
pub struct ConnSender {
    data: mpsc::Sender<Bytes>,
    failure: Arc<Mutex<Option<ConnError>>>,
    max_message: usize,
}

impl ConnSender {
    /// Queues one message; waits while the send window is full.
    pub async fn send(&self, msg: Bytes) -> Result<(), ConnError> {
        if msg.len() > self.max_message {
            return Err(ConnError::TooLarge {
                len: msg.len(),
                max: self.max_message,
            });
        }
        self.data
            .send(msg)
            .await
            .map_err(|_| failure_of(&self.failure))
    }
}

/// The transport a job uses between two ranks.
pub struct ResilientConnection {
    data: mpsc::Sender<Bytes>,
    orders: mpsc::Sender<Order>,
    deliveries: mpsc::Receiver<Delivery>,
    stats: watch::Receiver<ConnStats>,
    failure: Arc<Mutex<Option<ConnError>>>,
    max_message: usize,
    task: JoinHandle<()>,
    endpoint: Arc<Endpoint>,
    conn_id: u64,
}

impl ResilientConnection {
    /// Opens the connection on `endpoint`; the peer opens the same `conn_id`
    /// with the other side. Returns at once: the first path is set up in
    /// the background, and sends queue (bounded) until it exists.
    pub fn open(endpoint: Arc<Endpoint>, cfg: ConnConfig) -> Result<Self, ConnError> {
        cfg.validate(&endpoint)?;
        let incoming = endpoint
            .register(cfg.conn_id)
            .map_err(|e| ConnError::Endpoint(e.to_string()))?;
        let (data_tx, data_rx) = mpsc::channel(16);
        let (order_tx, order_rx) = mpsc::channel(16);
        let (deliver_tx, deliver_rx) = mpsc::channel(cfg.recv_queue);
        let (stats_tx, stats_rx) = watch::channel(ConnStats::default());
        let failure = Arc::new(Mutex::new(None));
        let links = endpoint.links();
        let seen = links.borrow().clone();
        let dampers = match &cfg.failback {
            Failback::WhenReusable { damping, .. } => cfg
                .rails
                .iter()
                .map(|_| FlapDamper::new(*damping))
                .collect(),
            Failback::Never => Vec::new(),
        };
        let now = Instant::now();
        let driver = Driver {
            window: SendWindow::new(cfg.window_msgs, cfg.window_bytes),
            recv: SeqReceiver::new(64, 1 << 20),
            epoch: 0,
            path: None,
            dial: None,
            peer_epoch: Arc::new(std::sync::atomic::AtomicU32::new(0)),
            next_dial: if cfg.side == Side::A {
                now
            } else {
                now + 2 * cfg.connect_timeout
            },
            dial_backoff: Duration::from_millis(10),
            stalled_since: now,
            pending_reason: MoveReason::Initial,
            seen,
            up_since: vec![Some(now); endpoint.nics().len()],
            links,
            dampers,
            pace: None,
            stats: stats_tx,
            deliver: deliver_tx,
            failure: failure.clone(),
            endpoint: endpoint.clone(),
            cfg: cfg.clone(),
        };
        let task = tokio::spawn(driver.run(data_rx, order_rx, incoming));
        Ok(Self {
            data: data_tx,
            orders: order_tx,
            deliveries: deliver_rx,
            stats: stats_rx,
            failure,
            max_message: cfg.max_message,
            task,
            endpoint,
            conn_id: cfg.conn_id,
        })
    }

    fn failed(&self) -> ConnError {
        failure_of(&self.failure)
    }

    /// Queues one message; waits while the send window is full.
    pub async fn send(&self, msg: Bytes) -> Result<(), ConnError> {
        self.sender().send(msg).await
    }

    /// A handle that sends on this connection (for a task of its own).
    pub fn sender(&self) -> ConnSender {
        ConnSender {
            data: self.data.clone(),
            failure: self.failure.clone(),
            max_message: self.max_message,
        }
    }

    /// The next message, in order.
    pub async fn recv(&mut self) -> Result<Bytes, ConnError> {
        self.recv_delivery().await.map(|d| d.payload)
    }

    /// The next message with the path that carried it.
    pub async fn recv_delivery(&mut self) -> Result<Delivery, ConnError> {
        match self.deliveries.recv().await {
            Some(d) => Ok(d),
            None => Err(self.failed()),
        }
    }

    /// Orders a migration (see [`ConnControl::migrate`]).
    pub async fn migrate(&self, rail: Option<usize>) -> Result<(), ConnError> {
        self.control().migrate(rail).await
    }

    /// Limits the connection's rate (see [`ConnControl::set_rate`]).
    pub async fn set_rate(&self, bytes_per_s: Option<u64>) -> Result<(), ConnError> {
        self.control().set_rate(bytes_per_s).await
    }

    /// A handle that orders migrations and pacing (for the task that
    /// answers the agent's orders).
    pub fn control(&self) -> ConnControl {
        ConnControl {
            orders: self.orders.clone(),
            failure: self.failure.clone(),
            stats: self.stats.clone(),
        }
    }

    /// Current figures.
    pub fn stats(&self) -> ConnStats {
        self.stats.borrow().clone()
    }

    /// Follows the figures (changes on every path change).
    pub fn watch_stats(&self) -> watch::Receiver<ConnStats> {
        self.stats.clone()
    }

    /// Waits until every message sent so far is acknowledged by the peer;
    /// `false` if that did not happen within `timeout`.
    pub async fn flush(&self, timeout: Duration) -> Result<bool, ConnError> {
        let mut st = self.stats.clone();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.task.is_finished() {
                return Err(self.failed());
            }
            let queued = self.data.capacity() < self.data.max_capacity();
            let done = {
                let s = st.borrow_and_update();
                !queued && s.acked_through == s.sent
            };
            if done {
                return Ok(true);
            }
            // Queued sends do not change the stats until they reach the
            // window: poll briefly while any are queued.
            let wait = if queued {
                Duration::from_millis(1)
            } else {
                Duration::from_millis(100)
            };
            let until = deadline.min(tokio::time::Instant::now() + wait);
            let _ = tokio::time::timeout_at(until, st.changed()).await;
            if tokio::time::Instant::now() >= deadline {
                return Ok(false);
            }
        }
    }
}

impl Drop for ResilientConnection {
    fn drop(&mut self) {
        self.task.abort();
        self.endpoint.unregister(self.conn_id);
    }
}

/// Why a connection stopped: its recorded error, or `Closed`.
fn failure_of(failure: &Mutex<Option<ConnError>>) -> ConnError {
    failure
        .lock()
        .expect("failure lock poisoned")
        .clone()
        .unwrap_or(ConnError::Closed)
}

/// Orders for a connection from another task. Cheap to clone; calls fail
/// with the connection's error once it has failed or closed.
#[derive(Clone)]
pub struct ConnControl {
    orders: mpsc::Sender<Order>,
    failure: Arc<Mutex<Option<ConnError>>>,
    stats: watch::Receiver<ConnStats>,
}

impl ConnControl {
    fn failed(&self) -> ConnError {
        failure_of(&self.failure)
    }

    /// Orders a migration to `rail`, or off the current rail to the best
    /// other one (`None`). A migration to the rail the connection is on
    /// already does nothing (an agent's order may cross the connection's
    /// own reflex).
    pub async fn migrate(&self, rail: Option<usize>) -> Result<(), ConnError> {
        self.orders
            .send(Order::Migrate(rail))
            .await
            .map_err(|_| self.failed())
    }

    /// Limits the connection to `bytes_per_s` on the wire (`None`: no limit).
    pub async fn set_rate(&self, bytes_per_s: Option<u64>) -> Result<(), ConnError> {
        self.orders
            .send(Order::Rate(bytes_per_s))
            .await
            .map_err(|_| self.failed())
    }

    /// Follows the connection's figures (changes on every path change).
    pub fn watch_stats(&self) -> watch::Receiver<ConnStats> {
        self.stats.clone()
    }

    /// Resolves once the connection has failed or closed, with why (for a
    /// task blocked elsewhere that must not miss this connection's end).
    pub async fn closed(&self) -> ConnError {
        let mut st = self.stats.clone();
        while st.changed().await.is_ok() {}
        self.failed()
    }
}

/// An item for a path's writer task.
struct Out {
    frame: BytesMut,
    payload: Option<Bytes>,
}

struct Path {
    rail: usize,
    epoch: u32,
    /// This side opened the path (else it accepted the peer's).
    dialed_by_me: bool,
    writer: mpsc::Sender<Out>,
    frames: mpsc::Receiver<Result<Frame, String>>,
    tasks: [JoinHandle<()>; 2],
    last_heard: Instant,
    last_ping: Instant,
    nic_downs: u64,
}

impl Drop for Path {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// `delivered_through` of a hello that refuses a path (never a real count).
const REFUSED: u64 = u64::MAX;

struct DialResult {
    rail: usize,
    epoch: u32,
    stream: TcpStream,
    rest: BytesMut,
    peer_delivered: u64,
}

struct Driver {
    cfg: ConnConfig,
    endpoint: Arc<Endpoint>,
    window: SendWindow,
    recv: SeqReceiver,
    /// Highest epoch seen or used.
    epoch: u32,
    path: Option<Path>,
    dial: Option<(JoinHandle<()>, oneshot::Receiver<Option<DialResult>>)>,
    /// Highest epoch a peer's refusal told us about.
    peer_epoch: Arc<std::sync::atomic::AtomicU32>,
    next_dial: Instant,
    dial_backoff: Duration,
    stalled_since: Instant,
    pending_reason: MoveReason,
    links: watch::Receiver<Vec<NicStatus>>,
    seen: Vec<NicStatus>,
    up_since: Vec<Option<Instant>>,
    dampers: Vec<FlapDamper>,
    pace: Option<Pacer>,
    stats: watch::Sender<ConnStats>,
    deliver: mpsc::Sender<Delivery>,
    failure: Arc<Mutex<Option<ConnError>>>,
}

/// Token bucket over bytes.
struct Pacer {
    rate: f64,
    tokens: f64,
    burst: f64,
    last: Instant,
}

impl Pacer {
    fn new(rate: u64) -> Self {
        let rate = rate.max(1) as f64;
        // A burst of 10 ms worth, at least one 64 KiB chunk.
        let burst = (rate / 100.0).max(65_536.0);
        Self {
            rate,
            tokens: burst,
            burst,
            last: Instant::now(),
        }
    }
    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        self.last = now;
    }
    /// When `bytes` may go (now if the bucket has anything left: a frame may
    /// overdraw, and the debt delays the next one).
    fn ready_at(&mut self, now: Instant) -> Instant {
        self.refill(now);
        if self.tokens > 0.0 {
            now
        } else {
            now + Duration::from_secs_f64(-self.tokens / self.rate + 1e-6)
        }
    }
    fn take(&mut self, bytes: usize) {
        self.tokens -= bytes as f64;
    }
}

impl Driver {
    async fn run(
        mut self,
        mut data: mpsc::Receiver<Bytes>,
        mut orders: mpsc::Receiver<Order>,
        mut incoming: mpsc::Receiver<IncomingPath>,
    ) {
        let tick = self.cfg.ping_interval.min(Duration::from_millis(10));
        let mut ticker = tokio::time::interval(tick);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let result: Result<(), ConnError> = loop {
            if let Err(e) = self.pump() {
                break Err(e);
            }
            let room = self.window.has_room(self.cfg.max_message);
            let can_write = self.path.is_some() && self.window.has_unsent();
            let pace_at = match (&mut self.pace, can_write) {
                (Some(p), true) => Some(p.ready_at(Instant::now())),
                _ => None,
            };
            tokio::select! {
                biased;
                // Path frames first: acks free the window.
                f = recv_frame(&mut self.path) => {
                    if let Err(e) = self.on_frame(f).await { break Err(e); }
                }
                Some(p) = incoming.recv() => {
                    if let Err(e) = self.on_incoming(p).await { break Err(e); }
                }
                r = dial_done(&mut self.dial) => {
                    self.dial = None;
                    if let Err(e) = self.on_dialed(r) { break Err(e); }
                }
                r = self.links.changed() => {
                    if r.is_err() { break Err(ConnError::Endpoint("endpoint closed".into())); }
                    self.on_links();
                }
                o = orders.recv() => match o {
                    Some(Order::Migrate(to)) => self.on_migrate_order(to),
                    Some(Order::Rate(r)) => self.pace = r.map(Pacer::new),
                    None => break Ok(()),
                },
                m = data.recv(), if room => match m {
                    Some(m) => self.window.push(m).map(|_| ()).unwrap_or_else(|e| {
                        tracing::error!(error = %e, "window refused a message it had room for");
                    }),
                    None => break Ok(()),
                },
                _ = sleep_until_opt(pace_at), if pace_at.is_some_and(|t| t > Instant::now()) => {}
                _ = ticker.tick() => {
                    if let Err(e) = self.on_tick() { break Err(e); }
                }
            }
            self.publish();
        };
        if let Err(e) = result {
            tracing::warn!(conn_id = self.cfg.conn_id, error = %e, "resilient connection failed");
            *self.failure.lock().expect("failure lock poisoned") = Some(e);
        }
    }

    fn publish(&self) {
        let path = self.path.as_ref();
        self.stats.send_if_modified(|s| {
            let new_rail = path.map(|p| p.rail);
            let acked = self.window.acked_through();
            let sent = self.window.highest_pushed();
            let delivered = self.recv.delivered_through();
            if s.rail == new_rail
                && s.acked_through == acked
                && s.sent == sent
                && s.delivered == delivered
            {
                return false;
            }
            s.rail = new_rail;
            s.acked_through = acked;
            s.sent = sent;
            s.delivered = delivered;
            true
        });
    }

    /// Writes unsent frames to the path while its writer has room and the
    /// pacer allows.
    fn pump(&mut self) -> Result<(), ConnError> {
        let Some(path) = self.path.as_mut() else {
            return Ok(());
        };
        let now = Instant::now();
        while let Some((seq, payload)) = self.window.unsent() {
            if let Some(p) = &mut self.pace {
                if p.ready_at(now) > now {
                    break;
                }
            }
            let Ok(permit) = path.writer.try_reserve() else {
                break;
            };
            let payload = payload.clone();
            let len = payload.len();
            let mut head = BytesMut::with_capacity(32);
            crate::seq::encode_data_header(seq, len, &mut head);
            permit.send(Out {
                frame: head,
                payload: Some(payload),
            });
            self.window.mark_sent(seq);
            if let Some(p) = &mut self.pace {
                p.take(len);
            }
        }
        Ok(())
    }

    /// Queues a control frame; `false` if the writer was full (control
    /// frames are dropped then: acks are cumulative, pings periodic).
    fn send_control(&mut self, f: Frame) -> bool {
        let Some(path) = &self.path else {
            return false;
        };
        let mut b = BytesMut::with_capacity(32);
        f.encode(&mut b);
        path.writer
            .try_send(Out {
                frame: b,
                payload: None,
            })
            .is_ok()
    }

    /// Sends a cumulative ack if `through` is given; remembers a dropped one.
    fn send_ack(&mut self, through: Option<u64>) {
        if let Some(t) = through {
            if !self.send_control(Frame::Ack {
                delivered_through: t,
            }) {
                self.recv.ack_dropped();
            }
        }
    }

    async fn on_frame(&mut self, f: Option<Result<Frame, String>>) -> Result<(), ConnError> {
        let f = match f {
            Some(Ok(f)) => f,
            Some(Err(e)) => {
                tracing::debug!(conn_id = self.cfg.conn_id, error = %e, "path broke");
                self.path_broke();
                return Ok(());
            }
            None => {
                self.path_broke();
                return Ok(());
            }
        };
        let (epoch, rail) = match self.path.as_mut() {
            Some(p) => {
                p.last_heard = Instant::now();
                (p.epoch, p.rail)
            }
            None => return Ok(()),
        };
        match f {
            Frame::Data { seq, payload } => {
                let len = payload.len();
                match self.recv.on_frame(seq, len) {
                    Verdict::Deliver => {
                        let d = Delivery {
                            payload,
                            epoch,
                            rail,
                        };
                        if self.deliver.send(d).await.is_err() {
                            return Err(ConnError::Closed);
                        }
                        let through = self.recv.should_ack();
                        self.send_ack(through);
                        // Input went idle: acknowledge everything now.
                        if self.path.as_ref().is_some_and(|p| p.frames.is_empty()) {
                            let through = self.recv.flush_ack();
                            self.send_ack(through);
                        }
                    }
                    Verdict::Duplicate => {
                        // A duplicate means the peer replays what we have:
                        // tell it soon so its window does not fill up.
                        let through = self.recv.should_ack();
                        self.send_ack(through);
                    }
                    Verdict::Gap { expected } => {
                        return Err(ConnError::Protocol(format!(
                        "message {seq} arrived while {expected} was expected on an in-order path"
                    )))
                    }
                }
            }
            Frame::Ack { delivered_through } => {
                self.window
                    .ack(delivered_through)
                    .map_err(|e| ConnError::Protocol(e.to_string()))?;
            }
            Frame::Ping { nonce } => {
                self.send_control(Frame::Pong { nonce });
            }
            Frame::Pong { .. } => {}
            Frame::Hello { .. } => {
                return Err(ConnError::Protocol("hello on an established path".into()))
            }
        }
        Ok(())
    }

    /// Whether this side would use a new path on local NIC `nic` now.
    fn nic_usable(&mut self, rail: usize) -> bool {
        let nic = self.cfg.rails[rail].nic;
        let up = self.seen.get(nic).is_some_and(|s| s.up);
        let suppressed = self
            .dampers
            .get_mut(rail)
            .is_some_and(|d| d.is_suppressed(Instant::now()));
        up && !suppressed
    }

    async fn on_incoming(&mut self, p: IncomingPath) -> Result<(), ConnError> {
        let Frame::Hello {
            epoch,
            delivered_through,
            ..
        } = p.hello
        else {
            return Ok(());
        };
        let Some(rail) = self.cfg.rails.iter().position(|r| r.nic == p.nic) else {
            tracing::debug!(
                conn_id = self.cfg.conn_id,
                nic = p.nic,
                "path on a NIC this connection does not use"
            );
            return Ok(());
        };
        // A newer epoch wins; for simultaneous dials of the same epoch, A's
        // path wins. A path on a NIC we would not use is refused unless we
        // have nothing better.
        // (B takes A's path over its own for the same epoch, but not a
        // second path of an epoch it already accepted from A.)
        let repeat = self
            .path
            .as_ref()
            .is_some_and(|p| p.epoch == epoch && !p.dialed_by_me);
        let newer =
            epoch > self.epoch || (epoch == self.epoch && self.cfg.side == Side::B && !repeat);
        let accept = newer && (self.path.is_none() || self.nic_usable(rail));
        if !accept {
            tracing::debug!(
                conn_id = self.cfg.conn_id,
                epoch,
                current = self.epoch,
                "refused a path"
            );
            // Say so, with our epoch, so a dialer that fell behind catches up
            // at once instead of one epoch per attempt.
            let mut refusal = BytesMut::with_capacity(32);
            Frame::Hello {
                conn_id: self.cfg.conn_id,
                epoch: self.epoch,
                delivered_through: REFUSED,
            }
            .encode(&mut refusal);
            let mut stream = p.stream;
            let limit = self.cfg.connect_timeout;
            tokio::spawn(async move {
                let _ = tokio::time::timeout(limit, stream.write_all(&refusal)).await;
            });
            return Ok(());
        }
        // Break the old path before answering, so what we report as
        // delivered is final for it.
        self.path = None;
        if let Some((t, _)) = self.dial.take() {
            t.abort();
        }
        self.epoch = epoch;
        let mut stream = p.stream;
        let mut hello = BytesMut::with_capacity(32);
        Frame::Hello {
            conn_id: self.cfg.conn_id,
            epoch,
            delivered_through: self.recv.hello_through(),
        }
        .encode(&mut hello);
        let wrote = tokio::time::timeout(self.cfg.connect_timeout, stream.write_all(&hello)).await;
        if !matches!(wrote, Ok(Ok(()))) {
            self.lose_path(MoveReason::TransportError);
            return Ok(());
        }
        self.adopt(
            rail,
            epoch,
            stream,
            p.rest,
            delivered_through,
            MoveReason::PeerMoved,
            false,
        )
    }

    fn on_dialed(&mut self, r: Option<DialResult>) -> Result<(), ConnError> {
        match r {
            // Still the newest attempt: use it (a failback dial replaces the
            // path it was made beside).
            Some(d) if d.epoch == self.epoch => self.adopt(
                d.rail,
                d.epoch,
                d.stream,
                d.rest,
                d.peer_delivered,
                self.pending_reason,
                true,
            ),
            Some(_) => Ok(()), // overtaken by a newer path
            None if self.path.is_some() => {
                // A failback refused or failed: stay, catch up on epochs.
                self.learn_peer_epoch();
                Ok(())
            }
            None => {
                self.learn_peer_epoch();
                self.next_dial = Instant::now() + self.dial_backoff;
                self.dial_backoff = (self.dial_backoff * 2).min(Duration::from_millis(200));
                Ok(())
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn adopt(
        &mut self,
        rail: usize,
        epoch: u32,
        stream: TcpStream,
        rest: BytesMut,
        peer_delivered: u64,
        reason: MoveReason,
        dialed_by_me: bool,
    ) -> Result<(), ConnError> {
        let replay = self
            .window
            .resume(peer_delivered)
            .map_err(|e| ConnError::Protocol(e.to_string()))?;
        let (rd, wr) = stream.into_split();
        let (wtx, wrx) = mpsc::channel(64);
        let (ftx, frx) = mpsc::channel(256);
        let max = self.cfg.max_message;
        let tasks = [
            tokio::spawn(reader(rd, rest, ftx, max)),
            tokio::spawn(writer(wr, wrx)),
        ];
        let now = Instant::now();
        if rail != 0 {
            // Arriving on a backup (by order, failure or the peer's move)
            // restarts the failback hold: a move is never undone at once,
            // and a connection does not ping-pong between rails.
            let primary = self.cfg.rails[0].nic;
            if let Some(Some(u)) = self.up_since.get_mut(primary) {
                *u = now;
            }
        }
        let nic_downs = self
            .seen
            .get(self.cfg.rails[rail].nic)
            .map_or(0, |s| s.downs);
        self.path = Some(Path {
            rail,
            epoch,
            dialed_by_me,
            writer: wtx,
            frames: frx,
            tasks,
            last_heard: now,
            last_ping: now,
            nic_downs,
        });
        self.dial_backoff = Duration::from_millis(10);
        let stalled_for = now.saturating_duration_since(self.stalled_since);
        tracing::info!(
            conn_id = self.cfg.conn_id,
            rail,
            epoch,
            ?reason,
            replay,
            stalled_ms = stalled_for.as_millis() as u64,
            "path up"
        );
        self.stats.send_modify(|s| {
            if s.path_since.is_some() || s.epoch > 0 {
                s.migrations += 1;
            }
            s.epoch = epoch;
            s.rail = Some(rail);
            s.replayed += replay as u64;
            s.last_reason = Some(reason);
            s.path_since = Some(now);
            s.stalled_since = None;
        });
        Ok(())
    }

    /// Drops the current path (if any) and schedules a new one now.
    fn lose_path(&mut self, reason: MoveReason) {
        if self.path.take().is_some() {
            self.stalled_since = Instant::now();
            let at = self.stalled_since;
            self.stats.send_modify(|s| {
                s.rail = None;
                s.path_since = None;
                s.stalled_since = Some(at);
            });
        }
        self.pending_reason = reason;
        self.next_dial = Instant::now();
    }

    /// The current path failed. During a make-before-break failback the
    /// peer breaks the old path as it accepts the new one, so the dial in
    /// flight is the way on: keep it. Otherwise move.
    fn path_broke(&mut self) {
        if self.dial.is_some() && self.pending_reason == MoveReason::Failback {
            self.lose_path(MoveReason::Failback);
        } else {
            self.start_move(MoveReason::TransportError, None);
        }
    }

    fn learn_peer_epoch(&mut self) {
        let e = self.peer_epoch.load(std::sync::atomic::Ordering::Relaxed);
        if e > self.epoch {
            tracing::debug!(
                conn_id = self.cfg.conn_id,
                ours = self.epoch,
                peer = e,
                "catching up with the peer's epoch"
            );
            self.epoch = e;
        }
    }

    fn on_migrate_order(&mut self, to: Option<usize>) {
        let here = self.path.as_ref().map(|p| p.rail);
        if to.is_some() && to == here {
            tracing::debug!(conn_id = self.cfg.conn_id, rail = ?to, "already on the ordered rail");
            return;
        }
        self.start_move(MoveReason::Order, to);
    }

    /// Leaves the current path and dials a new one (`to` first if given).
    fn start_move(&mut self, reason: MoveReason, to: Option<usize>) {
        let avoid = self.path.as_ref().map(|p| p.rail);
        self.lose_path(reason);
        if let Some((t, _)) = self.dial.take() {
            t.abort();
        }
        self.dial_now(avoid, to);
    }

    fn dial_now(&mut self, avoid: Option<usize>, first: Option<usize>) {
        let mut order: Vec<usize> = (0..self.cfg.rails.len())
            .filter(|r| Some(*r) != avoid && Some(*r) != first)
            .collect();
        order.retain(|r| self.seen.get(self.cfg.rails[*r].nic).is_some_and(|s| s.up));
        if let Some(f) = first.filter(|f| *f < self.cfg.rails.len()) {
            order.insert(0, f);
        }
        if let Some(a) = avoid.filter(|a| Some(*a) != first) {
            if self.seen.get(self.cfg.rails[a].nic).is_some_and(|s| s.up) {
                order.push(a);
            }
        }
        if order.is_empty() {
            self.next_dial = Instant::now() + self.dial_backoff;
            return;
        }
        self.dial_rails(order);
    }

    /// Dials `order` (rail indices, first choice first) with a new epoch in
    /// a task of its own; the current path, if any, keeps working meanwhile.
    fn dial_rails(&mut self, order: Vec<usize>) {
        self.epoch += 1;
        let epoch = self.epoch;
        let (tx, rx) = oneshot::channel();
        let rails: Vec<_> = order
            .into_iter()
            .map(|r| {
                let rail = &self.cfg.rails[r];
                (r, self.endpoint.nics()[rail.nic].clone(), rail.remote)
            })
            .collect();
        let hello = Frame::Hello {
            conn_id: self.cfg.conn_id,
            epoch,
            delivered_through: self.recv.hello_through(),
        };
        let timeout = self.cfg.connect_timeout;
        let conn_id = self.cfg.conn_id;
        let repair = self.endpoint.neighbours();
        let learned = self.peer_epoch.clone();
        let task = tokio::spawn(async move {
            let mut result = None;
            for (r, nic, remote) in rails {
                match dial_rail(&nic, remote, &hello, timeout, repair.as_ref(), &learned).await {
                    Ok((stream, rest, peer_delivered)) => {
                        result = Some(DialResult {
                            rail: r,
                            epoch,
                            stream,
                            rest,
                            peer_delivered,
                        });
                        break;
                    }
                    Err(e) => {
                        tracing::debug!(conn_id, rail = r, nic = %nic.name, error = %e, "dial failed")
                    }
                }
            }
            let _ = tx.send(result);
        });
        self.dial = Some((task, rx));
        self.next_dial = Instant::now() + Duration::from_secs(3600);
    }

    fn on_links(&mut self) {
        let now = Instant::now();
        let new = self.links.borrow_and_update().clone();
        for (nic, st) in new.iter().enumerate() {
            let old = self.seen.get(nic).cloned().unwrap_or_default();
            if st.downs > old.downs {
                for (r, rail) in self.cfg.rails.iter().enumerate() {
                    if rail.nic == nic {
                        if let Some(d) = self.dampers.get_mut(r) {
                            for _ in old.downs..st.downs {
                                d.record_flap(now);
                            }
                        }
                    }
                }
            }
            if let Some(u) = self.up_since.get_mut(nic) {
                *u = match (st.up, *u) {
                    (true, Some(t)) if st.downs == old.downs => Some(t),
                    (true, _) => Some(now),
                    (false, _) => None,
                };
            }
        }
        self.seen = new;
        // The reflex: our NIC under the current path went down (or bounced).
        if let Some(p) = &self.path {
            let nic = self.cfg.rails[p.rail].nic;
            let st = &self.seen[nic];
            if !st.up || st.downs > p.nic_downs {
                self.start_move(MoveReason::LinkDown, None);
                return;
            }
        }
        // A rail came back while we have none: try at once.
        if self.path.is_none() && self.dial.is_none() {
            self.next_dial = now;
        }
    }

    fn on_tick(&mut self) -> Result<(), ConnError> {
        let now = Instant::now();
        if let Some(p) = &mut self.path {
            if now.saturating_duration_since(p.last_heard) > self.cfg.dead_after {
                tracing::info!(
                    conn_id = self.cfg.conn_id,
                    rail = p.rail,
                    "path silent; moving"
                );
                self.start_move(MoveReason::TransportError, None);
                return Ok(());
            }
            if now.saturating_duration_since(p.last_ping) >= self.cfg.ping_interval {
                p.last_ping = now;
                self.send_control(Frame::Ping { nonce: 0 });
            }
            let through = self.recv.flush_ack();
            self.send_ack(through);
            self.maybe_fail_back(now);
            return Ok(());
        }
        let stalled = now.saturating_duration_since(self.stalled_since);
        if stalled > self.cfg.stall_timeout {
            return Err(ConnError::NoPath(stalled));
        }
        if self.dial.is_none() && now >= self.next_dial {
            self.dial_now(None, None);
        }
        Ok(())
    }

    fn maybe_fail_back(&mut self, now: Instant) {
        let Failback::WhenReusable { hold, .. } = self.cfg.failback else {
            return;
        };
        let Some(p) = &self.path else { return };
        if p.rail == 0 || self.dial.is_some() {
            return;
        }
        let nic = self.cfg.rails[0].nic;
        let stable = self
            .up_since
            .get(nic)
            .copied()
            .flatten()
            .is_some_and(|t| now.saturating_duration_since(t) >= hold);
        if stable && self.nic_usable(0) {
            // Try again only after another hold if the peer refuses.
            if let Some(u) = self.up_since.get_mut(nic) {
                *u = Some(now);
            }
            // Make before break: the current path carries on until the
            // primary's path is established.
            self.pending_reason = MoveReason::Failback;
            self.dial_rails(vec![0]);
        }
    }
}

async fn sleep_until_opt(t: Option<Instant>) {
    if let Some(t) = t {
        tokio::time::sleep_until(t.into()).await;
    }
}

async fn recv_frame(path: &mut Option<Path>) -> Option<Result<Frame, String>> {
    match path {
        Some(p) => p.frames.recv().await,
        None => std::future::pending().await,
    }
}

async fn dial_done(
    dial: &mut Option<(JoinHandle<()>, oneshot::Receiver<Option<DialResult>>)>,
) -> Option<DialResult> {
    match dial {
        Some((_, rx)) => rx.await.ok().flatten(),
        None => std::future::pending().await,
    }
}

/// Gap between parallel connect attempts on one rail.
const DIAL_STAGGER: Duration = Duration::from_millis(10);
/// Most parallel connect attempts on one rail.
const DIAL_ATTEMPTS: usize = 4;

/// Opens a path on one rail: a connect attempt now and, while none has
/// succeeded, another every [`DIAL_STAGGER`] (at most [`DIAL_ATTEMPTS`]),
/// all within `timeout`; before the second attempt a stuck neighbour entry
/// for the peer is forgotten. (Without this, a SYN queued behind a lost
/// ARP solicitation waits a second.) The first attempt to answer wins and
/// the others are dropped (the peer refuses a repeated hello for an epoch
/// it already accepted).
async fn dial_rail(
    nic: &crate::soft::LocalNic,
    remote: SocketAddr,
    hello: &Frame,
    timeout: Duration,
    repair: Option<&crate::soft::NeighbourRepair>,
    learned: &std::sync::atomic::AtomicU32,
) -> Result<(TcpStream, BytesMut, u64), String> {
    use futures::stream::{FuturesUnordered, StreamExt};
    let deadline = tokio::time::Instant::now() + timeout;
    let mut attempts = FuturesUnordered::new();
    let mut started = 0;
    let mut last_err = String::from("no attempt");
    loop {
        if started < DIAL_ATTEMPTS {
            if started == 1 {
                // The first attempt is slow: a stuck neighbour entry is
                // the usual cause right after a flap (see NeighbourRepair).
                if let Some(r) = repair {
                    r.forget(&nic.name, remote.ip()).await;
                }
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            attempts.push(dial_one(nic, remote, hello, left, learned));
            started += 1;
        }
        let next = if started < DIAL_ATTEMPTS {
            (tokio::time::Instant::now() + DIAL_STAGGER).min(deadline)
        } else {
            deadline
        };
        tokio::select! {
            Some(r) = attempts.next() => match r {
                Ok(ok) => return Ok(ok),
                Err(e) => {
                    last_err = e;
                    if attempts.is_empty() && started >= DIAL_ATTEMPTS {
                        return Err(last_err);
                    }
                }
            },
            _ = tokio::time::sleep_until(next) => {
                if tokio::time::Instant::now() >= deadline {
                    return Err(format!("{last_err}; timed out after {timeout:?}"));
                }
            }
        }
    }
}

async fn dial_one(
    nic: &crate::soft::LocalNic,
    remote: SocketAddr,
    hello: &Frame,
    timeout: Duration,
    learned: &std::sync::atomic::AtomicU32,
) -> Result<(TcpStream, BytesMut, u64), String> {
    let mut stream = dial(nic, remote, timeout)
        .await
        .map_err(|e| e.to_string())?;
    let mut b = BytesMut::with_capacity(32);
    hello.encode(&mut b);
    tokio::time::timeout(timeout, stream.write_all(&b))
        .await
        .map_err(|_| "hello write timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let (reply, stream, rest) = tokio::time::timeout(timeout, crate::soft::read_hello(stream))
        .await
        .map_err(|_| "no hello reply".to_string())?
        .map_err(|e| e.to_string())?;
    match reply {
        Frame::Hello {
            delivered_through: REFUSED,
            epoch,
            ..
        } => {
            learned.fetch_max(epoch, std::sync::atomic::Ordering::Relaxed);
            Err(format!("refused by the peer (its epoch {epoch})"))
        }
        Frame::Hello {
            delivered_through, ..
        } => Ok((stream, rest, delivered_through)),
        other => Err(format!("expected hello, got {}", other.kind())),
    }
}

async fn reader(
    mut rd: OwnedReadHalf,
    mut buf: BytesMut,
    out: mpsc::Sender<Result<Frame, String>>,
    max: usize,
) {
    loop {
        loop {
            match Frame::decode(&mut buf, max) {
                Ok(Decoded::Frame(f)) => {
                    if out.send(Ok(f)).await.is_err() {
                        return;
                    }
                }
                Ok(Decoded::Incomplete) => break,
                Err(e) => {
                    let _ = out.send(Err(e.to_string())).await;
                    return;
                }
            }
        }
        // Room for the whole frame being received (its length prefix says
        // how big; decode has checked it against the limit), so a large
        // message is read straight into one buffer without regrowing.
        let want = if buf.len() >= 4 {
            4 + u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize
        } else {
            0
        };
        let room = want.saturating_sub(buf.len()).max(64 * 1024);
        if buf.capacity() - buf.len() < room {
            buf.reserve(room.max(256 * 1024));
        }
        match rd.read_buf(&mut buf).await {
            Ok(0) => {
                let _ = out.send(Err("peer closed the path".into())).await;
                return;
            }
            Ok(_) => {}
            Err(e) => {
                let _ = out.send(Err(e.to_string())).await;
                return;
            }
        }
    }
}

/// Most frames written by one vectored write.
const WRITE_BATCH: usize = 64;

/// Writes the path's frames in order, each batch with vectored writes
/// (header and payload go out in one `writev`, the payload is not copied).
async fn writer(mut wr: OwnedWriteHalf, mut rx: mpsc::Receiver<Out>) {
    let mut chunks: Vec<Bytes> = Vec::with_capacity(2 * WRITE_BATCH);
    while let Some(o) = rx.recv().await {
        chunks.clear();
        let push = |o: Out, chunks: &mut Vec<Bytes>| {
            chunks.push(o.frame.freeze());
            if let Some(p) = o.payload {
                chunks.push(p);
            }
        };
        push(o, &mut chunks);
        while chunks.len() < 2 * WRITE_BATCH {
            match rx.try_recv() {
                Ok(o) => push(o, &mut chunks),
                Err(_) => break,
            }
        }
        if write_all_vectored(&mut wr, &mut chunks).await.is_err() {
            return;
        }
    }
}

async fn write_all_vectored(wr: &mut OwnedWriteHalf, chunks: &mut [Bytes]) -> std::io::Result<()> {
    use bytes::Buf;
    let mut i = 0;
    while i < chunks.len() {
        let mut n = {
            let slices: Vec<std::io::IoSlice<'_>> = chunks[i..]
                .iter()
                .take(WRITE_BATCH)
                .map(|b| std::io::IoSlice::new(b))
                .collect();
            wr.write_vectored(&slices).await?
        };
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while n > 0 && i < chunks.len() {
            let len = chunks[i].len();
            if n >= len {
                n -= len;
                i += 1;
            } else {
                chunks[i].advance(n);
                n = 0;
            }
        }
    }
    Ok(())
}
