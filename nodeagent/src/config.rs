//! The agent's configuration: one loader for the TOML file and the flags
//! (flags win), validated before anything starts; NICs are discovered from
//! the host's `rail<N>` interfaces when none are configured.
//!
//! Who ranks run as and who may talk to the control socket (defaults
//! shown; see [`crate::jobs`] and [`crate::control`]):
//!
//! ```toml
//! [jobs]
//! default_user = "railguard-job"   # a rank whose order names no user
//! allowed_users = []               # users an order may name besides it
//! allowed_commands = []            # absolute prefixes argv[0] must be under; [] = any
//! allow_root = false               # may a rank run as uid 0
//!
//! [control]
//! socket_group = "..."             # default: default_user's primary group
//! ```
//!
//! The default user need not exist for the agent to start, but every rank
//! it should run is refused until it does (`useradd --system
//! railguard-job`), and the control socket's group is taken when the agent
//! starts (root's group if neither `socket_group` nor the user exists).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::damper::DampingConfig;
use crate::jobs::lookup_group;
use crate::jobs::lookup_user;
use crate::jobs::JobsPolicy;
use crate::probe::clock::TestClock;
use crate::probe::mesh::{MeshConfig, MAX_PAIRS_PER_S};
use crate::probe::sock::TsMode;
use crate::probe::ProbeOptions;

/// A data NIC the agent watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicConfig {
    pub name: String,
    pub rail: Option<u32>,
    pub backup: Option<String>,
    pub rdma_device: Option<String>,
    /// The NIC's IPv4 address (found at start; registered for probing).
    pub addr: Option<std::net::Ipv4Addr>,
}

/// Everything the agent needs to run.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub host: String,
    pub supervisors: Vec<String>,
    pub nics: Vec<NicConfig>,
    pub data_dir: PathBuf,
    pub damping: DampingConfig,
    /// The job contract's Unix socket.
    pub control_socket: PathBuf,
    /// The probe mesh (None: off).
    pub probe: Option<ProbeOptions>,
    /// How the agent dials supervisors: its own certificate (the host's
    /// agent certificate), or plain text on an `--insecure` cluster.
    pub tls: pki::ClientTls,
    /// TEST ONLY: wait this long before executing each order (an action
    /// that takes a while, so chaos tests can crash the leader while an
    /// order is in flight). Zero on a real cluster.
    pub test_order_delay: Duration,
    /// `[jobs]`: who ranks run as and what they may run.
    pub jobs: JobsPolicy,
    /// The control socket's group (`[control] socket_group`, else the
    /// default job user's primary group; None: root's group, when neither
    /// exists).
    pub control_socket_group: Option<u32>,
    /// `[reroute] fabric_rto_min_ms`: the `rto_min` the data NICs'
    /// connected routes get (0: the kernel's default, 200 ms).
    pub fabric_rto_min_ms: u32,
    /// `[reroute] failback_hold_ms`: a NIC back up after being down stays
    /// Recovering this long before it is Up (its connections and detour
    /// routes fail back then).
    pub failback_hold: Duration,
}

/// Default `[reroute] failback_hold_ms`. Failing back at the moment the
/// carrier returns stalled an iperf3 stream for 50-85 ms in 5 of 8 pulls
/// (`bench tcp-failover`); failbacks that came seconds later (the NIC was
/// damped) stalled it for about 10 ms.
pub const DEFAULT_FAILBACK_HOLD_MS: u64 = 500;
/// The largest `failback_hold_ms` taken.
pub const MAX_FAILBACK_HOLD_MS: u64 = 600_000;

/// Default `[reroute] fabric_rto_min_ms`: a connection stalled by a pulled
/// cable retransmits within milliseconds once a detour works, instead of
/// waiting out the kernel's 200 ms minimum (datacentre round trips are
/// tens of microseconds, so 10 ms is still far above any real RTT).
pub const DEFAULT_FABRIC_RTO_MIN_MS: u32 = 10;
/// The largest `[probe] degraded_late_us` taken (a second: probes held
/// back longer are a dead path's business, not a gray link's).
pub const MAX_DEGRADED_LATE_US: u64 = 1_000_000;
/// The largest `fabric_rto_min_ms` taken.
pub const MAX_FABRIC_RTO_MIN_MS: u32 = 1_000;

