//! Edge holding end to end inside one process: a job on the control socket
//! (answering pace orders), a queueing board fed by hand, and a hold loop
//! for rail0. Checks targets (NIC, job, peer destination), hysteresis,
//! stale samples, the release pace and the release on stop.

/// The testbed's job stand-in, compiled from source: testbed depends on
/// nodeagent, so nodeagent cannot take it as a dev-dependency.
#[path = "../../testbed/src/jobsim.rs"]
mod jobsim;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nodeagent::agent::NicConfig;
use nodeagent::control::{bind, Control};
use nodeagent::hold::{HoldLoop, HoldSpec, JobHold, HOLD_RATE_BYTES_PER_S};
use nodeagent::probe::queueing::{OutgoingSample, QueueingBoard};
use rdma::contract::ConnUp;
use tokio::sync::{mpsc, watch};

const H1: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const H2: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 3);
const RELEASE: u64 = 6_250_000;

fn nic(name: &str, rail: u32) -> NicConfig {
    NicConfig {
        name: name.into(),
        rail: Some(rail),
        backup: None,
        rdma_device: None,
        addr: None,
    }
}

fn up(conn_id: u64, nic: &str, rail: u32, peer: &str) -> ConnUp {
    ConnUp {
        job: "train".into(),
        rank: 0,
        conn_id,
        nic: nic.into(),
        peer_host: peer.into(),
        peer_rank: 1,
        rail,
    }
}

/// Publishes `queueing` (ns) to h1 every 5 ms with a fresh sample while
/// it is Some; h2 always calm.
fn feeder(board: Arc<QueueingBoard>, queueing: watch::Receiver<Option<i64>>) {
    tokio::spawn(async move {
        loop {
            let now = Instant::now();
            let s = |q: i64| OutgoingSample {
                tx_ns: 0,
                owd_ns: 20_000 + q,
                baseline_ns: 20_000,
                queueing_ns: q,
                at: now,
            };
            let q = *queueing.borrow();
            let mut v = vec![(H2, "h2", 0, s(0))];
            if let Some(q) = q {
                v.push((H1, "h1", 0, s(q)));
            }
            board.publish(1, v.iter().map(|(a, p, r, s)| (*a, *p, *r, *s)));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
}

async fn next_pace(rx: &mut mpsc::UnboundedReceiver<(u64, Option<u64>)>) -> (u64, Option<u64>) {
    tokio::time::timeout(Duration::from_secs(2), rx.recv())
        .await
        .expect("a pace order within 2 s")
        .expect("job alive")
}

async fn quiet(rx: &mut mpsc::UnboundedReceiver<(u64, Option<u64>)>, ms: u64) {
    if let Ok(Some(p)) = tokio::time::timeout(Duration::from_millis(ms), rx.recv()).await {
        panic!("unexpected pace order {p:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_while_queueing_to_the_peer_is_high_released_with_hysteresis_and_on_stop() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    let control = Control::new(vec![nic("rail0", 0), nic("rail1", 1)]);
    tokio::spawn(control.clone().serve(bind(&sock, None).unwrap()));
    let (job, mut paces) = jobsim::pacing_rank(&sock, "train").await.unwrap();
    // 1: rail0 → h1 (a target); 2: rail0 → h2 (not a class destination);
    // 3: rail1 → h1 (another NIC).
    job.conn_up(up(1, "rail0", 0, "h1")).await.unwrap();
    job.conn_up(up(2, "rail0", 0, "h2")).await.unwrap();
    job.conn_up(up(3, "rail1", 1, "h1")).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    while control.conns().len() < 3 {
        assert!(Instant::now() < deadline, "connections registered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let board = QueueingBoard::new();
    let (q_tx, q_rx) = watch::channel(Some(0i64));
    feeder(board.clone(), q_rx);
    let spec = HoldSpec {
        nic: "rail0".into(),
        rail: 0,
        threshold_ns: 1_000_000,
        jobs: BTreeMap::from([(
            "train".to_string(),
            JobHold {
                dsts: [H1].into(),
                release_bytes_per_s: Some(RELEASE),
            },
        )]),
    };
    let hold = HoldLoop::start(spec, control.clone(), board.clone());
    quiet(&mut paces, 300).await;
    assert_eq!(hold.counters().targets, 1, "{:?}", hold.counters());

    // 3 ms of queueing to h1: connection 1 only is held.
    let t = Instant::now();
    q_tx.send_replace(Some(3_000_000));
    assert_eq!(
        next_pace(&mut paces).await,
        (1, Some(HOLD_RATE_BYTES_PER_S))
    );
    let reaction = t.elapsed();
    // Hysteresis: 0.8 ms (below the threshold, above half) keeps it held.
    q_tx.send_replace(Some(800_000));
    quiet(&mut paces, 300).await;
    // 0.3 ms releases it at the order's pace.
    q_tx.send_replace(Some(300_000));
    assert_eq!(next_pace(&mut paces).await, (1, Some(RELEASE)));
    // Held again, then the samples go stale: released.
    q_tx.send_replace(Some(3_000_000));
    assert_eq!(
        next_pace(&mut paces).await,
        (1, Some(HOLD_RATE_BYTES_PER_S))
    );
    let t = Instant::now();
    q_tx.send_replace(None);
    assert_eq!(next_pace(&mut paces).await, (1, Some(RELEASE)));
    let stale_release = t.elapsed();
    // Held once more; stopping the loop releases it.
    q_tx.send_replace(Some(3_000_000));
    assert_eq!(
        next_pace(&mut paces).await,
        (1, Some(HOLD_RATE_BYTES_PER_S))
    );
    let c = hold.stop().await;
    assert_eq!(next_pace(&mut paces).await, (1, Some(RELEASE)));
    quiet(&mut paces, 100).await;
    assert_eq!((c.holds, c.releases, c.held_now), (3, 3, 0), "{c:?}");
    assert_eq!((c.dropped, c.order_failures), (0, 0), "{c:?}");
    assert!(c.held >= Duration::from_millis(300), "{c:?}");
    eprintln!(
        "hold reaction {} ms, stale release {} ms, counters: {c}",
        reaction.as_millis(),
        stale_release.as_millis()
    );
    assert!(reaction < Duration::from_millis(100), "{reaction:?}");
    assert!(
        stale_release >= Duration::from_millis(90) && stale_release < Duration::from_millis(300),
        "{stale_release:?}"
    );
}
