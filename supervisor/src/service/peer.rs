//! `RaftPeer`: Raft RPCs from other supervisors, admin calls forwarded by
//! followers, and the election control used by leadership transfer.

use std::sync::Arc;
use std::time::Duration;

use proto::v1::raft_peer_server::RaftPeer;
use proto::v1::Blob;
use serde::Serialize;
use tonic::{Request, Response, Status};

use crate::api::AdminCall;
use crate::leader::services::Leader;
use crate::network::{decode, encode};
use crate::node::Supervisor;
use crate::service::auth::require_member;
use crate::service::raft_check::{self, RaftWireError};
use crate::service::transfer::{Control, MAX_PAUSE_MS};

/// The `RaftPeer` gRPC service.
pub struct PeerService {
    /// This node.
    pub sup: Arc<Supervisor>,
    /// The leader's memory, for forwarded admin calls.
    pub leader: Arc<Leader>,
}

impl PeerService {
    /// The service over `leader` and its node.
    pub fn new(leader: Arc<Leader>) -> Self {
        Self {
            sup: leader.node.clone(),
            leader,
        }
    }
}

fn bad_request(e: bincode::Error) -> Status {
    Status::invalid_argument(format!("malformed peer message: {e}"))
}

/// A Raft request [`raft_check`] refused: openraft never sees it.
fn refused(e: RaftWireError) -> Status {
    tracing::warn!(error = %e, "Raft request refused");
    match e {
        RaftWireError::Malformed(_) => Status::invalid_argument(e.to_string()),
        RaftWireError::Impersonation { .. } => Status::permission_denied(e.to_string()),
    }
}

fn reply<T: Serialize>(v: &T) -> Result<Response<Blob>, Status> {
    encode(v)
        .map(Response::new)
        .map_err(|e| Status::internal(format!("encode reply: {e}")))
}

#[tonic::async_trait]
impl RaftPeer for PeerService {
    async fn append_entries(&self, req: Request<Blob>) -> Result<Response<Blob>, Status> {
        let sender = require_member(&self.sup, &req, "send Raft AppendEntries")?;
        let rpc = decode(req.get_ref()).map_err(bad_request)?;
        raft_check::append(&rpc, sender).map_err(refused)?;
        reply(&self.sup.raft.append_entries(rpc).await)
    }

    async fn vote(&self, req: Request<Blob>) -> Result<Response<Blob>, Status> {
        let sender = require_member(&self.sup, &req, "send Raft Vote")?;
        let rpc = decode(req.get_ref()).map_err(bad_request)?;
        raft_check::vote(&rpc, sender).map_err(refused)?;
        let candidate = rpc.vote.leader_id().voted_for();
        let last = rpc.last_log_id.map(|l| l.index);
        if let Some(c) = candidate.filter(|c| !self.sup.hears_candidate(*c, last)) {
            tracing::debug!(
                candidate = c,
                "vote request refused: not a voter of the applied membership"
            );
            return Err(Status::failed_precondition(format!(
                "supervisor {c} is not a voter of supervisor {}'s committed membership \
                 and not ahead of it in the log",
                self.sup.id
            )));
        }
        reply(&self.sup.raft.vote(rpc).await)
    }

    async fn install_snapshot(&self, req: Request<Blob>) -> Result<Response<Blob>, Status> {
        let sender = require_member(&self.sup, &req, "send Raft InstallSnapshot")?;
        let rpc = decode(req.get_ref()).map_err(bad_request)?;
        raft_check::snapshot(&rpc, sender).map_err(refused)?;
        reply(&self.sup.raft.install_snapshot(rpc).await)
    }

    /// A follower's admin call: the follower checked the caller's
    /// certificate and role and set the actor from it; only members may
    /// forward, so the actor is trusted as a member's word.
    async fn forward(&self, req: Request<Blob>) -> Result<Response<Blob>, Status> {
        require_member(&self.sup, &req, "forward admin calls")?;
        let mut call: AdminCall = serde_json::from_slice(&req.get_ref().body)
            .map_err(|e| Status::invalid_argument(format!("malformed forwarded call: {e}")))?;
        call.forwarded = true;
        let res = crate::service::admin::handle(&self.leader, call).await;
        let body = serde_json::to_vec(&res).map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(Blob { body }))
    }

    async fn control(&self, req: Request<Blob>) -> Result<Response<Blob>, Status> {
        require_member(&self.sup, &req, "control elections")?;
        let c: Control = decode(req.get_ref()).map_err(bad_request)?;
        tracing::info!(control = ?c, "election control");
        match c {
            Control::PauseElection { ms } => {
                let ms = ms.min(MAX_PAUSE_MS);
                self.sup.election_gate.hold(Duration::from_millis(ms));
            }
            Control::ResumeElection => self.sup.election_gate.release(),
            Control::Elect => {
                self.sup
                    .raft
                    .trigger()
                    .elect()
                    .await
                    .map_err(|e| Status::internal(e.to_string()))?;
            }
        }
        reply(&())
    }
}
