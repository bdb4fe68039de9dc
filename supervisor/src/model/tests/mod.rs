//! Tests of the model, one file per area; the shared fixtures are here.

use crate::model::admin::AdminOp;
use crate::model::command::{Command, NodeId, Proposal, RequestId, TypeConfig};
use crate::model::events::AgentEvent;
use crate::model::hosts::{ClockChange, ClockState, HostStatus, Liveness, NicSpec, NicState};
use crate::model::intents::{Action, IntentStatus, Outcome};
use crate::model::jobs::types::{JobCommand, JobOp, JobSpec};
use crate::model::limits::{MAX_QPS_PER_HOST, MAX_SESSIONS, MAX_SESSION_RESULTS};
use crate::model::probe_graph::PROBE_DEGREE;
use crate::model::qps::QpKey;
use crate::model::result::{not_found, CmdError, CmdOk, CmdResult};
use crate::model::runs::types::{RunCommand, StepOp};
use crate::model::state::ClusterState;
use openraft::LogId;
use proto::agent::{
    NicHealth, NicReport, QpReport, RankCheckpointReport, RankExitReport, ReflexReport, Report,
};
use std::collections::BTreeMap;

use openraft::CommittedLeaderId;

fn lid(i: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(1, 1), i)
}

/// An admin's drain of `host` (reason "r", no deadline).
fn drain_op(host: &str) -> AdminOp {
    AdminOp::Drain {
        host: host.into(),
        reason: "r".into(),
        deadline_ms: None,
    }
}

fn register(st: &mut ClusterState, host: &str) {
    let p = Proposal {
        at_ms: 1,
        cmds: vec![Command::RegisterHost {
            host: host.into(),
            nics: vec![
                NicSpec::named("rail0").on_rail(0).backed_by("rail1"),
                NicSpec::named("rail1").on_rail(1).backed_by("rail0"),
            ],
            labels: BTreeMap::new(),
        }],
    };
    assert!(st.apply_proposal(&lid(1), &p)[0].is_ok());
}

fn admin(op: AdminOp) -> Command {
    Command::Admin {
        actor: "alice".into(),
        op,
        request: None,
    }
}

fn admin_req(op: AdminOp, client: &str, serial: u64) -> Command {
    Command::Admin {
        actor: "alice".into(),
        op,
        request: Some(RequestId {
            client: client.into(),
            serial,
            retry: true,
        }),
    }
}

fn one(st: &mut ClusterState, index: u64, at_ms: u64, cmd: Command) -> CmdResult {
    let p = Proposal {
        at_ms,
        cmds: vec![cmd],
    };
    st.apply_proposal(&lid(index), &p).remove(0)
}

fn qp_kind(job: &str, conn_id: u64, nic: &str, closed: bool) -> Report {
    Report::Qp(QpReport {
        job: job.into(),
        rank: 0,
        conn_id,
        nic: nic.into(),
        peer_host: "h9".into(),
        peer_rank: 1,
        rail: 0,
        moved: nic != "rail0",
        closed,
        at_unix_ns: 0,
    })
}

fn qp_event(st: &mut ClusterState, index: u64, seq: u64, kind: Report) -> CmdResult {
    one(
        st,
        index,
        index,
        Command::AgentEvents {
            host: "h0".into(),
            events: vec![AgentEvent { seq, report: kind }],
        },
    )
}

mod agent_events;
mod clock;
mod hosts;
mod intents;
mod requests;
mod reroute;
mod wire;
