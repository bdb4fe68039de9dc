//! The reshaping plan (pure, runs in apply), the orders it calls for, and
//! the detector's commands in apply.

use crate::model::hosts::Liveness;
use crate::model::incidents::Incident;
use crate::model::incidents::IncidentKind;
use crate::model::intents::{Action, Outcome};
use crate::model::jobs::types::JobState;
use crate::model::shaping::types::{
    ClassSpec, ContentionCommand, FlowSpec, HostNic, NicShape, Plan, DEFAULT_HEADROOM,
    DEFAULT_NIC_RATE_BPS, MAX_INCIDENT_PATHS, MAX_SHAPE_FAILURES, MAX_SIDE_NICS, MIN_CLASS_BPS,
    OTHER_SHARE,
};
use crate::model::state::ClusterState;
use crate::topology::DirLink;
use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::net::Ipv4Addr;

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
                job: Some((*job).to_owned()),
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
            job: None,
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
            let id = st.open_incident(at_ms, IncidentKind::LinkContention, host, None, detail);
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
        self.open_incidents()
            .find(|i| i.link.as_ref().is_some_and(|l| &l.link == link))
            .map(|i| i.id)
    }

    /// Admin: forget every shape of a host (desired and applied are
    /// cleared by the reconciler; the incident stays open).
    pub(crate) fn clear_host_shapes(&mut self, host: &str) -> usize {
        self.shapes.remove(host).map_or(0, |m| m.len())
    }
}
