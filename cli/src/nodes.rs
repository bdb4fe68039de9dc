//! `railguard node …`: GPU hosts — list, show, cordon, drain, labels.

use std::time::Duration;

use clap::Subcommand;
use supervisor::model::Host;

use crate::nics::nic_row;
use crate::output::{fmt_ms, pairs, parse_duration, table};

/// `railguard node …`.
#[derive(Subcommand, Debug)]
pub enum NodeCmd {
    /// All hosts with their status.
    List,
    /// One host with its NICs.
    Show { host: String },
    /// Mark a host unschedulable.
    Cordon { host: String },
    /// Make a cordoned host schedulable again.
    Uncordon { host: String },
    /// Cordon a host, move its work away, then mark it Drained.
    Drain {
        host: String,
        /// Why (required, recorded with the drain).
        #[arg(long, short)]
        reason: String,
        /// Stop remaining work after this long, e.g. 30m (default: wait).
        #[arg(long, value_parser = parse_duration)]
        deadline: Option<Duration>,
    },
    /// Return a draining or drained host to service.
    Undrain { host: String },
    /// Forget a decommissioned host: it must be Drained (or Down) with
    /// nothing on it. Stop its agent first, or it registers again (as a
    /// new host).
    Remove { host: String },
    /// Set (KEY=VALUE) or remove (--remove KEY) host labels.
    Label {
        host: String,
        /// KEY=VALUE pairs to set.
        set: Vec<String>,
        /// Label keys to remove.
        #[arg(long)]
        remove: Vec<String>,
    },
}

pub fn print_hosts(hosts: &[Host]) {
    if hosts.is_empty() {
        println!("no hosts registered");
        return;
    }
    if crate::output::wide() {
        table!(
            hosts,
            "{:<14} {:<10} {:<9} {:<9} {:>5} {:<25} {:<9} {:<30} {}",
            [
                "HOST",
                "STATUS",
                "LIVENESS",
                "CLOCK",
                "ID",
                "REGISTERED",
                "INCIDENT",
                "NICS",
                "LABELS"
            ],
            |h| [
                h.name,
                h.status().to_string(),
                format!("{:?}", h.liveness),
                format!("{:?}", h.clock.state),
                h.id,
                fmt_ms(h.registered_ms),
                h.open_incident.map_or("-".into(), |i| i.to_string()),
                h.nics
                    .values()
                    .map(|n| format!("{}:{:?}", n.name, n.state))
                    .collect::<Vec<_>>()
                    .join(","),
                pairs(&h.labels, ",", "")
            ],
        );
        return;
    }
    table!(
        hosts,
        "{:<14} {:<10} {:<9} {:<9} {:>5}  {}",
        ["HOST", "STATUS", "LIVENESS", "CLOCK", "NICS", "LABELS"],
        |h| [
            h.name,
            h.status().to_string(),
            format!("{:?}", h.liveness),
            format!("{:?}", h.clock.state),
            h.nics.len(),
            pairs(&h.labels, ",", "")
        ],
    );
}

/// `railguard node show`: one host with its NICs and jobs.
pub fn print_host(host: &Host, jobs: &[String]) {
    println!("host:       {} (probe id {})", host.name, host.id);
    println!("status:     {}", host.status());
    println!("liveness:   {:?}", host.liveness);
    println!(
        "clock:      {:?}{}",
        host.clock.state,
        if host.clock.changed_ms > 0 {
            format!(" since {}", fmt_ms(host.clock.changed_ms))
        } else {
            String::new()
        }
    );
    println!("cordoned:   {}", host.cordoned);
    if let Some(d) = &host.drain {
        println!(
            "drain:      {:?} since {} by {}: {}{}",
            d.phase,
            fmt_ms(d.since_ms),
            d.by,
            d.reason,
            d.deadline_ms
                .map(|x| format!(" (deadline {})", fmt_ms(x)))
                .unwrap_or_default()
        );
    }
    println!("labels:     {}", pairs(&host.labels, ",", "-"));
    println!(
        "jobs:       {}",
        if jobs.is_empty() {
            "-".into()
        } else {
            jobs.join(",")
        }
    );
    println!("events:     applied through seq {}", host.last_event_seq);
    println!("NICS:");
    println!(
        "  {:<8} {:>4} {:<8} {:<15} {:<10} {:>6} {:>8}  {:<24} SERVICE",
        "NIC", "RAIL", "BACKUP", "ADDR", "STATE", "FLAPS", "PENALTY", "LAST CHANGE"
    );
    for n in host.nics.values() {
        println!("  {}", nic_row(n));
    }
}
