//! The shipped playbooks: valid as a set, matched and planned as intended.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use playbooks::{
    check_files, load_files, matching, plan, toml_files, Action, ClusterView, HostStatus, HostView,
    IncidentView, JobView, Jump, MigrateTarget, NicHealth, NicView, Plan, Playbook,
};

fn library() -> Vec<Playbook> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("library");
    let files = toml_files(&dir).expect("library dir");
    assert!(files.len() >= 5, "{files:?}");
    match load_files(&files) {
        Ok(set) => set,
        Err(e) => panic!("library invalid:\n{e}"),
    }
}

fn nic(health: NicHealth, backup: Option<&str>) -> NicView {
    NicView {
        health,
        rail: Some(0),
        backup: backup.map(str::to_string),
    }
}

fn cluster(backup_health: NicHealth) -> ClusterView {
    let mut hosts = BTreeMap::new();
    for h in ["h1", "h2", "h3", "h4"] {
        let mut nics = BTreeMap::new();
        nics.insert("eth1".to_string(), nic(NicHealth::Up, Some("eth2")));
        nics.insert("eth2".to_string(), nic(NicHealth::Up, Some("eth1")));
        hosts.insert(
            h.to_string(),
            HostView {
                status: HostStatus::Ready,
                clock_synced: true,
                nics,
                jobs: ["train".to_string()].into(),
            },
        );
    }
    let h1 = hosts.get_mut("h1").unwrap();
    h1.nics.get_mut("eth1").unwrap().health = NicHealth::Down;
    h1.nics.get_mut("eth2").unwrap().health = backup_health;
    let mut jobs = BTreeMap::new();
    jobs.insert(
        "train".to_string(),
        JobView {
            running: true,
            checkpoint_age: Some(Duration::from_secs(120)),
        },
    );
    ClusterView { hosts, jobs }
}

fn incident(kind: &str) -> IncidentView {
    IncidentView {
        kind: kind.into(),
        host: "h1".into(),
        nic: Some("eth1".into()),
        rail: Some(0),
        ..Default::default()
    }
}

/// An incident of `kind` on host h1 as a whole (no NIC).
fn host_incident(kind: &str) -> IncidentView {
    IncidentView {
        nic: None,
        ..incident(kind)
    }
}

/// The plan of the shipped playbook matching `inc` (there must be one)
/// against `view`.
fn planned(inc: &IncidentView, view: &ClusterView) -> Plan {
    let set = library();
    let pb = matching(&set, inc).expect("a shipped playbook matches");
    plan(pb, inc, view)
}

#[test]
fn library_is_a_valid_set() {
    let set = library();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("library");
    assert!(check_files(&toml_files(&dir).unwrap()).is_empty());
    for kind in [
        "nic_down",
        "nic_flapping",
        "host_down",
        "clock_unsynced",
        "link_contention",
        "host_cut_off",
        "no_common_rail",
    ] {
        let pb = matching(&set, &incident(kind)).unwrap_or_else(|| panic!("nothing for {kind}"));
        assert_eq!(pb.name, kind.replace('_', "-"));
    }
    assert!(matching(&set, &incident("job")).is_none());
}

#[test]
fn nic_down_migrates_to_a_healthy_backup() {
    let p = planned(&incident("nic_down"), &cluster(NicHealth::Up));
    assert!(p.starts);
    let ids: Vec<&str> = p.steps.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["migrate", "announce"]);
    assert!(p.steps[0].runs);
    assert_eq!(p.steps[0].blocked, None);
    assert_eq!(p.steps[0].target, "host h1: eth1 -> eth2");
    assert_eq!(
        p.steps[0].action,
        Action::MigrateQps {
            to: MigrateTarget::Backup
        }
    );
    assert_eq!(p.steps[0].on_failure, Jump::Step("checkpoint".into()));
}

