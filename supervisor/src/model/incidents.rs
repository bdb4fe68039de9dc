//! Incidents: things that went wrong and may need remediation.

pub use playbooks::IncidentKind;
use serde::{Deserialize, Serialize};

/// Something that went wrong and may need remediation.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Incident {
    pub id: u64,
    pub kind: IncidentKind,
    pub host: String,
    pub nic: Option<String>,
    pub opened_ms: u64,
    pub closed_ms: Option<u64>,
    pub detail: String,
    /// The incident's latest playbook run (none: never had one).
    pub run: Option<u64>,
    /// A `link_contention` incident's link, sides and evidence.
    pub link: Option<crate::model::shaping::LinkContention>,
    /// The other host of a path incident (`no_common_rail`; `host` is the
    /// first of the two by name).
    pub peer: Option<String>,
    /// A path incident opened on the ranks' evidence (a connection of this
    /// job with no path) rather than on NIC states: it closes when its run
    /// ends or the job's incarnation ends, or when the pair comes to share
    /// an Up rail it did not share at the report — not merely because NIC
    /// states look healthy (they may have all along).
    pub stalled_job: Option<String>,
    /// The rails both hosts of such a pair had Up when the ranks reported.
    pub shared_at_report: Vec<u32>,
}
