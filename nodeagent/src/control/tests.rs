//! Unit tests of `control` (the contract socket, the reflex, failover/failback orders).

use super::*;
use rdma::contract::{ClientOptions, ContractClient, Delivery};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

fn nics() -> Vec<NicConfig> {
    vec![
        NicConfig {
            name: "rail0".into(),
            rail: Some(0),
            backup: Some("rail1".into()),
            rdma_device: None,
            addr: None,
        },
        NicConfig {
            name: "rail1".into(),
            rail: Some(1),
            backup: Some("rail0".into()),
            rdma_device: None,
            addr: None,
        },
    ]
}

fn up(conn_id: u64, nic: &str, rail: u32) -> ConnUp {
    ConnUp {
        job: "train".into(),
        rank: 0,
        conn_id,
        nic: nic.into(),
        peer_host: "h1".into(),
        peer_rank: 1,
        rail,
    }
}

fn transition(nic: &str, link_up: bool) -> LinkTransition {
    LinkTransition {
        nic: nic.into(),
        link_up,
        probes_lost: false,
        health: if link_up {
            NicHealth::Up
        } else {
            NicHealth::Down
        },
        carrier_changes: 0,
        flaps: 0,
        penalty: 0.0,
        observed_at: Instant::now(),
        observed_unix_ns: 0,
        synthesized: false,
    }
}

async fn start() -> (Arc<Control>, tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("run").join("agent.sock");
    let l = bind(&sock, None).unwrap();
    let c = Control::new(nics());
    tokio::spawn(c.clone().serve(l));
    (c, dir, sock)
}

async fn job(sock: &Path) -> (ContractClient, rdma::contract::OrderStream) {
    ContractClient::connect_rank(
        sock,
        "train",
        0,
        ClientOptions {
            backoff_max: Duration::from_millis(100),
            ..Default::default()
        },
    )
    .await
    .unwrap()
}

/// Answers every migrate order: `conn_moved` for each, then ok.
fn obey(
    c: ContractClient,
    mut orders: rdma::contract::OrderStream,
) -> mpsc::UnboundedReceiver<Order> {
    let (seen_tx, seen) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(o) = orders.next().await {
            if let OrderKind::Migrate { conn_ids, to_nic } = &o.kind {
                for id in conn_ids {
                    c.conn_moved(*id, to_nic.as_deref().unwrap_or("rail1"))
                        .await
                        .unwrap();
                }
            }
            c.order_done(o.order_id, true, "moved").await.unwrap();
            let _ = seen_tx.send(o);
        }
    });
    seen
}

