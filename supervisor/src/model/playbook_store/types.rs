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
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredPlaybook {
    pub name: String,
    pub file: String,
    pub source: String,
    /// Bumped on every apply that changes it.
    pub version: u64,
    pub applied_ms: u64,
    pub applied_by: String,
    /// `source` parsed, on first use: runs start, match and evaluate
    /// playbooks on every incident, and parsing the TOML each time cost
    /// more than the rest of applying the entry. Derived from `source`, so
    /// never persisted (and not compared). Nothing changes a stored
    /// playbook's `file` or `source` in place: an apply that changes it
    /// stores a new one.
    #[serde(skip)]
    parsed: std::sync::OnceLock<Option<playbooks::Playbook>>,
}

impl PartialEq for StoredPlaybook {
    fn eq(&self, o: &Self) -> bool {
        (
            &self.name,
            &self.file,
            &self.source,
            self.version,
            self.applied_ms,
            &self.applied_by,
        ) == (
            &o.name,
            &o.file,
            &o.source,
            o.version,
            o.applied_ms,
            &o.applied_by,
        )
    }
}

impl Eq for StoredPlaybook {}

impl StoredPlaybook {
    pub fn new(
        name: String,
        file: String,
        source: String,
        version: u64,
        applied_ms: u64,
        applied_by: String,
    ) -> Self {
        Self {
            name,
            file,
            source,
            version,
            applied_ms,
            applied_by,
            parsed: Default::default(),
        }
    }

    /// The parsed playbook (stored sources always parse: they were
    /// validated before they were stored).
    pub fn parsed(&self) -> Option<&playbooks::Playbook> {
        self.parsed
            .get_or_init(|| playbooks::parse(&self.file, &self.source).ok())
            .as_ref()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The parsed form is a cache: not in the stored bytes, not in
    /// equality, and rebuilt from the source after a round trip.
    #[test]
    fn the_parsed_playbook_is_derived_not_stored() {
        let (file, text) = playbooks::SHIPPED[0];
        let sp = StoredPlaybook::new("p".into(), file.into(), text.into(), 3, 7, "admin".into());
        let fresh = sp.clone();
        let name = sp.parsed().expect("a shipped playbook parses").name.clone();
        assert_eq!(sp, fresh, "a parsed copy equals an unparsed one");
        let bytes = bincode::serialize(&sp).expect("encode");
        assert_eq!(bytes, bincode::serialize(&fresh).expect("encode"));
        let back: StoredPlaybook = bincode::deserialize(&bytes).expect("decode");
        assert_eq!(back, sp);
        assert_eq!(back.parsed().map(|p| p.name.clone()), Some(name));
    }
}
