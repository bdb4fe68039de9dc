//! Tests of who a rank runs as and who may speak for it: the job user
//! really applied, refused starts that change nothing, and a process that
//! is not a rank refused on the control socket (real processes, a real
//! socket; tests run as root and create the `railguard-job` user).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use rdma::contract::{
    decode_agent, write_message, AgentMessage, ClientOptions, ContractClient, Hello, JobMessage,
    LineReader,
};
use tokio::net::UnixStream;

use super::tests::job_user::{ensure_job_user, JOB_USER};
use super::tests::{job_dir, jobs_cfg, key, order, pid_of, rig, rig_with, serve_control};
use super::user::JobsPolicy;
use crate::outbox::Report;

/// The (real, effective, saved, fs) ids of `field` ("Uid" or "Gid") in
/// `/proc/<pid>/status`.
fn ids(pid: u32, field: &str) -> Vec<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .unwrap();
    line.split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap())
        .collect()
}

async fn wait_file(p: &Path) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !p.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} missing",
            p.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_rank_runs_as_the_job_user_in_directories_it_owns() {
    let (uid, gid) = ensure_job_user();
    let r = rig().await;
    let script = "echo \"$USER\" > user.txt; touch ckpt/by-rank; exec sleep 100";
    let (ok, d) = r.launcher.start(&order("j", 1, 0, script)).await;
    assert!(ok, "{d}");
    let pid = pid_of(&d);
    assert_eq!(ids(pid, "Uid"), vec![uid; 4], "the rank runs as {JOB_USER}");
    assert_eq!(ids(pid, "Gid"), vec![gid; 4]);
    let dir = r.log_dir("j", 1);
    wait_file(&dir.join("ckpt/by-rank")).await;
    wait_file(&dir.join("user.txt")).await;
    for p in [
        dir.clone(),
        dir.join("rank-0.log"),
        dir.join("ckpt"),
        dir.join("ckpt/by-rank"),
    ] {
        assert_eq!(std::fs::metadata(&p).unwrap().uid(), uid, "{}", p.display());
    }
    let user = std::fs::read_to_string(dir.join("user.txt")).unwrap();
    assert_eq!(user.trim(), JOB_USER);
    r.launcher.shutdown().await;
}

#[tokio::test]
async fn starts_are_refused_for_a_missing_root_or_unlisted_user_and_an_unlisted_command() {
    ensure_job_user();
    let cases: Vec<(JobsPolicy, &str, &str, String)> = vec![
        (
            JobsPolicy {
                default_user: "rg-no-such-user".into(),
                ..JobsPolicy::default()
            },
            "",
            "/bin/sh",
            "user rg-no-such-user does not exist on this host; create it (useradd --system rg-no-such-user) or set [jobs] default_user".into(),
        ),
        (
            JobsPolicy {
                allowed_users: vec!["root".into()],
                ..JobsPolicy::default()
            },
            "root",
            "/bin/sh",
            "user root is root (uid 0); ranks run as root only with [jobs] allow_root = true"
                .into(),
        ),
        (
            JobsPolicy::default(),
            "nobody",
            "/bin/sh",
            format!("user nobody is not allowed on this host (its [jobs] allowed_users: {JOB_USER})"),
        ),
        (
            JobsPolicy {
                allowed_commands: vec!["/opt/railguard-jobs".into()],
                ..JobsPolicy::default()
            },
            "",
            "/bin/sh",
            "command /bin/sh is not under this host's [jobs] allowed_commands (/opt/railguard-jobs)"
                .into(),
        ),
        (
            JobsPolicy {
                allowed_commands: vec!["/opt/railguard-jobs".into()],
                ..JobsPolicy::default()
            },
            "",
            "/opt/railguard-jobs/../../bin/sh",
            "command /opt/railguard-jobs/../../bin/sh is not under this host's [jobs] allowed_commands (/opt/railguard-jobs)"
                .into(),
        ),
    ];
    for (policy, user, argv0, want) in cases {
        let dir = job_dir();
        let cfg = jobs_cfg(dir.path()).with_policy(policy);
        let r = rig_with(dir, cfg).await;
        let mut o = order("j", 1, 0, "exec sleep 100");
        o.user = user.into();
        o.argv[0] = argv0.into();
        let (ok, d) = r.launcher.start(&o).await;
        assert_eq!((ok, d.as_str()), (false, want.as_str()));
        assert!(r.launcher.running().is_empty(), "nothing launched");
        assert!(!r.log_dir("j", 1).exists(), "nothing made for the rank");
        assert!(r.exits().await.is_empty());
        // Nothing changed: the job's fence is as it was.
        let f = r.launcher.fence("j").unwrap();
        assert_eq!((f.highest, f.stopped_through), (0, None), "{want}");
        r.launcher.shutdown().await;
    }
    // Root only when the policy says so.
    let dir = job_dir();
    let cfg = jobs_cfg(dir.path()).with_policy(JobsPolicy {
        allowed_users: vec!["root".into()],
        allow_root: true,
        ..JobsPolicy::default()
    });
    let r = rig_with(dir, cfg).await;
    let mut o = order("j", 1, 0, "exec sleep 100");
    o.user = "root".into();
    let (ok, d) = r.launcher.start(&o).await;
    assert!(ok, "{d}");
    assert_eq!(ids(pid_of(&d), "Uid"), vec![0; 4]);
    r.launcher.shutdown().await;
}