fn reports(c: &Control) -> Vec<QpReport> {
    c.take_reports()
        .into_iter()
        .filter_map(|r| match r {
            Report::Qp(q) => Some(q),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn socket_binding_replaces_stale_files_and_refuses_a_live_agent() {
    let (_c, dir, sock) = start().await;
    let e = bind(&sock, None).unwrap_err();
    assert!(matches!(e, ControlError::InUse { .. }), "{e}");
    assert!(e.to_string().contains("another agent"), "{e}");
    // A socket file nobody listens on is replaced.
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    bind(&stale, None).expect("stale socket replaced");
    let mode = std::fs::metadata(&stale).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660, "root and the socket's group only");
    // A regular file is left alone.
    let file = dir.path().join("file.sock");
    std::fs::write(&file, b"x").unwrap();
    let e = bind(&file, None).unwrap_err();
    assert!(matches!(e, ControlError::NotASocket { .. }), "{e}");
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
}

#[tokio::test]
async fn registrations_are_validated_and_reported() {
    let (c, _dir, sock) = start().await;
    let (j, _orders) = job(&sock).await;
    assert_eq!(j.conn_up(up(1, "rail0", 0)).await.unwrap(), Delivery::Acked);
    assert_eq!(j.conn_up(up(2, "rail1", 0)).await.unwrap(), Delivery::Acked);
    let e = j.conn_up(up(3, "eth9", 0)).await.unwrap_err();
    assert!(e.to_string().contains("not a data NIC"), "{e}");
    let mut other = up(4, "rail0", 0);
    other.job = "other".into();
    assert!(j.conn_up(other).await.is_err(), "another job's connection");
    let mut other = up(5, "rail0", 0);
    other.rank = 1;
    let e = j.conn_up(other).await.unwrap_err();
    assert!(
        e.to_string()
            .contains("rank 1 on the connection of job \"train\" rank 0"),
        "{e}"
    );
    let r = reports(&c);
    assert_eq!(r.len(), 2);
    assert!(!r[0].moved && r[1].moved, "conn 2 is off its home rail0");
    // A garbage line gets an error and the socket stays usable.
    let mut raw = UnixStream::connect(&sock).await.unwrap();
    use tokio::io::AsyncWriteExt;
    raw.write_all(b"{\"type\":\"hello\",\"job\":\"x\",\"rank\":0,\"pid\":1}\nnot json\n{\"type\":\"conn_teleported\"}\n")
        .await
        .unwrap();
    let (rd, _wr) = raw.into_split();
    let mut lines = LineReader::new(rd);
    let mut got = Vec::new();
    for _ in 0..3 {
        let l = lines.next_line().await.unwrap().unwrap().to_vec();
        got.push(contract::decode_agent(&l).unwrap());
    }
    assert_eq!(got[0], AgentMessage::Ok);
    assert!(matches!(&got[1], AgentMessage::Error { message } if message.contains("not JSON")));
    assert!(
        matches!(&got[2], AgentMessage::Error { message } if message.contains("unknown message type"))
    );
    // Moves and closes are reported; closing twice is refused.
    j.conn_moved(1, "rail1").await.unwrap();
    j.conn_closed(2).await.unwrap();
    let r = reports(&c);
    assert_eq!(r.len(), 2);
    assert!(r[0].moved && !r[0].closed);
    assert!(r[1].closed);
    assert!(j.conn_closed(2).await.is_err());
}

#[tokio::test]
async fn failover_and_failback_move_the_right_connections() {
    let (c, _dir, sock) = start().await;
    let (j, orders) = job(&sock).await;
    for (id, nic, rail) in [(1, "rail0", 0), (2, "rail0", 0), (3, "rail1", 1)] {
        j.conn_up(up(id, nic, rail)).await.unwrap();
    }
    let mut seen = obey(j.clone(), orders);
    let fo = SupervisorOrder::Failover {
        nic: "rail0".into(),
        to: "rail1".into(),
    };
    let (ok, detail) = c.execute(&fo).await;
    assert!(ok, "{detail}");
    assert_eq!(detail, "2 connections moved off rail0 to rail1");
    let o = seen.recv().await.unwrap();
    assert_eq!(
        o.kind,
        OrderKind::Migrate {
            conn_ids: vec![1, 2],
            to_nic: Some("rail1".into())
        }
    );
    assert!(c.conns().iter().all(|r| r.conn.nic == "rail1"));
    // Nothing left on rail0: done without orders.
    let (ok, detail) = c.execute(&fo).await;
    assert!(ok && detail.contains("no connections"), "{detail}");
    // Failback moves only the connections whose home is rail0.
    let (ok, detail) = c
        .execute(&SupervisorOrder::Failback {
            nic: "rail0".into(),
        })
        .await;
    assert!(ok, "{detail}");
    let o = seen.recv().await.unwrap();
    assert!(
        matches!(&o.kind, OrderKind::Migrate { conn_ids, to_nic } if conn_ids == &vec![1, 2] && to_nic.as_deref() == Some("rail0")),
        "{o:?}"
    );
    assert!(seen.try_recv().is_err(), "one order each");
    // A failback to a NIC that is down is refused without orders.
    c.on_link(&transition("rail0", false));
    let (ok, detail) = c
        .execute(&SupervisorOrder::Failback {
            nic: "rail0".into(),
        })
        .await;
    assert!(!ok && detail.contains("Down"), "{detail}");
}

#[tokio::test]
async fn reflex_orders_connections_off_a_down_nic_and_reports_it() {
    let (c, _dir, sock) = start().await;
    let (j, orders) = job(&sock).await;
    j.conn_up(up(1, "rail0", 0)).await.unwrap();
    j.conn_up(up(2, "rail1", 1)).await.unwrap();
    let mut seen = obey(j.clone(), orders);
    c.take_reports();
    c.on_link(&transition("rail0", false));
    let o = seen.recv().await.unwrap();
    assert_eq!(
        o.kind,
        OrderKind::Migrate {
            conn_ids: vec![1],
            to_nic: Some("rail1".into())
        }
    );
    // The outcome is reported once the job answered.
    let reflex = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            c.changed().await;
            if let Some(r) = c.take_reports().into_iter().find_map(|r| match r {
                Report::Reflex(x) => Some(x),
                _ => None,
            }) {
                return r;
            }
        }
    })
    .await
    .unwrap();
    assert!(reflex.ok && reflex.conns == 1, "{reflex:?}");
    // Connections already moved off the NIC are not ordered again.
    c.on_link(&transition("rail0", false));
    assert!(
        tokio::time::timeout(Duration::from_millis(200), seen.recv())
            .await
            .is_err()
    );
}

