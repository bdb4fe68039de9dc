//! `railguard`: the admin CLI. Talks gRPC to any supervisor; writes are
//! forwarded to the leader; reads are linearizable unless `--stale`.
//!
//! # Layout
//! One module per command group — `members` (status, cluster), `nodes`,
//! `nics` (NICs, orders, connections), `jobs`, `playbooks`, `events`
//! (events, incidents, intents, history), `clock` (clock, paths), `links`
//! (links, shapes) — each with its clap subcommands and its printers;
//! `render` dispatches a reply to its printer; `output` holds the shared
//! helpers. `certs` (`railguard pki …`) works offline: the cluster CA and
//! certificates for mutual TLS.

mod certs;
mod clock;
mod contexts;
mod events;
mod examples;
mod jobs;
mod links;
mod manual;
mod members;
mod nics;
mod nodes;
mod output;
mod playbooks;
mod render;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use supervisor::api::{AdminReply, AdminRequest, ApiError};
use supervisor::client::AdminClient;
use supervisor::model::jobs::JobOp;
use supervisor::model::playbook_store::PlanIncident;
use supervisor::model::AdminOp;

use crate::certs::PkiCmd;
use crate::jobs::JobCmd;
use crate::links::ShapeCmd;
use crate::members::ClusterCmd;
use crate::nics::{NicCmd, QpCmd};
use crate::nodes::NodeCmd;
use crate::output::{exit_code, parse_duration, Output};
use crate::playbooks::PlaybookCmd;

