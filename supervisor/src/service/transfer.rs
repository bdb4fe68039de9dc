//! Leadership transfer: the election control messages supervisors send each
//! other ([`Control`], served by `RaftPeer.Control`) and the admin side
//! that uses them ([`transfer_leader`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::api::{AdminReply, ApiError, ErrorKind};
use crate::network::encode;
use crate::node::Supervisor;

/// Election control messages (leadership transfer).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub enum Control {
    /// Do not start elections for this long (re-enabled automatically, so a
    /// transfer interrupted by a crash cannot leave a node unable to elect).
    PauseElection { ms: u64 },
    /// Allow elections again now.
    ResumeElection,
    /// Start an election now.
    Elect,
}

/// Longest election pause a peer accepts.
pub const MAX_PAUSE_MS: u64 = 10_000;

/// Hands leadership to voter `to`: pauses elections on the other voters,
/// stops this leader's heartbeats, asks `to` to campaign, and waits (bounded)
/// until it leads. Elections are re-enabled everywhere on every path.
pub async fn transfer_leader(sup: &Arc<Supervisor>, to: u64) -> Result<AdminReply, ApiError> {
    if to == sup.id {
        return Ok(AdminReply::Committed {
            log_index: 0,
            detail: format!("supervisor {to} is already the leader"),
        });
    }
    let members = sup.members();
    let target = members.iter().find(|m| m.id == to).ok_or_else(|| {
        ApiError::new(
            ErrorKind::NotFound,
            format!("supervisor {to} is not a member"),
        )
    })?;
    if !target.voter {
        return Err(ApiError::new(
            ErrorKind::FailedPrecondition,
            format!("supervisor {to} is a learner; promote it first"),
        ));
    }
    // Wait (bounded) until the target has the whole log.
    let caught_up_by = Instant::now() + Duration::from_secs(2);
    loop {
        let last = sup.raft.metrics().borrow().last_log_index;
        let matched = sup
            .members()
            .into_iter()
            .find(|m| m.id == to)
            .and_then(|m| m.matched);
        if matched >= last {
            break;
        }
        if Instant::now() > caught_up_by {
            return Err(ApiError::new(
                ErrorKind::FailedPrecondition,
                format!("supervisor {to} has not caught up with the log; is it running?"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let others: Vec<String> = members
        .iter()
        .filter(|m| m.voter && m.id != to && m.id != sup.id)
        .map(|m| m.addr.clone())
        .collect();
    let control = |addr: String, c: Control| {
        let sup = sup.clone();
        async move {
            let blob = encode(&c).map_err(|e| ApiError::internal(e.to_string()))?;
            let mut client = sup.peer(&addr)?;
            tokio::time::timeout(Duration::from_secs(1), client.control(blob))
                .await
                .map_err(|_| ApiError::unavailable(format!("{addr} did not answer")))?
                .map_err(ApiError::from)
                .map(|_| ())
        }
    };
    for a in &others {
        // A follower that cannot be paused may win instead; we check below.
        let _ = control(a.clone(), Control::PauseElection { ms: 4_000 }).await;
    }
    sup.election_gate.hold(Duration::from_secs(4));
    sup.raft.runtime_config().heartbeat(false);
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut result = Err(ApiError::unavailable(format!(
        "supervisor {to} did not become leader within 3 s"
    )));
    while Instant::now() < deadline {
        let _ = control(target.addr.clone(), Control::Elect).await;
        tokio::time::sleep(Duration::from_millis(150)).await;
        if sup.leader() == Some(to) {
            result = Ok(AdminReply::Committed {
                log_index: 0,
                detail: format!("leadership transferred to supervisor {to}"),
            });
            break;
        }
    }
    sup.raft.runtime_config().heartbeat(true);
    sup.election_gate.release();
    for a in others {
        let _ = control(a, Control::ResumeElection).await;
    }
    result
}