/// Default data directory for the outbox.
pub const DEFAULT_DATA_DIR: &str = "./railguard-agent-data";
/// Default path of the job contract's socket.
pub const DEFAULT_CONTROL_SOCKET: &str = rdma::contract::DEFAULT_SOCKET;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileNic {
    name: String,
    rail: Option<u32>,
    backup: Option<String>,
    rdma_device: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    host: Option<String>,
    #[serde(default)]
    supervisors: Vec<String>,
    data_dir: Option<PathBuf>,
    #[serde(default)]
    nic: Vec<FileNic>,
    damping: Option<DampingConfig>,
    control_socket: Option<PathBuf>,
    probe: Option<FileProbe>,
    /// `[tls]`: the host's agent certificate, or `insecure = true`.
    #[serde(default)]
    tls: pki::TlsArgs,
    jobs: Option<JobsPolicy>,
    control: Option<FileControl>,
    reroute: Option<FileReroute>,
}

/// `[reroute]`: detour routes and the fabric routes' retransmission floor.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileReroute {
    fabric_rto_min_ms: Option<u32>,
    failback_hold_ms: Option<u64>,
}

/// `[control]`: the control socket.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileControl {
    /// The socket file's group (members may connect; mode 0660).
    socket_group: Option<String>,
}

/// `[probe]`: the probe mesh.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileProbe {
    enabled: Option<bool>,
    port: Option<u16>,
    pairs_per_s: Option<u32>,
    cpu_budget_pct: Option<f64>,
    purity_ns: Option<u64>,
    silence_ms: Option<u64>,
    /// Share of probes (%) a NIC may lose before it is Degraded (0: never).
    degraded_loss_pct: Option<f64>,
    /// How late (µs above the floor) a probe counts as held back; a NIC
    /// holding back a share of every peer's probes is Degraded (0: never).
    degraded_late_us: Option<u64>,
    timestamps: Option<TsMode>,
}

/// Values from the command line.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub host: Option<String>,
    pub supervisors: Vec<String>,
    pub data_dir: Option<PathBuf>,
    /// `NAME[:RAIL[:BACKUP[:RDMA]]]`.
    pub nics: Vec<String>,
    pub control_socket: Option<PathBuf>,
    /// Turn the probe mesh off.
    pub no_probes: bool,
    pub probe_port: Option<u16>,
    pub probe_rate: Option<u32>,
    /// The probe thread's CPU budget (% of one core; 0: no governor).
    pub probe_cpu_budget_pct: Option<f64>,
    /// Share of probes (%) a NIC may lose before it is Degraded (0: never).
    pub probe_degraded_loss_pct: Option<f64>,
    /// How late (µs above the floor) a probe counts as held back (0: the
    /// delay check off).
    pub probe_degraded_late_us: Option<u64>,
    pub probe_timestamps: Option<TsMode>,
    /// Test only: clock error applied to every probe timestamp.
    pub test_clock_offset_ns: Option<i64>,
    pub test_clock_drift_ppb: Option<i64>,
    pub test_clock_anchor_ns: Option<i64>,
    /// Test only: steps of that clock error.
    pub test_clock_steps: Vec<crate::probe::clock::ClockStep>,
    /// Test only: delay before executing each order (ms).
    pub test_order_delay_ms: Option<u64>,
    /// `--ca`, `--cert`, `--key`, `--insecure`.
    pub tls: pki::TlsArgs,
}

/// A configuration problem.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The configuration file could not be read (missing, no permission).
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The configuration file (or a flag) does not parse.
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    /// A value parses but is not allowed (the message says which).
    #[error("{0}")]
    Invalid(String),
}

/// Parses `NAME[:RAIL[:BACKUP[:RDMA]]]`.
pub fn parse_nic(s: &str) -> Result<NicConfig, ConfigError> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.is_empty() || parts[0].is_empty() || parts.len() > 4 {
        return Err(ConfigError::Invalid(format!(
            "--nic {s:?} must look like NAME[:RAIL[:BACKUP[:RDMA_DEVICE]]]"
        )));
    }
    let rail = match parts.get(1) {
        None | Some(&"") => None,
        Some(r) => Some(r.parse().map_err(|_| {
            ConfigError::Invalid(format!("rail {r:?} in --nic {s:?} is not a number"))
        })?),
    };
    let opt = |i: usize| {
        parts
            .get(i)
            .filter(|x| !x.is_empty())
            .map(|x| x.to_string())
    };
    Ok(NicConfig {
        name: parts[0].into(),
        rail,
        backup: opt(2),
        rdma_device: opt(3),
        addr: None,
    })
}

