//! `scenario partitions`: the management network splits around the leader
//! while admin clients write and playbooks send agent orders.
//!
//! A netns cluster (3 supervisors, 4 real agents; the `playbook-leader-kill`
//! harness) runs waves of NIC flap storms whose `nic-flapping` playbooks
//! order agents to move connections and fail them back. In each wave, at a
//! random moment (every other wave while an order is in flight), the
//! management network is split for `hold`, then healed; the kind of split
//! cycles wave by wave ([`crate::splits::PartitionKind`]):
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

use crate::playbook_leader_kill::{playbook_leader_kill, LeaderFault, LeaderKillRun};
use crate::splits::PartitionKind;
use serde::Serialize;

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
    /// `nic_flapping` runs cancelled because the NIC settled before the
    /// run could act (its host's agent cut off from the leader meanwhile).
    pub cancelled_runs: usize,
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
        cancelled_runs: k.cancelled,
        duplicate_actions: k.duplicated_actions,
        missing_actions: k.missing_actions,
        orders_executed: k.orders_executed,
        orders_in_flight_at_partitions: k.orders_in_flight_at_kills,
        wall_s: k.wall_s,
        errors,
    })
}
