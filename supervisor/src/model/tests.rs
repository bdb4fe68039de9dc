//! Tests of the model.

use crate::model::admin::AdminOp;
use crate::model::command::{Command, NodeId, Proposal, RequestId, TypeConfig};
use crate::model::events::AgentEvent;
use crate::model::hosts::{ClockChange, ClockState, HostStatus, Liveness, NicSpec, NicState};
use crate::model::intents::{Action, IntentStatus, Outcome};
use crate::model::jobs::types::{JobCommand, JobOp, JobSpec};
use crate::model::limits::{MAX_QPS_PER_HOST, MAX_SESSIONS, MAX_SESSION_RESULTS};
use crate::model::probe_graph::PROBE_DEGREE;
use crate::model::qps::QpKey;
use crate::model::result::{not_found, CmdError, CmdOk, CmdResult};
use crate::model::runs::types::{RunCommand, StepOp};
use crate::model::state::ClusterState;
use openraft::LogId;
use proto::agent::{
    NicHealth, NicReport, QpReport, RankCheckpointReport, RankExitReport, ReflexReport, Report,
};
use std::collections::BTreeMap;

use openraft::CommittedLeaderId;

fn lid(i: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(1, 1), i)
}

fn register(st: &mut ClusterState, host: &str) {
    let p = Proposal {
        at_ms: 1,
        cmds: vec![Command::RegisterHost {
            host: host.into(),
            nics: vec![
                NicSpec {
                    name: "rail0".into(),
                    rail: Some(0),
                    backup: Some("rail1".into()),
                    rdma_device: None,
                    addr: None,
                },
                NicSpec {
                    name: "rail1".into(),
                    rail: Some(1),
                    backup: Some("rail0".into()),
                    rdma_device: None,
                    addr: None,
                },
            ],
            labels: BTreeMap::new(),
        }],
    };
    assert!(st.apply_proposal(&lid(1), &p)[0].is_ok());
}

fn admin(op: AdminOp) -> Command {
    Command::Admin {
        actor: "alice".into(),
        op,
        request: None,
    }
}

fn admin_req(op: AdminOp, client: &str, serial: u64) -> Command {
    Command::Admin {
        actor: "alice".into(),
        op,
        request: Some(RequestId {
            client: client.into(),
            serial,
            retry: true,
        }),
    }
}

fn one(st: &mut ClusterState, index: u64, at_ms: u64, cmd: Command) -> CmdResult {
    let p = Proposal {
        at_ms,
        cmds: vec![cmd],
    };
    st.apply_proposal(&lid(index), &p).remove(0)
}

#[test]
fn retried_request_applies_once_and_returns_the_first_result() {
    let mut st = ClusterState::default();
    register(&mut st, "h0");
    let drain = AdminOp::Drain {
        host: "h0".into(),
        reason: "r".into(),
        deadline_ms: None,
    };
    assert_eq!(
        one(&mut st, 2, 10, admin_req(drain, "c1", 1)),
        Ok(CmdOk::Done)
    );
    let uncordon = AdminOp::Uncordon { host: "h0".into() };
    let refused = one(&mut st, 3, 11, admin_req(uncordon.clone(), "c1", 2));
    assert!(matches!(refused, Err(CmdError::FailedPrecondition(_))));
    let undrain = AdminOp::Undrain { host: "h0".into() };
    assert_eq!(
        one(&mut st, 4, 12, admin_req(undrain.clone(), "c1", 3)),
        Ok(CmdOk::Done)
    );
    let history = st.admin_history.len();
    // Retries, even reordered and after the state moved on, change
    // nothing and get the first answer.
    let before = st.hosts.clone();
    assert_eq!(
        one(&mut st, 5, 13, admin_req(undrain, "c1", 3)),
        Ok(CmdOk::Done)
    );
    assert_eq!(one(&mut st, 6, 14, admin_req(uncordon, "c1", 2)), refused);
    assert_eq!(st.hosts, before);
    assert_eq!(st.admin_history.len(), history);
    // The same serial in another session is a different request.
    let cordon = AdminOp::Cordon { host: "h0".into() };
    assert_eq!(
        one(&mut st, 7, 15, admin_req(cordon, "c2", 3)),
        Ok(CmdOk::Done)
    );
    assert!(st.hosts["h0"].cordoned);
}

#[test]
fn sessions_are_bounded_and_forgotten_requests_say_so() {
    let mut st = ClusterState::default();
    register(&mut st, "h0");
    let n = MAX_SESSION_RESULTS as u64 + 5;
    for serial in 1..=n {
        let op = AdminOp::Cordon { host: "h0".into() };
        one(&mut st, serial + 1, serial, admin_req(op, "c", serial)).unwrap();
    }
    assert_eq!(st.sessions["c"].results.len(), MAX_SESSION_RESULTS);
    let mut old = RequestId {
        client: "c".into(),
        serial: 1,
        retry: true,
    };
    assert!(matches!(
        st.session_result(&old),
        Some(Err(CmdError::RequestForgotten { serial: 1, .. }))
    ));
    // A first attempt that arrives late is simply applied.
    old.retry = false;
    assert_eq!(st.session_result(&old), None);
    for i in 0..MAX_SESSIONS + 3 {
        let op = AdminOp::Cordon { host: "h0".into() };
        one(
            &mut st,
            1000 + i as u64,
            1000 + i as u64,
            admin_req(op, &format!("s{i}"), 1),
        )
        .unwrap();
    }
    assert_eq!(st.sessions.len(), MAX_SESSIONS);
    assert!(
        !st.sessions.contains_key("c"),
        "least recently used goes first"
    );
}

