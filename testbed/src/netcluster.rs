//! A whole railguard cluster inside the netns testbed: supervisors in
//! `<p>s<i>` listening on their management addresses, one `railguard-agent`
//! per host namespace watching its real `rail0`/`rail1`, and the admin CLI
//! run inside a supervisor namespace.
//!
//! With leaf splits ([`NetClusterOptions::leaf_splits`]) the testbed's
//! topology is written to `<run dir>/topology.toml` and every supervisor
//! starts with `--topology` on it.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::cluster::bin_path;
use crate::{host_name, mgmt_addr, LeafSplit, Node, Testbed, TestbedOptions, TestbedSpec};

/// The shipped playbook that reshapes a contended link.
pub const RESHAPING_PLAYBOOK: &str = "link-contention";

/// Port every supervisor listens on (inside its own namespace).
pub const SUP_PORT: u16 = 7400;

/// Optional parts of a [`NetCluster`].
#[derive(Debug, Clone, Default)]
pub struct NetClusterOptions {
    /// Extra flags for host `h`'s agent in `agent_args[h]` (missing
    /// entries: none).
    pub agent_args: Vec<Vec<String>>,
    /// Split rails into two leaves with a shaped uplink each; the
    /// supervisors get the resulting topology (`--topology`).
    pub leaf_splits: Vec<LeafSplit>,
}

/// The running cluster.
pub struct NetCluster {
    pub tb: Testbed,
    pub run_dir: tempfile::TempDir,
    sup_bin: PathBuf,
    agent_bin: PathBuf,
    cli_bin: PathBuf,
    /// Extra flags per host's agent (kept for restarts).
    agent_args: Vec<Vec<String>>,
    /// The topology file every supervisor is started with, if any.
    topology_file: Option<PathBuf>,
    /// The pid of each host's latest agent.
    agent_pids: std::sync::Mutex<std::collections::BTreeMap<usize, u32>>,
    /// Set when a bounded wait timed out: the run directory (named in the
    /// error) is kept when the cluster is dropped.
    keep_on_drop: std::sync::atomic::AtomicBool,
    /// The cluster's CA: every supervisor, agent and CLI call uses mutual
    /// TLS with its own certificate.
    pub pki: pki::LabPki,
    /// The namespace the CLI runs in (default the first supervisor's).
    cli_node: std::sync::Mutex<Node>,
}

impl NetCluster {
    /// Builds the testbed and starts supervisors (initialised) and agents.
    pub async fn start(spec: TestbedSpec) -> anyhow::Result<NetCluster> {
        Self::start_with(spec, Vec::new()).await
    }

    /// [`Self::start`], then waits (at most `within`) until every data NIC
    /// (two per host) is committed Up.
    pub async fn start_all_up(spec: TestbedSpec, within: Duration) -> anyhow::Result<NetCluster> {
        let c = Self::start(spec).await?;
        let nics = spec.hosts * 2;
        c.wait_until("every NIC up", within, |c| c.nics_up() == nics)
            .await?;
        Ok(c)
    }

    /// Like [`Self::start`], with extra flags for host `h`'s agent in
    /// `agent_args[h]` (missing entries: none).
    pub async fn start_with(
        spec: TestbedSpec,
        agent_args: Vec<Vec<String>>,
    ) -> anyhow::Result<NetCluster> {
        Self::start_opts(
            spec,
            NetClusterOptions {
                agent_args,
                ..Default::default()
            },
        )
        .await
    }