/// NICs named `rail<N>` among `links`; rails 2k and 2k+1 back each other up.
pub fn discover(links: &[String]) -> Vec<NicConfig> {
    let mut rails: Vec<(u32, String)> = links
        .iter()
        .filter_map(|l| {
            l.strip_prefix("rail")
                .and_then(|n| n.parse().ok())
                .map(|n: u32| (n, l.clone()))
        })
        .collect();
    rails.sort();
    let names: std::collections::BTreeMap<u32, String> = rails.iter().cloned().collect();
    rails
        .into_iter()
        .map(|(n, name)| NicConfig {
            name,
            rail: Some(n),
            backup: names.get(&(n ^ 1)).cloned(),
            rdma_device: None,
            addr: None,
        })
        .collect()
}

fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8(buf[..end].to_vec()).ok()
}

/// Loads and validates; `links` are the interface names present (used for
/// discovery and to check configured NICs exist).
pub fn load(
    file: Option<&Path>,
    over: Overrides,
    links: &[String],
) -> Result<AgentConfig, ConfigError> {
    let mut fc: FileConfig = match file {
        None => FileConfig::default(),
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                path: p.display().to_string(),
                source,
            })?;
            toml::from_str(&text).map_err(|e| ConfigError::Parse {
                path: p.display().to_string(),
                message: e.to_string(),
            })?
        }
    };
    let probe = probe_options(fc.probe.take().unwrap_or_default(), &over)?;
    let host = over
        .host
        .or(fc.host)
        .or_else(hostname)
        .ok_or_else(|| ConfigError::Invalid("no host name: pass --host".into()))?;
    if host.is_empty()
        || host.len() > 253
        || host.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(ConfigError::Invalid(format!(
            "host name {host:?} is not valid"
        )));
    }
    let supervisors = if over.supervisors.is_empty() {
        fc.supervisors
    } else {
        over.supervisors
    };
    if supervisors.is_empty() {
        return Err(ConfigError::Invalid(
            "no supervisor address: pass --supervisor HOST:PORT".into(),
        ));
    }
    pki::check_supervisor_addrs(&supervisors).map_err(ConfigError::Invalid)?;
    let mut nics: Vec<NicConfig> = if !over.nics.is_empty() {
        over.nics
            .iter()
            .map(|s| parse_nic(s))
            .collect::<Result<_, _>>()?
    } else if !fc.nic.is_empty() {
        fc.nic
            .into_iter()
            .map(|n| NicConfig {
                name: n.name,
                rail: n.rail,
                backup: n.backup,
                rdma_device: n.rdma_device,
                addr: None,
            })
            .collect()
    } else {
        discover(links)
    };
    if nics.is_empty() {
        return Err(ConfigError::Invalid(
            "no data NICs configured and none named rail<N> found: pass --nic NAME".into(),
        ));
    }
    nics.sort_by(|a, b| a.name.cmp(&b.name));
    for n in &nics {
        if !links.contains(&n.name) {
            return Err(ConfigError::Invalid(format!(
                "NIC {:?} does not exist on this host",
                n.name
            )));
        }
        if let Some(b) = &n.backup {
            if !nics.iter().any(|m| &m.name == b) || b == &n.name {
                return Err(ConfigError::Invalid(format!(
                    "backup {b:?} of NIC {:?} is not another configured NIC",
                    n.name
                )));
            }
        }
    }
    let control_socket = over
        .control_socket
        .or(fc.control_socket)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CONTROL_SOCKET));
    if control_socket.as_os_str().is_empty() || control_socket.ends_with("/") {
        return Err(ConfigError::Invalid(format!(
            "control socket {:?} is not a file path",
            control_socket.display()
        )));
    }
    // sun_path holds 108 bytes including the terminating NUL.
    if control_socket.as_os_str().len() > 107 {
        return Err(ConfigError::Invalid(format!(
            "control socket path {} is longer than 107 bytes (a Unix socket limit)",
            control_socket.display()
        )));
    }
    let damping = fc.damping.unwrap_or_default();
    damping
        .validate()
        .map_err(|e| ConfigError::Invalid(e.to_string()))?;
    let tls = tls_of(&host, over.tls, fc.tls)?;
    let jobs = fc.jobs.unwrap_or_default();
    jobs.validate().map_err(ConfigError::Invalid)?;
    let control_socket_group = match fc.control.and_then(|c| c.socket_group) {
        Some(g) => Some(lookup_group(&g).ok_or_else(|| {
            ConfigError::Invalid(format!(
                "[control] socket_group {g:?} does not exist on this host"
            ))
        })?),
        // A user created after the agent started counts at its restart.
        None => {
            let gid = lookup_user(&jobs.default_user)
                .ok()
                .flatten()
                .map(|u| u.gid);
            if gid.is_none() {
                tracing::warn!(user = %jobs.default_user, "the default job user does not exist: ranks are refused until it does (useradd --system), and the control socket's group is root's until the agent restarts");
            }
            gid
        }
    };
    let reroute = fc.reroute.unwrap_or_default();
    let fabric_rto_min_ms = reroute
        .fabric_rto_min_ms
        .unwrap_or(DEFAULT_FABRIC_RTO_MIN_MS);
    let failback_hold_ms = reroute.failback_hold_ms.unwrap_or(DEFAULT_FAILBACK_HOLD_MS);
    if failback_hold_ms > MAX_FAILBACK_HOLD_MS {
        return Err(ConfigError::Invalid(format!(
            "[reroute] failback_hold_ms {failback_hold_ms}: want 0..={MAX_FAILBACK_HOLD_MS}"
        )));
    }
    if fabric_rto_min_ms > MAX_FABRIC_RTO_MIN_MS {
        return Err(ConfigError::Invalid(format!(
            "[reroute] fabric_rto_min_ms {fabric_rto_min_ms}: want 0..={MAX_FABRIC_RTO_MIN_MS} (0: the kernel's default)"
        )));
    }
    let test_order_delay_ms = over.test_order_delay_ms.unwrap_or(0);
    if test_order_delay_ms > MAX_TEST_ORDER_DELAY_MS {
        return Err(ConfigError::Invalid(format!(
            "--test-order-delay-ms {test_order_delay_ms}: want 0..={MAX_TEST_ORDER_DELAY_MS}"
        )));
    }
    Ok(AgentConfig {
        host,
        supervisors,
        nics,
        data_dir: over
            .data_dir
            .or(fc.data_dir)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR)),
        damping,
        control_socket,
        probe,
        tls,
        test_order_delay: std::time::Duration::from_millis(test_order_delay_ms),
        jobs,
        control_socket_group,
        fabric_rto_min_ms,
        failback_hold: Duration::from_millis(failback_hold_ms),
    })
}

