//! Contention in a real netns cluster (needs root; fails instead of
//! skipping when `CI` is set): the short form of `scenario contention`.
//! Two leaves joined by a 400 Mbit/s uplink, two ringtrain rings and a bulk
//! flow across it: the uplink is named, the senders are shaped (seen in
//! the kernel), and when the load ends every shape goes. Generous time
//! bounds; the 2 s detection goal is the scenario's own figure.

use std::time::Duration;

use chaos_tests::contention::{scenario, ContentionOpts};
use testbed::require_root;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uplink_queue_is_named_reshaped_and_the_shapes_removed() {
    if !require_root("contention_netns").unwrap() {
        return;
    }
    let v = scenario(&ContentionOpts {
        steps: 25,
        quiet: Duration::from_secs(15),
        deadline: Duration::from_secs(300),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(v["false_positives"], 0, "{v}");
    assert_eq!(v["link_named"], true, "{v}");
    assert_eq!(v["other_links_named"], 0, "{v}");
    let detect = v["detection_ms"].as_u64().expect("detected");
    assert!(detect <= 5_000, "{v}");
    let shaped = v["shaped_nics"].as_u64().unwrap();
    assert!(shaped >= 1, "{v}");
    assert_eq!(v["shapes_seen_in_kernel"].as_u64(), Some(shaped), "{v}");
    assert!(v["revert_ms"].as_u64().is_some(), "shapes removed: {v}");
    assert_eq!(v["leftover_qdiscs"], 0, "{v}");
    for j in v["jobs"].as_array().unwrap() {
        assert_eq!(j["state"], "succeeded", "{v}");
    }
}
