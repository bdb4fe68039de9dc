//! The leader's webhook sender: delivers `notify` steps that name a
//! webhook.
//!
//! The step's intent is committed (and its line logged) by apply; the
//! intent stays open until [`Command::WebhookDone`] closes it. Every
//! reconciler tick the leader POSTs each open webhook intent it is not
//! already posting: JSON with the message and what it is about, headers
//! `Idempotency-Key: railguard-intent-<id>` and `User-Agent`. A 2xx answer
//! within [`POST_TIMEOUT`] closes the intent Done; anything else closes it
//! Failed (the playbook's retries make a new attempt, a new intent and a
//! new key). A leader that dies between the POST and the commit leaves the
//! intent open: the next leader POSTs again with the same key, so delivery
//! is at least once and receivers can drop the repeat.
//!
//! Bounded: at most [`MAX_IN_FLIGHT`] POSTs at once, each with a timeout;
//! answers are read up to [`MAX_ANSWER_BYTES`]. Only `http://` (the
//! playbook language refuses `https://`: no TLS is built in).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use serde::Serialize;

use crate::model::runs::StepOp;
use crate::model::{Action, ClusterState, Command};
use crate::node::Supervisor;

/// Longest a POST may take (connect, send, answer).
pub const POST_TIMEOUT: Duration = Duration::from_secs(5);
/// Most POSTs in flight.
pub const MAX_IN_FLIGHT: usize = 32;
/// Most of an answer's body kept (for the step's detail).
pub const MAX_ANSWER_BYTES: usize = 4 << 10;

/// The JSON a webhook receives.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct WebhookBody {
    /// Same as the `Idempotency-Key` header.
    pub key: String,
    pub intent: u64,
    pub run: u64,
    pub playbook: String,
    pub incident: u64,
    pub incident_kind: String,
    pub host: String,
    pub nic: Option<String>,
    pub message: String,
}

/// One open webhook step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenWebhook {
    pub intent: u64,
    pub url: String,
    pub body: WebhookBody,
}

/// The key of intent `id`'s POST.
pub fn idempotency_key(id: u64) -> String {
    format!("railguard-intent-{id}")
}

/// Every open `notify` step intent with a webhook (pure).
pub fn open_webhooks(st: &ClusterState) -> Vec<OpenWebhook> {
    st.open_intents()
        .filter_map(|i| {
            let Action::PlaybookStep { run, host, op, .. } = &i.action else {
                return None;
            };
            let StepOp::Notify {
                message,
                webhook: Some(url),
            } = op
            else {
                return None;
            };
            let r = st.runs.get(run)?;
            let inc = st.incidents.get(&r.incident);
            Some(OpenWebhook {
                intent: i.id,
                url: url.clone(),
                body: WebhookBody {
                    key: idempotency_key(i.id),
                    intent: i.id,
                    run: *run,
                    playbook: r.playbook.clone(),
                    incident: r.incident,
                    incident_kind: inc.map(|x| x.kind.to_string()).unwrap_or_default(),
                    host: host.clone(),
                    nic: inc.and_then(|x| x.nic.clone()),
                    message: message.clone(),
                },
            })
        })
        .collect()
}

/// Leader memory: the intents being posted.
#[derive(Default)]
pub struct WebhookSender {
    /// Shared with the POST tasks, which remove their intent when done.
    in_flight: Arc<Mutex<HashSet<u64>>>,
}

fn lock_in_flight(in_flight: &Mutex<HashSet<u64>>) -> std::sync::MutexGuard<'_, HashSet<u64>> {
    in_flight.lock().unwrap_or_else(|e| e.into_inner())
}

impl WebhookSender {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<u64>> {
        lock_in_flight(&self.in_flight)
    }

    /// Starts a POST for every open webhook intent not already being posted
    /// (bounded); each closes its intent when it ends.
    pub fn dispatch(&self, sup: &Arc<Supervisor>) {
        let open = sup.read(open_webhooks);
        for w in open {
            {
                let mut f = self.lock();
                if f.contains(&w.intent) {
                    continue;
                }
                if f.len() >= MAX_IN_FLIGHT {
                    tracing::warn!(
                        in_flight = f.len(),
                        "webhook posts at their bound; the rest wait"
                    );
                    return;
                }
                f.insert(w.intent);
            }
            let sup = sup.clone();
            let in_flight = self.in_flight.clone();
            tokio::spawn(async move {
                tracing::info!(intent = w.intent, url = %w.url, "posting webhook");
                let (ok, detail) = match post(&w.url, &w.body).await {
                    Ok((status, _)) if (200..300).contains(&status) => {
                        (true, format!("webhook {} answered {status}", w.url))
                    }
                    Ok((status, answer)) => (
                        false,
                        format!("webhook {} answered {status}: {answer}", w.url),
                    ),
                    Err(e) => (false, format!("webhook {}: {e}", w.url)),
                };
                tracing::info!(intent = w.intent, ok, detail = %detail, "webhook delivered");
                if let Err(e) = sup
                    .propose(Command::WebhookDone {
                        id: w.intent,
                        ok,
                        detail,
                    })
                    .await
                {
                    // Leadership lost or the step moved on: the next
                    // leader (or tick) decides again from the state.
                    tracing::info!(intent = w.intent, error = %e, "webhook outcome not committed");
                }
                lock_in_flight(&in_flight).remove(&w.intent);
            });
        }
    }

