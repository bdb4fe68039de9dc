//! Stored playbooks: the files an apply carries, what is stored, and the
//! shipped library as files.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Most playbooks stored.
pub const MAX_PLAYBOOKS: usize = 256;

/// Longest playbook file.
pub const MAX_PLAYBOOK_BYTES: usize = 64 << 10;

/// Who installed the shipped playbooks (their `applied_by`).
pub const SHIPPED_ACTOR: &str = "railguard (shipped library)";

/// The shipped library as apply files.
pub fn shipped_files() -> Vec<PlaybookFile> {
    playbooks::SHIPPED
        .iter()
        .map(|(file, text)| PlaybookFile {
            file: format!("library/{file}"),
            text: (*text).to_owned(),
        })
        .collect()
}

/// Most files in one `apply`.
pub const MAX_APPLY_FILES: usize = 64;

/// One file of an `apply`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PlaybookFile {
    /// The name it had on the admin's machine (for error locations).
    pub file: String,
    pub text: String,
}

/// A stored playbook.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StoredPlaybook {
    pub name: String,
    pub file: String,
    pub source: String,
    /// Bumped on every apply that changes it.
    pub version: u64,
    pub applied_ms: u64,
    pub applied_by: String,
}

impl StoredPlaybook {
    /// The parsed playbook (stored sources always parse: they were
    /// validated before they were stored).
    pub fn parsed(&self) -> Option<playbooks::Playbook> {
        playbooks::parse(&self.file, &self.source).ok()
    }
}

/// The incident a plan is made for, as the CLI describes it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct PlanIncident {
    pub kind: String,
    pub host: String,
    pub nic: Option<String>,
    pub job: Option<String>,
    /// The other host of a path incident.
    #[serde(default)]
    pub peer: Option<String>,
}

/// Playbooks by name (for `playbook list`).
pub type PlaybookTable = BTreeMap<String, StoredPlaybook>;
