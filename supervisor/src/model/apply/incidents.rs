//! Opening and closing incidents (NIC, host, clock).

use crate::model::events::Event;
use crate::model::hosts::{ClockState, Liveness};
use crate::model::incidents::Incident;
use crate::model::incidents::IncidentKind;
use crate::model::jobs::types::JobState;
use crate::model::limits::{MAX_CLOSED_RECORDS, MAX_PATH_INCIDENTS_PER_HOST};
use crate::model::state::ClusterState;

impl ClusterState {
    pub(crate) fn open_incident(
        &mut self,
        at_ms: u64,
        kind: IncidentKind,
        host: &str,
        nic: Option<&str>,
        detail: String,
    ) -> u64 {
        self.next_incident_id += 1;
        let id = self.next_incident_id;
        self.open.incidents.insert(id);
        self.incidents.insert(
            id,
            Incident {
                id,
                kind,
                host: host.into(),
                nic: nic.map(str::to_owned),
                opened_ms: at_ms,
                closed_ms: None,
                detail,
                run: None,
                link: None,
                peer: None,
                stalled_job: None,
                shared_at_report: Vec::new(),
            },
        );
        self.log_event(at_ms, Some(host), Event::IncidentOpened { id, kind });
        id
    }

    /// A clock that lost sync (Synced or Degraded → Unsynced) opens a
    /// `clock_unsynced` incident; Synced again closes it (a playbook
    /// waiting for `clock_synced` goes on to its last steps). A Down
    /// host's clock is unknowable and its `host_down` incident says more:
    /// no clock incident for it.
    pub(in crate::model) fn clock_incidents(
        &mut self,
        at_ms: u64,
        host: &str,
        prev: ClockState,
        now: ClockState,
    ) {
        let h = &self.hosts[host];
        match now {
            ClockState::Unsynced
                if prev != ClockState::Unsynced
                    && h.clock_incident.is_none()
                    && h.liveness != Liveness::Down =>
            {
                let id = self.open_incident(
                    at_ms,
                    IncidentKind::ClockUnsynced,
                    host,
                    None,
                    format!("clock {prev:?} -> Unsynced"),
                );
                self.hosts.get_mut(host).expect("exists").clock_incident = Some(id);
            }
            ClockState::Synced => {
                if let Some(id) = self
                    .hosts
                    .get_mut(host)
                    .and_then(|h| h.clock_incident.take())
                {
                    self.close_incident(at_ms, id, "clock synced again");
                }
            }
            _ => {}
        }
    }

    /// A host whose data NICs are all Down or Flapping while its agent
    /// still reports ([`crate::model::Host::cut_off`]) opens a
    /// `host_cut_off` incident, distinct from Down; the first data NIC
    /// usable again closes it. While it is open, its NICs' incidents wait:
    /// their runs that are acting are cancelled (to start again once the
    /// host is reachable) and new ones do not start.
    pub(in crate::model) fn cut_off_incidents(&mut self, at_ms: u64, host: &str) {
        let Some(h) = self.hosts.get(host) else {
            return;
        };
        match (h.cut_off(), h.cut_off_incident) {
            (_, Some(id))
                if self
                    .incidents
                    .get(&id)
                    .is_none_or(|i| i.closed_ms.is_some()) =>
            {
                // Its incident was closed elsewhere: forget it.
                self.hosts.get_mut(host).expect("exists").cut_off_incident = None;
                self.cut_off_incidents(at_ms, host);
            }
            (true, None) => {
                let nics = crate::model::paths::rail_states(h);
                let id = self.open_incident(
                    at_ms,
                    IncidentKind::HostCutOff,
                    host,
                    None,
                    format!("no working data rail: {nics}"),
                );
                self.hosts.get_mut(host).expect("exists").cut_off_incident = Some(id);
                let nic_incidents: Vec<u64> = self.hosts[host]
                    .nics
                    .values()
                    .flat_map(|n| n.open_incidents.values().copied())
                    .collect();
                for i in nic_incidents {
                    self.set_aside_run(at_ms, i, id);
                }
            }
            (false, Some(id)) if h.reconnected() || !h.nics.values().any(|n| n.rail.is_some()) => {
                self.hosts.get_mut(host).expect("exists").cut_off_incident = None;
                self.close_incident(at_ms, id, "a data rail works again");
            }
            _ => {}
        }
    }

