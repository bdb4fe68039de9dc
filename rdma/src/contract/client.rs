//! The job's side of the contract: [`ContractClient`], which keeps the job's
//! registration across agent restarts, answers calls made while the agent
//! is away with [`Delivery::Deferred`], and hands each order once to the
//! [`OrderStream`].

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot, watch};

use super::error::ContractError;
use super::messages::{
    truncate, AgentMessage, ConnUp, Hello, JobMessage, Order, OrderAnswer, MAX_CONNS_PER_CLIENT,
    MAX_DETAIL_LEN,
};
use super::wire::{decode_agent, encode, write_message, LineReader};

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// How long [`ContractClient::connect`] keeps trying to reach the agent.
    pub connect_within: Duration,
    /// Limit of one call (queueing and the agent's answer).
    pub call_timeout: Duration,
    /// Reconnect backoff: first and largest pause.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// Orders delivered but not yet taken from the [`OrderStream`]; when it
    /// is full, further orders are answered as failed.
    pub order_queue: usize,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            connect_within: Duration::from_secs(5),
            call_timeout: Duration::from_secs(5),
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_secs(1),
            order_queue: 64,
        }
    }
}

/// How a call reached the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// The agent accepted it.
    Acked,
    /// The agent is away; the client re-sends the registration (or the
    /// order answer) when it is back.
    Deferred,
}

/// Orders from the agent, each delivered once.
pub struct OrderStream {
    rx: mpsc::Receiver<Order>,
}

impl OrderStream {
    /// The next order; `None` once the client has stopped.
    pub async fn next(&mut self) -> Option<Order> {
        self.rx.recv().await
    }

    /// An order if one is waiting.
    pub fn try_next(&mut self) -> Option<Order> {
        self.rx.try_recv().ok()
    }
}

/// Most order ids remembered to deliver each order once.
const SEEN_ORDERS: usize = 1024;
/// Most calls written but not yet answered.
const MAX_PENDING: usize = 256;
/// Most order answers kept while the agent is away.
const MAX_DEFERRED_DONE: usize = 256;

#[derive(Debug)]
enum CallError {
    Disconnected,
    Refused(String),
}

struct Call {
    msg: JobMessage,
    reply: oneshot::Sender<Result<(), CallError>>,
}

type Done = OrderAnswer;

struct Shared {
    path: PathBuf,
    hello: Hello,
    opts: ClientOptions,
    /// Live connections by id: re-sent after every reconnect.
    conns: Mutex<BTreeMap<u64, ConnUp>>,
    /// Order answers that have not reached the agent.
    deferred: Mutex<VecDeque<Done>>,
    /// The newest checkpoint this rank reported: re-sent after a reconnect.
    checkpointed: Mutex<Option<u64>>,
    connected: watch::Sender<bool>,
    /// The NICs the agent last said an admin holds out of service.
    held_out: watch::Sender<BTreeSet<String>>,
}

/// The job side of the contract. Cheap to clone; the background connection
/// stops when the last clone is dropped.
#[derive(Clone)]
pub struct ContractClient {
    shared: Arc<Shared>,
    calls: mpsc::Sender<Call>,
}

impl ContractClient {
    /// Connects to the agent at `path` and says hello (retrying for
    /// [`ClientOptions::connect_within`]).
    pub async fn connect(
        path: impl AsRef<Path>,
        hello: Hello,
    ) -> Result<(ContractClient, OrderStream), ContractError> {
        Self::connect_with(path, hello, ClientOptions::default()).await
    }

    /// Connects as rank `rank` of `job` running in this process (the
    /// hello's pid is this process's), with `opts`.
    pub async fn connect_rank(
        path: impl AsRef<Path>,
        job: &str,
        rank: u32,
        opts: ClientOptions,
    ) -> Result<(ContractClient, OrderStream), ContractError> {
        let hello = Hello {
            job: job.into(),
            rank,
            pid: std::process::id(),
        };
        Self::connect_with(path, hello, opts).await
    }

