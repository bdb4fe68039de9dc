//! Link contention and reshaping in the replicated model (DESIGN.md flow 4).
//!
//! The leader's detector ([`crate::contention`]) commits a
//! `link_contention` incident naming a directed link, the host NICs on
//! each side of it (from the topology, so every replica decides the same
//! without reading the file) and the link's rate. A playbook's
//! `reshape_rate` step then computes a **plan** in apply: for every host
//! NIC sending across the link, HTB classes with filters for each job's
//! flows that cross it and one class for everything else crossing it:
//! the jobs split the usable rate fairly after [`OTHER_SHARE`] of it is
//! set aside for the rest (split between the sending hosts), and every
//! class's ceiling is its rate, so the sum never exceeds the usable rate
//! and the link's queue stays empty.
//! The plan is the **desired** shaping (`ClusterState::shapes`); the
//! reconciler orders each agent to install it (`ShapeNic`) and records
//! what each confirmed (`applied_shapes`). When the incident closes, its
//! desired shapes go and the reconciler orders `ClearShape` wherever
//! something was applied: nothing stays behind on a NIC.
//!
//! Idempotent by construction: wanted actions are the difference between
//! desired and applied versions, and an open intent for the same action
//! is never doubled. A shape an agent refuses is retried at most
//! [`MAX_SHAPE_FAILURES`] times.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::model::{Action, ClusterState, Incident, JobState, Liveness, Outcome};
use crate::topology::DirLink;

/// Share of a link's rate the plan hands out when the step names none
/// (the rest keeps the queue empty).
pub const DEFAULT_HEADROOM: f64 = 0.95;
/// Share of the usable rate left to traffic that is not a job's (bulk
/// copies, anything unknown) when jobs cross the link; the jobs split the
/// rest fairly. Deliberately small: the training jobs are what the
/// cluster is for (MLTCP/CASSINI-style unfairness in their favour).
/// Without jobs crossing, the rest gets it all.
pub const OTHER_SHARE: f64 = 0.05;
/// An agent's refusals of one desired shape before the reconciler stops
/// asking (the shape stays desired and shown; an admin can clear it).
pub const MAX_SHAPE_FAILURES: u32 = 3;
/// Rate of the default (unmatched) class when the topology gives the NIC's
/// cable no rate.
pub const DEFAULT_NIC_RATE_BPS: u64 = 10_000_000_000;
/// Smallest class rate a plan hands out.
pub const MIN_CLASS_BPS: u64 = 1_000_000;
/// Most host NICs on one side of a link an incident records.
pub const MAX_SIDE_NICS: usize = 1024;
/// Most contended paths an incident names.
pub const MAX_INCIDENT_PATHS: usize = 64;

/// A host's NIC.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct HostNic {
    pub host: String,
    pub nic: String,
}

/// What a `link_contention` incident knows about its link (committed with
/// it: the topology itself is not replicated).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkContention {
    pub link: DirLink,
    pub rate_bps: Option<u64>,
    /// Host NICs on the `from` side: they send across.
    pub senders: Vec<HostNic>,
    /// Host NICs on the `to` side.
    pub receivers: Vec<HostNic>,
    /// The contended paths when it opened, `src/nic→dst/nic`.
    pub paths: Vec<String>,
    /// Their worst queueing delay p99 then (µs).
    pub queueing_p99_us: f64,
}

/// The leader's contention decisions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ContentionCommand {
    /// Open a `link_contention` incident (no-op while one is open for the
    /// same directed link). `host` anchors it (the worst path's sender).
    Open { host: String, info: LinkContention },
    /// Close it: the link has been quiet long enough.
    Close { incident: u64, why: String },
}

/// One flow match of a class (0 = any for ports; protocol 0 = no port).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FlowSpec {
    pub dst: Ipv4Addr,
    pub protocol: u8,
    pub dst_port: u16,
    pub src_port: u16,
}

/// One HTB class of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassSpec {
    pub minor: u16,
    /// `job NAME` or `other`.
    pub label: String,
    pub rate_bps: u64,
    pub ceil_bps: u64,
    pub flows: Vec<FlowSpec>,
}

