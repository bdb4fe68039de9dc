//! The probe mesh in a real netns cluster (needs root; fails instead of
//! skipping when `CI` is set): short forms of `probe-blackhole`,
//! `mgmt-partition`, `bench clock-sync` and the clock part of
//! `disk-faults`, with generous bounds (the tight figures come from the
//! benchmarks).

use std::time::Duration;

use chaos_tests::{clock_sync, probe_scenarios};
use testbed::require_root;

/// Held by the tests that load the fabric and by those that need it
/// quiet. Every namespace's packets are forwarded by the same CPUs'
/// backlogs, so cross traffic in one test's cluster queues the probes of
/// another's: the clock-step test, run beside the cross-traffic one under
/// CI's load, once found real (CPU) queueing and opened `link_contention`
/// incidents that no clock step caused.
static FABRIC: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silently_dead_nic_goes_down_from_probe_loss_and_comes_back() {
    if !require_root("probe_netns::blackhole").unwrap() {
        return;
    }
    // Four hosts: the dead NIC's host has three witnesses on the rail.
    let r = probe_scenarios::probe_blackhole(probe_scenarios::BlackholeRun {
        hosts: 4,
        rounds: 2,
        hold: Duration::from_millis(800),
        seed: 5,
    })
    .await
    .unwrap();
    assert!(r.ok, "{r:?}");
    assert!(
        r.netlink_stayed_up,
        "the fault must be invisible to netlink"
    );
    assert!(r.others_stayed_up && r.committed_link_down, "{r:?}");
    // Generous: the goal (1 s) is checked by the scenario's own figures.
    assert!(r.detect_max_ms < 5_000, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_management_partition_makes_a_host_suspect_never_down() {
    if !require_root("probe_netns::mgmt_partition").unwrap() {
        return;
    }
    let r = probe_scenarios::mgmt_partition(probe_scenarios::MgmtPartitionRun {
        hosts: 3,
        cut: Duration::from_secs(5),
        seed: 2,
    })
    .await
    .unwrap();
    assert!(r.ok, "{r:?}");
    assert!(r.went_suspect && !r.went_down, "{r:?}");
    assert_eq!(r.host_down_incidents, 0);
    assert!(r.outbox_drained && r.outbox_transitions >= 2, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clocks_converge_against_the_injected_truth() {
    if !require_root("probe_netns::clock_sync").unwrap() {
        return;
    }
    let r = clock_sync::run(clock_sync::ClockSyncRun {
        converge_timeout: Duration::from_secs(45),
        ..clock_sync::ClockSyncRun::idle(4, 5, 3)
    })
    .await
    .unwrap();
    assert!(r.ok, "{r:?}");
    // Offsets up to ±1 s and drifts up to ±200 ppm come down to
    // microseconds; the benchmark reports the real (sub-µs) figures.
    assert!(r.railguard.p99_ns < 20_000.0, "{:?}", r.railguard);
    assert!(r.railguard.samples >= 3 * 3, "{:?}", r.railguard);
    // The agents report their probe rate and the default budget.
    let rate = &r.probe_pairs_per_s_per_peer;
    assert_eq!(
        (rate.configured, rate.cpu_budget_pct),
        (100, 1.0),
        "{rate:?}"
    );
    assert!(rate.min >= 25.0 && rate.max <= 100.0, "{rate:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_thread_over_its_cpu_budget_slows_down_and_clocks_still_hold() {
    if !require_root("probe_netns::cpu_budget").unwrap() {
        return;
    }
    // 0.05 % of a core is far below what 100 pairs/s per peer costs on
    // veth (about 0.4 % with two peers): every agent governs its rate
    // down, to the floor (a quarter of the rate).
    let r = clock_sync::run(clock_sync::ClockSyncRun {
        converge_timeout: Duration::from_secs(45),
        probe_cpu_budget_pct: Some(0.05),
        ..clock_sync::ClockSyncRun::idle(3, 6, 4)
    })
    .await
    .unwrap();
    assert!(r.ok, "{r:?}");
    let rate = &r.probe_pairs_per_s_per_peer;
    assert_eq!(
        (rate.configured, rate.cpu_budget_pct),
        (100, 0.05),
        "{rate:?}"
    );
    // Halving at most per 2 s window: the floor within seconds.
    assert!(rate.min == 25.0 && rate.p50 <= 50.0, "{rate:?}");
    // The thread's cost stays small at the floor: generous (a CI run on
    // two loaded cores measured 0.84-1.01 % for the three agents), the
    // benchmark reports the figures.
    assert!(
        r.probe_thread_cpu_pct_max < 2.0,
        "{:?}",
        r.probe_thread_cpu_pct
    );
    // A quarter of the probes still synchronise the clocks.
    assert!(r.railguard.p99_ns < 20_000.0, "{:?}", r.railguard);
    assert!(r.railguard.samples >= 3 * 2, "{:?}", r.railguard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clocks_hold_under_bursty_cross_traffic_on_both_rails() {
    if !require_root("probe_netns::clock_sync_cross_load").unwrap() {
        return;
    }
    let _fabric = FABRIC.lock().await;
    let r = clock_sync::run(clock_sync::ClockSyncRun {
        converge_timeout: Duration::from_secs(45),
        cross_load_mbit: 50,
        cross_load_util: 0.7,
        ..clock_sync::ClockSyncRun::idle(4, 8, 5)
    })
    .await
    .unwrap();
    assert!(r.ok, "{r:?}");
    assert!(r.contention_playbook_deleted);
    // Both rails carry cross traffic both ways, and it gets through.
    let load = r.cross_load.as_ref().expect("cross load reported");
    assert_eq!(load.flows.len(), 4, "{load:?}");
    for rail in 0..2 {
        let ways: Vec<_> = load.flows.iter().filter(|f| f.rail == rail).collect();
        assert_eq!(ways.len(), 2, "{load:?}");
        assert_eq!((ways[0].from, ways[0].to), (ways[1].to, ways[1].from));
    }
    assert!(
        load.flows.iter().all(|f| f.delivered_mbps > 10.0),
        "{load:?}"
    );
    // Every host stays solved, within generous bounds (the benchmark
    // reports the real figures).
    assert!(r.railguard.p99_ns < 20_000.0, "{:?}", r.railguard);
    assert!(r.railguard.samples >= 3 * 4, "{:?}", r.railguard);
}

/// Two hosts' clocks step by 1 s (h1 forward, h2 back, h1 back, h2
/// forward, one step every 7 s), with the contention detector watching
/// every path over a leaf uplink: before the fix, every step opened `link_contention` incidents
/// (1 s of "queueing" one way); now nothing is found and the clock
/// solution follows each step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_step_is_no_link_finding() {
    if !require_root("probe_netns::clock_step").unwrap() {
        return;
    }
    let _fabric = FABRIC.lock().await;
    let r = chaos_tests::disk_faults::clock_steps(Duration::from_secs(1), Duration::from_secs(7))
        .await
        .unwrap();
    assert!(r.errors.is_empty(), "{r:?}");
    assert_eq!(r.steps, 4);
    assert!(r.false_link_findings.is_empty(), "{r:?}");
    assert!(r.false_incidents.is_empty(), "{r:?}");
    // Followed within the 7 s before the next step.
    assert!(r.resync_ms.iter().all(Option::is_some), "{r:?}");
}
