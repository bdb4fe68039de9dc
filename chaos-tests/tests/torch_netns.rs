//! The short form of `scenario torch-nic-flap` (needs root and Debian's
//! python3-torch; fails instead of skipping when `CI` is set): an
//! unmodified PyTorch DDP job over gloo keeps training across a 3 s pulled
//! cable — no restart, the fault-free run's digest, and no rank stalled
//! anywhere near the outage (without detours gloo's connections would
//! stall for at least the 3 s).

use std::time::Duration;

use testbed::require_root;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torch_nic_flap_short() {
    if !require_root("torch_nic_flap_short").unwrap() {
        return;
    }
    let r = chaos_tests::torch::run(chaos_tests::torch::TorchRun {
        hosts: 2,
        supervisors: 1,
        steps: 240,
        step_delay_ms: 15,
        outages: vec![Some(Duration::from_secs(3))],
        deadline: Duration::from_secs(300),
    })
    .await
    .unwrap();
    assert!(r.ok, "{r:?}");
    assert_eq!(r.restarts, 0, "{r:?}");
    assert!(r.same_digest, "{r:?}");
    assert!(
        r.max_step_stall_ms
            .iter()
            .all(|s| (0.0..2500.0).contains(s)),
        "{r:?}"
    );
}
