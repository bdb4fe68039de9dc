//! Tests of runs.

use crate::model::events::Event;
use crate::model::hosts::{DrainPhase, HostStatus, Liveness};
use crate::model::intents::{Action, Intent, Outcome};
use crate::model::jobs::types::JobState;
use crate::model::result::{CmdError, CmdOk, CmdResult};
use crate::model::runs::decide::wanted_run_commands;
use crate::model::runs::types::{PlaybookRun, RunCommand, RunState, StepOp};
use crate::model::runs::view::RunView;
use crate::model::state::ClusterState;
use crate::model::IncidentKind;
use proto::agent::OrderOutcome;

use std::collections::BTreeMap;

use crate::model::jobs::{JobOp, JobSpec};
use crate::model::{AdminOp, AgentEvent, Command, IntentStatus, Proposal};
use openraft::{CommittedLeaderId, LogId};
use proto::agent::{NicHealth, Report};
use proto::v1::agent_order;

/// The replicated state plus a simulated leader loop and agents that
/// execute each order id at most once (answering repeats from their
/// order log, as `nodeagent`'s `OrderLog` does).
struct World {
    st: ClusterState,
    now: u64,
    index: u64,
    seq: BTreeMap<String, u64>,
    /// Outcomes of executed orders by id (the agents' order logs).
    executed: BTreeMap<u64, OrderOutcome>,
    /// Orders delivered to agents (ids; repeats included).
    delivered: Vec<u64>,
}

impl World {
    fn new(hosts: &[&str], with_playbooks: bool) -> Self {
        let mut w = World {
            st: ClusterState::default(),
            now: 1_000,
            index: 0,
            seq: BTreeMap::new(),
            executed: BTreeMap::new(),
            delivered: Vec::new(),
        };
        for (i, h) in hosts.iter().enumerate() {
            w.ok(crate::model::testkit::register_two_rails_for_test(i, h));
        }
        crate::model::testkit::confirm_reroutes_for_test(
            &mut w,
            |w| &w.st,
            |w, c| {
                w.ok(c);
            },
        );
        if with_playbooks {
            // What a new cluster's first leader does.
            w.ok(Command::InstallShippedPlaybooks {
                files: crate::model::playbook_store::shipped_files(),
            });
            assert_eq!(w.st.playbooks.len(), playbooks::SHIPPED.len());
        } else {
            // A cluster whose shipped playbooks were installed once and
            // then deleted: the leader does not install them again.
            w.st.shipped_playbooks_installed = true;
        }
        w
    }

    fn apply(&mut self, cmd: Command) -> CmdResult {
        self.index += 1;
        self.now += 1;
        let lid = LogId::new(CommittedLeaderId::new(1, 1), self.index);
        self.st
            .apply_proposal(
                &lid,
                &Proposal {
                    at_ms: self.now,
                    cmds: vec![cmd],
                },
            )
            .remove(0)
    }

    fn ok(&mut self, cmd: Command) -> CmdOk {
        let r = self.apply(cmd.clone());
        r.unwrap_or_else(|e| panic!("{cmd:?} refused: {e}"))
    }

    fn admin(&mut self, op: AdminOp) -> CmdOk {
        self.ok(Command::Admin {
            actor: "t".into(),
            op,
            request: None,
        })
    }

    fn nic(&mut self, host: &str, nic: &str, state: NicHealth) {
        self.report(host, crate::model::testkit::nic_report(nic, state));
    }

    /// `host`'s agent reports `report` (its next sequence number).
    fn report(&mut self, host: &str, report: Report) {
        let seq = self.seq.entry(host.into()).or_default();
        *seq += 1;
        let e = AgentEvent { seq: *seq, report };
        self.ok(Command::AgentEvents {
            host: host.into(),
            events: vec![e],
        });
    }

    /// One pass of the leader's reconciler (`decide`, as
    /// `reconciler::step` proposes it), then the agents get the open orders; `agent` decides
    /// the outcome of an order the first time its id arrives (`None`:
    /// no answer yet). Returns whether anything was committed.
    fn tick(&mut self, agent: &mut impl FnMut(&Action) -> Option<OrderOutcome>) -> bool {
        let now = self.now;
        let mut progressed = false;
        for c in crate::model::decide::decide(&self.st, now) {
            match c {
                // Leader decisions the state outran are refused at apply.
                Command::Job(_) | Command::Playbook(_) => progressed |= self.apply(c).is_ok(),
                c => {
                    self.ok(c);
                    progressed = true;
                }
            }
        }
        progressed |= self.deliver(agent);
        progressed
    }

    /// Sends every open order (what the `OrderHub` would send).
    fn deliver(&mut self, agent: &mut impl FnMut(&Action) -> Option<OrderOutcome>) -> bool {
        let mut progressed = false;
        for (host, order) in crate::leader::orders::open_orders(&self.st) {
            let id = order.order_id;
            self.delivered.push(id);
            let action = self.st.intents[&id].action.clone();
            let answer = match self.executed.get(&id) {
                Some(done) => Some(done.clone()),
                None => agent(&action).inspect(|a| {
                    self.executed.insert(id, a.clone());
                }),
            };
            if let Some(outcome) = answer {
                self.ok(Command::OrderDone { host, id, outcome });
                progressed = true;
            }
        }
        progressed
    }

