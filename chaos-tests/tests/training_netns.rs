//! Training under railguard in a real netns cluster (needs root; fails
//! instead of skipping when `CI` is set): short forms of `train-nic-flap`,
//! `host-loss` and `drain`. Each runs a fault-free job first and compares
//! digests, so a wrong restart point, a lost or repeated step or a bad
//! reduction shows up as a different digest. Bounds are generous; the
//! figures come from the full scenarios.

use std::time::Duration;

use chaos_tests::training::{self, Storm, TrainOpts};
use serde_json::{json, Value};
use testbed::require_root;

/// Asserts that report `v` holds every field of `want` with its value.
fn assert_fields(v: &Value, want: Value) {
    for (k, w) in want.as_object().expect("an object of wanted fields") {
        assert_eq!(&v[k], w, "{k} in {v}");
    }
}

fn short(hosts: usize) -> TrainOpts {
    TrainOpts {
        hosts,
        ranks: 3,
        steps: 60,
        checkpoint_every: 10,
        hidden: Some(256),
        deadline: Duration::from_secs(180),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn training_survives_nic_flaps_without_a_restart() {
    if !require_root("training_netns::train_nic_flap").unwrap() {
        return;
    }
    let o = TrainOpts {
        steps: 120,
        ..short(3)
    };
    let v = training::train_nic_flap(
        &o,
        Storm::short(Duration::from_millis(1500), Duration::from_millis(1000), 3),
    )
    .await
    .unwrap();
    assert_fields(&v, json!({"ok": true, "restarts": 0, "digest_equal": true}));
    assert!(v["flaps"].as_u64().unwrap() >= 1, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_host_is_replaced_and_training_resumes_from_the_checkpoint() {
    if !require_root("training_netns::host_loss").unwrap() {
        return;
    }
    let o = short(4);
    let v = training::host_loss(&o, 25).await.unwrap();
    assert_fields(
        &v,
        json!({"ok": true, "on_spare": true, "restarts": 1, "digest_equal": true}),
    );
    assert!(v["lost_steps"].as_u64().unwrap() <= 10, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_a_host_moves_the_job_without_losing_a_step() {
    if !require_root("training_netns::drain").unwrap() {
        return;
    }
    let o = short(4);
    let v = training::drain(&o, 25).await.unwrap();
    assert_fields(
        &v,
        json!({"ok": true, "lost_steps": 0, "host_drained": true, "restarts": 0, "digest_equal": true}),
    );
}

/// The admin side of a running job: an ordered checkpoint (all ranks at
/// one step, recorded complete), its logs through the agents, cancel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_logs_and_cancel_from_the_cli() {
    if !require_root("training_netns::job_cli").unwrap() {
        return;
    }
    let o = TrainOpts {
        steps: 100_000,
        checkpoint_every: 0,
        ..short(2)
    };
    let o = TrainOpts { ranks: 2, ..o };
    let t = training::Training::start(&o).await.unwrap();
    t.submit("cli", &o, &[0, 1]).unwrap();
    t.c.wait_until("ranks started", Duration::from_secs(30), |c| {
        c.cli_json(&["job", "show", "cli"]).is_ok_and(|v| {
            v["job"]["ranks"]
                .as_array()
                .is_some_and(|r| r.len() == 2 && r.iter().all(|x| x["started"] == true))
        })
    })
    .await
    .unwrap();
    // Progress first, so the checkpoint lands at a real step.
    t.c.wait_until("a few steps", Duration::from_secs(30), |_| {
        t.max_step("cli", 1, 2, 2) >= 5
    })
    .await
    .unwrap();
    let out =
        t.c.cli(&["job", "checkpoint", "cli", "--wait", "60s"])
            .unwrap();
    assert!(out.contains("complete"), "{out}");
    let job = t.c.cli_json(&["job", "show", "cli"]).unwrap()["job"].clone();
    let step = job["latest_checkpoint"]
        .as_u64()
        .expect("a complete checkpoint");
    assert!(step >= 5, "{job}");
    for r in 0..2 {
        let f = t
            .checkpoint_dir("cli")
            .join(format!("step-{step}"))
            .join(format!("rank-{r}.ckpt"));
        assert!(f.exists(), "{} missing", f.display());
    }
    let logs =
        t.c.cli_json(&["job", "logs", "cli", "--rank", "1"])
            .unwrap();
    assert!(
        logs["text"]
            .as_str()
            .unwrap()
            .contains(&format!("checkpoint step={step}")),
        "{logs}"
    );
    assert_eq!(logs["host"], "h1");
    let err = t.c.cli(&["job", "logs", "cli", "--rank", "7"]).unwrap_err();
    assert!(err.to_string().contains("rank 7"), "{err}");
    // `job logs -f` goes on printing what the rank writes, in order.
    let mut follow =
        t.c.cli_command(
            &t.c.sup_addrs(),
            &["job", "logs", "cli", "--rank", "1", "--bytes", "2048", "-f"],
        )
        .unwrap()
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    testbed::register_pid(follow.id());
    let mut out = follow.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        use std::io::Read;
        let mut all = String::new();
        let _ = out.read_to_string(&mut all);
        all
    });
    let before = t.max_step("cli", 1, 2, 2);
    t.c.wait_until(
        "more steps while following",
        Duration::from_secs(30),
        |_| t.max_step("cli", 1, 2, 2) >= before + 20,
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _ = follow.kill();
    let _ = follow.wait();
    testbed::unregister_pid(follow.id());
    let followed = reader.join().unwrap();
    let steps: Vec<u64> = followed
        .lines()
        .filter_map(|l| {
            l.split_whitespace()
                .next()?
                .strip_prefix("step=")?
                .parse()
                .ok()
        })
        .collect();
    assert!(steps.len() >= 20, "{followed}");
    assert!(
        steps.windows(2).all(|w| w[1] == w[0] + 1),
        "every step once, in order: {steps:?}"
    );
    assert!(*steps.last().unwrap() >= before + 20, "{steps:?}");
    t.c.cli(&["job", "cancel", "cli"]).unwrap();
    t.c.wait_until("ranks stopped", Duration::from_secs(30), |c| {
        c.cli_json(&["job", "show", "cli"]).is_ok_and(|v| {
            v["job"]["state"] == "cancelled"
                && v["job"]["stopping"]
                    .as_object()
                    .is_some_and(|s| s.is_empty())
        })
    })
    .await
    .unwrap();
    let err = t.c.cli(&["job", "cancel", "cli"]).unwrap_err();
    assert!(err.to_string().contains("already ended"), "{err}");
}

/// Short form of `scenario admin-failover`: an admin's failover holds
/// through a leader kill and two recoveries of the NIC, until `nic
/// failback`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admins_failover_holds_until_the_admin_fails_back() {
    if !require_root("training_netns::admin_failover").unwrap() {
        return;
    }
    let r = chaos_tests::admin_failover::run(chaos_tests::admin_failover::AdminFailoverRun {
        hold: Duration::from_secs(12),
        pull: Duration::from_millis(1500),
    })
    .await
    .unwrap();
    assert!(r.ok, "{r:?}");
    assert_eq!(r.samples_on_held_nic, 0, "{r:?}");
    assert!(r.conns_held > 0 && r.samples >= 10, "{r:?}");
}

/// Short form of `scenario gray-link`: a rail that loses a tenth of its
/// packets, then one that stalls for up to 8 ms every 20 ms, while its
/// link stays up, is found Degraded from probe evidence, the connections
/// leave it, and it is Up again once the fault ends; no other NIC is
/// blamed and the job never restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rail_losing_or_delaying_packets_is_degraded_and_left_then_up_again() {
    if !require_root("training_netns::gray_link").unwrap() {
        return;
    }
    use chaos_tests::gray_link::GrayFault;
    let stalls = testbed::stalls::StallSpec {
        max_stall: Duration::from_millis(8),
        every: Duration::from_millis(20),
    };
    let r = chaos_tests::gray_link::run(chaos_tests::gray_link::GrayLinkRun {
        faults: vec![GrayFault::Loss(10.0), GrayFault::Stalls(stalls)],
        baseline: Duration::from_secs(3),
        fault: Duration::from_secs(5),
        // Generous under CI's load: the 10 % goal is the scenario's.
        max_slowdown_pct: 50.0,
        // As the scenario's default: ranks that compute between exchanges.
        step_delay: Duration::from_millis(3),
        detect: true,
    })
    .await
    .unwrap();
    assert!(r.ok, "{r:?}");
    assert_eq!(r.rounds.len(), 2, "{r:?}");
    for round in &r.rounds {
        assert!(round.degraded_ms.is_some_and(|ms| ms < 10_000), "{r:?}");
        assert!(
            round.moved_ms.is_some() && round.clean_ms.is_some(),
            "{r:?}"
        );
    }
    assert_eq!(r.rounds[1].stall_max_ms, Some(8), "{r:?}");
    assert!(r.false_findings.is_empty(), "{r:?}");
}

/// Short form of `scenario cut-off-host`: both rails of a rank's host cut
/// just after a checkpoint; the job moves to the spare from its latest
/// complete checkpoint, never back to the cut-off host while it is cut
/// off, and the incident stays open until the rails return.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_host_loses_its_ranks_to_a_spare_until_its_rails_return() {
    if !require_root("training_netns::cut_off_host").unwrap() {
        return;
    }
    rail_cuts(chaos_tests::rail_cuts::Cut::Host, false).await;
}

/// Short form of `scenario no-common-rail`: ring neighbours h1 and h2 lose
/// different rails just after a checkpoint; a path incident names both,
/// the job resumes with a spare in place of one of them (no crash loop,
/// no restart spent), and the incident stays open until the cables
/// return.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn neighbours_without_a_common_rail_are_parted_until_their_rails_return() {
    if !require_root("training_netns::no_common_rail").unwrap() {
        return;
    }
    rail_cuts(chaos_tests::rail_cuts::Cut::NoCommonRail, false).await;
}

/// The same with the cables cut silently (links up, traffic gone): the
/// probe mesh's evidence and the ranks' stalled connections must tell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn neighbours_cut_silently_are_parted_too() {
    if !require_root("training_netns::no_common_rail_silent").unwrap() {
        return;
    }
    rail_cuts(chaos_tests::rail_cuts::Cut::NoCommonRail, true).await;
}

async fn rail_cuts(cut_kind: chaos_tests::rail_cuts::Cut, silent: bool) {
    let mut o = short(4);
    o.ringtrain_step_delay_ms = 20;
    let r = chaos_tests::rail_cuts::run(chaos_tests::rail_cuts::RailCutRun {
        cut_kind,
        train: o,
        offsets: vec![3],
        cut: Duration::from_secs(4),
        silent,
    })
    .await
    .unwrap();
    assert!(r.ok, "{r:?}");
    let run = &r.runs[0];
    assert!(
        !run.forbidden_placement && run.incident_open_before_repair && run.restarts == 0,
        "{r:?}"
    );
    assert!(run.resumed_ms.is_some_and(|ms| ms < 20_000), "{r:?}");
}
