//! The gRPC services one supervisor serves on its listen address.

pub mod admin;
pub mod agent;
pub mod auth;
pub mod bulk_gate;
pub mod peer;
pub mod quota;
pub mod raft_check;
pub mod transfer;

use std::net::SocketAddr;
use std::sync::Arc;

use proto::v1::admin_server::AdminServer;
use proto::v1::agent_server::AgentServer;
use proto::v1::raft_peer_server::RaftPeerServer;

use crate::leader::services::Leader;

/// Reset streams not yet accepted that one connection may hold.
const MAX_PENDING_RESETS: usize = 256;

/// Serves `Admin`, `Agent` and `RaftPeer` on `listener` until `shutdown`
/// resolves: with mutual TLS when `tls` is given (every connection
/// presents a certificate of the cluster CA; handlers read the caller's
/// identity from it, [`auth`]), plain text otherwise (`--insecure`).
/// Message sizes are bounded per service, and the Raft calls that carry
/// bulk by [`bulk_gate`].
pub async fn serve(
    leader: Arc<Leader>,
    listener: tokio::net::TcpListener,
    tls: Option<pki::ServerTls>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let sup = leader.node.clone();
    let addr: Option<SocketAddr> = listener.local_addr().ok();
    tracing::info!(addr = ?addr, id = sup.id, mtls = tls.is_some(), "serving gRPC");
    let router = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .concurrency_limit_per_connection(1024)
        // A connection whose peer vanished (no FIN: a pulled cable, a
        // half-open flood) is closed when it stops answering pings.
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(10)))
        // Raft cancels every RPC that outlives its deadline (a heartbeat's
        // is 50 ms), and each cancel resets a stream. h2's default of 20
        // reset streams not yet accepted closes the whole connection
        // (heartbeats, votes and all) when a slow peer catches up; 256
        // still bounds a rapid-reset flood from a certificate holder.
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_RESETS))
        .add_service(bulk_gate::BulkGate::new(
            RaftPeerServer::new(peer::PeerService::new(leader.clone()))
                .max_decoding_message_size(proto::MAX_PEER_MESSAGE_BYTES)
                .max_encoding_message_size(proto::MAX_PEER_MESSAGE_BYTES),
            bulk_gate::MAX_BULK_RPCS,
            bulk_gate::ADMIT_WITHIN,
        ))
        .add_service(
            AdminServer::new(admin::AdminService {
                quota: quota::WriteQuota::new(leader.node.config.admin_write_rate),
                leader: leader.clone(),
            })
            .max_decoding_message_size(proto::MAX_ADMIN_MESSAGE_BYTES)
            .max_encoding_message_size(proto::MAX_ADMIN_MESSAGE_BYTES),
        )
        .add_service(
            AgentServer::new(agent::AgentService { sup, leader })
                .max_decoding_message_size(proto::MAX_AGENT_MESSAGE_BYTES),
        );
    match tls {
        // The accept stream sets TCP_NODELAY itself.
        Some(tls) => {
            router
                .serve_with_incoming_shutdown(pki::incoming(listener, tls), shutdown)
                .await
        }
        None => {
            // With our own listener tonic cannot set TCP_NODELAY; without it small
            // replies wait for delayed ACKs (~40 ms stalls).
            let incoming = tokio_stream::StreamExt::map(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                |conn| {
                    conn.inspect(|s| {
                        if let Err(e) = s.set_nodelay(true) {
                            tracing::warn!(error = %e, "cannot set TCP_NODELAY");
                        }
                    })
                },
            );
            router
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await
        }
    }
}
