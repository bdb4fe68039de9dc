//! Fixtures shared by the model's tests.

use crate::model::jobs::types::{port_of, Job, JobSpec, JobState, Rank};
use std::collections::BTreeMap;

/// Registers host `name` (the `i`th) with `rail0`/`rail1`, each the other's
/// backup, at 10.<rail>.0.<i+1> (for tests).
#[cfg(test)]
pub(crate) fn register_two_rails_for_test(i: usize, name: &str) -> crate::model::Command {
    crate::model::Command::RegisterHost {
        host: name.to_string(),
        nics: (0..2)
            .map(|r| crate::model::NicSpec {
                name: format!("rail{r}"),
                rail: Some(r),
                backup: Some(format!("rail{}", 1 - r)),
                rdma_device: None,
                addr: Some(format!("10.{r}.0.{}", i + 1)),
            })
            .collect(),
        labels: BTreeMap::new(),
    }
}

/// Applies `cmds` as the entry at log `index` (term 1, leader 1) at
/// `at_ms` (for tests).
#[cfg(test)]
pub(crate) fn apply_for_test(
    st: &mut crate::model::ClusterState,
    index: u64,
    at_ms: u64,
    cmds: Vec<crate::model::Command>,
) -> Vec<crate::model::result::CmdResult> {
    let id = openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), index);
    st.apply_proposal(&id, &crate::model::Proposal { at_ms, cmds })
}

/// A running job placed on `hosts` (for tests of code that only looks at
/// placement).
#[cfg(test)]
pub(crate) fn placed_for_test(name: &str, hosts: &[&str]) -> Job {
    let spec = spec(name, hosts.len() as u32);
    Job {
        name: name.into(),
        placement: hosts.iter().map(|h| h.to_string()).collect(),
        incarnation: 1,
        state: JobState::Running,
        number: 1,
        port: port_of(1),
        submitted_ms: 0,
        state_since_ms: 0,
        restarts: 0,
        failures_in_a_row: 0,
        not_before_ms: 0,
        ranks: hosts
            .iter()
            .map(|h| Rank {
                host: h.to_string(),
                started: true,
                exit: None,
            })
            .collect(),
        resume_step: 0,
        checkpoints: BTreeMap::new(),
        latest_checkpoint: None,
        latest_checkpoint_ms: None,
        stopping: BTreeMap::new(),
        previous_placement: Vec::new(),
        halting: false,
        fenced: BTreeMap::new(),
        reason: String::new(),
        spec,
    }
}

/// An agent's report that `nic` is in `health` (for tests).
pub(crate) fn nic_report(nic: &str, health: proto::agent::NicHealth) -> proto::agent::Report {
    proto::agent::Report::Nic(proto::agent::NicReport {
        nic: nic.into(),
        health,
        carrier_changes: 0,
        flaps: 0,
        penalty: 0.0,
        coalesced: 0,
        link_up: health == proto::agent::NicHealth::Up,
        probes_lost: false,
        at_unix_ns: 0,
    })
}

/// A job spec of `ranks` ranks running `/bin/true` (for tests).
pub(crate) fn spec(name: &str, ranks: u32) -> JobSpec {
    JobSpec {
        name: name.into(),
        ranks,
        hosts: vec![],
        labels: BTreeMap::new(),
        command: vec!["/bin/true".into()],
        env: BTreeMap::new(),
        checkpoint_dir: "/tmp/ckpt".into(),
        checkpoint_every: 10,
        max_restarts: 2,
        backoff_ms: 100,
        user: None,
        ranks_per_host: 1,
    }
}

/// An agent's answer to an order: done with `detail`, or failed with it.
pub(crate) fn answer(ok: bool, detail: impl Into<String>) -> proto::agent::OrderOutcome {
    let detail = detail.into();
    if ok {
        proto::agent::OrderOutcome::Done { detail }
    } else {
        proto::agent::OrderOutcome::Failed { error: detail }
    }
}

/// An agent's answer to a checkpoint order: every rank checkpointed at
/// `step`.
pub(crate) fn checkpointed(step: u64) -> proto::agent::OrderOutcome {
    proto::agent::OrderOutcome::Checkpointed {
        step,
        detail: format!("step={step}"),
    }
}

/// What the agents do after registering: each confirms the detour order
/// (its standby sets) the leader sends it. `st` reads the world's state,
/// `ok` commits a command in it (for tests whose worlds count orders).
#[cfg(test)]
pub(crate) fn confirm_reroutes_for_test<W>(
    w: &mut W,
    st: impl Fn(&W) -> &crate::model::ClusterState,
    mut ok: impl FnMut(&mut W, crate::model::Command),
) {
    use crate::model::intents::Action;
    for action in crate::model::reroute::wanted_reroute_actions(st(w)) {
        ok(w, crate::model::Command::OpenIntent { action });
    }
    let open: Vec<(u64, String)> = st(w)
        .open_intents()
        .filter(|i| matches!(i.action, Action::Reroute { .. }))
        .map(|i| (i.id, i.action.host().to_owned()))
        .collect();
    for (id, host) in open {
        ok(
            w,
            crate::model::Command::OrderDone {
                host,
                id,
                outcome: answer(true, "ok"),
            },
        );
    }
}

/// `st` through a snapshot and back, as a follower or a restarted member
/// reads it.
pub(crate) fn snapshot_roundtrip(st: &crate::model::ClusterState) -> crate::model::ClusterState {
    use raft_store::StateModel;
    let bytes = StateModel::encode(st).expect("encode");
    <crate::model::ClusterState as StateModel<crate::model::TypeConfig>>::decode(&bytes)
        .expect("decode")
}