#[test]
fn unknown_host_is_not_found_and_changes_nothing() {
    let mut st = ClusterState::default();
    register(&mut st, "h0");
    let before = st.clone();
    let r = st.apply_proposal(
        &lid(2),
        &Proposal {
            at_ms: 2,
            cmds: vec![admin(AdminOp::Cordon {
                host: "nope".into(),
            })],
        },
    );
    assert_eq!(
        r[0],
        Err(CmdError::NotFound {
            kind: "host".into(),
            name: "nope".into()
        })
    );
    // Only the applied index moves.
    let mut after = st.clone();
    after.last_log_index = before.last_log_index;
    assert_eq!(after, before);
}

#[test]
fn drain_requires_reason_and_blocks_uncordon() {
    let mut st = ClusterState::default();
    register(&mut st, "h0");
    let bad = admin(AdminOp::Drain {
        host: "h0".into(),
        reason: "  ".into(),
        deadline_ms: None,
    });
    assert!(matches!(
        st.validate(&bad),
        Err(CmdError::InvalidArgument(_))
    ));
    let good = admin(AdminOp::Drain {
        host: "h0".into(),
        reason: "bad psu".into(),
        deadline_ms: None,
    });
    st.apply_proposal(
        &lid(2),
        &Proposal {
            at_ms: 2,
            cmds: vec![good],
        },
    );
    assert_eq!(st.hosts["h0"].status(), HostStatus::Draining);
    assert!(matches!(
        st.validate(&admin(AdminOp::Uncordon { host: "h0".into() })),
        Err(CmdError::FailedPrecondition(_))
    ));
    st.apply_proposal(
        &lid(3),
        &Proposal {
            at_ms: 3,
            cmds: vec![admin(AdminOp::Undrain { host: "h0".into() })],
        },
    );
    assert_eq!(st.hosts["h0"].status(), HostStatus::Ready);
    assert_eq!(st.admin_history.len(), 2);
    assert_eq!(st.admin_history[0].actor, "alice");
}

#[test]
fn drain_intent_completes_once() {
    let mut st = ClusterState::default();
    register(&mut st, "h0");
    st.apply_proposal(
        &lid(2),
        &Proposal {
            at_ms: 2,
            cmds: vec![admin(AdminOp::Drain {
                host: "h0".into(),
                reason: "r".into(),
                deadline_ms: None,
            })],
        },
    );
    let open = Command::OpenIntent {
        action: Action::CompleteDrain { host: "h0".into() },
    };
    let r = st.apply_proposal(
        &lid(3),
        &Proposal {
            at_ms: 3,
            cmds: vec![open.clone(), open],
        },
    );
    assert_eq!(r[0], Ok(CmdOk::IntentOpened { id: 1 }));
    assert_eq!(
        r[1],
        Ok(CmdOk::IntentOpened { id: 1 }),
        "same action dedups to the open intent"
    );
    let close = Command::CloseIntent {
        id: 1,
        outcome: Outcome::Done,
    };
    st.apply_proposal(
        &lid(4),
        &Proposal {
            at_ms: 4,
            cmds: vec![close.clone(), close],
        },
    );
    assert_eq!(st.hosts["h0"].status(), HostStatus::Drained);
    assert_eq!(st.open_intents().count(), 0);
}

#[test]
fn agent_events_apply_exactly_once_in_order() {
    let mut st = ClusterState::default();
    register(&mut st, "h0");
    let ev = |seq, state| AgentEvent {
        seq,
        report: Report::Nic(NicReport {
            nic: "rail0".into(),
            health: state,
            carrier_changes: seq,
            flaps: 0,
            penalty: 0.0,
            coalesced: 0,
            link_up: state == NicHealth::Up,
            probes_lost: false,
            at_unix_ns: 0,
        }),
    };
    let cmd = |events| Command::AgentEvents {
        host: "h0".into(),
        events,
    };
    let r = st.apply_proposal(
        &lid(2),
        &Proposal {
            at_ms: 2,
            cmds: vec![cmd(vec![ev(1, NicHealth::Up), ev(2, NicHealth::Down)])],
        },
    );
    assert_eq!(r[0], Ok(CmdOk::Acked { through: 2 }));
    assert!(
        st.events
            .iter()
            .filter(|e| matches!(e.event, crate::model::Event::NicLink { .. }))
            .all(|e| e.observed_unix_ns.is_some()),
        "link events carry the agent's observation time"
    );
    assert_eq!(
        st.incidents
            .values()
            .filter(|i| i.kind == "nic_down")
            .count(),
        1
    );
    // A resend of 1..2 plus 3 applies only 3.
    let r = st.apply_proposal(
        &lid(3),
        &Proposal {
            at_ms: 3,
            cmds: vec![cmd(vec![
                ev(1, NicHealth::Up),
                ev(2, NicHealth::Down),
                ev(3, NicHealth::Up),
            ])],
        },
    );
    assert_eq!(r[0], Ok(CmdOk::Acked { through: 3 }));
    assert_eq!(st.hosts["h0"].nics["rail0"].state, NicState::Up);
    assert!(st.incidents.values().all(|i| i.closed_ms.is_some()));
    // A gap is refused.
    let r = st.apply_proposal(
        &lid(4),
        &Proposal {
            at_ms: 4,
            cmds: vec![cmd(vec![ev(5, NicHealth::Down)])],
        },
    );
    assert!(matches!(
        r[0],
        Err(CmdError::SequenceGap {
            expected: 4,
            got: 5,
            ..
        })
    ));
    assert_eq!(st.hosts["h0"].last_event_seq, 3);
}

