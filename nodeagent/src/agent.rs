//! The agent runtime: link tracker → outbox → report stream to the leader,
//! plus registration and heartbeats.
//!
//! **Reporting.** Every transition is written to the outbox (flushed) before
//! it is sent. The reporter registers (learning the last sequence the
//! cluster applied), resends everything after it on a fresh `Report`
//! stream, then streams new reports as they arrive; acks (sent by the
//! supervisor only after commit) trim the outbox. Any error closes the
//! stream and the reporter reconnects with capped exponential backoff,
//! preferring the leader the supervisors point to (`rg-leader`).

use std::sync::Arc;
use std::time::Duration;

use proto::v1::agent_client::AgentClient;
use proto::v1::{agent_event, AgentEvent, HeartbeatRequest, Nic, NicStateChange, RegisterHost};
use tokio::sync::{mpsc, Mutex, Notify};
use tonic::transport::{Channel, Endpoint};

use crate::damper::DampingConfig;
use crate::link::{LinkTracker, LinkTransition, NicHealth};
use crate::outbox::{NicReport, Outbox, OutboxError};

/// Heartbeat period (DESIGN.md default).
pub const HEARTBEAT: Duration = Duration::from_millis(250);
/// Outbox capacity (reports awaiting acknowledgement).
pub const OUTBOX_CAPACITY: usize = 4096;

/// A data NIC the agent watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicConfig {
    pub name: String,
    pub rail: Option<u32>,
    pub backup: Option<String>,
    pub rdma_device: Option<String>,
}

/// Everything the agent needs to run.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub host: String,
    pub supervisors: Vec<String>,
    pub nics: Vec<NicConfig>,
    pub data_dir: std::path::PathBuf,
    pub damping: DampingConfig,
}

/// Why the agent stopped.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    #[error(transparent)]
    Tracker(#[from] crate::link::TrackerError),
    #[error("bad supervisor address {0:?}")]
    BadAddress(String),
}

fn health_to_wire(h: NicHealth) -> i32 {
    use proto::v1::NicState as P;
    (match h {
        NicHealth::Up => P::Up,
        NicHealth::Down => P::Down,
        NicHealth::Flapping => P::Flapping,
        NicHealth::Recovering => P::Recovering,
    }) as i32
}

fn client(addr: &str) -> Result<AgentClient<Channel>, AgentError> {
    let ep = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|_| AgentError::BadAddress(addr.into()))?
        .connect_timeout(Duration::from_millis(500))
        .tcp_nodelay(true);
    Ok(AgentClient::new(ep.connect_lazy()))
}

/// Shared view of which supervisor leads.
#[derive(Default)]
struct LeaderHint(std::sync::Mutex<Option<String>>);

impl LeaderHint {
    fn get(&self) -> Option<String> {
        self.0.lock().expect("hint").clone()
    }
    fn set(&self, v: Option<String>) {
        *self.0.lock().expect("hint") = v;
    }
    fn learn(&self, s: &tonic::Status) {
        if let Some(l) = s.metadata().get("rg-leader").and_then(|v| v.to_str().ok()) {
            self.set(Some(l.to_owned()));
        } else {
            self.set(None);
        }
    }
}

/// Capped exponential backoff with jitter (one helper for every retry loop).
pub struct Backoff {
    cur: Duration,
    min: Duration,
    max: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        Self { cur: min, min, max }
    }
    pub fn reset(&mut self) {
        self.cur = self.min;
    }
    /// The next delay (doubling, capped, with up to 25 % jitter).
    pub fn next_delay(&mut self) -> Duration {
        let d = self.cur;
        self.cur = (self.cur * 2).min(self.max);
        let jitter = d.as_micros() as u64 / 4;
        d + Duration::from_micros(if jitter == 0 {
            0
        } else {
            rand::random::<u64>() % jitter
        })
    }
}

/// Runs the agent until `shutdown` resolves or a fatal error.
pub async fn run(
    cfg: AgentConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), AgentError> {
    for a in &cfg.supervisors {
        if a.parse::<std::net::SocketAddr>().is_err() {
            return Err(AgentError::BadAddress(a.clone()));
        }
    }
    std::fs::create_dir_all(&cfg.data_dir).map_err(|e| {
        OutboxError::Corrupt(format!("cannot create {}: {e}", cfg.data_dir.display()))
    })?;
    let outbox = Arc::new(Mutex::new(Outbox::open(
        &cfg.data_dir.join("outbox"),
        OUTBOX_CAPACITY,
    )?));
    let fresh = Arc::new(Notify::new());
    let hint = Arc::new(LeaderHint::default());
    let cfg = Arc::new(cfg);

    let (tx, mut rx) = mpsc::channel::<LinkTransition>(1024);
    let names: Vec<String> = cfg.nics.iter().map(|n| n.name.clone()).collect();
    let tracker = tokio::spawn(LinkTracker::new(&names, cfg.damping).run(tx));

    // Transitions → outbox.
    let ob = outbox.clone();
    let notify = fresh.clone();
    let recorder = tokio::spawn(async move {
        while let Some(t) = rx.recv().await {
            let report = NicReport {
                nic: t.nic.clone(),
                health: t.health,
                link_up: t.link_up,
                carrier_changes: t.carrier_changes,
                flaps: t.flaps,
                penalty: t.penalty,
                at_unix_ns: t.observed_unix_ns,
                coalesced: 0,
            };
            let seq = ob.lock().await.push(report).await?;
            tracing::info!(nic = %t.nic, health = ?t.health, link_up = t.link_up, seq = ?seq, synthesized = t.synthesized, "NIC transition recorded");
            notify.notify_one();
        }
        Ok::<(), OutboxError>(())
    });

    let reporter = tokio::spawn(report_loop(
        cfg.clone(),
        outbox.clone(),
        fresh.clone(),
        hint.clone(),
    ));
    let heartbeats = tokio::spawn(heartbeat_loop(cfg.clone(), hint.clone()));

    let result = tokio::select! {
        _ = shutdown => Ok(()),
        r = tracker => match r {
            Ok(Err(e)) => Err(AgentError::Tracker(e)),
            _ => Ok(()),
        },
        r = recorder => match r {
            Ok(Err(e)) => Err(AgentError::Outbox(e)),
            _ => Ok(()),
        },
    };
    reporter.abort();
    heartbeats.abort();
    result
}

