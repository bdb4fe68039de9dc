//! The connection's task: one event loop per connection that owns the send
//! window, the receiver and the current path, and decides every move
//! (which rail to dial, which hello to accept, when to fail back, when to
//! give up). Path I/O is in [`super::path`], pacing in [`super::pacer`].

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::damper::FlapDamper;
use crate::seq::{Frame, Receiver as SeqReceiver, SendWindow, Verdict};
use crate::soft::{Endpoint, IncomingPath, NicStatus};

use super::config::{ConnConfig, Failback, Side};
use super::error::ConnError;
use super::pacer::Pacer;
use super::path::{dial_rail, reader, writer, DialResult, Out, Path, REFUSED};
use super::report::{ConnStats, Delivery, MoveReason};

/// An order from a handle to the connection's task.
pub(super) enum Order {
    Migrate(Option<usize>),
    Rate(Option<u64>),
}

/// The connection's task: owns the send window, the receiver, the current
/// path and the dial in flight, and decides every move.
pub(super) struct Driver {
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
    /// When the connection last tried to leave a NIC held out of service.
    held_tried: Instant,
    dampers: Vec<FlapDamper>,
    pace: Option<Pacer>,
    stats: watch::Sender<ConnStats>,
    deliver: mpsc::Sender<Delivery>,
    failure: Arc<Mutex<Option<ConnError>>>,
}

impl Driver {
    /// A driver for `cfg` on `endpoint`, before any path: side A dials at
    /// once, side B first waits two connect timeouts for A's path.
    pub(super) fn new(
        endpoint: Arc<Endpoint>,
        cfg: ConnConfig,
        deliver: mpsc::Sender<Delivery>,
        stats: watch::Sender<ConnStats>,
        failure: Arc<Mutex<Option<ConnError>>>,
    ) -> Self {
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
        Driver {
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
            held_tried: now,
            links,
            dampers,
            pace: None,
            stats,
            deliver,
            failure,
            endpoint,
            cfg,
        }
    }

    /// Runs the connection until its handles are dropped or it fails (the
    /// failure is recorded for the handles).
    pub(super) async fn run(
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
        let up = self.seen.get(nic).is_some_and(NicStatus::in_service);
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

    /// The link state of rail `r`'s local NIC as last seen.
    fn rail_status(&self, r: usize) -> NicStatus {
        self.seen
            .get(self.cfg.rails[r].nic)
            .cloned()
            .unwrap_or_default()
    }

    fn dial_now(&mut self, avoid: Option<usize>, first: Option<usize>) {
        let status = |r: usize| self.rail_status(r);
        let mut order: Vec<usize> = (0..self.cfg.rails.len())
            .filter(|r| Some(*r) != avoid && Some(*r) != first)
            .filter(|r| status(*r).in_service())
            .collect();
        if let Some(f) = first.filter(|f| *f < self.cfg.rails.len()) {
            order.insert(0, f);
        }
        if let Some(a) = avoid.filter(|a| Some(*a) != first) {
            if status(a).in_service() {
                order.push(a);
            }
        }
        // NICs an admin holds out of service: a last resort, better than
        // no path at all (the connection leaves once one in service is up).
        let last_resort: Vec<usize> = (0..self.cfg.rails.len())
            .filter(|r| !order.contains(r))
            .filter(|r| status(*r).up && !status(*r).in_service())
            .collect();
        order.extend(last_resort);
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
            // Held out of service by an admin, and a NIC in service is up:
            // leave (an admin's move, so an order).
            let elsewhere =
                self.cfg.rails.iter().any(|r| {
                    r.nic != nic && self.seen.get(r.nic).is_some_and(NicStatus::in_service)
                });
            if st.held && elsewhere {
                tracing::info!(
                    conn_id = self.cfg.conn_id,
                    rail = p.rail,
                    "NIC held out of service; moving"
                );
                self.start_move(MoveReason::Order, None);
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
            self.maybe_leave_held(now);
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

    /// On a NIC held out of service (taken as a last resort, or a path
    /// the peer opened there) while a NIC in service is up: dial the rails
    /// in service beside the current path, at most once per failback hold.
    /// The path carries on until one is established; a refused or failed
    /// dial leaves it where it is.
    fn maybe_leave_held(&mut self, now: Instant) {
        let Some(p) = &self.path else { return };
        if self.dial.is_some() {
            return;
        }
        let status = |r: usize| self.rail_status(r);
        if !status(p.rail).held {
            return;
        }
        let hold = match self.cfg.failback {
            Failback::WhenReusable { hold, .. } => hold,
            Failback::Never => Duration::from_secs(1),
        };
        if now.saturating_duration_since(self.held_tried) < hold {
            return;
        }
        let here = p.rail;
        let others: Vec<usize> = (0..self.cfg.rails.len())
            .filter(|r| *r != here && status(*r).in_service())
            .collect();
        if others.is_empty() {
            return;
        }
        self.held_tried = now;
        self.pending_reason = MoveReason::Order;
        self.dial_rails(others);
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