/// The agent's TLS: flags over `[tls]`; with certificates, the certificate
/// must be `host`'s agent certificate (the supervisor lets it speak only
/// for the host it names).
fn tls_of(
    host: &str,
    flags: pki::TlsArgs,
    file: pki::TlsArgs,
) -> Result<pki::ClientTls, ConfigError> {
    let bad = |e: pki::PkiError| ConfigError::Invalid(e.to_string());
    let mode = flags.or(file).resolve("the agent").map_err(bad)?;
    if let pki::TlsMode::Mtls(f) = &mode {
        let held = pki::show(&f.cert).map_err(bad)?.identity;
        let want = pki::Identity::agent(host).map_err(bad)?;
        if held.as_ref() != Some(&want) {
            return Err(ConfigError::Invalid(format!(
                "{} is not the agent certificate of host {host} (it names {}); issue one with `railguard pki issue agent --host {host}`",
                f.cert.display(),
                held.map_or("the CA".to_owned(), |h| h.to_string())
            )));
        }
    } else {
        tracing::warn!("--insecure: no TLS and no authentication towards the supervisors; use it only in a lab");
    }
    pki::ClientTls::from_mode(&mode).map_err(bad)
}

/// Longest test-only order delay (orders time out after 30 s).
pub const MAX_TEST_ORDER_DELAY_MS: u64 = 10_000;

