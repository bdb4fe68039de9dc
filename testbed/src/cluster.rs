//! A real supervisor cluster on loopback: one `railguard-supervisor` process
//! per member, each with its own sled data directory, killed with SIGKILL
//! and restarted on the same directory and port.
//!
//! Every process is killed when the [`SupervisorCluster`] is dropped (also
//! on panic), so no test leaves a supervisor behind.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use supervisor::api::{AdminReply, AdminRequest};
use supervisor::client::AdminClient;

/// Finds a binary of this workspace: `$RAILGUARD_BIN_DIR`, else the
/// directory of the running executable (or its parent for test binaries in
/// `deps/`).
pub fn bin_path(name: &str) -> anyhow::Result<PathBuf> {
    let mut dirs = Vec::new();
    if let Ok(d) = std::env::var("RAILGUARD_BIN_DIR") {
        dirs.push(PathBuf::from(d));
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            dirs.push(dir.to_path_buf());
            if dir.ends_with("deps") {
                if let Some(p) = dir.parent() {
                    dirs.push(p.to_path_buf());
                }
            }
        }
    }
    for d in &dirs {
        let p = d.join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!(
        "cannot find the {name} binary in {dirs:?}; build it first (cargo build --workspace --bins) or set RAILGUARD_BIN_DIR"
    )
}

/// A free TCP port on 127.0.0.1 (bound and released; good enough for tests
/// that start their listeners right away).
pub fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("bind an ephemeral port")?;
    Ok(l.local_addr()?.port())
}

/// One supervisor process.
pub struct SupNode {
    pub id: u64,
    pub addr: String,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    /// Started with `--join` (waits to be added) instead of a peer list.
    pub joiner: bool,
    child: Option<Child>,
}

impl SupNode {
    /// Whether the process is running (started and not killed).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }
}

/// The supervisors' log filter unless `RAILGUARD_SUP_LOG` says otherwise.
const DEFAULT_LOG: &str = "info,openraft=warn";

/// A cluster of supervisor processes on loopback.
pub struct SupervisorCluster {
    pub nodes: Vec<SupNode>,
    extra_args: Vec<String>,
    /// `RUST_LOG` of every supervisor.
    log_filter: String,
    bin: PathBuf,
    /// Holds the run directory; removed on drop unless `RAILGUARD_KEEP` is set.
    dir: Option<tempfile::TempDir>,
    pub run_dir: PathBuf,
    /// The cluster's lab CA (`None`: the cluster runs `--insecure`).
    pub pki: Option<pki::LabPki>,
}

impl SupervisorCluster {
    /// Starts `n` supervisors (ids 1..=n), each knowing the others as peers.
    /// The cluster still has to be initialised ([`Self::init`]).
    pub fn start(n: usize) -> anyhow::Result<Self> {
        Self::start_with(n, &[])
    }

    /// Like [`Self::start`], passing `extra_args` to every supervisor.
    /// Every member, client and simulated agent uses mutual TLS with
    /// certificates of a lab CA in the run directory.
    pub fn start_with(n: usize, extra_args: &[&str]) -> anyhow::Result<Self> {
        Self::start_tls(n, extra_args, true)
    }

    /// Like [`Self::start_with`]; `mtls` false runs every member
    /// `--insecure` (to measure what TLS costs).
    pub fn start_tls(n: usize, extra_args: &[&str], mtls: bool) -> anyhow::Result<Self> {
        let filter = std::env::var("RAILGUARD_SUP_LOG").unwrap_or_else(|_| DEFAULT_LOG.into());
        Self::start_full(n, extra_args, mtls, &filter)
    }

    /// Like [`Self::start_with`], every supervisor logging with the
    /// `RUST_LOG`-style `filter` (tests that read the logs).
    pub fn start_logging(n: usize, extra_args: &[&str], filter: &str) -> anyhow::Result<Self> {
        Self::start_full(n, extra_args, true, filter)
    }

