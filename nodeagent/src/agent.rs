//! The agent runtime: link tracker → outbox → report stream to the leader,
//! plus registration and heartbeats.
//!
//! **Reporting.** Every transition is written to the outbox, which hands it
//! to the sender while it flushes it (see [`crate::outbox`]). The reporter
//! registers (learning the last sequence the
//! cluster applied), resends everything after it on a fresh `Report`
//! stream, then streams new reports as they arrive; acks (sent by the
//! supervisor only after commit) trim the outbox. Any error closes the
//! stream and the reporter reconnects with capped exponential backoff,
//! preferring the leader the supervisors point to (`rg-leader`).
//!
//! **Jobs and orders.** The control socket ([`crate::control`]) serves the
//! job contract; connection placements and reflex outcomes go through the
//! same outbox (a `QpReset` first at every start). Link transitions reach
//! the control plane (the reflex) before they are written to the outbox.
//! The orders loop keeps an `Orders` stream open to the leader and executes
//! each order id at most once: outcomes are stored in the outbox database
//! ([`crate::outbox::OrderLog`]) before they are reported, a repeated id is
//! answered from the record, and a repeat that arrives while the order runs
//! is ignored. Every execution is first appended to the execution journal
//! ([`crate::journal`], `executed.jsonl` in the data directory): the audit
//! trail the chaos suite's duplicate-action checker reads.
//!
//! **Shaping.** `ShapeNic` and `ClearShape` take the same at-most-once
//! path and run in [`crate::shaping::Shaper`] (HTB on the NIC in the
//! agent's network namespace, verified by a dump; pacing through the job
//! contract). Shapes outlive the agent: at start the shaping found on its
//! NICs is logged and kept; at exit it is left for the supervisor. Each
//! probe summary carries the shaped NICs' counters.
//!
//! **Ranks.** Job orders (`StartRank`, `StopJob`, `CheckpointJob`) take the
//! same at-most-once path and run in the job runner ([`crate::jobs`]); rank
//! exits and checkpoints reach the outbox from it. A `TailLog` query (its id
//! has the top bit set) is neither logged nor deduplicated: it is answered
//! with `Agent.LogTail`. At shutdown (SIGTERM, Ctrl-C) the agent stops its
//! ranks (SIGTERM, grace, SIGKILL) and writes their exits before it exits.

use std::sync::Arc;
use std::time::Duration;

use proto::agent::{Order, OrderOutcome};
use proto::v1::agent_client::AgentClient;
use proto::v1::{
    AgentEvent, AgentOrder, ClearShape, LogTailResult, Nic, OrderResultReply, OrdersRequest,
    RegisterHost,
};
use tokio::sync::{mpsc, Mutex, Notify};
use tonic::transport::Channel;

pub use crate::config::{AgentConfig, NicConfig};
use crate::control::{Control, ControlError, HeldChange, SupervisorOrder};
use crate::jobs::{JobOrder, JobsConfig, JobsError, Launcher};
use crate::leader_link::{heartbeat_loop, LeaderHint};
use crate::leader_term::LeaderTerm;
use crate::link::{LinkTracker, LinkTransition, NicHealth, PortEvent};
use crate::outbox::{NicReport, OrderLog, Outbox, OutboxError, RecordedOrder, Report, StoredOrder};
use crate::shaping::{ShapeOrder, Shaper};

pub use crate::leader_link::HEARTBEAT;
/// Outbox capacity (reports awaiting acknowledgement).
pub const OUTBOX_CAPACITY: usize = 4096;
/// Executed orders remembered (by id) to answer repeats.
pub const ORDER_LOG_CAPACITY: usize = 1024;
/// Supervisor orders carried out at once (repeats of others are ignored
/// until they finish).
pub const MAX_ORDERS_IN_FLIGHT: usize = 64;
/// How long an order's outcome is offered to the leader before the agent
/// leaves it to the leader's resend (answered from the record).
pub const ORDER_REPORT_WINDOW: Duration = Duration::from_secs(2);