#[test]
fn nic_down_without_backup_checkpoints_and_drains() {
    let p = planned(&incident("nic_down"), &cluster(NicHealth::Flapping));
    let ids: Vec<(&str, bool)> = p.steps.iter().map(|s| (s.id.as_str(), s.runs)).collect();
    assert_eq!(
        ids,
        [
            ("migrate", false),
            ("checkpoint", true),
            ("drain", true),
            ("wait-reusable", true),
            ("return", true),
            ("announce", true)
        ]
    );
    assert_eq!(
        p.steps[4].target,
        "host h1 back in service if a playbook drained it"
    );
    assert_eq!(p.steps[1].target, "host h1: checkpoint train");
    assert_eq!(
        p.steps[2].blocked, None,
        "1 of 4 hosts is within the limits"
    );

    // A second host already drained: the limits refuse another.
    let mut view = cluster(NicHealth::Down);
    view.hosts.get_mut("h2").unwrap().status = HostStatus::Drained;
    let p = planned(&incident("nic_down"), &view);
    let drain = p.steps.iter().find(|s| s.id == "drain").unwrap();
    assert!(
        drain.blocked.as_deref().unwrap().contains("limits allow 1"),
        "{drain:?}"
    );
}

#[test]
fn nic_flapping_waits_for_the_damper_then_fails_back() {
    let inc = incident("nic_flapping");
    let mut view = cluster(NicHealth::Up);
    view.hosts
        .get_mut("h1")
        .unwrap()
        .nics
        .get_mut("eth1")
        .unwrap()
        .health = NicHealth::Recovering;
    let p = planned(&inc, &view);
    let ids: Vec<(&str, bool)> = p.steps.iter().map(|s| (s.id.as_str(), s.runs)).collect();
    assert_eq!(
        ids,
        [
            ("move-off", true),
            ("wait-reusable", true),
            ("failback", false)
        ]
    );
    assert_eq!(p.escalates_to.as_deref(), Some("nic-flapping-stuck"));
}

#[test]
fn host_down_restarts_its_jobs() {
    let p = planned(&host_incident("host_down"), &cluster(NicHealth::Up));
    assert_eq!(p.steps[0].action, Action::RestartJob);
    assert_eq!(p.steps[0].target, "restart train (from host h1)");
    assert_eq!(
        p.steps[1].target,
        "log: h1 is down: its jobs were restarted elsewhere"
    );
}

#[test]
fn clock_unsynced_excludes_then_includes() {
    let p = planned(&host_incident("clock_unsynced"), &cluster(NicHealth::Up));
    let actions: Vec<&str> = p.steps.iter().map(|s| s.action.name()).collect();
    assert_eq!(
        actions,
        ["exclude_from_owd", "notify", "wait_until", "include_in_owd"]
    );
}

/// The README's complete examples (a fenced block starting with
/// `# library/<file>`) parse, and match the shipped file.
#[test]
fn readme_examples_are_the_shipped_files() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let mut checked = 0;
    for block in readme.split("```toml\n").skip(1) {
        let block = block.split("```").next().unwrap();
        let Some(file) = block
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# library/"))
            .filter(|f| f.ends_with(".toml"))
        else {
            continue;
        };
        let from_readme = playbooks::parse(file, block).unwrap_or_else(|e| panic!("{e}"));
        let text = std::fs::read_to_string(root.join("library").join(file)).unwrap();
        let shipped = playbooks::parse(file, &text).unwrap();
        assert_eq!(
            from_readme, shipped,
            "README's {file} differs from the shipped one"
        );
        checked += 1;
    }
    assert!(checked >= 1);
}

/// A path incident restarts only the jobs both of its hosts run, and its
/// announcement names both.
#[test]
fn no_common_rail_restarts_the_jobs_the_two_hosts_share() {
    let mut view = cluster(NicHealth::Up);
    view.hosts.get_mut("h1").unwrap().jobs.insert("solo".into());
    view.hosts.get_mut("h3").unwrap().jobs.clear();
    let inc = IncidentView {
        peer: Some("h2".into()),
        ..host_incident("no_common_rail")
    };
    let p = planned(&inc, &view);
    assert_eq!(p.playbook, "no-common-rail");
    assert!(p.starts);
    let ids: Vec<&str> = p.steps.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["restart", "announce"]);
    assert_eq!(p.steps[0].action, Action::RestartJob);
    assert_eq!(p.steps[0].target, "restart train (from host h1)");
    assert!(
        p.steps[1]
            .target
            .contains("h1 and h2 share no working data rail"),
        "{}",
        p.steps[1].target
    );
    // With a peer that shares none of h1's jobs: nothing to restart.
    let inc = IncidentView {
        peer: Some("h3".into()),
        ..inc
    };
    assert_eq!(
        planned(&inc, &view).steps[0].target,
        "restart no jobs (from host h1)"
    );
}
