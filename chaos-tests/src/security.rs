//! `railguard-chaos scenario security`: a netns cluster with mutual TLS (3
//! supervisors, 2 GPU hosts with agents) attacked for real over the
//! management network from host h1's namespace, the way an intruder on a
//! GPU host would: no certificate, another CA's, an expired one, a revoked
//! one, an agent speaking for another host, a viewer draining, an operator
//! submitting a job or removing a member, strangers on the Raft port
//! (AppendEntries, Vote, election pause) — and a process that is not a rank
//! on an agent's control socket.
//!
//! Every attempt must be refused (`accepted_bad` 0), and what the cluster
//! holds — hosts' admin state, NIC states, jobs, members — must be the same
//! after them as before (`state_changed_by_refused` 0). Refusals of admins
//! must be in the history.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use pki::{ClientTls, Identity, Role, ServerTlsFiles, TlsMode};
use proto::v1::admin_client::AdminClient as AdminGrpc;
use proto::v1::agent_client::AgentClient;
use proto::v1::raft_peer_client::RaftPeerClient;
use proto::v1::{Blob, HeartbeatRequest, OrderResult};
use serde::Serialize;
use supervisor::api::{AdminCall, AdminRequest};
use supervisor::model::jobs::{JobOp, JobSpec};
use supervisor::model::AdminOp;
use testbed::netcluster::NetCluster;
use testbed::{Node, TestbedSpec};

/// One attempt and how it ended.
#[derive(Debug, Clone, Serialize)]
pub struct Attempt {
    pub what: String,
    pub refused: bool,
    /// The refusal (or the answer, if it was accepted).
    pub detail: String,
}

/// The scenario's report.
#[derive(Debug, Serialize)]
pub struct SecurityReport {
    pub ok: bool,
    pub scenario: &'static str,
    pub attempts: usize,
    pub refused: usize,
    /// Attempts that were not refused: must be 0.
    pub accepted_bad: usize,
    /// 1 when the cluster's state differs after the refused attempts.
    pub state_changed_by_refused: usize,
    /// Admin refusals the leader recorded in the history.
    pub refusals_in_history: usize,
    /// Rotating agent h0's certificate without a restart: after its
    /// serial was revoked, how long until the cluster stopped hearing it
    /// (h0 left `ready`); after a new certificate and SIGHUP, how long
    /// until it was `ready` again. `None`: it did not happen in time.
    pub rotation_silenced_ms: Option<u64>,
    pub rotation_back_ms: Option<u64>,
    pub details: Vec<Attempt>,
}

/// The certificates the attacks present.
struct Material {
    addr: String,
    admin: ServerTlsFiles,
    viewer: ServerTlsFiles,
    operator: ServerTlsFiles,
    agent_h1: ServerTlsFiles,
    stranger_sup: ServerTlsFiles,
    foreign: ServerTlsFiles,
    expired: ServerTlsFiles,
    revoked: ServerTlsFiles,
}

fn tls(f: &ServerTlsFiles) -> anyhow::Result<ClientTls> {
    Ok(ClientTls::from_mode(&TlsMode::Mtls(f.clone()))?)
}

/// One admin call on a fresh connection presenting `tls`.
async fn admin_call(addr: &str, tls: &ClientTls, request: AdminRequest) -> Result<String, String> {
    let ch = supervisor::network::channel(addr, tls).map_err(|e| e.to_string())?;
    let call = AdminCall {
        actor: "intruder".into(),
        stale: false,
        forwarded: false,
        request_id: None,
        request,
    };
    let body = serde_json::to_vec(&call).map_err(|e| e.to_string())?;
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        AdminGrpc::new(ch).call(Blob { body }),
    )
    .await
    .map_err(|_| "timed out".to_string())?;
    r.map(|b| String::from_utf8_lossy(&b.get_ref().body).into_owned())
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
}

