//! Raft traffic between supervisors over gRPC (`RaftPeer` service).
//!
//! Requests and replies are openraft's own serde types in bincode inside a
//! `Blob`. A connection is opened lazily per peer and re-established by tonic
//! after failures; transport failures are reported to openraft as
//! `Unreachable` (so it backs off) and every call is bounded by openraft's
//! hard TTL.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Timeout, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use proto::v1::raft_peer_client::RaftPeerClient;
use proto::v1::Blob;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::Channel;

use crate::election_gate::VoteRefusals;
use crate::model::{NodeId, TypeConfig};
use crate::service::raft_check;

/// Connect timeout for peer channels.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

pub use pki::ClientTls;

/// Builds a lazily connecting channel to `addr` (`IP:port`).
pub fn channel(addr: &str, tls: &ClientTls) -> Result<Channel, tonic::transport::Error> {
    Ok(tls
        .endpoint(addr)?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5))
        .connect_lazy())
}

/// A `RaftPeer` client with railguard's message limits.
pub fn peer_client(
    addr: &str,
    tls: &ClientTls,
) -> Result<RaftPeerClient<Channel>, tonic::transport::Error> {
    Ok(RaftPeerClient::new(channel(addr, tls)?)
        .max_decoding_message_size(proto::MAX_PEER_MESSAGE_BYTES)
        .max_encoding_message_size(proto::MAX_PEER_MESSAGE_BYTES))
}

/// Whether a failed call's status shows the request never left this
/// process (the connection could not be made), so trying elsewhere cannot
/// duplicate a write. Errors the supervisor produced itself carry an error
/// kind header and are never "never sent".
pub fn never_sent(s: &tonic::Status) -> bool {
    let m = s.message();
    s.metadata().get(crate::api::ERROR_KIND_HEADER).is_none()
        && (m.contains("tcp connect error")
            || m.contains("error trying to connect")
            || m.contains("Connection refused"))
}

/// Encodes a peer message body.
pub fn encode<T: Serialize>(v: &T) -> Result<Blob, bincode::Error> {
    Ok(Blob {
        body: bincode::serialize(v)?,
    })
}

/// Decodes a peer message body.
pub fn decode<T: DeserializeOwned>(b: &Blob) -> Result<T, bincode::Error> {
    bincode::deserialize(&b.body)
}

/// Most peer addresses a [`PeerClients`] keeps (members come and go; the
/// cache starts afresh when full).
const MAX_CACHED_PEERS: usize = 64;

/// One lazily connecting channel per peer address, shared by every Raft
/// RPC and by forwarding. openraft asks its network factory for a new
/// client per replication stream, per heartbeat round and per linearizable
/// read; each would otherwise dial afresh, and with mutual TLS shake hands
/// afresh (found by profiling `bench raft-commit`: the leader spent a
/// fifth of its CPU dialling its followers). HTTP/2 multiplexes the calls
/// over the one connection. A peer is dialled again once this supervisor's
/// client certificate was reloaded (SIGHUP), so the peer sees the new one.
#[derive(Clone)]
pub struct PeerClients {
    tls: ClientTls,
    /// Per address: the certificate generation it was dialled with, and
    /// the client.
    cache: Arc<Mutex<HashMap<String, (u64, PeerClient)>>>,
}

type PeerClient = RaftPeerClient<Channel>;

impl PeerClients {
    pub fn new(tls: ClientTls) -> Self {
        Self {
            tls,
            cache: Arc::default(),
        }
    }

    /// The client certificate generation new channels are dialled with.
    pub fn generation(&self) -> u64 {
        self.tls.generation()
    }

    /// The client for `addr`, dialled with the current certificate.
    pub fn get(&self, addr: &str) -> Result<RaftPeerClient<Channel>, tonic::transport::Error> {
        let generation = self.tls.generation();
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((g, c)) = cache.get(addr) {
            if *g == generation {
                return Ok(c.clone());
            }
        }
        let c = peer_client(addr, &self.tls)?;
        if cache.len() >= MAX_CACHED_PEERS {
            cache.clear();
        }
        cache.insert(addr.to_owned(), (generation, c.clone()));
        Ok(c)
    }
}

