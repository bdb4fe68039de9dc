//! Configuration: clap flags, each falling back to the environment the
//! agent sets for a rank (`RAILGUARD_*`), then validated into [`Config`].

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use super::model::Shape;

/// Most ranks in a ring.
pub const MAX_WORLD: u32 = 1024;
/// Most rails (data NICs per host).
pub const MAX_RAILS: usize = 16;
/// Largest hidden width (keeps a chunk under the transport's message cap).
pub const MAX_HIDDEN: usize = 4096;
pub const MAX_BATCH: usize = 4096;
pub const MAX_STEPS: u64 = 1_000_000_000;

/// ringtrain: deterministic data-parallel training over resilient
/// connections (the chaos scenarios' workload).
#[derive(Parser, Debug, Clone)]
#[command(version, about, long_about = None)]
pub struct Args {
    /// Steps to train (total, counting the ones before a resume).
    #[arg(long, default_value_t = 300)]
    pub steps: u64,
    /// Seed of the data and the initial weights.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Width of the two hidden layers (1024: ~1.13 M parameters, 4.5 MB of
    /// gradient per step).
    #[arg(long, default_value_t = 1024)]
    pub hidden: usize,
    /// Samples per rank per step.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    #[arg(long, default_value_t = 0.05)]
    pub lr: f32,
    #[arg(long, default_value_t = 0.9)]
    pub momentum: f32,
    /// The baseline without railguard: each connection has its home rail
    /// only, and a rank without a path for --stall-timeout exits 75.
    #[arg(long)]
    pub fragile: bool,
    /// How long a connection may have no path before the rank gives up
    /// (exit 75): `2s`, `500ms`, or seconds. Default 2s fragile, 30s else.
    #[arg(long, value_parser = parse_duration)]
    pub stall_timeout: Option<Duration>,
    /// Sleep this long after each step (slows the job down for scenarios).
    #[arg(long, default_value_t = 0)]
    pub step_delay_ms: u64,
    /// Use the first N data NICs only, in rail order (default: all). With
    /// 1, every connection stays on rail 0 and has no backup rail.
    #[arg(long)]
    pub rails: Option<usize>,
    /// How long one dial of a rail may take before the connection tries
    /// the next (ms). Default 250, as the resilient connection's.
    #[arg(long, default_value_t = 250)]
    pub connect_timeout_ms: u64,
    /// Print a progress line every this many steps.
    #[arg(long, default_value_t = 10)]
    pub log_every: u64,
    #[arg(long, env = "RAILGUARD_JOB", default_value = "ringtrain")]
    pub job: String,
    #[arg(long, env = "RAILGUARD_INCARNATION", default_value_t = 0)]
    pub incarnation: u64,
    #[arg(long, env = "RAILGUARD_RANK", default_value_t = 0)]
    pub rank: u32,
    #[arg(long, env = "RAILGUARD_WORLD_SIZE", default_value_t = 1)]
    pub world_size: u32,
    /// Every rank's host and data NIC addresses in rail order:
    /// `h0=10.10.0.1,10.11.0.1;h1=10.10.0.2,10.11.0.2`.
    #[arg(long, env = "RAILGUARD_PEERS")]
    pub peers: Option<String>,
    /// This host's data NICs in rail order: `rail0=10.10.0.1,rail1=10.11.0.1`.
    #[arg(long, env = "RAILGUARD_NICS")]
    pub nics: Option<String>,
    /// The job's data port (the same on every NIC and host).
    #[arg(long, env = "RAILGUARD_PORT")]
    pub port: Option<u16>,
    #[arg(long, env = "RAILGUARD_CHECKPOINT_DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Write a checkpoint every this many steps (0: only when ordered).
    #[arg(long, env = "RAILGUARD_CHECKPOINT_EVERY", default_value_t = 0)]
    pub checkpoint_every: u64,
    /// Resume from the checkpoint at this step (0: from scratch).
    #[arg(long, env = "RAILGUARD_RESUME_STEP", default_value_t = 0)]
    pub resume_step: u64,
    /// The agent's control socket (without it: standalone, no job contract).
    #[arg(long, env = "RAILGUARD_AGENT_SOCKET")]
    pub agent_socket: Option<PathBuf>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 2s, 500ms, 1.5)"))?;
    let secs = v * scale;
    if !(secs > 0.0 && secs <= 3600.0) {
        return Err(format!("{s:?}: must be more than 0 and at most 1 hour"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// A bad configuration (one line for stderr; exit 2).
#[derive(Debug, thiserror::Error)]
#[error("bad config: {0}")]
pub struct ConfigError(pub String);

/// One rank of the ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub host: String,
    /// Data NIC addresses in rail order.
    pub addrs: Vec<IpAddr>,
}

/// A local data NIC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nic {
    pub name: String,
    pub addr: IpAddr,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub steps: u64,
    pub seed: u64,
    pub shape: Shape,
    pub batch: usize,
    pub lr: f32,
    pub momentum: f32,
    pub fragile: bool,
    pub stall_timeout: Duration,
    pub step_delay: Duration,
    pub connect_timeout: Duration,
    pub log_every: u64,
    pub job: String,
    pub incarnation: u64,
    pub rank: u32,
    pub world: u32,
    /// Empty for a world of one without a peer list.
    pub peers: Vec<Peer>,
    pub nics: Vec<Nic>,
    pub port: u16,
    pub checkpoint_dir: Option<PathBuf>,
    pub checkpoint_every: u64,
    pub resume_step: u64,
    pub agent_socket: Option<PathBuf>,
}

fn bad<T>(s: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(s.into()))
}

