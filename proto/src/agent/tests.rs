//! Unit tests of the border types: a wire roundtrip per variant, bincode
//! roundtrips, and bad wire input.

use std::collections::HashMap;

use crate::agent::*;
use crate::v1;

fn orders() -> Vec<Order> {
    vec![
        Order::Failover {
            nic: "rail0".into(),
            to: "rail1".into(),
        },
        Order::Failback {
            nic: "rail0".into(),
        },
        Order::StartRank(v1::StartRank {
            job: "train".into(),
            incarnation: 3,
            rank: 1,
            peers: vec![v1::RankPeer {
                host: "h0".into(),
                addrs: vec!["10.0.0.1".into()],
            }],
            argv: vec!["/bin/true".into()],
            env: HashMap::from([("A".into(), "1".into())]),
            checkpoint_dir: "/ckpt".into(),
            checkpoint_every: 10,
            resume_step: 5,
            port: 7000,
            user: "trainer".into(),
        }),
        Order::StopJob {
            job: "train".into(),
            incarnation: 3,
        },
        Order::CheckpointJob {
            job: "train".into(),
            incarnation: 3,
            halt: true,
        },
        Order::ShapeNic(v1::ShapeNic {
            nic: "rail0".into(),
            classes: vec![v1::ShapeClass {
                minor: 2,
                rate_bps: 1_000_000,
                ceil_bps: 2_000_000,
                flows: vec![v1::FlowMatch {
                    dst: "10.0.0.2".into(),
                    protocol: 6,
                    dst_port: 7000,
                    src_port: 0,
                }],
                label: "job train".into(),
                job: "train".into(),
            }],
            default_rate_bps: 10_000_000,
            pace: vec![v1::PaceJob {
                job: "train".into(),
                rate_bps: 500_000,
            }],
            hold_queueing_us: 50,
        }),
        Order::ClearShape {
            nic: "rail0".into(),
        },
        Order::Reroute {
            routes: vec![RouteVia {
                dst: "10.201.0.3".parse().unwrap(),
                via: "10.202.0.3".parse().unwrap(),
                dev: "rail1".into(),
            }],
            standby: vec![Standby {
                nic: "rail0".into(),
                routes: vec![RouteVia {
                    dst: "10.201.0.4".parse().unwrap(),
                    via: "10.202.0.4".parse().unwrap(),
                    dev: "rail1".into(),
                }],
            }],
        },
        Order::Reroute {
            routes: vec![],
            standby: vec![],
        },
        Order::TailLog {
            job: "train".into(),
            rank: 0,
            max_bytes: 4096,
            from: None,
        },
        Order::TailLog {
            job: "train".into(),
            rank: 3,
            max_bytes: 4096,
            from: Some((2, 81_920)),
        },
        Order::HoldOut {
            nic: "rail0".into(),
            to: "rail1".into(),
            version: 42,
        },
        Order::Release {
            nic: "rail0".into(),
            version: 43,
        },
    ]
}

#[test]
fn orders_stored_before_the_admins_hold_keep_their_bincode() {
    // The agent's order log holds bincode of `Order`: the variants that
    // existed before `HoldOut`/`Release` keep their index and layout.
    let o = Order::Failback {
        nic: "rail0".into(),
    };
    let bytes = bincode::serialize(&o).unwrap();
    assert_eq!(&bytes[..4], &1u32.to_le_bytes());
    let tail = Order::TailLog {
        job: "j".into(),
        rank: 0,
        max_bytes: 1,
        from: None,
    };
    assert_eq!(
        &bincode::serialize(&tail).unwrap()[..4],
        &8u32.to_le_bytes()
    );
}

#[test]
fn every_order_roundtrips_through_the_wire_and_bincode() {
    for (i, o) in orders().into_iter().enumerate() {
        let id = 40 + i as u64;
        let wire = o.to_wire(id);
        assert_eq!(wire.order_id, id);
        assert_eq!(Order::try_from(&wire).unwrap(), o);
        let bytes = bincode::serialize(&o).unwrap();
        assert_eq!(bincode::deserialize::<Order>(&bytes).unwrap(), o);
        assert_eq!(o.is_query(), matches!(o, Order::TailLog { .. }));
    }
}