fn drain_h0() -> AdminRequest {
    AdminRequest::Write {
        op: AdminOp::Drain {
            host: "h0".into(),
            reason: "intruder".into(),
            deadline_ms: None,
        },
    }
}

/// Every network attempt, from inside the attacker's namespace.
async fn attacks(m: Material) -> anyhow::Result<Vec<Attempt>> {
    let mut out = Vec::new();
    let mut note = |what: &str, r: Result<String, String>| {
        let (refused, detail) = match r {
            Ok(d) => (false, d),
            Err(e) => (true, e),
        };
        out.push(Attempt {
            what: what.into(),
            refused,
            detail: detail.chars().take(300).collect(),
        });
    };
    let a = m.addr.as_str();
    // Strangers: no TLS, another CA, expired, revoked.
    note(
        "admin call without TLS",
        admin_call(a, &ClientTls::Insecure, drain_h0()).await,
    );
    note(
        "admin call with another CA's certificate",
        admin_call(a, &tls(&m.foreign)?, drain_h0()).await,
    );
    note(
        "admin call with an expired certificate",
        admin_call(a, &tls(&m.expired)?, drain_h0()).await,
    );
    note(
        "admin call with a revoked certificate",
        admin_call(a, &tls(&m.revoked)?, AdminRequest::NodeList).await,
    );
    // Roles.
    note(
        "viewer drains h0",
        admin_call(a, &tls(&m.viewer)?, drain_h0()).await,
    );
    let spec: JobSpec = serde_json::from_value(serde_json::json!({
        "name": "evil", "ranks": 1, "command": ["/bin/sh", "-c", "id"],
        "checkpoint_dir": "/tmp/evil"
    }))?;
    note(
        "operator submits a job",
        admin_call(
            a,
            &tls(&m.operator)?,
            AdminRequest::Write {
                op: AdminOp::Job(JobOp::Submit { spec }),
            },
        )
        .await,
    );
    note(
        "operator removes a member",
        admin_call(a, &tls(&m.operator)?, AdminRequest::RemoveMember { id: 3 }).await,
    );
    // An agent speaking for another host.
    let mut h1 = AgentClient::new(supervisor::network::channel(a, &tls(&m.agent_h1)?)?);
    note(
        "agent h1 heartbeats for h0",
        h1.heartbeat(HeartbeatRequest {
            host: "h0".into(),
            sent_unix_ms: 0,
            ..Default::default()
        })
        .await
        .map(|_| "accepted".into())
        .map_err(|s| s.message().to_owned()),
    );
    note(
        "agent h1 answers an order of h0",
        h1.order_done(OrderResult {
            host: "h0".into(),
            order_id: 1,
            ok: true,
            detail: String::new(),
            checkpoint_step: None,
        })
        .await
        .map(|_| "accepted".into())
        .map_err(|s| s.message().to_owned()),
    );
    let forged = testbed::agentsim::nic_event("h0", 1_000_000, "rail0", false);
    let report = match h1.report(tokio_stream::iter(vec![forged])).await {
        Err(s) => Err(s.message().to_owned()),
        Ok(r) => match r.into_inner().message().await {
            Err(s) => Err(s.message().to_owned()),
            Ok(Some(ack)) if !ack.error.is_empty() => Err(ack.error),
            Ok(other) => Ok(format!("{other:?}")),
        },
    };
    note("agent h1 reports rail0 of h0 down", report);
    // Strangers on the Raft port.
    let pause =
        supervisor::network::encode(&supervisor::service::transfer::Control::PauseElection {
            ms: 10_000,
        })?;
    for (who, t) in [
        ("no TLS", ClientTls::Insecure),
        ("an admin certificate", tls(&m.admin)?),
        ("supervisor 9 (not a member)", tls(&m.stranger_sup)?),
    ] {
        let mut p = RaftPeerClient::new(supervisor::network::channel(a, &t)?);
        let empty = || Blob { body: Vec::new() };
        let msg = |r: Result<tonic::Response<Blob>, tonic::Status>| {
            r.map(|_| "accepted".to_string())
                .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
        };
        note(
            &format!("Raft AppendEntries with {who}"),
            msg(p.append_entries(empty()).await),
        );
        note(&format!("Raft Vote with {who}"), msg(p.vote(empty()).await));
        note(
            &format!("PauseElection with {who}"),
            msg(p.control(pause.clone()).await),
        );
    }
    Ok(out)
}

