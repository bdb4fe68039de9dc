//! Request sessions: a retried write applies once; sessions and their results are bounded.

use super::*;

#[test]
fn retried_request_applies_once_and_returns_the_first_result() {
    let mut st = ClusterState::default();
    register(&mut st, "h0");
    let drain = drain_op("h0");
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
    // So is a first attempt that arrives that late: clients never leave a
    // request that far behind unanswered, so it is a delayed copy (a
    // forward held up by a partition) that may already have been applied.
    old.retry = false;
    assert!(matches!(
        st.session_result(&old),
        Some(Err(CmdError::RequestForgotten { serial: 1, .. }))
    ));
    // A request not yet that old is new to the session.
    let fresh = RequestId {
        client: "c".into(),
        serial: n + 1,
        retry: false,
    };
    assert_eq!(st.session_result(&fresh), None);
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
