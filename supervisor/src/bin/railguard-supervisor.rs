//! `railguard-supervisor`: one member of the replicated supervisor cluster.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use supervisor::config::{Overrides, SupervisorConfig};

/// The commit path allocates and frees many small buffers per event (gRPC
/// frames, commands, log entries); glibc's malloc took about a tenth of the
/// leader's CPU under `bench raft-commit`, mimalloc much less.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// One railguard supervisor (Raft member). With no peers it runs as a
/// one-node cluster; with peers, initialise the cluster once with
/// `railguard cluster init`.
#[derive(Parser, Debug)]
#[command(name = "railguard-supervisor", version, about, long_about = None)]
struct Args {
    /// TOML configuration file (flags override its values).
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// This supervisor's node id (positive integer, unique in the cluster). Default 1.
    #[arg(long)]
    id: Option<u64>,
    /// Address for admin, agent and peer gRPC (IP:port). Default 127.0.0.1:7400.
    #[arg(long)]
    listen: Option<String>,
    /// Data directory (Raft log, snapshots). Default ./railguard-data.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Another initial voter, as ID=IP:PORT (repeatable).
    #[arg(long = "peer", value_name = "ID=ADDR")]
    peers: Vec<String>,
    /// Start uninitialised and wait to be added to an existing cluster with
    /// `railguard cluster add-member ID ADDR` (no auto-init, no peers).
    #[arg(long)]
    join: bool,
    /// Build a snapshot and compact the log every N entries (default 20000).
    #[arg(long, value_name = "N")]
    snapshot_every: Option<u64>,
    /// The fabric topology (TOML: switches, links, where each host NIC
    /// attaches), validated at start. Without it contended paths are still
    /// reported, but no bottleneck link is localised.
    #[arg(long, value_name = "FILE")]
    topology: Option<PathBuf>,
    #[command(flatten)]
    tls: pki::TlsFlags,
    /// The PEM CA bundle `https://` webhook receivers are verified against
    /// (default: the system's /etc/ssl/certs/ca-certificates.crt).
    #[arg(long, value_name = "FILE")]
    webhook_ca: Option<PathBuf>,
    /// Admin writes per second each identity may make through this
    /// supervisor (twice as many at once); 0 turns the quota off. Default
    /// 500.
    #[arg(long, value_name = "N")]
    admin_write_rate: Option<u32>,
    /// Log format: text (coloured only on a terminal) or json (one
    /// object per line).
    #[arg(long, value_enum, default_value = "text")]
    log_format: telemetry::LogFormat,
}

/// Raises the soft limit on open files to the hard one: every agent, admin
/// and peer holds a connection, and the default soft limit (1,024) is
/// below what the accept stream's limits allow.
fn raise_fd_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit fill and read a plain struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return None;
        }
        if lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return None;
            }
        }
    }
    Some(lim.rlim_cur)
}

fn main() {
    let args = Args::parse();
    let fd_limit = raise_fd_limit();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(run(args, fd_limit)) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

async fn run(args: Args, fd_limit: Option<u64>) -> anyhow::Result<()> {
    telemetry::init(
        args.log_format,
        "info,openraft=warn,sled=warn,h2=warn,tower=warn",
    );
    let config = SupervisorConfig::load(
        args.config.as_deref(),
        Overrides {
            id: args.id,
            listen: args.listen,
            data_dir: args.data_dir,
            peers: args.peers,
            join: args.join,
            snapshot_every: args.snapshot_every,
            topology: args.topology,
            tls: args.tls.into(),
            webhook_ca: args.webhook_ca,
            admin_write_rate: args.admin_write_rate,
        },
    )
    .context("invalid configuration")?;
    tracing::info!(id = config.id, listen = %config.listen, data_dir = %config.data_dir.display(), peers = config.peers.len(), fd_limit, "starting supervisor");
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("install SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutting down");
    };
    supervisor::daemon::run(config, shutdown).await?;
    Ok(())
}
