//! `scenario partitions`: the management network splits around the leader
//! while admin clients write and playbooks send agent orders.
//!
//! A netns cluster (3 supervisors, 4 real agents; the `playbook-leader-kill`
//! harness) runs waves of NIC flap storms whose `nic-flapping` playbooks
//! order agents to move connections and fail them back. In each wave, at a
//! random moment (every other wave while an order is in flight), the
//! management network is split for `hold`, then healed; the kind of split
//! cycles wave by wave ([`PartitionKind`]):
//! - **symmetric**: the leader and the two other supervisors no longer hear
//!   each other (agents and clients still hear everyone);
//! - **asymmetric**: the other supervisors no longer hear the leader, the
//!   leader still hears them (A hears B, B does not hear A);
//! - **leader with its agents**: the leader, h0 and h1 on one side, the
//!   other supervisors and h2 on the other.
//!
//! h3 is never cut: the CLI and six admin clients run in its namespace,
//! writing and reading hosts of their own (registered simulated hosts, so
//! drains do not disturb the playbooks) through any supervisor.
//!
//! Checkers: every acknowledged write survives and the admin history is
//! linearizable ([`crate::admin_history::HistoryLoad`]); no agent executes
//! an order twice and every playbook completes (the agents' execution
//! journals).

use std::time::Duration;

use serde::Serialize;
use testbed::Node;

use crate::playbook_leader_kill::{playbook_leader_kill, LeaderFault, LeaderKillRun};

/// How the management network is split around the leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PartitionKind {
    Symmetric,
    Asymmetric,
    LeaderWithAgents,
}

impl PartitionKind {
    /// In the order the waves take them.
    pub const ALL: [PartitionKind; 3] = [
        PartitionKind::Symmetric,
        PartitionKind::Asymmetric,
        PartitionKind::LeaderWithAgents,
    ];

    /// The kind of wave `wave`.
    pub fn of_wave(wave: usize) -> PartitionKind {
        Self::ALL[wave % Self::ALL.len()]
    }

    /// The cuts `(a, b)` — `a` no longer hears `b` — of this split around
    /// supervisor `leader` (index) of `supervisors`, with `hosts` hosts;
    /// the last host is never cut (the clients' and the CLI's).
    pub fn cuts(self, leader: usize, supervisors: usize, hosts: usize) -> Vec<(Node, Node)> {
        let l = Node::Supervisor(leader);
        let others: Vec<Node> = (0..supervisors)
            .filter(|i| *i != leader)
            .map(Node::Supervisor)
            .collect();
        let both = |x: &[Node], y: &[Node]| {
            let mut v = Vec::new();
            for a in x {
                for b in y {
                    v.push((*a, *b));
                    v.push((*b, *a));
                }
            }
            v
        };
        match self {
            PartitionKind::Symmetric => both(&[l], &others),
            PartitionKind::Asymmetric => others.iter().map(|o| (*o, l)).collect(),
            PartitionKind::LeaderWithAgents => {
                // The hosts but the last, split in two halves.
                let cut_hosts = hosts.saturating_sub(1);
                let half = cut_hosts.div_ceil(2);
                let mut x = vec![l];
                x.extend((0..half).map(Node::Host));
                let mut y = others;
                y.extend((half..cut_hosts).map(Node::Host));
                both(&x, &y)
            }
        }
    }
}

/// The scenario's settings.
#[derive(Debug, Clone)]
pub struct PartitionsRun {
    /// Partitions (one per wave of flap storms).
    pub rounds: usize,
    /// How long each partition lasts.
    pub hold: Duration,
    /// Admin clients writing and reading during the run.
    pub clients: usize,
    pub seed: u64,
}

/// The scenario's report.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionsReport {
    pub ok: bool,
    pub scenario: &'static str,
    pub partitions: usize,
    pub symmetric: usize,
    pub asymmetric: usize,
    pub leader_with_agents: usize,
    pub hold_s: f64,
    /// Partitions at whose end the majority had elected another leader
    /// (each one should: the old leader is cut off from a quorum).
    pub leader_moved: usize,
    pub acked_ops: usize,
    pub lost_acked_ops: usize,
    pub unknown_ops: usize,
    pub linearizable: bool,
    pub linearizability: String,
    /// Longest time no admin operation succeeded.
    pub max_unavailable_ms: u64,
    pub playbooks_completed: usize,
    pub playbook_ms_p50: u64,
    pub playbook_ms_max: u64,
    /// `nic_flapping` runs that did not complete.
    pub lost_runs: usize,
    /// Order ids executed more than once (agents' journals).
    pub duplicate_actions: usize,
    pub missing_actions: usize,
    pub orders_executed: usize,
    /// Partitions that found an agent order in flight.
    pub orders_in_flight_at_partitions: usize,
    pub wall_s: f64,
    pub errors: Vec<String>,
}

