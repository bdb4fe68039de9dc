//! The leaf split (TESTBED.md, "Contention") on real namespaces (needs
//! root; fails instead of skipping when `CI` is set): rail 0 of a 4-host
//! testbed is two leaf bridges (h0, h1 | h2, h3) joined by a 100 Mbit/s
//! uplink shaped by our HTB code. A bulk flow across the uplink is held to
//! its rate, one within a leaf (or on the unsplit rail) is not; the uplink
//! ends carry our HTB; the topology written for the supervisors routes
//! across the uplink exactly between leaves, and a cluster starts on it;
//! nothing is left behind.

use std::time::Duration;

use supervisor::topology::Topology;
use tc_htb::DEFAULT_MINOR;
use testbed::bulk::{BulkFlow, BulkReport};
use testbed::netcluster::{NetCluster, NetClusterOptions};
use testbed::{netns, require_root, LeafSplit, Testbed, TestbedOptions, TestbedSpec};

const UPLINK_BPS: u64 = 100_000_000;

fn split() -> LeafSplit {
    LeafSplit {
        rail: 0,
        right: vec![2, 3],
        uplink_bps: UPLINK_BPS,
    }
}

/// Runs one bulk flow for `secs` and reports (blocking, off the runtime's
/// async threads).
fn bulk(tb: &Testbed, from: usize, to: usize, rail: usize, port: u16, secs: u64) -> BulkReport {
    tokio::task::block_in_place(|| {
        let f = BulkFlow::start(tb, from, to, rail, port, Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("start h{from}→h{to} rail{rail}: {e}"));
        std::thread::sleep(Duration::from_secs(secs));
        let r = f.stop().expect("stop bulk flow");
        eprintln!(
            "bulk h{from}→h{to} rail{rail}: {} B sent, {} B received in {:.2} s = {:.1} Mbit/s",
            r.bytes_sent, r.bytes_received, r.secs, r.mbps
        );
        r
    })
}

fn crosses_uplink(t: &Topology, a: &str, b: &str, nic: &str) -> bool {
    t.route(a, nic, b, nic)
        .unwrap_or_else(|| panic!("no route {a}:{nic} → {b}:{nic}"))
        .iter()
        .any(|d| d.link == "rail0-uplink")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shaped_uplink_holds_only_cross_leaf_traffic() {
    if !require_root("leaf_split_netns::uplink").unwrap() {
        return;
    }
    let mut tb = Testbed::build_with(
        TestbedSpec {
            supervisors: 0,
            hosts: 4,
        },
        TestbedOptions {
            leaf_splits: vec![split()],
        },
    )
    .await
    .expect("build split testbed");
    let names = tb.namespace_names();

    // The topology describes what was built.
    let text = toml::to_string(&tb.topology()).unwrap();
    let t = Topology::parse(&text).expect("written topology loads");
    assert!(crosses_uplink(&t, "h0", "h2", "rail0"));
    assert!(crosses_uplink(&t, "h3", "h1", "rail0"));
    assert!(!crosses_uplink(&t, "h0", "h1", "rail0"));
    assert!(!crosses_uplink(&t, "h2", "h3", "rail0"));
    assert!(!crosses_uplink(&t, "h0", "h2", "rail1"));
    assert_eq!(t.link("rail0-uplink").unwrap().rate_bps, Some(UPLINK_BPS));

    // Both uplink ends carry our HTB: root qdisc 1: defaulting to class
    // 1:fffe at rate = ceil = the uplink rate.
    let (a, b) = tb.uplink_shaping().await.expect("dump uplink qdiscs");
    for (end, i) in [("up0a", &a), ("up0b", &b)] {
        let q = i.qdisc.as_ref().unwrap_or_else(|| panic!("{end}: no HTB"));
        assert_eq!(q.default_minor, DEFAULT_MINOR, "{end}: {i:?}");
        let d = i
            .class(DEFAULT_MINOR)
            .unwrap_or_else(|| panic!("{end}: no default class: {i:?}"));
        assert_eq!((d.rate_bps, d.ceil_bps), (UPLINK_BPS, UPLINK_BPS), "{end}");
    }

    // Across the uplink: held to its rate (generous bounds; goodput is a
    // little below the wire rate).
    let before = tb.uplink_stats().await.unwrap();
    let cross = bulk(&tb, 0, 2, 0, 5400, 4);
    let after = tb.uplink_stats().await.unwrap();
    assert!(
        (80.0..=100.0).contains(&cross.mbps),
        "cross-leaf flow at {:.1} Mbit/s, uplink {} Mbit/s",
        cross.mbps,
        UPLINK_BPS / 1_000_000
    );
    let up_bytes = after.leaf0_to_leaf1_bytes - before.leaf0_to_leaf1_bytes;
    assert!(
        up_bytes >= cross.bytes_received,
        "up0a sent {up_bytes} B < {} B received across it",
        cross.bytes_received
    );
    assert!(
        after.leaf1_to_leaf0_bytes > before.leaf1_to_leaf0_bytes,
        "the ACKs cross up0b"
    );
    eprintln!(
        "uplink: leaf0→leaf1 {up_bytes} B, leaf1→leaf0 {} B (ACKs)",
        after.leaf1_to_leaf0_bytes - before.leaf1_to_leaf0_bytes
    );
    let (a, _) = tb.uplink_shaping().await.unwrap();
    let sent = a.class(DEFAULT_MINOR).unwrap().sent_bytes;
    assert!(
        sent >= cross.bytes_received,
        "HTB default class of up0a sent {sent} B < {} B",
        cross.bytes_received
    );

    // Within a leaf, and on the unsplit rail: not held to the uplink rate.
    let before = tb.uplink_stats().await.unwrap();
    let same = bulk(&tb, 0, 1, 0, 5401, 2);
    let after = tb.uplink_stats().await.unwrap();
    assert!(
        same.mbps > 200.0,
        "same-leaf flow at {:.1} Mbit/s",
        same.mbps
    );
    assert!(
        after.leaf0_to_leaf1_bytes - before.leaf0_to_leaf1_bytes < same.bytes_received / 100,
        "same-leaf traffic stays off the uplink"
    );
    let other_rail = bulk(&tb, 0, 2, 1, 5402, 2);
    assert!(
        other_rail.mbps > 200.0,
        "rail1 (not split) flow at {:.1} Mbit/s",
        other_rail.mbps
    );

    tb.teardown();
    for n in &names {
        assert!(netns::list(n).is_empty(), "{n} removed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn supervisors_start_on_the_written_topology() {
    if !require_root("leaf_split_netns::netcluster").unwrap() {
        return;
    }
    let c = NetCluster::start_opts(
        TestbedSpec {
            supervisors: 1,
            hosts: 4,
        },
        NetClusterOptions {
            leaf_splits: vec![split()],
            ..Default::default()
        },
    )
    .await
    .expect("start cluster with a leaf split");
    let path = c.topology_file().expect("topology written").to_path_buf();
    let t = Topology::load(&path).expect("written topology loads");
    assert_eq!(t.file(), &c.tb.topology());
    assert_eq!(t.switch_of("h2", "rail0"), Some("rail0-leaf1"));
    c.wait_until("a leader", Duration::from_secs(20), |c| c.has_leader())
        .await
        .unwrap();
    c.wait_until("all 8 NICs up", Duration::from_secs(20), |c| {
        c.nics_up() == 8
    })
    .await
    .unwrap();
    let names = c.tb.namespace_names();
    drop(c);
    for n in &names {
        assert!(netns::list(n).is_empty(), "{n} removed");
    }
}
