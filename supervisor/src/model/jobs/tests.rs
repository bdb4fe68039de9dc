//! Tests of jobs.

use crate::model::hosts::Liveness;
use crate::model::intents::{Action, IntentStatus};
use crate::model::jobs::types::{
    port_of, Job, JobCommand, JobOp, JobSpec, JobState, PORT_BASE, PORT_SPAN,
};
use crate::model::result::{CmdError, CmdResult};
use crate::model::state::ClusterState;
use crate::model::testkit::spec;
use proto::agent::OrderOutcome;
use std::collections::BTreeMap;

/// A checkpoint's step comes from the agent's typed answer
/// (`OrderOutcome::Checkpointed`), never from its text: an answer that only
/// says `step=N` in its detail records no checkpoint.
#[test]
fn the_checkpoint_step_is_read_from_the_typed_answer_only() {
    let run = |reply: fn(&Action) -> Option<OrderOutcome>| {
        let mut w = World::new(&["h0", "h1"]);
        w.admin(JobOp::Submit { spec: spec("j", 2) }).unwrap();
        w.settle(obey);
        w.admin(JobOp::Checkpoint { job: "j".into() }).unwrap();
        w.settle(reply);
        w.job().latest_checkpoint
    };
    assert_eq!(
        run(|a| match a {
            Action::CheckpointJob { .. } => Some(crate::model::testkit::checkpointed(42)),
            _ => Some(crate::model::testkit::answer(true, "pid=1")),
        }),
        Some(42)
    );
    assert_eq!(
        run(|a| Some(crate::model::testkit::answer(
            true,
            match a {
                Action::CheckpointJob { .. } => "step=42",
                _ => "pid=1",
            }
        ))),
        None
    );
}

#[test]
fn ports_stay_in_their_range() {
    assert_eq!(port_of(1), PORT_BASE + 1);
    assert_eq!(port_of(PORT_SPAN), PORT_BASE);
    assert!(port_of(u64::MAX) < PORT_BASE + PORT_SPAN as u16);
}

#[test]
fn job_names_limits() {
    let mut s = spec("j", 2);
    assert!(s.validate().is_ok());
    s.env.insert("RAILGUARD_RANK".into(), "3".into());
    assert!(s.validate().is_err());
    let mut s = spec("j", 2);
    s.checkpoint_dir = "relative".into();
    assert!(s.validate().is_err());
    let mut s = spec("j", 0);
    s.ranks = 0;
    assert!(s.validate().is_err());
    let mut s = spec("j", 2);
    s.hosts = vec!["a".into()];
    assert!(s.validate().is_err());
}

#[test]
fn a_job_user_is_a_plain_user_name() {
    let mut s = spec("j", 2);
    for ok in ["railguard-job", "trainer", "_svc", "a.b", "u1"] {
        s.user = Some(ok.into());
        assert!(s.validate().is_ok(), "{ok}");
    }
    for bad in ["", "-x", ".x", "a b", "a/b", "1000", "ä", &"u".repeat(33)] {
        s.user = Some(bad.into());
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("user"), "{bad:?}: {e}");
    }
    // A job file may name it (TOML and JSON share the serde defaults).
    let toml_spec: JobSpec = toml::from_str(
        "name = \"j\"\nranks = 1\ncommand = [\"/bin/true\"]\ncheckpoint_dir = \"/c\"\nuser = \"trainer\"\n",
    )
    .unwrap();
    assert_eq!(toml_spec.user.as_deref(), Some("trainer"));
    let json_spec: JobSpec = serde_json::from_str(
        r#"{"name":"j","ranks":1,"command":["/bin/true"],"checkpoint_dir":"/c"}"#,
    )
    .unwrap();
    assert_eq!(json_spec.user, None);
}

use crate::model::{AdminOp, AgentEvent, Command, Outcome, Proposal};
use openraft::{CommittedLeaderId, LogId};
use proto::agent::{RankCheckpointReport, RankExitReport, Report};

struct World {
    st: ClusterState,
    t: u64,
    seq: BTreeMap<String, u64>,
}

