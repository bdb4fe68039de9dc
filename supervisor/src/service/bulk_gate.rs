//! A bound on the Raft RPCs that carry bulk: AppendEntries and
//! InstallSnapshot messages may each be up to
//! [`proto::MAX_PEER_MESSAGE_BYTES`], and tonic reads a whole message into
//! memory before its handler runs. Peers are exempt from the per-identity
//! connection caps (they must always get through), so without a bound 24
//! concurrent 63 MiB AppendEntries streams took a follower from 86 MB to
//! 1.6 GB. [`BulkGate`] admits [`MAX_BULK_RPCS`] such calls at a time,
//! before their bodies are read; the others wait, their bodies held back
//! by HTTP/2 flow control. Votes, forwards and control calls are not
//! counted, so a flood of appends cannot hold back an election.
//!
//! Before anything, the gate refuses a caller whose certificate is not a
//! supervisor's (`PERMISSION_DENIED`, body unread): the handlers check
//! membership only after tonic has read the body, so an agent could
//! otherwise send 64 MiB bodies to any Raft method, or take the permits
//! and stall the heartbeats (openraft's heartbeats are AppendEntries).
//!
//! A waiting call is refused (`RESOURCE_EXHAUSTED`) after
//! [`ADMIT_WITHIN`]: the streams of one connection share its flow-control
//! window, so calls waiting unread on a connection can take all of it and
//! starve the admitted calls of the same connection, which could then
//! never finish. Refused, their unread data is given back. An admitted
//! call holds its permit at most [`HOLD_AT_MOST`].

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tonic::codegen::{http, Context, Future, Pin, Poll, Service};
use tonic::server::NamedService;

/// Bulk Raft calls read and handled at once, across every connection:
/// openraft sends one AppendEntries at a time to each member, so this
/// leaves room for six peers and their snapshots, and bounds what the
/// bodies take to this many times [`proto::MAX_PEER_MESSAGE_BYTES`].
pub const MAX_BULK_RPCS: usize = 8;

/// How long a bulk call may wait for a permit: openraft's deadline for a
/// snapshot chunk (5 s; an AppendEntries' is far shorter, its leader has
/// given up on it long before).
pub const ADMIT_WITHIN: Duration = Duration::from_secs(5);

/// How long an admitted bulk call may take, its body's reading included:
/// twice a snapshot chunk's deadline.
pub const HOLD_AT_MOST: Duration = Duration::from_secs(10);

/// Whether a gRPC path is a call that carries bulk.
fn is_bulk(path: &str) -> bool {
    path.ends_with("/AppendEntries") || path.ends_with("/InstallSnapshot")
}

/// Wraps a gRPC service: its bulk calls ([`is_bulk`]) wait up to
/// `admit_within` for one of the gate's permits before their bodies are
/// read, and hold it until answered.
#[derive(Clone)]
pub struct BulkGate<S> {
    inner: S,
    permits: Arc<Semaphore>,
    size: usize,
    admit_within: Duration,
}

impl<S> BulkGate<S> {
    pub fn new(inner: S, permits: usize, admit_within: Duration) -> BulkGate<S> {
        BulkGate {
            inner,
            permits: Arc::new(Semaphore::new(permits)),
            size: permits,
            admit_within,
        }
    }
}

