//! Unit tests of the job runner (real processes, a temporary database).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use proto::v1::StartRank;
use tokio::sync::Notify;

use super::fence::{FenceStore, FENCE_FORMAT};
use super::launch::*;
use super::model::*;
use super::process::proc_stat;
use super::records::{RankRecord, RankStore, RANK_FORMAT};
use crate::config::NicConfig;
use crate::control::{Control, RankEvents};
use crate::outbox::{Outbox, RankExitReport, Report};
use proto::v1::RankPeer;
use rdma::contract::{ClientOptions, ContractClient, Hello};
use std::time::Instant;

#[path = "../../tests/support/job_user.rs"]
pub(super) mod job_user;

pub(super) struct Rig {
    pub(super) dir: tempfile::TempDir,
    pub(super) outbox: Arc<tokio::sync::Mutex<Outbox>>,
    pub(super) launcher: Arc<Launcher>,
}

pub(super) fn nics() -> Vec<NicConfig> {
    // Out of rail order on purpose, plus a NIC on no rail.
    vec![
        NicConfig {
            name: "rail1".into(),
            rail: Some(1),
            backup: Some("rail0".into()),
            rdma_device: None,
            addr: Some("10.11.0.1".parse().unwrap()),
        },
        NicConfig {
            name: "eth0".into(),
            rail: None,
            backup: None,
            rdma_device: None,
            addr: None,
        },
        NicConfig {
            name: "rail0".into(),
            rail: Some(0),
            backup: Some("rail1".into()),
            rdma_device: None,
            addr: Some("10.10.0.1".parse().unwrap()),
        },
    ]
}

pub(super) fn jobs_cfg(dir: &Path) -> JobsConfig {
    JobsConfig::new(dir.to_path_buf(), dir.join("agent.sock"), nics())
}

pub(super) async fn rig_with(dir: tempfile::TempDir, cfg: JobsConfig) -> Rig {
    let outbox = Outbox::open(&dir.path().join("outbox"), 1000).unwrap();
    let outbox = Arc::new(tokio::sync::Mutex::new(outbox));
    let launcher = Launcher::open(cfg, outbox.clone(), Arc::new(Notify::new()))
        .await
        .unwrap();
    Rig {
        dir,
        outbox,
        launcher,
    }
}

/// A temporary directory the job user can pass through (to the control
/// socket in it), with the job user made if missing.
pub(super) fn job_dir() -> tempfile::TempDir {
    job_user::ensure_job_user();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    dir
}

pub(super) async fn rig() -> Rig {
    let dir = job_dir();
    let cfg = jobs_cfg(dir.path());
    rig_with(dir, cfg).await
}

pub(super) fn order(job: &str, incarnation: u64, rank: u32, script: &str) -> StartRank {
    StartRank {
        job: job.into(),
        incarnation,
        rank,
        peers: vec![
            RankPeer {
                host: "h0".into(),
                addrs: vec!["10.10.0.1".into(), "10.11.0.1".into()],
            },
            RankPeer {
                host: "h1".into(),
                addrs: vec!["10.10.0.2".into(), "10.11.0.2".into()],
            },
        ],
        argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
        env: [
            ("EXTRA".to_string(), "x y".to_string()),
            ("RAILGUARD_RANK".to_string(), "overridden".to_string()),
        ]
        .into(),
        // Relative: under the rank's working directory.
        checkpoint_dir: "ckpt".into(),
        checkpoint_every: 50,
        resume_step: 100,
        port: 7000,
        user: String::new(),
    }
}

pub(super) fn key(job: &str, incarnation: u64, rank: u32) -> RankKey {
    RankKey {
        job: job.into(),
        incarnation,
        rank,
    }
}

impl Rig {
    pub(super) fn log_dir(&self, job: &str, inc: u64) -> PathBuf {
        self.dir
            .path()
            .join("jobs")
            .join(job_dir_name(job))
            .join(inc.to_string())
    }

