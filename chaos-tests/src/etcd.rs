//! etcd beside railguard, for `bench raft-commit --peer etcd`: a
//! three-member etcd cluster on loopback (Debian's `etcd-server`, installed
//! by `scripts/setup.sh`), secured as railguard's own is — mutual TLS
//! between members and with every client, certificates from a lab CA — and
//! a minimal gRPC client for its `KV.Put` and `Maintenance.Status` calls.
//!
//! The client speaks etcd's v3 wire protocol with message types written
//! here: protobuf ignores fields a reader does not know, so a subset of
//! `etcdserverpb`'s fields (with etcd's field numbers) is all the bench
//! needs. Every member is killed with SIGKILL when the [`EtcdCluster`] is
//! dropped, also on panic.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;

use testbed::cluster::free_port;

/// Where Debian's `etcd-server` puts the binary.
pub const ETCD_BIN: &str = "/usr/bin/etcd";

/// `etcdserverpb.ResponseHeader` (the fields the bench reads).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseHeader {
    #[prost(uint64, tag = "1")]
    pub cluster_id: u64,
    #[prost(uint64, tag = "2")]
    pub member_id: u64,
    #[prost(int64, tag = "3")]
    pub revision: i64,
    #[prost(uint64, tag = "4")]
    pub raft_term: u64,
}

/// `etcdserverpb.PutRequest`: key and value.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PutRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// `etcdserverpb.PutResponse`: only its header.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PutResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

/// `etcdserverpb.StatusRequest` (empty).
#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusRequest {}

/// `etcdserverpb.StatusResponse`: who answered, who leads, in which term.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(string, tag = "2")]
    pub version: String,
    #[prost(uint64, tag = "4")]
    pub leader: u64,
    #[prost(uint64, tag = "6")]
    pub raft_term: u64,
}

/// One client connection to one etcd member.
#[derive(Clone)]
pub struct EtcdClient {
    grpc: tonic::client::Grpc<Channel>,
}