async fn heartbeat_loop(cfg: Arc<AgentConfig>, hint: Arc<LeaderHint>) {
    let mut tick = tokio::time::interval(HEARTBEAT);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rotate = 0usize;
    loop {
        tick.tick().await;
        let addr = hint.get().unwrap_or_else(|| {
            rotate += 1;
            cfg.supervisors[rotate % cfg.supervisors.len()].clone()
        });
        let Ok(mut c) = client(&addr) else { continue };
        let req = HeartbeatRequest {
            host: cfg.host.clone(),
            sent_unix_ms: crate::link::unix_ns() / 1_000_000,
        };
        match tokio::time::timeout(HEARTBEAT * 2, c.heartbeat(req)).await {
            Ok(Ok(_)) => hint.set(Some(addr)),
            Ok(Err(s)) => {
                tracing::debug!(addr = %addr, status = %s.message(), "heartbeat refused");
                hint.learn(&s);
            }
            Err(_) => hint.set(None),
        }
    }
}

fn register_request(cfg: &AgentConfig) -> RegisterHost {
    RegisterHost {
        host: cfg.host.clone(),
        nics: cfg
            .nics
            .iter()
            .map(|n| Nic {
                name: n.name.clone(),
                rail: n.rail,
                backup: n.backup.clone().unwrap_or_default(),
                rdma_device: n.rdma_device.clone().unwrap_or_default(),
            })
            .collect(),
        labels: Default::default(),
        agent_version: env!("CARGO_PKG_VERSION").into(),
    }
}

/// Registers with whichever supervisor leads; returns its address and the
/// last applied sequence.
async fn connect(cfg: &AgentConfig, hint: &LeaderHint, backoff: &mut Backoff) -> (String, u64) {
    let mut i = 0usize;
    loop {
        let addr = hint
            .get()
            .unwrap_or_else(|| cfg.supervisors[i % cfg.supervisors.len()].clone());
        i += 1;
        if let Ok(mut c) = client(&addr) {
            match tokio::time::timeout(Duration::from_secs(3), c.register(register_request(cfg)))
                .await
            {
                Ok(Ok(r)) => {
                    backoff.reset();
                    hint.set(Some(addr.clone()));
                    return (addr, r.into_inner().last_applied_seq);
                }
                Ok(Err(s)) => {
                    tracing::debug!(addr = %addr, status = %s.message(), "register refused");
                    hint.learn(&s);
                    if hint.get().is_some() {
                        continue; // go straight to the named leader
                    }
                }
                Err(_) => hint.set(None),
            }
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

async fn report_loop(
    cfg: Arc<AgentConfig>,
    outbox: Arc<Mutex<Outbox>>,
    fresh: Arc<Notify>,
    hint: Arc<LeaderHint>,
) {
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    loop {
        let (addr, last_applied) = connect(&cfg, &hint, &mut backoff).await;
        if let Err(e) = outbox.lock().await.resync(last_applied).await {
            tracing::error!(error = %e, "outbox resync failed");
        }
        tracing::info!(addr = %addr, last_applied, "reporting to the leader");
        if let Err(e) = stream_once(&cfg, &addr, &outbox, &fresh, last_applied).await {
            tracing::info!(addr = %addr, error = %e, "report stream ended; reconnecting");
            hint.set(None);
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

async fn stream_once(
    cfg: &AgentConfig,
    addr: &str,
    outbox: &Mutex<Outbox>,
    fresh: &Notify,
    acked: u64,
) -> Result<(), String> {
    let mut c = client(addr).map_err(|e| e.to_string())?;
    let (tx, rx) = mpsc::channel::<AgentEvent>(256);
    let mut acks = c
        .report(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .map_err(|s| s.message().to_string())?
        .into_inner();
    let mut sent = acked;
    loop {
        let pending = outbox
            .lock()
            .await
            .pending_after(sent)
            .map_err(|e| e.to_string())?;
        for p in pending {
            let ev = AgentEvent {
                host: cfg.host.clone(),
                seq: p.seq,
                at_unix_ns: p.report.at_unix_ns,
                kind: Some(agent_event::Kind::NicState(NicStateChange {
                    nic: p.report.nic.clone(),
                    state: health_to_wire(p.report.health),
                    carrier_changes: p.report.carrier_changes,
                    flaps: p.report.flaps,
                    damping_penalty: p.report.penalty,
                    coalesced: p.report.coalesced,
                    link_up: p.report.link_up,
                })),
            };
            tx.send(ev).await.map_err(|_| "stream closed".to_string())?;
            sent = p.seq;
        }
        tokio::select! {
            _ = fresh.notified() => {}
            ack = acks.message() => match ack {
                Ok(Some(a)) => {
                    outbox.lock().await.ack(a.acked_through).await.map_err(|e| e.to_string())?;
                    if !a.error.is_empty() {
                        return Err(format!("supervisor refused reports after {}: {}", a.acked_through, a.error));
                    }
                }
                Ok(None) => return Err("supervisor closed the stream".into()),
                Err(s) => return Err(s.message().to_string()),
            },
        }
    }
}
