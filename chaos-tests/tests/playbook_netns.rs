//! The playbook executor in a real netns cluster (needs root; fails instead
//! of skipping when `CI` is set): a short `playbook-leader-kill`.

use chaos_tests::playbook_leader_kill::{playbook_leader_kill, LeaderKillRun};
use testbed::require_root;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn playbooks_complete_through_leader_kills_without_duplicated_actions() {
    if !require_root("playbook_netns::leader_kill").unwrap() {
        return;
    }
    let r = playbook_leader_kill(LeaderKillRun {
        rounds: 6,
        parallel: 3,
        seed: 3,
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(r.duplicated_actions, 0, "{r:?}");
    assert_eq!(r.lost, 0, "{r:?}");
    assert_eq!(r.playbooks_completed, 6, "{r:?}");
    assert_eq!(r.leader_kills, 2, "{r:?}");
    assert!(r.ok, "{r:?}");
}

/// The short form of `scenario pause-leader`'s playbook part: the leader
/// is SIGSTOPped mid-wave and resumed believing it leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn playbooks_complete_through_a_paused_leader_without_duplicated_actions() {
    if !require_root("playbook_netns::pause_leader").unwrap() {
        return;
    }
    let r = playbook_leader_kill(LeaderKillRun {
        rounds: 3,
        parallel: 3,
        seed: 5,
        pause: Some(std::time::Duration::from_secs(3)),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(r.duplicated_actions, 0, "{r:?}");
    assert_eq!(r.lost, 0, "{r:?}");
    assert_eq!(r.playbooks_completed, 3, "{r:?}");
    assert_eq!(r.leader_kills, 1, "{r:?}");
    assert!(r.ok, "{r:?}");
}