/// Log entries are bincode: every command variant must round-trip
/// (bincode rejects e.g. internally tagged enums at decode time, which
/// would stop Raft on the first such entry).
#[test]
fn every_command_roundtrips_through_bincode() {
    let cmds = vec![
        Command::RegisterHost {
            host: "h".into(),
            nics: vec![NicSpec {
                name: "n".into(),
                rail: Some(1),
                backup: None,
                rdma_device: Some("mlx5_0".into()),
                addr: None,
            }],
            labels: BTreeMap::from([("a".into(), "b".into())]),
        },
        admin(AdminOp::Cordon { host: "h".into() }),
        admin(AdminOp::Uncordon { host: "h".into() }),
        admin(AdminOp::Drain {
            host: "h".into(),
            reason: "r".into(),
            deadline_ms: Some(5),
        }),
        admin(AdminOp::Undrain { host: "h".into() }),
        admin_req(AdminOp::Undrain { host: "h".into() }, "c", 7),
        admin(AdminOp::SetLabels {
            host: "h".into(),
            set: BTreeMap::from([("k".into(), "v".into())]),
            remove: vec!["x".into()],
        }),
        Command::AgentEvents {
            host: "h".into(),
            events: vec![AgentEvent {
                seq: 1,
                report: Report::Nic(NicReport {
                    nic: "n".into(),
                    health: NicHealth::Flapping,
                    carrier_changes: 3,
                    flaps: 4,
                    penalty: 1.5,
                    coalesced: 2,
                    link_up: false,
                    probes_lost: false,
                    at_unix_ns: 2,
                }),
            }],
        },
        Command::OpenIntent {
            action: Action::CompleteDrain { host: "h".into() },
        },
        Command::CloseIntent {
            id: 1,
            outcome: Outcome::Done,
        },
        Command::CloseIntent {
            id: 1,
            outcome: Outcome::Cancelled { why: "w".into() },
        },
        Command::CloseIntent {
            id: 1,
            outcome: Outcome::Failed { error: "e".into() },
        },
        admin(AdminOp::NicFailover {
            host: "h".into(),
            nic: "n".into(),
            to: Some("m".into()),
        }),
        admin(AdminOp::NicFailover {
            host: "h".into(),
            nic: "n".into(),
            to: None,
        }),
        admin(AdminOp::NicFailback {
            host: "h".into(),
            nic: "n".into(),
        }),
        Command::OpenIntent {
            action: Action::Failover {
                host: "h".into(),
                nic: "n".into(),
                to: "m".into(),
            },
        },
        Command::OpenIntent {
            action: Action::Failback {
                host: "h".into(),
                nic: "n".into(),
            },
        },
        Command::OrderDone {
            host: "h".into(),
            id: 4,
            outcome: crate::model::testkit::answer(false, "d"),
        },
        Command::SetClockStates {
            changes: vec![
                ClockChange {
                    host: "h".into(),
                    state: ClockState::Synced,
                    offset_ns: Some(-12.5),
                    error_bound_ns: Some(300.0),
                },
                ClockChange {
                    host: "g".into(),
                    state: ClockState::Unsynced,
                    offset_ns: None,
                    error_bound_ns: None,
                },
            ],
        },
        Command::SetLiveness {
            host: "h".into(),
            liveness: Liveness::Suspect,
        },
        Command::AgentEvents {
            host: "h".into(),
            events: vec![
                AgentEvent {
                    seq: 2,
                    report: Report::Qp(QpReport {
                        job: "j".into(),
                        rank: 1,
                        conn_id: u64::MAX,
                        nic: "n".into(),
                        peer_host: "p".into(),
                        peer_rank: 2,
                        rail: 3,
                        moved: true,
                        closed: false,
                        at_unix_ns: 3,
                    }),
                },
                AgentEvent {
                    seq: 3,
                    report: Report::QpReset { at_unix_ns: 4 },
                },
                AgentEvent {
                    seq: 4,
                    report: Report::Reflex(ReflexReport {
                        nic: "n".into(),
                        conns: 7,
                        ok: true,
                        detail: "d".into(),
                        at_unix_ns: 5,
                    }),
                },
                AgentEvent {
                    seq: 5,
                    report: Report::RankExited(RankExitReport {
                        job: "j".into(),
                        incarnation: 2,
                        rank: 1,
                        exit_code: -1,
                        signal: 9,
                        detail: "d".into(),
                        at_unix_ns: 6,
                    }),
                },
                AgentEvent {
                    seq: 6,
                    report: Report::RankCheckpoint(RankCheckpointReport {
                        job: "j".into(),
                        incarnation: 2,
                        rank: 1,
                        step: 40,
                        at_unix_ns: 7,
                    }),
                },
            ],
        },
        Command::Admin {
            actor: "a".into(),
            op: AdminOp::Job(JobOp::Submit {
                spec: JobSpec {
                    name: "j".into(),
                    ranks: 2,
                    hosts: vec!["h".into()],
                    labels: BTreeMap::from([("k".into(), "v".into())]),
                    command: vec!["x".into()],
                    env: BTreeMap::from([("A".into(), "b".into())]),
                    checkpoint_dir: "/c".into(),
                    checkpoint_every: 5,
                    max_restarts: 3,
                    backoff_ms: 1000,
                    user: Some("trainer".into()),
                },
            }),
            request: None,
        },
        Command::Admin {
            actor: "a".into(),
            op: AdminOp::Job(JobOp::Restart {
                job: "j".into(),
                reason: "r".into(),
            }),
            request: None,
        },
        Command::Job(JobCommand::Place {
            job: "j".into(),
            incarnation: 1,
            placement: vec!["h".into()],
        }),
        Command::Job(JobCommand::Restart {
            job: "j".into(),
            incarnation: 1,
            reason: "r".into(),
            planned: true,
        }),
        Command::Job(JobCommand::Halt {
            job: "j".into(),
            incarnation: 1,
        }),
        Command::OpenIntent {
            action: Action::StartRank {
                job: "j".into(),
                incarnation: 1,
                rank: 0,
                host: "h".into(),
            },
        },
        Command::OpenIntent {
            action: Action::CheckpointJob {
                job: "j".into(),
                incarnation: 1,
                host: "h".into(),
                halt: true,
            },
        },
        Command::OpenIntent {
            action: Action::StopJob {
                job: "j".into(),
                incarnation: 1,
                host: "h".into(),
            },
        },
        Command::Playbook(RunCommand::Start {
            incident: 3,
            playbook: "nic-down".into(),
            version: 7,
        }),
    ];
    // Playbook steps are opened by their run, not proposed, but they
    // sit in intents (snapshots) and every operation must round-trip.
    let mark = crate::model::runs::JobMark {
        job: "j".into(),
        incarnation: 2,
        checkpoint: Some(40),
    };
    let ops = vec![
        StepOp::Failover {
            nic: "n".into(),
            to: "m".into(),
        },
        StepOp::Failback { nic: "n".into() },
        StepOp::CheckpointJobs {
            jobs: vec![mark.clone()],
        },
        StepOp::RestartJobs {
            jobs: vec![
                mark,
                crate::model::runs::JobMark {
                    job: "k".into(),
                    incarnation: 0,
                    checkpoint: None,
                },
            ],
        },
        StepOp::Cordon,
        StepOp::Drain {
            deadline_ms: 600_000,
        },
        StepOp::WaitUntil {
            condition: "not nic_reusable".into(),
        },
        StepOp::ExcludeFromOwd,
        StepOp::IncludeInOwd,
        StepOp::Notify {
            message: "m".into(),
            webhook: Some("http://127.0.0.1:9/hook".into()),
        },
        StepOp::ReshapeRate {
            bits_per_sec: Some(40_000_000_000),
            edge_hold_us: Some(1_000),
        },
    ];
    let mut cmds = cmds;
    cmds.push(Command::InstallShippedPlaybooks {
        files: crate::model::playbook_store::shipped_files(),
    });
    cmds.push(Command::WebhookDone {
        id: 4,
        ok: false,
        detail: "webhook http://h/x answered 503: busy".into(),
    });
    for (i, op) in ops.into_iter().enumerate() {
        cmds.push(Command::OpenIntent {
            action: Action::PlaybookStep {
                run: 1,
                step: i as u32,
                attempt: 2,
                host: "h".into(),
                op,
            },
        });
    }
    let p = Proposal { at_ms: 9, cmds };
    let bytes = bincode::serialize(&p).unwrap();
    let back: Proposal = bincode::deserialize(&bytes).unwrap();
    assert_eq!(back.cmds, p.cmds);
    let results: Vec<CmdResult> = vec![
        Ok(CmdOk::Done),
        Ok(CmdOk::Registered {
            last_applied_seq: 1,
        }),
        Ok(CmdOk::Acked { through: 2 }),
        Ok(CmdOk::IntentOpened { id: 3 }),
        Ok(CmdOk::RunStarted { id: 4 }),
        Err(not_found("host", "h")),
        Err(not_found("NIC", "h/n")),
        Err(CmdError::InvalidArgument("x".into())),
        Err(CmdError::FailedPrecondition("y".into())),
        Err(CmdError::SequenceGap {
            host: "h".into(),
            expected: 1,
            got: 3,
            acked: 0,
        }),
    ];
    let back: Vec<CmdResult> =
        bincode::deserialize(&bincode::serialize(&results).unwrap()).unwrap();
    assert_eq!(back, results);
    let mut st = ClusterState::default();
    register(&mut st, "h0");
    st.apply_proposal(
        &lid(2),
        &Proposal {
            at_ms: 2,
            cmds: vec![admin(AdminOp::Drain {
                host: "h0".into(),
                reason: "r".into(),
                deadline_ms: None,
            })],
        },
    );
    // Placements and order intents are part of snapshots too.
    qp_event(&mut st, 3, 1, qp_kind("j", 1, "rail0", false)).unwrap();
    one(
        &mut st,
        4,
        4,
        admin(AdminOp::NicFailover {
            host: "h0".into(),
            nic: "rail0".into(),
            to: None,
        }),
    )
    .unwrap();
    assert!(!st.qps.is_empty() && st.open_intents().count() == 1);
    let back: ClusterState = bincode::deserialize(&bincode::serialize(&st).unwrap()).unwrap();
    assert_eq!(back, st);
}