#[test]
fn descriptions_are_the_ones_the_journal_has_always_had() {
    let o = orders();
    assert_eq!(o[0].describe(), "failover rail0 -> rail1");
    assert_eq!(o[1].describe(), "failback -> rail0");
    assert_eq!(o[2].describe(), "start job train incarnation 3 rank 1");
    assert_eq!(o[3].describe(), "stop job train through incarnation 3");
    assert_eq!(
        o[4].describe(),
        "checkpoint job train incarnation 3 and halt"
    );
    assert!(o[5]
        .describe()
        .starts_with("shape rail0: 1 classes, 1 paced jobs, #"));
    assert_eq!(o[6].describe(), "clear shaping on rail0");
}

#[test]
fn an_order_without_a_kind_is_refused() {
    let wire = v1::AgentOrder {
        order_id: 9,
        term: 0,
        kind: None,
    };
    assert_eq!(
        Order::try_from(&wire),
        Err(BorderError::NoOrderKind { order_id: 9 })
    );
}

#[test]
fn every_outcome_roundtrips_through_the_wire_and_bincode() {
    let outcomes = [
        OrderOutcome::Done {
            detail: "moved 2 connections".into(),
        },
        OrderOutcome::Checkpointed {
            step: 12,
            detail: "checkpoint at step 12".into(),
        },
        OrderOutcome::Failed {
            error: "rank 0 did not answer".into(),
        },
    ];
    for o in outcomes {
        let wire = o.to_wire("h0", 7);
        assert_eq!((wire.host.as_str(), wire.order_id), ("h0", 7));
        assert_eq!(wire.ok, o.ok());
        assert_eq!(wire.detail, o.detail());
        assert_eq!(wire.checkpoint_step, o.step());
        assert_eq!(OrderOutcome::try_from(&wire).unwrap(), o);
        let bytes = bincode::serialize(&o).unwrap();
        assert_eq!(bincode::deserialize::<OrderOutcome>(&bytes).unwrap(), o);
    }
}

#[test]
fn a_failure_with_a_step_is_refused_and_a_step_in_a_detail_means_nothing() {
    let bad = v1::OrderResult {
        host: "h0".into(),
        order_id: 3,
        ok: false,
        detail: "x".into(),
        checkpoint_step: Some(4),
    };
    assert_eq!(
        OrderOutcome::try_from(&bad),
        Err(BorderError::StepOnFailure {
            order_id: 3,
            step: 4
        })
    );
    let old = v1::OrderResult {
        host: "h0".into(),
        order_id: 3,
        ok: true,
        detail: "step=8".into(),
        checkpoint_step: None,
    };
    assert_eq!(
        OrderOutcome::try_from(&old).unwrap(),
        OrderOutcome::Done {
            detail: "step=8".into()
        }
    );
}

#[test]
fn nic_reports_roundtrip_and_bad_states_are_refused() {
    for health in [
        NicHealth::Up,
        NicHealth::Down,
        NicHealth::Flapping,
        NicHealth::Recovering,
        NicHealth::Degraded,
    ] {
        let r = NicReport {
            nic: "rail0".into(),
            health,
            link_up: health == NicHealth::Up,
            carrier_changes: 4,
            flaps: 2,
            penalty: 1.5,
            at_unix_ns: 99,
            coalesced: 1,
            probes_lost: health == NicHealth::Down,
        };
        assert_eq!(NicReport::from_wire(&r.to_wire(), 99).unwrap(), r);
        let bytes = bincode::serialize(&r).unwrap();
        assert_eq!(bincode::deserialize::<NicReport>(&bytes).unwrap(), r);
    }
    for state in [0, 6, -1, i32::MAX] {
        let m = v1::NicStateChange {
            nic: "rail0".into(),
            state,
            ..Default::default()
        };
        assert!(matches!(
            NicReport::from_wire(&m, 0),
            Err(BorderError::BadNicState { .. })
        ));
    }
}

