//! railguard's playbook language: declarative remediation for incidents.
//!
//! A playbook (TOML, see `playbooks/README.md`) names the incidents it
//! handles, guards that must hold before it starts, ordered steps drawn from
//! the supervisor's capabilities, escalation to another playbook, safety
//! limits and a priority. This crate parses and validates playbooks (every
//! error at `file:line:column` with a hint), validates sets (escalation
//! references and cycles), picks the playbook for an incident and plans a
//! dry run against views of the cluster the supervisor fills from its
//! model. Everything here is pure: no I/O except the file helpers in `set`.
//!
//! The types in [`types`] go into Raft log entries: plain structs and
//! externally tagged enums only, so they round-trip through bincode.

mod diag;
mod parse;
mod plan;
mod set;
pub mod types;

pub use diag::{Diagnostic, PlaybookError};
pub use parse::{parse, parse_located, parse_rate, Located, PLACEHOLDERS};
pub use plan::{
    evaluate, incident_jobs, matching, plan, render_message, trigger_matches, ClusterView,
    ConditionCheck, HostStatus, HostView, IncidentView, JobView, NicHealth, NicView, Plan,
    PlannedStep,
};
pub use set::{check_files, check_sources, load_files, toml_files, validate_set, SetError};
pub use types::{
    Action, Check, Condition, IncidentKind, Jump, Limits, MigrateTarget, Playbook, Step, Trigger,
};

/// The shipped library (`playbooks/library/`), as (file name, text). A new
/// cluster installs it once (the supervisor's leader does); operators
/// replace or delete its playbooks like any other.
pub const SHIPPED: [(&str, &str); 8] = [
    ("nic-down.toml", include_str!("../library/nic-down.toml")),
    (
        "nic-flapping.toml",
        include_str!("../library/nic-flapping.toml"),
    ),
    (
        "nic-flapping-stuck.toml",
        include_str!("../library/nic-flapping-stuck.toml"),
    ),
    ("host-down.toml", include_str!("../library/host-down.toml")),
    (
        "host-cut-off.toml",
        include_str!("../library/host-cut-off.toml"),
    ),
    (
        "no-common-rail.toml",
        include_str!("../library/no-common-rail.toml"),
    ),
    (
        "clock-unsynced.toml",
        include_str!("../library/clock-unsynced.toml"),
    ),
    (
        "link-contention.toml",
        include_str!("../library/link-contention.toml"),
    ),
];