impl<S: NamedService> NamedService for BulkGate<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, R> Service<http::Request<B>> for BulkGate<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
    R: Default,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        // Mutual TLS puts the peer on every request; without it
        // (`--insecure`) nobody is authenticated anyway.
        if let Some(peer) = req.extensions().get::<pki::PeerInfo>() {
            if !peer.identity.is_server() {
                let refused = tonic::Status::permission_denied(format!(
                    "{} may not send Raft calls",
                    peer.identity
                ));
                return Box::pin(async move { Ok(refused.into_http()) });
            }
        }
        // The service made ready is the one to call; a fresh clone stays.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        if !is_bulk(req.uri().path()) {
            return Box::pin(inner.call(req));
        }
        let (permits, size, within) = (self.permits.clone(), self.size, self.admit_within);
        Box::pin(async move {
            // The semaphore is never closed: `Err` is the timeout.
            let Ok(_permit) = tokio::time::timeout(within, permits.acquire_owned()).await else {
                tracing::warn!(
                    path = req.uri().path(),
                    waited_ms = within.as_millis() as u64,
                    "bulk Raft call refused: every permit busy"
                );
                return Ok(tonic::Status::resource_exhausted(format!(
                    "{size} bulk Raft calls already in progress for {within:?}; try again"
                ))
                .into_http());
            };
            match tokio::time::timeout(HOLD_AT_MOST, inner.call(req)).await {
                Ok(answer) => answer,
                Err(_) => Ok(tonic::Status::deadline_exceeded(format!(
                    "a bulk Raft call took over {HOLD_AT_MOST:?}"
                ))
                .into_http()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    use tokio::sync::Notify;

    /// A service that counts the calls inside it and answers each once
    /// released.
    #[derive(Clone)]
    struct Held {
        inside: Arc<AtomicUsize>,
        release: Arc<Notify>,
    }

    impl Held {
        fn new() -> Held {
            Held {
                inside: Arc::new(AtomicUsize::new(0)),
                release: Arc::new(Notify::new()),
            }
        }
    }

    impl Service<http::Request<()>> for Held {
        type Response = http::Response<()>;
        type Error = std::convert::Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            let (inside, release) = (self.inside.clone(), self.release.clone());
            Box::pin(async move {
                inside.fetch_add(1, Ordering::SeqCst);
                release.notified().await;
                inside.fetch_sub(1, Ordering::SeqCst);
                Ok(http::Response::new(()))
            })
        }
    }

    fn request(method: &str) -> http::Request<()> {
        http::Request::builder()
            .uri(format!("/railguard.v1.RaftPeer/{method}"))
            .body(())
            .unwrap()
    }

    fn from(identity: pki::Identity, method: &str) -> http::Request<()> {
        let mut r = request(method);
        r.extensions_mut().insert(pki::PeerInfo {
            identity,
            serial: "01".parse().unwrap(),
            not_after: std::time::SystemTime::now(),
            remote_addr: "127.0.0.1:1".parse().unwrap(),
        });
        r
    }

    #[tokio::test]
    async fn only_supervisors_get_in_and_before_any_permit() {
        let held = Held::new();
        let mut gate = BulkGate::new(held.clone(), 1, Duration::from_secs(60));
        let agent = pki::Identity::agent("h1").unwrap();
        for m in ["AppendEntries", "Vote", "Forward"] {
            let answer = gate.call(from(agent.clone(), m)).await.unwrap();
            let status = tonic::Status::from_header_map(answer.headers()).unwrap();
            assert_eq!(status.code(), tonic::Code::PermissionDenied, "{m}");
        }
        assert_eq!(held.inside.load(Ordering::SeqCst), 0);
        // A member takes the one permit: the agents took none.
        let call = tokio::spawn(gate.call(from(pki::Identity::supervisor(2), "AppendEntries")));
        settle().await;
        assert_eq!(held.inside.load(Ordering::SeqCst), 1);
        held.release.notify_one();
        call.await.unwrap().unwrap();
    }

    async fn settle() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    #[tokio::test]
    async fn bulk_calls_wait_for_a_permit_and_votes_do_not() {
        let held = Held::new();
        let mut gate = BulkGate::new(held.clone(), 2, Duration::from_secs(60));
        let mut calls = Vec::new();
        for m in ["AppendEntries", "InstallSnapshot", "AppendEntries"] {
            calls.push(tokio::spawn(gate.call(request(m))));
        }
        settle().await;
        assert_eq!(held.inside.load(Ordering::SeqCst), 2, "the third waits");
        // A vote and a forward pass the full gate.
        for m in ["Vote", "Forward"] {
            calls.push(tokio::spawn(gate.call(request(m))));
        }
        settle().await;
        assert_eq!(held.inside.load(Ordering::SeqCst), 4);
        // One answered: the waiting append goes in.
        held.release.notify_one();
        settle().await;
        assert_eq!(held.inside.load(Ordering::SeqCst), 4);
        for _ in 0..4 {
            held.release.notify_one();
            settle().await;
        }
        for c in calls {
            tokio::time::timeout(Duration::from_secs(5), c)
                .await
                .expect("every call answered")
                .unwrap()
                .unwrap();
        }
        assert_eq!(held.inside.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_call_that_waits_too_long_is_refused_and_frees_nothing_it_did_not_hold() {
        let held = Held::new();
        let mut gate = BulkGate::new(held.clone(), 1, Duration::from_millis(100));
        let first = tokio::spawn(gate.call(request("AppendEntries")));
        settle().await;
        let refused = gate.call(request("AppendEntries")).await.unwrap();
        let status = tonic::Status::from_header_map(refused.headers()).unwrap();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
        assert_eq!(
            held.inside.load(Ordering::SeqCst),
            1,
            "the first still holds"
        );
        held.release.notify_one();
        first.await.unwrap().unwrap();
        // Its permit is back: the next is admitted at once.
        let next = tokio::spawn(gate.call(request("InstallSnapshot")));
        settle().await;
        assert_eq!(held.inside.load(Ordering::SeqCst), 1);
        held.release.notify_one();
        next.await.unwrap().unwrap();
    }
}