    /// Path incidents around `host`, whose NICs may have changed
    /// ([`crate::model::paths`]): an open `no_common_rail` incident of a
    /// pair with `host` closes when the two share an Up rail again (or
    /// either is gone); one opened on the ranks' evidence closes only when
    /// they share an Up rail they did not share at the report. A pair of
    /// `host` and another host of one of its live jobs that shares no
    /// working rail opens one (once per pair). Linear in the sizes of
    /// `host`'s jobs.
    pub(in crate::model) fn path_incidents(&mut self, at_ms: u64, host: &str) {
        use crate::model::paths::{describe, path_cut, path_gained, path_restored};
        let open: Vec<(u64, String, String, Option<Vec<u32>>)> = self
            .hosts
            .get(host)
            .into_iter()
            .flat_map(|h| &h.path_incidents)
            .filter_map(|id| self.incidents.get(id))
            .filter_map(|i| {
                let evidence = i.stalled_job.is_some().then(|| i.shared_at_report.clone());
                Some((i.id, i.host.clone(), i.peer.clone()?, evidence))
            })
            .collect();
        let mut known = std::collections::BTreeSet::new();
        for (id, a, b, evidence) in open {
            let restored = |ha, hb| match &evidence {
                // One opened on the ranks' evidence closes only on a rail
                // the pair gained since (the rails they shared then did
                // not carry the connection).
                Some(before) => path_gained(ha, hb, before),
                None => path_restored(ha, hb),
            };
            match (self.hosts.get(&a), self.hosts.get(&b)) {
                (Some(ha), Some(hb)) if !restored(ha, hb) => {
                    known.insert(if a == host { b } else { a });
                }
                (Some(_), Some(_)) => {
                    self.close_incident(at_ms, id, "a common data rail works again")
                }
                _ => self.close_incident(at_ms, id, "a host of the pair is gone"),
            }
        }
        let Some(me) = self.hosts.get(host) else {
            return;
        };
        if me.liveness == Liveness::Down
            || self.path_incidents_of(host) >= MAX_PATH_INCIDENTS_PER_HOST
        {
            return;
        }
        let mut peers: Vec<(String, String)> = Vec::new();
        for j in self.jobs.values().filter(|j| {
            matches!(j.state, JobState::Running | JobState::Checkpointing)
                && j.placement.iter().any(|h| h == host)
        }) {
            for other in j.hosts() {
                if other == host || known.contains(other) {
                    continue;
                }
                let Some(them) = self.hosts.get(other) else {
                    continue;
                };
                if them.liveness != Liveness::Down && path_cut(me, them) {
                    known.insert(other.to_owned());
                    peers.push((other.to_owned(), j.name.clone()));
                }
            }
        }
        let room = MAX_PATH_INCIDENTS_PER_HOST - self.path_incidents_of(host);
        for (other, job) in peers.into_iter().take(room) {
            if self.path_incidents_of(&other) >= MAX_PATH_INCIDENTS_PER_HOST {
                continue;
            }
            let (a, b) = if host < other.as_str() {
                (host.to_owned(), other)
            } else {
                (other, host.to_owned())
            };
            let detail = format!(
                "{a} and {b} share no working data rail (job {job}): {}; {}",
                describe(&self.hosts[&a]),
                describe(&self.hosts[&b])
            );
            self.open_pair_incident(at_ms, &a, &b, detail, None);
        }
    }

    /// A rank of a live job on `host` says its connection to a rank on
    /// another host of the job has had no path for a while: whatever the
    /// NIC states say, the two cannot talk. Unless a path or cut-off
    /// incident already covers the pair, it gets a `no_common_rail`
    /// incident on this evidence: placement keeps the two apart while it
    /// is open, and its playbook moves the job at once instead of the
    /// job's own timeout. (NIC states that look healthy do not keep it
    /// open once its run completed.) A report of an older incarnation, or
    /// about a host outside the job, changes nothing.
    pub(in crate::model) fn conn_stalled(
        &mut self,
        at_ms: u64,
        host: &str,
        c: &proto::agent::ConnStallReport,
    ) {
        let Some(j) = self.jobs.get(&c.job) else {
            return;
        };
        let live = j.incarnation == c.incarnation
            && matches!(j.state, JobState::Running | JobState::Checkpointing)
            && j.ranks.get(c.rank as usize).is_some_and(|r| r.host == host)
            && j.ranks
                .get(c.peer_rank as usize)
                .is_some_and(|r| r.host == c.peer_host)
            && c.peer_host != host;
        if !live {
            return;
        }
        // A peer that died stalls every connection to it too: that is the
        // liveness detector's to judge (host_down, a failure restart), so
        // only a pair of live hosts counts as a path fault.
        let covered = [host, c.peer_host.as_str()].iter().any(|h| {
            self.hosts.get(*h).is_none_or(|h| {
                h.cut_off_incident.is_some()
                    || h.liveness != Liveness::Ready
                    || self.path_incidents_of(&h.name) >= MAX_PATH_INCIDENTS_PER_HOST
            })
        }) || self.open_path_incident(host, &c.peer_host).is_some();
        let what = format!(
            "rank {} on {host} has had no path to rank {} on {} (connection {})",
            c.rank, c.peer_rank, c.peer_host, c.conn_id
        );
        self.log_event(
            at_ms,
            Some(host),
            Event::ConnStalled {
                job: c.job.clone(),
                what: what.clone(),
            },
        );
        if covered {
            return;
        }
        let (a, b) = if host < c.peer_host.as_str() {
            (host.to_owned(), c.peer_host.clone())
        } else {
            (c.peer_host.clone(), host.to_owned())
        };
        let detail = format!(
            "{a} and {b} cannot talk (job {}): {what}; {}; {}",
            c.job,
            crate::model::paths::describe(&self.hosts[&a]),
            crate::model::paths::describe(&self.hosts[&b])
        );
        self.open_pair_incident(at_ms, &a, &b, detail, Some(c.job.clone()));
    }

