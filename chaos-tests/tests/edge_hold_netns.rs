//! The edge-holding signal on real namespaces (needs root; fails instead of
//! skipping when `CI` is set): rail 0 of a 3-host testbed is split into two
//! leaves (h0, h1 | h2) joined by a 100 Mbit/s uplink. Each host runs the
//! agent's probe mesh ([`nodeagent::probe::ProbeRunner`], in its namespace,
//! on a port of its own). With a TCP bulk flow h0 → h2 across the uplink,
//! the outgoing queueing h0 publishes for h2 rises well above 1 ms while
//! the one for h1 (same leaf) stays near zero; without the flow both are
//! near zero.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chaos_tests::bulk::BulkFlow;
use chaos_tests::testbed::{
    host_name, rail_addr, require_root, LeafSplit, Node, Testbed, TestbedOptions, TestbedSpec,
};
use nodeagent::link::PortEvent;
use nodeagent::probe::mesh::{PeerNic, PeerSpec, Plan};
use nodeagent::probe::queueing::QueueingBoard;
use nodeagent::probe::{MeshNic, ProbeOptions, ProbeRunner, Summary};
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
            leaf_split: Some(LeafSplit {
                rail: 0,
                right: vec![2],
                uplink_bps: UPLINK_BPS,
            }),
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

    // The queue drains: back to calm.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = watch(&board, &[h2], Duration::from_secs(1)).await;
    eprintln!("after: to h2 median {} µs", median(&after[0]));
    assert!(median(&after[0]) < 300, "queueing goes with the flow");
    drop(meshes);
    tb.teardown();
}