fn qp_kind(job: &str, conn_id: u64, nic: &str, closed: bool) -> Report {
    Report::Qp(QpReport {
        job: job.into(),
        rank: 0,
        conn_id,
        nic: nic.into(),
        peer_host: "h9".into(),
        peer_rank: 1,
        rail: 0,
        moved: nic != "rail0",
        closed,
        at_unix_ns: 0,
    })
}

fn qp_event(st: &mut ClusterState, index: u64, seq: u64, kind: Report) -> CmdResult {
    one(
        st,
        index,
        index,
        Command::AgentEvents {
            host: "h0".into(),
            events: vec![AgentEvent { seq, report: kind }],
        },
    )
}

#[test]
fn qp_placements_are_recorded_moved_closed_and_reset() {
    let mut st = ClusterState::default();
    register(&mut st, "h0");
    qp_event(&mut st, 2, 1, qp_kind("j", 1, "rail0", false)).unwrap();
    qp_event(&mut st, 3, 2, qp_kind("j", 2, "rail0", false)).unwrap();
    qp_event(&mut st, 4, 3, qp_kind("k", 1, "rail1", false)).unwrap();
    let t = &st.qps["h0"];
    assert_eq!(t.len(), 3, "same conn id in two jobs is two connections");
    let key = |job: &str, conn_id| QpKey {
        job: job.into(),
        rank: 0,
        conn_id,
    };
    assert_eq!(t[&key("j", 1)].since_ms, 2);
    // A move updates the placement and its time; a repeat keeps the time.
    qp_event(&mut st, 5, 4, qp_kind("j", 1, "rail1", false)).unwrap();
    qp_event(&mut st, 6, 5, qp_kind("j", 1, "rail1", false)).unwrap();
    let q = &st.qps["h0"][&key("j", 1)];
    assert_eq!((q.nic.as_str(), q.moved, q.since_ms), ("rail1", true, 5));
    // Closing removes it; a resent (already applied) event changes nothing.
    qp_event(&mut st, 7, 6, qp_kind("j", 2, "rail0", true)).unwrap();
    assert!(!st.qps["h0"].contains_key(&key("j", 2)));
    let before = st.qps.clone();
    qp_event(&mut st, 8, 2, qp_kind("j", 2, "rail0", false)).unwrap();
    assert_eq!(st.qps, before, "exactly once");
    // Bad names are refused with nothing changed.
    let r = qp_event(&mut st, 9, 7, qp_kind("bad job", 3, "rail0", false));
    assert!(matches!(r, Err(CmdError::InvalidArgument(_))), "{r:?}");
    assert_eq!(st.hosts["h0"].last_event_seq, 6);
    // An agent restart forgets the host's placements.
    qp_event(&mut st, 10, 7, Report::QpReset { at_unix_ns: 0 }).unwrap();
    assert!(!st.qps.contains_key("h0"));
    assert!(st.events.iter().any(|e| matches!(
        e.event,
        crate::model::Event::AgentRestarted {
            placements_forgotten: 2
        }
    )));
}