/// The desired shaping of one host NIC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NicShape {
    pub incident: u64,
    /// Unique per desired shape (bumped on every change).
    pub version: u64,
    /// The directed link it relieves (display).
    pub link: String,
    pub classes: Vec<ClassSpec>,
    pub default_rate_bps: u64,
    /// Per-connection pacing of each job's ranks on the host (bits/s).
    pub pace: BTreeMap<String, u64>,
    /// On-Ramp-style edge holding: the agent holds a job's connections to
    /// a peer while the one-way delay to it exceeds the path's baseline by
    /// more than this (µs); none = off.
    #[serde(default)]
    pub hold_queueing_us: Option<u32>,
    /// Refusals of this version so far.
    pub failures: u32,
}

/// A plan before it is versioned: host → (nic, shape).
pub type Plan = BTreeMap<String, (String, NicShape)>;

fn nic_addr(st: &ClusterState, hn: &HostNic) -> Option<Ipv4Addr> {
    st.hosts
        .get(&hn.host)?
        .nics
        .get(&hn.nic)?
        .addr
        .as_deref()?
        .parse()
        .ok()
}

/// Computes the reshaping plan for a contention incident (deterministic:
/// runs in apply). `usable_bps`: the step's rate, else the link's rate ×
/// [`DEFAULT_HEADROOM`].
pub fn plan(
    st: &ClusterState,
    inc: &Incident,
    step_rate: Option<u64>,
    edge_hold_us: Option<u32>,
) -> Result<Plan, String> {
    let Some(info) = &inc.link else {
        return Err(format!(
            "incident {} ({}) names no link: reshape_rate needs a link_contention incident",
            inc.id, inc.kind
        ));
    };
    let usable = match (step_rate, info.rate_bps) {
        (Some(r), _) => r,
        (None, Some(r)) => (r as f64 * DEFAULT_HEADROOM) as u64,
        (None, None) => {
            return Err(format!(
                "link {} has no rate in the topology and the step gives none (rate = \"…\")",
                info.link
            ))
        }
    };
    let senders: BTreeSet<&HostNic> = info.senders.iter().collect();
    let receivers: BTreeSet<&HostNic> = info.receivers.iter().collect();
    let side_of = |host: &str, set: &BTreeSet<&HostNic>| -> Option<HostNic> {
        set.iter().find(|h| h.host == host).map(|h| (*h).clone())
    };
    // Jobs with a ring hop from the sending side to the receiving side:
    // rank r sends to rank r+1 (the ring's direction).
    let mut job_hops: BTreeMap<&str, Vec<(HostNic, HostNic, u16)>> = BTreeMap::new();
    for j in st.jobs.values() {
        if !matches!(j.state, JobState::Running | JobState::Checkpointing) {
            continue;
        }
        let n = j.placement.len();
        if n < 2 {
            continue;
        }
        for r in 0..n {
            let (a, b) = (&j.placement[r], &j.placement[(r + 1) % n]);
            if let (Some(s), Some(d)) = (side_of(a, &senders), side_of(b, &receivers)) {
                job_hops.entry(&j.name).or_default().push((s, d, j.port));
            }
        }
    }
    let (job_share, other_share) = if job_hops.is_empty() {
        (0, usable)
    } else {
        let other = (usable as f64 * OTHER_SHARE) as u64;
        ((usable - other) / job_hops.len() as u64, other)
    };
    let live_senders: Vec<&HostNic> = info
        .senders
        .iter()
        .filter(|hn| {
            st.hosts
                .get(&hn.host)
                .is_some_and(|h| h.liveness != Liveness::Down && h.nics.contains_key(&hn.nic))
        })
        .collect();
    if live_senders.is_empty() {
        return Err(format!("no live host sends across {}", info.link));
    }
    let receiver_addrs: Vec<Ipv4Addr> = info
        .receivers
        .iter()
        .filter_map(|hn| nic_addr(st, hn))
        .collect();
    if receiver_addrs.is_empty() {
        return Err(format!(
            "no host across {} has an address to match",
            info.link
        ));
    }
    let other_rate = (other_share / live_senders.len() as u64).max(MIN_CLASS_BPS);
    let mut out = Plan::new();
    for hn in &live_senders {
        let mut classes = Vec::new();
        let mut pace = BTreeMap::new();
        for (job, hops) in &job_hops {
            let mine: Vec<&(HostNic, HostNic, u16)> =
                hops.iter().filter(|(s, _, _)| s == *hn).collect();
            if mine.is_empty() {
                continue;
            }
            let rate = (job_share / hops.len() as u64).max(MIN_CLASS_BPS);
            let mut flows = Vec::new();
            for (_, d, port) in &mine {
                let Some(dst) = nic_addr(st, d) else {
                    continue;
                };
                // Whichever end listened, one of the two ports is the
                // job's.
                flows.push(FlowSpec {
                    dst,
                    protocol: 6,
                    dst_port: *port,
                    src_port: 0,
                });
                flows.push(FlowSpec {
                    dst,
                    protocol: 6,
                    dst_port: 0,
                    src_port: *port,
                });
            }
            if flows.is_empty() {
                continue;
            }
            flows.truncate(16);
            pace.insert(
                (*job).to_owned(),
                (rate / mine.len() as u64).max(MIN_CLASS_BPS),
            );
            classes.push(ClassSpec {
                minor: 0x10 + classes.len() as u16,
                label: format!("job {job}"),
                rate_bps: rate,
                ceil_bps: rate,
                flows,
            });
        }
        // Everything else crossing the link (listed last: job matches are
        // more specific and are tried first).
        let mut flows: Vec<FlowSpec> = receiver_addrs
            .iter()
            .map(|dst| FlowSpec {
                dst: *dst,
                protocol: 0,
                dst_port: 0,
                src_port: 0,
            })
            .collect();
        flows.truncate(16);
        classes.push(ClassSpec {
            minor: 0x10 + classes.len() as u16,
            label: "other".into(),
            rate_bps: other_rate,
            ceil_bps: other_rate,
            flows,
        });
        out.insert(
            hn.host.clone(),
            (
                hn.nic.clone(),
                NicShape {
                    incident: inc.id,
                    version: 0,
                    link: info.link.to_string(),
                    classes,
                    default_rate_bps: DEFAULT_NIC_RATE_BPS,
                    pace,
                    hold_queueing_us: edge_hold_us,
                    failures: 0,
                },
            ),
        );
    }
    Ok(out)
}

