//! Model round-trips (bincode, as in Raft entries), set validation, matching.

use std::collections::BTreeMap;
use std::time::Duration;

use playbooks::{
    check_sources, matching, parse, validate_set, Action, Check, Condition, IncidentKind,
    IncidentView, Jump, Limits, MigrateTarget, Playbook, SetError, Step, Trigger,
};

fn step(id: &str, action: Action) -> Step {
    Step {
        id: id.into(),
        action,
        when: None,
        timeout: Duration::from_secs(60),
        retries: 0,
        next: None,
        on_failure: None,
    }
}

fn playbook(name: &str, priority: u32, on_failure: Option<&str>) -> Playbook {
    Playbook {
        name: name.into(),
        description: String::new(),
        priority,
        trigger: Some(Trigger {
            incidents: vec![IncidentKind::NicDown],
            labels: BTreeMap::new(),
            nic: None,
            rail: None,
            job: None,
        }),
        guards: vec![],
        steps: vec![step("c", Action::Cordon)],
        on_failure: on_failure.map(str::to_string),
        limits: Limits::default(),
    }
}

#[test]
fn every_variant_round_trips_through_bincode() {
    let checks = [
        Check::HostReady,
        Check::HostDrained,
        Check::NicUp,
        Check::NicReusable,
        Check::BackupNicHealthy,
        Check::ClockSynced,
        Check::JobCheckpointYoungerThan(Duration::from_secs(600)),
        Check::JobRunning,
        Check::IncidentCleared,
    ];
    assert_eq!(checks.len(), Check::NAMES.len());
    let actions = vec![
        Action::MigrateQps {
            to: MigrateTarget::Backup,
        },
        Action::MigrateQps {
            to: MigrateTarget::Nic("eth3".into()),
        },
        Action::Failback,
        Action::ReshapeRate {
            bits_per_sec: Some(400_000_000),
            edge_hold: Some(Duration::from_millis(1)),
        },
        Action::CheckpointJob,
        Action::RestartJob,
        Action::Cordon,
        Action::Drain {
            deadline: Duration::from_secs(300),
        },
        Action::ReturnToService,
        Action::WaitUntil {
            condition: Condition {
                negated: true,
                check: Check::NicReusable,
            },
        },
        Action::ExcludeFromOwd,
        Action::IncludeInOwd,
        Action::Notify {
            message: "{host} down".into(),
            webhook: Some("http://ops.example/hook".into()),
        },
    ];
    let names: std::collections::BTreeSet<&str> = actions.iter().map(|a| a.name()).collect();
    assert_eq!(names.len(), Action::NAMES.len(), "every action covered");
    let mut pb = playbook("all", 7, Some("other"));
    pb.trigger = Some(Trigger {
        incidents: IncidentKind::ALL.to_vec(),
        labels: [("rack".to_string(), "r1".to_string())].into(),
        nic: Some("eth1".into()),
        rail: Some(2),
        job: Some("train".into()),
    });
    pb.guards = checks
        .iter()
        .map(|c| Condition {
            negated: false,
            check: c.clone(),
        })
        .collect();
    let jumps = [Jump::End, Jump::Escalate, Jump::Step("x".into())];
    pb.steps = actions
        .into_iter()
        .enumerate()
        .map(|(i, a)| {
            let mut s = step(&format!("s{i}"), a);
            s.next = Some(jumps[i % 3].clone());
            s.on_failure = Some(jumps[(i + 1) % 3].clone());
            s.when = Some(Condition {
                negated: i % 2 == 0,
                check: Check::ClockSynced,
            });
            s
        })
        .collect();
    let bytes = bincode::serialize(&pb).expect("bincode");
    let back: Playbook = bincode::deserialize(&bytes).expect("bincode back");
    assert_eq!(back, pb);
    let json = serde_json::to_string(&pb).unwrap();
    assert_eq!(serde_json::from_str::<Playbook>(&json).unwrap(), pb);
    let mut escalation_only = playbook("esc", 0, None);
    escalation_only.trigger = None;
    let bytes = bincode::serialize(&escalation_only).unwrap();
    assert_eq!(
        bincode::deserialize::<Playbook>(&bytes).unwrap(),
        escalation_only
    );
}

#[test]
fn set_errors() {
    let ok = [playbook("a", 1, Some("b")), playbook("b", 1, None)];
    assert_eq!(validate_set(&ok), Ok(()));

    let cycle = [
        playbook("c", 1, Some("a")),
        playbook("a", 1, Some("b")),
        playbook("b", 1, Some("c")),
        playbook("d", 1, Some("a")),
    ];
    assert_eq!(
        validate_set(&cycle),
        Err(vec![SetError::EscalationCycle {
            cycle: vec!["a".into(), "b".into(), "c".into()]
        }])
    );

    let missing = [
        playbook("a", 1, Some("nic-dwn")),
        playbook("nic-down", 1, None),
    ];
    assert_eq!(
        validate_set(&missing),
        Err(vec![SetError::MissingEscalation {
            playbook: "a".into(),
            target: "nic-dwn".into(),
            suggestion: Some("nic-down".into()),
        }])
    );

    let dup = [playbook("a", 1, None), playbook("a", 2, None)];
    assert_eq!(
        validate_set(&dup),
        Err(vec![SetError::DuplicateName { name: "a".into() }])
    );

    let mut lonely = playbook("lonely", 0, None);
    lonely.trigger = None;
    assert_eq!(
        validate_set(&[lonely]),
        Err(vec![SetError::Unused {
            playbook: "lonely".into()
        }])
    );

    let many: Vec<Playbook> = (0..300)
        .map(|i| playbook(&format!("p{i}"), 0, None))
        .collect();
    assert!(matches!(
        validate_set(&many).unwrap_err()[0],
        SetError::TooMany { count: 300, .. }
    ));
}

