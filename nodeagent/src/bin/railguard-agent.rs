//! `railguard-agent`: the node agent of one GPU host.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use futures::TryStreamExt;
use nodeagent::config::{load, Overrides};

/// railguard node agent: watches the host's data NICs through netlink, damps
/// flaps, and reports every transition to the supervisor leader
/// (persisted outbox, exactly-once after commit). Heartbeats every 250 ms.
///
/// Jobs register their connections on the control socket (the job
/// contract, JSON lines); the agent reports their placement, moves them off
/// a NIC that goes down (the reflex), and carries out the leader's
/// failover/failback orders (each order id at most once).
///
/// It also runs the ranks of jobs the supervisor places on this host: each
/// as the job's user (default: the railguard-job user, which must exist;
/// never root unless [jobs] allow_root), in its own process group with
/// RAILGUARD_* variables, its output in
/// <data-dir>/jobs/<job>/<incarnation>/rank-<r>.log (64 MiB at most);
/// exits and checkpoints are reported. Ranks never outlive the agent: on
/// SIGTERM or Ctrl-C it stops them (SIGTERM, SIGKILL after 5 s) before it
/// exits, and ranks left by a crashed agent are killed when it starts.
#[derive(Parser, Debug)]
#[command(name = "railguard-agent", version, about, long_about = None)]
struct Args {
    /// TOML configuration file (flags override its values).
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// This host's name in the cluster (default: the hostname).
    #[arg(long)]
    host: Option<String>,
    /// Supervisor addresses IP:PORT or HOST:PORT (repeatable or comma-separated).
    #[arg(long = "supervisor", value_delimiter = ',')]
    supervisors: Vec<String>,
    /// A data NIC as NAME[:RAIL[:BACKUP[:RDMA_DEVICE]]] (repeatable).
    /// Default: every interface named rail<N>, rails 2k/2k+1 backing each other up.
    #[arg(long = "nic")]
    nics: Vec<String>,
    /// Directory for the persisted outbox, order log, job fences, the
    /// execution journal (executed.jsonl) and the ranks' logs (jobs/).
    /// Default ./railguard-agent-data.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Unix socket jobs talk to (the job contract). Its directory is
    /// created; a stale socket is replaced, one another agent serves is not.
    /// Mode 0660, group [control] socket_group (default: the job user's
    /// group); a connection speaks only for the rank its process belongs
    /// to. Default /run/railguard/agent.sock.
    #[arg(long)]
    control_socket: Option<PathBuf>,
    /// Turn the probe mesh off (no clock sync, one-way delays or probe
    /// evidence for this host).
    #[arg(long)]
    no_probes: bool,
    /// Log format: text (coloured only on a terminal) or json (one object
    /// per line).
    #[arg(long, value_enum, default_value = "text")]
    log_format: telemetry::LogFormat,
    /// UDP port of the probe sockets, one per data NIC. Default 7947.
    #[arg(long)]
    probe_port: Option<u16>,
    /// Coded probe pairs per second to each peer (over all rails): the
    /// most the mesh sends (the CPU budget may lower it). Default 100.
    #[arg(long)]
    probe_rate: Option<u32>,
    /// CPU budget of the probe thread, % of one core: over it the agent
    /// lowers its probe rate (to a quarter of --probe-rate at most, and
    /// not below 25 pairs/s) and raises it back when there is room.
    /// 0 turns the governor off. Default 1.
    #[arg(long)]
    probe_cpu_budget_pct: Option<f64>,
    /// Share of probes (%) a NIC may lose, its link up, before it is
    /// Degraded and its connections leave it (a gray link). 0 turns the
    /// check off. Default 2.
    #[arg(long)]
    probe_degraded_loss_pct: Option<f64>,
    /// How late (µs above its path's floor over 1 s) a probe counts as
    /// held back: a NIC that holds back 3 % of every peer's probes, on that
    /// NIC alone, is Degraded and its connections leave it (a gray link
    /// that delays). 0 turns the check off. Default 300.
    #[arg(long)]
    probe_degraded_late_us: Option<u64>,
    /// Probe timestamps: "software" (kernel, any NIC) or "hardware" (the
    /// NIC's clock; the NIC must support it). Default software.
    #[arg(long)]
    probe_timestamps: Option<nodeagent::probe::sock::TsMode>,
    /// TEST ONLY — never on a real cluster: add this offset (ns) to every
    /// timestamp the agent takes, so the testbed knows the true clock
    /// error. Range ±1 h.
    #[arg(long, allow_hyphen_values = true)]
    test_clock_offset_ns: Option<i64>,
    /// TEST ONLY — never on a real cluster: make the agent's clock run
    /// fast (or slow, negative) by this many ppb. Range ±1,000,000.
    #[arg(long, allow_hyphen_values = true)]
    test_clock_drift_ppb: Option<i64>,
    /// TEST ONLY: the true Unix time (ns) at which the test clock error
    /// equals --test-clock-offset-ns. Default: the agent's start.
    #[arg(long, allow_hyphen_values = true)]
    test_clock_anchor_ns: Option<i64>,
    /// TEST ONLY — never on a real cluster: step the test clock by
    /// DELTA_NS at true Unix time AT_NS (`AT_NS:DELTA_NS`, as an NTP
    /// daemon steps a clock). Up to 4.
    #[arg(
        long = "test-clock-step",
        value_name = "AT_NS:DELTA_NS",
        allow_hyphen_values = true
    )]
    test_clock_steps: Vec<nodeagent::probe::clock::ClockStep>,
    /// TEST ONLY — never on a real cluster: wait this many ms before
    /// executing each order (a slow action, so a chaos test can crash the
    /// leader while an order is in flight). Range 0..=10000.
    #[arg(long)]
    test_order_delay_ms: Option<u64>,
    #[command(flatten)]
    tls: pki::TlsFlags,
}