/// Creates [`PeerNetwork`]s for openraft, over [`PeerClients`].
#[derive(Clone)]
pub struct PeerNetworkFactory {
    pub clients: PeerClients,
    /// Where a peer's refusal of this node's vote request is recorded.
    pub refusals: Arc<VoteRefusals>,
}

impl RaftNetworkFactory<TypeConfig> for PeerNetworkFactory {
    type Network = PeerNetwork;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        PeerNetwork {
            target,
            addr: node.addr.clone(),
            clients: self.clients.clone(),
            refusals: self.refusals.clone(),
            generation: self.clients.generation(),
            client: self.clients.get(&node.addr).map_err(|e| e.to_string()),
        }
    }
}

/// One peer, as openraft sees it: the shared channel to its address.
pub struct PeerNetwork {
    target: NodeId,
    addr: String,
    clients: PeerClients,
    refusals: Arc<VoteRefusals>,
    generation: u64,
    client: Result<RaftPeerClient<Channel>, String>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Msg(String);

impl PeerNetwork {
    async fn call<Req, Resp, E>(
        &mut self,
        which: Rpc,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        if self.clients.generation() != self.generation {
            self.generation = self.clients.generation();
            self.client = self.clients.get(&self.addr).map_err(|e| e.to_string());
        }
        let client = match &mut self.client {
            Ok(c) => c,
            Err(e) => return Err(RPCError::Unreachable(Unreachable::new(&Msg(e.clone())))),
        };
        let blob = encode(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let ttl = option.hard_ttl();
        let fut = async {
            match which {
                Rpc::Append => client.append_entries(blob).await,
                Rpc::Vote => client.vote(blob).await,
                Rpc::Snapshot => client.install_snapshot(blob).await,
            }
        };
        let reply = match tokio::time::timeout(ttl, fut).await {
            Err(_) => {
                return Err(RPCError::Timeout(Timeout {
                    action: which.action(),
                    id: 0,
                    target: self.target,
                    timeout: ttl,
                }))
            }
            Ok(Err(status)) => {
                let e = Msg(format!("{}: {}", status.code(), status.message()));
                // The peer does not take this node as a candidate (not a
                // voter of its committed membership, or not a member).
                if matches!(which, Rpc::Vote)
                    && matches!(
                        status.code(),
                        tonic::Code::FailedPrecondition | tonic::Code::PermissionDenied
                    )
                {
                    self.refusals.record();
                }
                return Err(match status.code() {
                    tonic::Code::Unavailable | tonic::Code::Cancelled => {
                        RPCError::Unreachable(Unreachable::new(&e))
                    }
                    _ => RPCError::Network(NetworkError::new(&e)),
                });
            }
            Ok(Ok(r)) => r.into_inner(),
        };
        let res: Result<Resp, RaftError<NodeId, E>> =
            decode(&reply).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        res.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

#[derive(Clone, Copy)]
enum Rpc {
    Append,
    Vote,
    Snapshot,
}

impl Rpc {
    fn action(self) -> openraft::RPCTypes {
        match self {
            Rpc::Append => openraft::RPCTypes::AppendEntries,
            Rpc::Vote => openraft::RPCTypes::Vote,
            Rpc::Snapshot => openraft::RPCTypes::InstallSnapshot,
        }
    }
}

impl RaftNetwork<TypeConfig> for PeerNetwork {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let r = self.call(Rpc::Append, &rpc, &option).await?;
        raft_check::append_answer(&r).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        Ok(r)
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        let r = self.call(Rpc::Snapshot, &rpc, &option).await?;
        raft_check::snapshot_answer(&r).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        Ok(r)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let r = self.call(Rpc::Vote, &rpc, &option).await?;
        raft_check::vote_answer(&r).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        Ok(r)
    }
}
