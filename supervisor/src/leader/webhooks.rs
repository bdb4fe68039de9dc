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
//! answers are read up to [`MAX_ANSWER_BYTES`]. `http://` or `https://`:
//! an `https://` receiver is verified (rustls, TLS 1.2 or 1.3, its name
//! against its certificate) with the CA bundle of [`WebhookTls`] — the
//! supervisor's `[webhooks] ca_bundle` (`--webhook-ca`), or the system's
//! [`DEFAULT_CA_BUNDLE`]. Without a usable bundle an `https://` step fails
//! with a detail that names the file; `http://` is unaffected.

use std::collections::HashSet;
use std::path::Path;
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

/// Debian's system CA bundle: what `https://` receivers are verified
/// against unless the supervisor is given another.
pub const DEFAULT_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// How `https://` receivers are verified: a rustls client configuration
/// over a CA bundle, or why there is none.
#[derive(Clone)]
pub struct WebhookTls(Result<Arc<rustls::ClientConfig>, String>);

impl WebhookTls {
    /// Trusts the CA certificates of the PEM bundle at `path`.
    pub fn load(path: &Path) -> Result<WebhookTls, WebhookError> {
        let roots = pki::ca_bundle(path).map_err(|e| WebhookError::Tls(e.to_string()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| WebhookError::Tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(WebhookTls(Ok(Arc::new(config))))
    }

    /// The bundle the operator gave, else the system's; if that cannot be
    /// used, `https://` posts fail saying why (logged once here).
    pub fn from_config(given: Option<&Path>) -> WebhookTls {
        let path = given.unwrap_or(Path::new(DEFAULT_CA_BUNDLE));
        match WebhookTls::load(path) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(bundle = %path.display(), error = %e, "no CA bundle for https:// webhooks; they will fail (give one with --webhook-ca)");
                WebhookTls(Err(format!(
                    "no CA bundle for https:// webhooks ({e}); give one with --webhook-ca or [webhooks] ca_bundle"
                )))
            }
        }
    }
}

/// Leader memory: the intents being posted.
pub struct WebhookSender {
    /// Shared with the POST tasks, which remove their intent when done.
    in_flight: Arc<Mutex<HashSet<u64>>>,
    tls: WebhookTls,
}

fn lock_in_flight(in_flight: &Mutex<HashSet<u64>>) -> std::sync::MutexGuard<'_, HashSet<u64>> {
    in_flight.lock().unwrap_or_else(|e| e.into_inner())
}

