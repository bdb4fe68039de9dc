//! `railguard links` and `railguard shape …`: fabric links with their
//! contention scores, and the HTB shapes reshaping playbooks put on NICs.

use clap::Subcommand;
use supervisor::api::{LinkScore, LinksView, ShapeRow};

use crate::output::{fmt_ms, num};

/// `railguard shape …`.
#[derive(Subcommand, Debug)]
pub enum ShapeCmd {
    /// Desired shapes (classes, rates, flows) and whether each host's agent
    /// confirmed installing them.
    List {
        /// Only this host.
        host: Option<String>,
    },
    /// Remove every shape from a host's NICs now (the agent deletes its
    /// HTB qdisc; the incident stays open and no new reshaping happens
    /// for it).
    Clear { host: String },
}

/// A rate in bit/s, human-sized (`-` when unknown).
pub fn rate(bps: Option<u64>) -> String {
    match bps {
        None => "-".into(),
        Some(b) if b >= 1_000_000_000 && b % 1_000_000_000 == 0 => {
            format!("{}Gbit", b / 1_000_000_000)
        }
        Some(b) => format!("{}Mbit", b / 1_000_000),
    }
}

pub fn print_links(v: &LinksView) {
    let Some(file) = &v.topology else {
        println!("no topology loaded (start the supervisors with --topology FILE)");
        return;
    };
    println!("topology: {file}");
    println!(
        "{:<20} {:<30} {:>8} {:>6} {:>10} {:>7} {:>12}  BOTTLENECK",
        "LINK", "DIRECTION", "RATE", "PATHS", "CONTENDED", "SCORE", "QUEUE p99 µs"
    );
    // One directed link's row (its rate is the topology's).
    let score_row = |s: &LinkScore| {
        println!(
            "{:<20} {:<30} {:>8} {:>6} {:>10} {:>7.2} {:>12}  {}",
            s.link.link,
            format!("{} → {}", s.link.from, s.link.to),
            rate(s.rate_bps),
            s.paths,
            s.contended,
            s.score,
            num(s.queueing_p99_us, 0),
            if s.bottleneck { "yes" } else { "" }
        );
    };
    for l in v.links.iter().filter(|l| !l.access) {
        let dirs: Vec<&LinkScore> = v.scores.iter().filter(|s| s.link.link == l.name).collect();
        if dirs.is_empty() {
            println!(
                "{:<20} {:<30} {:>8} {:>6} {:>10} {:>7} {:>12}",
                l.name,
                format!("{} ↔ {}", l.a, l.b),
                rate(l.rate_bps),
                0,
                0,
                "-",
                "-"
            );
        }
        dirs.into_iter().for_each(score_row);
    }
    v.scores
        .iter()
        .filter(|s| s.access && s.contended > 0)
        .for_each(score_row);
    let cables = v.links.iter().filter(|l| l.access).count();
    println!("({cables} NIC cables; those with contended paths are listed)");
    for i in &v.incidents {
        println!(
            "incident {} open since {}: {}",
            i.id,
            fmt_ms(i.opened_ms),
            i.detail
        );
    }
}

pub fn print_shapes(rows: &[ShapeRow]) {
    if rows.is_empty() {
        println!("no shapes");
        return;
    }
    for r in rows {
        let state = match (&r.desired, r.applied_version) {
            (Some(d), Some(v)) if d.version == v => "applied".to_string(),
            (Some(d), _) if d.failures >= supervisor::model::shaping::MAX_SHAPE_FAILURES => {
                format!("refused {} times", d.failures)
            }
            (Some(_), _) => "pending".to_string(),
            (None, Some(_)) => "to be removed".to_string(),
            (None, None) => "-".to_string(),
        };
        match &r.desired {
            Some(d) => {
                println!(
                    "{}/{}: {state} (incident {}, {}, version {})",
                    r.host, r.nic, d.incident, d.link, d.version
                );
                for c in &d.classes {
                    let flows: Vec<String> = c
                        .flows
                        .iter()
                        .map(|f| match (f.protocol, f.dst_port, f.src_port) {
                            (0, _, _) => format!("dst {}", f.dst),
                            (_, p, 0) => format!("dst {} tcp dport {p}", f.dst),
                            (_, _, p) => format!("dst {} tcp sport {p}", f.dst),
                        })
                        .collect();
                    println!(
                        "  1:{:x} {:<16} {:>9}  {}",
                        c.minor,
                        c.label,
                        rate(Some(c.rate_bps)),
                        flows.join(", ")
                    );
                }
                for (job, bps) in &d.pace {
                    println!("  pace job {job}: {} per connection", rate(Some(*bps)));
                }
            }
            None => println!("{}/{}: {state}", r.host, r.nic),
        }
    }
}
