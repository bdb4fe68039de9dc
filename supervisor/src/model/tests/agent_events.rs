//! Agent events: applied exactly once and in order; connection placements.

use super::*;

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