    /// Like [`Self::start_with`], calling `prepare` with each member
    /// before it starts (e.g. to mount a test disk on its data directory).
    pub fn start_prepared(
        n: usize,
        extra_args: &[&str],
        prepare: impl FnMut(&SupNode) -> anyhow::Result<()>,
    ) -> anyhow::Result<Self> {
        let filter = std::env::var("RAILGUARD_SUP_LOG").unwrap_or_else(|_| DEFAULT_LOG.into());
        Self::start_full_prepared(n, extra_args, true, &filter, prepare)
    }

    fn start_full(n: usize, extra_args: &[&str], mtls: bool, filter: &str) -> anyhow::Result<Self> {
        Self::start_full_prepared(n, extra_args, mtls, filter, |_| Ok(()))
    }

    fn start_full_prepared(
        n: usize,
        extra_args: &[&str],
        mtls: bool,
        filter: &str,
        mut prepare: impl FnMut(&SupNode) -> anyhow::Result<()>,
    ) -> anyhow::Result<Self> {
        let bin = bin_path("railguard-supervisor")?;
        let dir = tempfile::Builder::new()
            .prefix("railguard-chaos-")
            .tempdir()?;
        let run_dir = dir.path().to_path_buf();
        let pki = if mtls {
            Some(pki::LabPki::open(&run_dir.join("pki"))?)
        } else {
            None
        };
        let mut nodes = Vec::new();
        for id in 1..=n as u64 {
            let port = free_port()?;
            nodes.push(SupNode {
                id,
                addr: format!("127.0.0.1:{port}"),
                data_dir: run_dir.join(format!("s{id}")),
                log: run_dir.join(format!("s{id}.log")),
                joiner: false,
                child: None,
            });
        }
        let mut c = Self {
            nodes,
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            log_filter: filter.to_string(),
            bin,
            dir: Some(dir),
            run_dir,
            pki,
        };
        for id in 1..=n as u64 {
            prepare(c.node(id))?;
            c.restart(id)?;
        }
        Ok(c)
    }

    fn node(&self, id: u64) -> &SupNode {
        &self.nodes[(id - 1) as usize]
    }

    fn node_mut(&mut self, id: u64) -> &mut SupNode {
        &mut self.nodes[(id - 1) as usize]
    }

