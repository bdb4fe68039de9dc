//! [`HostModel`]: the sequential specification of one host's admin-visible
//! state (cordon, drain, labels, NICs held out of service by an admin's
//! failover) that the supervisor scenarios check their histories against.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::hash::Hash;

use super::model::{Model, Operation};

/// Admin-visible state of one host as the scenarios observe it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct HostView {
    pub cordoned: bool,
    /// A drain is in progress or done (the reconciler moves Draining to
    /// Drained on its own, so the two are one observable fact here).
    pub draining: bool,
    /// Label key -> value; each client writes its own key with increasing
    /// values.
    pub labels: BTreeMap<String, u64>,
    /// NICs held out of service (`nic failover` until `nic failback`).
    pub held: BTreeSet<String>,
}

/// The simulated hosts' NICs, each the other's backup.
pub const NICS: [&str; 2] = ["rail0", "rail1"];

/// The backup of a simulated host's NIC.
fn backup(nic: &str) -> &'static str {
    if nic == NICS[0] {
        NICS[1]
    } else {
        NICS[0]
    }
}

/// Admin operations on one host.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostOp {
    Cordon,
    Uncordon,
    Drain,
    Undrain,
    SetLabel(String, u64),
    /// `nic failover HOST NIC` (to its backup): refused while the backup
    /// is itself held; else the NIC is held.
    Failover(String),
    /// `nic failback HOST NIC`: releases the NIC (the simulated hosts'
    /// NICs never report a state, so it is never refused).
    Failback(String),
    Read,
}

/// What an operation returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostResult {
    Ok,
    /// Refused by a precondition (uncordon while draining, failover onto
    /// a held NIC); no effect.
    Refused,
    Read(HostView),
}

/// The NIC a failover or failback names.
fn input_nic(op: &HostOp) -> &str {
    match op {
        HostOp::Failover(n) | HostOp::Failback(n) => n,
        _ => "",
    }
}

/// The sequential specification of one host (see `supervisor::model`).
pub struct HostModel;

impl Model for HostModel {
    type State = HostView;
    type Input = HostOp;
    type Output = HostResult;

    fn init(&self) -> HostView {
        HostView::default()
    }

    fn is_read(&self, input: &HostOp) -> bool {
        *input == HostOp::Read
    }

    fn is_refused(&self, out: &HostResult) -> bool {
        *out == HostResult::Refused
    }

    fn step(&self, s: &HostView, input: &HostOp, out: Option<&HostResult>) -> Option<HostView> {
        if *input == HostOp::Read {
            // The common case: no clone unless the read matches.
            return match out {
                None => Some(s.clone()),
                Some(HostResult::Read(v)) if v == s => Some(s.clone()),
                _ => None,
            };
        }
        let ok = matches!(out, None | Some(HostResult::Ok));
        let mut n = s.clone();
        match input {
            HostOp::Cordon if ok => n.cordoned = true,
            HostOp::Uncordon if s.draining => {
                return matches!(out, None | Some(HostResult::Refused)).then_some(n)
            }
            HostOp::Uncordon if ok => n.cordoned = false,
            HostOp::Drain if ok => {
                n.cordoned = true;
                n.draining = true;
            }
            HostOp::Undrain if ok => {
                n.cordoned = false;
                n.draining = false;
            }
            HostOp::SetLabel(k, v) if ok => {
                n.labels.insert(k.clone(), *v);
            }
            HostOp::Failover(_) if s.held.contains(backup(input_nic(input))) => {
                return matches!(out, None | Some(HostResult::Refused)).then_some(n)
            }
            HostOp::Failover(nic) if ok => {
                n.held.insert(nic.clone());
            }
            HostOp::Failback(nic) if ok => {
                n.held.remove(nic);
            }
            _ => return None,
        }
        Some(n)
    }

    /// Unknown-outcome label writes whose value no read returned. If such a
    /// write took effect, then before any read of the host another write of
    /// the same key replaced its value, or nothing read the host again; and
    /// no other operation's outcome depends on labels. So a linearization
    /// that applies it stays one without it (states differ only on that
    /// label, only until it is overwritten, and nothing reads them).
    fn unobservable(&self, history: &[Operation<HostOp, HostResult>]) -> Vec<bool> {
        let seen: HashSet<(&str, u64)> = history
            .iter()
            .filter_map(|o| match &o.output {
                Some(HostResult::Read(v)) => Some(v),
                _ => None,
            })
            .flat_map(|v| v.labels.iter().map(|(k, x)| (k.as_str(), *x)))
            .collect();
        history
            .iter()
            .map(|o| {
                o.ret.is_none()
                    && matches!(&o.input, HostOp::SetLabel(k, v) if !seen.contains(&(k.as_str(), *v)))
            })
            .collect()
    }
}
