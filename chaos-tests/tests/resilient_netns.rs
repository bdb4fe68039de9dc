//! The resilient connection over real veth rails in network namespaces
//! (needs root; fails instead of skipping when `CI` is set): exactly-once
//! delivery through flaps and an outage, loud failure past the stall
//! timeout, failback to the primary, pacing, and refusal of bad input.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chaos_tests::qp::{self, HostTraffic, Sizes, TrafficSpec};
use rdma::resilient::{ConnConfig, ConnError, MoveReason, Rail, ResilientConnection};
use rdma::soft::Endpoint;
use testbed::{rail_addr, require_root, Node, Side, Testbed, TestbedSpec};

async fn two_hosts() -> Testbed {
    Testbed::build(TestbedSpec {
        supervisors: 0,
        hosts: 2,
    })
    .await
    .unwrap()
}

fn spec(stall: Duration, failback: bool) -> TrafficSpec {
    TrafficSpec {
        conns: 2,
        sizes: Sizes::Mixed { max: 256 << 10 },
        rate_per_conn: Some(2 << 20),
        both_ways: true,
        failback,
        window_bytes: 8 << 20,
        stall_timeout: stall,
        seed: 1,
        agent: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_qp_migrate_scenario_loses_nothing_short_form() {
    if !require_root("resilient_netns::qp_migrate_short").unwrap() {
        return;
    }
    let r = qp::qp_migrate(qp::QpMigrateRun {
        flaps: 12,
        conns: 3,
        max_message: 1 << 20,
        seed: 21,
        outage: Duration::from_millis(1200),
    })
    .await
    .unwrap();
    assert!(r.ok, "{r:?}");
    assert_eq!(
        (r.totals.lost, r.totals.duplicated, r.totals.reordered),
        (0, 0, 0)
    );
    assert_eq!(r.totals.bad_checksum, 0);
    assert!(r.totals.migrations > 0, "{r:?}");
    assert_eq!(r.totals.messages, r.totals.messages_sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_rail_past_the_stall_timeout_fails_loudly() {
    if !require_root("resilient_netns::stall_timeout").unwrap() {
        return;
    }
    let mut tb = two_hosts().await;
    let (a, b) = HostTraffic::start_pair(&tb, spec(Duration::from_secs(1), false)).unwrap();
    assert!(qp::wait_established(&a, &b, Duration::from_secs(10)).await);
    // Both rails of h1 down for longer than the stall timeout.
    tb.set_host_nic(1, 0, false).await.unwrap();
    tb.set_fabric_link(1, 1, false).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let failed = |h: &HostTraffic| {
        h.errors
            .lock()
            .unwrap()
            .iter()
            .any(|e| e.contains("no usable rail"))
    };
    while !(failed(&a) && failed(&b)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(failed(&a), "h0 errors: {:?}", a.errors.lock().unwrap());
    assert!(failed(&b), "h1 errors: {:?}", b.errors.lock().unwrap());
    // Nothing was delivered twice or out of order before the failure.
    for h in [&a, &b] {
        for rx in &h.rx {
            assert_eq!(rx.duplicated.load(Ordering::SeqCst), 0);
            assert_eq!(rx.reordered.load(Ordering::SeqCst), 0);
            assert_eq!(rx.bad_checksum.load(Ordering::SeqCst), 0);
        }
    }
    a.join();
    b.join();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_shorter_than_the_timeout_resumes_and_failback_returns_to_the_primary() {
    if !require_root("resilient_netns::failback").unwrap() {
        return;
    }
    let mut tb = two_hosts().await;
    let (a, b) = HostTraffic::start_pair(&tb, spec(Duration::from_secs(20), true)).unwrap();
    assert!(qp::wait_established(&a, &b, Duration::from_secs(10)).await);
    let on = |h: &HostTraffic, rail| h.conn_stats().iter().all(|s| s.rail == Some(rail));
    // Under load a first dial of the primary can miss its connect timeout,
    // so a connection may begin on the backup; failback brings it home.
    let home = Instant::now() + Duration::from_secs(10);
    while !on(&a, 0) && Instant::now() < home {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        on(&a, 0),
        "connections on their primary: {:?}",
        a.conn_stats()
    );
    // Both rails of h1 down for 1.5 s: stall, then resume.
    tb.set_host_nic(1, 1, false).await.unwrap();
    tb.set_host_nic(1, 0, false).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    tb.set_host_nic(1, 0, true).await.unwrap();
    tb.set_host_nic(1, 1, true).await.unwrap();
    assert!(qp::wait_established(&a, &b, Duration::from_secs(10)).await);
    // The primary goes down (fabric side of h0): everything moves to rail 1.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    tb.set_cable(0, 0, Side::Fabric, false).await.unwrap();
    while !(on(&a, 1) && on(&b, 1)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(on(&a, 1) && on(&b, 1), "{:?}", a.conn_stats());
    tb.set_cable(0, 0, Side::Fabric, true).await.unwrap();
    // One flap is below the damper's suppress threshold: after the hold the
    // connections go back to the primary.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(on(&a, 0) && on(&b, 0)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(on(&a, 0) && on(&b, 0), "{:?}", a.conn_stats());
    assert!(
        a.conn_stats()
            .iter()
            .chain(b.conn_stats().iter())
            .any(|s| s.last_reason == Some(MoveReason::Failback)),
        "no connection failed back: {:?} / {:?}",
        a.conn_stats(),
        b.conn_stats()
    );
    assert!(qp::drain(&a, &b, Duration::from_secs(20)).await);
    let t = qp::totals(&a, &b);
    a.join();
    b.join();
    assert_eq!(
        (t.lost, t.duplicated, t.reordered, t.bad_checksum),
        (0, 0, 0, 0),
        "{t:?}"
    );
    assert!(t.messages > 0);
}

fn rails(peer: usize, port: u16) -> Vec<Rail> {
    (0..2)
        .map(|r| Rail {
            nic: r,
            remote: SocketAddr::new(rail_addr(peer, r).into(), port),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pacing_limits_the_rate_and_bad_input_is_refused() {
    if !require_root("resilient_netns::pacing").unwrap() {
        return;
    }
    let tb = two_hosts().await;
    const PORT: u16 = 7900;
    const RATE: u64 = 4 << 20;
    let rx = qp::spawn_in(tb.ns(Node::Host(1)), move || async move {
        let ep = Arc::new(Endpoint::bind(qp::host_nics(1), PORT).await?);
        let mut conn = ResilientConnection::open(
            ep,
            ConnConfig::new(5, rdma::resilient::Side::B, rails(0, PORT)),
        )?;
        let mut got = 0u64;
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(3) {
            match tokio::time::timeout(Duration::from_millis(200), conn.recv()).await {
                Ok(m) => got += m?.len() as u64,
                Err(_) => continue,
            }
        }
        anyhow::Ok(got)
    })
    .unwrap();
    let tx = qp::spawn_in(tb.ns(Node::Host(0)), move || async move {
        let ep = Arc::new(Endpoint::bind(qp::host_nics(0), PORT).await?);
        let mut cfg = ConnConfig::new(5, rdma::resilient::Side::A, rails(1, PORT));
        cfg.max_message = 1 << 20;
        // Bad settings are refused before anything starts.
        let mut bad = cfg.clone();
        bad.conn_id = 6;
        bad.rails[1].nic = 9;
        assert!(matches!(
            ResilientConnection::open(ep.clone(), bad),
            Err(ConnError::Config(_))
        ));
        let conn = ResilientConnection::open(ep.clone(), cfg)?;
        // A second connection with the same id on this endpoint is refused.
        assert!(ResilientConnection::open(
            ep.clone(),
            ConnConfig::new(5, rdma::resilient::Side::A, rails(1, PORT))
        )
        .is_err());
        // Too large a message: a clear error, nothing sent.
        let big = Bytes::from(vec![0u8; (1 << 20) + 1]);
        assert!(matches!(
            conn.send(big).await,
            Err(ConnError::TooLarge { .. })
        ));
        conn.set_rate(Some(RATE)).await?;
        let chunk = Bytes::from(vec![1u8; 64 << 10]);
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(2500) {
            conn.send(chunk.clone()).await?;
        }
        anyhow::Ok(())
    })
    .unwrap();
    qp::join(tx).unwrap();
    let got = qp::join(rx).unwrap();
    // 2.5 s of sending at 4 MiB/s (plus a burst allowance), never much more.
    let limit = (RATE as f64 * 2.5 * 1.3) as u64 + (1 << 20);
    assert!(
        got <= limit,
        "paced connection delivered {got} bytes (limit {limit})"
    );
    assert!(got >= RATE, "paced connection delivered only {got} bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nic_held_out_of_service_is_left_and_not_failed_back_to_until_released() {
    if !require_root("resilient_netns::held_out").unwrap() {
        return;
    }
    let tb = two_hosts().await;
    const PORT: u16 = 7910;
    let hold = Duration::from_millis(300);
    let cfg = move |side, peer| {
        let mut c = ConnConfig::new(11, side, rails(peer, PORT));
        if let rdma::resilient::Failback::WhenReusable { hold: h, .. } = &mut c.failback {
            *h = hold;
        }
        c
    };
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let b = qp::spawn_in(tb.ns(Node::Host(1)), move || async move {
        let ep = Arc::new(Endpoint::bind(qp::host_nics(1), PORT).await?);
        let mut conn = ResilientConnection::open(ep, cfg(rdma::resilient::Side::B, 0))?;
        let mut got = 0u64;
        while stop_rx.try_recv().is_err() {
            if let Ok(m) = tokio::time::timeout(Duration::from_millis(100), conn.recv()).await {
                m?;
                got += 1;
            }
        }
        anyhow::Ok(got)
    })
    .unwrap();
    let a = qp::spawn_in(tb.ns(Node::Host(0)), move || async move {
        let ep = Arc::new(Endpoint::bind(qp::host_nics(0), PORT).await?);
        let (held_tx, held_rx) = tokio::sync::watch::channel(std::collections::BTreeSet::new());
        ep.follow_held(held_rx);
        let conn = ResilientConnection::open(ep, cfg(rdma::resilient::Side::A, 1))?;
        let stats = conn.watch_stats();
        let sender = tokio::spawn(async move {
            let mut sent = 0u64;
            loop {
                if conn.send(Bytes::from_static(b"step")).await.is_err() {
                    return sent;
                }
                sent += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        let rail = || stats.borrow().rail;
        let wait_rail = |want: usize, within: Duration| {
            let stats = stats.clone();
            async move {
                let end = Instant::now() + within;
                while stats.borrow().rail != Some(want) && Instant::now() < end {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                stats.borrow().rail == Some(want)
            }
        };
        anyhow::ensure!(
            wait_rail(0, Duration::from_secs(10)).await,
            "never on rail 0"
        );
        // An admin holds rail0 out of service: the connection leaves it,
        // and after many failback holds it is still off it.
        held_tx.send_replace(["rail0".to_string()].into());
        anyhow::ensure!(
            wait_rail(1, Duration::from_secs(5)).await,
            "did not leave rail0"
        );
        let reason = stats.borrow().last_reason;
        anyhow::ensure!(reason == Some(MoveReason::Order), "moved for {reason:?}");
        let end = Instant::now() + 10 * hold;
        while Instant::now() < end {
            anyhow::ensure!(rail() == Some(1), "failed back to a held NIC: {:?}", rail());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Released: the connection fails back to its primary by itself
        // (this side's failback, or the peer's, whichever dials first).
        held_tx.send_replace(Default::default());
        anyhow::ensure!(
            wait_rail(0, Duration::from_secs(5)).await,
            "no failback after release"
        );
        let reason = stats.borrow().last_reason;
        anyhow::ensure!(
            matches!(reason, Some(MoveReason::Failback | MoveReason::PeerMoved)),
            "moved for {reason:?}"
        );
        sender.abort();
        anyhow::Ok(())
    })
    .unwrap();
    let r = qp::join(a);
    let _ = stop_tx.send(());
    r.unwrap();
    assert!(qp::join(b).unwrap() > 0, "messages flowed");
}