/// What the refused attempts must not change.
fn state(c: &NetCluster) -> anyhow::Result<String> {
    let nodes = c.cli_json(&["node", "list"])?;
    let hosts: Vec<String> = nodes["hosts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|h| {
            let nics: Vec<String> = h["nics"]
                .as_object()
                .map(|m| {
                    m.values()
                        .map(|n| format!("{}={}", n["name"], n["state"]))
                        .collect()
                })
                .unwrap_or_default();
            format!(
                "{} cordoned={} drain={} labels={} nics={nics:?}",
                h["name"], h["cordoned"], h["drain"], h["labels"]
            )
        })
        .collect();
    let jobs = c.cli_json(&["job", "list"])?;
    let members = c.cli_json(&["cluster", "members"])?;
    let members: Vec<String> = members["members"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|m| format!("{}:{}", m["id"], m["voter"]))
        .collect();
    Ok(format!("{hosts:?}\n{jobs}\n{members:?}"))
}

/// A non-rank process (user `nobody`) writing a hello to h0's control
/// socket.
/// h0's liveness as the leader reports it.
fn liveness_h0(c: &NetCluster) -> String {
    c.cli_json(&["node", "show", "h0"])
        .ok()
        .and_then(|v| v["host"]["liveness"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// Milliseconds until `done` holds for h0's liveness (checked every
/// 100 ms), or `None` after `within`.
async fn until_h0(c: &NetCluster, within: Duration, done: impl Fn(&str) -> bool) -> Option<u64> {
    let t0 = std::time::Instant::now();
    while t0.elapsed() < within {
        if done(&liveness_h0(c)) {
            return Some(t0.elapsed().as_millis() as u64);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// Revokes agent h0's certificate (its open streams end, its calls are
/// refused: the cluster stops hearing it), then renews it in place and
/// sends the agent SIGHUP: it is heard again without a restart.
async fn rotate_agent(c: &NetCluster) -> anyhow::Result<(Option<u64>, Option<u64>)> {
    let h0 = Identity::agent("h0")?;
    let old = pki::show(&c.pki.files(&h0)?.cert)?.serial.to_string();
    eprintln!("[security] rotation: revoking agent h0's certificate {old}");
    c.cli(&["pki", "revoke", &old, "--reason", "rotation"])?;
    let silenced = until_h0(c, Duration::from_secs(15), |l| l != "ready").await;
    let (_, new) = c.pki.renew(&h0)?;
    let pid = c.agent_pid(0).context("agent h0 runs")?;
    eprintln!("[security] rotation: new certificate {new}, SIGHUP to agent h0 (pid {pid})");
    // SAFETY: signalling the agent process this cluster started.
    if unsafe { libc::kill(pid as i32, libc::SIGHUP) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    let back = until_h0(c, Duration::from_secs(20), |l| l == "ready").await;
    Ok((silenced, back))
}

fn control_socket_attempt(sock: PathBuf) -> Attempt {
    let script = "import socket,sys\n\
s=socket.socket(socket.AF_UNIX)\n\
try:\n s.connect(sys.argv[1])\n\
except OSError as e:\n print('refused: '+str(e)); sys.exit(0)\n\
s.sendall(b'{\"type\":\"hello\",\"job\":\"train\",\"rank\":0,\"pid\":1}\\n')\n\
print(s.recv(4096).decode().strip())\n";
    use std::os::unix::process::CommandExt;
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&sock)
        .uid(65534)
        .gid(65534)
        .output();
    let (refused, detail) = match out {
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stdout).trim().to_owned();
            let refused = text.starts_with("refused") || text.contains("\"error\"");
            (refused, text)
        }
        Err(e) => (false, format!("could not run the attempt: {e}")),
    };
    Attempt {
        what: "a process that is not a rank says hello on h0's control socket".into(),
        refused,
        detail,
    }
}

/// Runs the scenario.
pub async fn run() -> anyhow::Result<SecurityReport> {
    let spec = TestbedSpec {
        supervisors: 3,
        hosts: 2,
    };
    eprintln!("[security] starting 3 supervisors and 2 agents with mutual TLS");
    let c = NetCluster::start_all_up(spec, Duration::from_secs(30)).await?;
    let lab = &c.pki;
    let revoked = lab.admin("mallory", Role::Admin)?;
    let serial = pki::show(&revoked.cert)?.serial.to_string();
    c.cli(&["pki", "revoke", &serial, "--reason", "stolen laptop"])
        .context("revoke mallory's certificate")?;
    // Another CA, and an expired certificate of the cluster's CA.
    let other = tempfile::tempdir()?;
    let foreign = pki::LabPki::open(other.path())?.admin("root", Role::Admin)?;
    let ca_dir = lab
        .ca()
        .parent()
        .map(PathBuf::from)
        .context("the CA directory")?;
    let day = Duration::from_secs(86_400);
    let old = pki::issue_with_validity(
        &ca_dir,
        &Identity::admin("old", Role::Admin)?,
        &[],
        pki::Validity {
            not_before: SystemTime::now() - 10 * day,
            not_after: SystemTime::now() - day,
        },
        other.path(),
    )?;
    let m = Material {
        // A follower: refusals it makes must still reach the history.
        addr: c.sup_addrs()[(c.leader_index()? + 1) % 3].clone(),
        admin: c.admin_files()?,
        viewer: lab.admin("vera", Role::Viewer)?,
        operator: lab.admin("otto", Role::Operator)?,
        agent_h1: lab.agent("h1")?,
        stranger_sup: lab.supervisor(9)?,
        foreign,
        expired: ServerTlsFiles {
            ca: lab.ca(),
            cert: old.cert_path,
            key: old.key_path,
        },
        revoked,
    };
    // Let the revocation reach every supervisor's TLS server.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = state(&c)?;
    eprintln!("[security] attacking from host h1's namespace");
    let mut details = c.tb.ns(Node::Host(1)).run(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(attacks(m)))
    })??;
    details.push(control_socket_attempt(c.control_socket(0)));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = state(&c)?;
    let history = c.cli_json(&["history"])?;
    let refusals_in_history = history["records"].as_array().map_or(0, |r| {
        r.iter().filter(|x| x["op"]["Refused"].is_object()).count()
    });
    for d in &details {
        eprintln!(
            "[security] {:<55} {}  {}",
            d.what,
            if d.refused { "refused " } else { "ACCEPTED" },
            d.detail
        );
    }
    let refused = details.iter().filter(|d| d.refused).count();
    let accepted_bad = details.len() - refused;
    let state_changed_by_refused = usize::from(before != after);
    if state_changed_by_refused > 0 {
        eprintln!("[security] state before:\n{before}\nafter:\n{after}");
    }
    let (rotation_silenced_ms, rotation_back_ms) = rotate_agent(&c).await?;
    eprintln!(
        "[security] rotation: h0 silenced after {rotation_silenced_ms:?} ms, ready again {rotation_back_ms:?} ms after SIGHUP"
    );
    Ok(SecurityReport {
        ok: accepted_bad == 0
            && state_changed_by_refused == 0
            && refusals_in_history >= 3
            && rotation_silenced_ms.is_some()
            && rotation_back_ms.is_some(),
        scenario: "security",
        attempts: details.len(),
        refused,
        accepted_bad,
        state_changed_by_refused,
        refusals_in_history,
        rotation_silenced_ms,
        rotation_back_ms,
        details,
    })
}