#[test]
fn qp_placements_are_bounded_per_host() {
    let mut st = ClusterState::default();
    register(&mut st, "h0");
    let events: Vec<AgentEvent> = (1..=MAX_QPS_PER_HOST as u64 + 2)
        .map(|i| AgentEvent {
            seq: i,
            report: qp_kind("j", i, "rail0", false),
        })
        .collect();
    let r = one(
        &mut st,
        2,
        2,
        Command::AgentEvents {
            host: "h0".into(),
            events,
        },
    );
    assert_eq!(
        r,
        Ok(CmdOk::Acked {
            through: MAX_QPS_PER_HOST as u64 + 2
        }),
        "never stalls the agent's stream"
    );
    assert_eq!(st.qps["h0"].len(), MAX_QPS_PER_HOST);
    assert!(st
        .events
        .iter()
        .any(|e| matches!(e.event, crate::model::Event::QpNotRecorded { .. })));
    // Updates of recorded connections still apply when full.
    qp_event(
        &mut st,
        3,
        MAX_QPS_PER_HOST as u64 + 3,
        qp_kind("j", 1, "rail1", false),
    )
    .unwrap();
    assert_eq!(
        st.qps["h0"][&QpKey {
            job: "j".into(),
            rank: 0,
            conn_id: 1
        }]
            .nic,
        "rail1"
    );
}