fn parse_ip(what: &str, s: &str) -> Result<IpAddr, ConfigError> {
    s.trim()
        .parse()
        .map_err(|_| ConfigError(format!("{what}: {s:?} is not an IP address")))
}

/// Parses `RAILGUARD_PEERS`.
pub fn parse_peers(s: &str) -> Result<Vec<Peer>, ConfigError> {
    let mut out = Vec::new();
    for (i, entry) in s.split(';').enumerate() {
        let Some((host, addrs)) = entry.split_once('=') else {
            return bad(format!(
                "peers entry {i} {entry:?} is not host=addr0,addr1,..."
            ));
        };
        let host = host.trim();
        if rdma::contract::check_name("peer host", host).is_err() {
            return bad(format!(
                "peers entry {i}: {host:?} is not a valid host name"
            ));
        }
        let addrs = addrs
            .split(',')
            .map(|a| parse_ip(&format!("peers entry {i} ({host})"), a))
            .collect::<Result<Vec<_>, _>>()?;
        out.push(Peer {
            host: host.to_owned(),
            addrs,
        });
        if out.len() > MAX_WORLD as usize {
            return bad(format!("more than {MAX_WORLD} peers"));
        }
    }
    Ok(out)
}

/// Parses `RAILGUARD_NICS`.
pub fn parse_nics(s: &str) -> Result<Vec<Nic>, ConfigError> {
    let mut out: Vec<Nic> = Vec::new();
    for entry in s.split(',') {
        let Some((name, addr)) = entry.split_once('=') else {
            return bad(format!("NIC {entry:?} is not name=addr"));
        };
        let name = name.trim();
        if name.is_empty() || name.len() >= 16 || name.contains(['/', ' ', '\0']) {
            return bad(format!("{name:?} is not a valid interface name"));
        }
        if out.iter().any(|n| n.name == name) {
            return bad(format!("NIC {name} is listed twice"));
        }
        out.push(Nic {
            name: name.to_owned(),
            addr: parse_ip(&format!("NIC {name}"), addr)?,
        });
        if out.len() > MAX_RAILS {
            return bad(format!("more than {MAX_RAILS} NICs"));
        }
    }
    Ok(out)
}

