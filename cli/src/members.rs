//! `railguard status` and `railguard cluster …`: supervisor membership,
//! leader, term and replication progress.

use clap::Subcommand;
use supervisor::api::{MemberView, StatusView};

use crate::output::{pairs, table};

/// `railguard cluster …`.
#[derive(Subcommand, Debug)]
pub enum ClusterCmd {
    /// Initialise a new cluster from the contacted supervisor's configured peers (once).
    Init,
    /// List supervisors with their role and replication progress.
    Members,
    /// Add a supervisor: as a learner until it has caught up, then as a voter
    /// (one that does not catch up within 6 s is removed again and the call
    /// refused: nothing changes).
    AddMember { id: u64, addr: String },
    /// Remove a supervisor from the cluster.
    RemoveMember { id: u64 },
    /// Hand leadership to another voter.
    TransferLeader { id: u64 },
}

/// `railguard status`.
pub fn print_status(s: &StatusView) {
    println!("answered by: supervisor {}", s.answered_by);
    println!(
        "leader:      {}",
        s.leader
            .map(|l| format!("supervisor {l}"))
            .unwrap_or_else(|| "none (election in progress?)".into())
    );
    println!("term:        {}", s.term);
    println!(
        "commit:      {} (applied {})",
        s.commit_index, s.applied_index
    );
    println!(
        "snapshot:    {} (log compacted through {})",
        s.snapshot_index
            .map(|i| i.to_string())
            .unwrap_or_else(|| "none".into()),
        s.purged_index
            .map(|i| i.to_string())
            .unwrap_or_else(|| "-".into())
    );
    println!("members:");
    for m in &s.members {
        println!(
            "  {:>3}  {:<22} {:<8}{}",
            m.id,
            m.addr,
            if m.voter { "voter" } else { "learner" },
            if m.leader { " leader" } else { "" }
        );
    }
    println!("hosts:       {}", pairs(&s.hosts_by_status, " ", "none"));
    println!("open incidents: {}", s.open_incidents.len());
    for i in &s.open_incidents {
        println!(
            "  #{} {} on {}{}{}",
            i.id,
            i.kind,
            i.host,
            i.peer
                .as_ref()
                .map(|p| format!(" and {p}"))
                .unwrap_or_default(),
            i.nic.as_ref().map(|n| format!("/{n}")).unwrap_or_default()
        );
    }
    if !s.open_intents.is_empty() {
        println!("open intents: {}", s.open_intents.len());
        for i in &s.open_intents {
            println!("  #{} {}", i.id, i.action);
        }
    }
}

/// `railguard cluster members`.
pub fn print_members(members: &[MemberView]) {
    table!(
        members,
        "{:>4}  {:<22} {:<8} {:<7} {}",
        ["ID", "ADDRESS", "ROLE", "LEADER", "MATCHED"],
        |m| [
            m.id,
            m.addr,
            if m.voter { "voter" } else { "learner" },
            if m.leader { "yes" } else { "" },
            m.matched
                .map(|x| x.to_string())
                .unwrap_or_else(|| "-".into())
        ],
    );
}
