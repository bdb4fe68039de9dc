//! Self-checking traffic over resilient connections between two testbed
//! hosts: message generation and verification (index + CRC32 + seeded
//! payload), one endpoint thread per host inside its namespace, optional
//! job-contract side with the host's agent, counters, and waiting for the
//! traffic to drain.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::{BufMut, Bytes, BytesMut};
use rand::{Rng, RngCore, SeedableRng};
use rdma::resilient::{ConnConfig, ConnStats, Failback, Rail, ResilientConnection, Side};
use rdma::soft::{Endpoint, LocalNic};

use testbed::{rail_addr, Netns};

/// Port every endpoint listens on (the same on each NIC).
pub const PORT: u16 = 7700;
/// Most path changes recorded per connection direction.
const MAX_SWITCHES: usize = 100_000;

/// Message sizes to draw from.
#[derive(Debug, Clone, Copy)]
pub enum Sizes {
    /// Bytes to `max` bytes, log-uniform (most small, some MBs).
    Mixed {
        max: usize,
    },
    Fixed(usize),
}

impl Sizes {
    fn draw(&self, rng: &mut impl Rng) -> usize {
        match *self {
            Sizes::Fixed(n) => n,
            Sizes::Mixed { max } => {
                let bits = rng.gen_range(0.0..(max as f64).log2());
                (2f64.powf(bits) as usize).clamp(1, max)
            }
        }
    }
}

/// What one direction of one connection saw.
#[derive(Debug)]
pub struct DirCounters {
    pub sent: AtomicU64,
    pub sent_bytes: AtomicU64,
    pub received: AtomicU64,
    pub received_bytes: AtomicU64,
    pub duplicated: AtomicU64,
    pub reordered: AtomicU64,
    pub skipped: AtomicU64,
    pub bad_checksum: AtomicU64,
    /// Set by the scenario once the peer stopped sending: how many messages
    /// this direction must deliver in total (`u64::MAX` until then).
    pub expected_total: AtomicU64,
    /// The sender of this direction returned.
    pub finished: AtomicBool,
    /// (when, epoch) each time deliveries arrive over a new path.
    pub switches: Mutex<Vec<(Instant, u32)>>,
    /// Delivered bytes per 10 ms since the start (bounded).
    pub timeline: Mutex<Vec<u64>>,
}

impl Default for DirCounters {
    fn default() -> Self {
        Self {
            sent: AtomicU64::new(0),
            sent_bytes: AtomicU64::new(0),
            received: AtomicU64::new(0),
            received_bytes: AtomicU64::new(0),
            duplicated: AtomicU64::new(0),
            reordered: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            bad_checksum: AtomicU64::new(0),
            expected_total: AtomicU64::new(u64::MAX),
            finished: AtomicBool::new(false),
            switches: Mutex::new(Vec::new()),
            timeline: Mutex::new(Vec::new()),
        }
    }
}

/// One host's side of the traffic.
pub struct HostTraffic {
    pub host: usize,
    /// Per connection: what this host received.
    pub rx: Vec<Arc<DirCounters>>,
    /// Per connection: what this host sent.
    pub tx: Vec<Arc<DirCounters>>,
    pub stats: Arc<Mutex<Vec<ConnStats>>>,
    pub errors: Arc<Mutex<Vec<String>>>,
    pub contract: Arc<ContractCounters>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub started: Instant,
}

/// How to run the traffic.
#[derive(Debug, Clone)]
pub struct TrafficSpec {
    pub conns: usize,
    pub sizes: Sizes,
    /// Bytes per second each sender aims for (`None`: as fast as it can).
    pub rate_per_conn: Option<u64>,
    /// Whether both ends send (else only host A sends).
    pub both_ways: bool,
    pub failback: bool,
    pub window_bytes: usize,
    pub stall_timeout: Duration,
    pub seed: u64,
    /// Speak the job contract with the host's agent: register every
    /// connection, report its moves, carry out the agent's orders.
    pub agent: Option<AgentLink>,
}

/// Where the host's agent listens and which job the traffic is.
#[derive(Debug, Clone)]
pub struct AgentLink {
    pub socket: std::path::PathBuf,
    pub job: String,
}

