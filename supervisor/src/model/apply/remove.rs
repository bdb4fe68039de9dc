//! `node remove`: forgetting a decommissioned host. Only a host that
//! serves nothing may go — Drained (an admin's or a playbook's drain
//! finished) or Down — with no job placed on it, no rank of it still
//! being stopped and no open order to it, so nothing in flight refers to
//! it afterwards. Its open incidents close (which ends their runs), its
//! place in the probe graph is given to its neighbours, and every
//! per-host record goes. An agent that registers under the name later is
//! a new host.

use crate::model::hosts::{DrainPhase, Host, Liveness};
use crate::model::result::CmdError;
use crate::model::state::ClusterState;

impl ClusterState {
    /// Why `host` may not be removed now, if it may not.
    pub(crate) fn check_removable(&self, host: &Host) -> Result<(), CmdError> {
        let name = &host.name;
        let drained = host
            .drain
            .as_ref()
            .is_some_and(|d| d.phase == DrainPhase::Drained);
        if !drained && host.liveness != Liveness::Down {
            return Err(CmdError::FailedPrecondition(format!(
                "host {name:?} is {}; drain it first (`node drain`), or remove it once it is Down",
                host.status()
            )));
        }
        if let Some(j) = self
            .jobs
            .values()
            .find(|j| j.placement.contains(name) || j.stopping.contains_key(name))
        {
            return Err(CmdError::FailedPrecondition(format!(
                "job {:?} still has ranks on host {name:?}",
                j.name
            )));
        }
        if let Some(i) = self.open_intents().find(|i| i.action.host() == name) {
            return Err(CmdError::FailedPrecondition(format!(
                "intent {} ({}) is still open on host {name:?}",
                i.id, i.action
            )));
        }
        Ok(())
    }

    /// Removes a validated host; returns how many open incidents closed.
    pub(crate) fn remove_host(&mut self, at_ms: u64, name: &str) -> usize {
        let open: Vec<u64> = self
            .open_incidents()
            .filter(|i| i.host == name || i.peer.as_deref() == Some(name))
            .map(|i| i.id)
            .collect();
        for id in &open {
            self.resolve_incident(at_ms, *id, "host removed");
        }
        if let Some(h) = self.hosts.remove(name) {
            self.host_ids.remove(&h.id);
            self.probe_graph.leave(h.id);
            self.probe_plan_version += 1;
        }
        self.reroutes.remove(name);
        self.shapes.remove(name);
        self.applied_shapes.remove(name);
        self.qps.remove(name);
        open.len()
    }
}
