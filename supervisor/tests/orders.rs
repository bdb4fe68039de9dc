//! Failover/failback orders and connection placements against a real
//! supervisor process, with the test standing in for the agent over gRPC:
//! bad orders are refused with nothing written; a good one is committed as
//! an intent, streamed to the host's agent (and repeated until answered),
//! and closed with the agent's answer; placements reported as agent events
//! show in `qp list`.

mod common;

use std::time::Duration;

use common::{agent, register, Sup};
use proto::v1::{agent_event, agent_order, AgentEvent, OrderResult, OrdersRequest, QpPlacement};

fn json(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn placement(seq: u64, conn_id: u64, nic: &str, closed: bool) -> AgentEvent {
    AgentEvent {
        host: "h0".into(),
        seq,
        at_unix_ns: 0,
        kind: Some(agent_event::Kind::Qp(QpPlacement {
            job: "train".into(),
            rank: 0,
            conn_id,
            nic: nic.into(),
            peer_host: "h1".into(),
            peer_rank: 1,
            rail: 0,
            moved: nic != "rail0",
            closed,
        })),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_are_validated_committed_streamed_and_closed_by_the_agent() {
    let sup = Sup::with_h0(&[]).await;
    register(&sup.addr, "h1").await;

    // Bad orders: a clear error, exit 2, nothing written.
    for (args, want) in [
        (
            vec!["nic", "failover", "nope", "rail0"],
            "host \"nope\" not found",
        ),
        (
            vec!["nic", "failover", "h0", "rail9"],
            "NIC \"h0/rail9\" not found",
        ),
        (
            vec!["nic", "failover", "h0", "rail0", "--to", "rail0"],
            "is the NIC being failed over",
        ),
        (
            vec!["nic", "failover", "h0", "rail0", "--to", "eth0"],
            "is not a NIC of host",
        ),
        (
            vec!["nic", "failback", "h0", "rail7"],
            "NIC \"h0/rail7\" not found",
        ),
    ] {
        let out = sup.cli(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let v = json(&sup.cli(&["-o", "json", "intents"]));
    assert_eq!(v["intents"].as_array().unwrap().len(), 0, "{v}");
    let v = json(&sup.cli(&["-o", "json", "history"]));
    assert_eq!(v["records"].as_array().unwrap().len(), 0, "{v}");

    // Placements arrive as agent events and show in `qp list`.
    let mut c = agent(&sup.addr, "h0").await;
    let events = vec![
        placement(1, 1, "rail0", false),
        placement(2, 2, "rail0", false),
        placement(3, 3, "rail1", false),
        placement(4, 3, "rail1", true),
    ];
    let mut acks = c
        .report(tokio_stream::iter(events))
        .await
        .unwrap()
        .into_inner();
    loop {
        let a = tokio::time::timeout(Duration::from_secs(5), acks.message())
            .await
            .expect("ack within 5 s")
            .unwrap()
            .expect("ack");
        assert!(a.error.is_empty(), "{}", a.error);
        if a.acked_through == 4 {
            break;
        }
    }
    let v = json(&sup.cli(&["-o", "json", "qp", "list", "--host", "h0"]));
    let qps = v["qps"].as_array().unwrap();
    assert_eq!(qps.len(), 2, "{v}");
    assert_eq!(qps[0]["host"], "h0");
    assert_eq!(qps[0]["job"], "train");
    assert_eq!(qps[0]["nic"], "rail0");
    assert_eq!(qps[0]["moved"], false);
    let table = sup.cli(&["qp", "list", "--job", "train"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.starts_with("HOST"), "{table}");
    assert_eq!(table.lines().count(), 3, "{table}");
    let v = json(&sup.cli(&["-o", "json", "qp", "list", "--job", "other"]));
    assert!(v["qps"].as_array().unwrap().is_empty());
    let out = sup.cli(&["qp", "list", "--host", "h9"]);
    assert_eq!(out.status.code(), Some(2));

    // The agent of h0 listens for orders; so does h1's (it must get none).
    let mut orders = c
        .orders(OrdersRequest { host: "h0".into() })
        .await
        .unwrap()
        .into_inner();
    let mut other = agent(&sup.addr, "h1")
        .await
        .orders(OrdersRequest { host: "h1".into() })
        .await
        .unwrap()
        .into_inner();
    // h0's certificate cannot listen for another host's orders; h9's own
    // certificate can ask, but h9 never registered.
    let e = c
        .orders(OrdersRequest { host: "h9".into() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
    let e = agent(&sup.addr, "h9")
        .await
        .orders(OrdersRequest { host: "h9".into() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e}");

    // An order without waiting: the intent id comes back at once.
    let v = json(&sup.cli(&["-o", "json", "nic", "failover", "h0", "rail0", "--no-wait"]));
    let id = v["id"].as_u64().expect("intent id");
    let o = tokio::time::timeout(Duration::from_secs(5), orders.message())
        .await
        .expect("order within 5 s")
        .unwrap()
        .unwrap();
    assert_eq!(o.order_id, id);
    match o.kind {
        Some(agent_order::Kind::Failover(f)) => {
            assert_eq!((f.nic.as_str(), f.to.as_str()), ("rail0", "rail1"))
        }
        k => panic!("unexpected order {k:?}"),
    }
    // Unanswered, it comes again (the agent deduplicates by id).
    let again = tokio::time::timeout(Duration::from_secs(10), orders.message())
        .await
        .expect("repeat within 10 s")
        .unwrap()
        .unwrap();
    assert_eq!(again.order_id, id);
    // Only h0 may answer it: h0's certificate cannot speak for h1, and
    // h1's agent, speaking for itself, does not hold the order.
    let for_h1 = || OrderResult {
        host: "h1".into(),
        order_id: id,
        ok: true,
        detail: String::new(),
        checkpoint_step: None,
    };
    let e = c.order_done(for_h1()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
    let e = agent(&sup.addr, "h1")
        .await
        .order_done(for_h1())
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    for _ in 0..2 {
        c.order_done(OrderResult {
            host: "h0".into(),
            order_id: id,
            ok: true,
            detail: "moved 2 connections".into(),
            checkpoint_step: None,
        })
        .await
        .expect("answer (twice is harmless)");
    }
    let v = json(&sup.cli(&["-o", "json", "intents"]));
    let i = &v["intents"][0];
    assert_eq!(i["id"].as_u64(), Some(id));
    assert_eq!(i["status"]["closed"], "Done", "{v}");
    assert_eq!(i["detail"], "moved 2 connections");

    // A waiting failback: the CLI returns when the agent answers.
    let addr = sup.addr.clone();
    let cli = tokio::task::spawn_blocking(move || {
        common::cli(&addr, &["nic", "failback", "h0", "rail0"])
    });
    let o = tokio::time::timeout(Duration::from_secs(5), orders.message())
        .await
        .expect("order within 5 s")
        .unwrap()
        .unwrap();
    assert!(matches!(o.kind, Some(agent_order::Kind::Failback(_))));
    c.order_done(OrderResult {
        host: "h0".into(),
        order_id: o.order_id,
        ok: false,
        detail: "job train rank 0 did not answer".into(),
        checkpoint_step: None,
    })
    .await
    .unwrap();
    let out = cli.await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!("intent {} opened", o.order_id)),
        "{stdout}"
    );
    assert!(
        stderr.contains("failed: job train rank 0 did not answer"),
        "{stderr}"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(300), other.message())
            .await
            .is_err(),
        "h1's agent got no order"
    );
    // The history records who ordered what.
    let v = json(&sup.cli(&["-o", "json", "history"]));
    assert_eq!(v["records"].as_array().unwrap().len(), 2, "{v}");
}