impl World {
    fn new(hosts: &[&str]) -> Self {
        let mut w = World {
            st: ClusterState::default(),
            t: 0,
            seq: BTreeMap::new(),
        };
        for (i, h) in hosts.iter().enumerate() {
            w.ok(crate::model::testkit::register_two_rails_for_test(i, h));
        }
        crate::model::testkit::confirm_reroutes_for_test(&mut w, |w| &w.st, |w, c| w.ok(c));
        // A new cluster's playbooks (host-down restarts the jobs).
        w.ok(Command::InstallShippedPlaybooks {
            files: crate::model::playbook_store::shipped_files(),
        });
        w
    }

    fn apply(&mut self, cmd: Command) -> CmdResult {
        self.t += 1;
        let lid = LogId::new(CommittedLeaderId::new(1, 1), self.t);
        self.st
            .apply_proposal(
                &lid,
                &Proposal {
                    at_ms: self.t * 1000,
                    cmds: vec![cmd],
                },
            )
            .remove(0)
    }

    fn ok(&mut self, cmd: Command) {
        let r = self.apply(cmd.clone());
        assert!(r.is_ok(), "{cmd:?} refused: {r:?}");
    }

    fn admin(&mut self, op: JobOp) -> CmdResult {
        self.apply(Command::Admin {
            actor: "t".into(),
            op: AdminOp::Job(op),
            request: None,
        })
    }

    fn event(&mut self, host: &str, kind: Report) {
        let seq = self.seq.entry(host.into()).or_default();
        *seq += 1;
        let e = AgentEvent {
            seq: *seq,
            report: kind,
        };
        self.ok(Command::AgentEvents {
            host: host.into(),
            events: vec![e],
        });
    }

    /// Runs the leader's decisions and answers every open order the
    /// way `answer` says, until nothing changes (bounded).
    fn settle(&mut self, mut answer: impl FnMut(&Action) -> Option<OrderOutcome>) {
        for _ in 0..50 {
            let mut progressed = false;
            // The leader decides now; when all it could do is wait for a
            // job's backoff, the time passes.
            let now = self.t * 1000;
            let mut cmds = crate::model::decide::decide(&self.st, now);
            if cmds.is_empty() {
                let wake = self
                    .st
                    .jobs
                    .values()
                    .filter(|j| !j.state.is_final() && j.not_before_ms > now)
                    .map(|j| j.not_before_ms)
                    .min();
                if let Some(wake) = wake {
                    cmds = crate::model::decide::decide(&self.st, wake);
                }
            }
            for c in cmds {
                match c {
                    // Leader decisions the state outran are refused at apply.
                    Command::Job(_) | Command::Playbook(_) => progressed |= self.apply(c).is_ok(),
                    c => {
                        self.ok(c);
                        progressed = true;
                    }
                }
            }
            // Agents answer the orders that are out.
            let open: Vec<_> = self.st.open_intents().cloned().collect();
            for i in open.iter().filter(|i| i.action.is_order()) {
                if let Some(outcome) = answer(&i.action) {
                    self.ok(Command::OrderDone {
                        host: i.action.host().into(),
                        id: i.id,
                        outcome,
                    });
                    progressed = true;
                }
            }
            if !progressed {
                return;
            }
        }
        panic!("the job state did not settle");
    }

    fn job(&self) -> &Job {
        &self.st.jobs["j"]
    }
}

fn obey(a: &Action) -> Option<OrderOutcome> {
    Some(match a {
        Action::CheckpointJob { .. } => crate::model::testkit::checkpointed(40),
        _ => crate::model::testkit::answer(true, "pid=1"),
    })
}

fn exited(job: &str, incarnation: u64, rank: u32, code: i32) -> Report {
    Report::RankExited(RankExitReport {
        job: job.into(),
        incarnation,
        rank,
        exit_code: code,
        signal: 0,
        detail: String::new(),
        at_unix_ns: 0,
    })
}

