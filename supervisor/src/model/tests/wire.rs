//! Persisted forms: every command through bincode, snapshots and their format version.

use super::*;

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
        admin(AdminOp::Refused {
            request: "drain h".into(),
            needed: "operator".into(),
        }),
        admin(AdminOp::Revoke {
            serial: "0a".into(),
            reason: "lost".into(),
        }),
        admin(AdminOp::MemberAdded {
            id: 4,
            addr: "127.0.0.1:7404".into(),
        }),
        admin(AdminOp::MemberRemoved { id: 4 }),
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
                version: 3,
            },
        },
        Command::OpenIntent {
            action: Action::Failback {
                host: "h".into(),
                nic: "n".into(),
                version: 4,
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
                    ranks_per_host: 2,
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
            cmds: vec![admin(drain_op("h0"))],
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
    let back = crate::model::testkit::snapshot_roundtrip(&st);
    assert_eq!(back, st);
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
