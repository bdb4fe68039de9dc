//! The supervisor's configuration: one loader for the TOML file and the
//! command-line flags (flags win), validated before anything starts.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::model::NodeId;

/// Default client/peer listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7400";
/// Default data directory (relative to the working directory).
pub const DEFAULT_DATA_DIR: &str = "./railguard-data";

/// Raft timing and log-compaction settings (DESIGN.md defaults).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct RaftTuning {
    pub heartbeat_ms: u64,
    pub election_min_ms: u64,
    pub election_max_ms: u64,
    /// Build a snapshot (and purge the log) after this many entries.
    pub snapshot_every: u64,
}

impl Default for RaftTuning {
    fn default() -> Self {
        Self {
            heartbeat_ms: 50,
            election_min_ms: 150,
            election_max_ms: 300,
            snapshot_every: 20_000,
        }
    }
}

/// The file format (`railguard-supervisor --config FILE`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub id: Option<NodeId>,
    pub listen: Option<String>,
    pub data_dir: Option<PathBuf>,
    /// Other initial voters: node id -> address.
    #[serde(default)]
    pub peers: BTreeMap<String, String>,
    #[serde(default)]
    pub raft: Option<RaftTuning>,
    /// Start uninitialised and wait to be added to an existing cluster.
    #[serde(default)]
    pub join: bool,
    /// The fabric topology file ([`crate::topology`]); without one,
    /// contended paths are reported but no link is localised.
    pub topology: Option<PathBuf>,
    /// Mutual TLS: the cluster CA, this supervisor's certificate and key.
    #[serde(default)]
    pub tls: pki::TlsArgs,
    /// How webhooks are posted.
    #[serde(default)]
    pub webhooks: WebhookFileConfig,
    /// Admin writes per second per identity (0: no quota).
    pub admin_write_rate: Option<u32>,
}

/// `[webhooks]` of the config file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookFileConfig {
    /// The PEM CA bundle `https://` receivers are verified against
    /// (default: the system's, [`crate::leader::webhooks::DEFAULT_CA_BUNDLE`]).
    pub ca_bundle: Option<PathBuf>,
}

/// The resolved, validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SupervisorConfig {
    pub id: NodeId,
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// Other initial voters (never contains `id`).
    pub peers: BTreeMap<NodeId, SocketAddr>,
    pub raft: RaftTuning,
    /// Never self-initialise; wait for `railguard cluster add-member`.
    pub join: bool,
    /// The fabric topology, loaded and validated at start.
    pub topology: Option<crate::topology::Topology>,
    /// Where it came from.
    pub topology_path: Option<PathBuf>,
    /// Mutual TLS files, or insecure (chosen explicitly).
    pub tls: pki::TlsMode,
    /// The CA bundle for `https://` webhooks, when one was given (checked
    /// at load); `None` means the system's, if it has one.
    pub webhook_ca: Option<PathBuf>,
    /// Admin writes per second per identity (0: no quota;
    /// [`crate::service::quota`]).
    pub admin_write_rate: u32,
}

/// A configuration problem, with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file cannot be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The config file is not valid TOML for the config format.
    #[error("config file {path}: {message}")]
    Parse { path: String, message: String },
    /// A value (from the file or a flag) is invalid.
    #[error("{0}")]
    Invalid(String),
}

/// Values given on the command line (None = not given).
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub id: Option<NodeId>,
    pub listen: Option<String>,
    pub data_dir: Option<PathBuf>,
    /// `ID=ADDR` strings.
    pub peers: Vec<String>,
    pub join: bool,
    pub snapshot_every: Option<u64>,
    pub topology: Option<PathBuf>,
    /// `--ca`, `--cert`, `--key`, `--insecure`.
    pub tls: pki::TlsArgs,
    /// `--webhook-ca`.
    pub webhook_ca: Option<PathBuf>,
    /// `--admin-write-rate`.
    pub admin_write_rate: Option<u32>,
}

fn parse_addr(what: &str, s: &str) -> Result<SocketAddr, ConfigError> {
    s.parse().map_err(|_| {
        ConfigError::Invalid(format!(
            "{what} {s:?} is not an IP:port address (example: 127.0.0.1:7400)"
        ))
    })
}