/// What the job side of the contract saw (one host).
#[derive(Debug, Default)]
pub struct ContractCounters {
    /// Migrate orders received from the agent (reflex or supervisor).
    pub migrate_orders: AtomicU64,
    /// Pace orders received.
    pub pace_orders: AtomicU64,
    /// `conn_moved` reports sent.
    pub moves_reported: AtomicU64,
}

fn message_rng(conn: usize, dir: u8, idx: u64, seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(
        seed ^ ((conn as u64) << 40)
            ^ ((dir as u64) << 56)
            ^ idx.wrapping_mul(0x9e37_79b9_7f4a_7c15),
    )
}

/// Message `idx` of direction `dir` of connection `conn`: index, CRC32 of
/// the payload, payload (size and bytes from the seed).
pub fn message(conn: usize, dir: u8, idx: u64, sizes: Sizes, seed: u64) -> Bytes {
    let mut rng = message_rng(conn, dir, idx, seed);
    let len = sizes.draw(&mut rng);
    let mut b = BytesMut::with_capacity(12 + len);
    b.put_u64_le(idx);
    b.put_u32_le(0);
    b.resize(12 + len, 0);
    rng.fill_bytes(&mut b[12..]);
    let crc = crc32fast::hash(&b[12..]);
    b[8..12].copy_from_slice(&crc.to_le_bytes());
    b.freeze()
}

/// The local NICs of testbed host `h` (`rail0`, `rail1`).
pub fn host_nics(h: usize) -> Vec<LocalNic> {
    (0..2)
        .map(|r| LocalNic {
            name: format!("rail{r}"),
            addr: rail_addr(h, r).into(),
        })
        .collect()
}

impl HostTraffic {
    /// Starts both sides of `spec`'s traffic between hosts 0 (side A) and
    /// 1 (side B) of `tb`.
    pub fn start_pair(
        tb: &testbed::Testbed,
        spec: TrafficSpec,
    ) -> anyhow::Result<(HostTraffic, HostTraffic)> {
        use testbed::Node;
        let a = HostTraffic::start(tb.ns(Node::Host(0)), 0, 1, spec.clone())?;
        let b = HostTraffic::start(tb.ns(Node::Host(1)), 1, 0, spec)?;
        Ok((a, b))
    }

    /// Starts host `host` (0 = side A, 1 = side B) of the traffic with `peer`.
    pub fn start(ns: &Netns, host: usize, peer: usize, spec: TrafficSpec) -> anyhow::Result<Self> {
        let fd = ns.fd();
        let dup = nix_dup(fd)?;
        let rx: Vec<_> = (0..spec.conns).map(|_| Arc::default()).collect();
        let tx: Vec<_> = (0..spec.conns).map(|_| Arc::default()).collect();
        let stats = Arc::new(Mutex::new(vec![ConnStats::default(); spec.conns]));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let contract = Arc::new(ContractCounters::default());
        let started = Instant::now();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
        let thread = {
            let (rx, tx, stats, errors, stop, contract) = (
                rx.clone(),
                tx.clone(),
                stats.clone(),
                errors.clone(),
                stop.clone(),
                contract.clone(),
            );
            std::thread::Builder::new()
                .name(format!("traffic-h{host}"))
                .spawn(move || {
                    // SAFETY: setns on this thread only, with an fd we own.
                    if unsafe { libc::setns(dup.0, libc::CLONE_NEWNET) } != 0 {
                        let _ = ready_tx
                            .send(Err(format!("setns: {}", std::io::Error::last_os_error())));
                        return;
                    }
                    drop(dup);
                    let rt = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e.to_string()));
                            return;
                        }
                    };
                    rt.block_on(host_main(
                        host, peer, spec, rx, tx, stats, errors, stop, started, ready_tx, contract,
                    ));
                })
                .context("spawn traffic thread")?
        };
        match ready_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => anyhow::bail!("host {host} traffic: {e}"),
            Err(_) => anyhow::bail!("host {host} traffic did not start"),
        }
        Ok(Self {
            host,
            rx,
            tx,
            stats,
            errors,
            contract,
            stop,
            thread: Some(thread),
            started,
        })
    }

    /// Stops sending (receivers keep running until [`Self::join`]).
    pub fn stop_sending(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Ends the host's runtime.
    pub fn join(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    pub fn conn_stats(&self) -> Vec<ConnStats> {
        self.stats.lock().expect("stats").clone()
    }
}

impl Drop for HostTraffic {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

struct Fd(i32);
impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: we own this descriptor.
        unsafe { libc::close(self.0) };
    }
}
fn nix_dup(fd: i32) -> anyhow::Result<Fd> {
    // SAFETY: dup of a valid descriptor; the result is owned by `Fd`.
    let d = unsafe { libc::dup(fd) };
    anyhow::ensure!(d >= 0, "dup: {}", std::io::Error::last_os_error());
    Ok(Fd(d))
}

