//! The supervisor's APIs against a real process: bad input gets a clear
//! error and changes nothing; the agent event stream applies every event
//! exactly once; the data directory is exclusive; compaction and restart
//! keep the state.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::agentsim::{nic_event as ev, testbed_nics as nics};
use common::{agent, events, Sup};
use proto::v1::admin_client::AdminClient as AdminGrpc;
use proto::v1::agent_client::AgentClient;
use proto::v1::raft_peer_client::RaftPeerClient;
use proto::v1::{AgentEvent, Blob, RegisterHost};
use supervisor::api::{AdminReply, AdminRequest, ErrorKind};
use supervisor::model::events::Event;
use supervisor::model::{AdminAction, AdminOp, NicState};

/// Sends `events` on a fresh stream, closes it, and returns every ack.
async fn send_events(addr: &str, events: Vec<AgentEvent>) -> Vec<proto::v1::EventAck> {
    let host = events.first().map_or("h0".to_owned(), |e| e.host.clone());
    let mut c = agent(addr, &host).await;
    let stream = tokio_stream::iter(events);
    let mut acks = c.report(stream).await.expect("open stream").into_inner();
    let mut out = Vec::new();
    while let Ok(Some(a)) = tokio::time::timeout(Duration::from_secs(5), acks.message())
        .await
        .expect("ack in time")
    {
        out.push(a);
    }
    out
}

/// Everything an admin can observe, to compare before and after a refusal.
async fn observe(sup: &Sup) -> String {
    let c = sup.client();
    let hosts = c.call(AdminRequest::NodeList, false).await.unwrap();
    let events = c
        .call(
            AdminRequest::Events {
                since: 0,
                limit: 5000,
                newest: false,
            },
            false,
        )
        .await
        .unwrap();
    let history = c
        .call(AdminRequest::AdminHistory { limit: 5000 }, false)
        .await
        .unwrap();
    serde_json::to_string(&(hosts, events, history)).unwrap()
}

/// Asserts that what an admin can observe is still `before` (`why` says
/// why it must be).
async fn unchanged(sup: &Sup, before: &str, why: &str) {
    assert_eq!(observe(sup).await, before, "{why}");
}

/// Asserts that `s` refuses a message for its size.
fn assert_too_large(s: &tonic::Status) {
    assert!(
        matches!(
            s.code(),
            tonic::Code::ResourceExhausted | tonic::Code::OutOfRange
        ),
        "{s:?}"
    );
}

/// A registration of `host` with `nics`, no labels and no agent version.
fn registration(host: &str, nics: Vec<proto::v1::Nic>) -> RegisterHost {
    RegisterHost {
        host: host.into(),
        nics,
        labels: Default::default(),
        agent_version: String::new(),
    }
}

/// Host h0 as the leader shows it.
async fn show_h0(c: &supervisor::client::AdminClient) -> supervisor::model::Host {
    let AdminReply::Host { host, .. } = c
        .call(AdminRequest::NodeShow { host: "h0".into() }, false)
        .await
        .unwrap()
    else {
        panic!("not a host reply")
    };
    host
}

/// A raw message body.
fn blob(body: impl Into<Vec<u8>>) -> Blob {
    Blob { body: body.into() }
}

fn write(op: AdminOp) -> AdminRequest {
    AdminRequest::Write { op }
}

#[tokio::test]
async fn unknown_names_are_not_found_and_change_nothing() {
    let sup = Sup::with_h0(&[]).await;
    let before = observe(&sup).await;
    let c = sup.client();
    for op in [
        AdminOp::Cordon {
            host: "ghost".into(),
        },
        AdminOp::Drain {
            host: "ghost".into(),
            reason: "x".into(),
            deadline_ms: None,
        },
        AdminOp::SetLabels {
            host: "ghost".into(),
            set: BTreeMap::from([("a".into(), "b".into())]),
            remove: vec![],
        },
    ] {
        let e = c.call(write(op), false).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound, "{e}");
        assert!(e.message.contains("\"ghost\""), "error names the host: {e}");
    }
    let e = c
        .call(
            AdminRequest::NodeShow {
                host: "ghost".into(),
            },
            false,
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound);
    // An event for an unknown NIC is refused with the last applied sequence.
    let acks = send_events(&sup.addr, vec![ev("h0", 1, "eth9", false)]).await;
    assert_eq!(acks.len(), 1);
    assert_eq!(acks[0].acked_through, 0);
    assert!(acks[0].error.contains("h0/eth9"), "{:?}", acks[0]);
    unchanged(&sup, &before, "refused commands must not change state").await;
}