/// Why the agent stopped.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The outbox (or the order log) failed.
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    /// The link tracker could not start.
    #[error(transparent)]
    Tracker(#[from] crate::link::TrackerError),
    /// A supervisor address is not `host:port`.
    #[error("bad supervisor address {0:?}")]
    BadAddress(String),
    /// The control socket could not be served.
    #[error(transparent)]
    Control(#[from] ControlError),
    /// The probe mesh could not start.
    #[error("probe mesh: {0}")]
    Probe(String),
    /// The job runner failed (its storage).
    #[error(transparent)]
    Jobs(#[from] JobsError),
    /// The execution journal could not be opened.
    #[error(transparent)]
    Journal(#[from] crate::journal::JournalError),
    /// No netlink socket for shaping.
    #[error("cannot open a netlink socket for shaping: {0}")]
    Netlink(std::io::Error),
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
    let mut cfg = cfg;
    let names: Vec<String> = cfg.nics.iter().map(|n| n.name.clone()).collect();
    match crate::probe::interface_addrs(&names).await {
        Ok(addrs) => {
            for n in &mut cfg.nics {
                n.addr = addrs.get(&n.name).copied();
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot read NIC addresses; probing is off"),
    }
    std::fs::create_dir_all(&cfg.data_dir).map_err(|e| {
        OutboxError::Corrupt(format!("cannot create {}: {e}", cfg.data_dir.display()))
    })?;
    let outbox = Outbox::open(&cfg.data_dir.join("outbox"), OUTBOX_CAPACITY)?;
    let order_log = outbox.order_log(ORDER_LOG_CAPACITY)?;
    let journal = Arc::new(crate::journal::Journal::open(&cfg.data_dir)?);
    let outbox = Arc::new(Mutex::new(outbox));
    let fresh = Arc::new(Notify::new());
    let hint = Arc::new(LeaderHint::default());
    let cfg = Arc::new(cfg);

    // The job contract. Placements from an earlier run are unknown now:
    // reset them before any job registers again.
    let listener = crate::control::bind(&cfg.control_socket, cfg.control_socket_group)?;
    tracing::info!(socket = %cfg.control_socket.display(), "control socket ready");
    let _socket_file = RemoveOnDrop(cfg.control_socket.clone());
    outbox
        .lock()
        .await
        .push(Report::QpReset {
            at_unix_ns: crate::link::unix_ns(),
        })
        .await?;
    // The job runner: ranks an earlier run left are reported (and killed)
    // before orders arrive.
    let launcher = Launcher::open(
        JobsConfig::new(
            cfg.data_dir.clone(),
            cfg.control_socket.clone(),
            cfg.nics.clone(),
        )
        .with_policy(cfg.jobs.clone()),
        outbox.clone(),
        fresh.clone(),
    )
    .await?;
    let control = Control::with_rank_events(
        cfg.nics.clone(),
        Some(launcher.clone() as Arc<dyn crate::control::RankEvents>),
    );
    let server = tokio::spawn(control.clone().serve(listener));
    // Shaping: a netlink socket in this (the host's) namespace; shapes an
    // earlier run left are logged and kept.
    let (nl_conn, nl_handle, _) = rtnetlink::new_connection().map_err(AgentError::Netlink)?;
    let netlink = tokio::spawn(nl_conn);
    // Detour routes a crashed run left go before the host registers (the
    // supervisor then sends the desired set again).
    let rerouter = Arc::new(crate::reroute::Rerouter::new(nl_handle.clone()));
    if let Err(e) = rerouter.flush().await {
        tracing::warn!(error = %e, "cannot flush old detour routes");
    }
    let fabric = (cfg.fabric_rto_min_ms > 0).then(|| {
        tokio::spawn(tune_fabric_loop(
            rerouter.clone(),
            names.clone(),
            cfg.fabric_rto_min_ms,
        ))
    });
    let shaper = Arc::new(
        Shaper::new(nl_handle, cfg.nics.clone(), control.clone())
            .with_probe_port(cfg.probe.as_ref().map(|p| p.port)),
    );
    shaper.adopt_existing().await;
    let placements = tokio::spawn(placement_loop(
        control.clone(),
        outbox.clone(),
        fresh.clone(),
    ));
    let term = Arc::new(LeaderTerm::load(cfg.data_dir.join("leader_term")));
    let orders = tokio::spawn(orders_loop(OrderCtx {
        cfg: cfg.clone(),
        hint: hint.clone(),
        control: control.clone(),
        launcher: launcher.clone(),
        shaper: shaper.clone(),
        rerouter: rerouter.clone(),
        log: order_log,
        journal,
        inflight: Default::default(),
        tails: Default::default(),
        term: term.clone(),
    }));

    let (tx, mut rx) = mpsc::channel::<LinkTransition>(1024);
    // Evidence beside netlink: RDMA port events and the probe mesh's
    // verdicts share one channel into the tracker.
    let (evidence_tx, evidence_rx) = mpsc::channel::<PortEvent>(64);
    // The probe mesh judges a NIC only by its silence since netlink last
    // saw it come up.
    let netdevs = Arc::new(crate::link::NetdevEpochs::default());
    let link_tracker = LinkTracker::new(&names, cfg.damping, cfg.failback_hold)
        .with_port_events(evidence_rx)
        .with_netdev_epochs(netdevs.clone());
    let mut rdma_forward = None;
    if let Some(mut ports) = rdma_port_events(&cfg) {
        let ev = evidence_tx.clone();
        rdma_forward = Some(tokio::spawn(async move {
            while let Some(p) = ports.recv().await {
                if ev.send(p).await.is_err() {
                    return;
                }
            }
        }));
    }
    let tracker = tokio::spawn(link_tracker.run(tx));
    let probes = start_probes(&cfg, &hint, evidence_tx, shaper.clone(), netdevs)?;

    // Transitions → outbox.
    let ob = outbox.clone();
    let notify = fresh.clone();
    let reflex = control.clone();
    let (detour_tx, detour_rx) = mpsc::channel::<(String, bool)>(MAX_DETOUR_REFLEX_BACKLOG);
    let detour_reflex = tokio::spawn(detour_reflex_loop(rerouter.clone(), detour_rx));
    let recorder = tokio::spawn(async move {
        while let Some(t) = rx.recv().await {
            // The reflex first: jobs hear of a dead NIC before the disk
            // write and the round trip to the supervisor, and its standby
            // detours go in (in their own task: netlink round trips).
            reflex.on_link(&t);
            // A Degraded NIC (losing or holding back packets) is detoured like a dead one.
            let down = matches!(
                t.health,
                NicHealth::Down | NicHealth::Flapping | NicHealth::Degraded
            );
            if down || matches!(t.health, NicHealth::Up | NicHealth::Recovering) {
                if let Err(e) = detour_tx.try_send((t.nic.clone(), down)) {
                    tracing::warn!(nic = %t.nic, error = %e, "detour reflex backlog full: left to the leader's order");
                }
            }
            let report = NicReport {
                nic: t.nic.clone(),
                health: t.health.into(),
                link_up: t.link_up,
                carrier_changes: t.carrier_changes,
                flaps: t.flaps,
                penalty: t.penalty,
                at_unix_ns: t.observed_unix_ns,
                coalesced: 0,
                probes_lost: t.probes_lost,
            };
            let seq = crate::outbox::record(&ob, vec![Report::Nic(report)], &notify)
                .await?
                .pop()
                .flatten();
            tracing::info!(nic = %t.nic, health = ?t.health, link_up = t.link_up, probes_lost = t.probes_lost, seq = ?seq, synthesized = t.synthesized, "NIC transition recorded");
        }
        Ok::<(), OutboxError>(())
    });

    let reporter = tokio::spawn(report_loop(
        cfg.clone(),
        outbox.clone(),
        fresh.clone(),
        hint.clone(),
        term.clone(),
    ));
    let heartbeats = tokio::spawn(heartbeat_loop(
        cfg.clone(),
        hint.clone(),
        control.clone(),
        term,
        probes.as_ref().map(|p| p.2.clone()).unwrap_or_default(),
    ));

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
        r = placements => match r {
            Ok(Err(e)) => Err(AgentError::Outbox(e)),
            _ => Ok(()),
        },
    };
    // No new orders; ranks do not outlive their agent. Their exits reach
    // the outbox (and are sent after the next start if not before).
    orders.abort();
    detour_reflex.abort();
    launcher.shutdown().await;
    reporter.abort();
    heartbeats.abort();
    server.abort();
    // Shapes stay (the supervisor owns them); detour routes go (they steer
    // other programs' traffic, and only a running agent keeps them true).
    if let Err(e) = rerouter.flush().await {
        tracing::warn!(error = %e, "cannot remove the detour routes");
    }
    if let Some(t) = fabric {
        t.abort();
        if let Err(e) = rerouter.tune_fabric(&names, 0).await {
            tracing::warn!(error = %e, "cannot restore the fabric routes' rto_min");
        }
    }
    netlink.abort();
    if let Some(t) = rdma_forward {
        t.abort();
    }
    if let Some((plan, summary, _)) = probes {
        plan.abort();
        summary.abort();
    }
    result
}

/// NIC transitions waiting for the detour reflex (more are left to the
/// leader's next order).
const MAX_DETOUR_REFLEX_BACKLOG: usize = 64;

/// The detour reflex, one transition at a time: a NIC down installs its
/// standby detours, a NIC up marks them for the next order to judge.
async fn detour_reflex_loop(
    rerouter: Arc<crate::reroute::Rerouter>,
    mut rx: mpsc::Receiver<(String, bool)>,
) {
    while let Some((nic, down)) = rx.recv().await {
        if !down {
            rerouter.link_up(&nic).await;
            continue;
        }
        match rerouter.reflex_down(&nic).await {
            None => {}
            Some(Ok(a)) => {
                tracing::info!(nic = %nic, installed = a.installed, kept = a.kept, "reflex: standby detours installed")
            }
            Some(Err(e)) => {
                tracing::warn!(nic = %nic, error = %e, "reflex: standby detours not all installed")
            }
        }
    }
}

/// The probe mesh's plan and summary loops, and its board of peers heard.
type ProbeTasks = (
    tokio::task::JoinHandle<()>,
    tokio::task::JoinHandle<()>,
    Arc<crate::probe::HeardBoard>,
);

/// Starts the probe mesh over the NICs that have a rail and an address,
/// with its plan and summary loops.
fn start_probes(
    cfg: &Arc<AgentConfig>,
    hint: &Arc<LeaderHint>,
    evidence: mpsc::Sender<PortEvent>,
    shaper: Arc<Shaper>,
    netdevs: Arc<crate::link::NetdevEpochs>,
) -> Result<Option<ProbeTasks>, AgentError> {
    let Some(opts) = cfg.probe.clone() else {
        tracing::info!("probe mesh off");
        return Ok(None);
    };
    let mut nics = Vec::new();
    for n in &cfg.nics {
        match (n.rail, n.addr) {
            (Some(rail), Some(addr)) => nics.push(crate::probe::MeshNic {
                name: n.name.clone(),
                rail,
                addr,
            }),
            _ => {
                tracing::warn!(nic = %n.name, rail = ?n.rail, addr = ?n.addr, "NIC without a rail or an IPv4 address; not probing over it")
            }
        }
    }
    if nics.is_empty() {
        tracing::warn!("no NIC to probe over; probe mesh off");
        return Ok(None);
    }
    let port = opts.port;
    if !opts.test_clock.is_identity() {
        tracing::warn!(
            offset_ns = opts.test_clock.offset_ns,
            drift_ppb = opts.test_clock.drift_ppb,
            steps = ?opts.test_clock.steps.iter().flatten().collect::<Vec<_>>(),
            "TEST CLOCK ERROR applied to every probe timestamp"
        );
    }
    let (sum_tx, sum_rx) = mpsc::channel(4);
    let runner =
        crate::probe::ProbeRunner::start_with_netdevs(opts, &nics, evidence, sum_tx, netdevs)
            .map_err(|e| AgentError::Probe(e.to_string()))?;
    shaper.attach_queueing(runner.queueing());
    let heard = runner.heard();
    let runner = Arc::new(runner);
    let plan = tokio::spawn(plan_loop(cfg.clone(), hint.clone(), runner, port));
    let summary = tokio::spawn(summary_loop(cfg.clone(), hint.clone(), sum_rx, shaper));
    Ok(Some((plan, summary, heard)))
}

/// How often the agent asks for its probe plan.
const PLAN_EVERY: Duration = Duration::from_secs(2);

/// Fetches the probe plan from any supervisor every [`PLAN_EVERY`].
async fn plan_loop(
    cfg: Arc<AgentConfig>,
    hint: Arc<LeaderHint>,
    runner: Arc<crate::probe::ProbeRunner>,
    port: u16,
) {
    let mut rotate = 0usize;
    loop {
        let addr = hint.target(&cfg.supervisors, &mut rotate);
        if let Ok(mut c) = hint.client(&cfg, &addr) {
            let req = proto::v1::ProbePlanRequest {
                host: cfg.host.clone(),
            };
            match tokio::time::timeout(Duration::from_secs(2), c.get_probe_plan(req)).await {
                Ok(Ok(p)) => runner.set_plan(crate::probe::plan_from_wire(&p.into_inner(), port)),
                Ok(Err(s)) => {
                    tracing::debug!(addr = %addr, status = %s.message(), "no probe plan")
                }
                Err(_) => tracing::debug!(addr = %addr, "probe plan request timed out"),
            }
        }
        tokio::time::sleep(PLAN_EVERY).await;
    }
}

/// Sends each summary, with the shaped NICs' counters (one class dump per
/// shaped NIC), to the leader; a summary that cannot be delivered within a
/// second is dropped (the next one supersedes it).
async fn summary_loop(
    cfg: Arc<AgentConfig>,
    hint: Arc<LeaderHint>,
    mut rx: mpsc::Receiver<crate::probe::Summary>,
    shaper: Arc<Shaper>,
) {
    let mut rotate = 0usize;
    let mut refused = 0u64;
    while let Some(s) = rx.recv().await {
        let mut msg = s.to_wire(&cfg.host);
        msg.shaped = shaper.summary().await;
        let addr = hint.target(&cfg.supervisors, &mut rotate);
        let Ok(mut c) = hint.client(&cfg, &addr) else {
            continue;
        };
        match tokio::time::timeout(Duration::from_secs(1), c.send_probe_summary(msg)).await {
            Ok(Ok(_)) => {}
            Ok(Err(st)) => {
                // Not leading is routine (the hint follows the leader);
                // anything else means the leader drops this host's clocks,
                // paths and probe evidence, which an operator must see.
                if matches!(
                    st.code(),
                    tonic::Code::InvalidArgument | tonic::Code::NotFound
                ) {
                    refused += 1;
                    if refused.is_power_of_two() {
                        tracing::warn!(addr = %addr, status = %st.message(), refused, "probe summary refused by the leader");
                    }
                } else {
                    tracing::debug!(addr = %addr, status = %st.message(), "probe summary not taken");
                }
                hint.learn(&st);
            }
            Err(_) => tracing::debug!(addr = %addr, "probe summary timed out; dropped"),
        }
    }
}

/// Keeps the data NICs' connected routes at `rto_min` `ms` (the kernel
/// recreates a route without it when a NIC comes back up).
async fn tune_fabric_loop(rerouter: Arc<crate::reroute::Rerouter>, nics: Vec<String>, ms: u32) {
    let mut failures = 0u64;
    loop {
        if let Err(e) = rerouter.tune_fabric(&nics, ms).await {
            failures += 1;
            if failures.is_power_of_two() {
                tracing::warn!(error = %e, failures, "cannot tune the fabric routes");
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Removes the control socket file when the agent stops.
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Placements and reflex outcomes → outbox (one flush per batch).
async fn placement_loop(
    control: Arc<Control>,
    outbox: Arc<Mutex<Outbox>>,
    fresh: Arc<Notify>,
) -> Result<(), OutboxError> {
    loop {
        control.changed().await;
        let reports = control.take_reports();
        if reports.is_empty() {
            continue;
        }
        let n = reports.len();
        crate::outbox::record(&outbox, reports, &fresh).await?;
        tracing::debug!(reports = n, "connection reports recorded");
    }
}

/// An order the agent executes at most once per id.
enum Work {
    Nic(SupervisorOrder),
    /// An admin's failover or failback: the NIC's hold changes first.
    Held(HeldChange, SupervisorOrder),
    Job(JobOrder),
    Shape(ShapeOrder),
    Reroute(Vec<proto::agent::RouteVia>, Vec<proto::agent::Standby>),
}

/// A `TailLog` query's id has this bit set (the border's constant).
pub use proto::agent::QUERY_BIT;
/// Log tail queries answered at once (more are dropped; the leader asks
/// again).
pub const MAX_TAILS_IN_FLIGHT: usize = 8;

/// The executor of a (non-query) order.
fn work(o: &Order) -> Option<Work> {
    Some(match o.clone() {
        Order::Failover { nic, to } => Work::Nic(SupervisorOrder::Failover { nic, to }),
        Order::Failback { nic } => Work::Nic(SupervisorOrder::Failback { nic }),
        Order::HoldOut { nic, to, version } => Work::Held(
            HeldChange {
                nic: nic.clone(),
                version,
                held: true,
            },
            SupervisorOrder::Failover { nic, to },
        ),
        Order::Release { nic, version } => Work::Held(
            HeldChange {
                nic: nic.clone(),
                version,
                held: false,
            },
            SupervisorOrder::Failback { nic },
        ),
        Order::StartRank(s) => Work::Job(JobOrder::Start(s)),
        Order::StopJob { job, incarnation } => Work::Job(JobOrder::Stop { job, incarnation }),
        Order::CheckpointJob {
            job,
            incarnation,
            halt,
        } => Work::Job(JobOrder::Checkpoint {
            job,
            incarnation,
            halt,
        }),
        Order::ShapeNic(s) => Work::Shape(ShapeOrder::Shape(s)),
        Order::ClearShape { nic } => Work::Shape(ShapeOrder::Clear(ClearShape { nic })),
        Order::Reroute { routes, standby } => Work::Reroute(routes, standby),
        Order::TailLog { .. } => return None,
    })
}

/// An executor's (ok, detail) as an outcome.
fn outcome_of((ok, detail): (bool, String)) -> OrderOutcome {
    if ok {
        OrderOutcome::Done { detail }
    } else {
        OrderOutcome::Failed { error: detail }
    }
}

/// Everything the orders loop hands to each order.
#[derive(Clone)]
struct OrderCtx {
    cfg: Arc<AgentConfig>,
    hint: Arc<LeaderHint>,
    control: Arc<Control>,
    launcher: Arc<Launcher>,
    shaper: Arc<Shaper>,
    rerouter: Arc<crate::reroute::Rerouter>,
    log: OrderLog,
    /// Every execution (not repeat) is appended here first.
    journal: Arc<crate::journal::Journal>,
    inflight: Arc<std::sync::Mutex<std::collections::HashSet<u64>>>,
    tails: Arc<std::sync::atomic::AtomicUsize>,
    /// The newest leader term heard (orders, heartbeat replies).
    term: Arc<LeaderTerm>,
}

/// Keeps an `Orders` stream open to the leader and executes what arrives.
async fn orders_loop(ctx: OrderCtx) {
    let (cfg, hint) = (ctx.cfg.clone(), ctx.hint.clone());
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
    let mut rotate = 0usize;
    loop {
        let addr = hint.target(&cfg.supervisors, &mut rotate);
        if let Ok(mut c) = hint.client(&cfg, &addr) {
            let req = OrdersRequest {
                host: cfg.host.clone(),
            };
            match tokio::time::timeout(Duration::from_secs(3), c.orders(req)).await {
                Ok(Ok(resp)) => {
                    backoff.reset();
                    tracing::info!(addr = %addr, "receiving orders from the leader");
                    let mut stream = resp.into_inner();
                    // A newer term heard meanwhile (a heartbeat reply from
                    // a new leader) ends this stream: its leader may be
                    // paused or cut off and never end it itself.
                    let mut newer = ctx.term.watch();
                    let mut stream_term = *newer.borrow_and_update();
                    let mut followed = false;
                    loop {
                        tokio::select! {
                            m = stream.message() => match m {
                                Ok(Some(o)) => {
                                    // This stream's own orders carry its
                                    // leader's term.
                                    stream_term = stream_term.max(o.term);
                                    handle_order(&ctx, o);
                                    let now = *newer.borrow_and_update();
                                    if now > stream_term {
                                        tracing::info!(addr = %addr, term = now, "a newer leader term was heard; following the new leader");
                                        followed = true;
                                        break;
                                    }
                                }
                                Ok(None) => break,
                                Err(s) => {
                                    tracing::debug!(addr = %addr, status = %s.message(), "order stream ended");
                                    break;
                                }
                            },
                            changed = newer.changed() => {
                                if changed.is_err() {
                                    break;
                                }
                                let now = *newer.borrow_and_update();
                                if now > stream_term {
                                    tracing::info!(addr = %addr, term = now, "a newer leader term was heard; following the new leader");
                                    followed = true;
                                    break;
                                }
                            }
                        }
                    }
                    if !followed {
                        hint.set(None);
                    }
                }
                Ok(Err(s)) => {
                    tracing::debug!(addr = %addr, status = %s.message(), "order stream refused");
                    hint.learn(&s);
                }
                Err(_) => hint.set(None),
            }
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// Answers a `TailLog` query with `Agent.LogTail` (no order log, no dedup).
fn handle_tail(ctx: &OrderCtx, id: u64, t: &proto::v1::TailLog) {
    use std::sync::atomic::Ordering;
    if id & QUERY_BIT == 0 {
        tracing::warn!(
            order_id = id,
            "log tail query without the query bit; answering it anyway"
        );
    }
    if ctx.tails.fetch_add(1, Ordering::AcqRel) >= MAX_TAILS_IN_FLIGHT {
        ctx.tails.fetch_sub(1, Ordering::AcqRel);
        tracing::warn!(
            order_id = id,
            "too many log tails running; dropping the query"
        );
        return;
    }
    let (ctx, t) = (ctx.clone(), t.clone());
    tokio::spawn(async move {
        let from = t.from_offset.map(|o| (t.incarnation, o));
        let tail = ctx
            .launcher
            .tail_log(&t.job, t.rank, t.max_bytes, from)
            .await;
        tracing::info!(order_id = id, job = %t.job, rank = t.rank, ok = tail.ok, incarnation = tail.incarnation, bytes = tail.text.len(), "log tail read");
        let msg = LogTailResult {
            host: ctx.cfg.host.clone(),
            order_id: id,
            ok: tail.ok,
            text: tail.text,
            incarnation: tail.incarnation,
            end_offset: tail.end_offset,
            newest_incarnation: tail.newest,
        };
        offer(&ctx.cfg, &ctx.hint, id, "log tail", move |mut c| {
            let msg = msg.clone();
            async move { c.log_tail(msg).await }
        })
        .await;
        ctx.tails.fetch_sub(1, Ordering::AcqRel);
    });
}

fn handle_order(ctx: &OrderCtx, o: AgentOrder) {
    let id = o.order_id;
    let order = match Order::try_from(&o) {
        Ok(order) => order,
        Err(e) => {
            tracing::warn!(order_id = id, error = %e, "order of an unknown kind; ignoring it");
            return;
        }
    };
    if let Order::TailLog {
        job,
        rank,
        max_bytes,
        from,
    } = &order
    {
        let t = proto::v1::TailLog {
            job: job.clone(),
            rank: *rank,
            max_bytes: *max_bytes,
            from_offset: from.map(|(_, o)| o),
            incarnation: from.map_or(0, |(i, _)| i),
        };
        handle_tail(ctx, id, &t);
        return;
    }
    if !ctx.term.admit(o.term) {
        tracing::warn!(
            order_id = id,
            term = o.term,
            newest_term = ctx.term.get(),
            "order from a deposed leader (an older term); refused"
        );
        return;
    }
    let Some(work) = work(&order) else {
        return;
    };
    let desc = order.describe();
    match ctx.log.get(id) {
        Ok(Some(stored)) if stored.order.is(&order) => {
            tracing::info!(order_id = id, order = %desc, ok = stored.outcome.ok(), "order already executed; answering the stored outcome");
            let ctx = ctx.clone();
            tokio::spawn(async move {
                report_order(&ctx.cfg, &ctx.hint, id, &stored.outcome).await;
            });
            return;
        }
        Ok(Some(stored)) => {
            tracing::warn!(order_id = id, stored = %stored.order.describe(), order = %desc, "order id reused for a different order (a new cluster?); executing it");
        }
        Ok(None) => {}
        Err(e) => {
            tracing::error!(order_id = id, error = %e, "cannot read the order log; executing")
        }
    }
    {
        let mut f = ctx.inflight.lock().unwrap_or_else(|e| e.into_inner());
        if f.contains(&id) {
            tracing::debug!(
                order_id = id,
                "order repeated while running; ignoring the repeat"
            );
            return;
        }
        if f.len() >= MAX_ORDERS_IN_FLIGHT {
            tracing::warn!(
                order_id = id,
                "too many orders running; the leader will send it again"
            );
            return;
        }
        f.insert(id);
    }
    tracing::info!(order_id = id, order = %desc, "executing order");
    let ctx = ctx.clone();
    tokio::spawn(async move {
        let entry = crate::journal::JournalEntry {
            order_id: id,
            order: desc.clone(),
            started_unix_ms: crate::link::unix_ns() / 1_000_000,
        };
        if !ctx.cfg.test_order_delay.is_zero() {
            tokio::time::sleep(ctx.cfg.test_order_delay).await;
        }
        let journal = ctx.journal.clone();
        match tokio::task::spawn_blocking(move || journal.record(&entry)).await {
            Ok(Ok(())) => {}
            // The audit trail must not stop the work it records.
            Ok(Err(e)) => tracing::error!(order_id = id, error = %e, "cannot journal the order"),
            Err(e) => tracing::error!(order_id = id, error = %e, "journal task failed"),
        }
        let outcome = match &work {
            Work::Nic(o) => outcome_of(ctx.control.execute(o).await),
            Work::Held(change, o) => {
                ctx.control.change_held(change);
                outcome_of(ctx.control.execute(o).await)
            }
            Work::Job(o) => ctx.launcher.execute(&ctx.control, o).await,
            Work::Shape(o) => outcome_of(ctx.shaper.execute(o).await),
            Work::Reroute(routes, standby) => {
                outcome_of(ctx.rerouter.execute(routes, standby).await)
            }
        };
        tracing::info!(order_id = id, order = %desc, ok = outcome.ok(), detail = %outcome.detail(), step = ?outcome.step(), "order executed");
        let stored = StoredOrder {
            order: RecordedOrder::Typed(order),
            outcome: outcome.clone(),
            at_unix_ms: crate::link::unix_ns() / 1_000_000,
        };
        if let Err(e) = ctx.log.record(id, &stored).await {
            tracing::error!(order_id = id, error = %e, "cannot store the order's outcome");
        }
        ctx.inflight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        report_order(&ctx.cfg, &ctx.hint, id, &outcome).await;
    });
}

/// Offers an order's outcome to the leader for [`ORDER_REPORT_WINDOW`];
/// after that the leader's resend gets it from the order log.
async fn report_order(cfg: &AgentConfig, hint: &LeaderHint, id: u64, outcome: &OrderOutcome) {
    let req = outcome.to_wire(&cfg.host, id);
    offer(cfg, hint, id, "order outcome", move |mut c| {
        let req = req.clone();
        async move { c.order_done(req).await }
    })
    .await;
}

/// Calls the leader (`call`) for at most [`ORDER_REPORT_WINDOW`], following
/// its hints; gives up on a refusal (invalid argument, not found).
async fn offer<F, Fut>(cfg: &AgentConfig, hint: &LeaderHint, id: u64, what: &str, mut call: F)
where
    F: FnMut(AgentClient<Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<OrderResultReply>, tonic::Status>>,
{
    let deadline = tokio::time::Instant::now() + ORDER_REPORT_WINDOW;
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(500));
    let mut rotate = 0usize;
    loop {
        let addr = hint.target(&cfg.supervisors, &mut rotate);
        if let Ok(c) = hint.client(cfg, &addr) {
            match tokio::time::timeout(Duration::from_secs(1), call(c)).await {
                Ok(Ok(_)) => {
                    tracing::info!(order_id = id, what, "delivered to the leader");
                    return;
                }
                Ok(Err(s))
                    if matches!(
                        s.code(),
                        tonic::Code::InvalidArgument | tonic::Code::NotFound
                    ) =>
                {
                    tracing::warn!(order_id = id, what, status = %s.message(), "the leader refused it");
                    return;
                }
                Ok(Err(s)) => hint.learn(&s),
                Err(_) => hint.set(None),
            }
        }
        let pause = backoff.next_delay();
        if tokio::time::Instant::now() + pause >= deadline {
            tracing::warn!(
                order_id = id,
                what,
                "could not deliver it to the leader; the leader's resend will get it"
            );
            return;
        }
        tokio::time::sleep(pause).await;
    }
}

/// The RDMA port events of the NICs configured with an RDMA device, from
/// the verbs backend; `None` (netlink alone) when no NIC has one, the agent
/// is built without the `verbs` feature, or the machine has no devices.
fn rdma_port_events(cfg: &AgentConfig) -> Option<mpsc::Receiver<crate::link::PortEvent>> {
    let map = crate::rdma_events::PortMap::new(
        cfg.nics
            .iter()
            .filter_map(|n| Some((n.name.as_str(), n.rdma_device.as_deref()?))),
    );
    if map.is_empty() {
        return None;
    }
    #[cfg(feature = "verbs")]
    {
        match crate::rdma_events::feed(&rdma::verbs::VerbsBackend::new(), map) {
            Ok(rx) => {
                tracing::info!("RDMA port events feed the link tracker");
                Some(rx)
            }
            Err(e) => {
                tracing::warn!(error = %e, "no RDMA port events; watching links through netlink only");
                None
            }
        }
    }
    #[cfg(not(feature = "verbs"))]
    {
        drop(map);
        tracing::warn!(
            "NICs name RDMA devices but this agent is built without the `verbs` feature; \
             watching links through netlink only"
        );
        None
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
                addr: n.addr.map(|a| a.to_string()).unwrap_or_default(),
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
        if let Ok(mut c) = hint.client(cfg, &addr) {
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
    term: Arc<LeaderTerm>,
) {
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    loop {
        let (addr, last_applied) = connect(&cfg, &hint, &mut backoff).await;
        if let Err(e) = outbox.lock().await.resync(last_applied).await {
            tracing::error!(error = %e, "outbox resync failed");
        }
        tracing::info!(addr = %addr, last_applied, "reporting to the leader");
        match stream_once(&cfg, &hint, &addr, &outbox, &fresh, last_applied, &term).await {
            // The heartbeats found a newer leader: the hint names it.
            Ok(()) => {
                tracing::info!(addr = %addr, "a newer leader term was heard; reporting to the new leader")
            }
            Err(e) => {
                tracing::info!(addr = %addr, error = %e, "report stream ended; reconnecting");
                hint.set(None);
            }
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

async fn stream_once(
    cfg: &AgentConfig,
    hint: &LeaderHint,
    addr: &str,
    outbox: &Mutex<Outbox>,
    fresh: &Notify,
    acked: u64,
    term: &LeaderTerm,
) -> Result<(), String> {
    // A newer term heard meanwhile ends the stream (Ok): its leader may be
    // paused or cut off, holding the reports unacknowledged.
    let mut newer = term.watch();
    let stream_term = *newer.borrow_and_update();
    let mut c = hint.client(cfg, addr).map_err(|e| e.to_string())?;
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
            let ev = p.report.to_event(&cfg.host, p.seq);
            tx.send(ev).await.map_err(|_| "stream closed".to_string())?;
            sent = p.seq;
        }
        tokio::select! {
            _ = fresh.notified() => {}
            changed = newer.changed() => match changed {
                Err(_) => return Err("the leader term is gone".into()),
                Ok(()) if *newer.borrow_and_update() > stream_term => return Ok(()),
                Ok(()) => {}
            },
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
