//! Hosts and NICs: unknown hosts, drains, stable host ids and the probe graph, NIC addresses.

use super::*;

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
            cmds: vec![admin(drain_op("h0"))],
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