/// Orders the reconciler wants now: install desired shapes not yet
/// applied at their version, clear applied shapes no longer desired.
pub fn wanted_shape_actions(st: &ClusterState) -> Vec<Action> {
    let mut out = Vec::new();
    for (host, nics) in &st.shapes {
        if st
            .hosts
            .get(host)
            .is_none_or(|h| h.liveness == Liveness::Down)
        {
            continue;
        }
        for (nic, want) in nics {
            let applied = st.applied_shapes.get(host).and_then(|m| m.get(nic));
            if applied != Some(&want.version) && want.failures < MAX_SHAPE_FAILURES {
                out.push(Action::ShapeNic {
                    host: host.clone(),
                    nic: nic.clone(),
                    version: want.version,
                });
            }
        }
    }
    for (host, nics) in &st.applied_shapes {
        if st
            .hosts
            .get(host)
            .is_none_or(|h| h.liveness == Liveness::Down)
        {
            continue;
        }
        for nic in nics.keys() {
            let desired = st.shapes.get(host).is_some_and(|m| m.contains_key(nic));
            if !desired {
                out.push(Action::ClearShape {
                    host: host.clone(),
                    nic: nic.clone(),
                });
            }
        }
    }
    out
}

/// Whether an open shape order is obsolete (`Some(why)` cancels it).
pub fn shape_order_obsolete(st: &ClusterState, action: &Action) -> Option<String> {
    match action {
        Action::ShapeNic { host, nic, version } => {
            match st.shapes.get(host).and_then(|m| m.get(nic)) {
                Some(w) if w.version == *version => None,
                _ => Some("the desired shape changed".into()),
            }
        }
        Action::ClearShape { host, nic } => st
            .shapes
            .get(host)
            .is_some_and(|m| m.contains_key(nic))
            .then(|| "the NIC is to be shaped again".into()),
        _ => None,
    }
}

impl ClusterState {
    /// Installs a plan as the desired shaping of its incident (replacing
    /// that incident's earlier plan). A host NIC already shaped for
    /// another incident keeps that shape and is skipped.
    pub(crate) fn set_desired_shapes(&mut self, incident: u64, plan: Plan) -> (usize, usize) {
        self.drop_desired_shapes(incident);
        let (mut set, mut skipped) = (0, 0);
        for (host, (nic, mut shape)) in plan {
            let slot = self.shapes.entry(host).or_default();
            if slot.get(&nic).is_some_and(|s| s.incident != incident) {
                skipped += 1;
                continue;
            }
            self.next_shape_version += 1;
            shape.version = self.next_shape_version;
            slot.insert(nic, shape);
            set += 1;
        }
        self.shapes.retain(|_, m| !m.is_empty());
        (set, skipped)
    }

