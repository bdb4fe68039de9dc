//! The playbook executor in a real netns cluster (needs root; fails instead
//! of skipping when `CI` is set): a short `playbook-leader-kill`.

use chaos_tests::partitions::{partitions, PartitionsRun};
use chaos_tests::playbook_leader_kill::{playbook_leader_kill, LeaderFault, LeaderKillRun};
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
        fault: LeaderFault::Pause(std::time::Duration::from_secs(3)),
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

/// The short form of `scenario partitions`: one split of each kind around
/// the leader (symmetric, asymmetric, with its agents) while admin clients
/// write and playbooks order agents; every acknowledged write survives,
/// the history is linearizable, no order runs twice, every playbook ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_around_the_leader_lose_no_write_and_repeat_no_order() {
    if !require_root("playbook_netns::partitions").unwrap() {
        return;
    }
    let r = partitions(PartitionsRun {
        rounds: 3,
        hold: std::time::Duration::from_secs(3),
        clients: 4,
        seed: 9,
    })
    .await
    .unwrap();
    assert_eq!(r.lost_acked_ops, 0, "{r:?}");
    assert!(r.linearizable, "{r:?}");
    assert_eq!(r.duplicate_actions, 0, "{r:?}");
    assert_eq!(r.lost_runs, 0, "{r:?}");
    assert_eq!(
        (r.symmetric, r.asymmetric, r.leader_with_agents),
        (1, 1, 1),
        "{r:?}"
    );
    assert_eq!(r.leader_moved, 3, "every split cut the leader off: {r:?}");
    assert!(r.acked_ops > 20, "{r:?}");
    assert!(r.ok, "{r:?}");
}