/// Hosts flapping at once in each wave.
const PARALLEL: usize = 4;

/// Runs the scenario.
pub async fn partitions(p: PartitionsRun) -> anyhow::Result<PartitionsReport> {
    anyhow::ensure!((1..=200).contains(&p.rounds), "--rounds takes 1..=200");
    anyhow::ensure!(
        (Duration::from_secs(1)..=Duration::from_secs(60)).contains(&p.hold),
        "--hold-s takes 1..=60"
    );
    anyhow::ensure!((1..=32).contains(&p.clients), "--clients takes 1..=32");
    let k = playbook_leader_kill(LeaderKillRun {
        rounds: p.rounds * PARALLEL,
        parallel: PARALLEL,
        seed: p.seed,
        wave_timeout: Duration::from_secs(90) + p.hold,
        fault: LeaderFault::Partition(p.hold),
        history_clients: p.clients,
    })
    .await?;
    let h = k
        .history
        .clone()
        .ok_or_else(|| anyhow::anyhow!("the admin history was not recorded"))?;
    let count = |kind: PartitionKind| k.partitions.get(&kind).copied().unwrap_or(0);
    let mut errors = k.errors.clone();
    errors.extend(h.unexpected.iter().take(5).cloned());
    let ok = k.ok
        && h.ok()
        && k.duplicated_actions == 0
        && k.lost == 0
        && k.leader_moved == Some(k.leader_kills);
    Ok(PartitionsReport {
        ok,
        scenario: "partitions",
        partitions: k.leader_kills,
        symmetric: count(PartitionKind::Symmetric),
        asymmetric: count(PartitionKind::Asymmetric),
        leader_with_agents: count(PartitionKind::LeaderWithAgents),
        hold_s: p.hold.as_secs_f64(),
        leader_moved: k.leader_moved.unwrap_or(0),
        acked_ops: h.acked_ops,
        lost_acked_ops: h.lost_ops,
        unknown_ops: h.unknown_ops,
        linearizable: h.linearizable,
        linearizability: h.linearizability,
        max_unavailable_ms: h.max_unavailable_ms,
        playbooks_completed: k.playbooks_completed,
        playbook_ms_p50: k.playbook_ms_p50,
        playbook_ms_max: k.playbook_ms_max,
        lost_runs: k.lost,
        duplicate_actions: k.duplicated_actions,
        missing_actions: k.missing_actions,
        orders_executed: k.orders_executed,
        orders_in_flight_at_partitions: k.orders_in_flight_at_kills,
        wall_s: k.wall_s,
        errors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn hears(cuts: &[(Node, Node)], a: Node, b: Node) -> bool {
        !cuts.contains(&(a, b))
    }

    #[test]
    fn each_split_cuts_what_its_name_says_and_never_the_last_host() {
        let (s, h) = (Node::Supervisor, Node::Host);
        let sym = PartitionKind::Symmetric.cuts(1, 3, 4);
        for o in [s(0), s(2)] {
            assert!(!hears(&sym, s(1), o) && !hears(&sym, o, s(1)));
        }
        assert!(hears(&sym, s(0), s(2)) && hears(&sym, s(1), h(0)));
        let asym = PartitionKind::Asymmetric.cuts(1, 3, 4);
        for o in [s(0), s(2)] {
            assert!(!hears(&asym, o, s(1)), "the others do not hear the leader");
            assert!(hears(&asym, s(1), o), "the leader still hears them");
        }
        let with = PartitionKind::LeaderWithAgents.cuts(0, 3, 4);
        let side_x = [s(0), h(0), h(1)];
        let side_y = [s(1), s(2), h(2)];
        for a in side_x {
            for b in side_y {
                assert!(!hears(&with, a, b) && !hears(&with, b, a), "{a:?} {b:?}");
            }
        }
        assert!(hears(&with, s(0), h(0)) && hears(&with, s(1), s(2)));
        for kind in PartitionKind::ALL {
            let touched: BTreeSet<Node> = kind
                .cuts(2, 3, 4)
                .into_iter()
                .flat_map(|(a, b)| [a, b])
                .collect();
            assert!(!touched.contains(&h(3)), "{kind:?}");
        }
        assert_eq!(PartitionKind::of_wave(4), PartitionKind::Asymmetric);
    }
}