impl WebhookSender {
    /// Nothing in flight; `https://` receivers verified with `tls`.
    pub fn new(tls: WebhookTls) -> WebhookSender {
        WebhookSender {
            in_flight: Default::default(),
            tls,
        }
    }

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
            let tls = self.tls.clone();
            tokio::spawn(async move {
                tracing::info!(intent = w.intent, url = %w.url, "posting webhook");
                let (ok, detail) = match post(&w.url, &w.body, &tls).await {
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
    /// The URL is not an `http://` or `https://` URL the client can use.
    #[error("bad URL: {0}")]
    Url(String),
    /// No usable CA bundle for an `https://` receiver.
    #[error("TLS: {0}")]
    Tls(String),
    /// No answer within the bound.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The connection or the HTTP exchange failed.
    #[error("{0}")]
    Http(String),
}

/// POSTs `body` as JSON to `url` (`https://` verified with `tls`); the
/// status and the start of the answer.
pub async fn post(
    url: &str,
    body: &WebhookBody,
    tls: &WebhookTls,
) -> Result<(u16, String), WebhookError> {
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e: hyper::http::uri::InvalidUri| WebhookError::Url(e.to_string()))?;
    let https = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => {
            return Err(WebhookError::Url(format!(
                "{url}: want an http:// or https:// URL with a host"
            )))
        }
    };
    if uri.host().is_none() {
        return Err(WebhookError::Url(format!("{url}: the URL names no host")));
    }
    let json = serde_json::to_vec(body).expect("a webhook body serialises");
    let req = hyper::Request::post(uri)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(hyper::header::USER_AGENT, "railguard-supervisor")
        .header("Idempotency-Key", body.key.as_str())
        .body(Full::new(Bytes::from(json)))
        .map_err(|e| WebhookError::Http(e.to_string()))?;
    let builder = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new());
    let call = async {
        let resp = if https {
            let config = tls.0.as_ref().map_err(|e| WebhookError::Tls(e.clone()))?;
            let connector = hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config((**config).clone())
                .https_only()
                .enable_http1()
                .build();
            builder.build(connector).request(req).await
        } else {
            builder.build_http().request(req).await
        }
        .map_err(|e| WebhookError::Http(error_chain(&e)))?;
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

/// An error and its causes, so a TLS failure says why (an unknown issuer,
/// a name mismatch) rather than only "client error (Connect)".
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
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

    /// No CA bundle: `https://` must fail.
    fn no_tls() -> WebhookTls {
        WebhookTls(Err("no bundle in this test".into()))
    }

    /// A one-request HTTP server on loopback: returns the request text it
    /// read and answers with `answer` (raw).
    async fn serve_once(answer: &'static str) -> (String, tokio::task::JoinHandle<String>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", l.local_addr().unwrap());
        let h = tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            exchange(s, answer).await
        });
        (url, h)
    }

    /// The same over TLS with `tls` (a server certificate for 127.0.0.1
    /// and localhost); the URL names `host`.
    async fn serve_once_tls(
        tls: Arc<rustls::ServerConfig>,
        host: &str,
        answer: &'static str,
    ) -> (String, tokio::task::JoinHandle<String>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{host}:{}/hook", l.local_addr().unwrap().port());
        let h = tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            match tokio_rustls::TlsAcceptor::from(tls).accept(s).await {
                Ok(s) => exchange(s, answer).await,
                Err(e) => format!("handshake failed: {e}"),
            }
        });
        (url, h)
    }

    /// A lab CA (its bundle) and a receiver's TLS configuration signed by it.
    fn receiver_tls(dir: &Path) -> (std::path::PathBuf, Arc<rustls::ServerConfig>) {
        use rustls::pki_types::pem::PemObject;
        let lab = pki::LabPki::open(dir).unwrap();
        let files = lab.supervisor(1).unwrap();
        let chain = rustls::pki_types::CertificateDer::pem_file_iter(&files.cert)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&files.key).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        (files.ca, Arc::new(config))
    }

    /// Reads one request (headers, then the body by Content-Length, in
    /// bounded reads), answers `answer`, returns the request text.
    async fn exchange<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
        mut s: S,
        answer: &str,
    ) -> String {
        {
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
        }
    }

    #[tokio::test]
    async fn a_post_carries_the_key_and_the_json_and_reads_the_status() {
        let (url, server) =
            serve_once("HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n").await;
        let (status, _) = post(&url, &body(), &no_tls()).await.unwrap();
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
        assert_eq!(
            post(&url, &body(), &no_tls()).await.unwrap(),
            (503, "busy".into())
        );
        // Nobody listening: a connection error, not a hang.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dead = format!("http://{}/hook", l.local_addr().unwrap());
        drop(l);
        assert!(matches!(
            post(&dead, &body(), &no_tls()).await,
            Err(WebhookError::Http(_))
        ));
        for bad in ["ftp://x", "not a url", "http:///nohost", "https:///nohost"] {
            assert!(
                matches!(
                    post(bad, &body(), &no_tls()).await,
                    Err(WebhookError::Url(_))
                ),
                "{bad}"
            );
        }
        // https:// without a usable bundle says so and sends nothing.
        assert!(matches!(
            post("https://127.0.0.1:1/x", &body(), &no_tls()).await,
            Err(WebhookError::Tls(_))
        ));
    }

    #[tokio::test]
    async fn https_receivers_are_verified_with_the_configured_bundle() {
        let dir = tempfile::tempdir().unwrap();
        let (bundle, server) = receiver_tls(dir.path());
        let ok = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";
        // Trusted through the bundle, by IP and by name.
        let tls = WebhookTls::from_config(Some(&bundle));
        for host in ["127.0.0.1", "localhost"] {
            let (url, seen) = serve_once_tls(server.clone(), host, ok).await;
            assert_eq!(post(&url, &body(), &tls).await.unwrap(), (200, "ok".into()));
            let req = seen.await.unwrap();
            assert!(
                req.to_ascii_lowercase()
                    .contains("idempotency-key: railguard-intent-42"),
                "{req}"
            );
        }
        // The system's bundle does not know the lab CA: refused, and the
        // detail says why.
        if Path::new(DEFAULT_CA_BUNDLE).exists() {
            let (url, seen) = serve_once_tls(server.clone(), "127.0.0.1", ok).await;
            let e = post(&url, &body(), &WebhookTls::from_config(None))
                .await
                .unwrap_err();
            assert!(
                e.to_string().contains("UnknownIssuer") || e.to_string().contains("certificate"),
                "{e}"
            );
            assert!(seen.await.unwrap().starts_with("handshake failed"));
        }
        // A name the certificate does not hold is refused.
        let (url, _seen) = serve_once_tls(server.clone(), "127.0.0.2", ok).await;
        let e = post(&url, &body(), &tls).await;
        assert!(matches!(e, Err(WebhookError::Http(_))), "{e:?}");
        // A bundle that is not one: a clear error naming the file.
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not pem").unwrap();
        let e = post(
            "https://127.0.0.1:1/x",
            &body(),
            &WebhookTls::from_config(Some(&junk)),
        )
        .await
        .unwrap_err();
        assert!(e.to_string().contains("junk.pem"), "{e}");
    }
}