/// railguard admin CLI: human tables or `--output json`; exit 2 on bad input or a
/// refusal, 3 when the cluster is unavailable, 4 when an outcome is unknown.
#[derive(Parser, Debug)]
#[command(name = "railguard", version, about, long_about = None)]
struct Cli {
    /// Supervisor addresses (IP:port or host:port, comma-separated); tried
    /// in order [default: the context's, else 127.0.0.1:7400].
    #[arg(
        long,
        short = 's',
        global = true,
        env = "RAILGUARD_SUPERVISORS",
        value_delimiter = ','
    )]
    supervisor: Option<Vec<String>>,
    /// The named context (supervisors and certificate) from the config
    /// file [default: its `current`]; see `railguard context`.
    #[arg(long, global = true, env = "RAILGUARD_CONTEXT")]
    context: Option<String>,
    /// Output format.
    #[arg(long, short = 'o', global = true, value_enum, default_value = "table")]
    output: Output,
    /// Serve reads from the contacted supervisor's local state (may be stale)
    /// instead of a linearizable read through the leader.
    #[arg(long, global = true)]
    stale: bool,
    /// The cluster CA certificate (mutual TLS; `railguard pki init`).
    #[arg(long, global = true, env = "RAILGUARD_CA", value_name = "FILE")]
    ca: Option<std::path::PathBuf>,
    /// Your admin certificate (`railguard pki issue admin`); the cluster
    /// records its user and allows what its role allows.
    #[arg(long, global = true, env = "RAILGUARD_CERT", value_name = "FILE")]
    cert: Option<std::path::PathBuf>,
    /// Your admin certificate's private key.
    #[arg(long, global = true, env = "RAILGUARD_KEY", value_name = "FILE")]
    key: Option<std::path::PathBuf>,
    /// Speak plain text to a lab cluster started with --insecure (refused
    /// with certificates).
    #[arg(long, global = true, env = "RAILGUARD_INSECURE")]
    insecure: bool,
    /// Time limit per call, e.g. 10s [default: the context's, else 10s].
    #[arg(long, global = true, value_parser = parse_duration)]
    timeout: Option<Duration>,
    /// Show the view again every --interval until Ctrl-C, like watch(1);
    /// for views only (lists, status, show), not for changes.
    #[arg(long, short = 'w', global = true)]
    watch: bool,
    /// How often --watch shows the view, e.g. 500ms or 5s.
    #[arg(
        long,
        global = true,
        value_name = "DURATION",
        default_value = "2s",
        value_parser = parse_watch_interval
    )]
    interval: Duration,
    /// Name recorded with writes on an --insecure cluster (default: $USER);
    /// with mutual TLS the certificate's user is recorded instead.
    #[arg(long = "as", global = true, env = "RAILGUARD_ACTOR")]
    actor: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Members, leader, term, commit index, hosts by state, open incidents.
    Status,
    /// Supervisor cluster membership.
    #[command(subcommand)]
    Cluster(ClusterCmd),
    /// GPU hosts: list, show, cordon, drain, labels.
    #[command(subcommand)]
    Node(NodeCmd),
    /// NICs of all hosts; failover and failback orders.
    #[command(subcommand)]
    Nic(NicCmd),
    /// Training jobs: submit, list, show, checkpoint, restart, cancel, logs.
    #[command(subcommand)]
    Job(JobCmd),
    /// Remediation playbooks: list, show, apply, delete, plan (dry run).
    #[command(subcommand)]
    Playbook(PlaybookCmd),
    /// Jobs' connections (queue pairs) and the NICs they use.
    #[command(subcommand)]
    Qp(QpCmd),
    /// Intents: what the leader is doing or did (drains, failover and
    /// failback orders), with their outcome.
    Intents {
        /// Only intents that are still open.
        #[arg(long)]
        open: bool,
        /// At most this many (the most recent).
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Incidents (NIC down, flapping, ...).
    Incidents {
        /// Only incidents that are still open.
        #[arg(long)]
        open: bool,
    },
    /// The cluster event log.
    Events {
        /// Keep printing new events as they commit (Ctrl-C to stop).
        #[arg(long, short)]
        follow: bool,
        /// Start after this event sequence number, oldest first (default:
        /// the newest --limit events).
        #[arg(long)]
        since: Option<u64>,
        /// At most this many events (the newest, unless --since is given);
        /// with --follow, how many recent ones to show first.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Recorded admin operations (who, when, what).
    History {
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Clock synchronisation of every host, from the leader's latest
    /// network solution.
    ///
    /// Leader memory, so always answered by the leader (also with --stale);
    /// `--output json` adds the solve's edges and NTP-style offsets.
    Clock,
    /// One-way delays and probe loss per directed path, worst p99 first.
    ///
    /// Over the last 120 s, network-corrected when the clock solution covers
    /// both hosts; --contended or --queueing show the detector's queueing.
    Paths {
        /// Only paths from or to this host.
        #[arg(long)]
        host: Option<String>,
        /// Only the N worst paths (N ≥ 1).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        top: Option<u32>,
        /// Show queueing and contention instead of delays (contended paths
        /// only).
        #[arg(long, conflicts_with = "queueing")]
        contended: bool,
        /// Show every path's queueing (baseline, latest second's queueing
        /// p50/p99, contended or not).
        #[arg(long)]
        queueing: bool,
    },
    /// Fabric links from the topology file with each direction's contention
    /// score, the named bottlenecks and open link_contention incidents.
    Links,
    /// HTB shapes put on host NICs by reshaping playbooks.
    #[command(subcommand)]
    Shape(ShapeCmd),
    /// Cluster CA and certificates for mutual TLS: init, issue, show
    /// (offline; no supervisor is contacted).
    #[command(subcommand)]
    Pki(PkiCmd),
    /// Named contexts (supervisors and certificate) in the config file:
    /// list, show, use (offline).
    ///
    /// The file is $RAILGUARD_CONFIG, else
    /// $XDG_CONFIG_HOME/railguard/config.toml, else
    /// ~/.config/railguard/config.toml. For example `railguard context use
    /// prod`, then `railguard status` talks to prod's supervisors.
    #[command(subcommand)]
    Context(contexts::ContextCmd),
    /// Print a shell completion script (offline).
    ///
    /// For example `railguard completion bash >
    /// /usr/share/bash-completion/completions/railguard`.
    Completion {
        /// bash, zsh or fish.
        #[arg(value_enum)]
        shell: manual::Shell,
    },
    /// Write the man pages, railguard.1 and one per subcommand, into a
    /// directory (offline).
    ///
    /// For example `railguard man --dir /usr/local/share/man/man1`.
    Man {
        /// Where the pages go (created if missing).
        #[arg(long, value_name = "DIR")]
        dir: std::path::PathBuf,
    },
}

impl Cli {
    /// The connection settings the flags (or their variables) gave.
    fn flags(&self) -> contexts::Flags {
        contexts::Flags {
            supervisors: self.supervisor.clone(),
            ca: self.ca.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
            insecure: self.insecure,
            timeout: self.timeout,
            context: self.context.clone(),
        }
    }
}

/// Like any Unix filter: a reader that goes away (`railguard events |
/// head`) ends the process quietly with status 141 (as a SIGPIPE death
/// shows in a shell), instead of a panic on the failed print. SIGPIPE
/// itself stays ignored, so a supervisor closing a connection is an error
/// the client handles, never a silent death.
fn quiet_when_stdout_closes() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let p = info.payload();
        let msg = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    quiet_when_stdout_closes();
    let matches = examples::with_examples(Cli::command()).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    cli.output.choose();
    match run(cli).await {
        Ok(()) => {}
        Err(e) => {
            let code = e.downcast_ref::<ApiError>().map(exit_code).unwrap_or(2);
            eprintln!("error: {e:#}");
            std::process::exit(code);
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    // Offline commands first, so no supervisor address is even parsed.
    let flags = cli.flags();
    let cmd = match cli.cmd {
        Cmd::Pki(PkiCmd::Revoke { .. }) => cli.cmd,
        Cmd::Pki(cmd) => return certs::run(cmd, cli.output.structured()),
        Cmd::Completion { shell } => {
            return manual::completion(examples::with_examples(Cli::command()), shell)
        }
        Cmd::Man { dir } => return manual::man(examples::with_examples(Cli::command()), &dir),
        Cmd::Context(c) => return contexts::run(c, &flags, cli.output.structured()),
        cmd => cmd,
    };
    let target = contexts::resolve(&flags).map_err(|e| ApiError::invalid(format!("{e:#}")))?;
    let actor = cli
        .actor
        .clone()
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "unknown".into());
    let tls = target
        .tls
        .clone()
        .resolve("railguard")
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let tls = supervisor::client::ClientTls::from_mode(&tls)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let client = AdminClient::new(&target.supervisors, &actor, target.timeout, &tls)?;
    let json = cli.output.structured();
    let request = match cmd {
        Cmd::Status => AdminRequest::Status,
        Cmd::Cluster(c) => match c {
            ClusterCmd::Init => AdminRequest::ClusterInit,
            ClusterCmd::Members => AdminRequest::ClusterMembers,
            ClusterCmd::AddMember { id, addr } => AdminRequest::AddMember { id, addr },
            ClusterCmd::RemoveMember { id } => AdminRequest::RemoveMember { id },
            ClusterCmd::TransferLeader { id } => AdminRequest::TransferLeader { id },
        },
        Cmd::Node(n) => match n {
            NodeCmd::List => AdminRequest::NodeList,
            NodeCmd::Show { host } => AdminRequest::NodeShow { host },
            NodeCmd::Cordon { host } => AdminRequest::Write {
                op: AdminOp::Cordon { host },
            },
            NodeCmd::Uncordon { host } => AdminRequest::Write {
                op: AdminOp::Uncordon { host },
            },
            NodeCmd::Drain {
                host,
                reason,
                deadline,
            } => {
                if reason.trim().is_empty() {
                    bail!(ApiError::invalid("drain needs a non-empty --reason"));
                }
                let deadline_ms = deadline.map(|d| output::now_ms() + d.as_millis() as u64);
                AdminRequest::Write {
                    op: AdminOp::Drain {
                        host,
                        reason,
                        deadline_ms,
                    },
                }
            }
            NodeCmd::Undrain { host } => AdminRequest::Write {
                op: AdminOp::Undrain { host },
            },
            NodeCmd::Remove { host } => AdminRequest::Write {
                op: AdminOp::RemoveHost { host },
            },
            NodeCmd::Label { host, set, remove } => {
                let mut map = BTreeMap::new();
                for kv in set {
                    let (k, v) = kv
                        .split_once('=')
                        .with_context(|| format!("label {kv:?} must look like KEY=VALUE"))?;
                    map.insert(k.to_string(), v.to_string());
                }
                if map.is_empty() && remove.is_empty() {
                    bail!(ApiError::invalid(
                        "give KEY=VALUE labels to set or --remove KEY"
                    ));
                }
                AdminRequest::Write {
                    op: AdminOp::SetLabels {
                        host,
                        set: map,
                        remove,
                    },
                }
            }
        },
        Cmd::Incidents { open } => AdminRequest::Incidents { open_only: open },
        Cmd::Nic(NicCmd::List { state }) => AdminRequest::NicList {
            state: state.map(Into::into),
        },
        Cmd::Nic(NicCmd::Failover {
            host,
            nic,
            to,
            wait,
        }) => {
            let op = AdminOp::NicFailover { host, nic, to };
            return nics::order(&client, op, wait.wait(), json).await;
        }
        Cmd::Nic(NicCmd::Failback { host, nic, wait }) => {
            let op = AdminOp::NicFailback { host, nic };
            return nics::order(&client, op, wait.wait(), json).await;
        }
        Cmd::Job(j) => match j {
            JobCmd::Submit { spec } => AdminRequest::Write {
                op: AdminOp::Job(JobOp::Submit {
                    spec: jobs::read_job_file(&spec)?,
                }),
            },
            JobCmd::List => AdminRequest::JobList,
            JobCmd::Show { job } => AdminRequest::JobShow { job },
            JobCmd::Checkpoint { job, wait } => {
                return match jobs::checkpoint(&client, job, wait, json).await? {
                    Some(reply) => render::show(&reply, json),
                    None => Ok(()),
                };
            }
            JobCmd::Restart { job, reason } => {
                if reason.trim().is_empty() {
                    bail!(ApiError::invalid("restart needs a non-empty --reason"));
                }
                AdminRequest::Write {
                    op: AdminOp::Job(JobOp::Restart { job, reason }),
                }
            }
            JobCmd::Cancel { job } => AdminRequest::Write {
                op: AdminOp::Job(JobOp::Cancel { job }),
            },
            JobCmd::Logs {
                job,
                rank,
                bytes,
                follow,
            } => {
                if bytes == 0 {
                    bail!(ApiError::invalid("--bytes must be at least 1"));
                }
                if follow {
                    return jobs::follow_logs(&client, job, rank, bytes, json).await;
                }
                AdminRequest::JobLogs {
                    job,
                    rank,
                    max_bytes: bytes,
                    from: None,
                }
            }
        },
        Cmd::Playbook(p) => match p {
            PlaybookCmd::List => AdminRequest::PlaybookList,
            PlaybookCmd::Show { name } => AdminRequest::PlaybookShow { name },
            PlaybookCmd::Apply { files } => {
                let files = files
                    .iter()
                    .map(|f| playbooks::read_playbook_file(f))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                // Each file alone is checked here too, so a typo needs no
                // round trip; the set (escalations, cycles, names) can only
                // be judged by the supervisor, with the stored playbooks.
                for f in &files {
                    if let Err(e) = ::playbooks::parse(&f.file, &f.text) {
                        bail!(ApiError::invalid(e.to_string()));
                    }
                }
                AdminRequest::Write {
                    op: AdminOp::PlaybookApply { files },
                }
            }
            PlaybookCmd::Delete { name } => AdminRequest::Write {
                op: AdminOp::PlaybookDelete { name },
            },
            PlaybookCmd::Runs { open } => AdminRequest::PlaybookRuns { open_only: open },
            PlaybookCmd::Plan {
                file,
                incident,
                host,
                nic,
                job,
                peer,
            } => AdminRequest::PlaybookPlan {
                file: playbooks::read_playbook_file(&file)?,
                incident: PlanIncident {
                    kind: incident,
                    host,
                    nic,
                    job,
                    peer,
                },
            },
        },
        Cmd::Qp(QpCmd::List { host, job }) => AdminRequest::QpList { host, job },
        Cmd::Intents { open, limit } => AdminRequest::Intents {
            open_only: open,
            limit,
        },
        Cmd::Events {
            follow: true,
            since,
            limit,
        } => {
            return events::follow(&client, since, limit, json).await;
        }
        Cmd::Events { since, limit, .. } => AdminRequest::Events {
            since: since.unwrap_or(0),
            limit,
            newest: since.is_none(),
        },
        Cmd::History { limit } => AdminRequest::AdminHistory { limit },
        Cmd::Clock => AdminRequest::Clock,
        Cmd::Paths {
            host,
            top,
            contended: false,
            queueing: false,
        } => AdminRequest::Paths { host, top },
        Cmd::Paths {
            host,
            top,
            contended,
            ..
        } => AdminRequest::Queueing {
            host,
            contended_only: contended,
            top,
        },
        Cmd::Links => AdminRequest::Links,
        Cmd::Shape(ShapeCmd::List { host }) => AdminRequest::ShapeList { host },
        Cmd::Shape(ShapeCmd::Clear { host }) => AdminRequest::Write {
            op: AdminOp::ShapeClear { host },
        },
        Cmd::Pki(PkiCmd::Revoke { serial, reason }) => AdminRequest::Write {
            op: AdminOp::Revoke {
                serial: serial.to_ascii_lowercase().replace(':', ""),
                reason,
            },
        },
        Cmd::Pki(cmd) => return certs::run(cmd, json),
        // Offline, like `pki`: handled above; never reached with a client.
        Cmd::Completion { shell } => {
            return manual::completion(examples::with_examples(Cli::command()), shell)
        }
        Cmd::Man { dir } => return manual::man(examples::with_examples(Cli::command()), &dir),
        Cmd::Context(c) => return contexts::run(c, &flags, json),
    };
    if cli.watch {
        let every = cli.interval;
        if request.is_write() {
            return Err(
                ApiError::invalid("--watch repeats a view; it cannot repeat a change").into(),
            );
        }
        return watch(&client, request, every, cli.stale, json).await;
    }
    let reply = client.call(request, cli.stale).await?;
    render::show(&reply, json)?;
    if matches!(reply, AdminReply::Status(_)) && !cli.stale {
        cluster_available(&target.supervisors, target.timeout, &actor, &tls, json).await?;
    }
    Ok(())
}

/// The shortest `--watch` interval.
const MIN_WATCH: Duration = Duration::from_millis(100);

fn parse_watch_interval(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < MIN_WATCH {
        return Err(format!("{s:?} is shorter than {MIN_WATCH:?}"));
    }
    Ok(d)
}

/// `--watch`: the view again every `every` until interrupted, each under a
/// line with the time (on a terminal the screen is cleared first). A call
/// that fails prints its error and the next one is tried, like watch(1).
async fn watch(
    client: &AdminClient,
    request: AdminRequest,
    every: Duration,
    stale: bool,
    json: bool,
) -> anyhow::Result<()> {
    use std::io::{IsTerminal, Write};
    let tty = std::io::stdout().is_terminal();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let reply = client.call(request.clone(), stale).await;
        if tty {
            print!("\x1b[H\x1b[2J");
        }
        if !json {
            println!(
                "every {}: {}",
                humantime::format_duration(every),
                humantime::format_rfc3339_seconds(std::time::SystemTime::now())
            );
        }
        match reply {
            Ok(reply) => render::show(&reply, json)?,
            Err(e) => eprintln!("error: {e:#}"),
        }
        std::io::stdout().flush()?;
    }
}

/// After `status` (which any supervisor answers from its own memory, so it
/// looks the same with or without a quorum): whether the cluster can serve
/// at all, by one linearizable read through the leader, bounded by 3 s.
/// Unavailable is an error (exit 3), so scripts see it.
async fn cluster_available(
    supervisors: &[String],
    timeout: Duration,
    actor: &str,
    tls: &supervisor::client::ClientTls,
    json: bool,
) -> anyhow::Result<()> {
    let probe = AdminClient::new(supervisors, actor, timeout.min(Duration::from_secs(3)), tls)?;
    match probe.call(AdminRequest::ClusterMembers, false).await {
        Ok(_) => {
            if !json {
                println!("cluster:     available (a linearizable read went through the leader)");
            }
            Ok(())
        }
        Err(e) => {
            if !json {
                println!("cluster:     UNAVAILABLE");
            }
            Err(ApiError::unavailable(format!(
                "the cluster is unavailable: no leader with a quorum answered a linearizable read ({e})"
            ))
            .into())
        }
    }
}
