//! Playbooks in Raft apply (atomic apply, delete, the shipped install) and
//! the views of the model that matching and `plan` read.

use crate::model::events::Event;
use crate::model::hosts::{HostStatus, NicState};
use crate::model::playbook_store::types::{
    PlanIncident, PlaybookFile, StoredPlaybook, MAX_APPLY_FILES, MAX_PLAYBOOKS, MAX_PLAYBOOK_BYTES,
    SHIPPED_ACTOR,
};
use crate::model::result::CmdError;
use crate::model::state::ClusterState;
use std::collections::BTreeSet;
use std::time::Duration;

fn invalid(e: impl std::fmt::Display) -> CmdError {
    CmdError::InvalidArgument(e.to_string())
}

impl ClusterState {
    /// The set `files` would make: each parsed file, plus every stored
    /// playbook no file replaces. Errors carry `file:line:column`.
    pub fn playbooks_after_apply<'f>(
        &self,
        files: &'f [PlaybookFile],
    ) -> Result<Vec<(playbooks::Playbook, &'f PlaybookFile)>, CmdError> {
        if files.is_empty() {
            return Err(invalid("give at least one playbook file"));
        }
        if files.len() > MAX_APPLY_FILES {
            return Err(invalid(format!(
                "at most {MAX_APPLY_FILES} files per apply"
            )));
        }
        for f in files {
            if f.text.len() > MAX_PLAYBOOK_BYTES {
                return Err(invalid(format!(
                    "{}: {} bytes; a playbook file may have at most {MAX_PLAYBOOK_BYTES}",
                    f.file,
                    f.text.len()
                )));
            }
            if f.file.is_empty() || f.file.len() > 4096 {
                return Err(invalid("file names must be 1..4096 bytes"));
            }
        }
        // Parse the new files first: their names decide what they replace.
        let mut new_names = BTreeSet::new();
        let mut errors = Vec::new();
        for f in files {
            match playbooks::parse(&f.file, &f.text) {
                Ok(p) => {
                    new_names.insert(p.name);
                }
                Err(e) => errors.push(e.to_string()),
            }
        }
        if !errors.is_empty() {
            return Err(invalid(errors.join("\n")));
        }
        let stored: Vec<(String, &str)> = self
            .playbooks
            .values()
            .filter(|s| !new_names.contains(&s.name))
            .map(|s| (format!("stored playbook {}", s.name), s.source.as_str()))
            .collect();
        let sources = files
            .iter()
            .map(|f| (f.file.as_str(), f.text.as_str()))
            .chain(stored.iter().map(|(n, t)| (n.as_str(), *t)));
        let set = playbooks::check_sources(sources).map_err(invalid)?;
        if set.len() > MAX_PLAYBOOKS {
            return Err(invalid(format!("at most {MAX_PLAYBOOKS} playbooks")));
        }
        Ok(set
            .into_iter()
            .take(files.len())
            .zip(files.iter())
            .collect())
    }

    pub(crate) fn validate_playbook_delete(&self, name: &str) -> Result<(), CmdError> {
        if !self.playbooks.contains_key(name) {
            return Err(CmdError::NotFound {
                kind: "playbook".into(),
                name: name.into(),
            });
        }
        let rest: Vec<playbooks::Playbook> = self
            .playbooks
            .values()
            .filter(|s| s.name != name)
            .filter_map(StoredPlaybook::parsed)
            .cloned()
            .collect();
        if let Some(user) = rest.iter().find(|p| p.on_failure.as_deref() == Some(name)) {
            return Err(CmdError::FailedPrecondition(format!(
                "playbook {:?} escalates to {name:?}; change or delete it first",
                user.name
            )));
        }
        Ok(())
    }

    /// Stores validated files; returns what to log.
    pub(crate) fn apply_playbooks(
        &mut self,
        at_ms: u64,
        actor: &str,
        files: &[PlaybookFile],
    ) -> String {
        let parsed: Vec<(String, PlaybookFile)> = self
            .playbooks_after_apply(files)
            .expect("validated")
            .into_iter()
            .map(|(p, f)| (p.name, f.clone()))
            .collect();
        let mut changed = Vec::new();
        for (name, f) in parsed {
            if self
                .playbooks
                .get(&name)
                .is_some_and(|s| s.source == f.text)
            {
                continue;
            }
            self.playbook_version += 1;
            self.playbooks.insert(
                name.clone(),
                StoredPlaybook::new(
                    name.clone(),
                    f.file,
                    f.text,
                    self.playbook_version,
                    at_ms,
                    actor.to_owned(),
                ),
            );
            changed.push(name);
        }
        if changed.is_empty() {
            "playbooks applied: nothing changed".into()
        } else {
            format!(
                "playbooks applied (version {}): {}",
                self.playbook_version,
                changed.join(", ")
            )
        }
    }

    /// [`crate::model::Command::InstallShippedPlaybooks`]: stores the
    /// files that name no stored playbook, once per cluster. A set that
    /// does not validate (an admin's stored playbook escalating to a
    /// missing one, say) stores nothing and is logged; either way the
    /// install is done.
    pub(crate) fn install_shipped_playbooks(&mut self, at_ms: u64, files: &[PlaybookFile]) {
        if self.shipped_playbooks_installed {
            return;
        }
        self.shipped_playbooks_installed = true;
        let fresh: Vec<PlaybookFile> = files
            .iter()
            .filter(|f| {
                playbooks::parse(&f.file, &f.text)
                    .is_ok_and(|p| !self.playbooks.contains_key(&p.name))
            })
            .cloned()
            .collect();
        if fresh.is_empty() {
            self.log_event(
                at_ms,
                None,
                Event::ShippedPlaybooks {
                    installed: 0,
                    what: "shipped playbooks: every one is already stored".into(),
                },
            );
            return;
        }
        let event = match self.playbooks_after_apply(&fresh) {
            Ok(_) => Event::ShippedPlaybooks {
                installed: fresh.len() as u32,
                what: self.apply_playbooks(at_ms, SHIPPED_ACTOR, &fresh),
            },
            Err(e) => Event::ShippedPlaybooks {
                installed: 0,
                what: format!("shipped playbooks not installed: {e}"),
            },
        };
        self.log_event(at_ms, None, event);
    }

    /// Every stored playbook, parsed (borrowed: matching runs on every
    /// reconciler pass).
    pub fn playbook_set(&self) -> Vec<&playbooks::Playbook> {
        self.playbooks
            .values()
            .filter_map(StoredPlaybook::parsed)
            .collect()
    }

    /// What planning reads of the cluster (`now_ms`: the leader's clock).
    pub fn playbook_view(&self, now_ms: u64) -> playbooks::ClusterView {
        self.view_of(now_ms, self.hosts.values())
    }

    /// The view of only these hosts (and every job): enough for a step's
    /// condition, which reads the incident's host, peer and jobs, and
    /// cheap enough for the reconciler to build for every waiting run on
    /// every pass (the whole view is linear in the cluster's hosts).
    pub fn playbook_view_around(&self, now_ms: u64, hosts: &[&str]) -> playbooks::ClusterView {
        self.view_of(now_ms, hosts.iter().filter_map(|h| self.hosts.get(*h)))
    }

    /// The view a condition of `incident` reads (its host and peer: see
    /// `playbooks::evaluate`), cheap enough to build on every incident
    /// and every reconciler pass.
    pub fn playbook_view_of(
        &self,
        now_ms: u64,
        incident: &playbooks::IncidentView,
    ) -> playbooks::ClusterView {
        let around: Vec<&str> = std::iter::once(incident.host.as_str())
            .chain(incident.peer.as_deref())
            .collect();
        self.playbook_view_around(now_ms, &around)
    }

    fn view_of<'a>(
        &'a self,
        now_ms: u64,
        hosts: impl Iterator<Item = &'a crate::model::hosts::Host>,
    ) -> playbooks::ClusterView {
        use playbooks::{HostView, JobView, NicHealth, NicView};
        let mut view = playbooks::ClusterView::default();
        for h in hosts {
            let status = match h.status() {
                HostStatus::Ready => playbooks::HostStatus::Ready,
                HostStatus::Cordoned => playbooks::HostStatus::Cordoned,
                HostStatus::Draining => playbooks::HostStatus::Draining,
                HostStatus::Drained => playbooks::HostStatus::Drained,
                HostStatus::Down => playbooks::HostStatus::Down,
            };
            let nics = h
                .nics
                .values()
                .map(|n| {
                    let health = match n.state {
                        NicState::Unknown => NicHealth::Unknown,
                        NicState::Up => NicHealth::Up,
                        NicState::Down => NicHealth::Down,
                        NicState::Flapping => NicHealth::Flapping,
                        NicState::Recovering => NicHealth::Recovering,
                        NicState::Degraded => NicHealth::Degraded,
                    };
                    (
                        n.name.clone(),
                        NicView {
                            health,
                            rail: n.rail,
                            backup: n.backup.clone(),
                        },
                    )
                })
                .collect();
            view.hosts.insert(
                h.name.clone(),
                HostView {
                    status,
                    clock_synced: h.clock.state == crate::model::ClockState::Synced,
                    nics,
                    jobs: self.jobs_on(&h.name).map(|j| j.name.clone()).collect(),
                },
            );
        }
        for j in self.jobs.values() {
            view.jobs.insert(
                j.name.clone(),
                JobView {
                    running: matches!(
                        j.state,
                        crate::model::jobs::JobState::Running
                            | crate::model::jobs::JobState::Checkpointing
                    ),
                    checkpoint_age: j
                        .latest_checkpoint_ms
                        .map(|t| Duration::from_millis(now_ms.saturating_sub(t))),
                },
            );
        }
        view
    }

    /// The incident view for a plan: the host must exist (its labels and
    /// the NIC's rail come from the model).
    pub fn plan_incident(&self, i: &PlanIncident) -> Result<playbooks::IncidentView, CmdError> {
        let h = self.hosts.get(&i.host).ok_or_else(|| CmdError::NotFound {
            kind: "host".into(),
            name: i.host.clone(),
        })?;
        let rail = match &i.nic {
            Some(n) => {
                let nic = h.nics.get(n).ok_or_else(|| CmdError::NotFound {
                    kind: "NIC".into(),
                    name: format!("{}/{n}", i.host),
                })?;
                nic.rail
            }
            None => None,
        };
        if let Some(p) = i.peer.as_ref().filter(|p| !self.hosts.contains_key(*p)) {
            return Err(CmdError::NotFound {
                kind: "host".into(),
                name: p.clone(),
            });
        }
        if let Some(j) = &i.job {
            if !self.jobs.contains_key(j) {
                return Err(CmdError::NotFound {
                    kind: "job".into(),
                    name: j.clone(),
                });
            }
        }
        Ok(playbooks::IncidentView {
            kind: i.kind.clone(),
            host: i.host.clone(),
            nic: i.nic.clone(),
            rail,
            job: i.job.clone(),
            peer: i.peer.clone(),
            labels: h.labels.clone(),
            closed: false,
        })
    }
}
