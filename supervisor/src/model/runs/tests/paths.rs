//! Paths in the playbook world: an admin's failover that holds a NIC out
//! of service, a host cut off from every data rail, and two hosts with no
//! common working rail.

use super::*;
use crate::model::jobs::JobCommand;

#[test]
fn an_admins_failover_holds_the_nic_until_the_admins_failback() {
    let mut w = World::new(&["h0", "h1"], true);
    w.nic("h0", "rail0", NicHealth::Up);
    w.nic("h0", "rail1", NicHealth::Up);
    let registered = w.st.hosts["h0"].held_version;
    assert!(
        registered > 0,
        "a host's held set has a version from its registration"
    );
    let failover = AdminOp::NicFailover {
        host: "h0".into(),
        nic: "rail0".into(),
        to: None,
    };
    let CmdOk::IntentOpened { id } = w.admin(failover.clone()) else {
        panic!("no intent")
    };
    let h = &w.st.hosts["h0"];
    assert_eq!(h.held_out_nics(), vec!["rail0".to_string()]);
    assert!(h.held_version > registered);
    let version = h.held_version;
    // The order tells the agent to hold it, as of that version.
    let order = crate::leader::orders::order_of(&w.st, &w.st.intents[&id].action).map(|(_, o)| o);
    assert_eq!(
        order,
        Some(proto::agent::Order::HoldOut {
            nic: "rail0".into(),
            to: "rail1".into(),
            version,
        })
    );
    // The same failover again is the same intent and the same version.
    assert_eq!(w.admin(failover), CmdOk::IntentOpened { id });
    assert_eq!(w.st.hosts["h0"].held_version, version);
    w.settle(obey);
    // Nothing fails over onto a held NIC.
    let onto = w.apply(Command::Admin {
        actor: "t".into(),
        op: AdminOp::NicFailover {
            host: "h0".into(),
            nic: "rail1".into(),
            to: None,
        },
        request: None,
    });
    assert!(
        matches!(&onto, Err(CmdError::FailedPrecondition(m)) if m.contains("held out")),
        "{onto:?}"
    );
    // rail0 flaps and recovers: the nic-flapping playbook's failback step
    // ends at once without an order, and the NIC stays held.
    w.nic("h0", "rail0", NicHealth::Flapping);
    w.settle(obey);
    w.nic("h0", "rail0", NicHealth::Up);
    w.settle(obey);
    let run = w.st.runs.keys().next_back().copied().expect("a run");
    assert_eq!(
        w.run(run).state,
        RunState::Completed,
        "{:?}",
        w.run(run).log
    );
    let step = w
        .step_intents(run)
        .into_iter()
        .find(|i| {
            matches!(
                &i.action,
                Action::PlaybookStep {
                    op: StepOp::Failback { .. },
                    ..
                }
            )
        })
        .expect("a failback step")
        .clone();
    assert_eq!(step.status, IntentStatus::Closed(Outcome::Done));
    assert!(
        step.detail.contains("held out of service"),
        "{}",
        step.detail
    );
    assert!(
        !w.delivered.contains(&step.id),
        "no failback order reached the agent"
    );
    assert_eq!(w.st.hosts["h0"].held_out_nics(), vec!["rail0".to_string()]);
    // The admin's failback releases it, as of a newer version.
    let CmdOk::IntentOpened { id: back } = w.admin(AdminOp::NicFailback {
        host: "h0".into(),
        nic: "rail0".into(),
    }) else {
        panic!("no intent")
    };
    let h = &w.st.hosts["h0"];
    assert!(h.held_out_nics().is_empty());
    assert!(h.held_version > version);
    let order = crate::leader::orders::order_of(&w.st, &w.st.intents[&back].action).map(|(_, o)| o);
    assert_eq!(
        order,
        Some(proto::agent::Order::Release {
            nic: "rail0".into(),
            version: h.held_version,
        })
    );
}

#[test]
fn a_held_nic_that_is_down_can_still_be_released() {
    let mut w = World::new(&["h0", "h1"], true);
    w.nic("h0", "rail0", NicHealth::Up);
    w.nic("h0", "rail1", NicHealth::Up);
    w.admin(AdminOp::NicFailover {
        host: "h0".into(),
        nic: "rail0".into(),
        to: None,
    });
    w.settle(obey);
    w.nic("h0", "rail0", NicHealth::Down);
    w.settle(obey);
    let failback = || Command::Admin {
        actor: "t".into(),
        op: AdminOp::NicFailback {
            host: "h0".into(),
            nic: "rail0".into(),
        },
        request: None,
    };
    let r = w.apply(failback());
    assert!(matches!(r, Ok(CmdOk::IntentOpened { .. })), "{r:?}");
    assert!(w.st.hosts["h0"].held_out_nics().is_empty());
    // Not held any more: a failback to a NIC that is down is refused.
    let r = w.apply(failback());
    assert!(matches!(r, Err(CmdError::FailedPrecondition(_))), "{r:?}");
}