    fn settle(&mut self, mut agent: impl FnMut(&Action) -> Option<OrderOutcome>) {
        for _ in 0..100 {
            if !self.tick(&mut agent) {
                return;
            }
        }
        panic!("the world did not settle");
    }

    fn advance(&mut self, ms: u64) {
        self.now += ms;
    }

    fn run(&self, id: u64) -> &PlaybookRun {
        &self.st.runs[&id]
    }

    fn step_intents(&self, run: u64) -> Vec<&Intent> {
        self.st
            .intents
            .values()
            .filter(|i| matches!(&i.action, Action::PlaybookStep { run: r, .. } if *r == run))
            .collect()
    }

    /// How many logged events are `want` (the typed event, not its line).
    fn events_of(&self, want: &crate::model::events::Event) -> usize {
        self.st.events.iter().filter(|e| &e.event == want).count()
    }

    /// How many notify steps logged exactly `message`.
    fn notified(&self, message: &str) -> usize {
        self.events_of(&crate::model::events::Event::Notify {
            message: message.into(),
        })
    }
}

fn obey(a: &Action) -> Option<OrderOutcome> {
    Some(match a {
        Action::CheckpointJob { .. } => crate::model::testkit::checkpointed(40),
        Action::PlaybookStep { .. } => crate::model::testkit::answer(true, "moved 2 connections"),
        _ => crate::model::testkit::answer(true, "pid=1"),
    })
}

/// h0's rail0 goes down while its backup rail1 is up.
fn nic_down_world() -> World {
    let mut w = World::new(&["h0", "h1"], true);
    w.nic("h0", "rail1", NicHealth::Up);
    w.nic("h0", "rail0", NicHealth::Down);
    assert_eq!(w.st.incidents.len(), 1);
    w
}

