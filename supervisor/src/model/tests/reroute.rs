//! Detour routes: the desired sets follow NIC states, are ordered by
//! digest, confirmed by the agents' answers, and forgotten at registration;
//! standby sets (the failed host's part, for its reflex) follow the static
//! topology and agree with what the order says once the NIC is down.

use super::*;
use crate::model::decide::decide;
use crate::model::reroute::{desired, order_digest, standby, MAX_REROUTE_FAILURES};
use proto::agent::RouteVia;

/// Hosts h0..h{n-1}, each with rail0 (10.0.0.i+1) and rail1 (10.1.0.i+1),
/// each the other's backup, both up.
fn cluster(n: usize) -> (ClusterState, u64) {
    let mut st = ClusterState::default();
    let mut seq = 1;
    for i in 0..n {
        let h = format!("h{i}");
        let r = one(
            &mut st,
            seq,
            seq,
            crate::model::testkit::register_two_rails_for_test(i, &h),
        );
        assert!(r.is_ok(), "{r:?}");
        seq += 1;
        for nic in ["rail0", "rail1"] {
            nic_health(&mut st, &mut seq, &h, nic, NicHealth::Up);
        }
    }
    (st, seq)
}

/// `host`'s agent reporting `nic` in `health`, as its next event.
fn nic_report(st: &ClusterState, host: &str, nic: &str, health: NicHealth) -> Command {
    let next = st.hosts[host].last_event_seq + 1;
    Command::AgentEvents {
        host: host.into(),
        events: vec![AgentEvent {
            seq: next,
            report: Report::Nic(NicReport {
                nic: nic.into(),
                health,
                carrier_changes: next,
                flaps: 0,
                penalty: 0.0,
                coalesced: 0,
                link_up: health != NicHealth::Down,
                probes_lost: false,
                at_unix_ns: 0,
            }),
        }],
    }
}

fn nic_health(st: &mut ClusterState, seq: &mut u64, host: &str, nic: &str, health: NicHealth) {
    let r = one(st, *seq, *seq, nic_report(st, host, nic, health));
    assert!(r.is_ok(), "{r:?}");
    *seq += 1;
}

fn route(dst: &str, via: &str, dev: &str) -> RouteVia {
    RouteVia {
        dst: dst.parse().unwrap(),
        via: via.parse().unwrap(),
        dev: dev.into(),
    }
}

/// Opens each action's intent and answers it done (the agents confirm).
fn confirm(st: &mut ClusterState, seq: &mut u64, actions: Vec<Action>) {
    for a in actions {
        let r = one(st, *seq, *seq, Command::OpenIntent { action: a });
        *seq += 1;
        let Ok(CmdOk::IntentOpened { id }) = r else {
            panic!("{r:?}")
        };
        let host = st.intents[&id].action.host().to_owned();
        let r = one(
            st,
            *seq,
            *seq,
            Command::OrderDone {
                host,
                id,
                outcome: crate::model::testkit::answer(true, "ok"),
            },
        );
        assert_eq!(r, Ok(CmdOk::Done));
        *seq += 1;
    }
}

/// The reroute orders open now for the current sets (a NIC's change opens
/// them in its own entry).
fn opened(st: &ClusterState) -> Vec<Action> {
    st.open_intents()
        .map(|i| i.action.clone())
        .filter(|a| matches!(a, Action::Reroute { .. }))
        .filter(|a| crate::model::reroute::reroute_order_obsolete(st, a).is_none())
        .collect()
}

/// The reroute orders wanted now: those open for the current sets and
/// those `decide` would open.
fn wanted(st: &ClusterState) -> Vec<Action> {
    let mut out = opened(st);
    out.extend(decide(st, 10).into_iter().filter_map(|c| match c {
        Command::OpenIntent {
            action: a @ Action::Reroute { .. },
        } => Some(a),
        _ => None,
    }));
    out
}

