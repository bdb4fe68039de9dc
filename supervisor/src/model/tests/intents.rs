//! NIC failover and failback intents, opened by admins and closed by the host's answer.

use super::*;

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
            to: "rail1".into(),
            version: 2,
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
    one(&mut drain, 10, 10, admin(drain_op("h0"))).unwrap();
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
                NicSpec::named("rail0").on_rail(0),
                NicSpec::named("rail1").on_rail(1),
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