#[tokio::test]
async fn an_existing_checkpoint_dir_must_be_writable_by_the_job_user() {
    let (uid, _) = ensure_job_user();
    let r = rig().await;
    let theirs = r.dir.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut o = order("j", 1, 0, "exec sleep 100");
    o.checkpoint_dir = theirs.display().to_string();
    let (ok, d) = r.launcher.start(&o).await;
    assert!(!ok, "{d}");
    assert!(
        d.starts_with(&format!(
            "checkpoint_dir {} is not writable by user {JOB_USER}",
            theirs.display()
        )),
        "{d}"
    );
    assert!(r.launcher.running().is_empty(), "nothing launched");
    assert_eq!(
        std::fs::metadata(&theirs).unwrap().uid(),
        0,
        "not taken over"
    );
    // The operator gives it to the job user: it starts.
    std::os::unix::fs::chown(&theirs, Some(uid), None).unwrap();
    let (ok, d) = r.launcher.start(&o).await;
    assert!(ok, "{d}");
    // One the agent creates is the job user's, with the missing parents.
    let made = r.dir.path().join("made/deeper");
    let mut o = order("k", 1, 0, "exec sleep 100");
    o.checkpoint_dir = made.display().to_string();
    let (ok, d) = r.launcher.start(&o).await;
    assert!(ok, "{d}");
    for p in [r.dir.path().join("made"), made] {
        assert_eq!(std::fs::metadata(&p).unwrap().uid(), uid, "{}", p.display());
    }
    r.launcher.shutdown().await;
}

/// Ranks on several hosts (agents sharing a file system) make the same new
/// checkpoint directory at once: every one succeeds, nobody ever sees it
/// root-owned, and no private name is left behind.
#[test]
fn racing_creators_of_one_checkpoint_dir_all_succeed() {
    let (uid, _) = ensure_job_user();
    let user = super::user::lookup_user(JOB_USER).unwrap().unwrap();
    for round in 0..20 {
        let dir = job_dir();
        let target = format!("shared-{round}/ckpt");
        let results: Vec<Result<(), String>> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..8)
                .map(|_| {
                    sc.spawn(|| super::user::prepare_checkpoint_dir(&user, &target, dir.path()))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(
            results.iter().all(Result::is_ok),
            "round {round}: {results:?}"
        );
        let made = dir.path().join(&target);
        assert_eq!(std::fs::metadata(&made).unwrap().uid(), uid);
        let left: Vec<_> = std::fs::read_dir(made.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            left,
            vec![std::ffi::OsString::from("ckpt")],
            "round {round}"
        );
    }
}

/// Says `hello` on a fresh connection as the test process; returns the
/// agent's answer and whether the agent then closed the connection.
async fn hello_from_here(sock: &Path, hello: Hello) -> (AgentMessage, bool) {
    let s = UnixStream::connect(sock).await.unwrap();
    let (rd, mut wr) = s.into_split();
    let mut lines = LineReader::new(rd);
    write_message(&mut wr, &JobMessage::Hello(hello))
        .await
        .unwrap();
    let answer = decode_agent(lines.next_line().await.unwrap().unwrap()).unwrap();
    // A refused connection is closed: whatever it says next is not read.
    let _ = write_message(&mut wr, &JobMessage::Checkpointed { step: 99 }).await;
    let next = tokio::time::timeout(Duration::from_secs(5), lines.next_line())
        .await
        .expect("an answer or the end");
    let closed = matches!(next, Ok(None) | Err(_));
    (answer, closed)
}

#[tokio::test]
async fn a_process_that_is_not_the_rank_cannot_speak_for_it() {
    let r = rig().await;
    let (control, sock) = serve_control(&r);
    let mode = std::fs::metadata(&sock).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o660, "the control socket is not open to every user");
    let (ok, d) = r.launcher.start(&order("j", 5, 0, "exec sleep 100")).await;
    assert!(ok, "{d}");
    let rank_pid = pid_of(&d);
    // An order waits for the rank's answer.
    let checkpoint = {
        let (l, c) = (r.launcher.clone(), control.clone());
        tokio::spawn(async move { l.checkpoint(&c, "j", 5, false).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The test process (root, not in the rank's process group) claims the
    // rank, even with the rank's own pid: refused, and the socket closes.
    let me = std::process::id();
    for claimed in [rank_pid, me] {
        let (answer, closed) = hello_from_here(
            &sock,
            Hello {
                job: "j".into(),
                rank: 0,
                pid: claimed,
            },
        )
        .await;
        let want =
            format!("pid {me} is not a rank of job j (rank 0 runs as process group {rank_pid})");
        assert_eq!(answer, AgentMessage::Error { message: want });
        assert!(closed, "a refused hello closes the connection");
    }
    let (answer, closed) = hello_from_here(
        &sock,
        Hello {
            job: "j".into(),
            rank: 1,
            pid: me,
        },
    )
    .await;
    assert_eq!(
        answer,
        AgentMessage::Error {
            message: format!(
                "pid {me} is not a rank of job j: rank 1 does not run on this host (ranks [0] do)"
            )
        }
    );
    assert!(closed);
    // Nothing changed: no connection, no checkpoint, the order still waits.
    assert!(control.connected_ranks("j").is_empty());
    assert!(!checkpoint.is_finished(), "the order is still pending");
    let ckpts = r
        .reports()
        .await
        .into_iter()
        .filter(|r| matches!(r, Report::RankCheckpoint(_)))
        .count();
    assert_eq!(ckpts, 0, "no checkpoint recorded");
    // A job this agent runs no rank of may be spoken for by root (a job
    // started by other means).
    let (client, _orders) = ContractClient::connect_with(
        &sock,
        Hello {
            job: "external".into(),
            rank: 0,
            pid: me,
        },
        ClientOptions::default(),
    )
    .await
    .expect("root may speak for a job the agent did not launch");
    assert!(client.is_connected());
    assert_eq!(control.connected_ranks("external").len(), 1);
    checkpoint.abort();
    assert!(
        r.launcher.exit_of(&key("j", 5, 0)).is_none(),
        "still running"
    );
    r.launcher.shutdown().await;
}