#[test]
fn a_down_nic_gets_detours_on_every_host_and_loses_them_when_up() {
    let (mut st, mut seq) = cluster(3);
    for h in ["h0", "h1", "h2"] {
        assert!(desired(&st, h).is_empty(), "all NICs up: no detours");
    }
    // Every host is ordered once for its standby sets, then nothing more.
    let first = wanted(&st);
    assert_eq!(first.len(), 3, "{first:?}");
    confirm(&mut st, &mut seq, first);
    assert!(wanted(&st).is_empty());
    nic_health(&mut st, &mut seq, "h1", "rail0", NicHealth::Down);
    // Peers reach h1's rail0 address through its rail1 address, on their
    // own rail1.
    assert_eq!(
        desired(&st, "h0"),
        vec![route("10.0.0.2", "10.1.0.2", "rail1")]
    );
    assert_eq!(
        desired(&st, "h2"),
        vec![route("10.0.0.2", "10.1.0.2", "rail1")]
    );
    // h1 reaches the peers' rail0 addresses through their rail1 ones.
    assert_eq!(
        desired(&st, "h1"),
        vec![
            route("10.0.0.1", "10.1.0.1", "rail1"),
            route("10.0.0.3", "10.1.0.3", "rail1"),
        ]
    );
    // The entry that applied the report opened the three orders itself:
    // no reconciler round stands between the NIC and its detours.
    let actions = opened(&st);
    assert_eq!(actions.len(), 3, "{actions:?}");
    assert_eq!(wanted(&st), actions, "decide has nothing to add");
    // Opened, answered: confirmed, nothing more wanted.
    confirm(&mut st, &mut seq, actions);
    assert!(
        wanted(&st).is_empty(),
        "confirmed sets are not ordered again"
    );
    assert_eq!(st.reroutes["h0"].applied, order_digest(&st, "h0"));
    // Recovering is not yet usable: the detours stay.
    nic_health(&mut st, &mut seq, "h1", "rail0", NicHealth::Recovering);
    assert!(wanted(&st).is_empty());
    // Up (hold time passed): every host is ordered its set without the
    // detours, which is the digest of the all-up state confirmed first.
    nic_health(&mut st, &mut seq, "h1", "rail0", NicHealth::Up);
    let back = wanted(&st);
    assert_eq!(back.len(), 3);
    for a in &back {
        let Action::Reroute { host, digest } = a else {
            panic!("{a:?}")
        };
        assert!(desired(&st, host).is_empty());
        assert_eq!(*digest, order_digest(&st, host));
    }
    confirm(&mut st, &mut seq, back);
    // A NIC that loses packets with its link up (Degraded) is detoured
    // like a dead one, and comes back the same way.
    nic_health(&mut st, &mut seq, "h1", "rail0", NicHealth::Degraded);
    assert_eq!(st.hosts["h1"].nics["rail0"].state, NicState::Degraded);
    assert_eq!(wanted(&st).len(), 3);
    assert_eq!(
        desired(&st, "h0"),
        vec![route("10.0.0.2", "10.1.0.2", "rail1")]
    );
}

