//! `scenario pause-leader`: a leader that stood still (SIGSTOP for 10 s by
//! default, then SIGCONT, the way a VM pause, a stop-the-world stall or a
//! debugger does it) wakes up believing it still leads, with its sockets
//! and its agents' order streams open. Meanwhile the others elected a new
//! leader. It must not act on its stale leadership.
//!
//! Two parts, one report:
//! - **Admin history** (3 supervisors on loopback, the `leader-kill`
//!   harness with pauses instead of kills): concurrent admin writes and
//!   linearizable reads; every acknowledged write must survive
//!   (`lost_acked_ops` 0) and the history must be linearizable.
//! - **Playbooks and orders** (a netns cluster with real agents, the
//!   `playbook-leader-kill` harness with pauses): NIC flap storms whose
//!   playbooks send agent orders while the leader is paused at a random
//!   moment of each wave; every playbook must complete and no agent may
//!   execute an order twice (`duplicate_actions` 0, from the agents'
//!   execution journals).
//!
//! What keeps the woken leader harmless: Raft (its proposals cannot commit
//! in its old term), `Supervisor::leads` (leader services act only after a
//! quorum confirmed the term), and the agents' term fence — every order
//! carries its leader's term, and an agent refuses an order older than the
//! newest term it has heard from an order or a heartbeat reply.

use std::time::Duration;

use serde::Serialize;

use crate::admin_history::{self, HistoryRun};
use crate::playbook_leader_kill::{playbook_leader_kill, LeaderFault, LeaderKillRun};

#[derive(Debug, Clone)]
pub struct PauseLeaderRun {
    /// Pauses in the admin-history part.
    pub rounds: usize,
    /// Flap waves (one pause each) in the playbook part.
    pub waves: usize,
    pub pause: Duration,
    pub seed: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct PauseLeaderReport {
    pub ok: bool,
    pub scenario: &'static str,
    pub pause_s: f64,
    /// Leader pauses, both parts.
    pub pauses: usize,
    pub acked_ops: usize,
    pub lost_acked_ops: usize,
    pub unknown_ops: usize,
    pub linearizable: bool,
    pub linearizability: String,
    /// Longest time no admin operation succeeded.
    pub max_unavailable_ms: u64,
    /// Acknowledged additions and removals of the spare supervisor in the
    /// admin-history part (its membership history is checked too).
    pub member_changes: usize,
    pub playbooks_completed: usize,
    /// From incident opened to run completed (the runs' own committed
    /// times, not when the harness saw them), ms: below the pause when the
    /// new leader carries the playbooks on while the old one is stopped.
    pub playbook_ms_p50: u64,
    pub playbook_ms_max: u64,
    /// `nic_flapping` runs that did not complete.
    pub lost_runs: usize,
    /// Order ids executed more than once (agents' journals).
    pub duplicate_actions: usize,
    /// Order steps of completed runs that no agent executed.
    pub missing_actions: usize,
    pub orders_executed: usize,
    pub wall_s: f64,
    pub errors: Vec<String>,
}

/// Hosts flapping at once in each wave of the playbook part.
const PARALLEL: usize = 4;

pub async fn pause_leader(p: PauseLeaderRun) -> anyhow::Result<PauseLeaderReport> {
    anyhow::ensure!(
        (1..=100).contains(&p.rounds) && (1..=50).contains(&p.waves),
        "--rounds takes 1..=100 and --waves 1..=50"
    );
    anyhow::ensure!(
        (Duration::from_secs(1)..=Duration::from_secs(60)).contains(&p.pause),
        "--pause-s takes 1..=60 (shorter pauses end before another leader is elected)"
    );
    let t0 = std::time::Instant::now();
    let h = admin_history::run(HistoryRun {
        rounds: p.rounds,
        hosts: 4,
        clients: 6,
        whole_cluster: false,
        load_per_round: Duration::from_millis(1_500),
        seed: p.seed,
        pause: Some(p.pause),
    })
    .await?;
    eprintln!(
        "[pause-leader] admin history: {} acked, {} lost, linearizable {}",
        h.acked_ops, h.lost_ops, h.linearizable
    );
    let k = playbook_leader_kill(LeaderKillRun {
        rounds: p.waves * PARALLEL,
        parallel: PARALLEL,
        seed: p.seed,
        wave_timeout: Duration::from_secs(90) + p.pause,
        fault: LeaderFault::Pause(p.pause),
        history_clients: 0,
    })
    .await?;
    let ok = h.ok && k.ok && h.lost_ops == 0 && h.linearizable && k.duplicated_actions == 0;
    let mut errors = k.errors;
    if h.unexpected_errors > 0 {
        errors.push(format!(
            "admin history: {} unexpected errors",
            h.unexpected_errors
        ));
    }
    Ok(PauseLeaderReport {
        ok,
        scenario: "pause-leader",
        pause_s: p.pause.as_secs_f64(),
        pauses: h.kills + k.leader_kills,
        acked_ops: h.acked_ops,
        lost_acked_ops: h.lost_ops,
        unknown_ops: h.unknown_ops,
        linearizable: h.linearizable,
        linearizability: h.linearizability,
        max_unavailable_ms: h.max_unavailable_ms,
        member_changes: h.member_changes,
        playbooks_completed: k.playbooks_completed,
        playbook_ms_p50: k.playbook_ms_p50,
        playbook_ms_max: k.playbook_ms_max,
        lost_runs: k.lost,
        duplicate_actions: k.duplicated_actions,
        missing_actions: k.missing_actions,
        orders_executed: k.orders_executed,
        wall_s: t0.elapsed().as_secs_f64(),
        errors,
    })
}