#[test]
fn every_report_roundtrips_through_the_wire_and_bincode() {
    let reports = [
        Report::Nic(NicReport {
            nic: "rail0".into(),
            health: NicHealth::Down,
            link_up: false,
            carrier_changes: 3,
            flaps: 1,
            penalty: 0.5,
            at_unix_ns: 11,
            coalesced: 0,
            probes_lost: false,
        }),
        Report::Qp(QpReport {
            job: "train".into(),
            rank: 1,
            conn_id: u64::MAX,
            nic: "rail1".into(),
            peer_host: "h2".into(),
            peer_rank: 2,
            rail: 0,
            moved: true,
            closed: false,
            at_unix_ns: 12,
        }),
        Report::QpReset { at_unix_ns: 13 },
        Report::Reflex(ReflexReport {
            nic: "rail0".into(),
            conns: 4,
            ok: true,
            detail: "moved 4".into(),
            at_unix_ns: 14,
        }),
        Report::RankExited(RankExitReport {
            job: "train".into(),
            incarnation: 2,
            rank: 0,
            exit_code: -1,
            signal: 9,
            detail: "killed".into(),
            at_unix_ns: 15,
        }),
        Report::RankCheckpoint(RankCheckpointReport {
            job: "train".into(),
            incarnation: 2,
            rank: 0,
            step: 40,
            at_unix_ns: 16,
        }),
        Report::ConnStalled(ConnStallReport {
            job: "train".into(),
            incarnation: 2,
            rank: 1,
            conn_id: 3,
            peer_host: "h2".into(),
            peer_rank: 2,
            at_unix_ns: 17,
        }),
    ];
    for r in reports {
        let e = r.to_event("h0", 7);
        assert_eq!(
            (e.host.as_str(), e.seq, e.at_unix_ns),
            ("h0", 7, r.at_unix_ns())
        );
        assert_eq!(Report::from_wire(&e).unwrap(), r);
        let bytes = bincode::serialize(&r).unwrap();
        assert_eq!(bincode::deserialize::<Report>(&bytes).unwrap(), r);
    }
}

#[test]
fn events_without_a_kind_or_with_a_bad_penalty_are_refused() {
    let none = v1::AgentEvent {
        host: "h0".into(),
        seq: 4,
        at_unix_ns: 0,
        kind: None,
    };
    assert_eq!(
        Report::from_wire(&none),
        Err(BorderError::NoEventKind { seq: 4 })
    );
    for penalty in [f64::NAN, f64::INFINITY, -0.5] {
        let e = v1::AgentEvent {
            kind: Some(v1::agent_event::Kind::NicState(v1::NicStateChange {
                nic: "rail0".into(),
                state: v1::NicState::Up as i32,
                damping_penalty: penalty,
                ..Default::default()
            })),
            ..none.clone()
        };
        assert!(
            matches!(Report::from_wire(&e), Err(BorderError::BadPenalty { .. })),
            "{penalty}"
        );
    }
}

#[test]
fn arbitrary_wire_bytes_never_panic() {
    use prost::Message;
    let mut seed = 0x1234_5678_9abc_def0u64;
    for len in 0..200usize {
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        if let Ok(o) = v1::AgentOrder::decode(bytes.as_slice()) {
            let _ = Order::try_from(&o);
        }
        if let Ok(r) = v1::OrderResult::decode(bytes.as_slice()) {
            let _ = OrderOutcome::try_from(&r);
        }
        if let Ok(n) = v1::NicStateChange::decode(bytes.as_slice()) {
            let _ = NicReport::from_wire(&n, 0);
        }
        if let Ok(e) = v1::AgentEvent::decode(bytes.as_slice()) {
            let _ = Report::from_wire(&e);
        }
    }
}

fn reroute_wire(routes: Vec<(&str, &str, &str)>) -> v1::AgentOrder {
    v1::AgentOrder {
        order_id: 9,
        term: 0,
        kind: Some(v1::agent_order::Kind::Reroute(v1::Reroute {
            routes: routes
                .into_iter()
                .map(|(dst, via, dev)| v1::RouteVia {
                    dst: dst.into(),
                    via: via.into(),
                    dev: dev.into(),
                })
                .collect(),
            standby: vec![],
        })),
    }
}