fn ckpt(incarnation: u64, rank: u32, step: u64) -> Report {
    Report::RankCheckpoint(RankCheckpointReport {
        job: "j".into(),
        incarnation,
        rank,
        step,
        at_unix_ns: 0,
    })
}

#[test]
fn a_job_runs_to_success_on_ready_hosts_only() {
    let mut w = World::new(&["h0", "h1", "h2"]);
    w.ok(Command::Admin {
        actor: "t".into(),
        op: AdminOp::Cordon { host: "h0".into() },
        request: None,
    });
    w.admin(JobOp::Submit { spec: spec("j", 2) }).unwrap();
    assert_eq!(w.job().state, JobState::Pending);
    w.settle(obey);
    let j = w.job();
    assert_eq!(j.state, JobState::Running);
    assert_eq!(
        j.placement,
        vec!["h1".to_string(), "h2".to_string()],
        "never the cordoned host"
    );
    assert!(j.ranks.iter().all(|r| r.started));
    let order = crate::leader::orders::open_orders(&w.st);
    assert!(order.is_empty(), "every start order answered");
    w.event("h1", exited("j", 1, 0, 0));
    assert_eq!(
        w.job().state,
        JobState::Running,
        "one rank is still running"
    );
    // The agent restarted and reports the same rank again as lost.
    w.event("h1", exited("j", 1, 0, -1));
    assert_eq!(w.job().state, JobState::Running, "a rank ends once");
    assert_eq!(w.job().restarts, 0);
    w.event("h2", exited("j", 1, 1, 0));
    assert_eq!(w.job().state, JobState::Succeeded);
    assert!(
        w.st.jobs_on("h1").next().is_none(),
        "a finished job holds no host"
    );
}

#[test]
fn start_orders_carry_peers_command_and_checkpoint() {
    let mut w = World::new(&["h0", "h1"]);
    w.admin(JobOp::Submit { spec: spec("j", 2) }).unwrap();
    w.settle(|_| None);
    let orders = crate::leader::orders::open_orders(&w.st);
    assert_eq!(orders.len(), 2);
    let Some(proto::v1::agent_order::Kind::StartRank(s)) = &orders[1].1.kind else {
        panic!("{orders:?}");
    };
    assert_eq!(orders[1].0, "h1");
    assert_eq!((s.rank, s.incarnation, s.resume_step), (1, 1, 0));
    assert_eq!(s.peers.len(), 2);
    assert_eq!(s.peers[0].host, "h0");
    assert_eq!(
        s.peers[1].addrs,
        vec!["10.0.0.2".to_string(), "10.1.0.2".to_string()]
    );
    assert_eq!(s.argv, vec!["/bin/true".to_string()]);
    assert_eq!(s.checkpoint_every, 10);
    assert_eq!(s.port, u32::from(w.job().port));
}

#[test]
fn a_failed_rank_restarts_the_job_from_its_latest_complete_checkpoint() {
    let mut w = World::new(&["h0", "h1", "h2"]);
    w.admin(JobOp::Submit { spec: spec("j", 2) }).unwrap();
    w.settle(obey);
    w.event("h0", ckpt(1, 0, 10));
    w.event("h1", ckpt(1, 1, 10));
    w.event("h0", ckpt(1, 0, 20)); // incomplete: rank 1 never wrote 20
    assert_eq!(w.job().latest_checkpoint, Some(10));
    w.event("h1", exited("j", 1, 1, 75));
    let j = w.job();
    assert_eq!(j.state, JobState::Restarting);
    assert_eq!(j.restarts, 1);
    assert_eq!(j.stopping.len(), 2, "both hosts stop incarnation 1");
    // A late event from the old incarnation changes nothing.
    w.event("h0", exited("j", 1, 0, 143));
    assert_eq!(w.job().restarts, 1);
    w.settle(obey);
    let j = w.job();
    assert_eq!(j.state, JobState::Running);
    assert_eq!(j.incarnation, 2);
    assert_eq!(j.resume_step, 10);
    assert_eq!(
        j.placement,
        vec!["h0".to_string(), "h1".to_string()],
        "survivors keep their ranks"
    );
    let stops =
        w.st.intents
            .values()
            .filter(|i| matches!(i.action, Action::StopJob { incarnation: 1, .. }))
            .count();
    assert_eq!(stops, 2);
}

