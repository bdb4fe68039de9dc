//! Short forms of the PyTorch scenarios (need root and Debian's
//! python3-torch; fail instead of skipping when `CI` is set):
//! - `torch-nic-flap`: an unmodified PyTorch DDP job over gloo keeps
//!   training across a 3 s pulled cable — no restart, the fault-free run's
//!   digest, and no rank stalled anywhere near the outage (without detours
//!   gloo's connections would stall for at least the 3 s);
//! - `torch-host-loss`: a lost host's ranks (two per host, as torchrun's
//!   `--nproc-per-node 2` places them) resume on a spare from the latest
//!   complete checkpoint, the digest unchanged;
//! - `torch-drain`: a drained host's job halts at an ordered checkpoint and
//!   moves with no step lost.

use std::time::Duration;

use chaos_tests::training::{self, TrainOpts, Workload};
use serde_json::{json, Value};
use testbed::require_root;

/// One PyTorch cluster at a time: the flap test's stall bound assumes the
/// two cores are not shared with another job's ranks.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn short() -> TrainOpts {
    TrainOpts {
        workload: Workload::Torch { step_delay_ms: 10 },
        hosts: 3,
        ranks: 2,
        steps: 150,
        checkpoint_every: 25,
        deadline: Duration::from_secs(240),
        ..Default::default()
    }
}

fn assert_fields(v: &Value, want: Value) {
    for (k, w) in want.as_object().expect("an object of wanted fields") {
        assert_eq!(&v[k], w, "{k} in {v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torch_host_loss_short() {
    if !require_root("torch_host_loss_short").unwrap() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let o = TrainOpts {
        ranks: 4,
        ranks_per_host: 2,
        ..short()
    };
    let v = training::host_loss(&o, 60).await.unwrap();
    assert_fields(
        &v,
        json!({"ok": true, "scenario": "torch-host-loss", "on_spare": true, "restarts": 1, "digest_equal": true}),
    );
    assert!(v["lost_steps"].as_u64().unwrap() <= 25, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torch_drain_short() {
    if !require_root("torch_drain_short").unwrap() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let v = training::drain(&short(), 60).await.unwrap();
    assert_fields(
        &v,
        json!({"ok": true, "scenario": "torch-drain", "lost_steps": 0, "host_drained": true, "restarts": 0, "digest_equal": true}),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torch_nic_flap_short() {
    if !require_root("torch_nic_flap_short").unwrap() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
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

/// Short form of `scenario torch-nic-flap --without-railguard`: without
/// railguard the same job stalls for the whole 3 s outage (and longer: TCP's
/// retransmission backoff), which the detours above cut to milliseconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torch_nic_flap_without_railguard_short() {
    if !require_root("torch_nic_flap_without_railguard_short").unwrap() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let r = chaos_tests::torch_baseline::run(chaos_tests::torch_baseline::BaselineRun {
        hosts: 2,
        steps: 200,
        step_delay_ms: 10,
        outages: vec![Some(Duration::from_secs(3))],
    })
    .await
    .unwrap();
    let p = &r.pulls[0];
    assert!(p.finished && p.ranks_raised == 0, "{r:?}");
    assert!(p.longest_stall_ms >= 2500.0, "{r:?}");
}
