//! Matching incidents to playbooks and dry-run planning, against small
//! views of the cluster the supervisor fills from its model. Pure.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::types::{Action, Check, Condition, Jump, MigrateTarget, Playbook};

/// The incident a playbook would handle.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncidentView {
    /// The supervisor's incident kind, e.g. "nic_down".
    pub kind: String,
    pub host: String,
    pub nic: Option<String>,
    pub rail: Option<u32>,
    pub job: Option<String>,
    /// The other host of a path incident (`no_common_rail`).
    #[serde(default)]
    pub peer: Option<String>,
    /// The host's labels.
    pub labels: BTreeMap<String, String>,
    /// The incident is closed (its condition cleared).
    pub closed: bool,
}

/// Host status, as in the supervisor's model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostStatus {
    #[default]
    Ready,
    Cordoned,
    Draining,
    Drained,
    Down,
}

/// NIC state, as in the supervisor's model (flap damping included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NicHealth {
    #[default]
    Unknown,
    Up,
    Down,
    /// Suppressed by flap damping.
    Flapping,
    /// Up, not yet reusable.
    Recovering,
    /// Up, but losing packets (probe evidence): out of service.
    Degraded,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NicView {
    pub health: NicHealth,
    pub rail: Option<u32>,
    pub backup: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostView {
    pub status: HostStatus,
    pub clock_synced: bool,
    pub nics: BTreeMap<String, NicView>,
    /// Jobs with ranks on this host.
    pub jobs: BTreeSet<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobView {
    pub running: bool,
    /// Age of the latest complete checkpoint; `None`: no checkpoint.
    pub checkpoint_age: Option<Duration>,
}

/// What planning needs from the supervisor's model.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterView {
    pub hosts: BTreeMap<String, HostView>,
    pub jobs: BTreeMap<String, JobView>,
}

impl ClusterView {
    /// Hosts Draining or Drained.
    pub fn drained_count(&self) -> usize {
        self.hosts
            .values()
            .filter(|h| matches!(h.status, HostStatus::Draining | HostStatus::Drained))
            .count()
    }
}

/// Does the playbook's trigger match the incident?
pub fn trigger_matches(pb: &Playbook, incident: &IncidentView) -> bool {
    let Some(t) = &pb.trigger else {
        return false;
    };
    t.incidents.iter().any(|k| k.as_str() == incident.kind)
        && t.labels
            .iter()
            .all(|(k, v)| incident.labels.get(k) == Some(v))
        && t.nic
            .as_ref()
            .is_none_or(|n| incident.nic.as_ref() == Some(n))
        && t.rail.is_none_or(|r| incident.rail == Some(r))
        && t.job
            .as_ref()
            .is_none_or(|j| incident.job.as_ref() == Some(j))
}

/// The playbook to run for an incident: among those whose trigger matches,
/// the highest priority; ties go to the smallest name.
pub fn matching<'a>(
    set: impl IntoIterator<Item = &'a Playbook>,
    incident: &IncidentView,
) -> Option<&'a Playbook> {
    set.into_iter()
        .filter(|p| trigger_matches(p, incident))
        .min_by(|a, b| {
            b.priority
                .cmp(&a.priority)
                .then_with(|| a.name.cmp(&b.name))
        })
}

/// A condition's value now, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConditionCheck {
    pub condition: Condition,
    pub holds: bool,
    pub reason: String,
}

/// The jobs an incident concerns: its job, else every job on its host (a
/// path incident: every job on both of its hosts).
pub fn incident_jobs(incident: &IncidentView, view: &ClusterView) -> Vec<String> {
    match &incident.job {
        Some(j) => vec![j.clone()],
        None => {
            let jobs_of = |h: &str| view.hosts.get(h).map(|h| &h.jobs);
            let Some(mine) = jobs_of(&incident.host) else {
                return Vec::new();
            };
            match &incident.peer {
                // A path incident: the jobs the two hosts share.
                Some(p) => mine
                    .iter()
                    .filter(|j| jobs_of(p).is_some_and(|theirs| theirs.contains(*j)))
                    .cloned()
                    .collect(),
                None => mine.iter().cloned().collect(),
            }
        }
    }
}

