//! Hosts and their NICs: liveness, drain, cordon, clock state, and the
//! pure checks for NIC failover and failback; a NIC takes its agent's
//! reports and returns what the other areas must do ([`NicTransition`]).

use crate::model::incidents::IncidentKind;
use crate::model::result::{not_found, CmdError};
use proto::agent::{NicHealth, NicReport};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// A NIC as an agent reports it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NicSpec {
    pub name: String,
    pub rail: Option<u32>,
    pub backup: Option<String>,
    pub rdma_device: Option<String>,
    /// The NIC's IP address, where its probe socket listens (validated: it
    /// must parse as an IP address).
    pub addr: Option<String>,
}

impl NicSpec {
    /// A NIC called `name` and nothing more: no rail, backup, RDMA device
    /// or probe address (the methods below add them).
    pub fn named(name: impl Into<String>) -> NicSpec {
        NicSpec {
            name: name.into(),
            rail: None,
            backup: None,
            rdma_device: None,
            addr: None,
        }
    }

    /// The same NIC on data rail `rail`.
    pub fn on_rail(self, rail: u32) -> NicSpec {
        NicSpec {
            rail: Some(rail),
            ..self
        }
    }

    /// The same NIC with its probe socket at `addr`.
    pub fn at(self, addr: impl Into<String>) -> NicSpec {
        NicSpec {
            addr: Some(addr.into()),
            ..self
        }
    }

    /// The same NIC with `backup` as its failover target.
    pub fn backed_by(self, backup: impl Into<String>) -> NicSpec {
        NicSpec {
            backup: Some(backup.into()),
            ..self
        }
    }
}

/// A host's clock synchronisation state as the leader's clock service last
/// committed it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum ClockState {
    /// Error bound within the synced threshold (1 µs by default).
    Synced,
    /// Error bound within the degraded threshold (100 µs by default).
    Degraded,
    /// Worse, not connected to the reference, or no fresh probes.
    #[default]
    Unsynced,
}

/// The committed clock state of a host and the figures at its last change.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct HostClockRecord {
    pub state: ClockState,
    /// Offset to the reference host when the state changed (ns).
    pub offset_ns: Option<f64>,
    /// Error bound of that offset (ns).
    pub error_bound_ns: Option<f64>,
    /// Leader time of the change (Unix ms; 0: never changed).
    pub changed_ms: u64,
}

/// One host's new clock state, as the clock service commits it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ClockChange {
    pub host: String,
    pub state: ClockState,
    /// Offset to the reference host (ns), finite when present.
    pub offset_ns: Option<f64>,
    /// Its error bound (ns), finite and ≥ 0 when present.
    pub error_bound_ns: Option<f64>,
}

/// NIC health as the agent's link tracker classifies it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum NicState {
    /// No report yet.
    #[default]
    Unknown,
    Up,
    Down,
    /// Suppressed by flap damping.
    Flapping,
    /// Up again but not yet reusable.
    Recovering,
    /// Up, but the probe mesh sees it lose packets (a gray link): out of
    /// service for connections, detoured, until the loss ends.
    Degraded,
}

/// Host liveness as the leader's detector last committed it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Liveness {
    #[default]
    Ready,
    Suspect,
    Down,
}

/// Drain progress.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum DrainPhase {
    Draining,
    Drained,
}

/// An ongoing or finished drain.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Drain {
    pub phase: DrainPhase,
    pub reason: String,
    pub deadline_ms: Option<u64>,
    pub by: String,
    pub since_ms: u64,
    /// The host was cordoned before the drain began (undoing the drain
    /// leaves that cordon).
    #[serde(default)]
    pub cordoned_before: bool,
}

/// The status shown to admins, derived from liveness, drain and cordon.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum HostStatus {
    Ready,
    Cordoned,
    Draining,
    Drained,
    Down,
}

impl std::fmt::Display for HostStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            HostStatus::Ready => "Ready",
            HostStatus::Cordoned => "Cordoned",
            HostStatus::Draining => "Draining",
            HostStatus::Drained => "Drained",
            HostStatus::Down => "Down",
        };
        f.write_str(s)
    }
}