impl Config {
    pub fn from_args(a: Args) -> Result<Self, ConfigError> {
        if a.steps == 0 || a.steps > MAX_STEPS {
            return bad(format!("--steps must be 1..={MAX_STEPS}"));
        }
        if a.hidden == 0 || a.hidden > MAX_HIDDEN {
            return bad(format!("--hidden must be 1..={MAX_HIDDEN}"));
        }
        if a.batch == 0 || a.batch > MAX_BATCH {
            return bad(format!("--batch must be 1..={MAX_BATCH}"));
        }
        if !(a.lr.is_finite() && a.lr > 0.0 && a.lr <= 10.0) {
            return bad("--lr must be in (0, 10]");
        }
        if !(0.0..1.0).contains(&a.momentum) {
            return bad("--momentum must be in [0, 1)");
        }
        if a.log_every == 0 {
            return bad("--log-every must be positive");
        }
        if a.step_delay_ms > 60_000 {
            return bad("--step-delay-ms must be at most 60000");
        }
        if !(10..=30_000).contains(&a.connect_timeout_ms) {
            return bad("--connect-timeout-ms takes 10..=30000");
        }
        if rdma::contract::check_name("job", &a.job).is_err() {
            return bad(format!(
                "job name {:?} must be 1..=253 bytes without whitespace",
                a.job
            ));
        }
        if a.incarnation >= 1 << 32 {
            return bad(format!(
                "incarnation {} does not fit in 32 bits (connection ids are incarnation << 32 | pair)",
                a.incarnation
            ));
        }
        if a.world_size == 0 || a.world_size > MAX_WORLD {
            return bad(format!("world size must be 1..={MAX_WORLD}"));
        }
        if a.rank >= a.world_size {
            return bad(format!(
                "rank {} is not below the world size {}",
                a.rank, a.world_size
            ));
        }
        let peers = match &a.peers {
            Some(p) if !p.trim().is_empty() => parse_peers(p)?,
            _ => Vec::new(),
        };
        let nics = match &a.nics {
            Some(n) if !n.trim().is_empty() => parse_nics(n)?,
            _ => Vec::new(),
        };
        let port = a.port.unwrap_or(0);
        if a.world_size > 1 {
            if peers.len() != a.world_size as usize {
                return bad(format!(
                    "{} peers listed (RAILGUARD_PEERS / --peers) for a world of {}",
                    peers.len(),
                    a.world_size
                ));
            }
            if nics.is_empty() {
                return bad("no data NICs (RAILGUARD_NICS / --nics)");
            }
            if port == 0 {
                return bad("no data port (RAILGUARD_PORT / --port)");
            }
            for p in &peers {
                if p.addrs.len() != nics.len() {
                    return bad(format!(
                        "peer {} has {} rail addresses; this host has {} NICs",
                        p.host,
                        p.addrs.len(),
                        nics.len()
                    ));
                }
            }
            let mine: Vec<IpAddr> = nics.iter().map(|n| n.addr).collect();
            let listed = &peers[a.rank as usize];
            if listed.addrs != mine {
                return bad(format!(
                    "rank {}'s entry in the peer list ({}) does not match this host's NICs",
                    a.rank, listed.host
                ));
            }
        } else if !peers.is_empty() && peers.len() != 1 {
            return bad(format!("{} peers listed for a world of 1", peers.len()));
        }
        let (peers, nics) = match a.rails {
            None => (peers, nics),
            Some(n) if n == 0 || (!nics.is_empty() && n > nics.len()) => {
                return bad(format!(
                    "--rails takes 1..={} (the data NICs listed)",
                    nics.len().max(1)
                ));
            }
            Some(n) => (
                peers
                    .into_iter()
                    .map(|mut p| {
                        p.addrs.truncate(n);
                        p
                    })
                    .collect(),
                nics.into_iter().take(n).collect(),
            ),
        };
        if a.resume_step > a.steps {
            return bad(format!(
                "resume step {} is past the last step {}",
                a.resume_step, a.steps
            ));
        }
        if (a.resume_step > 0 || a.checkpoint_every > 0) && a.checkpoint_dir.is_none() {
            return bad(
                "checkpoints need a directory (RAILGUARD_CHECKPOINT_DIR / --checkpoint-dir)",
            );
        }
        let stall_timeout = a.stall_timeout.unwrap_or(if a.fragile {
            Duration::from_secs(2)
        } else {
            Duration::from_secs(30)
        });
        Ok(Self {
            steps: a.steps,
            seed: a.seed,
            shape: Shape::new(a.hidden),
            batch: a.batch,
            lr: a.lr,
            momentum: a.momentum,
            fragile: a.fragile,
            stall_timeout,
            step_delay: Duration::from_millis(a.step_delay_ms),
            connect_timeout: Duration::from_millis(a.connect_timeout_ms),
            log_every: a.log_every,
            job: a.job,
            incarnation: a.incarnation,
            rank: a.rank,
            world: a.world_size,
            peers,
            nics,
            port,
            checkpoint_dir: a.checkpoint_dir,
            checkpoint_every: a.checkpoint_every,
            resume_step: a.resume_step,
            agent_socket: a.agent_socket.filter(|p| !p.as_os_str().is_empty()),
        })
    }