fn parse_id(what: &str, s: &str) -> Result<NodeId, ConfigError> {
    match s.parse::<NodeId>() {
        Ok(0) | Err(_) => Err(ConfigError::Invalid(format!(
            "{what} {s:?} is not a node id (a positive integer)"
        ))),
        Ok(id) => Ok(id),
    }
}

impl SupervisorConfig {
    /// Loads `file` (if any), applies `over`, and validates the result.
    pub fn load(file: Option<&Path>, over: Overrides) -> Result<Self, ConfigError> {
        let fc = match file {
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
        let id = over.id.or(fc.id).unwrap_or(1);
        if id == 0 {
            return Err(ConfigError::Invalid(
                "node id must be a positive integer".into(),
            ));
        }
        let listen = parse_addr(
            "listen address",
            over.listen
                .as_deref()
                .or(fc.listen.as_deref())
                .unwrap_or(DEFAULT_LISTEN),
        )?;
        if listen.port() == 0 {
            return Err(ConfigError::Invalid("listen port must not be 0".into()));
        }
        let data_dir = over
            .data_dir
            .or(fc.data_dir)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
        let mut peers = BTreeMap::new();
        for (k, v) in &fc.peers {
            peers.insert(parse_id("peer id", k)?, parse_addr("peer address", v)?);
        }
        for p in &over.peers {
            let (k, v) = p.split_once('=').ok_or_else(|| {
                ConfigError::Invalid(format!("--peer {p:?} must look like ID=IP:PORT"))
            })?;
            peers.insert(parse_id("peer id", k)?, parse_addr("peer address", v)?);
        }
        if let Some(own) = peers.remove(&id) {
            if own != listen {
                return Err(ConfigError::Invalid(format!(
                    "peer list gives node {id} (this node) address {own}, but it listens on {listen}"
                )));
            }
        }
        if peers.values().any(|a| *a == listen) {
            return Err(ConfigError::Invalid(format!(
                "another peer uses this node's listen address {listen}"
            )));
        }
        let mut raft = fc.raft.unwrap_or_default();
        if let Some(n) = over.snapshot_every {
            raft.snapshot_every = n;
        }
        let join = over.join || fc.join;
        if join && !peers.is_empty() {
            return Err(ConfigError::Invalid(
                "--join starts a node that waits to be added; it takes no peers".into(),
            ));
        }
        if raft.heartbeat_ms == 0
            || raft.election_min_ms <= raft.heartbeat_ms
            || raft.election_max_ms <= raft.election_min_ms
        {
            return Err(ConfigError::Invalid(
                "raft timings need 0 < heartbeat_ms < election_min_ms < election_max_ms".into(),
            ));
        }
        if raft.snapshot_every == 0 {
            return Err(ConfigError::Invalid(
                "raft.snapshot_every must be positive".into(),
            ));
        }
        let tls = over
            .tls
            .or(fc.tls)
            .resolve("the supervisor")
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        let webhook_ca = over.webhook_ca.or(fc.webhooks.ca_bundle);
        if let Some(p) = &webhook_ca {
            pki::ca_bundle(p).map_err(|e| {
                ConfigError::Invalid(format!("webhook CA bundle (--webhook-ca): {e}"))
            })?;
        }
        let admin_write_rate = over
            .admin_write_rate
            .or(fc.admin_write_rate)
            .unwrap_or(crate::service::quota::DEFAULT_WRITE_RATE);
        if admin_write_rate > crate::service::quota::MAX_WRITE_RATE {
            return Err(ConfigError::Invalid(format!(
                "admin write rate {admin_write_rate}/s: want 0 (no quota) to {}",
                crate::service::quota::MAX_WRITE_RATE
            )));
        }
        let topology_path = over.topology.or(fc.topology);
        let topology = topology_path
            .as_deref()
            .map(crate::topology::Topology::load)
            .transpose()
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        Ok(Self {
            id,
            listen,
            data_dir,
            peers,
            raft,
            join,
            topology,
            topology_path,
            tls,
            webhook_ca,
            admin_write_rate,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Flags of a lab run (`--insecure`).
    fn lab() -> Overrides {
        Overrides {
            tls: pki::TlsArgs {
                insecure: true,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn tls_is_required_unless_insecure_and_never_both() {
        let e = SupervisorConfig::load(None, Overrides::default()).unwrap_err();
        assert!(e.to_string().contains("no certificates configured"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("s.toml");
        std::fs::write(
            &f,
            "[tls]\nca = \"ca.pem\"\ncert = \"s.pem\"\nkey = \"s.key\"\n",
        )
        .unwrap();
        let c = SupervisorConfig::load(Some(&f), Overrides::default()).unwrap();
        assert!(c.tls.is_mtls());
        let e = SupervisorConfig::load(Some(&f), lab()).unwrap_err();
        assert!(e.to_string().contains("--insecure is refused"), "{e}");
        std::fs::write(&f, "[tls]\nca = \"ca.pem\"\n").unwrap();
        let e = SupervisorConfig::load(Some(&f), Overrides::default()).unwrap_err();
        assert!(e.to_string().contains("all three"), "{e}");
        std::fs::write(&f, "[tls]\ninsecure = true\n").unwrap();
        let c = SupervisorConfig::load(Some(&f), Overrides::default()).unwrap();
        assert_eq!(c.tls, pki::TlsMode::Insecure);
    }

    #[test]
    fn a_webhook_ca_bundle_is_checked_at_load() {
        let dir = tempfile::tempdir().unwrap();
        let ca = pki::LabPki::open(dir.path()).unwrap().ca();
        let f = dir.path().join("s.toml");
        std::fs::write(
            &f,
            format!("[tls]\ninsecure = true\n[webhooks]\nca_bundle = {:?}\n", ca),
        )
        .unwrap();
        let c = SupervisorConfig::load(Some(&f), Overrides::default()).unwrap();
        assert_eq!(c.webhook_ca, Some(ca));
        assert_eq!(
            SupervisorConfig::load(None, lab()).unwrap().webhook_ca,
            None
        );
        for bad in ["missing.pem", "s.toml"] {
            let over = Overrides {
                webhook_ca: Some(dir.path().join(bad)),
                ..lab()
            };
            let e = SupervisorConfig::load(None, over).unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
            assert!(e.to_string().contains("--webhook-ca"), "{e}");
        }
        std::fs::write(&f, "[webhooks]\nca = \"x\"\n").unwrap();
        assert!(SupervisorConfig::load(Some(&f), lab()).is_err());
    }

    #[test]
    fn defaults_are_a_one_node_cluster() {
        let c = SupervisorConfig::load(None, lab()).unwrap();
        assert_eq!(c.id, 1);
        assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(c.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
        assert!(c.peers.is_empty());
    }

    #[test]
    fn file_and_flags_merge_and_validate() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("s.toml");
        std::fs::write(&f, "id = 2\nlisten = \"127.0.0.1:7402\"\n[peers]\n1 = \"127.0.0.1:7401\"\n2 = \"127.0.0.1:7402\"\n").unwrap();
        let c = SupervisorConfig::load(
            Some(&f),
            Overrides {
                peers: vec!["3=127.0.0.1:7403".into()],
                ..lab()
            },
        )
        .unwrap();
        assert_eq!(c.id, 2);
        assert_eq!(c.peers.len(), 2, "self is dropped from peers");
        std::fs::write(&f, "id = 2\nlisten = \"nonsense\"\n").unwrap();
        let e = SupervisorConfig::load(Some(&f), lab()).unwrap_err();
        assert!(e.to_string().contains("not an IP:port"), "{e}");
        std::fs::write(&f, "idd = 2\n").unwrap();
        let e = SupervisorConfig::load(Some(&f), lab()).unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
        let e = SupervisorConfig::load(
            None,
            Overrides {
                peers: vec!["x".into()],
                ..lab()
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("ID=IP:PORT"), "{e}");
        let topo = dir.path().join("topo.toml");
        std::fs::write(
            &topo,
            "[[switches]]\nname = \"a\"\n[[switches]]\nname = \"a\"\n",
        )
        .unwrap();
        let e = SupervisorConfig::load(
            None,
            Overrides {
                topology: Some(topo.clone()),
                ..lab()
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("defined twice"), "{e}");
        std::fs::write(&topo, "[[switches]]\nname = \"a\"\n").unwrap();
        let c = SupervisorConfig::load(
            None,
            Overrides {
                topology: Some(topo),
                ..lab()
            },
        )
        .unwrap();
        assert!(c.topology.is_some());
    }
}