#[tokio::test]
async fn unanswered_orders_fail_and_a_reconnecting_job_gets_them_again() {
    let (c, _dir, sock) = start().await;
    let (j, mut orders) = job(&sock).await;
    j.conn_up(up(1, "rail0", 0)).await.unwrap();
    let c2 = c.clone();
    let run = tokio::spawn(async move {
        c2.execute(&SupervisorOrder::Failover {
            nic: "rail0".into(),
            to: "rail1".into(),
        })
        .await
    });
    let first = orders.next().await.unwrap();
    // A second socket of the same job and rank (its client reconnected)
    // gets the unanswered order again and may answer it.
    let (j2, mut orders2) = job(&sock).await;
    let again = orders2.next().await.unwrap();
    assert_eq!(again.order_id, first.order_id);
    j2.order_done(again.order_id, false, "no healthy NIC")
        .await
        .unwrap();
    let (ok, detail) = run.await.unwrap();
    assert!(!ok);
    assert!(detail.contains("no healthy NIC"), "{detail}");
    // Answering a finished order is refused.
    assert!(j.order_done(first.order_id, true, "").await.is_err());
}

#[tokio::test]
async fn a_connection_answers_only_its_own_ranks_orders() {
    let (c, _dir, sock) = start().await;
    let (rank0, _orders0) = job(&sock).await;
    let (rank1, mut orders1) = ContractClient::connect_with(
        &sock,
        Hello {
            job: "train".into(),
            rank: 1,
            pid: std::process::id(),
        },
        ClientOptions::default(),
    )
    .await
    .unwrap();
    let asked = {
        let c = c.clone();
        tokio::spawn(async move {
            let kind = OrderKind::Checkpoint {
                step: None,
                halt: false,
            };
            c.order_ranks("train", &[1], kind, Duration::from_secs(10))
                .await
        })
    };
    let o = tokio::time::timeout(Duration::from_secs(5), orders1.next())
        .await
        .unwrap()
        .unwrap();
    // Rank 0 cannot answer rank 1's order, nor report for it.
    let e = rank0.checkpoint_done(o.order_id, 7).await.unwrap_err();
    assert!(
        e.to_string().contains(&format!(
            "order {} is not for job \"train\" rank 0",
            o.order_id
        )),
        "{e}"
    );
    assert!(!asked.is_finished(), "the order still waits for rank 1");
    rank1.checkpoint_done(o.order_id, 8).await.unwrap();
    let answers = asked.await.unwrap();
    assert_eq!((answers[0].ok, answers[0].step), (true, Some(8)));
}

const HELLO_X0: &[u8] = b"{\"type\":\"hello\",\"job\":\"x\",\"rank\":0,\"pid\":1}\n";

/// Everything the agent sends until it closes the socket.
async fn read_all(s: &mut UnixStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    buf
}