#[test]
fn failover_and_failback_open_intents_closed_by_the_hosts_answer() {
    let mut st = ClusterState::default();
    register(&mut st, "h0");
    register(&mut st, "h1");
    let failover = admin(AdminOp::NicFailover {
        host: "h0".into(),
        nic: "rail0".into(),
        to: None,
    });
    assert_eq!(
        one(&mut st, 2, 2, failover.clone()),
        Ok(CmdOk::IntentOpened { id: 1 })
    );
    assert_eq!(
        st.intents[&1].action,
        Action::Failover {
            host: "h0".into(),
            nic: "rail0".into(),
            to: "rail1".into()
        },
        "the target resolves to the NIC's backup"
    );
    assert_eq!(
        one(&mut st, 3, 3, failover),
        Ok(CmdOk::IntentOpened { id: 1 }),
        "the same order while open is the same intent"
    );
    assert_eq!(st.admin_history.len(), 2, "both requests are recorded");
    // Only the host the order is for may answer it.
    let wrong = Command::OrderDone {
        host: "h1".into(),
        id: 1,
        outcome: crate::model::testkit::answer(true, "x"),
    };
    assert!(matches!(
        one(&mut st, 4, 4, wrong),
        Err(CmdError::InvalidArgument(_))
    ));
    assert_eq!(st.open_intents().count(), 1);
    let done = Command::OrderDone {
        host: "h0".into(),
        id: 1,
        outcome: crate::model::testkit::answer(true, "moved 3 connections"),
    };
    assert_eq!(one(&mut st, 5, 5, done.clone()), Ok(CmdOk::Done));
    assert_eq!(st.intents[&1].status, IntentStatus::Closed(Outcome::Done));
    assert_eq!(st.intents[&1].detail, "moved 3 connections");
    // A repeated answer changes nothing, not even a different one.
    let failed = Command::OrderDone {
        host: "h0".into(),
        id: 1,
        outcome: crate::model::testkit::answer(false, "late"),
    };
    let before = st.clone();
    assert_eq!(one(&mut st, 6, 6, done), Ok(CmdOk::Done));
    assert_eq!(one(&mut st, 7, 7, failed), Ok(CmdOk::Done));
    assert_eq!(st.intents, before.intents);
    assert_eq!(st.events, before.events);
    // A failback, answered as failed.
    let failback = admin(AdminOp::NicFailback {
        host: "h0".into(),
        nic: "rail0".into(),
    });
    assert_eq!(
        one(&mut st, 8, 8, failback),
        Ok(CmdOk::IntentOpened { id: 2 })
    );
    let r = one(
        &mut st,
        9,
        9,
        Command::OrderDone {
            host: "h0".into(),
            id: 2,
            outcome: crate::model::testkit::answer(false, "job j rank 0 did not answer"),
        },
    );
    assert_eq!(r, Ok(CmdOk::Done));
    assert_eq!(
        st.intents[&2].status,
        IntentStatus::Closed(Outcome::Failed {
            error: "job j rank 0 did not answer".into()
        })
    );
    // Answers to what is not an order are refused.
    let mut drain = st.clone();
    one(
        &mut drain,
        10,
        10,
        admin(AdminOp::Drain {
            host: "h0".into(),
            reason: "r".into(),
            deadline_ms: None,
        }),
    )
    .unwrap();
    one(
        &mut drain,
        11,
        11,
        Command::OpenIntent {
            action: Action::CompleteDrain { host: "h0".into() },
        },
    )
    .unwrap();
    let r = one(
        &mut drain,
        12,
        12,
        Command::OrderDone {
            host: "h0".into(),
            id: 3,
            outcome: crate::model::testkit::answer(true, String::new()),
        },
    );
    assert!(matches!(r, Err(CmdError::InvalidArgument(_))), "{r:?}");
}

