//! `railguard playbook …`: stored remediation playbooks — list, show,
//! apply, delete, runs, and the dry-run plan.

use anyhow::Context;
use clap::Subcommand;
use supervisor::api::PlaybookView;
use supervisor::model::playbook_store::{PlaybookFile, StoredPlaybook};
use supervisor::model::runs::{RunState, RunView};

use crate::output::{fmt_ms, table};

/// `railguard playbook …`.
#[derive(Subcommand, Debug)]
pub enum PlaybookCmd {
    /// Stored playbooks with their version, priority and incident kinds.
    List,
    /// One stored playbook, with the TOML it was applied from.
    Show { name: String },
    /// Validate playbook files and store them, all or none; errors name
    /// file:line:column (the language: playbooks/README.md).
    Apply {
        #[arg(required = true)]
        files: Vec<std::path::PathBuf>,
    },
    /// Delete a stored playbook (refused while another escalates to it).
    Delete { name: String },
    /// Playbook runs: id, incident, playbook, current step, state.
    Runs {
        /// Only runs still running or waiting.
        #[arg(long)]
        open: bool,
    },
    /// Dry run: which guards hold and which steps would run, on what, if
    /// this incident happened now (the file need not be stored).
    Plan {
        file: std::path::PathBuf,
        /// Incident kind, e.g. nic_down, nic_flapping, host_down.
        #[arg(long)]
        incident: String,
        #[arg(long)]
        host: String,
        #[arg(long)]
        nic: Option<String>,
        #[arg(long)]
        job: Option<String>,
        /// The other host of a path incident (no_common_rail).
        #[arg(long)]
        peer: Option<String>,
    },
}

/// Reads a playbook file (checked by the caller and the supervisor).
pub fn read_playbook_file(path: &std::path::Path) -> anyhow::Result<PlaybookFile> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read playbook file {}", path.display()))?;
    Ok(PlaybookFile {
        file: path.display().to_string(),
        text,
    })
}

pub fn print_playbooks(list: &[PlaybookView], version: u64) {
    if list.is_empty() {
        println!("no playbooks (apply some: railguard playbook apply playbooks/library/*.toml)");
        return;
    }
    table!(
        list,
        "{:<24} {:>7} {:>8} {:>5}  {:<28} {}",
        [
            "PLAYBOOK",
            "VERSION",
            "PRIORITY",
            "STEPS",
            "INCIDENTS",
            "ESCALATES TO"
        ],
        |p| [
            p.name,
            p.version,
            p.priority,
            p.steps,
            if p.incidents.is_empty() {
                "(escalation only)".to_string()
            } else {
                p.incidents.join(",")
            },
            p.on_failure.as_deref().unwrap_or("-")
        ],
    );
    println!("(playbook set version {version})");
}

/// `railguard playbook show`: the stored source with a header line.
pub fn print_playbook(playbook: &StoredPlaybook) {
    println!(
        "# playbook {} version {} from {} (applied by {} at {})",
        playbook.name,
        playbook.version,
        playbook.file,
        playbook.applied_by,
        fmt_ms(playbook.applied_ms)
    );
    print!("{}", playbook.source);
}

pub fn print_plan(plan: &playbooks::Plan, matched_now: Option<&str>) {
    println!("playbook:  {}", plan.playbook);
    println!(
        "handled today by: {}",
        matched_now.unwrap_or("no stored playbook")
    );
    for g in &plan.guards {
        println!(
            "guard:     {} {}",
            if g.holds { "ok  " } else { "FAIL" },
            g.reason
        );
    }
    println!(
        "starts:    {}{}",
        plan.starts,
        plan.escalates_to
            .as_ref()
            .map(|e| format!(" (failure escalates to {e})"))
            .unwrap_or_default()
    );
    for s in &plan.steps {
        println!(
            "  {:<16} {:<5} {}{}",
            s.id,
            if s.runs { "run" } else { "skip" },
            s.target,
            s.blocked
                .as_ref()
                .map(|b| format!("  [blocked: {b}]"))
                .unwrap_or_default()
        );
    }
}

pub fn run_state(s: &RunState) -> String {
    match s {
        RunState::Running => "running".into(),
        RunState::Waiting { until_ms } => format!("waiting (until {})", fmt_ms(*until_ms)),
        RunState::Completed => "completed".into(),
        RunState::Failed { why } => format!("failed: {why}"),
        RunState::Escalated { playbook, run } => format!("escalated to {playbook} (run {run})"),
        RunState::Cancelled { why } => format!("cancelled: {why}"),
    }
}

/// A run's current step: `id (step/attempt)`, both counted from 1.
fn run_step(r: &RunView) -> String {
    if r.step_id.is_empty() {
        "-".to_string()
    } else {
        format!("{} ({}/{})", r.step_id, r.step + 1, r.attempt + 1)
    }
}

pub fn print_runs(runs: &[RunView], truncated: bool) {
    if runs.is_empty() {
        println!("no playbook runs");
        return;
    }
    table!(
        runs,
        "{:>5} {:>8}  {:<14} {:<10} {:<20} {:<18} {}",
        ["RUN", "INCIDENT", "KIND", "HOST", "PLAYBOOK", "STEP", "STATE"],
        |r| [
            r.id,
            r.incident,
            r.incident_kind,
            r.host,
            format!("{} v{}", r.playbook, r.playbook_version),
            run_step(r),
            run_state(&r.state)
        ],
    );
    if truncated {
        println!("(older runs left out)");
    }
}