/// Side A is host 0 of the pair; the connection ids are shared.
#[allow(clippy::too_many_arguments)]
async fn host_main(
    host: usize,
    peer: usize,
    spec: TrafficSpec,
    rx: Vec<Arc<DirCounters>>,
    tx: Vec<Arc<DirCounters>>,
    stats: Arc<Mutex<Vec<ConnStats>>>,
    errors: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    started: Instant,
    ready: std::sync::mpsc::Sender<Result<(), String>>,
    contract: Arc<ContractCounters>,
) {
    let nics = host_nics(host);
    let endpoint = match Endpoint::bind(nics.clone(), PORT).await {
        Ok(e) => Arc::new(e),
        Err(e) => {
            let _ = ready.send(Err(e.to_string()));
            return;
        }
    };
    // The reflex: netlink link events of this namespace feed the endpoint.
    let names: Vec<String> = nics.iter().map(|n| n.name.clone()).collect();
    let backend = rdma::netdev::NetdevBackend::new(names);
    if let Err(e) = endpoint.follow_links(&backend) {
        let _ = ready.send(Err(format!("link watch: {e}")));
        return;
    }
    let side = if host < peer { Side::A } else { Side::B };
    let mut conns = Vec::new();
    for c in 0..spec.conns {
        let rails = (0..2)
            .map(|r| Rail {
                nic: r,
                remote: std::net::SocketAddr::new(rail_addr(peer, r).into(), PORT),
            })
            .collect();
        let mut cfg = ConnConfig::new(1000 + c as u64, side, rails);
        cfg.window_bytes = spec.window_bytes;
        cfg.max_message = spec.window_bytes.min(64 << 20);
        cfg.stall_timeout = spec.stall_timeout;
        if !spec.failback {
            cfg.failback = Failback::Never;
        }
        match ResilientConnection::open(endpoint.clone(), cfg) {
            Ok(conn) => conns.push(conn),
            Err(e) => {
                let _ = ready.send(Err(e.to_string()));
                return;
            }
        }
    }
    let mut tasks = tokio::task::JoinSet::new();
    if let Some(link) = &spec.agent {
        let ids: Vec<u64> = (0..spec.conns).map(|c| 1000 + c as u64).collect();
        let controls: Vec<_> = conns.iter().map(|c| c.control()).collect();
        let job = JobSide {
            host,
            peer,
            names: nics.iter().map(|n| n.name.clone()).collect(),
            counters: contract,
            errors: errors.clone(),
        };
        match job.register(link, &ids, &controls).await {
            Ok((client, orders)) => {
                endpoint.follow_held(client.held_out());
                let stop = stop.clone();
                tasks.spawn(job.run(client, orders, ids, controls, stop));
            }
            Err(e) => {
                let _ = ready.send(Err(format!("job contract: {e}")));
                return;
            }
        }
    }
    let _ = ready.send(Ok(()));
    let dir = if side == Side::A { 0u8 } else { 1u8 };
    for (c, conn) in conns.into_iter().enumerate() {
        let sends = spec.both_ways || side == Side::A;
        if !sends {
            mark_finished(&tx[c]);
        }
        if sends {
            let (conn, tx, stop, errors, spec) = (
                conn.sender(),
                tx[c].clone(),
                stop.clone(),
                errors.clone(),
                spec.clone(),
            );
            tasks.spawn(async move {
                sender(c, dir, conn, tx, stop, errors, spec).await;
            });
        }
        let receives = spec.both_ways || side == Side::B;
        let (rxc, errors, stats) = (rx[c].clone(), errors.clone(), stats.clone());
        let seed = spec.seed;
        let sizes = spec.sizes;
        let stop2 = stop.clone();
        tasks.spawn(async move {
            receiver(
                c,
                1 - dir,
                conn,
                rxc,
                errors,
                stats,
                seed,
                sizes,
                started,
                stop2,
                receives,
            )
            .await;
        });
    }
    // Run until stopped and every task is done (receivers end when told to
    // stop after draining; see `receiver`).
    while tasks.join_next().await.is_some() {}
}