    /// Opens the `no_common_rail` incident of the pair `a` (its host) and
    /// `b` (its peer), on NIC states or on a job's evidence, and indexes it
    /// on both hosts.
    fn open_pair_incident(
        &mut self,
        at_ms: u64,
        a: &str,
        b: &str,
        detail: String,
        stalled_job: Option<String>,
    ) {
        let id = self.open_incident(at_ms, IncidentKind::NoCommonRail, a, None, detail);
        let shared = match (self.hosts.get(a), self.hosts.get(b), &stalled_job) {
            (Some(ha), Some(hb), Some(_)) => crate::model::paths::shared_up_rails(ha, hb),
            _ => Vec::new(),
        };
        if let Some(i) = self.incidents.get_mut(&id) {
            i.peer = Some(b.to_owned());
            i.stalled_job = stalled_job;
            i.shared_at_report = shared;
        }
        for h in [a, b] {
            if let Some(h) = self.hosts.get_mut(h) {
                h.path_incidents.insert(id);
            }
        }
    }

    /// The job's incarnation ended (restarted, finished, failed or
    /// cancelled): the path incidents opened on its ranks' evidence that no
    /// run acts on are spent (a run closes its own when it ends).
    pub(in crate::model) fn stalled_evidence_spent(&mut self, at_ms: u64, job: &str) {
        let open: std::collections::BTreeSet<u64> = self
            .hosts
            .values()
            .flat_map(|h| h.path_incidents.iter().copied())
            .collect();
        let spent: Vec<u64> = open
            .into_iter()
            .filter_map(|id| self.incidents.get(&id))
            .filter(|i| {
                i.closed_ms.is_none()
                    && i.stalled_job.as_deref() == Some(job)
                    && self.active_run_of(i.id).is_none()
            })
            .map(|i| i.id)
            .collect();
        for id in spent {
            self.close_incident(at_ms, id, "the job's incarnation that reported it ended");
        }
    }

    /// Open `no_common_rail` incidents naming `host`.
    fn path_incidents_of(&self, host: &str) -> usize {
        self.hosts.get(host).map_or(0, |h| h.path_incidents.len())
    }

    /// The open `no_common_rail` incident of the pair, if any.
    pub(in crate::model) fn open_path_incident(&self, a: &str, b: &str) -> Option<u64> {
        let h = self.hosts.get(a)?;
        h.path_incidents.iter().copied().find(|id| {
            self.incidents.get(id).is_some_and(|i| {
                i.peer
                    .as_deref()
                    .is_some_and(|p| (i.host == a && p == b) || (i.host == b && p == a))
            })
        })
    }

    pub(crate) fn close_incident(&mut self, at_ms: u64, id: u64, why: &str) {
        let Some(i) = self.incidents.get_mut(&id) else {
            return;
        };
        if i.closed_ms.is_some() {
            return;
        }
        i.closed_ms = Some(at_ms);
        self.open.incidents.remove(&id);
        let host = i.host.clone();
        let kind = i.kind;
        if let Some(peer) = i.peer.clone() {
            for h in [&host, &peer] {
                if let Some(h) = self.hosts.get_mut(h) {
                    h.path_incidents.remove(&id);
                }
            }
        }
        self.log_event(
            at_ms,
            Some(&host),
            Event::IncidentClosed {
                id,
                kind,
                why: why.to_owned(),
            },
        );
        self.closed_incidents.push_back(id);
        // Its shapes go; the reconciler clears what was applied.
        self.drop_desired_shapes(id);
        // A run still acting on it is cancelled (a waiting one goes on).
        self.incident_cleared(at_ms, id);
        while self.closed_incidents.len() > MAX_CLOSED_RECORDS {
            if let Some(old) = self.closed_incidents.pop_front() {
                self.incidents.remove(&old);
            }
        }
    }
}