/// A rank that fails while two of its job's hosts share no working rail
/// failed because of the path: its restart spends no budget (the next
/// placement keeps the two apart).
#[test]
fn a_rank_failing_on_a_cut_path_restarts_the_job_without_spending_its_budget() {
    let nic = crate::model::testkit::nic_report;
    let mut w = World::new(&["h0", "h1", "h2"]);
    for h in ["h0", "h1", "h2"] {
        for n in ["rail0", "rail1"] {
            w.event(h, nic(n, proto::agent::NicHealth::Up));
        }
    }
    w.admin(JobOp::Submit { spec: spec("j", 2) }).unwrap();
    w.settle(obey);
    assert_eq!(w.job().placement, vec!["h0", "h1"]);
    w.event("h0", nic("rail0", proto::agent::NicHealth::Down));
    w.event("h1", nic("rail1", proto::agent::NicHealth::Down));
    // Before any playbook acts, a rank gives up on its peer.
    w.event("h1", exited("j", 1, 1, 1));
    let j = w.job();
    assert_eq!(j.state, JobState::Restarting);
    assert_eq!(j.restarts, 0, "{}", j.reason);
    assert!(
        j.reason.ends_with("h0 and h1 share no working data rail"),
        "{}",
        j.reason
    );
    w.settle(obey);
    assert_eq!(w.job().placement, vec!["h0", "h2"]);
    // Any other failure still counts.
    w.event("h2", exited("j", 2, 1, 1));
    assert_eq!(w.job().restarts, 1);
}

#[test]
fn a_lost_host_is_replaced_by_a_spare_and_is_not_ordered_to_stop() {
    let mut w = World::new(&["h0", "h1", "h2", "h3"]);
    w.admin(JobOp::Submit {
        spec: spec("busy", 1),
    })
    .unwrap();
    w.settle(obey);
    assert_eq!(w.st.jobs["busy"].placement, vec!["h0".to_string()]);
    w.admin(JobOp::Submit { spec: spec("j", 2) }).unwrap();
    w.settle(obey);
    assert_eq!(w.job().placement, vec!["h1".to_string(), "h2".to_string()]);
    w.ok(Command::SetLiveness {
        host: "h2".into(),
        liveness: Liveness::Down,
    });
    // The host-down playbook's run restarts the job.
    assert_eq!(w.job().state, JobState::Running, "nothing hard-wired");
    w.settle(obey);
    let j = w.job();
    assert!(w.st.runs.values().any(|r| r.playbook == "host-down"));
    assert_eq!(j.incarnation, 2);
    assert_eq!(
        j.placement,
        vec!["h1".to_string(), "h3".to_string()],
        "the idle spare h3, not the busy h0"
    );
    assert!(!w
        .st
        .intents
        .values()
        .any(|i| matches!(&i.action, Action::StopJob { host, .. } if host == "h2")));
}

#[test]
fn the_backoff_doubles_per_failure_in_a_row_and_resets_after_progress() {
    let mut w = World::new(&["h0"]);
    let mut s = spec("j", 1);
    s.max_restarts = 10;
    s.backoff_ms = 1_000;
    w.admin(JobOp::Submit { spec: s }).unwrap();
    w.settle(obey);
    let mut delays = Vec::new();
    for inc in 1..=3 {
        w.event("h0", exited("j", inc, 0, 1));
        delays.push(w.job().not_before_ms - w.t * 1000);
        w.settle(obey);
    }
    assert_eq!(delays, vec![1_000, 2_000, 4_000]);
    w.event("h0", ckpt(4, 0, 10));
    w.event("h0", exited("j", 4, 0, 1));
    assert_eq!(
        w.job().not_before_ms - w.t * 1000,
        1_000,
        "progress resets the backoff"
    );
    assert_eq!(w.job().restarts, 4, "but every restart counts");
}