#[test]
fn a_cut_off_host_gets_its_own_incident_and_its_jobs_move_without_it() {
    let mut w = job_world(true);
    for h in ["h0", "h1", "h2"] {
        w.nic(h, "rail0", NicHealth::Up);
        w.nic(h, "rail1", NicHealth::Up);
    }
    w.settle(obey);
    let incidents_before = w.st.incidents.len();
    // One rail down: h1 still has a working rail.
    w.nic("h1", "rail0", NicHealth::Down);
    assert!(w.st.hosts["h1"].cut_off_incident.is_none());
    // Both down (its agent still answers: not Down, cut off).
    w.nic("h1", "rail1", NicHealth::Down);
    let id = w.st.hosts["h1"]
        .cut_off_incident
        .expect("a cut-off incident");
    assert_eq!(w.st.incidents[&id].kind, IncidentKind::HostCutOff);
    assert_eq!(w.st.hosts["h1"].liveness, Liveness::Ready);
    assert_eq!(
        crate::model::jobs::place::ineligible(&w.st, "h1", &w.st.jobs["j"].spec).as_deref(),
        Some("cut off: no working data rail")
    );
    // A NIC playbook decided before the host was cut off does not start.
    let rail0 = w.st.hosts["h1"].nics["rail0"].open_incidents[&IncidentKind::NicDown];
    let start = w.apply(Command::Playbook(RunCommand::Start {
        incident: rail0,
        playbook: "nic-down".into(),
        version: w.st.playbooks["nic-down"].version,
    }));
    assert!(
        matches!(&start, Err(CmdError::FailedPrecondition(m)) if m.contains("cut off")),
        "{start:?}"
    );
    w.settle(obey);
    // Its playbook restarted the job on the spare, as a planned move.
    let j = &w.st.jobs["j"];
    assert_eq!(j.incarnation, 2);
    assert_eq!(j.state, JobState::Running);
    assert_eq!(j.placement, vec!["h0", "h2"]);
    assert_eq!(j.restarts, 0, "no restart budget spent");
    let run =
        w.st.runs
            .values()
            .find(|r| r.incident == id)
            .expect("a host-cut-off run");
    assert_eq!(run.playbook, "host-cut-off");
    assert_eq!(run.state, RunState::Completed, "{:?}", run.log);
    // The NICs' own playbooks did not drain it; the incident stays open
    // while the host is still cut off.
    assert_eq!(w.st.hosts["h1"].status(), crate::model::HostStatus::Ready);
    assert!(w.st.incidents[&id].closed_ms.is_none());
    assert_eq!(w.events_of(&Event::HostIncidentStays { incident: id }), 1);
    assert!(w.st.incidents.len() >= incidents_before + 3);
    // A rail back but settling, then flapping again: the same incident.
    w.nic("h1", "rail0", NicHealth::Recovering);
    assert!(
        w.st.incidents[&id].closed_ms.is_none(),
        "settling does not end it"
    );
    w.nic("h1", "rail0", NicHealth::Flapping);
    assert_eq!(
        w.st.hosts["h1"].cut_off_incident,
        Some(id),
        "no incident per flap"
    );
    w.nic("h1", "rail0", NicHealth::Down);
    w.settle(obey);
    // One rail back: the condition is gone, the incident closes; the other
    // NIC's incident gets its playbook now (rail0 is its healthy backup).
    w.nic("h1", "rail0", NicHealth::Up);
    assert!(w.st.incidents[&id].closed_ms.is_some());
    assert!(w.st.hosts["h1"].cut_off_incident.is_none());
    w.settle(obey);
    let rail1 = w.st.hosts["h1"].nics["rail1"].open_incidents[&IncidentKind::NicDown];
    assert!(
        w.st.runs
            .values()
            .any(|r| r.incident == rail1 && r.playbook == "nic-down"),
        "the NIC's incident was handled once the host was reachable"
    );
}