#[test]
fn standby_sets_are_the_failed_hosts_part_and_follow_the_topology_only() {
    let (mut st, mut seq) = cluster(3);
    let sets = standby(&st, "h1");
    let nics: Vec<&str> = sets.iter().map(|s| s.nic.as_str()).collect();
    assert_eq!(nics, ["rail0", "rail1"]);
    assert_eq!(
        sets[0].routes,
        vec![
            route("10.0.0.1", "10.1.0.1", "rail1"),
            route("10.0.0.3", "10.1.0.3", "rail1"),
        ]
    );
    assert_eq!(
        sets[1].routes,
        vec![
            route("10.1.0.1", "10.0.0.1", "rail0"),
            route("10.1.0.3", "10.0.0.3", "rail0"),
        ]
    );
    // What the reflex installs is what the leader orders once the NIC is
    // known down: the next order confirms the routes, never flips them.
    nic_health(&mut st, &mut seq, "h1", "rail0", NicHealth::Down);
    assert_eq!(desired(&st, "h1"), sets[0].routes);
    // NIC states elsewhere do not change standby sets (no order storm).
    nic_health(&mut st, &mut seq, "h2", "rail1", NicHealth::Down);
    assert_eq!(standby(&st, "h1"), sets);
    // A host registering changes every other host's standby sets, and so
    // their digests: each is ordered again.
    let (mut st, mut seq) = cluster(2);
    let first = wanted(&st);
    confirm(&mut st, &mut seq, first);
    let before = order_digest(&st, "h0");
    let r = one(
        &mut st,
        seq,
        seq,
        crate::model::testkit::register_two_rails_for_test(2, "h2"),
    );
    assert!(r.is_ok(), "{r:?}");
    assert_ne!(order_digest(&st, "h0"), before);
    assert_eq!(standby(&st, "h0")[0].routes.len(), 2);
    let hosts: Vec<String> = wanted(&st).iter().map(|a| a.host().to_owned()).collect();
    assert_eq!(hosts, ["h0", "h1", "h2"]);
}

#[test]
fn a_host_alone_or_without_backups_is_not_ordered() {
    let (st, _) = cluster(1);
    assert!(standby(&st, "h0").is_empty());
    assert_eq!(order_digest(&st, "h0"), 0);
    assert!(wanted(&st).is_empty());
    // Two hosts whose NICs name no backup: nothing to stand by for.
    let mut st = ClusterState::default();
    for (i, h) in ["h0", "h1"].into_iter().enumerate() {
        let mut reg = crate::model::testkit::register_two_rails_for_test(i, h);
        if let Command::RegisterHost { nics, .. } = &mut reg {
            for n in nics {
                n.backup = None;
            }
        }
        assert!(one(&mut st, i as u64 + 1, i as u64 + 1, reg).is_ok());
    }
    assert!(standby(&st, "h0").is_empty());
    assert_eq!(order_digest(&st, "h0"), 0);
    assert!(wanted(&st).is_empty());
}

#[test]
fn stale_and_failing_sets_are_not_applied_or_retried_forever() {
    let (mut st, mut seq) = cluster(2);
    nic_health(&mut st, &mut seq, "h1", "rail0", NicHealth::Down);
    let a = wanted(&st).into_iter().find(|a| a.host() == "h0").unwrap();
    let Ok(CmdOk::IntentOpened { id }) =
        one(&mut st, seq, seq, Command::OpenIntent { action: a.clone() })
    else {
        panic!()
    };
    seq += 1;
    // The NIC comes back before the answer: the order is obsolete.
    nic_health(&mut st, &mut seq, "h1", "rail0", NicHealth::Up);
    let closes: Vec<Command> = decide(&st, 10)
        .into_iter()
        .filter(|c| matches!(c, Command::CloseIntent { id: i, .. } if *i == id))
        .collect();
    assert_eq!(closes.len(), 1, "an obsolete set is cancelled");
    for c in closes {
        assert!(one(&mut st, seq, seq, c).is_ok());
        seq += 1;
    }
    // Opening a set that is no longer the desired one is refused.
    assert!(matches!(
        one(&mut st, seq, seq, Command::OpenIntent { action: a }),
        Err(CmdError::FailedPrecondition(_))
    ));
    seq += 1;
    // A set that keeps failing is given up after MAX_REROUTE_FAILURES.
    nic_health(&mut st, &mut seq, "h1", "rail0", NicHealth::Down);
    for _ in 0..MAX_REROUTE_FAILURES {
        let a = wanted(&st)
            .into_iter()
            .find(|a| a.host() == "h0")
            .expect("retried");
        let Ok(CmdOk::IntentOpened { id }) =
            one(&mut st, seq, seq, Command::OpenIntent { action: a })
        else {
            panic!()
        };
        seq += 1;
        let r = one(
            &mut st,
            seq,
            seq,
            Command::OrderDone {
                host: "h0".into(),
                id,
                outcome: crate::model::testkit::answer(false, "no NIC rail1"),
            },
        );
        assert_eq!(r, Ok(CmdOk::Done));
        seq += 1;
    }
    assert!(wanted(&st).iter().all(|a| a.host() != "h0"), "given up");
    // Re-registration forgets what the agent had (it flushed at start).
    st.reroutes.insert(
        "h0".into(),
        crate::model::reroute::RerouteRecord {
            applied: 42,
            ..Default::default()
        },
    );
    let r = one(
        &mut st,
        seq,
        seq,
        crate::model::testkit::register_two_rails_for_test(0, "h0"),
    );
    assert!(r.is_ok());
    assert!(!st.reroutes.contains_key("h0"));
}

