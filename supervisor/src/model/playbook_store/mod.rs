//! Playbooks in the replicated model: their source text, versions, and the
//! views of the cluster that planning reads.
//!
//! A playbook is stored as the TOML text it was applied from; the parsed
//! form is derived (parsing is pure and deterministic), so what is in Raft
//! is exactly what the admin wrote. `playbook apply` is atomic: the new
//! files together with every stored playbook they do not replace must form
//! a valid set (`playbooks::check_sources`), or nothing is stored. Deleting
//! a playbook another one escalates to is refused.

pub(crate) mod apply;
pub(crate) mod types;

pub use types::{
    shipped_files, PlanIncident, PlaybookFile, PlaybookTable, StoredPlaybook, MAX_APPLY_FILES,
    MAX_PLAYBOOKS, MAX_PLAYBOOK_BYTES, SHIPPED_ACTOR,
};