#[test]
fn a_nic_down_incident_runs_the_migrate_step_as_a_failover_order() {
    let mut w = nic_down_world();
    assert_eq!(
        wanted_run_commands(&w.st),
        vec![RunCommand::Start {
            incident: 1,
            playbook: "nic-down".into(),
            version: w.st.playbooks["nic-down"].version,
        }]
    );
    w.tick(&mut |_| None);
    let run = w.run(1);
    assert_eq!(
        (run.playbook.as_str(), run.step, run.attempt),
        ("nic-down", 0, 0)
    );
    assert_eq!(run.state, RunState::Running);
    let intent = run
        .step_intent
        .expect("the migrate step waits for its order");
    let orders = crate::leader::orders::open_orders(&w.st);
    assert_eq!(orders.len(), 1);
    assert_eq!(orders[0].0, "h0");
    assert_eq!(
        orders[0].1.order_id, intent,
        "the order id is the intent id"
    );
    let Some(agent_order::Kind::Failover(f)) = &orders[0].1.kind else {
        panic!("{orders:?}");
    };
    assert_eq!((f.nic.as_str(), f.to.as_str()), ("rail0", "rail1"));
    w.settle(obey);
    let run = w.run(1);
    assert_eq!(run.state, RunState::Completed);
    // The work is off the NIC, but the NIC is still down: the incident
    // stays open (and no second run starts) until the NIC is back.
    assert!(
        w.st.incidents[&1].closed_ms.is_none(),
        "a NIC's incident outlives its completed run while the NIC is down"
    );
    assert!(w
        .st
        .events
        .iter()
        .any(|e| e.event == Event::NicIncidentStays { incident: 1 }));
    assert!(
        wanted_run_commands(&w.st).is_empty(),
        "one run per incident"
    );
    w.nic("h0", "rail0", NicHealth::Up);
    assert!(
        w.st.incidents[&1].closed_ms.is_some(),
        "the NIC's recovery closes it"
    );
    assert!(w.st.hosts["h0"].nics["rail0"].open_incidents.is_empty());
    assert_eq!(
        w.notified("nic_down on h0: nic-down finished for h0 rail0"),
        1
    );
    // Skipped steps: checkpoint to return were jumped over by `next`.
    let steps: Vec<u32> = w
        .step_intents(1)
        .iter()
        .map(|i| match &i.action {
            Action::PlaybookStep { step, .. } => *step,
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(steps, vec![0, 5], "migrate, then announce");
    assert!(w
        .step_intents(1)
        .iter()
        .all(|i| i.status == IntentStatus::Closed(Outcome::Done)));
    // Runs and their step intents are part of snapshots.
    let back = crate::model::testkit::snapshot_roundtrip(&w.st);
    assert_eq!(back, w.st);
    // And of the admin JSON.
    let reply = crate::api::AdminReply::PlaybookRuns {
        runs: vec![RunView::of(&w.st, w.run(1))],
        truncated: false,
    };
    let text = serde_json::to_string(&reply).unwrap();
    let back: crate::api::AdminReply = serde_json::from_str(&text).unwrap();
    let crate::api::AdminReply::PlaybookRuns { runs, .. } = back else {
        panic!("{text}");
    };
    assert_eq!(runs[0].state, RunState::Completed);
    assert_eq!(runs[0].playbook, "nic-down");
}

/// The leader dies after committing the step's intent, before sending
/// the order (or after sending it, the agent's answer lost): the state
/// is all the next leader has. It starts nothing again and sends the
/// same order id; the agent executes it once.
#[test]
fn a_new_leader_resumes_the_open_step_with_the_same_order_id() {
    let mut w = nic_down_world();
    for c in wanted_run_commands(&w.st) {
        w.ok(Command::Playbook(c));
    }
    let intent = w.run(1).step_intent.unwrap();
    // --- the old leader dies here (maybe it proposed the start twice) ---
    let again = RunCommand::Start {
        incident: 1,
        playbook: "nic-down".into(),
        version: w.st.playbooks["nic-down"].version,
    };
    assert!(matches!(
        w.apply(Command::Playbook(again)),
        Err(CmdError::FailedPrecondition(_))
    ));
    assert!(
        wanted_run_commands(&w.st).is_empty(),
        "one run per incident"
    );
    assert!(crate::model::decide::wanted_actions(&w.st).is_empty());
    assert_eq!(w.st.runs.len(), 1);
    // The new leader sends the open order; the answer is lost, so it is
    // sent again after the resend period; the agent executes it once.
    let mut executions = 0;
    let mut lose_first_answer = true;
    for _ in 0..3 {
        let orders = crate::leader::orders::open_orders(&w.st);
        assert!(orders.len() <= 1);
        for (_, o) in &orders {
            assert_eq!(o.order_id, intent);
            w.delivered.push(o.order_id);
            if w.executed
                .insert(o.order_id, crate::model::testkit::answer(true, "moved"))
                .is_none()
            {
                executions += 1;
            }
            if lose_first_answer {
                lose_first_answer = false;
                continue;
            }
            let outcome = w.executed[&o.order_id].clone();
            w.ok(Command::OrderDone {
                host: "h0".into(),
                id: o.order_id,
                outcome: outcome.clone(),
            });
            // A late duplicate answer changes nothing.
            let before = w.st.runs.clone();
            w.ok(Command::OrderDone {
                host: "h0".into(),
                id: o.order_id,
                outcome,
            });
            assert_eq!(w.st.runs, before);
        }
    }
    assert_eq!(executions, 1);
    assert_eq!(w.delivered, vec![intent, intent], "one id, sent twice");
    w.settle(obey);
    assert_eq!(w.run(1).state, RunState::Completed);
    let migrate_intents = w
        .step_intents(1)
        .iter()
        .filter(|i| matches!(i.action, Action::PlaybookStep { step: 0, .. }))
        .count();
    assert_eq!(migrate_intents, 1);
}

#[test]
fn a_failing_step_is_retried_then_escalated() {
    let mut w = World::new(&["h0", "h1"], true);
    w.nic("h0", "rail1", NicHealth::Up);
    w.nic("h0", "rail0", NicHealth::Flapping);
    w.settle(|a| match a {
        Action::PlaybookStep { .. } => Some(crate::model::testkit::answer(
            false,
            "job j rank 0 did not answer",
        )),
        _ => Some(crate::model::testkit::answer(true, String::new())),
    });
    let first = w.run(1);
    assert_eq!(first.playbook, "nic-flapping");
    assert_eq!(
        first.state,
        RunState::Escalated {
            playbook: "nic-flapping-stuck".into(),
            run: 2
        }
    );
    let attempts: Vec<(u32, IntentStatus)> = w
        .step_intents(1)
        .iter()
        .map(|i| match &i.action {
            Action::PlaybookStep { attempt, .. } => (*attempt, i.status.clone()),
            _ => unreachable!(),
        })
        .collect();
    let failed = IntentStatus::Closed(Outcome::Failed {
        error: "job j rank 0 did not answer".into(),
    });
    assert_eq!(
        attempts,
        vec![(0, failed.clone()), (1, failed.clone()), (2, failed)],
        "retries = 2: three attempts, each its own order"
    );
    let second = w.run(2);
    assert_eq!(second.playbook, "nic-flapping-stuck");
    assert_eq!(second.escalated_from, Some(1));
    assert_eq!(second.state, RunState::Completed);
    assert_eq!(
        w.notified(
            "h0 rail0 (rail 0) still flaps after 30m; connections stay off it, check the cable and port"
        ),
        1
    );
    assert_eq!(
        w.st.runs.values().filter(|r| r.state.is_active()).count(),
        0
    );
}

#[test]
fn a_wait_until_step_fails_at_its_timeout() {
    let mut w = World::new(&["h0", "h1"], true);
    w.nic("h0", "rail1", NicHealth::Up);
    w.nic("h0", "rail0", NicHealth::Flapping);
    w.settle(obey);
    let run = w.run(1);
    assert_eq!(run.step_id(), "wait-reusable");
    let RunState::Waiting { until_ms } = run.state else {
        panic!("{:?}", run.state);
    };
    assert_eq!(until_ms, run.step_started_ms + 30 * 60 * 1000);
    w.advance(29 * 60 * 1000);
    w.settle(obey);
    assert!(matches!(w.run(1).state, RunState::Waiting { .. }));
    w.advance(60 * 1000);
    w.settle(obey);
    let run = w.run(1);
    assert!(
        matches!(&run.state, RunState::Escalated { playbook, .. } if playbook == "nic-flapping-stuck"),
        "{:?}",
        run.state
    );
    assert!(
        run.log.iter().any(|l| l
            .line
            .contains("timed out after 30m waiting for nic_reusable")),
        "{:?}",
        run.log
    );
    assert_eq!(w.run(2).state, RunState::Completed);
}

#[test]
fn a_waiting_run_outlives_its_cleared_incident_and_fails_back() {
    let mut w = World::new(&["h0", "h1"], true);
    w.nic("h0", "rail1", NicHealth::Up);
    w.nic("h0", "rail0", NicHealth::Flapping);
    w.settle(obey);
    assert!(matches!(w.run(1).state, RunState::Waiting { .. }));
    w.nic("h0", "rail0", NicHealth::Up);
    assert!(w.st.incidents[&1].closed_ms.is_some());
    w.settle(obey);
    let run = w.run(1);
    assert_eq!(run.state, RunState::Completed, "{:?}", run.log);
    let failback = w.step_intents(1).into_iter().any(|i| {
        matches!(&i.action, Action::PlaybookStep { op: StepOp::Failback { nic }, .. } if nic == "rail0")
            && i.status == IntentStatus::Closed(Outcome::Done)
    });
    assert!(failback);
}

#[test]
fn a_drain_beyond_the_limits_fails_the_step() {
    // rail1 never reported: no healthy backup, so nic-down skips the
    // migration, checkpoints (no jobs) and drains.
    let refused = |drained_first: bool| {
        let mut w = World::new(&["h0", "h1", "h2", "h3"], true);
        if drained_first {
            w.admin(AdminOp::Drain {
                host: "h3".into(),
                reason: "maintenance".into(),
                deadline_ms: None,
            });
        }
        w.nic("h0", "rail0", NicHealth::Down);
        w.settle(obey);
        w
    };
    let w = refused(true);
    let run = w.run(1);
    assert!(
        matches!(&run.state, RunState::Failed { why } if why.contains("limits")),
        "{:?}",
        run.state
    );
    assert!(run
        .log
        .iter()
        .any(|l| l.line.contains("skipped: backup_nic_healthy is false")));
    assert_eq!(w.st.hosts["h0"].drain, None, "nothing drained");
    assert!(
        w.st.incidents[&1].closed_ms.is_none(),
        "left to an operator"
    );
    assert!(w.step_intents(1).iter().any(|i| matches!(
        (&i.action, &i.status),
        (Action::PlaybookStep { op: StepOp::Drain { .. }, .. }, IntentStatus::Closed(Outcome::Failed { error }))
            if error.contains("max_drained_hosts = 1")
    )));
    // Within the limits the drain runs and the playbook waits for the
    // NIC to be reusable before it returns the host to service.
    let w = refused(false);
    assert_eq!(w.run(1).step_id(), "wait-reusable", "{:?}", w.run(1).log);
    assert!(w.run(1).state.is_active());
    let d = w.st.hosts["h0"].drain.as_ref().unwrap();
    assert_eq!(d.phase, DrainPhase::Drained);
    assert_eq!(d.by, "playbook:nic-down");
    assert!(
        w.st.incidents[&1].closed_ms.is_none(),
        "the host is drained, but its NIC is still down: the incident stays open"
    );
}

#[test]
fn an_incident_cleared_mid_run_cancels_the_run_and_its_order() {
    let mut w = nic_down_world();
    w.settle(|_| None);
    let intent = w.run(1).step_intent.unwrap();
    assert_eq!(crate::leader::orders::open_orders(&w.st).len(), 1);
    w.nic("h0", "rail0", NicHealth::Up);
    let run = w.run(1);
    assert!(
        matches!(run.state, RunState::Cancelled { .. }),
        "{:?}",
        run.state
    );
    assert_eq!(run.step_intent, None);
    assert!(matches!(
        w.st.intents[&intent].status,
        IntentStatus::Closed(Outcome::Cancelled { .. })
    ));
    assert!(crate::leader::orders::open_orders(&w.st).is_empty());
    // A late answer to the cancelled order changes nothing.
    let before = w.st.runs.clone();
    w.ok(Command::OrderDone {
        host: "h0".into(),
        id: intent,
        outcome: crate::model::testkit::answer(true, "moved"),
    });
    assert_eq!(w.st.runs, before);
    assert!(wanted_run_commands(&w.st).is_empty());
}

fn spec(ranks: u32) -> JobSpec {
    JobSpec {
        name: "j".into(),
        ranks,
        hosts: vec![],
        labels: BTreeMap::new(),
        command: vec!["/bin/true".into()],
        env: BTreeMap::new(),
        checkpoint_dir: "/tmp/ckpt".into(),
        checkpoint_every: 10,
        max_restarts: 3,
        backoff_ms: 100,
        user: None,
        ranks_per_host: 1,
    }
}

#[test]
fn the_shipped_library_is_installed_once_and_an_admins_version_wins() {
    let mut w = World::new(&["h0"], false);
    // A new cluster: nothing installed yet.
    w.st.shipped_playbooks_installed = false;
    let mine = "name = \"host-down\"\n[trigger]\nincidents = [\"host_down\"]\n\n[[steps]]\nid = \"say\"\naction = \"notify\"\nmessage = \"mine\"\n";
    w.admin(AdminOp::PlaybookApply {
        files: vec![crate::model::playbook_store::PlaybookFile {
            file: "mine.toml".into(),
            text: mine.into(),
        }],
    });
    let files = crate::model::playbook_store::shipped_files();
    w.ok(Command::InstallShippedPlaybooks {
        files: files.clone(),
    });
    assert!(w.st.shipped_playbooks_installed);
    assert_eq!(w.st.playbooks.len(), playbooks::SHIPPED.len());
    assert_eq!(
        w.st.playbooks["host-down"].source, mine,
        "the admin's stays"
    );
    assert_eq!(
        w.st.playbooks["nic-down"].applied_by,
        crate::model::playbook_store::SHIPPED_ACTOR
    );
    // Deleted by an admin, not brought back by a repeated install.
    w.admin(AdminOp::PlaybookDelete {
        name: "nic-down".into(),
    });
    let version = w.st.playbook_version;
    w.ok(Command::InstallShippedPlaybooks { files });
    assert!(!w.st.playbooks.contains_key("nic-down"));
    assert_eq!(w.st.playbook_version, version);
}

#[test]
fn webhook_notifications_wait_for_the_leaders_post() {
    let mut w = World::new(&["h0"], false);
    let pb = "name = \"hook\"\n[trigger]\nincidents = [\"nic_down\"]\n\n[[steps]]\nid = \"tell\"\naction = \"notify\"\nmessage = \"{host} {nic} down\"\nwebhook = \"http://127.0.0.1:9/hook\"\ntimeout = \"10s\"\nretries = 1\n";
    w.admin(AdminOp::PlaybookApply {
        files: vec![crate::model::playbook_store::PlaybookFile {
            file: "hook.toml".into(),
            text: pb.into(),
        }],
    });
    w.nic("h0", "rail0", NicHealth::Down);
    w.settle(obey);
    // Logged at once; the intent waits for the POST.
    assert_eq!(w.notified("h0 rail0 down"), 1);
    let open = crate::leader::webhooks::open_webhooks(&w.st);
    assert_eq!(open.len(), 1, "{open:?}");
    let first = open[0].clone();
    assert_eq!(first.url, "http://127.0.0.1:9/hook");
    assert_eq!(
        first.body.key,
        crate::leader::webhooks::idempotency_key(first.intent)
    );
    assert_eq!(first.body.incident_kind, "nic_down");
    // Only webhook intents can be answered this way.
    let other = w.apply(Command::WebhookDone {
        id: first.intent + 100,
        ok: true,
        detail: String::new(),
    });
    assert!(other.is_err());
    // A failed POST: the step is retried with a new intent (new key).
    w.ok(Command::WebhookDone {
        id: first.intent,
        ok: false,
        detail: "webhook answered 503".into(),
    });
    w.settle(obey);
    let open = crate::leader::webhooks::open_webhooks(&w.st);
    assert_eq!(open.len(), 1);
    assert_ne!(open[0].intent, first.intent);
    assert_eq!(w.run(1).attempt, 1);
    // A late answer for the old attempt changes nothing.
    w.ok(Command::WebhookDone {
        id: first.intent,
        ok: true,
        detail: "late".into(),
    });
    assert!(w.run(1).state.is_active());
    w.ok(Command::WebhookDone {
        id: open[0].intent,
        ok: true,
        detail: "webhook answered 204".into(),
    });
    w.settle(obey);
    let run = w.run(1);
    assert_eq!(run.state, RunState::Completed, "{:?}", run.log);
    assert!(run
        .log
        .iter()
        .any(|l| l.line.contains("done (intent") && l.line.contains("answered 204")));
    assert!(crate::leader::webhooks::open_webhooks(&w.st).is_empty());
    // Unanswered past the step's timeout (both attempts): the run fails.
    w.nic("h0", "rail0", NicHealth::Up);
    w.nic("h0", "rail0", NicHealth::Down);
    w.settle(obey);
    w.advance(11_000);
    w.settle(obey);
    w.advance(11_000);
    w.settle(obey);
    let run = w.run(2);
    assert!(
        matches!(run.state, RunState::Failed { .. }),
        "{:?}",
        run.state
    );
    assert!(crate::leader::webhooks::open_webhooks(&w.st).is_empty());
}

fn job_world(with_playbooks: bool) -> World {
    let mut w = World::new(&["h0", "h1", "h2"], with_playbooks);
    w.admin(AdminOp::Job(JobOp::Submit { spec: spec(2) }));
    w.settle(obey);
    assert_eq!(w.st.jobs["j"].placement, vec!["h0", "h1"]);
    w
}

#[test]
fn host_down_goes_through_the_host_down_playbook_when_one_is_stored() {
    let mut w = job_world(true);
    w.ok(Command::SetLiveness {
        host: "h1".into(),
        liveness: Liveness::Down,
    });
    assert_eq!(
        w.st.jobs["j"].state,
        JobState::Running,
        "not restarted by the hard-wired path"
    );
    assert_eq!(
        w.events_of(&crate::model::events::Event::HostDownHandled {
            playbook: Some("host-down".into())
        }),
        1
    );
    w.settle(obey);
    assert_eq!(w.st.jobs["j"].state, JobState::Restarting, "backoff");
    assert_eq!(w.run(1).step_id(), "restart");
    w.advance(1_000);
    w.settle(obey);
    let run = w.run(1);
    assert_eq!(run.playbook, "host-down");
    assert_eq!(run.state, RunState::Completed, "{:?}", run.log);
    let j = &w.st.jobs["j"];
    assert_eq!(j.incarnation, 2);
    assert_eq!(j.state, JobState::Running);
    assert_eq!(j.placement, vec!["h0", "h2"]);
    assert_eq!(j.restarts, 1, "a lost host is a failure restart");
    assert!(w.st.incidents[&1].closed_ms.is_some());
    assert_eq!(
        w.notified("h1 is down: its jobs were restarted elsewhere"),
        1
    );

    // Without a host_down playbook nothing is hard-wired: the jobs wait
    // for an operator (and the log says so).
    let mut w = job_world(false);
    w.ok(Command::SetLiveness {
        host: "h1".into(),
        liveness: Liveness::Down,
    });
    assert!(wanted_run_commands(&w.st).is_empty());
    w.settle(obey);
    assert_eq!(w.st.jobs["j"].state, JobState::Running);
    assert_eq!(w.st.jobs["j"].incarnation, 1);
    assert_eq!(
        w.events_of(&crate::model::events::Event::HostDownHandled { playbook: None }),
        1
    );
}

#[test]
fn checkpoint_steps_wait_for_a_new_complete_checkpoint() {
    // rail1 never reported: nic-down checkpoints the host's jobs.
    let mut w = job_world(true);
    w.nic("h0", "rail0", NicHealth::Down);
    // Checkpoint orders go unanswered: the step waits.
    w.settle(|a| match a {
        Action::CheckpointJob { .. } => None,
        _ => Some(crate::model::testkit::answer(true, "pid=1")),
    });
    assert_eq!(w.run(1).step_id(), "checkpoint");
    assert_eq!(w.st.jobs["j"].state, JobState::Checkpointing);
    // Answered with step=40 by both hosts: a complete checkpoint, the
    // step is done and the drain (within limits: 1 of 3) starts.
    w.settle(obey);
    assert_eq!(w.st.jobs["j"].latest_checkpoint, Some(40));
    let run = w.run(1);
    assert!(
        run.log
            .iter()
            .any(|l| l.line.contains("step checkpoint done")),
        "{:?}",
        run.log
    );
    assert_eq!(run.step_id(), "wait-reusable", "{:?}", run.log);
    assert_eq!(
        w.st.hosts["h0"].drain.as_ref().map(|d| d.phase),
        Some(DrainPhase::Drained)
    );
    assert!(!w.st.jobs["j"].placement.contains(&"h0".to_string()));
}

/// nic-down drained a host whose NIC had no healthy backup: once the NIC
/// is up and reusable the same run returns the host to service (the
/// incident closed meanwhile: a waiting run outlives it). A host an admin
/// drained first stays drained.
#[test]
fn a_host_a_playbook_drained_returns_to_service_when_its_nic_is_reusable() {
    let drained = |admin_first: bool| {
        let mut w = World::new(&["h0", "h1", "h2", "h3"], true);
        if admin_first {
            w.admin(AdminOp::Drain {
                host: "h0".into(),
                reason: "maintenance".into(),
                deadline_ms: None,
            });
        }
        w.nic("h0", "rail0", NicHealth::Down);
        w.settle(obey);
        assert_eq!(w.run(1).step_id(), "wait-reusable", "{:?}", w.run(1).log);
        // Back, but settling (held for the hold time): still waiting.
        w.nic("h0", "rail0", NicHealth::Recovering);
        w.settle(obey);
        assert_eq!(w.run(1).step_id(), "wait-reusable");
        assert!(w.st.hosts["h0"].drain.is_some());
        w.nic("h0", "rail0", NicHealth::Up);
        assert!(w.st.incidents[&1].closed_ms.is_some(), "the NIC is up");
        w.settle(obey);
        assert_eq!(w.run(1).state, RunState::Completed, "{:?}", w.run(1).log);
        w
    };
    let w = drained(false);
    let h = &w.st.hosts["h0"];
    assert_eq!(h.status(), HostStatus::Ready);
    assert!(!h.cordoned && h.drain.is_none());
    assert!(w.run(1).log.iter().any(|l| l
        .line
        .contains("back in service (drained by playbook:nic-down)")));
    // An admin's drain is the admin's to undo.
    let w = drained(true);
    let d = w.st.hosts["h0"].drain.as_ref().expect("still drained");
    assert_eq!(d.by, "t");
    assert!(w
        .run(1)
        .log
        .iter()
        .any(|l| l.line.contains("stays drained: t drained it")));
}

/// A checkpoint step on a job whose ranks can no longer all talk ends at
/// once: the latest complete checkpoint stands (no wait for one a stalled
/// ring cannot write).
#[test]
fn a_checkpoint_step_takes_the_latest_checkpoint_when_the_ring_cannot_write_one() {
    let mut w = World::new(&["h0", "h1", "h2"], true);
    for h in ["h0", "h1", "h2"] {
        w.nic(h, "rail0", NicHealth::Up);
        w.nic(h, "rail1", NicHealth::Up);
    }
    // An operator's playbook for path incidents that checkpoints first.
    let text = r#"
name = "no-common-rail"
priority = 100
[trigger]
incidents = ["no_common_rail"]
[[steps]]
id = "checkpoint"
action = "checkpoint_job"
timeout = "2m"
"#;
    w.admin(AdminOp::PlaybookApply {
        files: vec![crate::model::playbook_store::PlaybookFile {
            file: "no-common-rail.toml".into(),
            text: text.into(),
        }],
    });
    w.admin(AdminOp::Job(JobOp::Submit { spec: spec(2) }));
    w.settle(obey);
    assert_eq!(w.st.jobs["j"].placement, vec!["h0", "h1"]);
    w.nic("h0", "rail0", NicHealth::Down);
    w.nic("h1", "rail1", NicHealth::Down);
    // Checkpoint orders would go unanswered: the step must not wait.
    w.settle(|a| match a {
        Action::CheckpointJob { .. } => None,
        _ => Some(crate::model::testkit::answer(true, "pid=1")),
    });
    let run =
        w.st.runs
            .values()
            .find(|r| r.playbook == "no-common-rail")
            .expect("a run");
    assert_eq!(run.state, RunState::Completed, "{:?}", run.log);
    assert!(
        run.log.iter().any(|l| l
            .line
            .contains("no new checkpoint possible; the latest complete ones stand: j (h0 and h1 cannot talk; latest complete checkpoint: none yet)")),
        "{:?}",
        run.log
    );
    assert_ne!(w.st.jobs["j"].state, JobState::Checkpointing);
}

fn contention_world() -> (World, u64) {
    use crate::model::shaping::{ContentionCommand, HostNic, LinkContention};
    let mut w = World::new(&["h0", "h1", "h2", "h3"], true);
    let a = crate::model::testkit::placed_for_test("a", &["h0", "h2"]);
    let mut b = crate::model::testkit::placed_for_test("b", &["h1", "h3"]);
    b.port = a.port + 1;
    w.st.jobs.insert("a".into(), a);
    w.st.jobs.insert("b".into(), b);
    let hn = |h: &str| HostNic {
        host: h.into(),
        nic: "rail0".into(),
    };
    let info = LinkContention {
        link: crate::topology::DirLink {
            link: "up".into(),
            from: "l0".into(),
            to: "l1".into(),
        },
        rate_bps: Some(400_000_000),
        senders: vec![hn("h0"), hn("h1")],
        receivers: vec![hn("h2"), hn("h3")],
        paths: vec!["h0/rail0→h2/rail0".into(), "h1/rail0→h3/rail0".into()],
        queueing_p99_us: 12_000.0,
    };
    let open = Command::Contention(ContentionCommand::Open {
        host: "h0".into(),
        info,
    });
    w.ok(open.clone());
    // A second open for the same link while one is open: no-op.
    w.ok(open);
    let incs: Vec<u64> =
        w.st.incidents
            .values()
            .filter(|i| i.kind == "link_contention")
            .map(|i| i.id)
            .collect();
    assert_eq!(incs.len(), 1);
    (w, incs[0])
}

/// The whole reshaping lifecycle in the model: the incident's playbook
/// plans fair shares, orders every sending host's agent, the step is
/// done when all confirmed; closing the incident orders every shape
/// removed, and nothing is left desired or applied.
#[test]
fn a_link_contention_incident_reshapes_and_its_close_clears_every_shape() {
    use crate::model::shaping::ContentionCommand;
    let (mut w, inc) = contention_world();
    w.settle(obey);
    let run = w.st.runs.values().find(|r| r.incident == inc).unwrap();
    assert_eq!(run.state, RunState::Completed, "{:?}", run.state);
    let evs: Vec<&str> = w.st.events.iter().map(|e| e.what.as_str()).collect();
    assert_eq!(w.st.shapes.len(), 2, "h0 and h1 send across: {evs:#?}");
    assert_eq!(w.st.shapes_applied(inc), Some(true));
    let h0 = &w.st.shapes["h0"]["rail0"];
    let labels: Vec<&str> = h0.classes.iter().map(|c| c.label.as_str()).collect();
    assert_eq!(
        labels,
        ["job a", "other"],
        "job classes first, the rest last"
    );
    // 400 Mbit/s × 0.95: 5 % for the rest (split between the two
    // senders), the jobs share what is left fairly.
    assert_eq!(h0.classes[0].rate_bps, 180_500_000);
    assert_eq!(h0.classes[1].rate_bps, 9_500_000);
    let total: u64 =
        w.st.shapes
            .values()
            .flat_map(|m| m.values())
            .flat_map(|s| s.classes.iter())
            .map(|c| c.ceil_bps)
            .sum();
    assert!(
        total <= 380_000_000,
        "never more than the usable rate: {total}"
    );
    let a_port = w.st.jobs["a"].port;
    let dst: std::net::Ipv4Addr = "10.0.0.3".parse().unwrap();
    assert!(h0.classes[0]
        .flows
        .iter()
        .any(|f| f.dst == dst && f.dst_port == a_port));
    assert!(h0.classes[0]
        .flows
        .iter()
        .any(|f| f.dst == dst && f.src_port == a_port));
    assert_eq!(h0.pace.get("a"), Some(&180_500_000));
    let orders = |w: &World, clear: bool| {
        w.st.intents
            .values()
            .filter(|i| match &i.action {
                Action::ShapeNic { .. } => !clear,
                Action::ClearShape { .. } => clear,
                _ => false,
            })
            .filter(|i| i.status == IntentStatus::Closed(Outcome::Done))
            .count()
    };
    assert_eq!(orders(&w, false), 2, "one shape order per sender, once");
    // Settled: nothing more is ordered.
    w.settle(obey);
    assert_eq!(orders(&w, false), 2);

    w.ok(Command::Contention(ContentionCommand::Close {
        incident: inc,
        why: "quiet".into(),
    }));
    assert!(w.st.shapes.is_empty());
    w.settle(obey);
    assert!(w.st.applied_shapes.is_empty(), "{:?}", w.st.applied_shapes);
    assert_eq!(orders(&w, true), 2, "every applied shape removed");
    // Closing twice changes nothing.
    w.ok(Command::Contention(ContentionCommand::Close {
        incident: inc,
        why: "again".into(),
    }));
    w.settle(obey);
    assert_eq!(orders(&w, true), 2);
}

/// An agent that refuses its shape: retried a bounded number of
/// times, then the step fails; the incident's close still clears the
/// shape that another agent applied.
#[test]
fn a_refused_shape_is_retried_a_bounded_number_of_times() {
    use crate::model::shaping::{ContentionCommand, MAX_SHAPE_FAILURES};
    let (mut w, inc) = contention_world();
    let refuse = |a: &Action| match a {
        Action::ShapeNic { host, .. } if host == "h1" => Some(crate::model::testkit::answer(
            false,
            "rail0: no such device",
        )),
        other => obey(other),
    };
    w.settle(refuse);
    let refused =
        w.st.intents
            .values()
            .filter(|i| matches!(&i.action, Action::ShapeNic { host, .. } if host == "h1"))
            .count();
    assert_eq!(
        refused as u32,
        MAX_SHAPE_FAILURES * 2,
        "two step attempts, each retried"
    );
    let run = w.st.runs.values().find(|r| r.incident == inc).unwrap();
    assert!(
        matches!(&run.state, RunState::Failed { why } if why.contains("refused")),
        "{:?}",
        run.state
    );
    assert!(w.st.applied_shapes.contains_key("h0"));
    w.ok(Command::Contention(ContentionCommand::Close {
        incident: inc,
        why: "quiet".into(),
    }));
    w.settle(obey);
    assert!(w.st.applied_shapes.is_empty() && w.st.shapes.is_empty());
}

/// `railguard shape clear HOST`: the host's shapes go, others stay.
#[test]
fn an_admin_clears_one_hosts_shapes() {
    let (mut w, _) = contention_world();
    w.settle(obey);
    w.admin(AdminOp::ShapeClear { host: "h0".into() });
    w.settle(obey);
    assert!(!w.st.applied_shapes.contains_key("h0"));
    assert!(w.st.applied_shapes.contains_key("h1"));
    let e = w
        .apply(Command::Admin {
            actor: "t".into(),
            op: AdminOp::ShapeClear {
                host: "nope".into(),
            },
            request: None,
        })
        .unwrap_err();
    assert!(e.to_string().contains("nope"), "{e}");
}

#[test]
fn model_only_steps_and_unavailable_actions() {
    // clock-unsynced: the clock state changes open and close the
    // incident; the playbook excludes, notifies, waits, includes.
    let mut w = World::new(&["h0", "h1"], true);
    let clock = |host: &str, state| Command::SetClockStates {
        changes: vec![crate::model::ClockChange {
            host: host.into(),
            state,
            offset_ns: None,
            error_bound_ns: None,
        }],
    };
    use crate::model::ClockState::{Degraded, Synced, Unsynced};
    // Unsynced at registration → Synced → Degraded: no incident.
    w.ok(clock("h0", Synced));
    w.ok(clock("h0", Degraded));
    assert!(w.st.incidents.is_empty());
    w.ok(clock("h0", Unsynced));
    let inc = w.st.hosts["h0"].clock_incident.expect("an incident");
    assert_eq!(w.st.incidents[&inc].kind, "clock_unsynced");
    // Still Unsynced: no second incident.
    w.ok(clock("h0", Degraded));
    w.ok(clock("h0", Unsynced));
    assert_eq!(w.st.incidents.len(), 1);
    w.settle(obey);
    assert!(w.st.hosts["h0"].owd_excluded);
    let run = w.run(1);
    assert_eq!(run.step_id(), "wait-synced");
    w.ok(clock("h0", Synced));
    assert!(w.st.incidents[&inc].closed_ms.is_some());
    assert_eq!(w.st.hosts["h0"].clock_incident, None);
    w.settle(obey);
    assert_eq!(w.run(1).state, RunState::Completed);
    assert!(!w.st.hosts["h0"].owd_excluded);
    // A Down host losing sync gets no clock incident (host_down says
    // more); back up and synced, then unsynced again: a new one.
    w.ok(clock("h1", Synced));
    w.ok(Command::SetLiveness {
        host: "h1".into(),
        liveness: Liveness::Down,
    });
    w.ok(clock("h1", Unsynced));
    assert_eq!(w.st.hosts["h1"].clock_incident, None);
    w.ok(Command::SetLiveness {
        host: "h1".into(),
        liveness: Liveness::Ready,
    });
    w.ok(clock("h1", Synced));
    w.ok(clock("h1", Unsynced));
    assert!(w.st.hosts["h1"].clock_incident.is_some());
    // link-contention without a link (not one the detector opened):
    // reshape_rate fails, is retried, then the run fails (no
    // escalation target).
    let inc = w.st.open_incident(
        w.now,
        IncidentKind::LinkContention,
        "h0",
        None,
        "test".into(),
    );
    w.settle(obey);
    let run = w.st.runs.values().find(|r| r.incident == inc).unwrap();
    assert!(
        matches!(&run.state, RunState::Failed { why } if why.contains("names no link")),
        "{:?}",
        run.state
    );
    assert_eq!(w.step_intents(run.id).len(), 2, "retries = 1: two attempts");
}

mod paths;