impl EtcdClient {
    async fn unary<Q, R>(&mut self, path: &'static str, req: Q) -> Result<R, tonic::Status>
    where
        Q: prost::Message + Send + Sync + 'static,
        R: prost::Message + Default + Send + Sync + 'static,
    {
        self.grpc
            .ready()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let codec = tonic_prost::ProstCodec::<Q, R>::default();
        let r = self
            .grpc
            .unary(
                tonic::Request::new(req),
                PathAndQuery::from_static(path),
                codec,
            )
            .await?;
        Ok(r.into_inner())
    }

    /// Writes `value` at `key`; answered once the write is committed.
    pub async fn put(&mut self, key: Vec<u8>, value: Vec<u8>) -> Result<(), tonic::Status> {
        let _: PutResponse = self
            .unary("/etcdserverpb.KV/Put", PutRequest { key, value })
            .await?;
        Ok(())
    }

    /// The member's status: its id, the leader it knows, the term.
    pub async fn status(&mut self) -> Result<StatusResponse, tonic::Status> {
        self.unary("/etcdserverpb.Maintenance/Status", StatusRequest {})
            .await
    }
}

struct Member {
    client_addr: String,
    /// None once killed.
    child: Mutex<Option<Child>>,
}

impl Member {
    fn running(&self) -> bool {
        self.child
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }
}

/// A three-member (or `n`-member) etcd cluster on loopback.
pub struct EtcdCluster {
    members: Vec<Member>,
    tls: pki::ClientTls,
    /// Removed at drop unless the run failed to start (then kept for its logs).
    dir: Option<tempfile::TempDir>,
    run_dir: PathBuf,
    pub version: String,
}

impl EtcdCluster {
    /// Starts `n` members with mutual TLS on every port and waits until
    /// they agree on a leader. Fails with what to do when etcd is missing.
    pub async fn start(n: usize) -> anyhow::Result<Self> {
        if !Path::new(ETCD_BIN).is_file() {
            bail!(
                "{ETCD_BIN} not found: install Debian's etcd-server (scripts/setup.sh does) to compare with etcd"
            );
        }
        let dir = tempfile::Builder::new()
            .prefix("railguard-etcd-")
            .tempdir()?;
        let run_dir = dir.path().to_path_buf();
        let lab = pki::LabPki::open(&run_dir.join("pki"))?;
        let ports: Vec<(u16, u16)> = (0..n)
            .map(|_| Ok((free_port()?, free_port()?)))
            .collect::<anyhow::Result<_>>()?;
        let initial = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("e{i}=https://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let admin = lab.files(&pki::Identity::admin("bench", pki::Role::Admin)?)?;
        let tls = pki::ClientTls::from_mode(&pki::TlsMode::Mtls(admin))?;
        // From here on a failure drops the cluster, which kills what was
        // started (and the chaos binary's Ctrl-C clean-up knows the pids).
        let mut c = EtcdCluster {
            members: Vec::new(),
            tls,
            dir: Some(dir),
            run_dir: run_dir.clone(),
            version: String::new(),
        };
        for (i, (client, peer)) in ports.iter().enumerate() {
            // Supervisor certificates serve and dial (server and client
            // auth) and name 127.0.0.1: what an etcd member needs.
            let files = lab.files(&pki::Identity::supervisor(i as u64 + 1))?;
            let client_url = format!("https://127.0.0.1:{client}");
            let peer_url = format!("https://127.0.0.1:{peer}");
            let log = std::fs::File::create(run_dir.join(format!("e{i}.log")))?;
            let mut cmd = Command::new(ETCD_BIN);
            cmd.arg("--name")
                .arg(format!("e{i}"))
                .arg("--data-dir")
                .arg(run_dir.join(format!("e{i}")))
                .args(["--listen-client-urls", &client_url])
                .args(["--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url])
                .args(["--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &initial])
                .args(["--initial-cluster-state", "new"])
                .args(["--initial-cluster-token", "railguard-bench"])
                .args(["--logger", "zap", "--log-level", "warn"])
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log);
            // The same certificate for clients and for peers, each side
            // requiring one of the CA's.
            for side in ["", "peer-"] {
                cmd.arg(format!("--{side}cert-file"))
                    .arg(&files.cert)
                    .arg(format!("--{side}key-file"))
                    .arg(&files.key)
                    .arg(format!("--{side}trusted-ca-file"))
                    .arg(&files.ca)
                    .arg(format!("--{side}client-cert-auth"));
            }
            let child = cmd.spawn().with_context(|| format!("start {ETCD_BIN}"))?;
            testbed::register_pid(child.id());
            c.members.push(Member {
                client_addr: format!("127.0.0.1:{client}"),
                child: Mutex::new(Some(child)),
            });
        }
        let (leader, _) = match c.leader(Duration::from_secs(30)).await {
            Ok(l) => l,
            Err(e) => {
                // Keep the members' logs for whoever reads the error.
                if let Some(d) = c.dir.take() {
                    let _ = d.keep();
                }
                return Err(e);
            }
        };
        c.version = c.client(leader).await?.status().await?.version;
        Ok(c)
    }

    /// A new connection to member `i`.
    pub async fn client(&self, i: usize) -> anyhow::Result<EtcdClient> {
        let m = self.members.get(i).context("no such etcd member")?;
        let channel = self
            .tls
            .endpoint(&m.client_addr)?
            .connect_timeout(Duration::from_secs(3))
            .timeout(Duration::from_secs(5))
            .connect()
            .await
            .with_context(|| format!("connect to etcd at {}", m.client_addr))?;
        Ok(EtcdClient {
            grpc: tonic::client::Grpc::new(channel),
        })
    }

    /// The member every running member names as leader, and the term,
    /// waiting up to `within` for them to agree.
    pub async fn leader(&self, within: Duration) -> anyhow::Result<(usize, u64)> {
        let deadline = Instant::now() + within;
        loop {
            let mut seen = Vec::new();
            let running: Vec<usize> = (0..self.members.len())
                .filter(|i| self.members[*i].running())
                .collect();
            for &i in &running {
                let Ok(mut c) = self.client(i).await else {
                    continue;
                };
                if let Ok(s) = c.status().await {
                    let me = s.header.as_ref().map_or(0, |h| h.member_id);
                    seen.push((i, me, s.leader, s.raft_term));
                }
            }
            let agreed =
                seen.len() == running.len() && seen.iter().all(|s| s.2 != 0 && s.2 == seen[0].2);
            if agreed {
                if let Some((i, _, _, term)) = seen.iter().find(|s| s.1 == s.2) {
                    return Ok((*i, *term));
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "etcd members did not agree on a leader within {within:?} (saw {seen:?}); logs in {}",
                    self.run_dir.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Kills member `i` with SIGKILL (its data stays; it is not restarted).
    pub fn kill(&self, i: usize) {
        if let Some(m) = self.members.get(i) {
            kill_child(&m.child);
        }
    }

    /// The members' process ids (for the CPU they use).
    pub fn pids(&self) -> Vec<u32> {
        self.members
            .iter()
            .filter_map(|m| {
                let c = m.child.lock().unwrap_or_else(|e| e.into_inner());
                c.as_ref().map(Child::id)
            })
            .collect()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for m in &self.members {
            kill_child(&m.child);
        }
        if std::thread::panicking() {
            if let Some(d) = self.dir.take() {
                let _ = d.keep();
            }
        }
    }
}

fn kill_child(child: &Mutex<Option<Child>>) {
    let taken = child.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(mut c) = taken {
        let _ = c.kill();
        let _ = c.wait();
        testbed::unregister_pid(c.id());
    }
}