/// Hosts with both rails Up and job `j` of `ranks` ranks placed.
fn job_on_healthy_rails(hosts: &[&str], ranks: u32) -> World {
    let mut w = World::new(hosts, true);
    for h in hosts {
        w.nic(h, "rail0", NicHealth::Up);
        w.nic(h, "rail1", NicHealth::Up);
    }
    w.admin(AdminOp::Job(JobOp::Submit { spec: spec(ranks) }));
    w.settle(obey);
    w
}

/// The open `no_common_rail` incidents, as (host, peer), from the
/// incident table; checks the hosts' index of them on the way.
fn path_incidents(w: &World) -> Vec<(u64, String, String)> {
    let open: Vec<(u64, String, String)> =
        w.st.incidents
            .values()
            .filter(|i| i.kind == IncidentKind::NoCommonRail && i.closed_ms.is_none())
            .map(|i| (i.id, i.host.clone(), i.peer.clone().unwrap_or_default()))
            .collect();
    check_path_index(w, &open);
    open
}

/// Invariant: every host's `path_incidents` holds exactly the open
/// `no_common_rail` incidents that name it, as host or peer.
fn check_path_index(w: &World, open: &[(u64, String, String)]) {
    for h in w.st.hosts.values() {
        let expected: std::collections::BTreeSet<u64> = open
            .iter()
            .filter(|(_, a, b)| *a == h.name || *b == h.name)
            .map(|(id, _, _)| *id)
            .collect();
        assert_eq!(h.path_incidents, expected, "path index of {}", h.name);
    }
}

#[test]
fn two_neighbours_without_a_common_rail_get_a_path_incident_and_a_spare_takes_one() {
    let mut w = job_on_healthy_rails(&["h0", "h1", "h2", "h3"], 3);
    assert_eq!(w.st.jobs["j"].placement, vec!["h0", "h1", "h2"]);
    // Each keeps a local backup: no path incident yet.
    w.nic("h1", "rail0", NicHealth::Down);
    assert!(path_incidents(&w).is_empty());
    // h2 loses the other rail: h1 and h2 share none.
    w.nic("h2", "rail1", NicHealth::Down);
    let open = path_incidents(&w);
    assert_eq!(open.len(), 1, "{open:?}");
    let (id, host, peer) = open[0].clone();
    assert_eq!((host.as_str(), peer.as_str()), ("h1", "h2"));
    assert!(
        w.st.incidents[&id].detail.contains("rail0 Down"),
        "{}",
        w.st.incidents[&id].detail
    );
    // Another report changes nothing: one incident per pair.
    w.nic("h2", "rail1", NicHealth::Down);
    assert_eq!(path_incidents(&w).len(), 1);
    w.settle(obey);
    // Its playbook restarted the job with the spare instead of h2, as a
    // planned move; the NIC incidents' playbooks moved their connections.
    let j = &w.st.jobs["j"];
    assert_eq!(j.incarnation, 2);
    assert_eq!(j.state, JobState::Running);
    assert_eq!(j.placement, vec!["h0", "h1", "h3"]);
    assert_eq!(j.restarts, 0, "no restart budget spent");
    let run =
        w.st.runs
            .values()
            .find(|r| r.incident == id)
            .expect("a no-common-rail run");
    assert_eq!(run.playbook, "no-common-rail");
    assert_eq!(run.state, RunState::Completed, "{:?}", run.log);
    assert_eq!(
        w.notified("h1 and h2 share no working data rail: their jobs were restarted apart"),
        1
    );
    // Done, but the pair still shares no rail: the incident stays open.
    assert!(w.st.incidents[&id].closed_ms.is_none());
    assert_eq!(w.events_of(&Event::PathIncidentStays { incident: id }), 1);
    // A settling NIC does not end it; Up on both sides does.
    w.nic("h2", "rail1", NicHealth::Recovering);
    assert!(w.st.incidents[&id].closed_ms.is_none());
    w.nic("h2", "rail1", NicHealth::Up);
    assert!(w.st.incidents[&id].closed_ms.is_some());
    assert!(path_incidents(&w).is_empty());
    assert!(w.st.hosts.values().all(|h| h.status() == HostStatus::Ready));
}