    /// A fingerprint of everything the ranks must agree on (carried in
    /// every all-reduce message).
    pub fn fingerprint(&self) -> u32 {
        let mut h = crc32fast::Hasher::new();
        for v in [
            self.seed,
            self.shape.input as u64,
            self.shape.hidden as u64,
            self.shape.output as u64,
            self.batch as u64,
            u64::from(self.world),
            u64::from(self.lr.to_bits()),
            u64::from(self.momentum.to_bits()),
            self.steps,
            self.incarnation,
        ] {
            h.update(&v.to_le_bytes());
        }
        h.finalize()
    }
}

#[cfg(test)]
mod tests {
    use crate::ringtrain::config::*;

    fn args(extra: &[&str]) -> Result<Config, ConfigError> {
        let mut v = vec!["ringtrain"];
        v.extend_from_slice(extra);
        Config::from_args(Args::try_parse_from(v).expect("clap"))
    }

    #[test]
    fn standalone_defaults_are_valid() {
        let c = args(&["--job", "t"]).expect("valid");
        assert_eq!(c.world, 1);
        assert_eq!(c.stall_timeout, Duration::from_secs(30));
    }

    #[test]
    fn a_ring_needs_consistent_peers_and_nics() {
        let ok = [
            "--world-size",
            "2",
            "--rank",
            "1",
            "--port",
            "9000",
            "--peers",
            "a=127.0.0.1,127.0.1.1;b=127.0.0.2,127.0.1.2",
            "--nics",
            "x=127.0.0.2,y=127.0.1.2",
        ];
        let c = args(&ok).expect("valid");
        assert_eq!(c.peers[1].host, "b");
        assert_eq!(c.nics[1].name, "y");
        let e = args(&["--world-size", "2", "--rank", "2"]).expect_err("rank");
        assert!(e.to_string().contains("rank 2 is not below"), "{e}");
        let mut v = ok.to_vec();
        v[7] = "a=127.0.0.1;b=127.0.0.2";
        let e = args(&v).expect_err("rails");
        assert!(e.to_string().contains("1 rail addresses"), "{e}");
        let mut v = ok.to_vec();
        v[9] = "x=127.0.0.9,y=127.0.1.2";
        let e = args(&v).expect_err("mine");
        assert!(e.to_string().contains("does not match"), "{e}");
        let mut v = ok.to_vec();
        v[7] = "a=127.0.0.1,nope;b=127.0.0.2,127.0.1.2";
        let e = args(&v).expect_err("ip");
        assert!(e.to_string().contains("\"nope\" is not an IP"), "{e}");
        // The first rail only: every list cut to it.
        let mut v = ok.to_vec();
        v.extend(["--rails", "1"]);
        let c = args(&v).expect("valid");
        assert_eq!(c.nics.len(), 1);
        assert_eq!(c.nics[0].name, "x");
        assert!(c.peers.iter().all(|p| p.addrs.len() == 1), "{:?}", c.peers);
        for n in ["0", "3"] {
            let mut v = ok.to_vec();
            v.extend(["--rails", n]);
            let e = args(&v).expect_err("rails");
            assert!(e.to_string().contains("--rails takes 1..=2"), "{e}");
        }
    }

    #[test]
    fn bad_values_are_refused() {
        for (flags, needle) in [
            (vec!["--steps", "0"], "--steps"),
            (vec!["--resume-step", "5", "--steps", "4"], "past the last"),
            (vec!["--resume-step", "2"], "need a directory"),
            (vec!["--incarnation", "4294967296"], "32 bits"),
            (vec!["--momentum", "1"], "--momentum"),
        ] {
            let e = args(&flags).expect_err("refused");
            assert!(e.to_string().contains(needle), "{flags:?}: {e}");
        }
        assert!(Args::try_parse_from(["r", "--stall-timeout", "0s"]).is_err());
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
    }
}