    /// Forgets everything (leadership lost).
    pub fn clear(&self) {
        self.lock().clear();
    }
}

/// Why a POST failed before an answer.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// The URL is not an `http://` URL the client can use.
    #[error("bad URL: {0}")]
    Url(String),
    /// No answer within the bound.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The connection or the HTTP exchange failed.
    #[error("{0}")]
    Http(String),
}

/// POSTs `body` as JSON to `url`; the status and the start of the answer.
pub async fn post(url: &str, body: &WebhookBody) -> Result<(u16, String), WebhookError> {
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e: hyper::http::uri::InvalidUri| WebhookError::Url(e.to_string()))?;
    if uri.scheme_str() != Some("http") || uri.host().is_none() {
        return Err(WebhookError::Url(format!(
            "{url}: want an http:// URL with a host"
        )));
    }
    let json = serde_json::to_vec(body).expect("a webhook body serialises");
    let req = hyper::Request::post(uri)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(hyper::header::USER_AGENT, "railguard-supervisor")
        .header("Idempotency-Key", body.key.as_str())
        .body(Full::new(Bytes::from(json)))
        .map_err(|e| WebhookError::Http(e.to_string()))?;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let call = async {
        let resp = client
            .request(req)
            .await
            .map_err(|e| WebhookError::Http(e.to_string()))?;
        let status = resp.status().as_u16();
        let answer = match Limited::new(resp.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
        {
            Ok(b) => String::from_utf8_lossy(&b.to_bytes()).into_owned(),
            Err(_) => format!("(answer longer than {MAX_ANSWER_BYTES} bytes)"),
        };
        Ok((status, answer.trim().chars().take(256).collect()))
    };
    tokio::time::timeout(POST_TIMEOUT, call)
        .await
        .map_err(|_| WebhookError::Timeout(POST_TIMEOUT))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn body() -> WebhookBody {
        WebhookBody {
            key: idempotency_key(42),
            intent: 42,
            run: 3,
            playbook: "nic-down".into(),
            incident: 7,
            incident_kind: "nic_down".into(),
            host: "h1".into(),
            nic: Some("rail0".into()),
            message: "h1 rail0 down".into(),
        }
    }

    /// A one-request HTTP server on loopback: returns the request text it
    /// read and answers with `answer` (raw).
    async fn serve_once(answer: &'static str) -> (String, tokio::task::JoinHandle<String>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", l.local_addr().unwrap());
        let h = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            // Headers, then the body by Content-Length (bounded reads).
            for _ in 0..64 {
                let n = s.read(&mut buf).await.unwrap();
                got.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&got).to_string();
                if let Some(end) = text.find("\r\n\r\n") {
                    let len: usize = text
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length: ")
                                .map(|v| v.trim().parse().unwrap())
                        })
                        .unwrap_or(0);
                    if got.len() >= end + 4 + len {
                        break;
                    }
                }
                if n == 0 {
                    break;
                }
            }
            s.write_all(answer.as_bytes()).await.unwrap();
            s.shutdown().await.ok();
            String::from_utf8_lossy(&got).into_owned()
        });
        (url, h)
    }

    #[tokio::test]
    async fn a_post_carries_the_key_and_the_json_and_reads_the_status() {
        let (url, server) =
            serve_once("HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n").await;
        let (status, _) = post(&url, &body()).await.unwrap();
        assert_eq!(status, 204);
        let req = server.await.unwrap();
        assert!(req.starts_with("POST /hook HTTP/1.1\r\n"), "{req}");
        let lower = req.to_ascii_lowercase();
        assert!(
            lower.contains("idempotency-key: railguard-intent-42\r\n"),
            "{req}"
        );
        assert!(
            lower.contains("content-type: application/json\r\n"),
            "{req}"
        );
        let json = &req[req.find("\r\n\r\n").unwrap() + 4..];
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(v["message"], "h1 rail0 down");
        assert_eq!(v["intent"], 42);
        assert_eq!(v["nic"], "rail0");
    }

    #[tokio::test]
    async fn errors_are_answers_or_clear_failures() {
        let (url, _s) = serve_once(
            "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbusy",
        )
        .await;
        assert_eq!(post(&url, &body()).await.unwrap(), (503, "busy".into()));
        // Nobody listening: a connection error, not a hang.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dead = format!("http://{}/hook", l.local_addr().unwrap());
        drop(l);
        assert!(matches!(
            post(&dead, &body()).await,
            Err(WebhookError::Http(_))
        ));
        for bad in ["https://x/y", "ftp://x", "not a url", "http:///nohost"] {
            assert!(
                matches!(post(bad, &body()).await, Err(WebhookError::Url(_))),
                "{bad}"
            );
        }
    }
}
