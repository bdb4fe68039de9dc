//! The agent's job orders end to end: a fake leader (the `Agent` gRPC
//! service) streams `StartRank` and `TailLog` orders to a real agent, which
//! launches real processes and answers through `OrderDone`, `LogTail` and
//! its `Report` stream. Shaping orders take the same at-most-once path
//! (the kernel side is in chaos-tests' `shape_netns`, which needs root).

#[path = "support/job_user.rs"]
mod job_user;

use std::pin::Pin;
use std::time::Duration;

use proto::v1::agent_server::{Agent, AgentServer};
use proto::v1::{
    agent_event, agent_order, AgentEvent, AgentOrder, EventAck, HeartbeatReply, HeartbeatRequest,
    LogTailResult, OrderResult, OrderResultReply, OrdersRequest, ProbePlan, ProbePlanRequest,
    ProbeSummary, ProbeSummaryReply, RankPeer, RegisterHost, RegisterReply, StartRank, TailLog,
};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

struct Fake {
    orders: broadcast::Sender<AgentOrder>,
    done: mpsc::UnboundedSender<OrderResult>,
    tails: mpsc::UnboundedSender<LogTailResult>,
    events: mpsc::UnboundedSender<AgentEvent>,
}

#[tonic::async_trait]
impl Agent for Fake {
    async fn register(&self, _: Request<RegisterHost>) -> Result<Response<RegisterReply>, Status> {
        Ok(Response::new(RegisterReply {
            last_applied_seq: 0,
            leader_id: 1,
        }))
    }
    async fn heartbeat(
        &self,
        _: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatReply>, Status> {
        Ok(Response::new(HeartbeatReply {
            leader_id: 1,
            ..Default::default()
        }))
    }
    type ReportStream = Boxed<EventAck>;
    async fn report(
        &self,
        req: Request<Streaming<AgentEvent>>,
    ) -> Result<Response<Self::ReportStream>, Status> {
        let mut incoming = req.into_inner();
        let (tx, rx) = mpsc::channel(64);
        let events = self.events.clone();
        tokio::spawn(async move {
            while let Some(Ok(ev)) = incoming.next().await {
                let seq = ev.seq;
                let _ = events.send(ev);
                let ack = EventAck {
                    acked_through: seq,
                    error: String::new(),
                };
                if tx.send(Ok(ack)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
    type OrdersStream = Boxed<AgentOrder>;
    async fn orders(
        &self,
        _: Request<OrdersRequest>,
    ) -> Result<Response<Self::OrdersStream>, Status> {
        let s = tokio_stream::wrappers::BroadcastStream::new(self.orders.subscribe())
            .filter_map(|o| o.ok().map(Ok));
        Ok(Response::new(Box::pin(s)))
    }
    async fn order_done(
        &self,
        req: Request<OrderResult>,
    ) -> Result<Response<OrderResultReply>, Status> {
        let _ = self.done.send(req.into_inner());
        Ok(Response::new(OrderResultReply {}))
    }
    async fn log_tail(
        &self,
        req: Request<LogTailResult>,
    ) -> Result<Response<OrderResultReply>, Status> {
        let _ = self.tails.send(req.into_inner());
        Ok(Response::new(OrderResultReply {}))
    }
    async fn get_probe_plan(
        &self,
        _: Request<ProbePlanRequest>,
    ) -> Result<Response<ProbePlan>, Status> {
        Err(Status::unimplemented("no probes here"))
    }
    async fn send_probe_summary(
        &self,
        _: Request<ProbeSummary>,
    ) -> Result<Response<ProbeSummaryReply>, Status> {
        Ok(Response::new(ProbeSummaryReply {}))
    }
}

fn start(id: u64, incarnation: u64, script: &str) -> AgentOrder {
    AgentOrder {
        order_id: id,
        term: 0,
        kind: Some(agent_order::Kind::StartRank(StartRank {
            job: "train".into(),
            incarnation,
            rank: 0,
            peers: vec![RankPeer {
                host: "h0".into(),
                addrs: vec![],
            }],
            argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
            env: Default::default(),
            checkpoint_dir: String::new(),
            user: String::new(),
            checkpoint_every: 0,
            resume_step: 0,
            port: 7000,
        })),
    }
}

async fn next<T>(rx: &mut mpsc::UnboundedReceiver<T>, what: &str) -> T {
    tokio::time::timeout(Duration::from_secs(15), rx.recv())
        .await
        .unwrap_or_else(|_| panic!("no {what} within 15 s"))
        .expect("channel open")
}

/// A real agent connected to a [`Fake`] leader, and the fake's channels.
struct Rig {
    /// Holds the agent's data dir and control socket.
    dir: tempfile::TempDir,
    /// Orders sent here reach the agent's order stream.
    orders: broadcast::Sender<AgentOrder>,
    done: mpsc::UnboundedReceiver<OrderResult>,
    tails: mpsc::UnboundedReceiver<LogTailResult>,
    events: mpsc::UnboundedReceiver<AgentEvent>,
    /// Asks the agent to shut down.
    stop_tx: tokio::sync::oneshot::Sender<()>,
    agent: tokio::task::JoinHandle<Result<(), nodeagent::agent::AgentError>>,
    /// TCP connections the fake leader accepted.
    connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Rig {
    /// Starts the fake leader and an agent (host `h0`, no NICs), and waits
    /// until the agent subscribed to orders.
    async fn start() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let (orders, _) = broadcast::channel(16);
        let (done_tx, done) = mpsc::unbounded_channel();
        let (tails_tx, tails) = mpsc::unbounded_channel();
        let (events_tx, events) = mpsc::unbounded_channel();
        let fake = Fake {
            orders: orders.clone(),
            done: done_tx,
            tails: tails_tx,
            events: events_tx,
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = connections.clone();
        let incoming = tokio_stream::StreamExt::map(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            move |c| {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                c
            },
        );
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(AgentServer::new(fake))
                .serve_with_incoming(incoming),
        );
        let cfg = nodeagent::agent::AgentConfig {
            host: "h0".into(),
            supervisors: vec![addr.to_string()],
            nics: vec![],
            data_dir: dir.path().join("data"),
            damping: Default::default(),
            control_socket: dir.path().join("agent.sock"),
            probe: None,
            // The fake supervisor speaks plain text: this tests orders, not TLS.
            tls: pki::ClientTls::Insecure,
            test_order_delay: Duration::ZERO,
            // Ranks run as the default job user, the socket is its group's.
            jobs: Default::default(),
            control_socket_group: Some(job_user::ensure_job_user().1),
            fabric_rto_min_ms: 0,
            failback_hold: Duration::ZERO,
        };
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let agent = tokio::spawn(nodeagent::agent::run(cfg, async {
            let _ = stop_rx.await;
        }));
        // The agent subscribes to orders once it is up.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while orders.receiver_count() == 0 {
            assert!(tokio::time::Instant::now() < deadline, "no order stream");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Rig {
            dir,
            orders,
            done,
            tails,
            events,
            stop_tx,
            agent,
            connections,
        }
    }
}

/// Shuts the agent down and waits (at most 20 s) for it to return cleanly.
async fn stop(
    stop_tx: tokio::sync::oneshot::Sender<()>,
    agent: tokio::task::JoinHandle<Result<(), nodeagent::agent::AgentError>>,
) {
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(20), agent)
        .await
        .expect("agent stops")
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_starts_ranks_reports_their_exits_and_answers_log_tails() {
    let Rig {
        dir,
        orders,
        mut done,
        mut tails,
        mut events,
        stop_tx,
        agent,
        connections,
    } = Rig::start().await;
    // Heartbeats (every 250 ms), the order stream, the report stream and
    // order answers all share one connection to the leader.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let n = connections.load(std::sync::atomic::Ordering::SeqCst);
    assert!(n <= 2, "{n} connections for one supervisor");

    orders
        .send(start(1, 1, "echo hello-from-rank; exit 4"))
        .unwrap();
    let d = next(&mut done, "order outcome").await;
    assert_eq!(d.order_id, 1);
    assert!(d.ok && d.detail.starts_with("pid="), "{d:?}");
    let exited = loop {
        let ev = next(&mut events, "rank exit").await;
        if let Some(agent_event::Kind::RankExited(x)) = ev.kind {
            break x;
        }
    };
    assert_eq!(
        (exited.job.as_str(), exited.incarnation, exited.exit_code),
        ("train", 1, 4),
        "{exited:?}"
    );

    // A repeated id is answered from the order log, not run again.
    orders
        .send(start(1, 1, "echo hello-from-rank; exit 4"))
        .unwrap();
    let again = next(&mut done, "repeated outcome").await;
    assert_eq!((again.order_id, &again.detail), (1, &d.detail));

    // A log tail query: answered with LogTail, never through OrderDone.
    let qid = (1u64 << 63) | 7;
    orders
        .send(AgentOrder {
            order_id: qid,
            term: 0,
            kind: Some(agent_order::Kind::TailLog(TailLog {
                job: "train".into(),
                rank: 0,
                max_bytes: 1 << 20,
                from_offset: None,
                incarnation: 0,
            })),
        })
        .unwrap();
    let t = next(&mut tails, "log tail").await;
    assert_eq!((t.order_id, t.ok, t.incarnation), (qid, true, 1), "{t:?}");
    assert_eq!(t.text, "hello-from-rank\n");
    assert_eq!((t.end_offset, t.newest_incarnation), (16, 1), "{t:?}");
    // Read on from byte 6 of incarnation 1: the rest, and where it ends.
    orders
        .send(AgentOrder {
            order_id: qid + 1,
            term: 0,
            kind: Some(agent_order::Kind::TailLog(TailLog {
                job: "train".into(),
                rank: 0,
                max_bytes: 1 << 20,
                from_offset: Some(6),
                incarnation: 1,
            })),
        })
        .unwrap();
    let t = next(&mut tails, "log read").await;
    assert_eq!(
        (t.text.as_str(), t.end_offset),
        ("from-rank\n", 16),
        "{t:?}"
    );

    // A stale incarnation is refused once a newer one was seen.
    orders.send(start(2, 3, "exec sleep 100")).unwrap();
    let d = next(&mut done, "start of incarnation 3").await;
    assert!(d.ok, "{d:?}");
    let pid: u32 = d.detail.strip_prefix("pid=").unwrap().parse().unwrap();
    orders.send(start(3, 2, "true")).unwrap();
    let d = next(&mut done, "stale start").await;
    assert_eq!(
        (d.order_id, d.ok, d.detail.as_str()),
        (3, false, "stale incarnation 2 < 3")
    );
    assert!(done.try_recv().is_err(), "one answer per order");

    // Shutdown stops the running rank before the agent returns.
    stop(stop_tx, agent).await;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(
        !stat.contains("(sleep)"),
        "the rank outlived its agent: {stat}"
    );
    // The execution journal: every executed order once; the repeat of
    // order 1 (answered from the log) and the log tail query not at all.
    let ids: Vec<u64> = nodeagent::journal::read_journal(&dir.path().join("data"))
        .unwrap()
        .iter()
        .map(|e| e.order_id)
        .collect();
    assert_eq!(ids, [1, 2, 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shaping_orders_take_the_order_path_and_refuse_unknown_nics() {
    use proto::v1::{ClearShape, ShapeClass, ShapeNic};
    let Rig {
        dir,
        orders,
        mut done,
        stop_tx,
        agent,
        ..
    } = Rig::start().await;

    let shape = AgentOrder {
        order_id: 11,
        term: 0,
        kind: Some(agent_order::Kind::ShapeNic(ShapeNic {
            nic: "rail0".into(),
            classes: vec![ShapeClass {
                minor: 0x10,
                rate_bps: 120_000_000,
                ceil_bps: 120_000_000,
                flows: vec![proto::v1::FlowMatch {
                    dst: "10.0.0.2".into(),
                    protocol: 0,
                    dst_port: 0,
                    src_port: 0,
                }],
                label: "job a".into(),
                job: "a".into(),
            }],
            default_rate_bps: 1_000_000_000,
            pace: vec![],
            hold_queueing_us: 0,
        })),
    };
    orders.send(shape.clone()).unwrap();
    let d = next(&mut done, "shape outcome").await;
    assert_eq!((d.order_id, d.ok), (11, false), "{d:?}");
    assert_eq!(
        d.detail,
        "NIC \"rail0\" is not a data NIC of this host (it has none); nothing changed"
    );
    // A repeat is answered from the order log.
    orders.send(shape).unwrap();
    let again = next(&mut done, "repeated shape outcome").await;
    assert_eq!(
        (again.order_id, again.ok, &again.detail),
        (11, false, &d.detail)
    );

    orders
        .send(AgentOrder {
            order_id: 12,
            term: 0,
            kind: Some(agent_order::Kind::ClearShape(ClearShape {
                nic: "rail0".into(),
            })),
        })
        .unwrap();
    let d = next(&mut done, "clear outcome").await;
    assert_eq!((d.order_id, d.ok), (12, false), "{d:?}");
    assert!(d.detail.contains("not a data NIC"), "{d:?}");

    stop(stop_tx, agent).await;
    let journal: Vec<(u64, String)> = nodeagent::journal::read_journal(&dir.path().join("data"))
        .unwrap()
        .into_iter()
        .map(|e| (e.order_id, e.order))
        .collect();
    assert_eq!(journal.len(), 2, "{journal:?}");
    assert_eq!(journal[0].0, 11);
    assert!(
        journal[0].1.starts_with("shape rail0: 1 classes"),
        "{journal:?}"
    );
    assert_eq!(journal[1], (12, "clear shaping on rail0".to_string()));
}

/// An order from a leader older than one the agent has heard is refused
/// (a deposed leader that does not know it yet); the newer leader's orders
/// and queries (term 0) go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_from_a_deposed_leaders_term_are_refused() {
    use proto::v1::ClearShape;
    let Rig {
        dir,
        orders,
        mut done,
        stop_tx,
        agent,
        ..
    } = Rig::start().await;
    let clear = |id: u64, term: u64| AgentOrder {
        order_id: id,
        term,
        kind: Some(agent_order::Kind::ClearShape(ClearShape {
            nic: "rail0".into(),
        })),
    };
    orders.send(clear(21, 7)).unwrap();
    assert_eq!(next(&mut done, "term 7").await.order_id, 21);
    // A deposed leader of term 5 wakes up and sends an order.
    orders.send(clear(22, 5)).unwrap();
    orders.send(clear(23, 7)).unwrap();
    assert_eq!(next(&mut done, "term 7 again").await.order_id, 23);
    // A newer leader's order goes through.
    orders.send(clear(24, 8)).unwrap();
    assert_eq!(next(&mut done, "term 8").await.order_id, 24);
    orders.send(clear(25, 7)).unwrap();
    orders.send(clear(26, 8)).unwrap();
    assert_eq!(next(&mut done, "term 8 again").await.order_id, 26);
    stop(stop_tx, agent).await;
    let journal: Vec<u64> = nodeagent::journal::read_journal(&dir.path().join("data"))
        .unwrap()
        .into_iter()
        .map(|e| e.order_id)
        .collect();
    assert_eq!(journal, vec![21, 23, 24, 26], "the stale orders never ran");
}