    /// Addresses of all members, in id order.
    pub fn addrs(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.addr.clone()).collect()
    }

    /// Addresses of the members running now, in id order.
    pub fn live_addrs(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.is_running())
            .map(|n| n.addr.clone())
            .collect()
    }

    /// A client over the members running now.
    pub fn live_client(&self, actor: &str, timeout: Duration) -> anyhow::Result<AdminClient> {
        Ok(AdminClient::new(
            &self.live_addrs(),
            actor,
            timeout,
            &self.admin_tls()?,
        )?)
    }

    /// How an admin with every role dials the cluster.
    pub fn admin_tls(&self) -> anyhow::Result<pki::ClientTls> {
        self.tls_as(&pki::Identity::admin("chaos", pki::Role::Admin)?)
    }

    /// How the agent of `host` dials the cluster.
    pub fn agent_tls(&self, host: &str) -> anyhow::Result<pki::ClientTls> {
        self.tls_as(&pki::Identity::agent(host)?)
    }

    /// How `id`'s certificate dials the cluster (plain text if insecure).
    pub fn tls_as(&self, id: &pki::Identity) -> anyhow::Result<pki::ClientTls> {
        Ok(match &self.pki {
            Some(p) => pki::ClientTls::from_mode(&pki::TlsMode::Mtls(p.files(id)?))?,
            None => pki::ClientTls::Insecure,
        })
    }

    /// The `railguard` CLI's environment for an admin with every role.
    pub fn cli_env(&self) -> anyhow::Result<Vec<(&'static str, std::ffi::OsString)>> {
        Ok(match &self.pki {
            Some(p) => p
                .admin("chaos", pki::Role::Admin)?
                .cli_env()
                .into_iter()
                .map(|(k, v)| (k, v.into_os_string()))
                .collect(),
            None => vec![("RAILGUARD_INSECURE", "true".into())],
        })
    }

    /// Runs the `railguard` CLI against every member, as an admin with
    /// every role.
    pub fn cli(&self, args: &[&str]) -> anyhow::Result<std::process::Output> {
        self.cli_at(&self.addrs(), args)
    }

    /// Like [`Self::cli`], trying only `addrs`.
    pub fn cli_at(&self, addrs: &[String], args: &[&str]) -> anyhow::Result<std::process::Output> {
        Command::new(bin_path("railguard")?)
            .arg("--supervisor")
            .arg(addrs.join(","))
            .envs(self.cli_env()?)
            .env_remove("RAILGUARD_SUPERVISORS")
            .args(args)
            .output()
            .context("run railguard")
    }

    /// (Re)starts member `id` on its data directory and port.
    pub fn restart(&mut self, id: u64) -> anyhow::Result<()> {
        if self.node(id).is_running() {
            return Ok(());
        }
        // Founding members know each other; later members join empty.
        let peers: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| n.id != id && !n.joiner)
            .map(|n| format!("{}={}", n.id, n.addr))
            .collect();
        let node = self.node(id);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .with_context(|| format!("open {}", node.log.display()))?;
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--id")
            .arg(id.to_string())
            .arg("--listen")
            .arg(&node.addr)
            .arg("--data-dir")
            .arg(&node.data_dir);
        if node.joiner {
            cmd.arg("--join");
        } else {
            for p in &peers {
                cmd.arg("--peer").arg(p);
            }
        }
        match &self.pki {
            Some(p) => cmd.args(p.supervisor(id)?.args()),
            None => cmd.arg("--insecure"),
        };
        cmd.args(&self.extra_args);
        cmd.env("RUST_LOG", &self.log_filter)
            .env_remove("RUST_BACKTRACE")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = cmd
            .spawn()
            .with_context(|| format!("spawn {}", self.bin.display()))?;
        tracing::debug!(id, pid = child.id(), "supervisor started");
        crate::register_pid(child.id());
        self.node_mut(id).child = Some(child);
        Ok(())
    }

    /// Starts one more supervisor with `--join` (not yet a member; add it
    /// with `cluster add-member`). Returns its id.
    pub fn spawn_joiner(&mut self) -> anyhow::Result<u64> {
        let id = self.nodes.len() as u64 + 1;
        let port = free_port()?;
        self.nodes.push(SupNode {
            id,
            addr: format!("127.0.0.1:{port}"),
            data_dir: self.run_dir.join(format!("s{id}")),
            log: self.run_dir.join(format!("s{id}.log")),
            joiner: true,
            child: None,
        });
        self.restart(id)?;
        Ok(id)
    }

    /// Gives member `id` a new certificate in place of its files and sends
    /// it SIGHUP (rotation without a restart); returns the new serial.
    pub fn renew_and_hup(&self, id: u64) -> anyhow::Result<pki::Serial> {
        let pki = self
            .pki
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("an insecure cluster has no certificates"))?;
        let (_, serial) = pki.renew(&pki::Identity::supervisor(id))?;
        let pid = self
            .node(id)
            .pid()
            .ok_or_else(|| anyhow::anyhow!("supervisor {id} is not running"))?;
        // SAFETY: signalling a child process we spawned and still own.
        if unsafe { libc::kill(pid as i32, libc::SIGHUP) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(serial)
    }

    /// Sends `signal` to member `id` (SIGSTOP / SIGCONT: a paused
    /// supervisor keeps its sockets and its belief that it leads). Whether
    /// it was running.
    pub fn signal(&self, id: u64, signal: i32) -> bool {
        let Some(pid) = self
            .nodes
            .iter()
            .find(|n| n.id == id)
            .and_then(SupNode::pid)
        else {
            return false;
        };
        // SAFETY: signalling a child process we spawned and still own.
        unsafe { libc::kill(pid as i32, signal) == 0 }
    }

    /// Member `id`'s exit status once its process has ended by itself
    /// (then it counts as stopped: `restart` starts it again); None while it
    /// runs or was never started.
    pub fn exit_status(&mut self, id: u64) -> Option<std::process::ExitStatus> {
        let node = self.node_mut(id);
        let status = node.child.as_mut()?.try_wait().ok().flatten()?;
        if let Some(child) = node.child.take() {
            crate::unregister_pid(child.id());
        }
        Some(status)
    }

    /// SIGKILLs member `id` and reaps it.
    pub fn kill(&mut self, id: u64) {
        if let Some(mut child) = self.node_mut(id).child.take() {
            // SAFETY: signalling a child process we spawned and still own.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGKILL);
            }
            let _ = child.wait();
            crate::unregister_pid(child.id());
            tracing::debug!(id, "supervisor killed");
        }
    }

    /// A client that tries members in the given rotation (so different
    /// clients start at different supervisors).
    pub fn client(
        &self,
        actor: &str,
        rotate: usize,
        timeout: Duration,
    ) -> anyhow::Result<AdminClient> {
        let mut addrs = self.addrs();
        let len = addrs.len();
        addrs.rotate_left(rotate % len);
        // Each actor its own certificate, as independent operators are
        // (write quotas are per identity).
        Ok(AdminClient::new(
            &addrs,
            actor,
            timeout,
            &self.tls_as(&pki::Identity::admin(actor, pki::Role::Admin)?)?,
        )?)
    }

    /// A client for one member only.
    pub fn client_for(&self, id: u64, timeout: Duration) -> anyhow::Result<AdminClient> {
        Ok(AdminClient::new(
            &[self.node(id).addr.clone()],
            "chaos",
            timeout,
            &self.admin_tls()?,
        )?)
    }

    /// Initialises the cluster through member 1 and waits for a leader.
    pub async fn init(&self) -> anyhow::Result<u64> {
        let c = self.client_for(1, Duration::from_secs(2))?;
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            match c.call(AdminRequest::ClusterInit, false).await {
                Ok(_) => break,
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!(error = %e, "init not yet possible");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => bail!("cluster init failed: {e}"),
            }
        }
        self.wait_leader(Duration::from_secs(15)).await
    }

    /// Waits until a running member reports itself leader and every running
    /// member that answers agrees; returns its id.
    pub async fn wait_leader(&self, within: Duration) -> anyhow::Result<u64> {
        let deadline = Instant::now() + within;
        loop {
            let mut seen = Vec::new();
            for n in self.nodes.iter().filter(|n| n.is_running()) {
                let c = self.client_for(n.id, Duration::from_millis(500))?;
                if let Ok(AdminReply::Status(s)) = c.call(AdminRequest::Status, true).await {
                    // A node that has not joined yet knows no members.
                    if !s.members.is_empty() {
                        seen.push((n.id, s.leader));
                    }
                }
            }
            if let Some((_, Some(l))) = seen.first() {
                let agreed = seen.iter().all(|(_, x)| *x == Some(*l));
                let leader_running = self.node(*l).is_running();
                if agreed && leader_running && seen.iter().any(|(id, _)| id == l) {
                    return Ok(*l);
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "no agreed leader within {within:?}; saw {seen:?}; logs in {}",
                    self.run_dir.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Keeps the run directory (logs, data) after drop.
    pub fn keep(&mut self) -> PathBuf {
        if let Some(d) = self.dir.take() {
            let _ = d.keep();
        }
        self.run_dir.clone()
    }

    /// Path of member `id`'s log.
    pub fn log_of(&self, id: u64) -> &Path {
        &self.node(id).log
    }

    /// Member `id`'s data directory.
    pub fn data_dir(&self, id: u64) -> &Path {
        &self.node(id).data_dir
    }
}

impl Drop for SupervisorCluster {
    fn drop(&mut self) {
        // First: a test disk left frozen on a data directory (its owner
        // failed half-way) would keep a killed member from ever exiting,
        // and a mounted one the run directory from being removed.
        crate::disk::unmount_under(&self.run_dir);
        let ids: Vec<u64> = self.nodes.iter().map(|n| n.id).collect();
        for id in ids {
            self.kill(id);
        }
        if std::env::var_os("RAILGUARD_KEEP").is_some() {
            let p = self.keep();
            eprintln!("kept run directory {}", p.display());
        }
    }
}