#[test]
fn bad_failover_and_failback_requests_change_nothing() {
    let mut st = ClusterState::default();
    register(&mut st, "h0");
    // A NIC without a backup.
    one(
        &mut st,
        2,
        2,
        Command::RegisterHost {
            host: "h1".into(),
            nics: vec![
                NicSpec {
                    name: "rail0".into(),
                    rail: Some(0),
                    backup: None,
                    rdma_device: None,
                    addr: None,
                },
                NicSpec {
                    name: "rail1".into(),
                    rail: Some(1),
                    backup: None,
                    rdma_device: None,
                    addr: None,
                },
            ],
            labels: BTreeMap::new(),
        },
    )
    .unwrap();
    // rail1 of h0 is down.
    one(
        &mut st,
        3,
        3,
        Command::AgentEvents {
            host: "h0".into(),
            events: vec![AgentEvent {
                seq: 1,
                report: Report::Nic(NicReport {
                    nic: "rail1".into(),
                    health: NicHealth::Down,
                    carrier_changes: 1,
                    flaps: 0,
                    penalty: 0.0,
                    coalesced: 0,
                    link_up: false,
                    probes_lost: false,
                    at_unix_ns: 0,
                }),
            }],
        },
    )
    .unwrap();
    let fo = |host: &str, nic: &str, to: Option<&str>| {
        admin(AdminOp::NicFailover {
            host: host.into(),
            nic: nic.into(),
            to: to.map(Into::into),
        })
    };
    let fb = |nic: &str| {
        admin(AdminOp::NicFailback {
            host: "h0".into(),
            nic: nic.into(),
        })
    };
    let before = st.clone();
    let cases: Vec<(Command, CmdError)> = vec![
        (fo("nope", "rail0", None), not_found("host", "nope")),
        (fo("h0", "rail9", None), not_found("NIC", "h0/rail9")),
        (
            fo("h0", "rail0", Some("rail0")),
            CmdError::InvalidArgument("--to \"rail0\" is the NIC being failed over".into()),
        ),
        (
            fo("h0", "rail0", Some("eth7")),
            CmdError::InvalidArgument("--to \"eth7\" is not a NIC of host \"h0\"".into()),
        ),
        (
            fo("h1", "rail0", None),
            CmdError::FailedPrecondition(
                "NIC h1/rail0 has no backup configured; pass --to NIC".into(),
            ),
        ),
        (
            fo("h0", "rail0", None),
            CmdError::FailedPrecondition("target NIC h0/rail1 is Down".into()),
        ),
        (fb("rail9"), not_found("NIC", "h0/rail9")),
        (
            fb("rail1"),
            CmdError::FailedPrecondition("NIC h0/rail1 is Down; fail back once it is up".into()),
        ),
    ];
    for (i, (cmd, want)) in cases.into_iter().enumerate() {
        assert_eq!(st.validate(&cmd), Err(want.clone()), "case {i}");
        assert_eq!(one(&mut st, 10 + i as u64, 10, cmd), Err(want), "case {i}");
    }
    let mut after = st.clone();
    after.last_log_index = before.last_log_index;
    assert_eq!(after, before, "nothing written, not even history");
    // An explicit healthy target works where the backup does not.
    assert!(st.validate(&fo("h1", "rail0", Some("rail1"))).is_ok());
}

#[test]
fn snapshot_roundtrip_preserves_model() {
    use raft_store::StateModel;
    let mut st = ClusterState::default();
    register(&mut st, "h0");
    let bytes = StateModel::encode(&st).unwrap();
    let back = <ClusterState as StateModel<TypeConfig>>::decode(&bytes).unwrap();
    assert_eq!(back, st);
}

fn register_nics(st: &mut ClusterState, index: u64, host: &str, nics: Vec<NicSpec>) -> CmdResult {
    one(
        st,
        index,
        index,
        Command::RegisterHost {
            host: host.into(),
            nics,
            labels: BTreeMap::new(),
        },
    )
}

fn data_nic(name: &str, rail: u32, addr: &str) -> NicSpec {
    NicSpec {
        name: name.into(),
        rail: Some(rail),
        backup: None,
        rdma_device: None,
        addr: Some(addr.into()),
    }
}

#[test]
fn hosts_get_stable_ids_and_join_the_probe_graph() {
    let mut st = ClusterState::default();
    for i in 0..8u64 {
        let h = format!("h{i}");
        let nics = vec![data_nic("rail0", 0, &format!("10.0.0.{i}"))];
        register_nics(&mut st, i + 1, &h, nics).unwrap();
        assert_eq!(st.hosts[&h].id, i as u32);
    }
    assert_eq!(st.next_host_id, 8);
    assert_eq!(st.probe_graph.len(), 8);
    for h in st.hosts.values() {
        assert_eq!(st.probe_graph.degree(h.id), PROBE_DEGREE, "{}", h.name);
    }
    let version = st.probe_plan_version;
    assert_eq!(version, 8, "every join changes the plan");
    // Re-registering the same way changes neither graph nor version.
    let graph = st.probe_graph.clone();
    register_nics(&mut st, 20, "h3", vec![data_nic("rail0", 0, "10.0.0.3")]).unwrap();
    assert_eq!(st.probe_graph, graph);
    assert_eq!(st.probe_plan_version, version);
    assert_eq!(st.hosts["h3"].id, 3);
    // A new address (or rail) changes the plan, not the graph.
    register_nics(&mut st, 21, "h3", vec![data_nic("rail0", 0, "10.0.9.3")]).unwrap();
    assert_eq!(st.probe_graph, graph);
    assert_eq!(st.probe_plan_version, version + 1);
    assert_eq!(
        st.hosts["h3"].nics["rail0"].addr.as_deref(),
        Some("10.0.9.3")
    );
    register_nics(&mut st, 22, "h3", vec![data_nic("rail0", 1, "10.0.9.3")]).unwrap();
    assert_eq!(st.probe_plan_version, version + 2);
    // Replicas that apply the same log agree on the graph.
    let mut other = ClusterState::default();
    for i in 0..8u64 {
        let nics = vec![data_nic("rail0", 0, &format!("10.0.0.{i}"))];
        register_nics(&mut other, i + 1, &format!("h{i}"), nics).unwrap();
    }
    assert_eq!(other.probe_graph, graph);
}