#[tokio::test]
async fn silent_and_half_written_connections_are_closed() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    let (hello, line) = (Duration::from_millis(300), Duration::from_millis(200));
    let mut c = Control::new(nics());
    let only = Arc::get_mut(&mut c).unwrap();
    (only.hello_timeout, only.line_timeout) = (hello, line);
    tokio::spawn(c.clone().serve(bind(&sock, None).unwrap()));
    // No hello: closed after the hello timeout, saying why.
    let mut silent = UnixStream::connect(&sock).await.unwrap();
    let t0 = tokio::time::Instant::now();
    let said = read_all(&mut silent).await;
    assert!(said.contains("no hello within 300 ms"), "{said}");
    assert!(t0.elapsed() >= hello);
    // A first line that is not a hello: one answer, then closed (the rest
    // is never read, so no flood of answers can pile up).
    let mut rude = UnixStream::connect(&sock).await.unwrap();
    rude.write_all(b"{\"type\":\"checkpointed\",\"step\":1}\nnot json\nnot json\n")
        .await
        .unwrap();
    let said = read_all(&mut rude).await;
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(said.contains("say hello first"), "{said}");
    // A line begun and never finished (after a good hello): closed after
    // LINE_TIMEOUT.
    let mut half = UnixStream::connect(&sock).await.unwrap();
    half.write_all(HELLO_X0).await.unwrap();
    half.write_all(b"{\"type\":").await.unwrap();
    let t0 = tokio::time::Instant::now();
    let said = read_all(&mut half).await;
    assert!(said.contains("not finished within 200 ms"), "{said}");
    assert!(t0.elapsed() >= line);
    // A session that said hello may stay quiet between lines.
    let mut quiet = UnixStream::connect(&sock).await.unwrap();
    quiet.write_all(HELLO_X0).await.unwrap();
    tokio::time::sleep(hello * 3).await;
    quiet
        .write_all(b"{\"type\":\"checkpointed\",\"step\":1}\n")
        .await
        .unwrap();
    drop(quiet.shutdown().await);
    let said = read_all(&mut quiet).await;
    assert_eq!(said.lines().count(), 2, "two answers, no error: {said}");
    assert!(!said.contains("error"), "{said}");
}

#[tokio::test]
async fn a_flood_of_connections_and_of_one_ranks_sessions_is_capped() {
    use tokio::io::AsyncWriteExt;
    let (_c, _dir, sock) = start().await;
    // MAX_PENDING_HELLOS silent connections: the next is closed at once.
    let mut held = Vec::new();
    for _ in 0..MAX_PENDING_HELLOS {
        held.push(UnixStream::connect(&sock).await.unwrap());
    }
    // Let the agent accept them all.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut extra = UnixStream::connect(&sock).await.unwrap();
    let said = tokio::time::timeout(Duration::from_secs(5), read_all(&mut extra))
        .await
        .expect("closed at once");
    assert_eq!(said, "");
    // Once they say hello the way is free again.
    for s in &mut held {
        s.write_all(HELLO_X0).await.unwrap();
    }
    drop(held);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // One rank holds at most MAX_SESSIONS_PER_RANK sessions.
    let mut sessions = Vec::new();
    for i in 0..=MAX_SESSIONS_PER_RANK {
        let s = UnixStream::connect(&sock).await.unwrap();
        let (rd, mut wr) = s.into_split();
        wr.write_all(HELLO_X0).await.unwrap();
        let mut lines = LineReader::new(rd);
        let answer = tokio::time::timeout(Duration::from_secs(5), lines.next_line())
            .await
            .expect("an answer")
            .unwrap()
            .unwrap()
            .to_vec();
        let answer = contract::decode_agent(&answer).unwrap();
        if i < MAX_SESSIONS_PER_RANK {
            assert_eq!(answer, AgentMessage::Ok, "session {i}");
        } else {
            assert!(
                matches!(&answer, AgentMessage::Error { message } if message.contains("already holds 4")),
                "{answer:?}"
            );
        }
        sessions.push((lines, wr));
    }
    // Another rank is not affected.
    let (_j, _orders) = job(&sock).await;
}

/// The next held-out set a job hears (5 s at most).
async fn wait_held(rx: &mut tokio::sync::watch::Receiver<BTreeSet<String>>) -> BTreeSet<String> {
    tokio::time::timeout(Duration::from_secs(5), rx.changed())
        .await
        .expect("the job hears the set")
        .unwrap();
    rx.borrow_and_update().clone()
}

/// The held-out set a job that connects now hears after its hello.
async fn held_after_hello(sock: &std::path::Path) -> BTreeSet<String> {
    let (j, _orders) = ContractClient::connect_rank(sock, "train", 1, ClientOptions::default())
        .await
        .unwrap();
    let mut rx = j.held_out();
    if rx.borrow_and_update().is_empty() {
        wait_held(&mut rx).await
    } else {
        rx.borrow().clone()
    }
}