    pub(super) async fn wait_exit(&self, k: &RankKey) -> RankExit {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(x) = self.launcher.exit_of(k) {
                return x;
            }
            assert!(Instant::now() < deadline, "{k} did not exit");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub(super) async fn reports(&self) -> Vec<Report> {
        self.launcher.flush_events().await;
        self.outbox
            .lock()
            .await
            .pending_after(0)
            .unwrap()
            .into_iter()
            .map(|s| s.report)
            .collect()
    }

    pub(super) async fn exits(&self) -> Vec<RankExitReport> {
        self.reports()
            .await
            .into_iter()
            .filter_map(|r| match r {
                Report::RankExited(x) => Some(x),
                _ => None,
            })
            .collect()
    }

    pub(super) async fn wait_log(&self, job: &str, inc: u64, rank: u32, needle: &str) -> String {
        let p = self.log_dir(job, inc).join(format!("rank-{rank}.log"));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let s = std::fs::read_to_string(&p).unwrap_or_default();
            if s.contains(needle) {
                return s;
            }
            assert!(Instant::now() < deadline, "{needle:?} not in {s:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

pub(super) fn pid_of(detail: &str) -> u32 {
    detail
        .strip_prefix("pid=")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("not pid=N: {detail}"))
}

#[tokio::test]
async fn a_rank_gets_its_environment_and_its_output_and_exit_are_captured() {
    let r = rig().await;
    let (ok, detail) = r
        .launcher
        .start(&order(
            "train",
            4,
            1,
            "env > env.txt; echo to-stdout; echo to-stderr >&2; exit 3",
        ))
        .await;
    assert!(ok, "{detail}");
    let pid = pid_of(&detail);
    let x = r.wait_exit(&key("train", 4, 1)).await;
    assert_eq!((x.exit_code, x.signal), (3, 0), "{x:?}");
    assert_eq!(x.detail, "exited with code 3");
    let env = std::fs::read_to_string(r.log_dir("train", 4).join("env.txt")).unwrap();
    let vars: BTreeMap<&str, &str> = env.lines().filter_map(|l| l.split_once('=')).collect();
    let sock = r.dir.path().join("agent.sock").display().to_string();
    for (k, v) in [
        ("RAILGUARD_AGENT_SOCKET", sock.as_str()),
        ("RAILGUARD_JOB", "train"),
        ("RAILGUARD_INCARNATION", "4"),
        ("RAILGUARD_RANK", "1"),
        ("RAILGUARD_WORLD_SIZE", "2"),
        (
            "RAILGUARD_PEERS",
            "h0=10.10.0.1,10.11.0.1;h1=10.10.0.2,10.11.0.2",
        ),
        ("RAILGUARD_NICS", "rail0=10.10.0.1,rail1=10.11.0.1"),
        ("RAILGUARD_PORT", "7000"),
        ("RAILGUARD_CHECKPOINT_DIR", "ckpt"),
        ("RAILGUARD_CHECKPOINT_EVERY", "50"),
        ("RAILGUARD_RESUME_STEP", "100"),
        ("EXTRA", "x y"),
        // As torchrun would set them, one rank per host.
        ("RANK", "1"),
        ("GROUP_RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "0"),
        ("LOCAL_WORLD_SIZE", "1"),
        ("MASTER_ADDR", "10.10.0.1"),
        ("MASTER_PORT", "7000"),
        ("GLOO_SOCKET_IFNAME", "rail0"),
        ("NCCL_SOCKET_IFNAME", "rail0"),
    ] {
        assert_eq!(vars.get(k).copied(), Some(v), "{k} in {env}");
    }
    assert!(vars.contains_key("PATH"), "the agent's environment is kept");
    let log = r.wait_log("train", 4, 1, "to-stderr").await;
    assert!(log.contains("to-stdout\n"), "{log}");
    let exits = r.exits().await;
    assert_eq!(exits.len(), 1, "{exits:?}");
    assert_eq!(
        (exits[0].job.as_str(), exits[0].incarnation, exits[0].rank),
        ("train", 4, 1)
    );
    assert_eq!(exits[0].exit_code, 3);
    assert!(
        r.launcher.records.is_empty(),
        "the record goes with the exit"
    );
    assert!(pid > 1);
    // Starting the exited rank again (another order id) is refused.
    let (ok, detail) = r.launcher.start(&order("train", 4, 1, "exit 0")).await;
    assert!(!ok && detail.contains("already ran"), "{detail}");
}

#[tokio::test]
async fn a_signal_is_reported_and_a_bad_start_fails_with_the_os_error() {
    let r = rig().await;
    let (ok, detail) = r.launcher.start(&order("j", 1, 0, "kill -9 $$")).await;
    assert!(ok, "{detail}");
    let x = r.wait_exit(&key("j", 1, 0)).await;
    assert_eq!((x.exit_code, x.signal), (-1, 9), "{x:?}");
    assert_eq!(x.detail, "killed by signal 9 (SIGKILL)");
    let mut o = order("j", 1, 1, "");
    o.argv = vec!["/nonexistent/trainer".into()];
    let (ok, detail) = r.launcher.start(&o).await;
    assert!(!ok, "{detail}");
    assert!(detail.contains("No such file"), "{detail}");
    let mut o = order("bad\nname", 1, 0, "true");
    let (ok, detail) = r.launcher.start(&o).await;
    assert!(!ok && detail.contains("job name"), "{detail}");
    // Any other name gets a directory of its own, inside jobs/.
    let (ok, detail) = r.launcher.start(&order("../x/y", 1, 0, "pwd")).await;
    assert!(ok, "{detail}");
    r.wait_exit(&key("../x/y", 1, 0)).await;
    let t = r.launcher.tail_log("../x/y", 0, 1000, None).await;
    assert!(t.ok, "{t:?}");
    assert!(t.text.trim_end().ends_with("/jobs/%2E.%2Fx%2Fy/1"), "{t:?}");
    assert_eq!(job_dir_name("a.b-c_D9"), "a.b-c_D9");
    assert_eq!(job_dir_name(".%"), "%2E%25");
    o.job = "j".into();
    o.rank = 2;
    let (ok, detail) = r.launcher.start(&o).await;
    assert!(!ok && detail.contains("outside a world of 2"), "{detail}");
}

#[tokio::test]
async fn stop_escalates_from_sigterm_to_sigkill() {
    let r = rig().await;
    let script = "trap 'echo got TERM' TERM; echo ready; while :; do sleep 0.1; done";
    let (ok, detail) = r.launcher.start(&order("j", 1, 0, script)).await;
    assert!(ok, "{detail}");
    r.wait_log("j", 1, 0, "ready").await;
    let t0 = Instant::now();
    let (ok, detail) = r.launcher.stop_job("j", 1).await;
    let took = t0.elapsed();
    assert!(ok, "{detail}");
    assert_eq!(detail, "1 ranks stopped");
    assert!(took >= STOP_GRACE, "SIGKILL came after {took:?}");
    assert!(took < STOP_GRACE + KILL_WAIT, "{took:?}");
    let x = r
        .launcher
        .exit_of(&key("j", 1, 0))
        .expect("reaped before the answer");
    assert_eq!((x.exit_code, x.signal), (-1, 9), "{x:?}");
    assert!(
        x.detail.starts_with("stopped by order: killed by signal 9")
            && x.detail.contains("SIGKILL after 5 s"),
        "{}",
        x.detail
    );
    r.wait_log("j", 1, 0, "got TERM").await;
    // Nothing left: ok at once.
    let t0 = Instant::now();
    let (ok, detail) = r.launcher.stop_job("j", 1).await;
    assert!(ok && detail == "nothing running", "{detail}");
    assert!(t0.elapsed() < Duration::from_secs(1));
    // A stopped incarnation does not start again.
    let (ok, detail) = r.launcher.start(&order("j", 1, 1, "true")).await;
    assert!(!ok && detail.contains("was stopped"), "{detail}");
}

#[tokio::test]
async fn fencing_refuses_stale_incarnations_and_a_newer_one_stops_the_older_first() {
    let r = rig().await;
    let (ok, d) = r.launcher.start(&order("j", 2, 0, "exec sleep 100")).await;
    assert!(ok, "{d}");
    let old_pid = pid_of(&d);
    let (ok, d) = r.launcher.start(&order("j", 2, 1, "exec sleep 100")).await;
    assert!(ok, "{d}");
    // The same rank again (another order id): the same process.
    let (ok, again) = r.launcher.start(&order("j", 2, 0, "exec sleep 100")).await;
    assert!(ok && pid_of(&again) == old_pid, "{again}");
    // Older incarnations are refused, for starts and checkpoints.
    let (ok, d) = r.launcher.start(&order("j", 1, 0, "true")).await;
    assert_eq!((ok, d.as_str()), (false, "stale incarnation 1 < 2"));
    let control = Control::new(nics());
    let (ok, d, step) = r.launcher.checkpoint(&control, "j", 1, false).await;
    assert_eq!(
        (ok, d.as_str(), step),
        (false, "stale incarnation 1 < 2", None)
    );
    assert_eq!(r.launcher.running().len(), 2, "nothing was touched");
    // A newer incarnation: the older ranks are gone before it starts.
    let (ok, d) = r.launcher.start(&order("j", 3, 0, "exec sleep 100")).await;
    assert!(ok, "{d}");
    assert!(
        proc_stat(old_pid).is_none(),
        "reaped before the newer started"
    );
    for rank in [0, 1] {
        let x = r.launcher.exit_of(&key("j", 2, rank));
        let x = x.expect("the older rank was reaped before the newer started");
        assert_eq!(x.signal, 15, "{x:?}");
        assert!(x.detail.starts_with("superseded by incarnation 3"), "{x:?}");
    }
    let exits = r.exits().await;
    assert_eq!(exits.len(), 2, "{exits:?}");
    assert!(exits.iter().all(|x| x.incarnation == 2));
    let running: Vec<RankKey> = r.launcher.running().into_iter().map(|(k, _)| k).collect();
    assert_eq!(running, vec![key("j", 3, 0)]);
    // Other jobs are not fenced by this one.
    let (ok, d) = r
        .launcher
        .start(&order("other", 1, 0, "exec sleep 100"))
        .await;
    assert!(ok, "{d}");
    // The fence is durable.
    assert_eq!(r.launcher.fence("j").unwrap().highest, 3);
    r.launcher.shutdown().await;
    let exits = r.exits().await;
    assert_eq!(exits.len(), 4, "{exits:?}");
    let last: Vec<&str> = exits[2..].iter().map(|x| x.detail.as_str()).collect();
    assert!(
        last.iter()
            .all(|d| d.starts_with("agent shutting down: rank stopped")),
        "{last:?}"
    );
    let (ok, d) = r.launcher.start(&order("j", 4, 0, "true")).await;
    assert!(!ok && d.contains("shutting down"), "{d}");
}

#[tokio::test]
async fn ranks_left_by_an_earlier_run_are_killed_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let mut alive = Command::new("sleep")
        .arg("100")
        .process_group(0)
        .spawn()
        .unwrap();
    let mut gone = Command::new("true").spawn().unwrap();
    let gone_pid = gone.id();
    gone.wait().unwrap();
    {
        let outbox = Outbox::open(&dir.path().join("outbox"), 1000).unwrap();
        let (db, path) = outbox.database();
        let store = RankStore::open(&db, &path).unwrap();
        let recs = [
            RankRecord {
                job: "j".into(),
                incarnation: 7,
                rank: 0,
                pid: alive.id(),
                start_time: proc_stat(alive.id()).unwrap().start_time,
            },
            RankRecord {
                job: "j".into(),
                incarnation: 7,
                rank: 1,
                pid: gone_pid,
                start_time: 12345,
            },
        ];
        for rec in recs {
            store.insert(&rec).await.unwrap();
        }
        db.flush().unwrap();
    }
    let cfg = jobs_cfg(dir.path());
    let r = rig_with(dir, cfg).await;
    let status = alive.wait().unwrap();
    assert_eq!(status.signal(), Some(9), "the leftover rank was killed");
    let mut exits = r.exits().await;
    exits.sort_by_key(|x| x.rank);
    assert_eq!(exits.len(), 2, "{exits:?}");
    assert_eq!(
        (
            exits[0].exit_code,
            exits[0].signal,
            exits[0].detail.as_str()
        ),
        (-1, 9, "agent restarted: rank stopped")
    );
    assert_eq!(
        (
            exits[1].exit_code,
            exits[1].signal,
            exits[1].detail.as_str()
        ),
        (-1, 0, "lost while the agent was down")
    );
    assert!(r.launcher.records.is_empty());
}

#[tokio::test]
async fn the_log_tail_is_the_end_of_the_newest_incarnations_log_and_logs_are_capped() {
    let dir = job_dir();
    let mut cfg = jobs_cfg(dir.path());
    cfg.log_cap = 1000;
    let r = rig_with(dir, cfg).await;
    let (ok, d) = r.launcher.start(&order("j", 1, 0, "echo first")).await;
    assert!(ok, "{d}");
    r.wait_exit(&key("j", 1, 0)).await;
    let script = "i=0; while [ $i -lt 20 ]; do echo line-$i; i=$((i+1)); done";
    let (ok, d) = r.launcher.start(&order("j", 2, 0, script)).await;
    assert!(ok, "{d}");
    r.wait_exit(&key("j", 2, 0)).await;
    r.wait_log("j", 2, 0, "line-19").await;
    let t = r.launcher.tail_log("j", 0, 16, None).await;
    assert!(t.ok, "{t:?}");
    assert_eq!(t.incarnation, 2);
    assert_eq!(t.text, "line-18\nline-19\n");
    let t = r.launcher.tail_log("j", 0, 0, None).await;
    assert!(t.text.starts_with("line-0\n"), "0 means the cap: {t:?}");
    let t = r.launcher.tail_log("j", 5, 100, None).await;
    assert!(!t.ok && t.text.contains("no log"), "{t:?}");
    let t = r.launcher.tail_log("nope", 0, 100, None).await;
    assert!(!t.ok, "{t:?}");
    // Following: the tail says where it ended; reads from there go on
    // in order, and an offset at the end reads nothing new.
    let tail = r.launcher.tail_log("j", 0, 16, None).await;
    assert_eq!((tail.incarnation, tail.newest), (2, 2));
    let whole = r.launcher.tail_log("j", 0, 0, None).await;
    assert_eq!(tail.end_offset, whole.text.len() as u64);
    let mut read = String::new();
    let mut at = (2, 0);
    for _ in 0..100 {
        let t = r.launcher.tail_log("j", 0, 10, Some(at)).await;
        assert!(t.ok, "{t:?}");
        if t.text.is_empty() {
            break;
        }
        read.push_str(&t.text);
        at = (t.incarnation, t.end_offset);
    }
    assert_eq!(read, whole.text, "ten bytes at a time, the whole log");
    // The log of an incarnation no longer kept: the newest from its start.
    let t = r.launcher.tail_log("j", 0, 7, Some((1_000, 5))).await;
    assert_eq!(
        (t.incarnation, t.text.as_str(), t.end_offset),
        (2, "line-0\n", 7)
    );
    // Output beyond the cap is discarded with a note; the rank is not
    // blocked by it.
    let script = "i=0; while [ $i -lt 500 ]; do echo 0123456789; i=$((i+1)); done; echo done >&2";
    let (ok, d) = r.launcher.start(&order("j", 3, 0, script)).await;
    assert!(ok, "{d}");
    let x = r.wait_exit(&key("j", 3, 0)).await;
    assert_eq!(x.exit_code, 0, "{x:?}");
    let log = r.wait_log("j", 3, 0, "log capped").await;
    assert!(log.len() < 1100, "{}", log.len());
    assert!(!log.contains("done"), "{log}");
}

/// Set in the environment of a rank that is this test binary run again
/// (see [`rank_helper`]).
const HELPER: &str = "RAILGUARD_TEST_RANK_HELPER";

/// A rank that is this test binary running [`rank_helper`] only.
pub(super) fn helper_order(job: &str, incarnation: u64, rank: u32) -> StartRank {
    let mut o = order(job, incarnation, rank, "");
    o.argv = vec![
        std::env::current_exe().unwrap().display().to_string(),
        "jobs::tests::rank_helper".into(),
        "--exact".into(),
        "--nocapture".into(),
        "--test-threads=1".into(),
    ];
    o.env.insert(HELPER.into(), "1".into());
    o
}

/// Not a test by itself: when the launcher runs this binary as a rank
/// ([`helper_order`]), the rank's side of the contract. After 300 ms it
/// says hello with its own pid, answers its first order (a checkpoint) at
/// step 40 after reporting step 40 twice, reports 41, registers a
/// connection and says twice that it stalled, and waits to be stopped;
/// what it saw goes to its log.
#[tokio::test]
async fn rank_helper() {
    if std::env::var_os(HELPER).is_none() {
        return;
    }
    let var = |k: &str| std::env::var(k).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (client, mut orders) = ContractClient::connect_with(
        var("RAILGUARD_AGENT_SOCKET"),
        Hello {
            job: var("RAILGUARD_JOB"),
            rank: var("RAILGUARD_RANK").parse().unwrap(),
            pid: std::process::id(),
        },
        ClientOptions::default(),
    )
    .await
    .unwrap();
    println!("helper: connected");
    let o = orders.next().await.unwrap();
    println!("helper: order {:?}", o.kind);
    client.checkpointed(40).await.unwrap();
    client.checkpointed(40).await.unwrap();
    client.checkpoint_done(o.order_id, 40).await.unwrap();
    client.checkpointed(41).await.unwrap();
    let rank: u32 = var("RAILGUARD_RANK").parse().unwrap();
    client
        .conn_up(rdma::contract::ConnUp {
            job: var("RAILGUARD_JOB"),
            rank,
            conn_id: 7,
            nic: "rail0".into(),
            peer_host: "h2".into(),
            peer_rank: rank + 1,
            rail: 0,
        })
        .await
        .unwrap();
    client.conn_stalled(7).await.unwrap();
    client.conn_stalled(7).await.unwrap();
    println!("helper: reported 41");
    tokio::time::sleep(Duration::from_secs(100)).await;
}

/// Starts the control socket of `r`'s launcher (group: the job user's).
pub(super) fn serve_control(r: &Rig) -> (Arc<Control>, PathBuf) {
    let sock = r.dir.path().join("agent.sock");
    let (_, gid) = job_user::ensure_job_user();
    let listener = crate::control::bind(&sock, Some(gid)).unwrap();
    let control =
        Control::with_rank_events(nics(), Some(r.launcher.clone() as Arc<dyn RankEvents>));
    tokio::spawn(control.clone().serve(listener));
    (control, sock)
}

#[tokio::test]
async fn checkpoint_orders_reach_the_ranks_and_checkpoints_are_reported_once() {
    let r = rig().await;
    let (control, _sock) = serve_control(&r);
    let (ok, d, step) = r.launcher.checkpoint(&control, "j", 5, true).await;
    assert_eq!(
        (ok, d.as_str(), step),
        (
            false,
            "no rank of job j incarnation 5 runs on this host",
            None
        )
    );
    // The rank (a real process running as the job user) connects after
    // the order was sent: the order waits for its hello.
    let (ok, d) = r.launcher.start(&helper_order("j", 5, 0)).await;
    assert!(ok, "{d}");
    let checkpoint = {
        let (l, c) = (r.launcher.clone(), control.clone());
        tokio::spawn(async move { l.checkpoint(&c, "j", 5, true).await })
    };
    let (ok, d, step) = tokio::time::timeout(Duration::from_secs(20), checkpoint)
        .await
        .expect("the checkpoint was answered")
        .unwrap();
    assert_eq!(
        (ok, d.as_str(), step),
        (true, "checkpoint at step 40", Some(40))
    );
    let log = r.wait_log("j", 5, 0, "helper: reported 41").await;
    assert!(
        log.contains("helper: order Checkpoint { step: None, halt: true }"),
        "{log}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let ckpts = loop {
        let ckpts: Vec<(u64, u64)> = r
            .reports()
            .await
            .into_iter()
            .filter_map(|r| match r {
                Report::RankCheckpoint(c) => Some((c.incarnation, c.step)),
                _ => None,
            })
            .collect();
        if ckpts.contains(&(5, 41)) || Instant::now() > deadline {
            break ckpts;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(ckpts, vec![(5, 40), (5, 41)], "repeats are not reported");
    // The stalled connection, once, as the incarnation's with its peer
    // (queued after step 41).
    let stalls = loop {
        let stalls: Vec<_> = r
            .reports()
            .await
            .into_iter()
            .filter_map(|r| match r {
                Report::ConnStalled(c) => {
                    Some((c.incarnation, c.rank, c.conn_id, c.peer_host, c.peer_rank))
                }
                _ => None,
            })
            .collect();
        if !stalls.is_empty() || Instant::now() > deadline {
            break stalls;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(stalls, vec![(5, 0, 7, "h2".to_string(), 1)]);
    r.launcher.shutdown().await;
}

/// Stamps `tree` of the database in `dir` with format `v`.
fn stamp_format(dir: &Path, tree: &str, v: u32) {
    let outbox = Outbox::open(dir, 10).unwrap();
    let (db, path) = outbox.database();
    let t = db.open_tree(tree).unwrap();
    crate::store_format::stamp(&db, &path, &t, v).unwrap();
    db.flush().unwrap();
}

#[tokio::test]
async fn the_fence_and_rank_trees_refuse_an_unknown_format() {
    for (tree, current) in [("job_fences", FENCE_FORMAT), ("job_ranks", RANK_FORMAT)] {
        let dir = tempfile::tempdir().unwrap();
        {
            // A fresh database is stamped with the current format.
            let outbox = Outbox::open(dir.path(), 10).unwrap();
            let (db, path) = outbox.database();
            FenceStore::open(&db, &path).unwrap();
            RankStore::open(&db, &path).unwrap();
            let t = db.open_tree(tree).unwrap();
            assert_eq!(
                crate::store_format::open(&db, &path, &t, current, &[current]).unwrap(),
                current
            );
        }
        stamp_format(dir.path(), tree, current + 98);
        let outbox = Outbox::open(dir.path(), 10).unwrap();
        let (db, path) = outbox.database();
        let e = match tree {
            "job_fences" => FenceStore::open(&db, &path).err().unwrap(),
            _ => RankStore::open(&db, &path).err().unwrap(),
        }
        .to_string();
        assert!(
            e.contains(tree) && e.contains(&(current + 98).to_string()),
            "{e}"
        );
        assert!(e.contains(&path), "names the database: {e}");
    }
}

#[test]
fn several_ranks_per_host_get_torchruns_local_and_group_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = jobs_cfg(dir.path());
    // Two hosts, three ranks each (ranks_per_host = 3), as the supervisor
    // places them: a host's ranks in a row.
    let mut o = order("t", 1, 0, "true");
    let peer = |h: &str, a: &str| RankPeer {
        host: h.into(),
        addrs: vec![a.into()],
    };
    o.peers = (0..6)
        .map(|r| {
            if r < 3 {
                peer("h0", "10.10.0.1")
            } else {
                peer("h1", "10.10.0.2")
            }
        })
        .collect();
    for (rank, group, local) in [(0, 0, 0), (2, 0, 2), (3, 1, 0), (5, 1, 2)] {
        o.rank = rank;
        let env: BTreeMap<String, String> =
            super::launch::torchrun_env(&cfg, &o).into_iter().collect();
        for (k, v) in [
            ("RANK", rank.to_string()),
            ("GROUP_RANK", group.to_string()),
            ("LOCAL_RANK", local.to_string()),
            ("LOCAL_WORLD_SIZE", "3".into()),
            ("WORLD_SIZE", "6".into()),
            ("MASTER_ADDR", "10.10.0.1".into()),
        ] {
            assert_eq!(env.get(k), Some(&v), "{k} of rank {rank}: {env:?}");
        }
    }
}