    /// [`Self::connect`] with explicit options.
    pub async fn connect_with(
        path: impl AsRef<Path>,
        hello: Hello,
        opts: ClientOptions,
    ) -> Result<(ContractClient, OrderStream), ContractError> {
        JobMessage::Hello(hello.clone()).validate()?;
        let (calls, calls_rx) = mpsc::channel(MAX_PENDING);
        let (orders_tx, orders_rx) = mpsc::channel(opts.order_queue.max(1));
        let (first_tx, first_rx) = oneshot::channel();
        let shared = Arc::new(Shared {
            path: path.as_ref().to_path_buf(),
            hello,
            opts,
            conns: Mutex::new(BTreeMap::new()),
            deferred: Mutex::new(VecDeque::new()),
            checkpointed: Mutex::new(None),
            connected: watch::channel(false).0,
            held_out: watch::channel(BTreeSet::new()).0,
        });
        tokio::spawn(run_client(shared.clone(), calls_rx, orders_tx, first_tx));
        match first_rx.await {
            Ok(Ok(())) => Ok((
                ContractClient { shared, calls },
                OrderStream { rx: orders_rx },
            )),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(ContractError::Closed),
        }
    }

    /// Whether the client is connected to the agent right now.
    pub fn is_connected(&self) -> bool {
        *self.shared.connected.borrow()
    }