#[test]
fn without_a_spare_the_job_waits_with_the_reason_and_no_budget_spent() {
    let mut w = job_on_healthy_rails(&["h0", "h1", "h2"], 3);
    w.nic("h1", "rail0", NicHealth::Down);
    w.nic("h2", "rail1", NicHealth::Down);
    w.settle(obey);
    let j = &w.st.jobs["j"];
    assert_eq!(j.state, JobState::Restarting);
    assert_eq!(j.restarts, 0);
    assert!(j.placement.is_empty());
    let why = crate::model::jobs::waiting_reason(&w.st, j, w.now).expect("a reason");
    assert_eq!(
        why,
        "needs 3 hosts that pairwise share a working data rail; 3 eligible, but h1 and h2 share none"
    );
    // No placement spans them, even one an old leader decided.
    let incarnation = j.incarnation;
    let place = w.apply(Command::Job(JobCommand::Place {
        job: "j".into(),
        incarnation,
        placement: vec!["h0".into(), "h1".into(), "h2".into()],
    }));
    assert!(
        matches!(&place, Err(CmdError::FailedPrecondition(m)) if m.contains("cannot talk")),
        "{place:?}"
    );
    // The rail back: placed again on all three, still no budget spent.
    w.nic("h1", "rail0", NicHealth::Up);
    w.settle(obey);
    let j = &w.st.jobs["j"];
    assert_eq!(j.state, JobState::Running);
    assert_eq!(j.placement, vec!["h0", "h1", "h2"]);
    assert_eq!(j.restarts, 0);
    assert!(path_incidents(&w).is_empty());
}

/// A rank says its connection to a neighbour has had no path although
/// every NIC looks Up (a fault the NIC states do not show): the pair gets
/// a path incident on that evidence, the job is moved at once with the
/// two apart (a failure restart: a dead peer stalls connections too, so
/// the evidence proves no path fault), and the incident resolves with its
/// run (nothing keeps it open while the NICs look healthy); a NIC report
/// meanwhile does not close it.
#[test]
fn a_stalled_connection_parts_two_hosts_whose_nics_look_healthy() {
    let mut w = job_on_healthy_rails(&["h0", "h1", "h2", "h3"], 3);
    assert_eq!(w.st.jobs["j"].placement, vec!["h0", "h1", "h2"]);
    let stalled = |incarnation: u64, rank: u32, peer: &str, peer_rank: u32| {
        Report::ConnStalled(proto::agent::ConnStallReport {
            job: "j".into(),
            incarnation,
            rank,
            conn_id: 1,
            peer_host: peer.into(),
            peer_rank,
            at_unix_ns: 0,
        })
    };
    // An older incarnation's, or one naming a rank elsewhere: nothing.
    w.report("h2", stalled(0, 2, "h1", 1));
    w.report("h2", stalled(1, 2, "h3", 1));
    assert!(path_incidents(&w).is_empty());
    w.report("h2", stalled(1, 2, "h1", 1));
    let open = path_incidents(&w);
    assert_eq!(open.len(), 1, "{open:?}");
    let (id, host, peer) = open[0].clone();
    assert_eq!((host.as_str(), peer.as_str()), ("h1", "h2"));
    let detail = &w.st.incidents[&id].detail;
    assert!(
        detail.contains("cannot talk")
            && detail.contains("rank 2 on h2 has had no path to rank 1 on h1"),
        "{detail}"
    );
    // The other end says the same: still one incident.
    w.report("h1", stalled(1, 1, "h2", 2));
    assert_eq!(path_incidents(&w).len(), 1);
    assert_eq!(w.st.incidents[&id].stalled_job.as_deref(), Some("j"));
    // Healthy NIC states do not close it.
    w.nic("h2", "rail0", NicHealth::Up);
    assert!(w.st.incidents[&id].closed_ms.is_none());
    // Placement keeps the two apart while it is open; a rank failing now
    // is a planned restart.
    assert_eq!(
        crate::model::jobs::place::placement_cut(&w.st, &w.st.jobs["j"].placement),
        Some(("h1".to_string(), "h2".to_string()))
    );
    w.settle(obey);
    w.advance(1_000);
    w.settle(obey);
    let j = &w.st.jobs["j"];
    assert_eq!((j.incarnation, j.restarts), (2, 1));
    assert_eq!(j.placement, vec!["h0", "h1", "h3"]);
    // Done; the NICs look healthy, so nothing keeps the incident open.
    assert!(w.st.incidents[&id].closed_ms.is_some());
    assert!(path_incidents(&w).is_empty());
}