/// Evaluates a condition against the views.
pub fn evaluate(cond: &Condition, incident: &IncidentView, view: &ClusterView) -> ConditionCheck {
    let (raw, reason) = evaluate_check(&cond.check, incident, view);
    ConditionCheck {
        condition: cond.clone(),
        holds: raw != cond.negated,
        reason,
    }
}

/// Reads only the incident's host (its status, clock and NICs) and the
/// jobs of the incident's host and peer: the supervisor evaluates waiting
/// steps against a view of just those hosts (`playbook_view_around`), so a
/// check that reads other hosts needs that view widened.
fn evaluate_check(check: &Check, inc: &IncidentView, view: &ClusterView) -> (bool, String) {
    let host = view.hosts.get(&inc.host);
    let nic = || -> Result<(&String, &NicView), String> {
        let name = inc.nic.as_ref().ok_or("the incident names no NIC")?;
        let n = host
            .and_then(|h| h.nics.get(name))
            .ok_or_else(|| format!("NIC {} of {} is unknown", name, inc.host))?;
        Ok((name, n))
    };
    match check {
        Check::HostReady | Check::HostDrained => match host {
            None => (false, format!("host {} is unknown", inc.host)),
            Some(h) => {
                let want = if *check == Check::HostReady {
                    HostStatus::Ready
                } else {
                    HostStatus::Drained
                };
                (
                    h.status == want,
                    format!("host {} is {:?}", inc.host, h.status),
                )
            }
        },
        Check::NicUp | Check::NicReusable => match nic() {
            Err(why) => (false, why),
            Ok((name, n)) => {
                let ok = match check {
                    Check::NicUp => matches!(
                        n.health,
                        NicHealth::Up | NicHealth::Recovering | NicHealth::Degraded
                    ),
                    _ => n.health == NicHealth::Up,
                };
                (ok, format!("{name} is {:?}", n.health))
            }
        },
        Check::BackupNicHealthy => match nic() {
            Err(why) => (false, why),
            Ok((name, n)) => match &n.backup {
                None => (false, format!("{name} has no backup")),
                Some(b) => match host.and_then(|h| h.nics.get(b)) {
                    None => (false, format!("backup {b} of {name} is unknown")),
                    // Recovering is a link back up and settling: a better
                    // home for the connections than a dead NIC (their
                    // transport leaves it if it fails again); waiting for
                    // Up would drain a host whose backup returns in 500 ms.
                    Some(bn) => (
                        matches!(bn.health, NicHealth::Up | NicHealth::Recovering),
                        format!("backup {b} is {:?}", bn.health),
                    ),
                },
            },
        },
        Check::ClockSynced => match host {
            None => (false, format!("host {} is unknown", inc.host)),
            Some(h) => (
                h.clock_synced,
                format!(
                    "clock of {} is {}",
                    inc.host,
                    if h.clock_synced {
                        "synced"
                    } else {
                        "not synced"
                    }
                ),
            ),
        },
        Check::JobCheckpointYoungerThan(max) => {
            let jobs = incident_jobs(inc, view);
            if jobs.is_empty() {
                return (false, "no job concerned".into());
            }
            for j in &jobs {
                match view.jobs.get(j).and_then(|v| v.checkpoint_age) {
                    None => return (false, format!("job {j} has no checkpoint")),
                    Some(age) if age >= *max => {
                        return (
                            false,
                            format!(
                                "job {j}'s checkpoint is {} old",
                                humantime::format_duration(age)
                            ),
                        )
                    }
                    Some(_) => {}
                }
            }
            (true, format!("{} job(s) checkpointed recently", jobs.len()))
        }
        Check::JobRunning => {
            let jobs = incident_jobs(inc, view);
            if jobs.is_empty() {
                return (false, "no job concerned".into());
            }
            match jobs
                .iter()
                .find(|j| !view.jobs.get(*j).is_some_and(|v| v.running))
            {
                Some(j) => (false, format!("job {j} is not running")),
                None => (true, format!("{} job(s) running", jobs.len())),
            }
        }
        Check::IncidentCleared => (
            inc.closed,
            if inc.closed {
                "incident closed"
            } else {
                "incident open"
            }
            .into(),
        ),
    }
}

