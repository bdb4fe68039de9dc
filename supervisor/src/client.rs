//! Client side of the admin API, shared by the `railguard` CLI and the chaos
//! suite: tries each configured supervisor until one answers.
//!
//! Host writes carry a request id (a random session id per client and a
//! serial), which the cluster applies at most once, so a write whose outcome
//! is unknown (a timeout, a leader that died mid-commit) is retried with the
//! same id until a definite answer or the retry window ends. Only then is the
//! outcome reported as unknown.
//!
//! The cluster remembers the last [`MAX_SESSION_RESULTS`] results of a
//! session, so a retry is decidable only while its serial is among the
//! newest the cluster has seen. A client therefore never issues serial `n`
//! while a serial at or below `n - WRITE_WINDOW` is still unanswered
//! ([`SerialWindow`]): however many tasks share one client, every retry it
//! sends can be told apart from a duplicate.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proto::v1::admin_client::AdminClient as Grpc;
use proto::v1::{Blob, FollowRequest};
use tonic::transport::Channel;

use crate::api::{AdminCall, AdminReply, AdminRequest, ApiError, ErrorKind, FollowedEvent};
use crate::model::{RequestId, MAX_SESSION_RESULTS};
pub use crate::network::ClientTls;

/// Default time limit of one call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// An admin client over one or more supervisor addresses.
#[derive(Clone)]
pub struct AdminClient {
    targets: Vec<(String, Grpc<Channel>)>,
    actor: String,
    timeout: Duration,
    /// Session id of this client (and its clones) for retry-safe writes.
    session: String,
    serials: Arc<SerialWindow>,
    retry_for: Duration,
    /// Index of the supervisor to try first: the one that last answered,
    /// or the one after one that did not answer in time (a paused or
    /// overloaded supervisor keeps its connections and answers nothing,
    /// and every call would wait for it first). Shared by clones.
    first: Arc<std::sync::atomic::AtomicUsize>,
    /// Per supervisor, until when it counts as silent: it let a call time
    /// out. A silent supervisor is tried only when no other one answered
    /// at all, so a client whose other supervisors say "no leader yet"
    /// (an election under way after the leader stopped) asks them again
    /// instead of waiting out another timeout on the stopped one. Shared by
    /// clones.
    silent: Arc<Mutex<Vec<Option<Instant>>>>,
}

/// How long a supervisor that let a call time out is tried last.
const SILENT_FOR: Duration = Duration::from_secs(5);

/// How far the newest serial a client issues may run ahead of its oldest
/// unanswered one: half of what the cluster remembers per session.
pub const WRITE_WINDOW: u64 = MAX_SESSION_RESULTS as u64 / 2;

/// The serials a client has issued and not yet seen answered.
#[derive(Default)]
struct SerialWindow {
    state: Mutex<WindowState>,
    freed: tokio::sync::Notify,
}

#[derive(Default)]
struct WindowState {
    last: u64,
    open: BTreeSet<u64>,
}

/// An issued serial; dropping it (answered, or given up) frees its slot.
struct Serial<'a> {
    window: &'a SerialWindow,
    n: u64,
}

impl SerialWindow {
    /// The next serial, once it is within [`WRITE_WINDOW`] of the oldest
    /// unanswered one.
    async fn next(&self) -> Serial<'_> {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                let n = st.last + 1;
                let oldest = st.open.first().copied().unwrap_or(n);
                if n - oldest < WRITE_WINDOW {
                    st.last = n;
                    st.open.insert(n);
                    return Serial { window: self, n };
                }
            }
            freed.await;
        }
    }
}

impl Drop for Serial<'_> {
    fn drop(&mut self) {
        let mut st = self.window.state.lock().unwrap_or_else(|p| p.into_inner());
        st.open.remove(&self.n);
        drop(st);
        self.window.freed.notify_waiters();
    }
}

/// First pause between retries of a write; doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_millis(500);