    /// Like [`Self::start`], with the optional parts in `opts`.
    pub async fn start_opts(
        spec: TestbedSpec,
        opts: NetClusterOptions,
    ) -> anyhow::Result<NetCluster> {
        let split = !opts.leaf_splits.is_empty();
        let tb = Testbed::build_with(
            spec,
            TestbedOptions {
                leaf_splits: opts.leaf_splits,
            },
        )
        .await?;
        // Agents run ranks as the job user: it must exist before they start
        // (the control socket takes its group then), and reach the run
        // directory (sockets, checkpoints) through it.
        crate::job_user::ensure_job_user()?;
        let run_dir = tempfile::Builder::new()
            .prefix("railguard-net-")
            .tempdir()?;
        std::fs::set_permissions(run_dir.path(), std::fs::Permissions::from_mode(0o755))?;
        crate::cleanup::register_dir(run_dir.path());
        let topology_file = if split {
            let path = run_dir.path().join("topology.toml");
            let text = toml::to_string(&tb.topology()).context("serialise the topology")?;
            std::fs::write(&path, text)
                .with_context(|| format!("write topology file {}", path.display()))?;
            tracing::info!(path = %path.display(), "topology written for the supervisors");
            Some(path)
        } else {
            None
        };
        let pki = pki::LabPki::open(&run_dir.path().join("pki"))?;
        let c = NetCluster {
            pki,
            tb,
            run_dir,
            sup_bin: bin_path("railguard-supervisor")?,
            agent_bin: bin_path("railguard-agent")?,
            cli_bin: bin_path("railguard")?,
            agent_args: opts.agent_args,
            topology_file,
            agent_pids: Default::default(),
            keep_on_drop: std::sync::atomic::AtomicBool::new(
                std::env::var_os("RAILGUARD_KEEP_RUN_DIR").is_some(),
            ),
            cli_node: std::sync::Mutex::new(Node::Supervisor(0)),
        };
        for i in 0..spec.supervisors {
            c.start_supervisor(i)?;
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            // A lone supervisor initialises itself; a group needs the order.
            if c.cli(&["cluster", "init"]).is_ok() || c.has_leader() {
                break;
            }
            if Instant::now() > deadline {
                bail!("cluster init failed");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        for h in 0..spec.hosts {
            c.start_agent(h)?;
        }
        Ok(c)
    }

    /// Supervisor addresses (management network).
    pub fn sup_addrs(&self) -> Vec<String> {
        (0..self.tb.spec.supervisors)
            .map(|i| format!("{}:{SUP_PORT}", mgmt_addr(Node::Supervisor(i))))
            .collect()
    }

    fn log(&self, name: &str) -> anyhow::Result<std::fs::File> {
        Ok(std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.run_dir.path().join(name))?)
    }

    /// (Re)starts supervisor `i` on its data directory.
    pub fn start_supervisor(&self, i: usize) -> anyhow::Result<u32> {
        let mut cmd = self.tb.command(
            Node::Supervisor(i),
            self.sup_bin.to_str().unwrap_or_default(),
        )?;
        cmd.args([
            "--id",
            &(i + 1).to_string(),
            "--listen",
            &self.sup_addrs()[i],
            "--data-dir",
        ])
        .arg(self.run_dir.path().join(format!("s{i}")));
        for (j, a) in self.sup_addrs().iter().enumerate() {
            if j != i {
                cmd.args(["--peer", &format!("{}={a}", j + 1)]);
            }
        }
        if let Some(t) = &self.topology_file {
            cmd.arg("--topology").arg(t);
        }
        cmd.args(self.pki.supervisor(i as u64 + 1)?.args());
        let log = self.log(&format!("s{i}.log"))?;
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .env_remove("RUST_BACKTRACE");
        self.tb.spawn_command(Node::Supervisor(i), cmd)
    }

    /// (Re)starts the agent of host `h` (same outbox directory).
    pub fn start_agent(&self, h: usize) -> anyhow::Result<u32> {
        let mut cmd = self
            .tb
            .command(Node::Host(h), self.agent_bin.to_str().unwrap_or_default())?;
        cmd.args([
            "--host",
            &host_name(h),
            "--supervisor",
            &self.sup_addrs().join(","),
            "--data-dir",
        ])
        .arg(self.run_dir.path().join(format!("h{h}")))
        .arg("--control-socket")
        .arg(self.control_socket(h))
        .args(self.pki.agent(&host_name(h))?.args())
        .args(self.agent_args.get(h).into_iter().flatten());
        let log = self.log(&format!("h{h}.log"))?;
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .env_remove("RUST_BACKTRACE");
        let pid = self.tb.spawn_command(Node::Host(h), cmd)?;
        self.agent_pids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(h, pid);
        Ok(pid)
    }

    /// The topology file the supervisors were started with (leaf split only).
    pub fn topology_file(&self) -> Option<&std::path::Path> {
        self.topology_file.as_deref()
    }

    /// The pid of host `h`'s latest agent.
    pub fn agent_pid(&self, h: usize) -> Option<u32> {
        self.agent_pids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&h)
            .copied()
    }

    /// The job contract socket of host `h`'s agent (namespaces share the
    /// filesystem, so a job in the test process reaches it).
    pub fn control_socket(&self, h: usize) -> PathBuf {
        self.run_dir.path().join(format!("h{h}.sock"))
    }

    /// The certificate the cluster's CLI calls present: an admin with
    /// every role.
    pub fn admin_files(&self) -> anyhow::Result<pki::ServerTlsFiles> {
        Ok(self.pki.admin("chaos", pki::Role::Admin)?)
    }

