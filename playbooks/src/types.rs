//! The validated playbook model. Everything here may go into a Raft log
//! entry: plain structs and externally tagged enums only, so bincode
//! round-trips every value (a test covers each variant).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Bounds the language enforces (also documented in the README).
pub mod bounds {
    use std::time::Duration;

    /// Largest playbook file accepted, in bytes.
    pub const MAX_FILE_BYTES: usize = 256 * 1024;
    /// Longest playbook name / step id / NIC / job / label text.
    pub const MAX_NAME_LEN: usize = 64;
    /// Longest description.
    pub const MAX_DESCRIPTION_LEN: usize = 1024;
    /// Longest notify message.
    pub const MAX_MESSAGE_LEN: usize = 1024;
    /// Longest webhook URL.
    pub const MAX_URL_LEN: usize = 2048;
    /// Steps per playbook.
    pub const MAX_STEPS: usize = 64;
    /// Guards per playbook.
    pub const MAX_GUARDS: usize = 16;
    /// Incident kinds per trigger.
    pub const MAX_TRIGGER_KINDS: usize = 16;
    /// Label matches per trigger.
    pub const MAX_LABELS: usize = 32;
    /// Retries per step.
    pub const MAX_RETRIES: u32 = 10;
    /// Shortest step timeout.
    pub const MIN_TIMEOUT: Duration = Duration::from_secs(1);
    /// Longest step timeout (also bounds drain deadlines and checkpoint ages).
    pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
    /// Default step timeout.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
    /// Highest priority.
    pub const MAX_PRIORITY: u32 = 10_000;
    /// Largest `max_drained_hosts`.
    pub const MAX_DRAINED_HOSTS: u32 = 100_000;
    /// Slowest and fastest reshaping rates, bits per second.
    pub const MIN_RATE_BPS: u64 = 1_000;
    pub const MAX_RATE_BPS: u64 = 10_000_000_000_000;
    /// Playbooks in one set (what the supervisor stores).
    pub const MAX_SET: usize = 256;
    /// Files one `check_files` call reads.
    pub const MAX_FILES: usize = 1024;
}

/// The incident kinds a trigger can name (the supervisor's incident kinds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IncidentKind {
    NicDown,
    NicFlapping,
    HostDown,
    ClockUnsynced,
    LinkContention,
    /// Every data NIC of a host is down while its agent still answers.
    HostCutOff,
    /// Two hosts sharing a job have no working data rail in common.
    NoCommonRail,
}

impl IncidentKind {
    pub const ALL: [IncidentKind; 7] = [
        IncidentKind::NicDown,
        IncidentKind::NicFlapping,
        IncidentKind::HostDown,
        IncidentKind::ClockUnsynced,
        IncidentKind::LinkContention,
        IncidentKind::HostCutOff,
        IncidentKind::NoCommonRail,
    ];

    /// The name used in playbooks and in the supervisor's incidents.
    pub fn as_str(self) -> &'static str {
        match self {
            IncidentKind::NicDown => "nic_down",
            IncidentKind::NicFlapping => "nic_flapping",
            IncidentKind::HostDown => "host_down",
            IncidentKind::ClockUnsynced => "clock_unsynced",
            IncidentKind::LinkContention => "link_contention",
            IncidentKind::HostCutOff => "host_cut_off",
            IncidentKind::NoCommonRail => "no_common_rail",
        }
    }

    pub fn from_name(name: &str) -> Option<IncidentKind> {
        IncidentKind::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

impl fmt::Display for IncidentKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A validated playbook.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Playbook {
    pub name: String,
    pub description: String,
    /// Higher wins when several playbooks match an incident.
    pub priority: u32,
    /// `None`: escalation-only (runs only when another playbook escalates).
    pub trigger: Option<Trigger>,
    /// All must hold before the first step runs.
    pub guards: Vec<Condition>,
    pub steps: Vec<Step>,
    /// Playbook to escalate to when a guard fails or a step fails for good.
    pub on_failure: Option<String>,
    pub limits: Limits,
}

impl Playbook {
    /// Index of the step with this id.
    pub fn step_index(&self, id: &str) -> Option<usize> {
        self.steps.iter().position(|s| s.id == id)
    }
}

/// What incidents a playbook handles. Every present matcher must match.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trigger {
    pub incidents: Vec<IncidentKind>,
    /// Host labels that must all be present with these values.
    pub labels: BTreeMap<String, String>,
    pub nic: Option<String>,
    pub rail: Option<u32>,
    pub job: Option<String>,
}

/// A condition the supervisor can evaluate from its model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Condition {
    /// Written `not <check>`.
    pub negated: bool,
    pub check: Check,
}

/// The closed set of checks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    /// The incident's host is Ready.
    HostReady,
    /// The incident's host is Drained.
    HostDrained,
    /// The incident's NIC is up (Up or Recovering).
    NicUp,
    /// The incident's NIC is Up and its flap damper says it is reusable.
    NicReusable,
    /// The incident's NIC has a backup whose link is up (Up, or
    /// Recovering: back and settling).
    BackupNicHealthy,
    /// The incident's host clock is Synced.
    ClockSynced,
    /// The incident's jobs (its job, or every job on its host) each have a
    /// complete checkpoint younger than this.
    JobCheckpointYoungerThan(Duration),
    /// The incident's jobs are all running.
    JobRunning,
    /// The incident has been closed (its condition cleared).
    IncidentCleared,
}