impl AdminClient {
    /// `addrs` are `IP:port` or `host:port` of supervisors (names must
    /// resolve), dialled with `tls`; `actor`
    /// is recorded with writes only on an `--insecure` cluster (with mTLS
    /// the supervisor records the certificate's user).
    pub fn new(
        addrs: &[String],
        actor: &str,
        timeout: Duration,
        tls: &ClientTls,
    ) -> Result<Self, ApiError> {
        if addrs.is_empty() {
            return Err(ApiError::invalid("no supervisor address given"));
        }
        pki::check_supervisor_addrs(addrs).map_err(ApiError::invalid)?;
        let mut targets = Vec::new();
        for a in addrs {
            let ch = crate::network::channel(a, tls)
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
            session: format!("{:016x}", rand::random::<u64>()),
            serials: Arc::new(SerialWindow::default()),
            retry_for: timeout,
            first: Arc::default(),
            silent: Arc::new(Mutex::new(vec![None; addrs.len()])),
        })
    }

    /// How long a write whose outcome is not yet known is retried (default:
    /// the call timeout).
    pub fn with_retry_window(mut self, d: Duration) -> Self {
        self.retry_for = d;
        self
    }

    /// Sends one request, trying supervisors in order while they are
    /// unreachable or answer `Unavailable`. Host writes are retried (same
    /// request id) while their outcome is unknown, within the retry window.
    pub async fn call(&self, request: AdminRequest, stale: bool) -> Result<AdminReply, ApiError> {
        let is_write = request.is_write();
        let serial = match request {
            AdminRequest::Write { .. } => Some(self.serials.next().await),
            _ => None,
        };
        let request_id = serial.as_ref().map(|s| RequestId {
            client: self.session.clone(),
            serial: s.n,
            retry: false,
        });
        let retry_safe = request_id.is_some();
        let call = AdminCall {
            actor: self.actor.clone(),
            stale,
            forwarded: false,
            request_id,
            request,
        };
        let body = serde_json::to_vec(&call).map_err(|e| ApiError::internal(e.to_string()))?;
        if !retry_safe {
            return self.attempt(&body, is_write).await;
        }
        let mut retry_call = call;
        if let Some(r) = retry_call.request_id.as_mut() {
            r.retry = true;
        }
        let retry_body =
            serde_json::to_vec(&retry_call).map_err(|e| ApiError::internal(e.to_string()))?;
        let deadline = Instant::now() + self.retry_for;
        let mut backoff = FIRST_BACKOFF;
        let mut uncertain: Option<ApiError> = None;
        let mut first = true;
        loop {
            let body = if std::mem::take(&mut first) {
                &body
            } else {
                &retry_body
            };
            let e = match self.attempt(body, true).await {
                Ok(r) => return Ok(r),
                Err(e) if e.kind == ErrorKind::Unavailable => e,
                Err(e) if !e.is_definite() => {
                    tracing::debug!(error = %e, "write outcome unknown; retrying with the same request id");
                    uncertain = Some(e.clone());
                    e
                }
                Err(e) => return Err(e),
            };
            if Instant::now() + backoff >= deadline {
                // Once any attempt may have been applied, "unavailable" no
                // longer means "not written".
                return Err(uncertain.unwrap_or(e));
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// The order of one pass: from the preferred supervisor on, the silent
    /// ones (see `silent`) last, each with whether it is silent.
    fn order(&self) -> Vec<(usize, bool)> {
        use std::sync::atomic::Ordering;
        let n = self.targets.len();
        let start = self.first.load(Ordering::Relaxed) % n;
        let now = Instant::now();
        let silent = self.silent.lock().expect("silent supervisors");
        let mut order: Vec<(usize, bool)> = (0..n)
            .map(|k| (start + k) % n)
            .map(|i| (i, silent[i].is_some_and(|t| now < t)))
            .collect();
        order.sort_by_key(|&(_, s)| s);
        order
    }

    fn set_silent(&self, i: usize, silent: bool) {
        let mut s = self.silent.lock().expect("silent supervisors");
        s[i] = silent.then(|| Instant::now() + SILENT_FOR);
    }

    /// One pass over the supervisors. When none can serve, the error names
    /// every address tried and what each said.
    async fn attempt(&self, body: &[u8], is_write: bool) -> Result<AdminReply, ApiError> {
        use std::sync::atomic::Ordering;
        let mut tried: Vec<String> = Vec::new();
        let n = self.targets.len();
        // Whether a supervisor answered in this pass (if only to say it
        // cannot serve now).
        let mut answered = false;
        for (i, silent) in self.order() {
            if silent && answered {
                tried.push(format!(
                    "{}: skipped (no answer to an earlier call)",
                    self.targets[i].0
                ));
                continue;
            }
            let (addr, client) = &self.targets[i];
            let mut c = client.clone();
            let fut = c.call(Blob {
                body: body.to_vec(),
            });
            let r = tokio::time::timeout(self.timeout, fut).await;
            self.set_silent(i, r.is_err());
            match r {
                Err(_) if is_write => {
                    // The retry (same request id) starts at the next one.
                    self.first.store((i + 1) % n, Ordering::Relaxed);
                    return Err(ApiError::unknown(format!(
                        "no answer from {addr} within {:?}; the write's outcome is unknown",
                        self.timeout
                    )));
                }
                Err(_) => tried.push(format!("{addr}: no answer within {:?}", self.timeout)),
                Ok(Ok(r)) => {
                    self.first.store(i, Ordering::Relaxed);
                    return serde_json::from_slice(&r.get_ref().body).map_err(|e| {
                        ApiError::internal(format!("malformed reply from {addr}: {e}"))
                    });
                }
                Ok(Err(s)) if crate::network::never_sent(&s) => {
                    tried.push(format!("{addr} unreachable: {}", s.message()))
                }
                Ok(Err(s)) => {
                    let e = ApiError::from(s);
                    if e.kind == ErrorKind::Unavailable
                        || (e.kind == ErrorKind::Unknown && !is_write)
                    {
                        answered = true;
                        tried.push(format!("{addr}: {}", e.message));
                        continue;
                    }
                    return Err(e);
                }
            }
        }
        Err(none_could_serve(&tried))
    }

    /// Follows the cluster event log from `since`; `on_event` is called for
    /// each event until it returns false or the stream ends.
    pub async fn follow(
        &self,
        since: u64,
        mut on_event: impl FnMut(FollowedEvent) -> bool,
    ) -> Result<(), ApiError> {
        let mut tried: Vec<String> = Vec::new();
        for (addr, client) in &self.targets {
            let mut c = client.clone();
            match c.follow(FollowRequest { since }).await {
                Err(s) => {
                    tried.push(format!("{addr}: {}", s.message()));
                    continue;
                }
                Ok(stream) => {
                    let mut stream = stream.into_inner();
                    while let Some(item) = stream.message().await.map_err(ApiError::from)? {
                        let ev: FollowedEvent = serde_json::from_slice(&item.body)
                            .map_err(|e| ApiError::internal(format!("malformed event: {e}")))?;
                        if !on_event(ev) {
                            return Ok(());
                        }
                    }
                    return Ok(());
                }
            }
        }
        Err(none_could_serve(&tried))
    }
}

/// The error of a pass in which no supervisor could serve: every address
/// tried, with what it said.
fn none_could_serve(tried: &[String]) -> ApiError {
    if tried.is_empty() {
        return ApiError::unavailable("no supervisor answered");
    }
    ApiError::unavailable(format!(
        "no supervisor could serve the call ({} tried): {}",
        tried.len(),
        tried.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits briefly: true if `fut` finished.
    async fn finishes<F: std::future::Future>(fut: F) -> Option<F::Output> {
        tokio::time::timeout(Duration::from_millis(100), fut)
            .await
            .ok()
    }

    #[tokio::test]
    async fn serials_never_run_a_window_ahead_of_the_oldest_unanswered() {
        let w = SerialWindow::default();
        let mut held: Vec<Serial<'_>> = Vec::new();
        for i in 1..=WRITE_WINDOW {
            let s = finishes(w.next()).await.expect("within the window");
            assert_eq!(s.n, i);
            held.push(s);
        }
        // Full: the next waits, even when a newer serial is answered...
        assert!(finishes(w.next()).await.is_none());
        held.remove(5);
        assert!(finishes(w.next()).await.is_none());
        // ...until the oldest is.
        held.remove(0);
        let s = finishes(w.next()).await.expect("the oldest was answered");
        assert_eq!(s.n, WRITE_WINDOW + 1);
        assert!(s.n - held[0].n < WRITE_WINDOW);
    }

    #[tokio::test]
    async fn a_waiting_writer_wakes_when_the_oldest_serial_is_answered() {
        let w = Arc::new(SerialWindow::default());
        let mut held = Vec::new();
        for _ in 0..WRITE_WINDOW {
            held.push(w.next().await);
        }
        let w2 = w.clone();
        let waiter = tokio::spawn(async move { w2.next().await.n });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        held.remove(0);
        let n = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .expect("task");
        assert_eq!(n, WRITE_WINDOW + 1);
    }
}