/// What one step would do.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlannedStep {
    pub id: String,
    pub action: Action,
    /// What it acts on, e.g. "host h1: eth1 -> eth2".
    pub target: String,
    /// The step's `when`, evaluated now (`None`: no `when`).
    pub when: Option<ConditionCheck>,
    /// Runs now (its `when` holds, or it has none).
    pub runs: bool,
    /// Why it would fail or be refused now (a safety limit, no backup …).
    pub blocked: Option<String>,
    pub timeout: Duration,
    pub retries: u32,
    /// Where a failure goes.
    pub on_failure: Jump,
}

/// A dry run: which steps would run, on what, assuming each succeeds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub playbook: String,
    pub guards: Vec<ConditionCheck>,
    /// Every guard holds.
    pub starts: bool,
    /// Where a failure (guard or step) escalates.
    pub escalates_to: Option<String>,
    /// The success path from the first step (skipped steps included).
    pub steps: Vec<PlannedStep>,
}

/// Plans the playbook for the incident. Never panics, whatever the playbook
/// (jumps to missing or earlier steps end the walk).
pub fn plan(pb: &Playbook, incident: &IncidentView, view: &ClusterView) -> Plan {
    let guards: Vec<ConditionCheck> = pb
        .guards
        .iter()
        .map(|g| evaluate(g, incident, view))
        .collect();
    let starts = guards.iter().all(|g| g.holds);
    let mut steps = Vec::new();
    let mut i = 0usize;
    while let Some(step) = pb.steps.get(i) {
        if steps.len() >= pb.steps.len() {
            break; // bounded even for hand-made playbooks with loops
        }
        let when = step.when.as_ref().map(|w| evaluate(w, incident, view));
        let runs = when.as_ref().is_none_or(|w| w.holds);
        let (target, blocked) = describe(pb, &step.action, incident, view);
        steps.push(PlannedStep {
            id: step.id.clone(),
            action: step.action.clone(),
            target,
            when,
            runs,
            blocked: if runs { blocked } else { None },
            timeout: step.timeout,
            retries: step.retries,
            on_failure: step.on_failure.clone().unwrap_or(Jump::Escalate),
        });
        i = match (runs, &step.next) {
            (false, _) | (true, None) => i + 1,
            (true, Some(Jump::Step(id))) => match pb.step_index(id) {
                Some(j) if j > i => j,
                _ => break,
            },
            (true, Some(_)) => break,
        };
    }
    Plan {
        playbook: pb.name.clone(),
        guards,
        starts,
        escalates_to: pb.on_failure.clone(),
        steps,
    }
}

