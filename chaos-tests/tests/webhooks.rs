//! A `notify` step with a webhook, end to end: three real supervisors, a
//! playbook applied with the real CLI, a NIC-down event from a simulated
//! agent, and a real HTTP endpoint on loopback that must receive exactly one
//! POST carrying the step's idempotency key, after which the run completes.
//! A second incident meets an endpoint answering 503: the attempt fails,
//! is retried with a new key, and the run fails for good.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use testbed::agentsim::{nic_event, open_stream, register_host};
use testbed::cluster::SupervisorCluster;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug, Clone)]
struct Received {
    key: String,
    body: serde_json::Value,
}

/// An HTTP endpoint on loopback recording every POST; answers with the
/// status `status()` returns at the time.
async fn endpoint(
    status: Arc<Mutex<u16>>,
) -> (
    String,
    Arc<Mutex<Vec<Received>>>,
    tokio::task::JoinHandle<()>,
) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", l.local_addr().unwrap());
    let got: Arc<Mutex<Vec<Received>>> = Arc::default();
    let seen = got.clone();
    let h = tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            let mut req = Vec::new();
            let mut buf = [0u8; 4096];
            let mut parsed = None;
            for _ in 0..64 {
                let Ok(n) = s.read(&mut buf).await else { break };
                req.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&req).to_string();
                if let Some(end) = text.find("\r\n\r\n") {
                    let header = |name: &str| {
                        text[..end].lines().find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
                        })
                    };
                    let len: usize = header("content-length")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    if req.len() >= end + 4 + len {
                        let body = serde_json::from_slice(&req[end + 4..end + 4 + len])
                            .unwrap_or(serde_json::Value::Null);
                        parsed = Some(Received {
                            key: header("idempotency-key").unwrap_or_default(),
                            body,
                        });
                        break;
                    }
                }
                if n == 0 {
                    break;
                }
            }
            if let Some(r) = parsed {
                seen.lock().unwrap().push(r);
            }
            let code = *status.lock().unwrap();
            let answer =
                format!("HTTP/1.1 {code} X\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
            let _ = s.write_all(answer.as_bytes()).await;
            let _ = s.shutdown().await;
        }
    });
    (url, got, h)
}

fn cli(c: &SupervisorCluster, addrs: &[String], args: &[&str]) -> (i32, String, String) {
    let out = c.cli_at(addrs, args).unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn runs(c: &SupervisorCluster, addrs: &[String]) -> Vec<serde_json::Value> {
    let (_, out, _) = cli(c, addrs, &["--output", "json", "playbook", "runs"]);
    serde_json::from_str::<serde_json::Value>(&out)
        .ok()
        .and_then(|v| v["runs"].as_array().cloned())
        .unwrap_or_default()
}

async fn wait_for(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < within, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_step_posts_once_with_its_key_and_failures_are_retried() {
    let status = Arc::new(Mutex::new(204u16));
    let (url, got, _server) = endpoint(status.clone()).await;
    let c = SupervisorCluster::start(3).unwrap();
    let leader = c.init().await.unwrap();
    let addrs = c.addrs();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hook.toml");
    std::fs::write(
        &file,
        format!(
            "name = \"hook\"\npriority = 500\n[trigger]\nincidents = [\"nic_down\"]\n\n\
             [[steps]]\nid = \"tell\"\naction = \"notify\"\nmessage = \"{{host}} {{nic}} down\"\n\
             webhook = \"{url}\"\ntimeout = \"20s\"\nretries = 1\n"
        ),
    )
    .unwrap();
    let (code, _, err) = cli(&c, &addrs, &["playbook", "apply", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");

    let tls = c.agent_tls("h0").unwrap();
    register_host(&addrs, "h0", &tls).await.unwrap();
    let stream = open_stream(&addrs[leader as usize - 1], &tls)
        .await
        .unwrap();
    stream
        .tx
        .send(nic_event("h0", 1, "rail0", false))
        .await
        .unwrap();
    wait_for("the POST", Duration::from_secs(30), || {
        !got.lock().unwrap().is_empty()
    })
    .await;
    wait_for("the run to complete", Duration::from_secs(30), || {
        runs(&c, &addrs)
            .iter()
            .any(|r| r["playbook"] == "hook" && r["state"] == "completed")
    })
    .await;
    {
        let g = got.lock().unwrap();
        assert_eq!(g.len(), 1, "one POST: {g:?}");
        let intent = g[0].body["intent"].as_u64().unwrap();
        assert_eq!(g[0].key, format!("railguard-intent-{intent}"));
        assert_eq!(g[0].body["message"], "h0 rail0 down");
        assert_eq!(g[0].body["incident_kind"], "nic_down");
    }

    // The endpoint fails: two attempts (retries = 1), two keys, run Failed.
    *status.lock().unwrap() = 503;
    stream
        .tx
        .send(nic_event("h0", 2, "rail0", true))
        .await
        .unwrap();
    stream
        .tx
        .send(nic_event("h0", 3, "rail0", false))
        .await
        .unwrap();
    wait_for("the second run to fail", Duration::from_secs(30), || {
        runs(&c, &addrs)
            .iter()
            .any(|r| r["playbook"] == "hook" && r["state"].get("failed").is_some())
    })
    .await;
    let g = got.lock().unwrap();
    assert_eq!(g.len(), 3, "one more POST per attempt: {g:?}");
    assert_ne!(
        g[1].key, g[2].key,
        "a retry is a new attempt with a new key"
    );
}