#[test]
fn a_bad_nic_address_is_refused_and_changes_nothing() {
    let mut st = ClusterState::default();
    register(&mut st, "h0");
    let before = st.clone();
    let r = register_nics(
        &mut st,
        2,
        "h1",
        vec![
            data_nic("rail0", 0, "10.0.0.1"),
            data_nic("rail1", 1, "10.0.0.256"),
        ],
    );
    assert_eq!(
        r,
        Err(CmdError::InvalidArgument(
            "address \"10.0.0.256\" of NIC \"rail1\" is not an IP address".into()
        ))
    );
    let mut after = st.clone();
    after.last_log_index = before.last_log_index;
    assert_eq!(after, before);
    // IPv6 is an IP address too.
    register_nics(&mut st, 3, "h1", vec![data_nic("rail0", 0, "fd00::1")]).unwrap();
}

fn clock(host: &str, state: ClockState) -> ClockChange {
    ClockChange {
        host: host.into(),
        state,
        offset_ns: Some(40.0),
        error_bound_ns: Some(250.0),
    }
}

#[test]
fn clock_states_change_with_an_event_and_unknown_hosts_write_nothing() {
    let mut st = ClusterState::default();
    register(&mut st, "h0");
    register(&mut st, "h1");
    assert_eq!(st.hosts["h0"].clock.state, ClockState::Unsynced);
    let before = st.clone();
    for bad in [
        vec![
            clock("h0", ClockState::Synced),
            clock("ghost", ClockState::Synced),
        ],
        vec![
            clock("h0", ClockState::Synced),
            clock("h0", ClockState::Degraded),
        ],
        vec![ClockChange {
            offset_ns: Some(f64::NAN),
            ..clock("h0", ClockState::Synced)
        }],
        vec![ClockChange {
            error_bound_ns: Some(-1.0),
            ..clock("h0", ClockState::Synced)
        }],
    ] {
        let r = one(&mut st, 5, 5, Command::SetClockStates { changes: bad });
        assert!(r.is_err(), "{r:?}");
    }
    assert_eq!(
        one(
            &mut st,
            6,
            6,
            Command::SetClockStates {
                changes: vec![clock("ghost", ClockState::Synced)]
            }
        ),
        Err(not_found("host", "ghost"))
    );
    let mut after = st.clone();
    after.last_log_index = before.last_log_index;
    assert_eq!(after, before, "nothing written");
    let change = Command::SetClockStates {
        changes: vec![clock("h0", ClockState::Synced)],
    };
    assert_eq!(one(&mut st, 7, 70, change.clone()), Ok(CmdOk::Done));
    let c = &st.hosts["h0"].clock;
    assert_eq!(
        (c.state, c.offset_ns, c.error_bound_ns, c.changed_ms),
        (ClockState::Synced, Some(40.0), Some(250.0), 70)
    );
    assert!(st
        .events
        .back()
        .is_some_and(|e| e.what == "clock Unsynced -> Synced (offset 40 ns ± 250 ns)"));
    // The same state again changes nothing, not even the figures.
    let events = st.events.len();
    let mut again = clock("h0", ClockState::Synced);
    again.offset_ns = Some(1.0);
    one(
        &mut st,
        8,
        80,
        Command::SetClockStates {
            changes: vec![again],
        },
    )
    .unwrap();
    assert_eq!(st.events.len(), events);
    assert_eq!(st.hosts["h0"].clock.changed_ms, 70);
}

#[test]
fn snapshots_carry_the_model_format_version_and_refuse_another() {
    use raft_store::StateModel;
    let mut st = ClusterState::default();
    register(&mut st, "h0");
    let bytes = st.encode().unwrap();
    assert_eq!(bytes[0], crate::model::state::MODEL_FORMAT_VERSION);
    assert_eq!(ClusterState::decode(&bytes).unwrap(), st);
    let mut other = bytes.clone();
    other[0] = crate::model::state::MODEL_FORMAT_VERSION + 1;
    let err = ClusterState::decode(&other).unwrap_err();
    assert!(err.contains("format version"), "{err}");
    assert!(ClusterState::decode(&[]).is_err());
    assert!(ClusterState::decode(&bytes[..bytes.len() / 2]).is_err());
}