fn describe(
    pb: &Playbook,
    action: &Action,
    inc: &IncidentView,
    view: &ClusterView,
) -> (String, Option<String>) {
    let host = &inc.host;
    let host_view = view.hosts.get(host);
    let nic = inc.nic.as_deref();
    let jobs = || {
        let j = incident_jobs(inc, view);
        if j.is_empty() {
            "no jobs".to_string()
        } else {
            j.join(", ")
        }
    };
    let no_nic = || Some("the incident names no NIC".to_string());
    match action {
        Action::MigrateQps { to } => {
            let Some(nic) = nic else {
                return (format!("host {host}"), no_nic());
            };
            let dest = match to {
                MigrateTarget::Nic(n) => Some(n.clone()),
                MigrateTarget::Backup => host_view
                    .and_then(|h| h.nics.get(nic))
                    .and_then(|n| n.backup.clone()),
            };
            match dest {
                None => (
                    format!("host {host}: {nic} -> (no backup)"),
                    Some(format!("{nic} has no backup")),
                ),
                Some(d) => {
                    let health = host_view.and_then(|h| h.nics.get(&d)).map(|n| n.health);
                    let blocked = match health {
                        Some(NicHealth::Up) => None,
                        Some(h) => Some(format!("{d} is {h:?}")),
                        None => Some(format!("{d} is not a NIC of {host}")),
                    };
                    (format!("host {host}: {nic} -> {d}"), blocked)
                }
            }
        }
        Action::Failback => match nic {
            Some(n) => (format!("host {host}: connections back to {n}"), None),
            None => (format!("host {host}"), no_nic()),
        },
        Action::ReshapeRate {
            bits_per_sec,
            edge_hold,
        } => {
            let what = match (&inc.job, nic) {
                (Some(j), _) => format!("job {j}"),
                (None, Some(n)) => format!("NIC {n}"),
                (None, None) => "all traffic".into(),
            };
            let rate = match bits_per_sec {
                Some(b) => format!("fair shares of {b} bit/s"),
                None => "fair shares of the link's rate × 0.95".into(),
            };
            let hold = match edge_hold {
                Some(d) => format!(
                    ", edge hold above {} of queueing",
                    humantime::format_duration(*d)
                ),
                None => String::new(),
            };
            (format!("host {host}: {what}, {rate}{hold}"), None)
        }
        Action::CheckpointJob => (format!("host {host}: checkpoint {}", jobs()), None),
        Action::RestartJob => (format!("restart {} (from host {host})", jobs()), None),
        Action::Cordon => (format!("cordon host {host}"), None),
        Action::ReturnToService => (
            format!("host {host} back in service if a playbook drained it"),
            None,
        ),
        Action::Drain { deadline } => {
            let total = view.hosts.len();
            let already = host_view
                .is_some_and(|h| matches!(h.status, HostStatus::Draining | HostStatus::Drained));
            let after = view.drained_count() + usize::from(!already);
            let allowed = pb.limits.allowed_drained(total);
            let blocked = (after as u64 > allowed).then(|| {
                format!(
                    "would make {after} of {total} hosts drained; limits allow {allowed} \
                     (max_drained_hosts = {}, max_drained_percent = {})",
                    pb.limits.max_drained_hosts, pb.limits.max_drained_percent
                )
            });
            (
                format!(
                    "drain host {host} (deadline {})",
                    humantime::format_duration(*deadline)
                ),
                blocked,
            )
        }
        Action::WaitUntil { condition } => (format!("wait until {condition}"), None),
        Action::ExcludeFromOwd => (format!("exclude host {host} from OWD decisions"), None),
        Action::IncludeInOwd => (format!("use host {host} in OWD decisions again"), None),
        Action::Notify { message, webhook } => {
            let text = render_message(message, pb, inc);
            match webhook {
                Some(w) => (format!("log and POST to {w}: {text}"), None),
                None => (format!("log: {text}"), None),
            }
        }
    }
}

/// Fills a notify message's placeholders.
pub fn render_message(message: &str, pb: &Playbook, inc: &IncidentView) -> String {
    let rail = inc
        .rail
        .map(|r| r.to_string())
        .unwrap_or_else(|| "-".into());
    message
        .replace("{host}", &inc.host)
        .replace("{nic}", inc.nic.as_deref().unwrap_or("-"))
        .replace("{rail}", &rail)
        .replace("{job}", inc.job.as_deref().unwrap_or("-"))
        .replace("{peer}", inc.peer.as_deref().unwrap_or("-"))
        .replace("{kind}", &inc.kind)
        .replace("{incident}", &format!("{} on {}", inc.kind, inc.host))
        .replace("{playbook}", &pb.name)
}