/// A wire `Reroute` with no routes of its own and these standby sets.
fn standby_wire(sets: Vec<(&str, usize)>) -> v1::AgentOrder {
    let route = v1::RouteVia {
        dst: "10.201.0.2".into(),
        via: "10.202.0.2".into(),
        dev: "rail1".into(),
    };
    v1::AgentOrder {
        order_id: 9,
        term: 0,
        kind: Some(v1::agent_order::Kind::Reroute(v1::Reroute {
            routes: vec![],
            standby: sets
                .into_iter()
                .map(|(nic, n)| v1::Standby {
                    nic: nic.into(),
                    routes: vec![route.clone(); n],
                })
                .collect(),
        })),
    }
}

#[test]
fn standby_sets_are_checked_and_bounded() {
    let o = Order::try_from(&standby_wire(vec![("rail1", 0), ("rail0", 3)])).unwrap();
    let Order::Reroute { standby, .. } = o else {
        panic!("not a reroute")
    };
    let nics: Vec<(&str, usize)> = standby
        .iter()
        .map(|s| (s.nic.as_str(), s.routes.len()))
        .collect();
    assert_eq!(nics, [("rail0", 1), ("rail1", 0)], "sorted, deduplicated");
    let two = vec![("rail0", 1), ("rail0", 1)];
    let many_nics: Vec<(&str, usize)> = vec![("rail0", 0); MAX_STANDBY_NICS + 1];
    let per_nic = MAX_STANDBY_ROUTES / MAX_REROUTES + 1;
    let names: Vec<String> = (0..per_nic).map(|i| format!("rail{i}")).collect();
    let too_many_routes: Vec<(&str, usize)> =
        names.iter().map(|n| (n.as_str(), MAX_REROUTES)).collect();
    for (bad, says) in [
        (two, "two standby sets for NIC rail0"),
        (vec![("", 1)], "not a NIC name"),
        (vec![("rail0", MAX_REROUTES + 1)], "standby routes of rail0"),
        (many_nics, "standby sets for 33 NICs"),
        (too_many_routes, "standby routes (at most"),
    ] {
        let e = Order::try_from(&standby_wire(bad)).unwrap_err();
        assert!(e.to_string().contains(says), "{says}: {e}");
    }
}

#[test]
fn reroute_orders_are_checked_sorted_and_deduplicated() {
    let o = Order::try_from(&reroute_wire(vec![
        ("10.201.0.9", "10.202.0.9", "rail1"),
        ("10.201.0.2", "10.202.0.2", "rail1"),
        ("10.201.0.9", "10.202.0.9", "rail1"),
    ]))
    .unwrap();
    let Order::Reroute { routes, .. } = o else {
        panic!("not a reroute")
    };
    let dsts: Vec<String> = routes.iter().map(|r| r.dst.to_string()).collect();
    assert_eq!(dsts, ["10.201.0.2", "10.201.0.9"]);
    for (bad, says) in [
        (("10.201.0", "10.202.0.2", "rail1"), "not an IPv4 address"),
        (("10.201.0.2", "::1", "rail1"), "not an IPv4 address"),
        (("10.201.0.2", "10.202.0.2", ""), "not a NIC name"),
        (("10.201.0.2", "10.202.0.2", "a/b"), "not a NIC name"),
        (("10.201.0.2", "10.202.0.2", "rail 1"), "not a NIC name"),
        (
            ("10.201.0.2", "10.202.0.2", "sixteen-bytes-xx"),
            "not a NIC name",
        ),
    ] {
        let e = Order::try_from(&reroute_wire(vec![bad])).unwrap_err();
        assert!(e.to_string().contains(says), "{bad:?}: {e}");
    }
    let many = vec![("10.201.0.2", "10.202.0.2", "rail1"); MAX_REROUTES + 1];
    let e = Order::try_from(&reroute_wire(many)).unwrap_err();
    assert!(e.to_string().contains("at most"), "{e}");
}