#[test]
fn a_host_back_from_down_is_told_to_stop_the_old_incarnation() {
    let mut w = World::new(&["h0", "h1", "h2"]);
    w.admin(JobOp::Submit { spec: spec("j", 2) }).unwrap();
    w.settle(obey);
    w.ok(Command::SetLiveness {
        host: "h1".into(),
        liveness: Liveness::Down,
    });
    w.settle(obey);
    assert_eq!(w.job().incarnation, 2, "placed without waiting for h1");
    assert!(w.job().stopping.is_empty());
    w.ok(Command::SetLiveness {
        host: "h1".into(),
        liveness: Liveness::Ready,
    });
    assert_eq!(w.job().stopping.get("h1"), Some(&1));
    let stop = crate::model::decide::wanted_actions(&w.st);
    assert!(
        stop.contains(&Action::StopJob {
            job: "j".into(),
            incarnation: 1,
            host: "h1".into()
        }),
        "{stop:?}"
    );
    w.settle(obey);
    assert!(w.job().stopping.is_empty());
    assert!(w.job().fenced.is_empty());
}

#[test]
fn too_many_failures_fail_the_job() {
    let mut w = World::new(&["h0"]);
    let mut s = spec("j", 1);
    s.max_restarts = 1;
    w.admin(JobOp::Submit { spec: s }).unwrap();
    w.settle(obey);
    w.event("h0", exited("j", 1, 0, 1));
    assert_eq!(w.job().state, JobState::Restarting);
    assert!(w.job().not_before_ms > w.t * 1000, "backoff");
    w.settle(obey);
    assert_eq!(w.job().incarnation, 2);
    w.event("h0", exited("j", 2, 0, 1));
    assert_eq!(w.job().state, JobState::Failed);
    assert!(w.job().reason.contains("gave up"), "{}", w.job().reason);
}

#[test]
fn drain_halts_the_job_at_a_checkpoint_and_moves_it_without_losing_a_step() {
    let mut w = World::new(&["h0", "h1", "h2"]);
    w.admin(JobOp::Submit { spec: spec("j", 2) }).unwrap();
    w.settle(obey);
    assert_eq!(w.job().placement, vec!["h0".to_string(), "h1".to_string()]);
    w.ok(Command::Admin {
        actor: "t".into(),
        op: AdminOp::Drain {
            host: "h0".into(),
            reason: "maintenance".into(),
            deadline_ms: None,
        },
        request: None,
    });
    w.settle(obey);
    let j = w.job();
    assert_eq!(j.state, JobState::Running);
    assert_eq!(j.incarnation, 2);
    assert_eq!(j.resume_step, 40, "resumes from the halting checkpoint");
    assert_eq!(j.restarts, 0, "a planned move is not a failure");
    assert_eq!(j.placement, vec!["h2".to_string(), "h1".to_string()]);
    let halts =
        w.st.intents
            .values()
            .filter(|i| matches!(i.action, Action::CheckpointJob { halt: true, .. }))
            .count();
    assert_eq!(halts, 2, "every host of the job halts");
    assert_eq!(
        w.st.hosts["h0"].drain.as_ref().unwrap().phase,
        crate::model::DrainPhase::Drained
    );
}

#[test]
fn at_the_drain_deadline_the_job_is_moved_from_its_latest_checkpoint() {
    let mut w = World::new(&["h0", "h1", "h2"]);
    w.admin(JobOp::Submit { spec: spec("j", 2) }).unwrap();
    w.settle(obey);
    w.event("h0", ckpt(1, 0, 30));
    w.event("h1", ckpt(1, 1, 30));
    w.ok(Command::Admin {
        actor: "t".into(),
        op: AdminOp::Drain {
            host: "h0".into(),
            reason: "r".into(),
            deadline_ms: Some(1),
        },
        request: None,
    });
    // Checkpoint orders are never answered: the deadline decides.
    w.settle(|a| match a {
        Action::CheckpointJob { .. } => None,
        _ => Some(crate::model::testkit::answer(true, "pid=1")),
    });
    let j = w.job();
    assert_eq!(j.incarnation, 2);
    assert_eq!(j.state, JobState::Running);
    assert_eq!(j.resume_step, 30);
    assert!(!j.placement.contains(&"h0".to_string()));
    assert!(j.reason.contains("deadline"), "{}", j.reason);
    assert_eq!(j.restarts, 0);
}