#[test]
fn no_detour_without_a_usable_backup() {
    let (mut st, mut seq) = cluster(2);
    // Both of h1's NICs down: nothing to route through.
    nic_health(&mut st, &mut seq, "h1", "rail1", NicHealth::Down);
    nic_health(&mut st, &mut seq, "h1", "rail0", NicHealth::Down);
    assert!(desired(&st, "h0").is_empty());
    assert!(desired(&st, "h1").is_empty());
    // A peer whose own backup rail is down cannot carry the detour either.
    let (mut st, mut seq) = cluster(2);
    nic_health(&mut st, &mut seq, "h0", "rail1", NicHealth::Down);
    nic_health(&mut st, &mut seq, "h1", "rail0", NicHealth::Down);
    assert_eq!(
        desired(&st, "h0"),
        vec![],
        "h0 has no up NIC on h1's backup rail"
    );
}

#[test]
fn an_entry_with_many_nic_changes_opens_one_order_per_host_for_its_final_state() {
    let (mut st, mut seq) = cluster(4);
    let first = wanted(&st);
    confirm(&mut st, &mut seq, first);
    // The orders the hosts' registrations made obsolete are cancelled by
    // the reconciler.
    for c in decide(&st, 10) {
        if matches!(c, Command::CloseIntent { .. }) {
            assert!(one(&mut st, seq, seq, c).is_ok());
            seq += 1;
        }
    }
    let reroutes = |st: &ClusterState| -> Vec<Action> {
        st.open_intents()
            .map(|i| i.action.clone())
            .filter(|a| matches!(a, Action::Reroute { .. }))
            .collect()
    };
    assert!(reroutes(&st).is_empty());
    let intents_before = st.next_intent_id;
    // A rail switch dies: three hosts' rail0 go down in one entry (the
    // batcher packs their reports together).
    let cmds: Vec<Command> = ["h0", "h1", "h2"]
        .into_iter()
        .map(|h| nic_report(&st, h, "rail0", NicHealth::Down))
        .collect();
    let results = st.apply_proposal(
        &lid(seq),
        &crate::model::command::Proposal { at_ms: seq, cmds },
    );
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    // One order per host, each for the set after the whole entry: none
    // for an intermediate state, none already obsolete.
    let open = reroutes(&st);
    let mut hosts: Vec<&str> = open.iter().map(|a| a.host()).collect();
    hosts.sort_unstable();
    assert_eq!(hosts, ["h0", "h1", "h2", "h3"], "{open:?}");
    for a in &open {
        assert_eq!(
            crate::model::reroute::reroute_order_obsolete(&st, a),
            None,
            "{a:?}"
        );
    }
    assert_eq!(st.next_intent_id - intents_before, 4);
    assert!(!st.reroute_pending, "nothing carried into the next entry");
    // h3 reaches the three down addresses through their backups.
    assert_eq!(desired(&st, "h3").len(), 3);
}