/// The job side of the contract for one host's connections.
struct JobSide {
    host: usize,
    peer: usize,
    /// NIC names by index (the endpoint's order).
    names: Vec<String>,
    counters: Arc<ContractCounters>,
    errors: Arc<Mutex<Vec<String>>>,
}

impl JobSide {
    /// Says hello and registers every connection on its current NIC.
    async fn register(
        &self,
        link: &AgentLink,
        ids: &[u64],
        controls: &[rdma::resilient::ConnControl],
    ) -> anyhow::Result<(rdma::contract::ContractClient, rdma::contract::OrderStream)> {
        use rdma::contract::{ClientOptions, ConnUp, ContractClient};
        let (client, orders) = ContractClient::connect_rank(
            &link.socket,
            &link.job,
            self.host as u32,
            ClientOptions::default(),
        )
        .await?;
        for (id, ctl) in ids.iter().zip(controls) {
            let rail = ctl.watch_stats().borrow().rail.unwrap_or(0);
            client
                .conn_up(ConnUp {
                    job: link.job.clone(),
                    rank: self.host as u32,
                    conn_id: *id,
                    nic: self.names[rail].clone(),
                    peer_host: format!("h{}", self.peer),
                    peer_rank: self.peer as u32,
                    rail: 0,
                })
                .await?;
        }
        Ok((client, orders))
    }