#[test]
fn bad_job_operations_change_nothing() {
    let mut w = World::new(&["h0"]);
    let before = w.st.clone();
    let mut s = spec("j", 1);
    s.hosts = vec!["nope".into()];
    assert!(matches!(
        w.admin(JobOp::Submit { spec: s }),
        Err(CmdError::NotFound { .. })
    ));
    assert!(matches!(
        w.admin(JobOp::Cancel { job: "x".into() }),
        Err(CmdError::NotFound { .. })
    ));
    assert!(w.admin(JobOp::Checkpoint { job: "x".into() }).is_err());
    assert!(w
        .apply(Command::Job(JobCommand::Place {
            job: "x".into(),
            incarnation: 0,
            placement: vec!["h0".into()],
        }))
        .is_err());
    let mut after = w.st.clone();
    after.last_log_index = before.last_log_index;
    assert_eq!(after, before);
    w.admin(JobOp::Submit { spec: spec("j", 1) }).unwrap();
    assert!(matches!(
        w.admin(JobOp::Submit { spec: spec("j", 1) }),
        Err(CmdError::FailedPrecondition(_))
    ));
    // A stale placement decision is refused.
    w.settle(obey);
    assert!(w
        .apply(Command::Job(JobCommand::Place {
            job: "j".into(),
            incarnation: 0,
            placement: vec!["h0".into()],
        }))
        .is_err());
    assert_eq!(w.job().incarnation, 1);
}

/// `job show` says why a job is not placed: too few eligible hosts, each
/// other host with its reason; nothing once it can be placed.
#[test]
fn a_pending_job_says_why_it_is_not_placed() {
    use crate::model::jobs::waiting_reason;
    let mut w = World::new(&["h0", "h1", "h2"]);
    w.ok(Command::Admin {
        actor: "t".into(),
        op: AdminOp::Cordon { host: "h2".into() },
        request: None,
    });
    let mut s = spec("j", 9);
    s.labels = BTreeMap::from([("rack".to_string(), "a".to_string())]);
    w.admin(JobOp::Submit { spec: s }).unwrap();
    w.settle(obey);
    assert_eq!(w.job().state, JobState::Pending);
    let why = waiting_reason(&w.st, w.job(), w.t * 1000).expect("a reason");
    assert!(
        why.starts_with("needs 9 hosts (9 ranks, 1 per host); 0 eligible"),
        "{why}"
    );
    assert!(why.contains("h0 no label rack=a"), "{why}");
    assert!(why.contains("h2 cordoned"), "{why}");
    // A job that fits has no reason to wait.
    w.admin(JobOp::Submit { spec: spec("k", 2) }).unwrap();
    let k = w.st.jobs["k"].clone();
    assert_eq!(waiting_reason(&w.st, &k, w.t * 1000), None);
}