    /// Waits (bounded) until the client is connected and has said hello.
    pub async fn wait_connected(&self, within: Duration) -> bool {
        let mut rx = self.shared.connected.subscribe();
        tokio::time::timeout(within, rx.wait_for(|c| *c))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Follows the NICs of this host an admin holds out of service for
    /// connections (the agent's `held_out`); feed it to the endpoint with
    /// [`crate::soft::Endpoint::follow_held`]. Kept across reconnects
    /// until the agent says otherwise.
    pub fn held_out(&self) -> watch::Receiver<BTreeSet<String>> {
        self.shared.held_out.subscribe()
    }

    /// The connections registered now (what a reconnect re-sends).
    pub fn registered(&self) -> Vec<ConnUp> {
        lock(&self.shared.conns).values().cloned().collect()
    }

    async fn call(&self, msg: JobMessage) -> Result<Delivery, ContractError> {
        let t = self.shared.opts.call_timeout;
        let (reply, rx) = oneshot::channel();
        tokio::time::timeout(t, self.calls.send(Call { msg, reply }))
            .await
            .map_err(|_| ContractError::Timeout(t))?
            .map_err(|_| ContractError::Closed)?;
        match tokio::time::timeout(t, rx).await {
            Err(_) => Err(ContractError::Timeout(t)),
            Ok(Err(_)) => Err(ContractError::Closed),
            Ok(Ok(Ok(()))) => Ok(Delivery::Acked),
            Ok(Ok(Err(CallError::Disconnected))) => Ok(Delivery::Deferred),
            Ok(Ok(Err(CallError::Refused(m)))) => Err(ContractError::Refused(m)),
        }
    }

    /// Registers a connection (or updates its placement). A connection the
    /// agent refuses is not kept.
    pub async fn conn_up(&self, conn: ConnUp) -> Result<Delivery, ContractError> {
        let msg = JobMessage::ConnUp(conn.clone());
        msg.validate()?;
        if conn.job != self.shared.hello.job {
            return Err(ContractError::Invalid(format!(
                "connection of job {:?} on the client of job {:?}",
                conn.job, self.shared.hello.job
            )));
        }
        let previous = {
            let mut conns = lock(&self.shared.conns);
            if !conns.contains_key(&conn.conn_id) && conns.len() >= MAX_CONNS_PER_CLIENT {
                return Err(ContractError::Invalid(format!(
                    "at most {MAX_CONNS_PER_CLIENT} connections per client"
                )));
            }
            conns.insert(conn.conn_id, conn.clone())
        };
        let r = self.call(msg).await;
        if let Err(ContractError::Refused(_)) = &r {
            let mut conns = lock(&self.shared.conns);
            match previous {
                Some(p) => conns.insert(conn.conn_id, p),
                None => conns.remove(&conn.conn_id),
            };
        }
        r
    }

    /// Reports that the transport moved a connection to `nic`.
    pub async fn conn_moved(&self, conn_id: u64, nic: &str) -> Result<Delivery, ContractError> {
        let msg = JobMessage::ConnMoved {
            conn_id,
            nic: nic.into(),
        };
        msg.validate()?;
        match lock(&self.shared.conns).get_mut(&conn_id) {
            Some(c) => c.nic = nic.into(),
            None => {
                return Err(ContractError::Invalid(format!(
                    "connection {conn_id} is not registered"
                )))
            }
        }
        self.call(msg).await
    }

    /// Reports that a connection has had no path for a while (every rail
    /// it tried failed to reach the peer). Best effort: while the agent is
    /// away it is not kept ([`Delivery::Deferred`]).
    pub async fn conn_stalled(&self, conn_id: u64) -> Result<Delivery, ContractError> {
        if !lock(&self.shared.conns).contains_key(&conn_id) {
            return Err(ContractError::Invalid(format!(
                "connection {conn_id} is not registered"
            )));
        }
        self.call(JobMessage::ConnStalled { conn_id }).await
    }

    /// Reports that a connection is gone.
    pub async fn conn_closed(&self, conn_id: u64) -> Result<Delivery, ContractError> {
        if lock(&self.shared.conns).remove(&conn_id).is_none() {
            return Err(ContractError::Invalid(format!(
                "connection {conn_id} is not registered"
            )));
        }
        self.call(JobMessage::ConnClosed { conn_id }).await
    }

    /// Answers an order (`detail` is cut to [`MAX_DETAIL_LEN`] bytes). An
    /// answer the agent cannot take now is kept and sent after reconnecting.
    pub async fn order_done(
        &self,
        order_id: u64,
        ok: bool,
        detail: &str,
    ) -> Result<Delivery, ContractError> {
        self.call(JobMessage::OrderDone(OrderAnswer {
            order_id,
            ok,
            detail: truncate(detail, MAX_DETAIL_LEN).to_owned(),
            step: None,
        }))
        .await
    }

    /// Answers a checkpoint order: this rank's checkpoint at `step` is
    /// durable (send [`checkpointed`](Self::checkpointed) for it too).
    pub async fn checkpoint_done(
        &self,
        order_id: u64,
        step: u64,
    ) -> Result<Delivery, ContractError> {
        self.call(JobMessage::OrderDone(OrderAnswer {
            order_id,
            ok: true,
            detail: format!("checkpoint at step {step}"),
            step: Some(step),
        }))
        .await
    }

    /// Reports that this rank's checkpoint at `step` is durable. The newest
    /// one is sent again after a reconnect (the supervisor only needs the
    /// newest complete checkpoint).
    pub async fn checkpointed(&self, step: u64) -> Result<Delivery, ContractError> {
        {
            let mut last = lock(&self.shared.checkpointed);
            *last = Some(last.map_or(step, |s| s.max(step)));
        }
        self.call(JobMessage::Checkpointed { step }).await
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn defer_done(shared: &Shared, d: Done) {
    let mut q = lock(&shared.deferred);
    if q.len() >= MAX_DEFERRED_DONE {
        if let Some(old) = q.pop_front() {
            tracing::warn!(
                order_id = old.order_id,
                "too many order answers waiting for the agent; dropping the oldest"
            );
        }
    }
    q.push_back(d);
}

/// Orders already delivered (bounded), so a repeated order is delivered once.
#[derive(Default)]
struct Seen {
    order: VecDeque<u64>,
    set: HashSet<u64>,
}

impl Seen {
    /// True the first time `id` is seen.
    fn first(&mut self, id: u64) -> bool {
        if !self.set.insert(id) {
            return false;
        }
        self.order.push_back(id);
        if self.order.len() > SEEN_ORDERS {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        true
    }
}

enum Pending {
    Hello,
    /// Re-sent registration: the answer only gets logged.
    Resync,
    /// A deferred order answer or an automatic refusal.
    Done(Done),
    Call {
        reply: oneshot::Sender<Result<(), CallError>>,
        done: Option<Done>,
    },
}

enum SessionEnd {
    ClientGone,
    HelloRefused(String),
    Lost(String),
}

async fn run_client(
    shared: Arc<Shared>,
    mut calls: mpsc::Receiver<Call>,
    orders: mpsc::Sender<Order>,
    first: oneshot::Sender<Result<(), ContractError>>,
) {
    let mut first = Some(first);
    let mut seen = Seen::default();
    let deadline = Instant::now() + shared.opts.connect_within;
    let mut backoff = shared.opts.backoff_min;
    let path = shared.path.display().to_string();
    loop {
        let mut last_error = match UnixStream::connect(&shared.path).await {
            Ok(s) => {
                let mut said_hello = false;
                let end = session(
                    &shared,
                    s,
                    &mut calls,
                    &orders,
                    &mut first,
                    &mut seen,
                    &mut said_hello,
                )
                .await;
                shared.connected.send_replace(false);
                if said_hello {
                    backoff = shared.opts.backoff_min;
                }
                match end {
                    SessionEnd::ClientGone => return,
                    SessionEnd::HelloRefused(m) => {
                        if let Some(f) = first.take() {
                            let _ = f.send(Err(ContractError::Refused(m)));
                            return;
                        }
                        tracing::warn!(socket = %path, error = %m, "the agent refused hello; retrying");
                        ContractError::Refused(m)
                    }
                    SessionEnd::Lost(m) => {
                        tracing::info!(socket = %path, reason = %m, "lost the agent; reconnecting");
                        ContractError::Malformed(m)
                    }
                }
            }
            Err(source) => ContractError::Io {
                path: path.clone(),
                source,
            },
        };
        if first.is_some() && Instant::now() >= deadline {
            if let Some(f) = first.take() {
                let _ = f.send(Err(std::mem::replace(
                    &mut last_error,
                    ContractError::Closed,
                )));
            }
            return;
        }
        // Wait before reconnecting; calls meanwhile are recorded (done by
        // the caller) and answered as deferred.
        let pause = tokio::time::sleep(backoff);
        tokio::pin!(pause);
        loop {
            tokio::select! {
                _ = &mut pause => break,
                c = calls.recv() => match c {
                    None => return,
                    Some(c) => answer_disconnected(&shared, c),
                },
            }
        }
        backoff = (backoff * 2).min(shared.opts.backoff_max);
    }
}

fn answer_disconnected(shared: &Shared, c: Call) {
    if let JobMessage::OrderDone(answer) = c.msg {
        defer_done(shared, answer);
    }
    let _ = c.reply.send(Err(CallError::Disconnected));
}

async fn session(
    shared: &Shared,
    stream: UnixStream,
    calls: &mut mpsc::Receiver<Call>,
    orders: &mpsc::Sender<Order>,
    first: &mut Option<oneshot::Sender<Result<(), ContractError>>>,
    seen: &mut Seen,
    said_hello: &mut bool,
) -> SessionEnd {
    let (rd, mut wr) = stream.into_split();
    let mut reader = LineReader::new(rd);
    let mut pending: VecDeque<Pending> = VecDeque::new();
    let end = 'session: {
        // Re-register: hello, every live connection, unsent order answers.
        let conns: Vec<ConnUp> = lock(&shared.conns).values().cloned().collect();
        let dones: Vec<Done> = lock(&shared.deferred).drain(..).collect();
        let mut resync = vec![(JobMessage::Hello(shared.hello.clone()), Pending::Hello)];
        resync.extend(
            conns
                .into_iter()
                .map(|c| (JobMessage::ConnUp(c), Pending::Resync)),
        );
        if let Some(step) = *lock(&shared.checkpointed) {
            resync.push((JobMessage::Checkpointed { step }, Pending::Resync));
        }
        resync.extend(
            dones
                .into_iter()
                .map(|d| (JobMessage::OrderDone(d.clone()), Pending::Done(d))),
        );
        // Register every pending entry before writing any: a write failure
        // part way hands all the deferred answers back to the queue, the
        // unwritten ones too.
        let msgs: Vec<JobMessage> = resync
            .into_iter()
            .map(|(msg, p)| {
                pending.push_back(p);
                msg
            })
            .collect();
        for msg in msgs {
            if let Err(e) = write_message(&mut wr, &msg).await {
                break 'session SessionEnd::Lost(e.to_string());
            }
        }
        loop {
            tokio::select! {
                line = reader.next_line() => {
                    let msg = match line {
                        Ok(Some(l)) => decode_agent(l),
                        Ok(None) => break 'session SessionEnd::Lost("the agent closed the connection".into()),
                        Err(e) => break 'session SessionEnd::Lost(e.to_string()),
                    };
                    let msg = match msg {
                        Ok(m) => m,
                        Err(e) => break 'session SessionEnd::Lost(format!("bad line from the agent: {e}")),
                    };
                    match msg {
                        AgentMessage::Ok | AgentMessage::Error { .. } => {
                            let refused = match msg {
                                AgentMessage::Error { message } => Some(message),
                                _ => None,
                            };
                            match pending.pop_front() {
                                None => break 'session SessionEnd::Lost("an answer nobody asked for".into()),
                                Some(Pending::Hello) => match refused {
                                    Some(m) => break 'session SessionEnd::HelloRefused(m),
                                    None => {
                                        *said_hello = true;
                                        shared.connected.send_replace(true);
                                        if let Some(f) = first.take() {
                                            let _ = f.send(Ok(()));
                                        }
                                    }
                                },
                                Some(Pending::Resync) | Some(Pending::Done(_)) => {
                                    if let Some(m) = refused {
                                        tracing::warn!(error = %m, "the agent refused a re-sent registration");
                                    }
                                }
                                Some(Pending::Call { reply, .. }) => {
                                    let _ = reply.send(match refused {
                                        Some(m) => Err(CallError::Refused(m)),
                                        None => Ok(()),
                                    });
                                }
                            }
                        }
                        AgentMessage::HeldOut { nics } => {
                            let nics: BTreeSet<String> = nics.into_iter().collect();
                            shared.held_out.send_if_modified(|h| {
                                let changed = *h != nics;
                                if changed {
                                    tracing::info!(held_out = ?nics, "the agent's NICs held out of service changed");
                                    *h = nics;
                                }
                                changed
                            });
                        }
                        AgentMessage::Order(o) => {
                            if !seen.first(o.order_id) {
                                tracing::debug!(order_id = o.order_id, "order repeated by the agent; already delivered");
                                continue;
                            }
                            let id = o.order_id;
                            let refusal = match orders.try_send(o) {
                                Ok(()) => None,
                                Err(mpsc::error::TrySendError::Full(_)) => Some("the job's order queue is full"),
                                Err(mpsc::error::TrySendError::Closed(_)) => Some("the job takes no orders"),
                            };
                            if let Some(why) = refusal {
                                let d = Done { order_id: id, ok: false, detail: why.into(), step: None };
                                let msg = JobMessage::OrderDone(d.clone());
                                pending.push_back(Pending::Done(d));
                                if let Err(e) = write_message(&mut wr, &msg).await {
                                    break 'session SessionEnd::Lost(e.to_string());
                                }
                            }
                        }
                    }
                }
                c = calls.recv(), if pending.len() < MAX_PENDING => {
                    let Some(c) = c else { break 'session SessionEnd::ClientGone };
                    let done = match &c.msg {
                        JobMessage::OrderDone(answer) => Some(answer.clone()),
                        _ => None,
                    };
                    let line = encode(&c.msg);
                    pending.push_back(Pending::Call { reply: c.reply, done });
                    let written = match line {
                        Ok(l) => wr.write_all(&l).await.map_err(|e| e.to_string()),
                        Err(e) => Err(e.to_string()),
                    };
                    if let Err(e) = written {
                        break 'session SessionEnd::Lost(e);
                    }
                }
            }
        }
    };
    // Whatever was not answered: callers hear "deferred"; order answers wait
    // for the next connection.
    for p in pending {
        match p {
            Pending::Done(d) => defer_done(shared, d),
            Pending::Call { reply, done } => {
                if let Some(d) = done {
                    defer_done(shared, d);
                }
                let _ = reply.send(Err(CallError::Disconnected));
            }
            Pending::Hello | Pending::Resync => {}
        }
    }
    end
}

#[cfg(test)]
mod tests {
    use tokio::net::UnixListener;

    use crate::contract::client::*;
    use crate::contract::messages::OrderKind;
    use crate::contract::wire::decode_job;
    use crate::contract::wire::tests::conn;

    /// A scripted agent: answers every line `ok` (or `error` for conn ids
    /// in `refuse`), records what it got, and pushes what it is told to.
    async fn fake_agent(
        listener: UnixListener,
        got: mpsc::UnboundedSender<JobMessage>,
        mut push: mpsc::UnboundedReceiver<AgentMessage>,
        refuse: u64,
    ) {
        let Ok((s, _)) = listener.accept().await else {
            return;
        };
        let (rd, mut wr) = s.into_split();
        let mut r = LineReader::new(rd);
        loop {
            tokio::select! {
                l = r.next_line() => {
                    let Ok(Some(l)) = l else { return };
                    let m = decode_job(l).unwrap();
                    let reply = match &m {
                        JobMessage::ConnUp(c) if c.conn_id == refuse => AgentMessage::Error { message: "no such NIC".into() },
                        _ => AgentMessage::Ok,
                    };
                    let _ = got.send(m);
                    if write_message(&mut wr, &reply).await.is_err() { return; }
                }
                Some(p) = push.recv() => {
                    if write_message(&mut wr, &p).await.is_err() { return; }
                }
            }
        }
    }

    /// A fake agent on `sock`: its task, the sender it records with (for
    /// a later agent), what it got, and where to push to it.
    #[allow(clippy::type_complexity)]
    fn spawn_fake_agent(
        sock: &Path,
    ) -> (
        tokio::task::JoinHandle<()>,
        mpsc::UnboundedSender<JobMessage>,
        mpsc::UnboundedReceiver<JobMessage>,
        mpsc::UnboundedSender<AgentMessage>,
    ) {
        let (got_tx, got) = mpsc::unbounded_channel();
        let (push_tx, push_rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(fake_agent(
            UnixListener::bind(sock).unwrap(),
            got_tx.clone(),
            push_rx,
            99,
        ));
        (task, got_tx, got, push_tx)
    }

    #[tokio::test]
    async fn client_survives_an_agent_restart_and_delivers_orders_once() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("agent.sock");
        let (agent1, got_tx, mut got, push_tx) = spawn_fake_agent(&sock);
        let hello = Hello {
            job: "j".into(),
            rank: 0,
            pid: std::process::id(),
        };
        let opts = ClientOptions {
            backoff_max: Duration::from_millis(100),
            ..Default::default()
        };
        let (c, mut orders) = ContractClient::connect_with(&sock, hello.clone(), opts)
            .await
            .unwrap();
        assert_eq!(got.recv().await, Some(JobMessage::Hello(hello.clone())));
        assert_eq!(c.conn_up(conn(1, "rail0")).await.unwrap(), Delivery::Acked);
        assert_eq!(c.conn_up(conn(2, "rail0")).await.unwrap(), Delivery::Acked);
        let e = c.conn_up(conn(99, "rail7")).await.unwrap_err();
        assert!(matches!(e, ContractError::Refused(_)), "{e}");
        assert_eq!(c.registered().len(), 2, "a refused connection is not kept");
        assert_eq!(c.conn_moved(2, "rail1").await.unwrap(), Delivery::Acked);
        for _ in 0..4 {
            got.recv().await.unwrap();
        }
        // The same order twice reaches the job once.
        let order = AgentMessage::Order(Order {
            order_id: 5,
            kind: OrderKind::Migrate {
                conn_ids: vec![1],
                to_nic: Some("rail1".into()),
            },
        });
        push_tx.send(order.clone()).unwrap();
        push_tx.send(order).unwrap();
        let o = orders.next().await.unwrap();
        assert_eq!(o.order_id, 5);

        // The agent goes away: calls are recorded and deferred.
        agent1.abort();
        let _ = agent1.await;
        std::fs::remove_file(&sock).unwrap();
        let mut deferred = false;
        for _ in 0..50 {
            if c.conn_moved(1, "rail1").await.unwrap() == Delivery::Deferred {
                deferred = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(deferred, "calls without an agent are deferred, not failed");
        assert_eq!(
            c.order_done(5, true, "moved").await.unwrap(),
            Delivery::Deferred
        );
        // A new agent: hello, both connections (as moved), the answer.
        let (push_tx2, push_rx2) = mpsc::unbounded_channel();
        let _agent2 = tokio::spawn(fake_agent(
            UnixListener::bind(&sock).unwrap(),
            got_tx,
            push_rx2,
            99,
        ));
        let mut resent = Vec::new();
        while resent.len() < 4 {
            let m = tokio::time::timeout(Duration::from_secs(5), got.recv())
                .await
                .expect("resync within 5 s")
                .unwrap();
            // Messages of the first agent still queued are skipped.
            if resent.is_empty() && !matches!(m, JobMessage::Hello(_)) {
                continue;
            }
            resent.push(m);
        }
        assert_eq!(resent[0], JobMessage::Hello(hello));
        assert_eq!(resent[1], JobMessage::ConnUp(conn(1, "rail1")));
        assert_eq!(resent[2], JobMessage::ConnUp(conn(2, "rail1")));
        assert_eq!(
            resent[3],
            JobMessage::OrderDone(OrderAnswer {
                order_id: 5,
                ok: true,
                detail: "moved".into(),
                step: None,
            })
        );
        assert!(c.wait_connected(Duration::from_secs(5)).await);
        // The new agent repeats the open order: not delivered again.
        push_tx2
            .send(AgentMessage::Order(Order {
                order_id: 5,
                kind: OrderKind::Stop,
            }))
            .unwrap();
        push_tx2
            .send(AgentMessage::Order(Order {
                order_id: 6,
                kind: OrderKind::Checkpoint {
                    step: None,
                    halt: true,
                },
            }))
            .unwrap();
        assert_eq!(orders.next().await.unwrap().order_id, 6);
        assert!(orders.try_next().is_none());
    }

    #[tokio::test]
    async fn held_out_nics_follow_the_agent_and_a_bad_set_ends_the_session() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("agent.sock");
        let (_agent, _, mut got, push_tx) = spawn_fake_agent(&sock);
        let hello = Hello {
            job: "j".into(),
            rank: 0,
            pid: std::process::id(),
        };
        let (c, _orders) = ContractClient::connect_with(&sock, hello, ClientOptions::default())
            .await
            .unwrap();
        got.recv().await.unwrap();
        let mut held = c.held_out();
        assert!(held.borrow_and_update().is_empty());
        let set = |n: &[&str]| AgentMessage::HeldOut {
            nics: n.iter().map(|s| s.to_string()).collect(),
        };
        push_tx.send(set(&["rail0"])).unwrap();
        tokio::time::timeout(Duration::from_secs(5), held.changed())
            .await
            .expect("the set arrives")
            .unwrap();
        assert_eq!(
            *held.borrow_and_update(),
            BTreeSet::from(["rail0".to_string()])
        );
        // The same set again is not a change; a new one is.
        push_tx.send(set(&["rail0"])).unwrap();
        push_tx.send(set(&[])).unwrap();
        tokio::time::timeout(Duration::from_secs(5), held.changed())
            .await
            .expect("the empty set arrives")
            .unwrap();
        assert!(held.borrow_and_update().is_empty());
        // A NIC name with whitespace is a malformed line: the client drops
        // the session (and keeps the last good set).
        push_tx.send(set(&["rail 0"])).unwrap();
        tokio::time::timeout(Duration::from_secs(5), async {
            while c.is_connected() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the session ends on a bad held_out");
        assert!(held.borrow().is_empty());
    }

    #[tokio::test]
    async fn connect_fails_clearly_without_an_agent() {
        let dir = tempfile::tempdir().unwrap();
        let opts = ClientOptions {
            connect_within: Duration::from_millis(200),
            ..Default::default()
        };
        let hello = Hello {
            job: "j".into(),
            rank: 0,
            pid: 1,
        };
        let e = ContractClient::connect_with(dir.path().join("none.sock"), hello, opts)
            .await
            .err()
            .expect("no agent");
        assert!(e.to_string().contains("none.sock"), "{e}");
    }
}