#[tokio::test]
async fn drain_needs_a_reason_and_uncordon_respects_drain() {
    let sup = Sup::with_h0(&[]).await;
    let before = observe(&sup).await;
    let c = sup.client();
    let e = c
        .call(
            write(AdminOp::Drain {
                host: "h0".into(),
                reason: " ".into(),
                deadline_ms: None,
            }),
            false,
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(e.message.contains("reason"), "{e}");
    // The CLI refuses too: clap requires --reason, and an empty one exits 2.
    let out = sup.cli(&["node", "drain", "h0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--reason"));
    let out = sup.cli(&["node", "drain", "h0", "--reason", ""]);
    assert_eq!(out.status.code(), Some(2));
    unchanged(&sup, &before, "a refused drain changes nothing").await;

    let out = sup.cli(&[
        "node",
        "drain",
        "h0",
        "--reason",
        "bad optics",
        "--deadline",
        "10m",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // No jobs on h0: the reconciler completes the drain through an intent.
    let mut drained = false;
    for _ in 0..100 {
        if let Ok(AdminReply::Host { host, .. }) = c
            .call(AdminRequest::NodeShow { host: "h0".into() }, false)
            .await
        {
            if host.status() == supervisor::model::HostStatus::Drained {
                drained = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(drained, "host reaches Drained");
    let out = sup.cli(&["node", "uncordon", "h0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("undrain"));
    let out = sup.cli(&["-o", "json", "history"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("bad optics") && text.contains("\"actor\""),
        "admin history records who and what: {text}"
    );
}

#[tokio::test]
async fn malformed_and_oversized_messages_are_refused() {
    let sup = Sup::with_h0(&[]).await;
    let before = observe(&sup).await;
    let as_ =
        |id: &pki::Identity| supervisor::network::channel(&sup.addr, &common::tls_as(id)).unwrap();
    let ch = as_(&common::admin_id());

    let mut admin = AdminGrpc::new(ch.clone()).max_encoding_message_size(64 << 20);
    let s = admin.call(blob(b"{not json".to_vec())).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::InvalidArgument);
    assert!(
        s.message().contains("malformed admin call"),
        "{}",
        s.message()
    );
    let s = admin.call(blob(vec![b'x'; 5 << 20])).await.unwrap_err();
    assert_too_large(&s);

    let mut peer = RaftPeerClient::new(as_(&pki::Identity::supervisor(1)));
    let s = peer.append_entries(blob(vec![0xff; 16])).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::InvalidArgument);
    assert!(s.message().contains("malformed peer message"));
    let s = peer.forward(blob(b"[]".to_vec())).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::InvalidArgument);

    let mut ag = AgentClient::new(common::agent_channel(&sup.addr, "h1"))
        .max_encoding_message_size(64 << 20);
    let huge = BTreeMap::from([("k".to_string(), "v".repeat(300 << 10))])
        .into_iter()
        .collect();
    let s = ag
        .register(RegisterHost {
            labels: huge,
            ..registration("h1", nics())
        })
        .await
        .unwrap_err();
    assert_too_large(&s);
    // A host name no certificate can hold: h1's certificate speaks only
    // for h1.
    let s = ag
        .register(registration("bad name", nics()))
        .await
        .unwrap_err();
    assert_eq!(s.code(), tonic::Code::PermissionDenied, "{s:?}");
    let dup = vec![nics()[0].clone(), nics()[0].clone()];
    let mut ag2 = AgentClient::new(common::agent_channel(&sup.addr, "h2"));
    let s = ag2.register(registration("h2", dup)).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::InvalidArgument);
    // An event without a kind, or with sequence 0, ends the stream with an error.
    let mut no_kind = ev("h0", 1, "rail0", true);
    no_kind.kind = None;
    let mut c = agent(&sup.addr, "h0").await;
    let mut acks = c
        .report(tokio_stream::iter(vec![no_kind]))
        .await
        .unwrap()
        .into_inner();
    let s = acks.message().await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::InvalidArgument);
    let mut acks = c
        .report(tokio_stream::iter(vec![ev("h0", 0, "rail0", true)]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        acks.message().await.unwrap_err().code(),
        tonic::Code::InvalidArgument
    );
    // An oversized event ends the stream with the size error (it used to
    // end with grpc-status 0, hiding it).
    let mut big = ev("h0", 1, "huge", true);
    if let Some(proto::v1::agent_event::Kind::NicState(n)) = big.kind.as_mut() {
        n.nic = "x".repeat(300 << 10);
    }
    let mut acks = c
        .report(tokio_stream::iter(vec![big]))
        .await
        .unwrap()
        .into_inner();
    assert_too_large(&acks.message().await.unwrap_err());

    unchanged(&sup, &before, "refused messages must not change state").await;
    // And the supervisor still works.
    sup.client()
        .call(write(AdminOp::Cordon { host: "h0".into() }), false)
        .await
        .unwrap();
}

#[tokio::test]
async fn events_apply_exactly_once_in_order_across_reconnects() {
    let sup = Sup::with_h0(&[]).await;
    let acks = send_events(
        &sup.addr,
        (1..=3).map(|s| ev("h0", s, "rail0", s % 2 == 0)).collect(),
    )
    .await;
    assert_eq!(acks.last().unwrap().acked_through, 3);
    assert!(
        acks.windows(2)
            .all(|w| w[0].acked_through <= w[1].acked_through),
        "acks are cumulative"
    );
    // Reconnect and resend 1..=5 (as an agent does after losing its acks).
    let acks = send_events(
        &sup.addr,
        (1..=5).map(|s| ev("h0", s, "rail0", s % 2 == 0)).collect(),
    )
    .await;
    assert_eq!(acks.last().unwrap().acked_through, 5);
    // Re-registration reports where to resume.
    assert_eq!(common::register(&sup.addr, "h0").await, 5);
    let c = sup.client();
    let host = show_h0(&c).await;
    assert_eq!(host.last_event_seq, 5);
    assert_eq!(
        host.nics["rail0"].state,
        NicState::Down,
        "seq 5 is odd: down"
    );
    // Exactly once: 5 transitions applied, each logged once.
    let events = events(&c).await;
    let transitions = events
        .iter()
        .filter(|e| {
            matches!(&e.event, Event::NicLink { nic, .. } | Event::NicState { nic, .. } if nic == "rail0")
        })
        .count();
    assert_eq!(transitions, 5, "{events:#?}");
    let AdminReply::Incidents { incidents } = c
        .call(AdminRequest::Incidents { open_only: false }, false)
        .await
        .unwrap()
    else {
        panic!()
    };
    // Three downs, three incidents; the first two closed by the ups that
    // followed them. (The third may be open, or closed by its playbook or
    // joined by a host_down incident on a slow run: h0 has no agent.)
    let mut downs: Vec<_> = incidents.iter().filter(|i| i.kind == "nic_down").collect();
    downs.sort_by_key(|i| i.id);
    assert_eq!(downs.len(), 3, "{incidents:?}");
    assert!(
        downs[..2].iter().all(|i| i.closed_ms.is_some()),
        "{incidents:?}"
    );
    // A gap is refused, naming the last applied sequence; nothing applies.
    let acks = send_events(&sup.addr, vec![ev("h0", 7, "rail0", true)]).await;
    assert_eq!(acks.len(), 1);
    assert_eq!(acks[0].acked_through, 5);
    assert!(acks[0].error.contains("gap"), "{:?}", acks[0]);
}

#[tokio::test]
async fn second_process_on_a_data_dir_gets_a_clear_error() {
    let sup = Sup::start(&[]).await;
    let out = std::process::Command::new(common::SUPERVISOR)
        .args([
            "--listen",
            &format!("127.0.0.1:{}", common::free_port()),
            "--data-dir",
        ])
        .arg(sup.data_dir())
        .args(common::sup_args(1))
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use by another process"), "{err}");
    assert!(
        err.contains(&sup.child.as_ref().unwrap().id().to_string()),
        "names the holder pid: {err}"
    );
    // Bad flags are refused before anything starts.
    let out = std::process::Command::new(common::SUPERVISOR)
        .args(["--listen", "nonsense"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an IP:port"));
    let out = std::process::Command::new(common::SUPERVISOR)
        .args(["--peer", "2"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("ID=IP:PORT"));
}

#[tokio::test]
async fn cli_reports_errors_with_exit_codes() {
    let sup = Sup::with_h0(&[]).await;
    let out = sup.cli(&["node", "show", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "one-line error: {err}");
    assert!(err.contains("\"nope\" not found"), "{err}");
    let dead = format!("127.0.0.1:{}", common::free_port());
    let out = common::cli(&dead, &["status"]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every address tried is named, with what each said.
    let dead2 = format!("127.0.0.1:{}", common::free_port());
    let out = common::cli(&format!("{dead},{dead2}"), &["node", "list"]);
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("(2 tried)") && err.contains(&dead) && err.contains(&dead2),
        "{err}"
    );
    let out = common::cli("not-an-addr", &["status"]);
    assert_eq!(out.status.code(), Some(2));
    let out = sup.cli(&["-o", "json", "node", "list"]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["hosts"][0]["name"], "h0");
    let out = sup.cli(&["node", "label", "h0", "rack=r1", "--remove", "old"]);
    assert!(out.status.success());
    let out = sup.cli(&["--stale", "node", "show", "h0"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("rack=r1"));
}

#[tokio::test]
async fn follow_streams_new_events() {
    let sup = Sup::with_h0(&[]).await;
    let c = sup.client();
    let follower = tokio::spawn({
        let c = c.clone();
        async move {
            let mut seen = Vec::new();
            let mut applied = Vec::new();
            c.follow(0, |e| {
                seen.push(e.record.event.clone());
                applied.push(e.applied_unix_ns);
                !matches!(
                    e.record.event,
                    Event::Admin {
                        action: AdminAction::Cordon,
                        ..
                    }
                )
            })
            .await
            .unwrap();
            (seen, applied)
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before_ns = supervisor::replica::unix_ns();
    c.call(write(AdminOp::Cordon { host: "h0".into() }), false)
        .await
        .unwrap();
    let answered_ns = supervisor::replica::unix_ns();
    let (seen, applied) = tokio::time::timeout(Duration::from_secs(10), follower)
        .await
        .unwrap()
        .unwrap();
    // The serving supervisor (the leader) says when it applied each event
    // it applied: the cordon between the call and its answer.
    assert!(applied.iter().all(Option::is_some), "{applied:?}");
    let cordon_at = applied.last().copied().flatten().unwrap();
    assert!(
        (before_ns..=answered_ns).contains(&cordon_at),
        "applied at {cordon_at}, call {before_ns}..{answered_ns}"
    );
    assert!(
        matches!(seen[0], Event::ShippedPlaybooks { .. }),
        "{seen:?}"
    );
    assert!(matches!(seen[1], Event::HostRegistered { .. }), "{seen:?}");
    assert!(
        matches!(
            seen.last(),
            Some(Event::Admin {
                action: AdminAction::Cordon,
                ..
            })
        ),
        "{seen:?}"
    );
}

#[tokio::test]
async fn log_compaction_and_restart_keep_every_write() {
    let mut sup = Sup::with_h0(&["--snapshot-every", "20"]).await;
    let c = sup.client();
    for i in 0..120u32 {
        let set = BTreeMap::from([(format!("k{}", i % 7), i.to_string())]);
        c.call(
            write(AdminOp::SetLabels {
                host: "h0".into(),
                set,
                remove: vec![],
            }),
            false,
        )
        .await
        .unwrap();
    }
    // openraft builds snapshots in the background: the one after the
    // last write may still be under way (asked again for up to 10 s).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let st = loop {
        let AdminReply::Status(st) = c.call(AdminRequest::Status, false).await.unwrap() else {
            panic!()
        };
        if st.snapshot_index.unwrap_or(0) >= 100 || std::time::Instant::now() > deadline {
            break st;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        st.snapshot_index.unwrap_or(0) >= 100,
        "snapshots follow the log: {st:?}"
    );
    assert!(st.purged_index.is_some(), "the log was compacted: {st:?}");
    let before = observe(&sup).await;
    sup.kill(); // SIGKILL
    sup.spawn().await;
    unchanged(&sup, &before, "state after restart equals state before").await;
}

/// A write sent again with the same request id (what a client does when it
/// could not learn the outcome) is applied once and answered with the first
/// result, even after the state has moved on.
#[tokio::test]
async fn retried_write_with_the_same_request_id_applies_once() {
    let sup = Sup::with_h0(&[]).await;
    let mut grpc = AdminGrpc::new(
        supervisor::network::channel(&sup.addr, &common::tls_as(&common::admin_id())).unwrap(),
    );
    let send = |op: AdminOp, serial: u64| {
        let call = supervisor::api::AdminCall {
            actor: "retry-test".into(),
            stale: false,
            forwarded: false,
            request_id: Some(supervisor::model::RequestId {
                client: "session-1".into(),
                serial,
                retry: serial == 1,
            }),
            request: write(op),
        };
        blob(serde_json::to_vec(&call).unwrap())
    };
    let drain = AdminOp::Drain {
        host: "h0".into(),
        reason: "retry test".into(),
        deadline_ms: None,
    };
    grpc.call(send(drain.clone(), 1)).await.unwrap();
    grpc.call(send(AdminOp::Undrain { host: "h0".into() }, 2))
        .await
        .unwrap();
    let before = observe(&sup).await;
    // The retry of serial 1 must not drain the host again.
    grpc.call(send(drain, 1)).await.unwrap();
    unchanged(&sup, &before, "a retry must change nothing").await;
    let c = sup.client();
    let host = show_h0(&c).await;
    assert!(host.drain.is_none() && !host.cordoned, "{host:?}");
}

/// A retry refused by validation is remembered in its session: an earlier
/// copy of the same request (a forward a partition held up) that arrives
/// after the state changed must get the refusal, not apply (found by the
/// partitions scenario: an uncordon answered "refused" later took effect).
#[tokio::test]
async fn a_refused_retry_is_remembered_so_a_late_copy_of_the_request_cannot_apply() {
    let sup = Sup::with_h0(&[]).await;
    let mut grpc = AdminGrpc::new(
        supervisor::network::channel(&sup.addr, &common::tls_as(&common::admin_id())).unwrap(),
    );
    let send = |op: AdminOp, serial: u64, retry: bool| {
        let call = supervisor::api::AdminCall {
            actor: "late-copy-test".into(),
            stale: false,
            forwarded: false,
            request_id: Some(supervisor::model::RequestId {
                client: "session-late".into(),
                serial,
                retry,
            }),
            request: write(op),
        };
        blob(serde_json::to_vec(&call).unwrap())
    };
    let h0 = || "h0".to_string();
    let drain = AdminOp::Drain {
        host: h0(),
        reason: "late copy test".into(),
        deadline_ms: None,
    };
    grpc.call(send(drain, 1, false)).await.unwrap();
    // The retry of serial 2 (its first attempt is somewhere else, late) is
    // refused: the host is draining.
    let refused = grpc
        .call(send(AdminOp::Uncordon { host: h0() }, 2, true))
        .await
        .unwrap_err();
    assert_eq!(
        supervisor::api::ApiError::from(refused).kind,
        ErrorKind::FailedPrecondition
    );
    grpc.call(send(AdminOp::Undrain { host: h0() }, 3, false))
        .await
        .unwrap();
    grpc.call(send(AdminOp::Cordon { host: h0() }, 4, false))
        .await
        .unwrap();
    // The late first attempt of serial 2: the refusal stands.
    let late = grpc
        .call(send(AdminOp::Uncordon { host: h0() }, 2, false))
        .await
        .unwrap_err();
    assert_eq!(
        supervisor::api::ApiError::from(late).kind,
        ErrorKind::FailedPrecondition
    );
    let host = show_h0(&sup.client()).await;
    assert!(host.cordoned, "the late copy uncordoned it: {host:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_registered_on_a_long_standing_leader_is_not_declared_down() {
    // A leader that has led for longer than its election grace (3 s) and
    // the Down period (1.2 s).
    let sup = Sup::start(&[]).await;
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    common::register(&sup.addr, "h1").await;
    // Its first heartbeat comes a little later (here 400 ms, under the
    // 750 ms that make a host Suspect), as an agent's does; until then
    // (and after) it must stay Ready: its silence counts from its
    // registration, not from the leader's election.
    let c = sup.client();
    let liveness = || async {
        match c
            .call(AdminRequest::NodeShow { host: "h1".into() }, false)
            .await
            .unwrap()
        {
            AdminReply::Host { host, .. } => host.liveness,
            other => panic!("not a host: {other:?}"),
        }
    };
    let mut h1 = agent(&sup.addr, "h1").await;
    for _ in 0..4 {
        assert_eq!(liveness().await, supervisor::model::Liveness::Ready);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    h1.heartbeat(proto::v1::HeartbeatRequest {
        host: "h1".into(),
        sent_unix_ms: 0,
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(liveness().await, supervisor::model::Liveness::Ready);
    let evs = events(&c).await;
    assert!(
        !evs.iter()
            .any(|e| matches!(&e.event, Event::Liveness { .. }) && e.host.as_deref() == Some("h1")),
        "no liveness change for h1: {evs:?}"
    );
}

#[tokio::test]
async fn supervisor_addresses_may_be_host_names() {
    let sup = Sup::start(&[]).await;
    let port = sup.addr.rsplit_once(':').unwrap().1;
    let out = common::cli(&format!("localhost:{port}"), &["status"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = common::cli("nosuchhost.invalid:7400", &["status"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot resolve nosuchhost.invalid"), "{err}");
    let out = common::cli("localhost", &["status"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("HOST:PORT"));
}

/// Logs written to a file are plain text (no ANSI colour codes), and
/// `--log-format json` writes one JSON object per line.
#[tokio::test]
async fn logs_to_a_file_are_plain_text_or_json_lines() {
    let text = Sup::start(&[]).await;
    let log = std::fs::read_to_string(text.dir.path().join("sup.log")).unwrap();
    assert!(log.contains("INFO"), "{log}");
    assert!(
        !log.contains('\u{1b}'),
        "ANSI escapes in a log file:\n{log}"
    );
    let json = Sup::start(&["--log-format", "json"]).await;
    let log = std::fs::read_to_string(json.dir.path().join("sup.log")).unwrap();
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty());
    for l in lines {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(v["level"].is_string() && v["timestamp"].is_string(), "{l}");
    }
}

/// The CLI with only what the config file says: no connection flags or
/// variables.
fn cli_with_config(config: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(common::cli_bin())
        .args(args)
        .env("RAILGUARD_CONFIG", config)
        .env("HOME", config.parent().unwrap())
        .env_remove("RAILGUARD_SUPERVISORS")
        .env_remove("RAILGUARD_CONTEXT")
        .env_remove("RAILGUARD_CA")
        .env_remove("RAILGUARD_CERT")
        .env_remove("RAILGUARD_KEY")
        .env_remove("RAILGUARD_INSECURE")
        .output()
        .unwrap()
}

#[tokio::test]
async fn cli_contexts_choose_the_supervisors_and_the_certificate() {
    let sup = Sup::with_h0(&[]).await;
    let admin = common::files(&common::admin_id());
    let dir = tempfile::tempdir().unwrap();
    // The certificate by a path relative to the file.
    std::fs::copy(&admin.cert, dir.path().join("me.pem")).unwrap();
    let dead = format!("127.0.0.1:{}", common::free_port());
    let config = dir.path().join("config.toml");
    let text = format!(
        "# my clusters\ncurrent = \"dead\"\n\n[contexts.live]\nsupervisors = [\"{}\"]\nca = \"{}\"\ncert = \"me.pem\"\nkey = \"{}\"\n\n[contexts.dead]  # a decommissioned one\nsupervisors = [\"{dead}\"]\nca = \"{}\"\ncert = \"me.pem\"\nkey = \"{}\"\ntimeout = \"2s\"\n",
        sup.addr,
        admin.ca.display(),
        admin.key.display(),
        admin.ca.display(),
        admin.key.display(),
    );
    std::fs::write(&config, &text).unwrap();
    // The current context is used: its supervisor is the one tried.
    let out = cli_with_config(&config, &["node", "list"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&dead));
    // --context picks another, whose supervisor and certificate work.
    let out = cli_with_config(
        &config,
        &["--context", "live", "-o", "json", "node", "list"],
    );
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["hosts"][0]["name"], "h0");
    // A flag wins over the context's value, setting by setting.
    let out = cli_with_config(&config, &["--supervisor", &sup.addr, "node", "list"]);
    assert!(out.status.success(), "{out:?}");
    // `context use` switches, keeping the file's comments.
    let out = cli_with_config(&config, &["context", "use", "live"]);
    assert!(out.status.success(), "{out:?}");
    let now = std::fs::read_to_string(&config).unwrap();
    assert!(
        now.contains("current = \"live\"") && now.contains("# a decommissioned one"),
        "{now}"
    );
    assert!(cli_with_config(&config, &["node", "list"]).status.success());
    let out = cli_with_config(&config, &["context", "list"]);
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed.contains(&format!("* live\t{}", sup.addr)),
        "{listed}"
    );
    let out = cli_with_config(&config, &["-o", "json", "context", "show"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["name"], "live");
    assert_eq!(
        v["context"]["cert"],
        dir.path().join("me.pem").display().to_string(),
        "relative paths are the file's"
    );
    // Bad choices and bad files are clear errors that change nothing.
    for (args, says) in [
        (
            &["--context", "nope", "status"][..],
            "context \"nope\" is not in",
        ),
        (&["context", "use", "nope"][..], "contexts: dead, live"),
    ] {
        let out = cli_with_config(&config, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert_eq!(std::fs::read_to_string(&config).unwrap(), now, "unchanged");
    std::fs::write(&config, "current = \"x\"\n[contexts.y]\nsupervisors = 7\n").unwrap();
    let out = cli_with_config(&config, &["status"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("config.toml"));
    // No file, no context: the built-in defaults, as before (and no
    // certificate: the flags must give one, or --insecure).
    std::fs::remove_file(&config).unwrap();
    let out = cli_with_config(&config, &["status"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no certificates configured"));
    let out = cli_with_config(&config, &["--insecure", "--timeout", "1s", "status"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("127.0.0.1:7400"),
        "{out:?}"
    );
}

#[tokio::test]
async fn cli_watch_shows_the_view_again_until_stopped() {
    use std::io::Read;
    let sup = Sup::with_h0(&[]).await;
    let admin = common::files(&common::admin_id());
    let mut child = std::process::Command::new(common::cli_bin())
        .args([
            "--supervisor",
            &sup.addr,
            "--watch",
            "--interval",
            "200ms",
            "node",
            "list",
        ])
        .env_remove("RAILGUARD_SUPERVISORS")
        .envs(admin.cli_env())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        let _ = stdout.read_to_string(&mut all);
        all
    });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let out = sup.cli(&["node", "cordon", "h0"]);
    assert!(out.status.success(), "{out:?}");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // SAFETY: kill has no memory-safety preconditions; the child is ours.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    let all = reader.join().unwrap();
    let views = all.matches("every 200ms: ").count();
    assert!((4..=12).contains(&views), "{views} views: {all}");
    let first = all.split("every 200ms: ").nth(1).unwrap();
    let last = all.rsplit("every 200ms: ").next().unwrap();
    assert!(!first.to_lowercase().contains("cordon"), "{first}");
    assert!(last.to_lowercase().contains("cordon"), "{last}");
    assert!(!status.success(), "stopped by the signal");
    // A change cannot be watched; a too short interval is refused.
    let out = sup.cli(&["-w", "node", "cordon", "h0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot repeat a change"));
    let out = sup.cli(&["-w", "--interval", "10ms", "node", "list"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("shorter than"));
}

#[tokio::test]
async fn a_drained_host_is_removed_from_the_cli() {
    let sup = Sup::with_h0(&[]).await;
    let out = sup.cli(&["node", "remove", "h0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("drain it first"));
    let out = sup.cli(&["node", "drain", "h0", "--reason", "decommission"]);
    assert!(out.status.success(), "{out:?}");
    let mut drained = false;
    for _ in 0..50 {
        let out = sup.cli(&["node", "show", "h0"]);
        if String::from_utf8_lossy(&out.stdout).contains("status:     Drained") {
            drained = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(drained, "h0 never Drained");
    let out = sup.cli(&["node", "remove", "h0"]);
    assert!(out.status.success(), "{out:?}");
    let out = sup.cli(&["node", "list"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("no hosts registered"));
    let out = sup.cli(&["history"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("node remove h0"));
    let out = sup.cli(&["node", "remove", "h0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));
}

#[tokio::test]
async fn wide_tables_add_columns() {
    let sup = Sup::with_h0(&[]).await;
    let narrow = String::from_utf8(sup.cli(&["node", "list"]).stdout).unwrap();
    let wide = String::from_utf8(sup.cli(&["-o", "wide", "node", "list"]).stdout).unwrap();
    assert!(!narrow.contains("REGISTERED"), "{narrow}");
    assert!(
        wide.contains("REGISTERED") && wide.contains("rail0:"),
        "{wide}"
    );
    let wide = String::from_utf8(sup.cli(&["-o", "wide", "nic", "list"]).stdout).unwrap();
    let header = wide.lines().next().unwrap();
    assert!(
        header.contains("CARRIER") && header.contains("INCIDENTS"),
        "{wide}"
    );
    assert_eq!(wide.lines().count(), 3, "h0's two NICs: {wide}");
    // Views without a wide form print as tables.
    let out = sup.cli(&["-o", "wide", "status"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("leader:"));
}

/// An admin service that always says there is no leader, as a follower
/// does during an election.
struct NoLeader;

#[tonic::async_trait]
impl proto::v1::admin_server::Admin for NoLeader {
    async fn call(
        &self,
        _: tonic::Request<proto::v1::Blob>,
    ) -> Result<tonic::Response<proto::v1::Blob>, tonic::Status> {
        Err(supervisor::api::ApiError::unavailable(
            "not the leader; no leader is elected right now",
        )
        .into())
    }

    type FollowStream = std::pin::Pin<
        Box<dyn futures::Stream<Item = Result<proto::v1::Blob, tonic::Status>> + Send>,
    >;

    async fn follow(
        &self,
        _: tonic::Request<proto::v1::FollowRequest>,
    ) -> Result<tonic::Response<Self::FollowStream>, tonic::Status> {
        Err(tonic::Status::unavailable("no leader"))
    }
}

/// A supervisor that stopped (SIGSTOP) keeps its listening socket: the
/// kernel completes connections and nothing answers. Once it let a call
/// time out, a client whose other supervisor answers "no leader yet" asks
/// that one again instead of waiting out another timeout on the stopped
/// one (it used to: clients lost 3-7 s per paused leader).
#[tokio::test]
async fn a_supervisor_that_let_a_call_time_out_is_skipped_while_another_answers() {
    let stopped = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let follower = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addrs = vec![
        stopped.local_addr().unwrap().to_string(),
        follower.local_addr().unwrap().to_string(),
    ];
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(proto::v1::admin_server::AdminServer::new(NoLeader))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(follower)),
    );
    let c = supervisor::client::AdminClient::new(
        &addrs,
        "test",
        Duration::from_millis(400),
        &supervisor::client::ClientTls::Insecure,
    )
    .unwrap();
    // First pass: the stopped one first (nothing known yet), its timeout,
    // then the follower's refusal.
    let t = std::time::Instant::now();
    let e = c.call(AdminRequest::Status, false).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unavailable, "{e}");
    assert!(
        t.elapsed() >= Duration::from_millis(400),
        "{:?}",
        t.elapsed()
    );
    // Next passes: the follower answers, the stopped one is skipped.
    for _ in 0..3 {
        let t = std::time::Instant::now();
        let e = c.call(AdminRequest::Status, false).await.unwrap_err();
        assert!(
            t.elapsed() < Duration::from_millis(300),
            "{:?}: {e}",
            t.elapsed()
        );
        assert!(
            e.message.contains("no leader is elected") && e.message.contains("skipped"),
            "{e}"
        );
    }
    drop(stopped);
}