async fn link_names() -> anyhow::Result<Vec<String>> {
    let (conn, handle, _) = rtnetlink::new_connection().context("netlink")?;
    tokio::spawn(conn);
    let mut names = Vec::new();
    let mut links = handle.link().get().execute();
    while let Some(m) = links.try_next().await.context("list links")? {
        if let Some(s) = nodeagent::link::LinkSample::from_message(&m) {
            names.push(s.name);
        }
    }
    Ok(names)
}

async fn run(args: Args) -> anyhow::Result<()> {
    let links = link_names().await?;
    let cfg = load(
        args.config.as_deref(),
        Overrides {
            host: args.host,
            supervisors: args.supervisors,
            data_dir: args.data_dir,
            nics: args.nics,
            control_socket: args.control_socket,
            no_probes: args.no_probes,
            probe_port: args.probe_port,
            probe_rate: args.probe_rate,
            probe_cpu_budget_pct: args.probe_cpu_budget_pct,
            probe_degraded_loss_pct: args.probe_degraded_loss_pct,
            probe_degraded_late_us: args.probe_degraded_late_us,
            probe_timestamps: args.probe_timestamps,
            test_clock_offset_ns: args.test_clock_offset_ns,
            test_clock_drift_ppb: args.test_clock_drift_ppb,
            test_clock_anchor_ns: args.test_clock_anchor_ns,
            test_clock_steps: args.test_clock_steps,
            test_order_delay_ms: args.test_order_delay_ms,
            tls: args.tls.into(),
        },
        &links,
    )
    .context("invalid configuration")?;
    tracing::info!(host = %cfg.host, nics = ?cfg.nics.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), supervisors = ?cfg.supervisors, "starting agent");
    // SIGHUP re-reads the certificate the agent presents; calls and
    // streams opened afterwards use it.
    pki::reload_on_sighup(None, cfg.tls.clone()).context("SIGHUP handler")?;
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    nodeagent::agent::run(cfg, shutdown).await?;
    Ok(())
}

fn main() {
    let args = Args::parse();
    telemetry::init(args.log_format, "info,h2=warn,tower=warn");
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    if let Err(e) = rt.block_on(run(args)) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