#[tokio::test]
async fn held_out_nics_reach_every_job_and_the_newest_set_wins() {
    let (c, _dir, sock) = start().await;
    let (j, _orders) = job(&sock).await;
    let mut held = j.held_out();
    assert!(held.borrow_and_update().is_empty());
    // Nothing is said before the leader has spoken: a job that heard a set
    // from an agent before its restart keeps it.
    c.change_held(&HeldChange {
        nic: "rail0".into(),
        version: 0,
        held: true,
    });
    assert_eq!(c.held_out(), (0, BTreeSet::new()));
    // The leader's set as of version 10; unknown NIC names are left out.
    assert!(c.set_held_out(10, vec!["rail0".into(), "eth9".into()]));
    assert_eq!(
        wait_held(&mut held).await,
        BTreeSet::from(["rail0".to_string()])
    );
    // An older set (a heartbeat reply computed before) changes nothing.
    assert!(!c.set_held_out(9, vec![]));
    assert_eq!(c.held_out(), (10, BTreeSet::from(["rail0".to_string()])));
    // Older ones again and again are a rebuilt cluster: taken.
    for _ in 1..HELD_OLDER_TAKEN - 1 {
        assert!(!c.set_held_out(9, vec![]));
    }
    assert!(c.set_held_out(9, vec![]));
    assert_eq!(c.held_out(), (9, BTreeSet::new()));
    assert!(wait_held(&mut held).await.is_empty());
    assert!(c.set_held_out(10, vec!["rail0".into()]));
    assert_eq!(
        wait_held(&mut held).await,
        BTreeSet::from(["rail0".to_string()])
    );
    // An order's change applies only when newer than what the agent has.
    c.change_held(&HeldChange {
        nic: "rail1".into(),
        version: 10,
        held: true,
    });
    assert_eq!(c.held_out().1.len(), 1, "version 10 is already known");
    c.change_held(&HeldChange {
        nic: "rail0".into(),
        version: 12,
        held: false,
    });
    assert_eq!(c.held_out(), (12, BTreeSet::new()));
    assert!(wait_held(&mut held).await.is_empty());
    // A job that connects later hears the set right after its hello.
    assert!(c.set_held_out(13, vec!["rail1".into()]));
    let got = held_after_hello(&sock).await;
    assert_eq!(got, BTreeSet::from(["rail1".to_string()]));
}

#[tokio::test]
async fn a_degraded_nic_is_out_of_service_for_jobs_beside_the_admins_holds() {
    let (c, _dir, sock) = start().await;
    let (j, _orders) = job(&sock).await;
    let mut held = j.held_out();
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    // Before the leader has said what is held, nothing is told: the job
    // takes a set as the whole one, and a restarted agent must not release
    // the admin's holds the job knows.
    let mut t = transition("rail1", true);
    t.health = NicHealth::Degraded;
    c.on_link(&t);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), held.changed())
            .await
            .is_err(),
        "told before the leader spoke: {:?}",
        held.borrow()
    );
    // The admin's holds join it; the job hears the union.
    assert!(c.set_held_out(5, vec!["rail0".into()]));
    assert_eq!(wait_held(&mut held).await, set(&["rail0", "rail1"]));
    // The loss ends: only the admin's hold stays.
    c.on_link(&transition("rail1", true));
    assert_eq!(wait_held(&mut held).await, set(&["rail0"]));
    // The agent's own hold set is the admin's alone (what it reports).
    assert_eq!(c.held_out(), (5, set(&["rail0"])));
    // A job that connects while a NIC is Degraded hears it after hello.
    c.on_link(&t);
    assert_eq!(wait_held(&mut held).await, set(&["rail0", "rail1"]));
    let got = held_after_hello(&sock).await;
    assert_eq!(got, set(&["rail0", "rail1"]));
}

#[tokio::test]
async fn a_failover_may_land_on_a_nic_back_and_settling_but_not_on_a_dead_one() {
    let (c, _dir, sock) = start().await;
    let (j, orders) = job(&sock).await;
    j.conn_up(up(1, "rail0", 0)).await.unwrap();
    let _seen = obey(j.clone(), orders);
    let fo = SupervisorOrder::Failover {
        nic: "rail0".into(),
        to: "rail1".into(),
    };
    let mut t = transition("rail1", false);
    c.on_link(&t);
    let (ok, detail) = c.execute(&fo).await;
    assert!(!ok && detail.contains("Down"), "{detail}");
    // rail1 is back and settling (its failback hold): it takes them.
    t.link_up = true;
    t.health = NicHealth::Recovering;
    c.on_link(&t);
    let (ok, detail) = c.execute(&fo).await;
    assert!(ok, "{detail}");
    assert!(c.conns().iter().all(|r| r.conn.nic == "rail1"));
}