    /// Reports every move of a connection and carries out the agent's
    /// orders until `stop`. A call the agent could not take now is kept by
    /// the client and re-sent after it returns (an agent restart).
    async fn run(
        self,
        client: rdma::contract::ContractClient,
        mut orders: rdma::contract::OrderStream,
        ids: Vec<u64>,
        controls: Vec<rdma::resilient::ConnControl>,
        stop: Arc<AtomicBool>,
    ) {
        use rdma::contract::OrderKind;
        let mut watches: Vec<_> = controls.iter().map(|c| c.watch_stats()).collect();
        let mut reported: Vec<Option<usize>> = watches.iter().map(|w| w.borrow().rail).collect();
        let mut tick = tokio::time::interval(Duration::from_millis(5));
        while !stop.load(Ordering::Relaxed) {
            tokio::select! {
                o = orders.next() => {
                    let Some(o) = o else { return };
                    let (ok, detail) = match &o.kind {
                        OrderKind::Migrate { conn_ids, to_nic } => {
                            self.counters.migrate_orders.fetch_add(1, Ordering::Relaxed);
                            let to = to_nic.as_deref().and_then(|n| self.names.iter().position(|x| x == n));
                            let mut failed = Vec::new();
                            for id in conn_ids {
                                match ids.iter().position(|x| x == id) {
                                    Some(i) => {
                                        if let Err(e) = controls[i].migrate(to).await {
                                            failed.push(format!("{id}: {e}"));
                                        }
                                    }
                                    None => failed.push(format!("{id}: unknown connection")),
                                }
                            }
                            (failed.is_empty(), if failed.is_empty() { "moving".to_string() } else { failed.join("; ") })
                        }
                        OrderKind::Pace { conn_id, bytes_per_s } => {
                            self.counters.pace_orders.fetch_add(1, Ordering::Relaxed);
                            match ids.iter().position(|x| x == conn_id) {
                                Some(i) => match controls[i].set_rate(*bytes_per_s).await {
                                    Ok(()) => (true, "paced".to_string()),
                                    Err(e) => (false, e.to_string()),
                                },
                                None => (false, format!("{conn_id}: unknown connection")),
                            }
                        }
                        other => (false, format!("traffic does not do {other:?}")),
                    };
                    if let Err(e) = client.order_done(o.order_id, ok, &detail).await {
                        self.error(format!("order_done {}: {e}", o.order_id));
                    }
                }
                _ = tick.tick() => {
                    for (i, w) in watches.iter_mut().enumerate() {
                        let rail = w.borrow_and_update().rail;
                        if let Some(r) = rail.filter(|r| Some(*r) != reported[i]) {
                            match client.conn_moved(ids[i], &self.names[r]).await {
                                Ok(_) => {
                                    reported[i] = Some(r);
                                    self.counters.moves_reported.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(e) => self.error(format!("conn_moved {}: {e}", ids[i])),
                            }
                        }
                    }
                }
            }
        }
    }

    fn error(&self, e: String) {
        let mut errs = self.errors.lock().expect("errors");
        if errs.len() < 100 {
            errs.push(e);
        }
    }
}

async fn sender(
    c: usize,
    dir: u8,
    conn: rdma::resilient::ConnSender,
    tx: Arc<DirCounters>,
    stop: Arc<AtomicBool>,
    errors: Arc<Mutex<Vec<String>>>,
    spec: TrafficSpec,
) {
    let start = Instant::now();
    let mut idx = 0u64;
    let mut bytes = 0u64;
    while !stop.load(Ordering::Relaxed) {
        idx += 1;
        let m = message(c, dir, idx, spec.sizes, spec.seed);
        let len = m.len() as u64;
        if let Err(e) = conn.send(m).await {
            errors
                .lock()
                .expect("errors")
                .push(format!("conn {c} send {idx}: {e}"));
            mark_finished(&tx);
            return;
        }
        tx.sent.store(idx, Ordering::SeqCst);
        bytes += len;
        tx.sent_bytes.store(bytes, Ordering::Relaxed);
        if let Some(rate) = spec.rate_per_conn {
            let due = start + Duration::from_secs_f64(bytes as f64 / rate as f64);
            tokio::time::sleep_until(due.into()).await;
        }
    }
    mark_finished(&tx);
}

#[allow(clippy::too_many_arguments)]
async fn receiver(
    c: usize,
    dir: u8,
    mut conn: ResilientConnection,
    rx: Arc<DirCounters>,
    errors: Arc<Mutex<Vec<String>>>,
    stats: Arc<Mutex<Vec<ConnStats>>>,
    seed: u64,
    sizes: Sizes,
    started: Instant,
    stop: Arc<AtomicBool>,
    expect_data: bool,
) {
    let mut expected = 1u64;
    let mut last_epoch = None;
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    loop {
        let d = tokio::select! {
            d = conn.recv_delivery() => d,
            _ = tick.tick() => {
                stats.lock().expect("stats")[c] = conn.stats();
                // After stop, run until everything the peer sent arrived
                // (the scenario sets the total), then end.
                if stop.load(Ordering::Relaxed)
                    && (!expect_data
                        || rx.received.load(Ordering::SeqCst)
                            >= rx.expected_total.load(Ordering::SeqCst))
                {
                    // Let the peer's acks for our own sends drain too.
                    let _ = conn.flush(Duration::from_secs(5)).await;
                    stats.lock().expect("stats")[c] = conn.stats();
                    return;
                }
                continue;
            }
        };
        let d = match d {
            Ok(d) => d,
            Err(e) => {
                errors
                    .lock()
                    .expect("errors")
                    .push(format!("conn {c} receive: {e}"));
                return;
            }
        };
        if last_epoch != Some(d.epoch) {
            last_epoch = Some(d.epoch);
            let mut s = rx.switches.lock().expect("switches");
            if s.len() < MAX_SWITCHES {
                s.push((Instant::now(), d.epoch));
            }
        }
        let m = d.payload;
        if m.len() < 12 {
            rx.bad_checksum.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let idx = u64::from_le_bytes(m[..8].try_into().expect("8 bytes"));
        let crc = u32::from_le_bytes(m[8..12].try_into().expect("4 bytes"));
        let want_len = 12 + sizes.draw(&mut message_rng(c, dir, idx, seed));
        if crc32fast::hash(&m[12..]) != crc || want_len != m.len() {
            rx.bad_checksum.fetch_add(1, Ordering::Relaxed);
        }
        match idx.cmp(&expected) {
            std::cmp::Ordering::Equal => expected += 1,
            std::cmp::Ordering::Less => {
                rx.duplicated.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            std::cmp::Ordering::Greater => {
                rx.reordered.fetch_add(1, Ordering::Relaxed);
                rx.skipped.fetch_add(idx - expected, Ordering::Relaxed);
                expected = idx + 1;
            }
        }
        rx.received.fetch_add(1, Ordering::Relaxed);
        rx.received_bytes
            .fetch_add(m.len() as u64, Ordering::Relaxed);
        let bucket = (started.elapsed().as_millis() / 10) as usize;
        let mut t = rx.timeline.lock().expect("timeline");
        if bucket < 360_000 {
            if t.len() <= bucket {
                t.resize(bucket + 1, 0);
            }
            t[bucket] += m.len() as u64;
        }
    }
}

/// Marks the end of a sender for [`wait_senders`].
fn mark_finished(tx: &DirCounters) {
    tx.finished.store(true, Ordering::SeqCst);
}

/// Waits (bounded) until every sender of `hosts` returned.
async fn wait_senders(hosts: &[&HostTraffic], limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        let done = hosts
            .iter()
            .all(|h| h.tx.iter().all(|t| t.finished.load(Ordering::SeqCst)));
        if done || Instant::now() > deadline {
            return done;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Stops the senders, tells each receiver how many messages to expect and
/// waits (bounded) until they all arrived. Returns whether they did.
pub async fn drain(a: &HostTraffic, b: &HostTraffic, limit: Duration) -> bool {
    a.stop_sending();
    b.stop_sending();
    let senders_done = wait_senders(&[a, b], limit).await;
    for (from, to) in [(a, b), (b, a)] {
        for (t, r) in from.tx.iter().zip(&to.rx) {
            r.expected_total
                .store(t.sent.load(Ordering::SeqCst), Ordering::SeqCst);
        }
    }
    let deadline = Instant::now() + limit;
    loop {
        let all = [(a, b), (b, a)].iter().all(|(from, to)| {
            from.tx
                .iter()
                .zip(&to.rx)
                .all(|(t, r)| r.received.load(Ordering::SeqCst) >= t.sent.load(Ordering::SeqCst))
        });
        if all {
            return senders_done;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (bounded) until every connection of both hosts has a path.
pub async fn wait_established(a: &HostTraffic, b: &HostTraffic, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        let up = |h: &HostTraffic| h.conn_stats().iter().all(|s| s.rail.is_some());
        if up(a) && up(b) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Totals of both directions of every connection.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Totals {
    pub messages_sent: u64,
    pub messages: u64,
    pub bytes: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub bad_checksum: u64,
    pub migrations: u64,
    pub replayed: u64,
}

pub fn totals(a: &HostTraffic, b: &HostTraffic) -> Totals {
    let mut t = Totals::default();
    for (from, to) in [(a, b), (b, a)] {
        for (tx, rx) in from.tx.iter().zip(&to.rx) {
            let sent = tx.sent.load(Ordering::SeqCst);
            let got = rx.received.load(Ordering::SeqCst);
            t.messages_sent += sent;
            t.messages += got;
            t.bytes += rx.received_bytes.load(Ordering::SeqCst);
            t.lost += sent.saturating_sub(got) + rx.skipped.load(Ordering::SeqCst);
            t.duplicated += rx.duplicated.load(Ordering::SeqCst);
            t.reordered += rx.reordered.load(Ordering::SeqCst);
            t.bad_checksum += rx.bad_checksum.load(Ordering::SeqCst);
        }
    }
    for h in [a, b] {
        for s in h.conn_stats() {
            t.migrations += s.migrations;
            t.replayed += s.replayed;
        }
    }
    // Each migration is counted by both ends.
    t.migrations /= 2;
    t
}

/// Runs `f` on a new thread inside `ns` with its own runtime.
pub fn spawn_in<T: Send + 'static, F>(
    ns: &Netns,
    f: impl FnOnce() -> F + Send + 'static,
) -> anyhow::Result<std::thread::JoinHandle<anyhow::Result<T>>>
where
    F: std::future::Future<Output = anyhow::Result<T>>,
{
    let dup = nix_dup(ns.fd())?;
    Ok(std::thread::spawn(move || -> anyhow::Result<T> {
        // SAFETY: setns on this thread only, with an fd we own.
        anyhow::ensure!(
            unsafe { libc::setns(dup.0, libc::CLONE_NEWNET) } == 0,
            "setns: {}",
            std::io::Error::last_os_error()
        );
        drop(dup);
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(f())
    }))
}

pub fn join<T>(h: std::thread::JoinHandle<anyhow::Result<T>>) -> anyhow::Result<T> {
    h.join()
        .map_err(|_| anyhow::anyhow!("traffic thread panicked"))?
}
