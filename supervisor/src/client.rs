//! Client side of the admin API, shared by the `railguard` CLI and the chaos
//! suite: tries each configured supervisor until one answers, and never
//! retries a write whose outcome is unknown.

use std::time::Duration;

use proto::v1::admin_client::AdminClient as Grpc;
use proto::v1::{Blob, FollowRequest};
use tonic::transport::Channel;

use crate::api::{AdminCall, AdminReply, AdminRequest, ApiError, ErrorKind};
use crate::model::ClusterEvent;

/// Default time limit of one call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// An admin client over one or more supervisor addresses.
#[derive(Clone)]
pub struct AdminClient {
    targets: Vec<(String, Grpc<Channel>)>,
    actor: String,
    timeout: Duration,
}

impl AdminClient {
    /// `addrs` are `IP:port` of supervisors; `actor` is recorded with writes.
    pub fn new(addrs: &[String], actor: &str, timeout: Duration) -> Result<Self, ApiError> {
        if addrs.is_empty() {
            return Err(ApiError::invalid("no supervisor address given"));
        }
        let mut targets = Vec::new();
        for a in addrs {
            if a.parse::<std::net::SocketAddr>().is_err() {
                return Err(ApiError::invalid(format!(
                    "supervisor address {a:?} is not IP:port"
                )));
            }
            let ch = crate::network::channel(a)
                .map_err(|e| ApiError::invalid(format!("supervisor address {a:?}: {e}")))?;
            let g = Grpc::new(ch)
                .max_decoding_message_size(proto::MAX_ADMIN_MESSAGE_BYTES)
                .max_encoding_message_size(proto::MAX_ADMIN_MESSAGE_BYTES);
            targets.push((a.clone(), g));
        }
        Ok(Self {
            targets,
            actor: actor.into(),
            timeout,
        })
    }

    /// Sends one request, trying supervisors in order while they are
    /// unreachable or answer `Unavailable`.
    pub async fn call(&self, request: AdminRequest, stale: bool) -> Result<AdminReply, ApiError> {
        let is_write = request.is_write();
        let call = AdminCall {
            actor: self.actor.clone(),
            stale,
            forwarded: false,
            request,
        };
        let body = serde_json::to_vec(&call).map_err(|e| ApiError::internal(e.to_string()))?;
        let mut last = ApiError::unavailable("no supervisor answered");
        for (addr, client) in &self.targets {
            let mut c = client.clone();
            let fut = c.call(Blob { body: body.clone() });
            match tokio::time::timeout(self.timeout, fut).await {
                Err(_) if is_write => {
                    return Err(ApiError::unknown(format!(
                        "no answer from {addr} within {:?}; the write's outcome is unknown",
                        self.timeout
                    )))
                }
                Err(_) => last = ApiError::unavailable(format!("{addr}: timed out")),
                Ok(Ok(r)) => {
                    return serde_json::from_slice(&r.get_ref().body).map_err(|e| {
                        ApiError::internal(format!("malformed reply from {addr}: {e}"))
                    })
                }
                Ok(Err(s)) if crate::network::never_sent(&s) => {
                    last = ApiError::unavailable(format!("{addr} unreachable: {}", s.message()))
                }
                Ok(Err(s)) => {
                    let e = ApiError::from(s);
                    if e.kind == ErrorKind::Unavailable {
                        last = ApiError::unavailable(format!("{addr}: {}", e.message));
                        continue;
                    }
                    if e.kind == ErrorKind::Unknown && !is_write {
                        last = ApiError::unavailable(format!("{addr}: {}", e.message));
                        continue;
                    }
                    return Err(e);
                }
            }
        }
        Err(last)
    }

    /// Follows the cluster event log from `since`; `on_event` is called for
    /// each event until it returns false or the stream ends.
    pub async fn follow(
        &self,
        since: u64,
        mut on_event: impl FnMut(ClusterEvent) -> bool,
    ) -> Result<(), ApiError> {
        let mut last = ApiError::unavailable("no supervisor answered");
        for (addr, client) in &self.targets {
            let mut c = client.clone();
            match c.follow(FollowRequest { since }).await {
                Err(s) => {
                    last = ApiError::unavailable(format!("{addr}: {}", s.message()));
                    continue;
                }
                Ok(stream) => {
                    let mut stream = stream.into_inner();
                    while let Some(item) = stream.message().await.map_err(ApiError::from)? {
                        let ev: ClusterEvent = serde_json::from_slice(&item.body)
                            .map_err(|e| ApiError::internal(format!("malformed event: {e}")))?;
                        if !on_event(ev) {
                            return Ok(());
                        }
                    }
                    return Ok(());
                }
            }
        }
        Err(last)
    }
}
