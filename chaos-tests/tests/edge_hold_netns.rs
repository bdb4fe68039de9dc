//! The edge-holding signal on real namespaces (needs root; fails instead of
//! skipping when `CI` is set): rail 0 of a 3-host testbed is split into two
//! leaves (h0, h1 | h2) joined by a 100 Mbit/s uplink. Each host runs the
//! agent's probe mesh ([`nodeagent::probe::ProbeRunner`], in its namespace,
//! on a port of its own). With a TCP bulk flow h0 → h2 across the uplink,
//! the outgoing queueing h0 publishes for h2 rises well above 1 ms while
//! the one for h1 (same leaf) stays near zero; without the flow both are
//! near zero. And the whole chain on h0: a `ShapeNic` with
//! `hold_queueing_us` carried out by the agent's `Shaper` holds the job's
//! connection to h2 (not the one to h1) while the flow runs and releases
//! it after.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use nodeagent::agent::NicConfig;
use nodeagent::control::{bind, Control};
use nodeagent::hold::HOLD_RATE_BYTES_PER_S;
use nodeagent::link::PortEvent;
use nodeagent::probe::mesh::{PeerNic, PeerSpec, Plan};
use nodeagent::probe::queueing::QueueingBoard;
use nodeagent::probe::{MeshNic, ProbeOptions, ProbeRunner, Summary};
use nodeagent::shaping::{ShapeOrder, Shaper};
use proto::v1::{ClearShape, FlowMatch, PaceJob, ShapeClass, ShapeNic};
use rdma::contract::ConnUp;
use testbed::bulk::BulkFlow;
use testbed::jobsim::pacing_rank;
use testbed::{
    host_name, rail_addr, require_root, LeafSplit, Node, Testbed, TestbedOptions, TestbedSpec,
};
use tokio::sync::mpsc;

const HOSTS: usize = 3;
const PORT: u16 = 7991;
const UPLINK_BPS: u64 = 100_000_000;

/// One host's probe mesh and the receivers it needs alive.
struct Mesh {
    runner: ProbeRunner,
    _evidence: mpsc::Receiver<PortEvent>,
    _summaries: mpsc::Receiver<Summary>,
}

fn start_mesh(tb: &Testbed, h: usize) -> Mesh {
    let (ev_tx, ev_rx) = mpsc::channel(64);
    let (sum_tx, sum_rx) = mpsc::channel(4);
    let nics = vec![MeshNic {
        name: "rail0".into(),
        rail: 0,
        addr: rail_addr(h, 0),
    }];
    let opts = ProbeOptions {
        port: PORT,
        ..ProbeOptions::default()
    };
    let runner = tb
        .ns(Node::Host(h))
        .run(move || ProbeRunner::start(opts, &nics, ev_tx, sum_tx))
        .expect("enter the host's namespace")
        .unwrap_or_else(|e| panic!("probe mesh on h{h}: {e}"));
    let plan = Plan {
        self_id: h as u32,
        version: 1,
        peers: (0..HOSTS)
            .filter(|p| *p != h)
            .map(|p| PeerSpec {
                host: host_name(p),
                id: p as u32,
                nics: BTreeMap::from([(
                    0,
                    PeerNic {
                        nic: "rail0".into(),
                        addr: SocketAddrV4::new(rail_addr(p, 0), PORT),
                    },
                )]),
            })
            .collect(),
    };
    runner.set_plan(plan);
    Mesh {
        runner,
        _evidence: ev_rx,
        _summaries: sum_rx,
    }
}

