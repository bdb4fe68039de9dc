//! The simulated network between supervisors: every Raft RPC is handed
//! straight to the target node's handler, after a seeded delay, unless
//! the switchboard drops it (a cut direction, a crashed target, random
//! loss). A reply crosses the same switchboard back, so a cut in the
//! reply's direction loses an answer to a request that took effect — the
//! asymmetric partition.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use openraft::error::{InstallSnapshotError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Raft};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::SimConfig;

type NodeId = u64;

/// The switchboard's state.
pub struct Board {
    /// Running nodes.
    pub rafts: BTreeMap<NodeId, Raft<SimConfig>>,
    /// Cut directions (from, to).
    pub cut: BTreeSet<(NodeId, NodeId)>,
    /// Share of messages lost, in percent.
    pub loss_pct: u32,
    /// Longest one-way delay.
    pub max_delay: Duration,
    rng: StdRng,
    /// Messages delivered and lost, for the report.
    pub delivered: u64,
    pub lost: u64,
}

/// The shared switchboard.
#[derive(Clone)]
pub struct Net(Arc<Mutex<Board>>);

impl Net {
    pub fn new(seed: u64) -> Net {
        Net(Arc::new(Mutex::new(Board {
            rafts: BTreeMap::new(),
            cut: BTreeSet::new(),
            loss_pct: 0,
            max_delay: Duration::from_millis(5),
            rng: StdRng::seed_from_u64(seed ^ 0x6e65_7477),
            delivered: 0,
            lost: 0,
        })))
    }

    pub fn board(&self) -> MutexGuard<'_, Board> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The delay of one message, or `None` when it is lost on the way.
    fn hop(&self, from: NodeId, to: NodeId) -> Option<Duration> {
        let mut b = self.board();
        let lost = b.cut.contains(&(from, to))
            || !b.rafts.contains_key(&to)
            || (b.loss_pct > 0 && b.rng.gen_range(0..100) < b.loss_pct);
        if lost {
            b.lost += 1;
            return None;
        }
        b.delivered += 1;
        let max = b.max_delay.as_micros().max(1) as u64;
        Some(Duration::from_micros(b.rng.gen_range(0..=max)))
    }

    /// The target's handle, if the message gets there.
    async fn deliver(&self, from: NodeId, to: NodeId) -> Option<Raft<SimConfig>> {
        let delay = self.hop(from, to)?;
        tokio::time::sleep(delay).await;
        // Crashed (or cut) while the message was on its way.
        let b = self.board();
        if b.cut.contains(&(from, to)) {
            return None;
        }
        b.rafts.get(&to).cloned()
    }

    /// Whether the reply gets back.
    async fn reply(&self, from: NodeId, to: NodeId) -> bool {
        match self.hop(to, from) {
            Some(d) => {
                tokio::time::sleep(d).await;
                true
            }
            None => false,
        }
    }
}

fn unreachable<E: std::error::Error>() -> RPCError<NodeId, BasicNode, E> {
    RPCError::Unreachable(Unreachable::new(&std::io::Error::other(
        "lost by the simulated network",
    )))
}

/// One node's view of the network.
pub struct Factory {
    pub net: Net,
    pub me: NodeId,
}

impl RaftNetworkFactory<SimConfig> for Factory {
    type Network = Client;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> Client {
        Client {
            net: self.net.clone(),
            from: self.me,
            to: target,
        }
    }
}

/// A connection from one node to another.
pub struct Client {
    net: Net,
    from: NodeId,
    to: NodeId,
}

impl Client {
    /// Delivers one RPC to the target's handler `f` and its answer back,
    /// either way through the switchboard.
    async fn call<R, E, F, Fut>(&self, f: F) -> Result<R, RPCError<NodeId, BasicNode, E>>
    where
        E: std::error::Error,
        F: FnOnce(Raft<SimConfig>) -> Fut,
        Fut: std::future::Future<Output = Result<R, E>>,
    {
        let Some(raft) = self.net.deliver(self.from, self.to).await else {
            return Err(unreachable());
        };
        let r = f(raft)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.to, e)))?;
        if !self.net.reply(self.from, self.to).await {
            return Err(unreachable());
        }
        Ok(r)
    }
}

impl RaftNetwork<SimConfig> for Client {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<SimConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.call(|raft| async move { raft.append_entries(rpc).await })
            .await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<SimConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.call(|raft| async move { raft.install_snapshot(rpc).await })
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.call(|raft| async move { raft.vote(rpc).await }).await
    }
}