/// torchrun's `--nproc-per-node`: a host's ranks in a row, distinct
/// hosts, one checkpoint order per host, and a lost host's whole group
/// moves to one spare.
#[test]
fn several_ranks_per_host_are_placed_in_a_row_and_move_together() {
    let mut w = World::new(&["h0", "h1", "h2"]);
    let mut s = spec("j", 4);
    s.ranks_per_host = 2;
    s.hosts = vec!["h1".into(), "h0".into(), "h2".into()];
    w.admin(JobOp::Submit { spec: s }).unwrap();
    w.settle(obey);
    let j = w.job();
    assert_eq!(j.state, JobState::Running);
    assert_eq!(j.placement, ["h1", "h1", "h0", "h0"].map(String::from));
    let starts: Vec<(String, u32)> =
        w.st.intents
            .values()
            .filter_map(|i| match &i.action {
                Action::StartRank { host, rank, .. } => Some((host.clone(), *rank)),
                _ => None,
            })
            .collect();
    assert_eq!(starts.len(), 4, "one start order per rank: {starts:?}");
    // The host-down playbook restarts the job: h0's two ranks go to h2.
    w.ok(Command::SetLiveness {
        host: "h0".into(),
        liveness: Liveness::Down,
    });
    w.settle(obey);
    let j = w.job();
    assert_eq!(j.incarnation, 2);
    assert_eq!(j.placement, ["h1", "h1", "h2", "h2"].map(String::from));
    // Checkpoint orders go to each host once, for all its ranks.
    w.admin(JobOp::Checkpoint { job: "j".into() }).unwrap();
    let ckpt_hosts: Vec<String> =
        w.st.open_intents()
            .filter_map(|i| match &i.action {
                Action::CheckpointJob { host, .. } => Some(host.clone()),
                _ => None,
            })
            .collect();
    assert_eq!(ckpt_hosts, ["h1", "h2"].map(String::from));
}

#[test]
fn a_placement_that_splits_a_hosts_ranks_is_refused() {
    let mut w = World::new(&["h0", "h1", "h2"]);
    let mut s = spec("j", 4);
    s.ranks_per_host = 2;
    w.admin(JobOp::Submit { spec: s }).unwrap();
    for bad in [
        ["h0", "h1", "h0", "h1"],
        ["h0", "h0", "h0", "h0"],
        ["h0", "h0", "h1", "h2"],
    ] {
        let r = w.apply(Command::Job(JobCommand::Place {
            job: "j".into(),
            incarnation: 0,
            placement: bad.map(String::from).to_vec(),
        }));
        assert!(
            matches!(r, Err(CmdError::InvalidArgument(_))),
            "{bad:?}: {r:?}"
        );
    }
    assert_eq!(w.job().incarnation, 0);
    w.ok(Command::Job(JobCommand::Place {
        job: "j".into(),
        incarnation: 0,
        placement: ["h2", "h2", "h0", "h0"].map(String::from).to_vec(),
    }));
    // Specs the per-host count cannot serve are refused at submission.
    for (ranks, per, hosts) in [(4, 3, 0), (4, 0, 0), (4, 65, 0), (4, 2, 1)] {
        let mut s = spec("k", ranks);
        s.ranks_per_host = per;
        s.hosts = ["h0", "h1"]
            .iter()
            .take(hosts)
            .map(|h| h.to_string())
            .collect();
        assert!(
            matches!(s.validate(), Err(CmdError::InvalidArgument(_))),
            "{ranks} ranks, {per} per host, {hosts} hosts"
        );
    }
}

#[test]
fn cancel_stops_every_rank_and_start_orders_of_old_incarnations_are_cancelled() {
    let mut w = World::new(&["h0", "h1"]);
    w.admin(JobOp::Submit { spec: spec("j", 2) }).unwrap();
    w.settle(|_| None);
    assert_eq!(crate::leader::orders::open_orders(&w.st).len(), 2);
    w.admin(JobOp::Cancel { job: "j".into() }).unwrap();
    assert_eq!(w.job().state, JobState::Cancelled);
    w.settle(obey);
    let cancelled =
        w.st.intents
            .values()
            .filter(|i| {
                matches!(i.action, Action::StartRank { .. })
                    && matches!(i.status, IntentStatus::Closed(Outcome::Cancelled { .. }))
            })
            .count();
    assert_eq!(cancelled, 2);
    assert!(w.job().stopping.is_empty(), "both stops answered");
}