/// Queueing samples (µs) to `addr` over `dur`, one per 10 ms look (fresh
/// samples only: at most 100 ms old).
async fn watch(board: &Arc<QueueingBoard>, addrs: &[Ipv4Addr], dur: Duration) -> Vec<Vec<i64>> {
    let mut out = vec![Vec::new(); addrs.len()];
    let end = Instant::now() + dur;
    while Instant::now() < end {
        let now = Instant::now();
        for (i, a) in addrs.iter().enumerate() {
            if let Some((q, age)) = board.queueing(*a, now) {
                if age <= Duration::from_millis(100) {
                    out[i].push(q / 1_000);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    out
}

fn median(v: &[i64]) -> i64 {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(i64::MAX)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outgoing_queueing_rises_across_a_loaded_uplink_only() {
    if !require_root("edge_hold_netns::queueing").unwrap() {
        return;
    }
    let mut tb = Testbed::build_with(
        TestbedSpec {
            supervisors: 0,
            hosts: HOSTS,
        },
        TestbedOptions {
            leaf_splits: vec![LeafSplit {
                rail: 0,
                right: vec![2],
                uplink_bps: UPLINK_BPS,
            }],
        },
    )
    .await
    .expect("testbed with a leaf split");
    let meshes: Vec<Mesh> = (0..HOSTS).map(|h| start_mesh(&tb, h)).collect();
    let board = meshes[0].runner.queueing();
    let (h1, h2) = (rail_addr(1, 0), rail_addr(2, 0));

    // Lines and baselines settle.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let calm = watch(&board, &[h1, h2], Duration::from_secs(2)).await;
    let (calm1, calm2) = (median(&calm[0]), median(&calm[1]));
    eprintln!(
        "calm: to h1 {} samples, median {calm1} µs, max {:?} µs; to h2 {} samples, median {calm2} µs, max {:?} µs",
        calm[0].len(),
        calm[0].iter().max(),
        calm[1].len(),
        calm[1].iter().max()
    );
    assert!(calm[0].len() > 100 && calm[1].len() > 100, "fresh samples");
    assert!(calm1 < 300 && calm2 < 300, "calm paths show no queueing");

    let flow = tokio::task::block_in_place(|| {
        BulkFlow::start(&tb, 0, 2, 0, 5201, Duration::from_secs(30)).expect("bulk h0 → h2")
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let loaded = watch(&board, &[h1, h2], Duration::from_secs(3)).await;
    let report = tokio::task::block_in_place(|| flow.stop()).expect("stop the bulk flow");
    let (load1, load2) = (median(&loaded[0]), median(&loaded[1]));
    eprintln!(
        "loaded ({:.1} Mbit/s h0 → h2): to h1 {} samples, median {load1} µs, max {:?} µs; to h2 {} samples, median {load2} µs, max {:?} µs",
        report.mbps,
        loaded[0].len(),
        loaded[0].iter().max(),
        loaded[1].len(),
        loaded[1].iter().max()
    );
    assert!(
        report.mbps < 1.2 * UPLINK_BPS as f64 / 1e6,
        "the uplink holds the flow"
    );
    assert!(load2 > 1_000, "queueing to h2 above 1 ms across the uplink");
    assert!(load1 < 300, "queueing to h1 (same leaf) near zero");

    // The queue drains: back to calm (within a generous bound: on a busy
    // machine the last of the flow can take a few seconds to leave).
    let mut after = Vec::new();
    for _ in 0..8 {
        let w = watch(&board, &[h2], Duration::from_secs(1)).await;
        after.push(median(&w[0]));
        if after.last().is_some_and(|m| *m < 300) {
            break;
        }
    }
    eprintln!("after: to h2 medians {after:?} µs (one a second)");
    assert!(
        after.last().is_some_and(|m| *m < 300),
        "queueing goes with the flow"
    );
    drop(meshes);
    tb.teardown();
}

fn split_testbed() -> TestbedOptions {
    TestbedOptions {
        leaf_splits: vec![LeafSplit {
            rail: 0,
            right: vec![2],
            uplink_bps: UPLINK_BPS,
        }],
    }
}

async fn next_pace(
    rx: &mut mpsc::UnboundedReceiver<(u64, Option<u64>)>,
    within: Duration,
) -> Option<(u64, Option<u64>)> {
    tokio::time::timeout(within, rx.recv()).await.ok().flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shape_order_with_edge_hold_holds_the_connection_to_the_loaded_peer() {
    if !require_root("edge_hold_netns::hold").unwrap() {
        return;
    }
    let mut tb = Testbed::build_with(
        TestbedSpec {
            supervisors: 0,
            hosts: HOSTS,
        },
        split_testbed(),
    )
    .await
    .expect("testbed with a leaf split");
    let meshes: Vec<Mesh> = (0..HOSTS).map(|h| start_mesh(&tb, h)).collect();
    let (h1, h2) = (rail_addr(1, 0), rail_addr(2, 0));

    // h0's agent side: control socket, shaper fed by its probe mesh.
    let nics = vec![NicConfig {
        name: "rail0".into(),
        rail: Some(0),
        backup: None,
        rdma_device: None,
        addr: Some(rail_addr(0, 0)),
    }];
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("h0.sock");
    let control = Control::new(nics.clone());
    tokio::spawn(control.clone().serve(bind(&sock, None).unwrap()));
    let nl = tb.ns(Node::Host(0)).netlink().expect("netlink in h0");
    assert!(nl
        .link()
        .get()
        .match_name("rail0".to_string())
        .execute()
        .try_next()
        .await
        .expect("find rail0")
        .is_some());
    let shaper = Shaper::new(nl, nics, control.clone());
    shaper.attach_queueing(meshes[0].runner.queueing());

    // Job a, rank 0 on h0: connection 1 to h2 (across the uplink), 2 to h1.
    let (job, mut paces) = pacing_rank(&sock, "a").await.unwrap();
    for (id, peer) in [(1, "h2"), (2, "h1")] {
        job.conn_up(ConnUp {
            job: "a".into(),
            rank: 0,
            conn_id: id,
            nic: "rail0".into(),
            peer_host: peer.into(),
            peer_rank: 1,
            rail: 0,
        })
        .await
        .unwrap();
    }
    // Lines and baselines settle.
    tokio::time::sleep(Duration::from_secs(5)).await;

    // The job's class (its port to h1 and h2) and the pace; the bulk flow
    // (another port) takes the default class: the uplink stays the
    // bottleneck.
    let flow = |dst: Ipv4Addr, dst_port, src_port| FlowMatch {
        dst: dst.to_string(),
        protocol: 6,
        dst_port,
        src_port,
    };
    let order = ShapeNic {
        nic: "rail0".into(),
        classes: vec![ShapeClass {
            minor: 0x10,
            rate_bps: 500_000_000,
            ceil_bps: 500_000_000,
            flows: vec![
                flow(h2, 5301, 0),
                flow(h2, 0, 5301),
                flow(h1, 5301, 0),
                flow(h1, 0, 5301),
            ],
            label: "job a".into(),
            job: "a".into(),
        }],
        default_rate_bps: 1_000_000_000,
        pace: vec![PaceJob {
            job: "a".into(),
            rate_bps: 50_000_000,
        }],
        hold_queueing_us: 1_000,
    };
    let (ok, detail) = shaper.execute(&ShapeOrder::Shape(order)).await;
    eprintln!("shape: {detail}");
    assert!(ok, "{detail}");
    assert!(
        detail.contains("edge hold at 1000 µs for 1 jobs"),
        "{detail}"
    );
    let release = Some(50_000_000 / 8);
    let mut initial = vec![
        next_pace(&mut paces, Duration::from_secs(1)).await,
        next_pace(&mut paces, Duration::from_secs(1)).await,
    ];
    initial.sort();
    assert_eq!(initial, vec![Some((1, release)), Some((2, release))]);
    assert_eq!(
        next_pace(&mut paces, Duration::from_millis(500)).await,
        None,
        "calm: nothing held"
    );

    let f = tokio::task::block_in_place(|| {
        BulkFlow::start(&tb, 0, 2, 0, 5202, Duration::from_secs(30)).expect("bulk h0 → h2")
    });
    let t = Instant::now();
    let held = next_pace(&mut paces, Duration::from_secs(3)).await;
    let hold_after = t.elapsed();
    assert_eq!(
        held,
        Some((1, Some(HOLD_RATE_BYTES_PER_S))),
        "h2's connection held"
    );
    // Let it run; count what the loop does (only connection 1 moves).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let report = tokio::task::block_in_place(|| f.stop()).expect("stop the bulk flow");
    let mut during = Vec::new();
    while let Ok(p) = paces.try_recv() {
        during.push(p);
    }
    assert!(during.iter().all(|(c, _)| *c == 1), "{during:?}");
    // After the flow the last order for connection 1 is its release.
    let mut last = during
        .last()
        .copied()
        .unwrap_or((1, Some(HOLD_RATE_BYTES_PER_S)));
    let t = Instant::now();
    let mut released_after = Duration::ZERO;
    while let Some(p) = next_pace(&mut paces, Duration::from_secs(2)).await {
        assert_eq!(p.0, 1, "{p:?}");
        last = p;
        released_after = t.elapsed();
    }
    eprintln!(
        "bulk {:.1} Mbit/s; held {} ms after the flow started; {} pace orders while it ran; counters {:?}; last order {} ms after it stopped",
        report.mbps,
        hold_after.as_millis(),
        during.len(),
        shaper.holds(),
        released_after.as_millis()
    );
    assert_eq!(last, (1, release), "released at the order's pace");
    let c = shaper.holds();
    assert_eq!(c.len(), 1);
    assert!(c[0].1.holds >= 1 && c[0].1.held_now == 0, "{c:?}");

    let (ok, detail) = shaper
        .execute(&ShapeOrder::Clear(ClearShape {
            nic: "rail0".into(),
        }))
        .await;
    eprintln!("clear: {detail}");
    assert!(ok && detail.contains("edge hold stopped ("), "{detail}");
    assert!(shaper.holds().is_empty());
    let mut unpaced = vec![
        next_pace(&mut paces, Duration::from_secs(1)).await,
        next_pace(&mut paces, Duration::from_secs(1)).await,
    ];
    unpaced.sort();
    assert_eq!(unpaced, vec![Some((1, None)), Some((2, None))]);
    drop(meshes);
    tb.teardown();
}