const A: &str = r#"name = "a"
on_failure = "b"

[[steps]]
action = "cordon"
"#;
const B: &str = r#"name = "b"
priority = 5
on_failure = "a"

[[steps]]
action = "cordon"
"#;
const A_ESCALATION_ONLY: &str = r#"name = "a"

[[steps]]
action = "cordon"
"#;
const B_TRIGGERED: &str = r#"name = "b"
on_failure = "a"

[trigger]
incidents = ["host_down"]

[[steps]]
action = "cordon"
"#;

#[test]
fn set_errors_are_located_in_their_files() {
    let err = check_sources([("a.toml", A), ("b.toml", B)]).unwrap_err();
    let d = err.diagnostics();
    assert_eq!(d.len(), 1, "{err}");
    assert_eq!(
        (d[0].file.as_str(), d[0].line, d[0].column),
        ("a.toml", 2, 14)
    );
    assert!(d[0].message.contains("escalation cycle: a -> b"), "{err}");
    assert!(d[0].hint.is_some());

    let err = check_sources([("a.toml", A), ("b.toml", B), ("b2.toml", B)]).unwrap_err();
    let dup = err
        .diagnostics()
        .iter()
        .find(|d| d.message.contains("two playbooks are named \"b\""))
        .expect("duplicate reported");
    assert_eq!((dup.file.as_str(), dup.line, dup.column), ("b2.toml", 1, 8));
    assert!(dup.hint.as_deref().unwrap().contains("b.toml:1:8"));

    let set =
        check_sources([("a.toml", A_ESCALATION_ONLY), ("b.toml", B_TRIGGERED)]).expect("valid set");
    assert_eq!(set.len(), 2);
    assert!(set[0].trigger.is_none());
}

fn triggered(name: &str, priority: u32, f: impl FnOnce(&mut Trigger)) -> Playbook {
    let mut p = playbook(name, priority, None);
    f(p.trigger.as_mut().unwrap());
    p
}

#[test]
fn matching_picks_highest_priority_then_smallest_name() {
    let inc = IncidentView {
        kind: "nic_down".into(),
        host: "h1".into(),
        nic: Some("eth1".into()),
        rail: Some(1),
        job: None,
        peer: None,
        labels: [("rack".to_string(), "r1".to_string())].into(),
        closed: false,
    };
    let set = vec![
        triggered("generic", 10, |_| {}),
        triggered("zz-rack", 50, |t| {
            t.labels.insert("rack".into(), "r1".into());
        }),
        triggered("aa-rack", 50, |t| {
            t.labels.insert("rack".into(), "r1".into());
        }),
        triggered("other-rack", 90, |t| {
            t.labels.insert("rack".into(), "r2".into());
        }),
        triggered("other-nic", 90, |t| t.nic = Some("eth2".into())),
        triggered("other-rail", 90, |t| t.rail = Some(2)),
        triggered("needs-job", 90, |t| t.job = Some("train".into())),
        triggered("host-down", 99, |t| {
            t.incidents = vec![IncidentKind::HostDown]
        }),
    ];
    assert_eq!(matching(&set, &inc).unwrap().name, "aa-rack");
    let mut no_labels = inc.clone();
    no_labels.labels.clear();
    assert_eq!(matching(&set, &no_labels).unwrap().name, "generic");
    let mut with_job = inc.clone();
    with_job.job = Some("train".into());
    assert_eq!(matching(&set, &with_job).unwrap().name, "needs-job");
    let mut unknown = inc;
    unknown.kind = "something_else".into();
    assert!(matching(&set, &unknown).is_none());
}

#[test]
fn parsed_defaults() {
    let pb = parse(
        "d.toml",
        r#"name = "d"
[trigger]
incidents = ["nic_down"]
[[steps]]
action = "drain"
deadline = "5m"
[[steps]]
action = "wait_until"
condition = "not job_checkpoint_younger_than 1h30m"
timeout = "2h"
"#,
    )
    .unwrap();
    assert_eq!(pb.priority, 0);
    assert_eq!(pb.limits, Limits::default());
    assert_eq!(pb.steps[0].id, "step-1");
    assert_eq!(pb.steps[0].timeout, Duration::from_secs(360));
    assert_eq!(
        pb.steps[1].action,
        Action::WaitUntil {
            condition: Condition {
                negated: true,
                check: Check::JobCheckpointYoungerThan(Duration::from_secs(5400)),
            }
        }
    );
    assert_eq!(pb.steps[1].on_failure, None);
}