    /// Runs `railguard ARGS` inside the CLI node's namespace (the first
    /// supervisor's unless [`Self::set_cli_node`] said otherwise); returns
    /// stdout, or the error line.
    pub fn cli(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self
            .cli_command(&self.sup_addrs(), args)?
            .output()
            .context("run railguard")?;
        if !out.status.success() {
            bail!(
                "railguard {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).to_string())
    }

    /// `railguard ARGS` against `addrs`, prepared (in the first supervisor's
    /// namespace, as the admin, 3 s per call) for the caller to run.
    pub fn cli_command(&self, addrs: &[String], args: &[&str]) -> anyhow::Result<Command> {
        let node = *self.cli_node.lock().unwrap_or_else(|e| e.into_inner());
        let mut cmd = self
            .tb
            .command(node, self.cli_bin.to_str().unwrap_or_default())?;
        cmd.args(["--supervisor", &addrs.join(","), "--timeout", "3s"])
            .envs(self.admin_files()?.cli_env())
            .args(args);
        Ok(cmd)
    }

    /// Runs the CLI from `node`'s namespace from now on (a scenario that
    /// partitions the supervisors runs it from a host both sides hear).
    pub fn set_cli_node(&self, node: Node) {
        *self.cli_node.lock().unwrap_or_else(|e| e.into_inner()) = node;
    }

    /// Deletes the shipped `link-contention` playbook, so railguard does
    /// not reshape a load a run wants left as it is (the queue it builds is
    /// what the run measures).
    pub fn disable_reshaping(&self) -> anyhow::Result<()> {
        self.cli(&["playbook", "delete", RESHAPING_PLAYBOOK])
            .map(drop)
            .with_context(|| format!("delete the {RESHAPING_PLAYBOOK} playbook"))
    }

    /// Whether the cluster reports a leader.
    pub fn has_leader(&self) -> bool {
        self.cli_json(&["cluster", "members"])
            .ok()
            .and_then(|v| {
                v.as_array()
                    .or_else(|| v.get("members").and_then(|m| m.as_array()))
                    .cloned()
            })
            .is_some_and(|m| {
                m.iter()
                    .any(|x| x["leader"] == serde_json::Value::Bool(true))
            })
    }

    /// Runs the CLI with `--output json` and parses the reply.
    pub fn cli_json(&self, args: &[&str]) -> anyhow::Result<serde_json::Value> {
        let mut a = vec!["--output", "json"];
        a.extend_from_slice(args);
        Ok(serde_json::from_str(&self.cli(&a)?)?)
    }

    /// The sequence number of the newest committed event among the first
    /// 5000 (0 for none): where to follow the event log from.
    pub fn last_event_seq(&self) -> anyhow::Result<u64> {
        let v = self.cli_json(&["events", "--since", "0", "--limit", "5000"])?;
        Ok(v["events"]
            .as_array()
            .and_then(|a| a.last())
            .and_then(|e| e["seq"].as_u64())
            .unwrap_or(0))
    }

    /// How many NICs the cluster has committed as Up (0 when the CLI
    /// fails).
    pub fn nics_up(&self) -> usize {
        self.cli_json(&["nic", "list", "--state", "up"])
            .map(|v| v["nics"].as_array().map_or(0, |a| a.len()))
            .unwrap_or(0)
    }

    /// The committed state of `host`/`nic` (e.g. "up", "down").
    pub fn nic_state(&self, host: &str, nic: &str) -> anyhow::Result<String> {
        let v = self.cli_json(&["node", "show", host])?;
        Ok(v["host"]["nics"][nic]["state"]
            .as_str()
            .unwrap_or("?")
            .to_string())
    }

    /// Waits (bounded) until `f` holds, polling every 50 ms.
    pub async fn wait_until(
        &self,
        what: &str,
        within: Duration,
        mut f: impl FnMut(&Self) -> bool,
    ) -> anyhow::Result<Duration> {
        let t0 = Instant::now();
        while t0.elapsed() < within {
            if f(self) {
                return Ok(t0.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.keep_on_drop
            .store(true, std::sync::atomic::Ordering::Relaxed);
        bail!(
            "timed out after {within:?} waiting for {what}; logs in {}",
            self.run_dir.path().display()
        )
    }

    /// Which supervisor (index) leads, per the cluster.
    pub fn leader_index(&self) -> anyhow::Result<usize> {
        // `status` fails while no leader with a quorum can serve (an
        // election): asked again for up to 5 s.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let got = self
                .cli_json(&["status"])
                .and_then(|v| v["leader"].as_u64().context("no leader"));
            match got {
                Ok(id) => return Ok(id as usize - 1),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    /// Keeps the run directory (logs) after the cluster is dropped.
    pub fn keep_logs(self) -> PathBuf {
        self.keep_on_drop
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.run_dir.path().to_path_buf()
    }

    /// Keeps the run directory after the cluster is dropped (logged).
    pub fn keep_run_dir(&self) {
        self.keep_on_drop
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for NetCluster {
    fn drop(&mut self) {
        crate::cleanup::unregister_dir(self.run_dir.path());
        if self.keep_on_drop.load(std::sync::atomic::Ordering::Relaxed) {
            self.run_dir.disable_cleanup(true);
            eprintln!("run directory kept: {}", self.run_dir.path().display());
        }
    }
}