/// The probe mesh's options from `[probe]` and the flags (None: disabled).
fn probe_options(fp: FileProbe, over: &Overrides) -> Result<Option<ProbeOptions>, ConfigError> {
    let test_set = over.test_clock_offset_ns.is_some()
        || over.test_clock_drift_ppb.is_some()
        || !over.test_clock_steps.is_empty();
    if over.no_probes || fp.enabled == Some(false) {
        if test_set {
            return Err(ConfigError::Invalid(
                "test clock options need the probe mesh (drop --no-probes)".into(),
            ));
        }
        return Ok(None);
    }
    let port = over
        .probe_port
        .or(fp.port)
        .unwrap_or(crate::probe::DEFAULT_PORT);
    if port == 0 {
        return Err(ConfigError::Invalid("probe port must be 1..=65535".into()));
    }
    let mut mesh = MeshConfig::default();
    if let Some(r) = over.probe_rate.or(fp.pairs_per_s) {
        if r == 0 || r > MAX_PAIRS_PER_S {
            return Err(ConfigError::Invalid(format!(
                "probe rate {r} pairs/s per peer: want 1..={MAX_PAIRS_PER_S}"
            )));
        }
        mesh.pairs_per_s = r;
    }
    if let Some(b) = over.probe_cpu_budget_pct.or(fp.cpu_budget_pct) {
        crate::probe::governor::check_budget(b).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        mesh.cpu_budget_pct = b;
    }
    if let Some(p) = fp.purity_ns {
        if p == 0 || p > 1_000_000 {
            return Err(ConfigError::Invalid(format!(
                "probe purity_ns {p}: want 1..=1000000"
            )));
        }
        mesh.purity_ns = p;
    }
    if let Some(ms) = fp.silence_ms {
        if !(50..=60_000).contains(&ms) {
            return Err(ConfigError::Invalid(format!(
                "probe silence_ms {ms}: want 50..=60000"
            )));
        }
        mesh.silence = std::time::Duration::from_millis(ms);
    }
    if let Some(pct) = over.probe_degraded_loss_pct.or(fp.degraded_loss_pct) {
        if !(0.0..=50.0).contains(&pct) {
            return Err(ConfigError::Invalid(format!(
                "probe degraded_loss_pct {pct}: want 0..=50 (0: never Degraded)"
            )));
        }
        mesh.loss.threshold = pct / 100.0;
    }
    if let Some(us) = over.probe_degraded_late_us.or(fp.degraded_late_us) {
        if us > MAX_DEGRADED_LATE_US {
            return Err(ConfigError::Invalid(format!(
                "probe degraded_late_us {us}: want 0..={MAX_DEGRADED_LATE_US} (0: never Degraded)"
            )));
        }
        mesh.jitter.late = std::time::Duration::from_micros(us);
    }
    let anchor = over
        .test_clock_anchor_ns
        .unwrap_or_else(crate::probe::clock::realtime_ns);
    let mut test_clock = TestClock::new(
        over.test_clock_offset_ns.unwrap_or(0),
        over.test_clock_drift_ppb.unwrap_or(0),
        anchor,
    )
    .map_err(ConfigError::Invalid)?;
    for step in &over.test_clock_steps {
        test_clock = test_clock.with_step(*step).map_err(ConfigError::Invalid)?;
    }
    Ok(Some(ProbeOptions {
        port,
        mesh,
        timestamps: over
            .probe_timestamps
            .or(fp.timestamps)
            .unwrap_or(TsMode::Software),
        test_clock,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links() -> Vec<String> {
        ["lo", "mgmt0", "rail0", "rail1"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    /// Flags that load: host h0, one supervisor, no TLS.
    fn base() -> Overrides {
        Overrides {
            host: Some("h0".into()),
            supervisors: vec!["10.0.0.1:7400".into()],
            tls: pki::TlsArgs {
                insecure: true,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn discovers_rails_as_each_others_backup() {
        let n = discover(&links());
        assert_eq!(n.len(), 2);
        assert_eq!(n[0].backup.as_deref(), Some("rail1"));
        assert_eq!(n[1].backup.as_deref(), Some("rail0"));
        assert_eq!(n[1].rail, Some(1));
    }

    #[test]
    fn the_jobs_and_control_sections_are_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("agent.toml");
        let load_text = |text: &str| {
            std::fs::write(&file, text).unwrap();
            load(Some(&file), base(), &links())
        };
        let c = load_text("").unwrap();
        assert_eq!(c.jobs, JobsPolicy::default());
        assert_eq!(c.jobs.default_user, "railguard-job");
        assert!(!c.jobs.allow_root && c.jobs.allowed_commands.is_empty());
        let c = load_text(
            "[jobs]\ndefault_user = \"trainer\"\nallowed_users = [\"a\", \"b\"]\nallowed_commands = [\"/opt/jobs\"]\nallow_root = true\n[control]\nsocket_group = \"root\"\n",
        )
        .unwrap();
        assert_eq!(c.jobs.default_user, "trainer");
        assert_eq!(c.jobs.allowed_users, ["a", "b"]);
        assert_eq!(c.jobs.allowed_commands, [PathBuf::from("/opt/jobs")]);
        assert!(c.jobs.allow_root);
        assert_eq!(c.control_socket_group, Some(0));
        let e = load_text("[jobs]\nallowed_commands = [\"opt/jobs\"]\n").unwrap_err();
        assert!(e.to_string().contains("not an absolute path"), "{e}");
        let e = load_text("[jobs]\ndefault_user = \"\"\n").unwrap_err();
        assert!(e.to_string().contains("default_user"), "{e}");
        let e = load_text("[control]\nsocket_group = \"rg-no-such-group\"\n").unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        let e = load_text("[jobs]\nrun_as = \"root\"\n").unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
    }

    #[test]
    fn flags_are_validated() {
        let base = base();
        let with = |change: &dyn Fn(&mut Overrides)| {
            let mut o = base.clone();
            change(&mut o);
            load(None, o, &links())
        };
        let refused = |change: &dyn Fn(&mut Overrides), needle: &str| {
            let e = with(change).unwrap_err().to_string();
            assert!(e.contains(needle), "{needle:?} not in {e}");
        };
        // Secure by default: no certificates and no --insecure is refused.
        refused(
            &|o| o.tls = Default::default(),
            "no certificates configured",
        );
        // An agent certificate of another host is refused at start.
        let dir = tempfile::tempdir().unwrap();
        let lab = pki::LabPki::open(dir.path()).unwrap();
        refused(
            &|o| o.tls = lab.agent("h1").unwrap().into(),
            "not the agent certificate of host h0",
        );
        let c = with(&|o| o.tls = lab.agent("h0").unwrap().into()).unwrap();
        assert!(matches!(c.tls, pki::ClientTls::Mtls(_)));
        let c = with(&|_| ()).unwrap();
        assert_eq!(c.nics.len(), 2);
        assert_eq!(c.control_socket, PathBuf::from("/run/railguard/agent.sock"));
        let c = with(&|o| o.control_socket = Some("/tmp/x/a.sock".into())).unwrap();
        assert_eq!(c.control_socket, PathBuf::from("/tmp/x/a.sock"));
        refused(
            &|o| o.control_socket = Some(format!("/tmp/{}", "s".repeat(120)).into()),
            "107 bytes",
        );
        refused(&|o| o.nics = vec!["eth7".into()], "does not exist");
        refused(&|o| o.nics = vec!["rail0:x".into()], "not a number");
        refused(&|o| o.nics = vec!["rail0:0:rail9".into()], "backup");
        refused(&|o| o.supervisors = vec!["nowhere".into()], "HOST:PORT");
        refused(&|o| o.supervisors = vec![], "--supervisor");

        let probe = |c: &AgentConfig| c.probe.as_ref().expect("probes on").mesh.clone();
        let c = with(&|_| ()).unwrap();
        assert_eq!(probe(&c).cpu_budget_pct, 1.0, "the default budget");
        assert_eq!(probe(&c).loss.threshold, 0.02, "the default loss threshold");
        assert_eq!(
            probe(&c).jitter.late,
            std::time::Duration::from_micros(300),
            "the default lateness"
        );
        for bad in [-1.0, 101.0, f64::NAN] {
            refused(&|o| o.probe_cpu_budget_pct = Some(bad), "probe CPU budget");
        }
        for bad in [-1.0, 51.0, f64::NAN] {
            refused(
                &|o| o.probe_degraded_loss_pct = Some(bad),
                "degraded_loss_pct",
            );
        }
        refused(
            &|o| o.probe_degraded_late_us = Some(MAX_DEGRADED_LATE_US + 1),
            "degraded_late_us",
        );
        let c = with(&|o| o.probe_cpu_budget_pct = Some(0.0)).unwrap();
        assert_eq!(probe(&c).cpu_budget_pct, 0.0, "0: no governor");
        let c = with(&|o| o.probe_degraded_loss_pct = Some(0.0)).unwrap();
        assert_eq!(probe(&c).loss.threshold, 0.0, "0: never Degraded");
        let c = with(&|o| o.probe_degraded_late_us = Some(0)).unwrap();
        assert!(probe(&c).jitter.late.is_zero(), "0: never Degraded");
    }
}