    /// Forgets an incident's desired shapes (the reconciler then clears
    /// whatever was applied).
    pub(crate) fn drop_desired_shapes(&mut self, incident: u64) {
        for m in self.shapes.values_mut() {
            m.retain(|_, s| s.incident != incident);
        }
        self.shapes.retain(|_, m| !m.is_empty());
    }

    /// Whether every desired shape of `incident` is applied (false if it
    /// has none).
    pub fn shapes_applied(&self, incident: u64) -> Option<bool> {
        let mut any = false;
        for (host, m) in &self.shapes {
            for (nic, s) in m {
                if s.incident != incident {
                    continue;
                }
                any = true;
                if self.applied_shapes.get(host).and_then(|a| a.get(nic)) != Some(&s.version) {
                    return Some(false);
                }
            }
        }
        any.then_some(true)
    }

    /// A closed shape order's effect.
    pub(crate) fn shape_order_closed(&mut self, action: &Action, outcome: &Outcome) {
        match (action, outcome) {
            (Action::ShapeNic { host, nic, version }, Outcome::Done) => {
                self.applied_shapes
                    .entry(host.clone())
                    .or_default()
                    .insert(nic.clone(), *version);
            }
            (Action::ShapeNic { host, nic, version }, Outcome::Failed { .. }) => {
                if let Some(s) = self.shapes.get_mut(host).and_then(|m| m.get_mut(nic)) {
                    if s.version == *version {
                        s.failures += 1;
                    }
                }
            }
            (Action::ClearShape { host, nic }, Outcome::Done) => {
                if let Some(m) = self.applied_shapes.get_mut(host) {
                    m.remove(nic);
                }
                self.applied_shapes.retain(|_, m| !m.is_empty());
            }
            _ => {}
        }
    }

    /// The open `link_contention` incident of a directed link.
    pub fn open_link_incident(&self, link: &DirLink) -> Option<u64> {
        self.incidents
            .values()
            .find(|i| i.closed_ms.is_none() && i.link.as_ref().is_some_and(|l| &l.link == link))
            .map(|i| i.id)
    }

    /// Admin: forget every shape of a host (desired and applied are
    /// cleared by the reconciler; the incident stays open).
    pub(crate) fn clear_host_shapes(&mut self, host: &str) -> usize {
        self.shapes.remove(host).map_or(0, |m| m.len())
    }
}

/// Checks a contention command before it is proposed.
pub fn validate(st: &ClusterState, c: &ContentionCommand) -> Result<(), String> {
    match c {
        ContentionCommand::Open { host, info } => {
            if !st.hosts.contains_key(host) {
                return Err(format!("host {host:?} not found"));
            }
            if info.senders.len() > MAX_SIDE_NICS || info.receivers.len() > MAX_SIDE_NICS {
                return Err(format!("at most {MAX_SIDE_NICS} NICs per side of a link"));
            }
            if info.paths.len() > MAX_INCIDENT_PATHS {
                return Err(format!("at most {MAX_INCIDENT_PATHS} paths per incident"));
            }
            if !info.queueing_p99_us.is_finite() {
                return Err("queueing figure must be finite".into());
            }
            Ok(())
        }
        ContentionCommand::Close { incident, .. } => match st.incidents.get(incident) {
            Some(i) if i.link.is_some() => Ok(()),
            Some(_) => Err(format!("incident {incident} is not a link incident")),
            None => Err(format!("incident {incident} not found")),
        },
    }
}

/// Applies a validated contention command.
pub(crate) fn apply(st: &mut ClusterState, at_ms: u64, c: &ContentionCommand) -> String {
    match c {
        ContentionCommand::Open { host, info } => {
            if let Some(id) = st.open_link_incident(&info.link) {
                return format!("incident {id} already open");
            }
            let detail = format!(
                "link {} contended: {} paths, queueing p99 {:.0} µs ({})",
                info.link,
                info.paths.len(),
                info.queueing_p99_us,
                info.paths.join(", ")
            );
            let id = st.open_incident(at_ms, "link_contention", host, None, detail);
            st.incidents.get_mut(&id).expect("just opened").link = Some(info.clone());
            format!("incident {id} opened")
        }
        ContentionCommand::Close { incident, why } => {
            let open = st
                .incidents
                .get(incident)
                .is_some_and(|i| i.closed_ms.is_none());
            if open {
                st.close_incident(at_ms, *incident, why);
                st.drop_desired_shapes(*incident);
            }
            format!("incident {incident} closed")
        }
    }
}