impl Check {
    /// Names as written in playbooks, and whether each takes a duration.
    pub const NAMES: [(&'static str, bool); 9] = [
        ("host_ready", false),
        ("host_drained", false),
        ("nic_up", false),
        ("nic_reusable", false),
        ("backup_nic_healthy", false),
        ("clock_synced", false),
        ("job_checkpoint_younger_than", true),
        ("job_running", false),
        ("incident_cleared", false),
    ];

    pub fn name(&self) -> &'static str {
        match self {
            Check::HostReady => "host_ready",
            Check::HostDrained => "host_drained",
            Check::NicUp => "nic_up",
            Check::NicReusable => "nic_reusable",
            Check::BackupNicHealthy => "backup_nic_healthy",
            Check::ClockSynced => "clock_synced",
            Check::JobCheckpointYoungerThan(_) => "job_checkpoint_younger_than",
            Check::JobRunning => "job_running",
            Check::IncidentCleared => "incident_cleared",
        }
    }
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.negated {
            f.write_str("not ")?;
        }
        f.write_str(self.check.name())?;
        if let Check::JobCheckpointYoungerThan(d) = &self.check {
            write!(f, " {}", humantime::format_duration(*d))?;
        }
        Ok(())
    }
}

/// One step of a playbook.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// Given, or `step-<n>` (1-based position).
    pub id: String,
    pub action: Action,
    /// Skip the step (continue with the following one) unless this holds.
    pub when: Option<Condition>,
    pub timeout: Duration,
    /// Extra attempts after a failure or timeout.
    pub retries: u32,
    /// Where to go after success (default: the following step).
    pub next: Option<Jump>,
    /// Where to go after failing for good (default: escalate).
    pub on_failure: Option<Jump>,
}

/// A jump target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Jump {
    /// A later step, by id.
    Step(String),
    /// Stop: the playbook is complete.
    End,
    /// Stop: the playbook failed; escalate to the playbook's `on_failure`.
    Escalate,
}

impl fmt::Display for Jump {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Jump::Step(s) => f.write_str(s),
            Jump::End => f.write_str("end"),
            Jump::Escalate => f.write_str("escalate"),
        }
    }
}

/// Where `migrate_qps` moves connections.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MigrateTarget {
    /// The incident NIC's configured backup.
    Backup,
    /// A named NIC on the same host.
    Nic(String),
}

/// The closed set of actions: the supervisor's capabilities.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Move the incident NIC's connections.
    MigrateQps { to: MigrateTarget },
    /// Move connections whose home is the incident NIC back to it.
    Failback,
    /// Reshape the traffic crossing a contended link: HTB classes per job
    /// (fair shares of `bits_per_sec`, or of the link's rate × 0.9 from
    /// the topology when absent) on every sending host, and pacing through
    /// the job contract. Undone when the incident closes.
    ///
    /// With `edge_hold`, On-Ramp-style edge holding as well: the sending
    /// agents hold a job's connections to a peer while the one-way delay
    /// to it exceeds the path's baseline by more than this.
    ReshapeRate {
        bits_per_sec: Option<u64>,
        edge_hold: Option<Duration>,
    },
    /// Checkpoint the incident's jobs.
    CheckpointJob,
    /// Restart the incident's jobs from their latest checkpoint, elsewhere
    /// if the host cannot run them.
    RestartJob,
    /// No new work on the incident's host.
    Cordon,
    /// Cordon, then move work off; stop what remains at the deadline.
    Drain { deadline: Duration },
    /// Wait (up to the step timeout) until the condition holds.
    WaitUntil { condition: Condition },
    /// Leave the host's one-way delays out of contention decisions.
    ExcludeFromOwd,
    /// Use the host's one-way delays again.
    IncludeInOwd,
    /// Log a line; also POST it to a webhook when one is given.
    Notify {
        message: String,
        webhook: Option<String>,
    },
    /// Undo this playbook's drain of the incident's host (and the cordon
    /// that came with it); an admin's drain, another playbook's, or a
    /// cordon from before the drain stays. (Appended last: runs keep their
    /// playbook in Raft, bincode.)
    ReturnToService,
}

impl Action {
    /// Action names as written in playbooks.
    pub const NAMES: [&'static str; 12] = [
        "migrate_qps",
        "failback",
        "reshape_rate",
        "checkpoint_job",
        "restart_job",
        "cordon",
        "drain",
        "return_to_service",
        "wait_until",
        "exclude_from_owd",
        "include_in_owd",
        "notify",
    ];

    pub fn name(&self) -> &'static str {
        match self {
            Action::MigrateQps { .. } => "migrate_qps",
            Action::Failback => "failback",
            Action::ReshapeRate { .. } => "reshape_rate",
            Action::CheckpointJob => "checkpoint_job",
            Action::RestartJob => "restart_job",
            Action::Cordon => "cordon",
            Action::Drain { .. } => "drain",
            Action::ReturnToService => "return_to_service",
            Action::WaitUntil { .. } => "wait_until",
            Action::ExcludeFromOwd => "exclude_from_owd",
            Action::IncludeInOwd => "include_in_owd",
            Action::Notify { .. } => "notify",
        }
    }
}

/// Cluster-wide safety limits for this playbook's `drain` steps: a drain
/// runs only if afterwards no more than `max_drained_hosts` hosts, and no
/// more than `max_drained_percent` % of hosts (rounded up to whole hosts),
/// are Draining or Drained.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub max_drained_hosts: u32,
    pub max_drained_percent: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_drained_hosts: 1,
            max_drained_percent: 10,
        }
    }
}

impl Limits {
    /// How many hosts may be Draining or Drained at once in a cluster of
    /// `total` hosts.
    pub fn allowed_drained(&self, total: usize) -> u64 {
        let total = total as u64;
        let by_percent = (total * u64::from(self.max_drained_percent)).div_ceil(100);
        by_percent.min(u64::from(self.max_drained_hosts))
    }
}

/// An incident kind equals its name (`IncidentKind::NicDown == "nic_down"`).
impl PartialEq<&str> for IncidentKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}