#[test]
fn an_ended_jobs_name_is_used_again_with_newer_incarnations() {
    let mut w = World::new(&["h0", "h1"]);
    w.admin(JobOp::Submit { spec: spec("j", 2) }).unwrap();
    w.settle(obey);
    assert_eq!(w.job().state, JobState::Running);
    let running = w.admin(JobOp::Submit { spec: spec("j", 2) });
    assert!(
        matches!(&running, Err(CmdError::FailedPrecondition(m)) if m.contains("is Running")),
        "{running:?}"
    );
    w.admin(JobOp::Cancel { job: "j".into() }).unwrap();
    // Its ranks are being stopped: not yet.
    let stopping = w.admin(JobOp::Submit { spec: spec("j", 2) });
    assert!(
        matches!(&stopping, Err(CmdError::FailedPrecondition(m)) if m.contains("still being stopped")),
        "{stopping:?}"
    );
    w.settle(obey);
    let old = w.job().incarnation;
    w.admin(JobOp::Submit { spec: spec("j", 2) }).unwrap();
    assert_eq!(w.job().state, JobState::Pending);
    w.settle(obey);
    let j = w.job();
    assert_eq!(j.state, JobState::Running);
    assert!(j.incarnation > old, "{} after {old}", j.incarnation);
    assert_eq!(w.st.jobs.len(), 1, "the new job replaced the ended one");
}

mod json {
    #[test]
    fn a_job_with_checkpoints_and_exits_round_trips_through_the_admin_json() {
        let mut j = crate::model::testkit::placed_for_test("j", &["h0"]);
        j.checkpoints.insert(10, [0u32].into_iter().collect());
        j.ranks[0].exit = Some(crate::model::jobs::Exit {
            code: 0,
            signal: 0,
            detail: "d".into(),
        });
        let reply = crate::api::AdminReply::Job {
            job: Box::new(j.clone()),
            waiting: None,
        };
        let text = serde_json::to_string(&reply).unwrap();
        let back: crate::api::AdminReply = serde_json::from_str(&text).unwrap();
        let crate::api::AdminReply::Job { job, .. } = back else {
            panic!("{text}")
        };
        assert_eq!(*job, j);
    }
}

#[test]
fn a_drained_host_without_work_can_be_removed_and_comes_back_as_new() {
    let mut w = World::new(&["h0", "h1", "h2"]);
    w.admin(JobOp::Submit { spec: spec("j", 2) }).unwrap();
    w.settle(obey);
    let on = w.job().placement.clone();
    let busy = on[0].clone();
    let remove = |host: &str| Command::Admin {
        actor: "t".into(),
        op: AdminOp::RemoveHost { host: host.into() },
        request: None,
    };
    // A Ready host serving a rank is refused, naming why.
    let r = w.apply(remove(&busy));
    assert!(
        matches!(&r, Err(CmdError::FailedPrecondition(m)) if m.contains("drain it first")),
        "{r:?}"
    );
    w.ok(Command::Admin {
        actor: "t".into(),
        op: AdminOp::Drain {
            host: busy.clone(),
            reason: "decommission".into(),
            deadline_ms: None,
        },
        request: None,
    });
    w.settle(obey);
    assert_eq!(
        w.st.hosts[&busy].drain.as_ref().map(|d| d.phase),
        Some(crate::model::hosts::DrainPhase::Drained)
    );
    assert!(!w.job().placement.contains(&busy), "the job moved off");
    let id = w.st.hosts[&busy].id;
    let graph_before = w.st.probe_graph.len();
    w.ok(remove(&busy));
    assert!(!w.st.hosts.contains_key(&busy));
    assert!(!w.st.host_ids.contains_key(&id));
    assert!(!w.st.probe_graph.contains(id));
    assert_eq!(w.st.probe_graph.len(), graph_before - 1);
    assert!(w
        .st
        .admin_history
        .iter()
        .any(|r| r.op == AdminOp::RemoveHost { host: busy.clone() }));
    // Gone: a second removal is "not found"; the job runs on.
    assert!(matches!(
        w.apply(remove(&busy)),
        Err(CmdError::NotFound { .. })
    ));
    assert_eq!(w.job().state, JobState::Running);
    // Its agent registering again makes a new host, with a new id.
    w.ok(crate::model::testkit::register_two_rails_for_test(7, &busy));
    assert_ne!(w.st.hosts[&busy].id, id);
    assert!(w.st.hosts[&busy].drain.is_none());
}