/// A GPU host.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Host {
    pub name: String,
    /// Stable numeric id, given at first registration and never reused
    /// (the probe graph's and the clock solve's host id).
    pub id: u32,
    pub labels: BTreeMap<String, String>,
    pub nics: BTreeMap<String, Nic>,
    pub cordoned: bool,
    pub drain: Option<Drain>,
    pub liveness: Liveness,
    pub registered_ms: u64,
    /// Last agent event sequence applied for this host (exactly-once).
    pub last_event_seq: u64,
    /// The open `host_down` incident, if any.
    pub open_incident: Option<u64>,
    /// Clock synchronisation state (changes committed by the leader).
    pub clock: HostClockRecord,
    /// Left out of OWD-based (contention) decisions by a playbook's
    /// `exclude_from_owd` until an `include_in_owd`.
    pub owd_excluded: bool,
    /// The open `clock_unsynced` incident, if any.
    pub clock_incident: Option<u64>,
    /// The Raft log index at which the set of this host's NICs held out of
    /// service last changed (the agent keeps the newest set it hears).
    pub held_version: u64,
    /// The open `host_cut_off` incident, if any.
    pub cut_off_incident: Option<u64>,
    /// The open `no_common_rail` incidents naming this host, as its host
    /// or its peer (at most `MAX_PATH_INCIDENTS_PER_HOST`): an index, so
    /// every NIC transition looks at a handful of ids, not at the
    /// incident table.
    pub path_incidents: BTreeSet<u64>,
}

impl Host {
    /// Cut off: the host has data NICs and every one of them is Down or
    /// Flapping (known unusable; a NIC not yet reported does not count as
    /// down). Its ranks can reach no peer: it gets no new ranks, and its
    /// `host_cut_off` incident moves its jobs.
    pub fn cut_off(&self) -> bool {
        let mut data = self.nics.values().filter(|n| n.rail.is_some()).peekable();
        data.peek().is_some()
            && data.all(|n| matches!(n.state, NicState::Down | NicState::Flapping))
    }

    /// Reachable again after being cut off: a data NIC is Up (a NIC back
    /// but still settling or damped does not end it, so a host whose rails
    /// flap does not open an incident per flap).
    pub fn reconnected(&self) -> bool {
        self.nics
            .values()
            .any(|n| n.rail.is_some() && n.state == NicState::Up)
    }

    /// The NICs an admin holds out of service for connections.
    pub fn held_out_nics(&self) -> Vec<String> {
        self.nics
            .values()
            .filter(|n| n.held_out.is_some())
            .map(|n| n.name.clone())
            .collect()
    }

    /// The admin-facing status.
    pub fn status(&self) -> HostStatus {
        match (&self.liveness, &self.drain) {
            (Liveness::Down, _) => HostStatus::Down,
            (_, Some(d)) if d.phase == DrainPhase::Drained => HostStatus::Drained,
            (_, Some(_)) => HostStatus::Draining,
            _ if self.cordoned => HostStatus::Cordoned,
            _ => HostStatus::Ready,
        }
    }
}

/// A NIC of a host.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Nic {
    pub name: String,
    pub rail: Option<u32>,
    pub backup: Option<String>,
    pub rdma_device: Option<String>,
    /// IP address of the NIC's probe socket.
    pub addr: Option<String>,
    pub state: NicState,
    pub flaps: u32,
    pub damping_penalty: f64,
    pub carrier_changes: u64,
    pub last_change_ms: u64,
    /// Open incidents of this NIC by kind (index into `incidents`).
    pub open_incidents: BTreeMap<IncidentKind, u64>,
    /// The link's last reported up/down (None before the first report).
    pub link_up: Option<bool>,
    /// How many link up/down changes were committed.
    pub link_transitions: u64,
    /// Held out of service for connections by an admin's failover, until
    /// an admin's failback (automatic failback leaves it alone).
    pub held_out: Option<HeldOut>,
}

/// An admin's hold of a NIC out of service (`railguard nic failover`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HeldOut {
    /// Who failed it over (from their certificate).
    pub by: String,
    pub since_ms: u64,
}

impl From<NicHealth> for NicState {
    fn from(h: NicHealth) -> NicState {
        match h {
            NicHealth::Up => NicState::Up,
            NicHealth::Down => NicState::Down,
            NicHealth::Flapping => NicState::Flapping,
            NicHealth::Recovering => NicState::Recovering,
            NicHealth::Degraded => NicState::Degraded,
        }
    }
}