/// A rank's stall that a NIC outage explains (its connection had only the
/// rail that went down) parts the pair, and with no spare the job waits;
/// once that NIC is Up again, the newer NIC evidence closes the incident
/// and the job runs on the same hosts again. (It used to wait for its
/// run's restart step to time out: minutes.)
#[test]
fn a_stall_ends_when_a_nic_of_a_common_rail_comes_back_after_it() {
    let mut w = job_on_healthy_rails(&["h0", "h1", "h2", "h3"], 4);
    w.nic("h1", "rail0", NicHealth::Down);
    w.advance(600);
    w.report(
        "h1",
        Report::ConnStalled(proto::agent::ConnStallReport {
            job: "j".into(),
            incarnation: 1,
            rank: 1,
            conn_id: 1,
            peer_host: "h0".into(),
            peer_rank: 0,
            at_unix_ns: 0,
        }),
    );
    let open = path_incidents(&w);
    assert_eq!(open.len(), 1, "{open:?}");
    let id = open[0].0;
    w.settle(obey);
    let j = &w.st.jobs["j"];
    assert_eq!(j.state, JobState::Restarting, "{}", j.reason);
    // A NIC that changes nothing (rail1 stays Up) does not close it, nor
    // does a flap of rail1, which the two shared when the ranks stalled.
    w.advance(600);
    w.nic("h0", "rail1", NicHealth::Up);
    assert!(w.st.incidents[&id].closed_ms.is_none());
    w.advance(100);
    w.nic("h0", "rail1", NicHealth::Down);
    w.advance(100);
    w.nic("h0", "rail1", NicHealth::Up);
    assert!(w.st.incidents[&id].closed_ms.is_none());
    // h1's rail0 back: both share rail0 again, newer than the report.
    w.advance(1_000);
    w.nic("h1", "rail0", NicHealth::Up);
    assert!(w.st.incidents[&id].closed_ms.is_some());
    w.settle(obey);
    let j = &w.st.jobs["j"];
    assert_eq!(j.state, JobState::Running, "{}", j.reason);
    assert_eq!(j.placement, vec!["h0", "h1", "h2", "h3"]);
    // The stall's restart (a failure restart: a stall alone does not prove
    // a path fault), and no other.
    assert_eq!(j.restarts, 1);
}

/// A peer that is not Ready (its liveness in doubt) stalls connections
/// too: that is the liveness detector's to judge, not a path incident.
#[test]
fn a_stall_towards_a_host_in_doubt_is_not_a_path_incident() {
    let mut w = job_on_healthy_rails(&["h0", "h1", "h2"], 2);
    assert_eq!(w.st.jobs["j"].placement, vec!["h0", "h1"]);
    w.ok(Command::SetLiveness {
        host: "h1".into(),
        liveness: Liveness::Suspect,
    });
    w.report(
        "h0",
        Report::ConnStalled(proto::agent::ConnStallReport {
            job: "j".into(),
            incarnation: 1,
            rank: 0,
            conn_id: 1,
            peer_host: "h1".into(),
            peer_rank: 1,
            at_unix_ns: 0,
        }),
    );
    assert!(path_incidents(&w).is_empty());
    assert!(w
        .st
        .events
        .iter()
        .any(|e| matches!(&e.event, Event::ConnStalled { job, .. } if job == "j")));
}

/// Placement finds hosts that share one rail when the greedy pass (which
/// keeps the earliest previous host) cannot: h0 lost rail0, h1..h3 lost
/// rail1; {h1, h2, h3, h4} all have rail0.
#[test]
fn placement_falls_back_to_the_hosts_of_one_rail() {
    let mut w = job_on_healthy_rails(&["h0", "h1", "h2", "h3", "h4"], 4);
    assert_eq!(w.st.jobs["j"].placement, vec!["h0", "h1", "h2", "h3"]);
    w.nic("h0", "rail0", NicHealth::Down);
    for h in ["h1", "h2", "h3"] {
        w.nic(h, "rail1", NicHealth::Down);
    }
    w.settle(obey);
    let j = &w.st.jobs["j"];
    assert_eq!(j.state, JobState::Running, "{}", j.reason);
    assert_eq!(j.placement, vec!["h4", "h1", "h2", "h3"]);
    assert_eq!(j.restarts, 0);
    // At most a few path incidents name one host.
    for h in ["h0", "h1", "h2", "h3"] {
        let n = path_incidents(&w)
            .iter()
            .filter(|(_, a, b)| a == h || b == h)
            .count();
        assert!(
            n <= crate::model::limits::MAX_PATH_INCIDENTS_PER_HOST,
            "{h}: {n}"
        );
    }
}
