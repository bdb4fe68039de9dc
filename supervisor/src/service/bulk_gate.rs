//! A bound on the Raft RPCs that carry bulk: AppendEntries and
//! InstallSnapshot messages may each be up to
//! [`proto::MAX_PEER_MESSAGE_BYTES`], and tonic reads a whole message into
//! memory before its handler runs. Peers are exempt from the per-identity
//! connection caps (they must always get through), so without a bound 24
//! concurrent 63 MiB AppendEntries streams took a follower from 86 MB to
//! 1.6 GB. [`BulkGate`] admits [`MAX_BULK_RPCS`] such calls at a time,
//! before their bodies are read; the others wait, their bodies held back
//! by HTTP/2 flow control. Votes, forwards and control calls pass
//! ungated, so a flood of appends cannot hold back an election.

use std::sync::Arc;

use tokio::sync::Semaphore;
use tonic::codegen::{http, Context, Future, Pin, Poll, Service};
use tonic::server::NamedService;

/// Bulk Raft calls read and handled at once, across every connection:
/// openraft sends one AppendEntries at a time to each member, so this
/// leaves room for six peers and their snapshots, and bounds what the
/// bodies take to this many times [`proto::MAX_PEER_MESSAGE_BYTES`].
pub const MAX_BULK_RPCS: usize = 8;

/// Whether a gRPC path is a call that carries bulk.
fn is_bulk(path: &str) -> bool {
    path.ends_with("/AppendEntries") || path.ends_with("/InstallSnapshot")
}

/// Wraps a gRPC service: its bulk calls ([`is_bulk`]) wait for one of
/// the gate's permits before their bodies are read, and hold it until
/// answered.
#[derive(Clone)]
pub struct BulkGate<S> {
    inner: S,
    permits: Arc<Semaphore>,
}

impl<S> BulkGate<S> {
    pub fn new(inner: S, permits: usize) -> BulkGate<S> {
        BulkGate {
            inner,
            permits: Arc::new(Semaphore::new(permits)),
        }
    }
}

impl<S: NamedService> NamedService for BulkGate<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> Service<http::Request<B>> for BulkGate<S>
where
    S: Service<http::Request<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        // The service made ready is the one to call; a fresh clone stays.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        if !is_bulk(req.uri().path()) {
            return Box::pin(inner.call(req));
        }
        let permits = self.permits.clone();
        Box::pin(async move {
            // The semaphore is never closed.
            let _permit = permits.acquire_owned().await;
            inner.call(req).await
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

    impl Service<http::Request<()>> for Held {
        type Response = ();
        type Error = std::convert::Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<(), Self::Error>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            let (inside, release) = (self.inside.clone(), self.release.clone());
            Box::pin(async move {
                inside.fetch_add(1, Ordering::SeqCst);
                release.notified().await;
                inside.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            })
        }
    }

    fn request(method: &str) -> http::Request<()> {
        http::Request::builder()
            .uri(format!("/railguard.v1.RaftPeer/{method}"))
            .body(())
            .unwrap()
    }

    async fn settle() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    #[tokio::test]
    async fn bulk_calls_wait_for_a_permit_and_votes_do_not() {
        let held = Held {
            inside: Arc::new(AtomicUsize::new(0)),
            release: Arc::new(Notify::new()),
        };
        let mut gate = BulkGate::new(held.clone(), 2);
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
}