/// What one report did to a NIC, for the other areas to act on: the
/// transition to log, the NIC's incidents to close and the kind to open.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NicTransition {
    pub from: NicState,
    pub to: NicState,
    /// The link itself went up or down.
    pub link_changed: bool,
    /// Incidents the recovery closes (taken off the NIC).
    pub close: BTreeMap<IncidentKind, u64>,
    /// An incident kind to open (the NIC has none of it open).
    pub open: Option<IncidentKind>,
}

impl Nic {
    /// Takes an agent's report into this NIC alone; what the other areas
    /// must do about it comes back as a [`NicTransition`]. A recovery to
    /// `Up` takes the NIC's open incidents (to close); a change to `Down`
    /// or `Flapping` asks for an incident of that kind unless one is open.
    pub(crate) fn apply_report(&mut self, at_ms: u64, r: &NicReport) -> NicTransition {
        let from = self.state;
        let to = NicState::from(r.health);
        let link_changed = self.link_up != Some(r.link_up);
        if link_changed {
            self.link_up = Some(r.link_up);
            self.link_transitions += 1;
        }
        self.state = to;
        self.carrier_changes = r.carrier_changes;
        self.flaps = r.flaps;
        self.damping_penalty = r.penalty;
        let changed = from != to;
        if changed {
            self.last_change_ms = at_ms;
        }
        let close = if changed && to == NicState::Up {
            std::mem::take(&mut self.open_incidents)
        } else {
            BTreeMap::new()
        };
        let open = match to {
            NicState::Down => Some(IncidentKind::NicDown),
            NicState::Flapping => Some(IncidentKind::NicFlapping),
            _ => None,
        }
        .filter(|k| changed && !self.open_incidents.contains_key(k));
        NicTransition {
            from,
            to,
            link_changed,
            close,
            open,
        }
    }
}

/// The NIC a failover of `host`/`nic` moves to: `to`, else the NIC's
/// backup. Refuses an unknown NIC, a target that is the NIC itself or not a
/// NIC of the host, a NIC without backup (and no `to`), and a target that
/// is down.
pub(crate) fn failover_target(
    host: &Host,
    nic: &str,
    to: Option<&str>,
) -> Result<String, CmdError> {
    let n = host
        .nics
        .get(nic)
        .ok_or_else(|| not_found("NIC", &format!("{}/{nic}", host.name)))?;
    let target = match to {
        Some(t) if t == nic => {
            return Err(CmdError::InvalidArgument(format!(
                "--to {t:?} is the NIC being failed over"
            )))
        }
        Some(t) if !host.nics.contains_key(t) => {
            return Err(CmdError::InvalidArgument(format!(
                "--to {t:?} is not a NIC of host {:?}",
                host.name
            )))
        }
        Some(t) => t.to_owned(),
        None => n.backup.clone().ok_or_else(|| {
            CmdError::FailedPrecondition(format!(
                "NIC {}/{nic} has no backup configured; pass --to NIC",
                host.name
            ))
        })?,
    };
    match host.nics.get(&target).map(|t| (t.state, &t.held_out)) {
        Some((s @ (NicState::Down | NicState::Flapping), _)) => Err(CmdError::FailedPrecondition(
            format!("target NIC {}/{target} is {s:?}", host.name),
        )),
        Some((_, Some(h))) => Err(CmdError::FailedPrecondition(format!(
            "target NIC {}/{target} is held out of service (failed over by {}); \
             `railguard nic failback {} {target}` returns it",
            host.name, h.by, host.name
        ))),
        Some(_) => Ok(target),
        None => Err(not_found("NIC", &format!("{}/{target}", host.name))),
    }
}

/// Refuses a failback to an unknown NIC or one that is down.
pub(crate) fn check_failback(host: &Host, nic: &str) -> Result<(), CmdError> {
    let n = host
        .nics
        .get(nic)
        .ok_or_else(|| not_found("NIC", &format!("{}/{nic}", host.name)))?;
    if matches!(n.state, NicState::Down | NicState::Flapping) {
        return Err(CmdError::FailedPrecondition(format!(
            "NIC {}/{nic} is {:?}; fail back once it is up",
            host.name, n.state
        )));
    }
    Ok(())
}

/// What of a host its probe peers see: NIC names, rails and addresses.
pub(in crate::model) fn probe_view(h: &Host) -> Vec<(&str, Option<u32>, Option<&str>)> {
    h.nics
        .values()
        .map(|n| (n.name.as_str(), n.rail, n.addr.as_deref()))
        .collect()
}
