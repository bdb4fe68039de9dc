//! Shared fixtures: a real `railguard-supervisor` process (one-node cluster)
//! on a free loopback port with its own data directory, killed on drop,
//! speaking mutual TLS with certificates from one lab CA per test binary
//! ([`lab`]): supervisors, agents and admins each present their own.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use pki::{Identity, LabPki, Role, ServerTlsFiles};
use proto::v1::agent_client::AgentClient;
use proto::v1::RegisterHost;
use supervisor::api::{AdminReply, AdminRequest};
use supervisor::client::{AdminClient, ClientTls};
use supervisor::model::events::Event;

/// The testbed's agent stand-in (agent client, the testbed's two rails, NIC
/// events), compiled into these tests from its source: testbed depends on
/// supervisor, so supervisor cannot take it as a dev-dependency (cargo
/// refuses the cycle).
#[path = "../../../testbed/src/agentsim.rs"]
pub mod agentsim;

pub const SUPERVISOR: &str = env!("CARGO_BIN_EXE_railguard-supervisor");

/// The `railguard` CLI (package `railguard-cli`): `$RAILGUARD_BIN_DIR`, else
/// beside the supervisor binary in the target dir. Cargo builds it only for
/// its own package, so build it first: `cargo build --workspace --bins`.
pub fn cli_bin() -> std::path::PathBuf {
    let dir = match std::env::var_os("RAILGUARD_BIN_DIR") {
        Some(d) => std::path::PathBuf::from(d),
        None => Path::new(SUPERVISOR)
            .parent()
            .expect("the supervisor binary has a directory")
            .to_path_buf(),
    };
    let p = dir.join("railguard");
    assert!(
        p.is_file(),
        "cannot find the railguard CLI at {}; build it first (cargo build --workspace --bins) or set RAILGUARD_BIN_DIR",
        p.display()
    );
    p
}

/// The lab CA of this test binary (in the target's tmp dir, reused).
pub fn lab() -> &'static std::sync::Mutex<LabPki> {
    static LAB: std::sync::OnceLock<std::sync::Mutex<LabPki>> = std::sync::OnceLock::new();
    LAB.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("pki-{}", module_path!().replace("::", "-")));
        std::sync::Mutex::new(LabPki::open(&dir).expect("lab CA"))
    })
}

/// The files of `id`'s certificate.
pub fn files(id: &Identity) -> ServerTlsFiles {
    lab()
        .lock()
        .unwrap()
        .files(id)
        .expect("issue a lab certificate")
}

/// A client TLS setting presenting `id`'s certificate.
pub fn tls_as(id: &Identity) -> ClientTls {
    ClientTls::from_mode(&pki::TlsMode::Mtls(files(id))).expect("client TLS")
}

/// The admin every test acts as unless it says otherwise.
pub fn admin_id() -> Identity {
    Identity::admin("test", Role::Admin).unwrap()
}

/// A channel to `addr` as the agent of `host`.
pub fn agent_channel(addr: &str, host: &str) -> tonic::transport::Channel {
    supervisor::network::channel(addr, &tls_as(&Identity::agent(host).unwrap())).unwrap()
}

/// `--ca/--cert/--key` of supervisor `id`.
pub fn sup_args(id: u64) -> Vec<String> {
    files(&Identity::supervisor(id)).args()
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub struct Sup {
    pub child: Option<Child>,
    pub addr: String,
    pub dir: tempfile::TempDir,
    extra: Vec<String>,
}

impl Sup {
    /// Starts a one-node supervisor and waits until it leads.
    pub async fn start(extra: &[&str]) -> Sup {
        let dir = tempfile::tempdir().unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let mut s = Sup {
            child: None,
            addr,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        s.spawn().await;
        s.wait_shipped_playbooks().await;
        s
    }

    /// [`Sup::start`], then registers host `h0` (see [`register`]).
    pub async fn with_h0(extra: &[&str]) -> Sup {
        let s = Sup::start(extra).await;
        register(&s.addr, "h0").await;
        s
    }

    /// A new cluster's leader installs the shipped playbooks once, as its
    /// first own write; tests that compare state before and after wait for
    /// it so that write is not mistaken for theirs.
    pub async fn wait_shipped_playbooks(&self) {
        let c = self.client();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let req = AdminRequest::Events {
                since: 0,
                limit: 100,
                newest: false,
            };
            if let Ok(AdminReply::Events { events, .. }) = c.call(req, false).await {
                if events.iter().any(|e| {
                    matches!(e.event, Event::ShippedPlaybooks { installed, .. } if installed > 0)
                }) {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "the leader did not install the shipped playbooks"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn spawn(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("sup.log")).unwrap();
        let child = Command::new(SUPERVISOR)
            .args(["--listen", &self.addr, "--data-dir"])
            .arg(self.dir.path().join("data"))
            .args(sup_args(1))
            .args(&self.extra)
            .env_remove("RUST_BACKTRACE")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        self.wait_leader().await;
    }

    pub async fn wait_leader(&self) {
        let c = self.client();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(AdminReply::Status(s)) = c.call(AdminRequest::Status, true).await {
                if s.leader.is_some() {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "supervisor did not become leader"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn client(&self) -> AdminClient {
        self.client_as(&admin_id())
    }

    /// An admin client presenting `id`'s certificate.
    pub fn client_as(&self, id: &Identity) -> AdminClient {
        AdminClient::new(
            std::slice::from_ref(&self.addr),
            "test",
            Duration::from_secs(5),
            &tls_as(id),
        )
        .unwrap()
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn data_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("data")
    }

    /// Runs the CLI against this supervisor.
    pub fn cli(&self, args: &[&str]) -> Output {
        cli(&self.addr, args)
    }
}

impl Drop for Sup {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn cli(addr: &str, args: &[&str]) -> Output {
    Command::new(cli_bin())
        .args(["--supervisor", addr])
        .args(args)
        .env_remove("RAILGUARD_SUPERVISORS")
        .envs(files(&admin_id()).cli_env())
        .output()
        .unwrap()
}

pub fn exists(p: &Path) -> bool {
    p.exists()
}

/// The agent API of the supervisor at `addr` (the testbed's agent
/// stand-in), as the agent of `host` (its own certificate).
pub async fn agent(addr: &str, host: &str) -> AgentClient<tonic::transport::Channel> {
    agentsim::agent_client(addr, &tls_as(&Identity::agent(host).unwrap())).unwrap()
}

/// Registers `host` with the testbed's two rails (each the other's
/// backup), as agent version `test`; returns the last applied event
/// sequence the supervisor answered (where the agent resumes).
pub async fn register(addr: &str, host: &str) -> u64 {
    agent(addr, host)
        .await
        .register(RegisterHost {
            host: host.into(),
            nics: agentsim::testbed_nics(),
            labels: Default::default(),
            agent_version: "test".into(),
        })
        .await
        .expect("register")
        .into_inner()
        .last_applied_seq
}

/// The first 1000 committed events, read from the leader.
pub async fn events(c: &AdminClient) -> Vec<supervisor::model::ClusterEvent> {
    let AdminReply::Events { events, .. } = c
        .call(
            AdminRequest::Events {
                since: 0,
                limit: 1000,
                newest: false,
            },
            false,
        )
        .await
        .unwrap()
    else {
        panic!("not events")
    };
    events
}
