//! `railguard`: the admin CLI. Talks gRPC to any supervisor; writes are
//! forwarded to the leader; reads are linearizable unless `--stale`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand, ValueEnum};
use serde::Serialize;
use supervisor::api::{
    AdminReply, AdminRequest, ApiError, ClockView, ErrorKind, PathsView, QpView,
};
use supervisor::client::AdminClient;
use supervisor::jobs::{Job, JobOp, JobState};
use supervisor::model::{
    Action, AdminOp, ClusterEvent, Host, Incident, Intent, IntentStatus, Nic, NicState, Outcome,
};
use supervisor::playbook_store::{PlanIncident, PlaybookFile};

/// railguard admin CLI.
///
/// Every command prints a human table by default or JSON with `--output json`,
/// and exits non-zero with a one-line error on failure (exit 2: bad input,
/// refused, or an order that failed or was cancelled; 3: cluster
/// unavailable; 4: outcome unknown, e.g. an order still open when
/// `--wait-timeout` ran out).
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Cli {
    /// Supervisor addresses (IP:port, comma-separated); tried in order.
    #[arg(
        long,
        short = 's',
        global = true,
        env = "RAILGUARD_SUPERVISORS",
        value_delimiter = ',',
        default_value = "127.0.0.1:7400"
    )]
    supervisor: Vec<String>,
    /// Output format.
    #[arg(long, short = 'o', global = true, value_enum, default_value = "table")]
    output: Output,
    /// Serve reads from the contacted supervisor's local state (may be stale)
    /// instead of a linearizable read through the leader.
    #[arg(long, global = true)]
    stale: bool,
    /// Time limit per call, e.g. 10s.
    #[arg(long, global = true, default_value = "10s", value_parser = parse_duration)]
    timeout: Duration,
    /// Name recorded with writes (default: $USER).
    #[arg(long = "as", global = true, env = "RAILGUARD_ACTOR")]
    actor: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Output {
    Table,
    Json,
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
        /// Start after this event sequence number.
        #[arg(long, default_value_t = 0)]
        since: u64,
        /// At most this many events (without --follow).
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
    /// Per host: probe id, committed state (Synced / Degraded / Unsynced,
    /// changes go through Raft), live offset to the reference host (ns),
    /// drift (ppb) and error bound (ns), and its probe rate (pairs/s per
    /// peer now / configured: the agent lowers it to keep its probe thread
    /// inside a CPU budget) with that thread's CPU (% of one core). The
    /// leader solves every second
    /// from the agents' probe summaries; this data lives only in its
    /// memory, so the call always goes to the leader (also with --stale).
    /// A host missing from the current solution (its paths too busy for
    /// clean probes, say) shows its last solved clock carried forward for
    /// at most 30 s, marked "held over", its error bound growing with the
    /// drift's error; then it is Unsynced (at once if the reference host
    /// changes or the host is Down). When the leader gets no solution at
    /// all (no fresh summaries, a failed solve), the last one stands in
    /// the same way for at most 30 s (a Down host excepted): its bounds
    /// grow, and once it is 3 s old every host in it is marked "held
    /// over"; the edges shown are that solution's.
    ///
    /// `--output json` adds the solution's `at_ns` (on the reference's
    /// clock; a host's offset at reference time t is
    /// offset_ns + drift_ppb·1e-9·(t − at_ns)), every edge of the solve
    /// (reporter, peer, rail, offset, error bound, the NTP-style estimate,
    /// loop residual and whether it was used) and each host's NTP-style
    /// offset composed hop by hop from the reference.
    Clock,
    /// One-way delays and probe loss per directed path, worst p99 first.
    ///
    /// A path is src host/NIC → dst host/NIC on one rail, as the receiving
    /// host measured it. Figures cover the last 120 s of per-second
    /// summaries: min = min of the per-second minima, p50 = median of the
    /// per-second medians, p99 = max of the per-second p99s, loss = 1 −
    /// received/expected. Delays are corrected with the leader's network
    /// clock solution when it covers both hosts (CORR "network"); else
    /// "pair" (the receiver's own pair estimate) or "raw" (receive minus
    /// send time, which includes the clock offset). Leader memory, like
    /// `clock`.
    ///
    /// With --contended: the contention detector's view instead — per
    /// path, the baseline (min OWD of calm seconds), the latest second's
    /// queueing delay (median and p99 OWD minus the baseline) and whether
    /// the path is contended (a second's median queueing ≥ 1 ms or its
    /// p99 ≥ 5 ms; clear after 3 s with the median below 300 µs and the
    /// p99 below 2.5 ms); contended paths only.
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
    /// Fabric links from the topology file, each direction's contention
    /// score (contended paths / fresh paths crossing it) and which are
    /// named bottlenecks, with the open link_contention incidents.
    /// Leader memory, like `clock`.
    Links,
    /// HTB shapes put on host NICs by reshaping playbooks.
    #[command(subcommand)]
    Shape(ShapeCmd),
}

#[derive(Subcommand, Debug)]
enum ShapeCmd {
    /// Desired shapes (classes, rates, flows) and whether each host's agent
    /// confirmed installing them.
    List {
        /// Only this host.
        host: Option<String>,
    },
    /// Remove every shape from a host's NICs now (the agent deletes its
    /// HTB qdisc; the incident stays open and no new reshaping happens
    /// for it).
    Clear { host: String },
}

#[derive(Subcommand, Debug)]
enum JobCmd {
    /// Submit a job described by a TOML file.
    ///
    /// Fields: name, ranks, command (argv list), checkpoint_dir (absolute,
    /// shared by the hosts), and optionally hosts (allowed hosts, the first
    /// `ranks` preferred in rank order), labels (placement constraint),
    /// env, checkpoint_every (steps; 0 = only on order), max_restarts
    /// (default 3), backoff (first restart delay, default "1s", doubling).
    /// The job is placed on Ready hosts only; the leader's agents launch
    /// the ranks.
    Submit { spec: std::path::PathBuf },
    /// Every job with its state, incarnation, hosts and latest checkpoint.
    List,
    /// One job: spec, ranks, checkpoints, restarts.
    Show { job: String },
    /// Checkpoint a running job now (all ranks at the same step) and wait
    /// until the checkpoint is complete.
    Checkpoint {
        job: String,
        /// How long to wait for it (0s: don't wait).
        #[arg(long, default_value = "60s", value_parser = parse_duration)]
        wait: Duration,
    },
    /// Stop a running job and start it again from its latest complete
    /// checkpoint (not counted against max_restarts).
    Restart {
        job: String,
        /// Why (recorded).
        #[arg(long, short)]
        reason: String,
    },
    /// Stop a job for good.
    Cancel { job: String },
    /// The end of a rank's output (stdout and stderr), from its host.
    Logs {
        job: String,
        #[arg(long, default_value_t = 0)]
        rank: u32,
        /// At most this many bytes (from the end; the agent caps it at 128 KiB).
        #[arg(long, default_value_t = 16 << 10)]
        bytes: u32,
    },
}

#[derive(Subcommand, Debug)]
enum PlaybookCmd {
    /// Stored playbooks with their version, priority and incident kinds.
    List,
    /// One stored playbook, with the TOML it was applied from.
    Show { name: String },
    /// Validate playbook files and store them, all or none. Each file is
    /// checked alone and then with every stored playbook it does not
    /// replace (escalation targets, cycles); errors name file:line:column.
    /// The language is documented in playbooks/README.md.
    Apply {
        #[arg(required = true)]
        files: Vec<std::path::PathBuf>,
    },
    /// Delete a stored playbook (refused while another escalates to it).
    Delete { name: String },
    /// Playbook runs: id, incident, playbook, current step, state.
    Runs {
        /// Only runs still running or waiting.
        #[arg(long)]
        open: bool,
    },
    /// Dry run: which guards hold and which steps would run, on what, if
    /// this incident happened now (the file need not be stored).
    Plan {
        file: std::path::PathBuf,
        /// Incident kind, e.g. nic_down, nic_flapping, host_down.
        #[arg(long)]
        incident: String,
        #[arg(long)]
        host: String,
        #[arg(long)]
        nic: Option<String>,
        #[arg(long)]
        job: Option<String>,
    },
}

fn read_playbook_file(path: &std::path::Path) -> anyhow::Result<PlaybookFile> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read playbook file {}", path.display()))?;
    Ok(PlaybookFile {
        file: path.display().to_string(),
        text,
    })
}

/// A job file as written by hand (durations as text).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct JobFile {
    name: String,
    ranks: u32,
    #[serde(default)]
    hosts: Vec<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    command: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    checkpoint_dir: String,
    #[serde(default)]
    checkpoint_every: u64,
    max_restarts: Option<u32>,
    backoff: Option<String>,
}

fn read_job_file(path: &std::path::Path) -> anyhow::Result<supervisor::jobs::JobSpec> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read job file {}", path.display()))?;
    let f: JobFile = toml::from_str(&text).map_err(|e| {
        ApiError::invalid(format!("{}: {}", path.display(), e.to_string().trim_end()))
    })?;
    let backoff_ms = match &f.backoff {
        Some(b) => parse_duration(b)
            .map_err(|e| ApiError::invalid(format!("{}: backoff: {e}", path.display())))?
            .as_millis() as u64,
        None => 1_000,
    };
    let spec = supervisor::jobs::JobSpec {
        name: f.name,
        ranks: f.ranks,
        hosts: f.hosts,
        labels: f.labels,
        command: f.command,
        env: f.env,
        checkpoint_dir: f.checkpoint_dir,
        checkpoint_every: f.checkpoint_every,
        max_restarts: f.max_restarts.unwrap_or(3),
        backoff_ms,
    };
    spec.validate()
        .map_err(|e| ApiError::invalid(format!("{}: {e}", path.display())))?;
    Ok(spec)
}

#[derive(Subcommand, Debug)]
enum NicCmd {
    /// Every NIC with its state, flap count, damping penalty and last change.
    List {
        /// Only NICs in this state.
        #[arg(long, value_enum)]
        state: Option<NicStateArg>,
    },
    /// Move every connection of HOST off NIC (e.g. before maintenance).
    ///
    /// Commits a Failover intent first and prints its id; the leader then
    /// orders the host's agent, which tells the jobs' transports to move.
    /// Waits for the outcome unless --no-wait.
    Failover {
        /// The host whose NIC is failed over.
        host: String,
        /// The NIC to move every connection off.
        nic: String,
        /// Where to move (default: the NIC's configured backup).
        #[arg(long)]
        to: Option<String>,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Move the connections whose home is NIC on HOST back to it.
    ///
    /// Commits a Failback intent first and prints its id; waits for the
    /// outcome unless --no-wait.
    Failback {
        /// The host.
        host: String,
        /// The NIC to move its connections back to (it must be up).
        nic: String,
        #[command(flatten)]
        wait: WaitArgs,
    },
}

#[derive(clap::Args, Debug)]
struct WaitArgs {
    /// Return once the intent is committed instead of waiting for the outcome.
    #[arg(long)]
    no_wait: bool,
    /// How long to wait for the outcome (exit 4 if it is still open then).
    #[arg(long, default_value = "40s", value_parser = parse_duration)]
    wait_timeout: Duration,
}

impl WaitArgs {
    fn wait(&self) -> Option<Duration> {
        (!self.no_wait).then_some(self.wait_timeout)
    }
}

#[derive(Subcommand, Debug)]
enum QpCmd {
    /// Connections with host, job, rank, id, NIC, home rail, peer and
    /// whether they moved off their home rail.
    List {
        /// Only connections on this host.
        #[arg(long)]
        host: Option<String>,
        /// Only connections of this job.
        #[arg(long)]
        job: Option<String>,
    },
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum NicStateArg {
    Unknown,
    Up,
    Down,
    Flapping,
    Recovering,
}

impl From<NicStateArg> for NicState {
    fn from(a: NicStateArg) -> Self {
        match a {
            NicStateArg::Unknown => NicState::Unknown,
            NicStateArg::Up => NicState::Up,
            NicStateArg::Down => NicState::Down,
            NicStateArg::Flapping => NicState::Flapping,
            NicStateArg::Recovering => NicState::Recovering,
        }
    }
}

#[derive(Subcommand, Debug)]
enum ClusterCmd {
    /// Initialise a new cluster from the contacted supervisor's configured peers (once).
    Init,
    /// List supervisors with their role and replication progress.
    Members,
    /// Add a supervisor: as a learner until it has caught up, then as a voter.
    AddMember { id: u64, addr: String },
    /// Remove a supervisor from the cluster.
    RemoveMember { id: u64 },
    /// Hand leadership to another voter.
    TransferLeader { id: u64 },
}

#[derive(Subcommand, Debug)]
enum NodeCmd {
    /// All hosts with their status.
    List,
    /// One host with its NICs.
    Show { host: String },
    /// Mark a host unschedulable.
    Cordon { host: String },
    /// Make a cordoned host schedulable again.
    Uncordon { host: String },
    /// Cordon a host, move its work away, then mark it Drained.
    Drain {
        host: String,
        /// Why (required, recorded with the drain).
        #[arg(long, short)]
        reason: String,
        /// Stop remaining work after this long, e.g. 30m (default: wait).
        #[arg(long, value_parser = parse_duration)]
        deadline: Option<Duration>,
    },
    /// Return a draining or drained host to service.
    Undrain { host: String },
    /// Set (KEY=VALUE) or remove (--remove KEY) host labels.
    Label {
        host: String,
        /// KEY=VALUE pairs to set.
        set: Vec<String>,
        /// Label keys to remove.
        #[arg(long)]
        remove: Vec<String>,
    },
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{s:?} is not a duration like 30s or 5m: {e}"))
}

fn exit_code(e: &ApiError) -> i32 {
    match e.kind {
        ErrorKind::InvalidArgument | ErrorKind::NotFound | ErrorKind::FailedPrecondition => 2,
        ErrorKind::Unavailable => 3,
        ErrorKind::Unknown | ErrorKind::Internal => 4,
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => {}
        Err(e) => {
            let code = e.downcast_ref::<ApiError>().map(exit_code).unwrap_or(2);
            eprintln!("error: {e:#}");
            std::process::exit(code);
        }
    }
}

fn print_json<T: Serialize>(v: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

fn fmt_ms(ms: u64) -> String {
    if ms == 0 {
        return "-".into();
    }
    let t = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let actor = cli
        .actor
        .clone()
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "unknown".into());
    let client = AdminClient::new(&cli.supervisor, &actor, cli.timeout)?;
    let json = cli.output == Output::Json;
    let request = match cli.cmd {
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
                let deadline_ms =
                    deadline.map(|d| supervisor::node::now_ms() + d.as_millis() as u64);
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
            return order(&client, op, wait.wait(), json).await;
        }
        Cmd::Nic(NicCmd::Failback { host, nic, wait }) => {
            let op = AdminOp::NicFailback { host, nic };
            return order(&client, op, wait.wait(), json).await;
        }
        Cmd::Job(j) => match j {
            JobCmd::Submit { spec } => AdminRequest::Write {
                op: AdminOp::Job(JobOp::Submit {
                    spec: read_job_file(&spec)?,
                }),
            },
            JobCmd::List => AdminRequest::JobList,
            JobCmd::Show { job } => AdminRequest::JobShow { job },
            JobCmd::Checkpoint { job, wait } => {
                return checkpoint(&client, job, wait, json).await;
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
            JobCmd::Logs { job, rank, bytes } => {
                if bytes == 0 {
                    bail!(ApiError::invalid("--bytes must be at least 1"));
                }
                AdminRequest::JobLogs {
                    job,
                    rank,
                    max_bytes: bytes,
                }
            }
        },
        Cmd::Playbook(p) => match p {
            PlaybookCmd::List => AdminRequest::PlaybookList,
            PlaybookCmd::Show { name } => AdminRequest::PlaybookShow { name },
            PlaybookCmd::Apply { files } => {
                let files = files
                    .iter()
                    .map(|f| read_playbook_file(f))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                // Each file alone is checked here too, so a typo needs no
                // round trip; the set (escalations, cycles, names) can only
                // be judged by the supervisor, with the stored playbooks.
                for f in &files {
                    if let Err(e) = playbooks::parse(&f.file, &f.text) {
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
            } => AdminRequest::PlaybookPlan {
                file: read_playbook_file(&file)?,
                incident: PlanIncident {
                    kind: incident,
                    host,
                    nic,
                    job,
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
            ..
        } => {
            return follow(&client, since, json).await;
        }
        Cmd::Events { since, limit, .. } => AdminRequest::Events { since, limit },
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
    };
    let reply = client.call(request, cli.stale).await?;
    if json {
        return print_json(&reply);
    }
    render(&reply);
    Ok(())
}

/// Orders a checkpoint and, unless `wait` is zero, waits until a complete
/// checkpoint newer than the one before exists (exit 2 when the job left
/// Checkpointing without one, 4 when `wait` ran out).
async fn checkpoint(
    client: &AdminClient,
    job: String,
    wait: Duration,
    json: bool,
) -> anyhow::Result<()> {
    let before = match client
        .call(AdminRequest::JobShow { job: job.clone() }, false)
        .await?
    {
        AdminReply::Job { job } => job.latest_checkpoint,
        other => bail!(ApiError::internal(format!("unexpected reply: {other:?}"))),
    };
    let op = AdminOp::Job(JobOp::Checkpoint { job: job.clone() });
    let reply = client.call(AdminRequest::Write { op }, false).await?;
    if wait.is_zero() {
        return if json {
            print_json(&reply)
        } else {
            render(&reply);
            Ok(())
        };
    }
    let deadline = Instant::now() + wait;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let j = match client
            .call(AdminRequest::JobShow { job: job.clone() }, false)
            .await
        {
            Ok(AdminReply::Job { job }) => job,
            Ok(other) => bail!(ApiError::internal(format!("unexpected reply: {other:?}"))),
            Err(e) if e.kind == ErrorKind::Unavailable => {
                if Instant::now() >= deadline {
                    return Err(e.into());
                }
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if j.latest_checkpoint > before {
            let step = j.latest_checkpoint.unwrap_or(0);
            if json {
                return print_json(&serde_json::json!({"job": j.name, "step": step}));
            }
            println!("job {}: checkpoint at step {step} complete", j.name);
            return Ok(());
        }
        if j.state != JobState::Checkpointing {
            bail!(ApiError::new(
                ErrorKind::FailedPrecondition,
                format!(
                    "job {} is {:?} and has no new complete checkpoint{}",
                    j.name,
                    j.state,
                    if j.reason.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", j.reason)
                    }
                ),
            ));
        }
        if Instant::now() >= deadline {
            bail!(ApiError::new(
                ErrorKind::Unknown,
                format!("job {job} is still checkpointing after {wait:?}"),
            ));
        }
    }
}

fn print_playbooks(list: &[supervisor::api::PlaybookView], version: u64) {
    if list.is_empty() {
        println!("no playbooks (apply some: railguard playbook apply playbooks/library/*.toml)");
        return;
    }
    println!(
        "{:<24} {:>7} {:>8} {:>5}  {:<28} ESCALATES TO",
        "PLAYBOOK", "VERSION", "PRIORITY", "STEPS", "INCIDENTS"
    );
    for p in list {
        println!(
            "{:<24} {:>7} {:>8} {:>5}  {:<28} {}",
            p.name,
            p.version,
            p.priority,
            p.steps,
            if p.incidents.is_empty() {
                "(escalation only)".to_string()
            } else {
                p.incidents.join(",")
            },
            p.on_failure.as_deref().unwrap_or("-")
        );
    }
    println!("(playbook set version {version})");
}

fn print_plan(plan: &playbooks::Plan, matched_now: Option<&str>) {
    println!("playbook:  {}", plan.playbook);
    println!(
        "handled today by: {}",
        matched_now.unwrap_or("no stored playbook")
    );
    for g in &plan.guards {
        println!(
            "guard:     {} {}",
            if g.holds { "ok  " } else { "FAIL" },
            g.reason
        );
    }
    println!(
        "starts:    {}{}",
        plan.starts,
        plan.escalates_to
            .as_ref()
            .map(|e| format!(" (failure escalates to {e})"))
            .unwrap_or_default()
    );
    for s in &plan.steps {
        println!(
            "  {:<16} {:<5} {}{}",
            s.id,
            if s.runs { "run" } else { "skip" },
            s.target,
            s.blocked
                .as_ref()
                .map(|b| format!("  [blocked: {b}]"))
                .unwrap_or_default()
        );
    }
}

fn print_jobs(jobs: &[Job]) {
    if jobs.is_empty() {
        println!("no jobs");
        return;
    }
    println!(
        "{:<20} {:<13} {:>5} {:>5} {:>8} {:>10}  HOSTS",
        "JOB", "STATE", "RANKS", "INC", "RESTARTS", "CHECKPOINT"
    );
    for j in jobs {
        let hosts = if j.placement.is_empty() {
            "-".to_string()
        } else {
            j.placement.join(",")
        };
        println!(
            "{:<20} {:<13} {:>5} {:>5} {:>8} {:>10}  {}",
            j.name,
            format!("{:?}", j.state).to_lowercase(),
            j.spec.ranks,
            j.incarnation,
            j.restarts,
            j.latest_checkpoint
                .map(|s| s.to_string())
                .unwrap_or_else(|| "-".into()),
            hosts
        );
    }
}

fn print_job(j: &Job) {
    println!("job:         {}", j.name);
    println!(
        "state:       {} since {}{}",
        format!("{:?}", j.state).to_lowercase(),
        fmt_ms(j.state_since_ms),
        if j.reason.is_empty() {
            String::new()
        } else {
            format!(" ({})", j.reason)
        }
    );
    println!("submitted:   {}", fmt_ms(j.submitted_ms));
    println!("command:     {}", j.spec.command.join(" "));
    println!(
        "incarnation: {} (resumed from {}), restarts {}/{}",
        j.incarnation,
        match j.resume_step {
            0 => "scratch".to_string(),
            s => format!("step {s}"),
        },
        j.restarts,
        j.spec.max_restarts
    );
    println!("port:        {}", j.port);
    println!(
        "checkpoints: {} every {} steps; latest complete: {}",
        j.spec.checkpoint_dir,
        j.spec.checkpoint_every,
        j.latest_checkpoint
            .map(|s| format!("step {s}"))
            .unwrap_or_else(|| "none".into())
    );
    if !j.stopping.is_empty() {
        println!("stopping on: {}", pairs(&j.stopping, ",", "-"));
    }
    println!("RANKS:");
    println!("  {:>4}  {:<16} {:<8} EXIT", "RANK", "HOST", "STARTED");
    for (r, rank) in j.ranks.iter().enumerate() {
        println!(
            "  {:>4}  {:<16} {:<8} {}",
            r,
            rank.host,
            if rank.started { "yes" } else { "no" },
            rank.exit
                .as_ref()
                .map(|e| if e.signal != 0 {
                    format!("signal {}", e.signal)
                } else {
                    format!("code {}", e.code)
                })
                .unwrap_or_else(|| "-".into())
        );
    }
}

/// Commits an order (failover/failback) and, with `wait`, polls its intent
/// until it closes; a failed or cancelled order is an error (exit 2), one
/// still open when `wait` runs out is an unknown outcome (exit 4).
async fn order(
    client: &AdminClient,
    op: AdminOp,
    wait: Option<Duration>,
    json: bool,
) -> anyhow::Result<()> {
    let reply = client.call(AdminRequest::Write { op }, false).await?;
    let AdminReply::IntentOpened { id, log_index, .. } = reply else {
        bail!(ApiError::internal(format!(
            "unexpected reply to an order: {reply:?}"
        )));
    };
    let Some(wait) = wait else {
        if json {
            return print_json(&reply);
        }
        println!("intent {id} opened (log index {log_index}); follow it with `railguard intents`");
        return Ok(());
    };
    if !json {
        println!(
            "intent {id} opened (log index {log_index}); waiting up to {wait:?} for the agent"
        );
    }
    let deadline = Instant::now() + wait;
    loop {
        match client.call(AdminRequest::IntentShow { id }, false).await {
            Ok(AdminReply::Intent { intent }) => {
                if let IntentStatus::Closed(outcome) = &intent.status {
                    if json {
                        print_json(&intent)?;
                    } else {
                        println!("{}", intent_line(&intent));
                    }
                    return match outcome {
                        Outcome::Done => Ok(()),
                        Outcome::Failed { error } => Err(ApiError::new(
                            ErrorKind::FailedPrecondition,
                            format!("intent {id} failed: {error}"),
                        )
                        .into()),
                        Outcome::Cancelled { why } => Err(ApiError::new(
                            ErrorKind::FailedPrecondition,
                            format!("intent {id} was cancelled: {why}"),
                        )
                        .into()),
                    };
                }
            }
            Ok(other) => bail!(ApiError::internal(format!("unexpected reply {other:?}"))),
            // A leader election: keep asking until the deadline.
            Err(e) if e.kind == ErrorKind::Unavailable => {}
            Err(e) => return Err(e.into()),
        }
        if Instant::now() + Duration::from_millis(200) >= deadline {
            bail!(ApiError::unknown(format!(
                "intent {id} is still open after {wait:?}; follow it with `railguard intents`"
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn describe_action(a: &Action) -> String {
    match a {
        Action::CompleteDrain { host } => format!("complete drain of {host}"),
        Action::Failover { host, nic, to } => format!("failover of {host}/{nic} to {to}"),
        Action::Failback { host, nic } => format!("failback to {host}/{nic}"),
        Action::StartRank {
            job,
            incarnation,
            rank,
            host,
        } => format!("start {job}#{incarnation} rank {rank} on {host}"),
        Action::StopJob {
            job,
            incarnation,
            host,
        } => format!("stop {job}#{incarnation} (and older) on {host}"),
        Action::CheckpointJob {
            job,
            incarnation,
            host,
            halt,
        } => format!(
            "checkpoint {job}#{incarnation} on {host}{}",
            if *halt { " and halt" } else { "" }
        ),
        Action::ShapeNic { host, nic, version } => {
            format!("shape {host}/{nic} (version {version})")
        }
        Action::ClearShape { host, nic } => format!("clear shapes of {host}/{nic}"),
        Action::PlaybookStep {
            run,
            step,
            attempt,
            host,
            op,
        } => format!(
            "run {run} step {} attempt {} on {host}: {op:?}",
            step + 1,
            attempt + 1
        ),
    }
}

fn run_state(s: &supervisor::runs::RunState) -> String {
    use supervisor::runs::RunState;
    match s {
        RunState::Running => "running".into(),
        RunState::Waiting { until_ms } => format!("waiting (until {})", fmt_ms(*until_ms)),
        RunState::Completed => "completed".into(),
        RunState::Failed { why } => format!("failed: {why}"),
        RunState::Escalated { playbook, run } => format!("escalated to {playbook} (run {run})"),
        RunState::Cancelled { why } => format!("cancelled: {why}"),
    }
}

fn print_runs(runs: &[supervisor::runs::RunView], truncated: bool) {
    if runs.is_empty() {
        println!("no playbook runs");
        return;
    }
    println!(
        "{:>5} {:>8}  {:<14} {:<10} {:<20} {:<18} STATE",
        "RUN", "INCIDENT", "KIND", "HOST", "PLAYBOOK", "STEP"
    );
    for r in runs {
        let step = if r.step_id.is_empty() {
            "-".to_string()
        } else {
            format!("{} ({}/{})", r.step_id, r.step + 1, r.attempt + 1)
        };
        println!(
            "{:>5} {:>8}  {:<14} {:<10} {:<20} {:<18} {}",
            r.id,
            r.incident,
            r.incident_kind,
            r.host,
            format!("{} v{}", r.playbook, r.playbook_version),
            step,
            run_state(&r.state)
        );
    }
    if truncated {
        println!("(older runs left out)");
    }
}

fn intent_status(i: &Intent) -> String {
    match &i.status {
        IntentStatus::Open => "open".into(),
        IntentStatus::Closed(Outcome::Done) => "done".into(),
        IntentStatus::Closed(Outcome::Failed { .. }) => "failed".into(),
        IntentStatus::Closed(Outcome::Cancelled { .. }) => "cancelled".into(),
    }
}

/// `intent 7: failover of h0/rail0 to rail1: done (moved 3 connections)`.
fn intent_line(i: &Intent) -> String {
    let why = match &i.status {
        IntentStatus::Closed(Outcome::Failed { error }) => error.clone(),
        IntentStatus::Closed(Outcome::Cancelled { why }) => why.clone(),
        _ => i.detail.clone(),
    };
    let why = if why.is_empty() {
        String::new()
    } else {
        format!(" ({why})")
    };
    format!(
        "intent {}: {}: {}{why}",
        i.id,
        describe_action(&i.action),
        intent_status(i)
    )
}

fn print_intents(intents: &[Intent]) {
    if intents.is_empty() {
        println!("no intents");
        return;
    }
    println!(
        "{:>5}  {:<36} {:<9} {:<26} {:<26} DETAIL",
        "ID", "ACTION", "STATUS", "OPENED", "CLOSED"
    );
    for i in intents {
        let detail = match &i.status {
            IntentStatus::Closed(Outcome::Failed { error }) => error.as_str(),
            IntentStatus::Closed(Outcome::Cancelled { why }) => why.as_str(),
            _ => i.detail.as_str(),
        };
        println!(
            "{:>5}  {:<36} {:<9} {:<26} {:<26} {}",
            i.id,
            describe_action(&i.action),
            intent_status(i),
            fmt_ms(i.opened_ms),
            i.closed_ms.map(fmt_ms).unwrap_or_else(|| "-".into()),
            detail
        );
    }
}

fn print_qps(qps: &[QpView], truncated: bool) {
    if qps.is_empty() {
        println!("no connections");
        return;
    }
    println!(
        "{:<14} {:<16} {:>5} {:>20} {:<8} {:>4} {:<20} MOVED",
        "HOST", "JOB", "RANK", "CONN", "NIC", "RAIL", "PEER"
    );
    for v in qps {
        let q = &v.qp;
        println!(
            "{:<14} {:<16} {:>5} {:>20} {:<8} {:>4} {:<20} {}",
            v.host,
            q.job,
            q.rank,
            q.conn_id,
            q.nic,
            q.rail,
            format!("{}/{}", q.peer_host, q.peer_rank),
            if q.moved { "yes" } else { "no" }
        );
    }
    if truncated {
        println!("(more connections match; narrow with --host or --job)");
    }
}

async fn follow(client: &AdminClient, since: u64, json: bool) -> anyhow::Result<()> {
    client
        .follow(since, |e| {
            if json {
                println!("{}", serde_json::to_string(&e).unwrap_or_default());
            } else {
                print_event(&e);
            }
            true
        })
        .await?;
    Ok(())
}

fn print_event(e: &ClusterEvent) {
    println!(
        "{:>6}  {}  {:<10} {}",
        e.seq,
        fmt_ms(e.at_ms),
        e.host.as_deref().unwrap_or("-"),
        e.what
    );
}

fn print_incidents(incidents: &[Incident]) {
    if incidents.is_empty() {
        println!("no incidents");
        return;
    }
    println!(
        "{:>5}  {:<14} {:<10} {:<8} {:<26} {:<26} DETAIL",
        "ID", "KIND", "HOST", "NIC", "OPENED", "CLOSED"
    );
    for i in incidents {
        println!(
            "{:>5}  {:<14} {:<10} {:<8} {:<26} {:<26} {}",
            i.id,
            i.kind,
            i.host,
            i.nic.as_deref().unwrap_or("-"),
            fmt_ms(i.opened_ms),
            i.closed_ms.map(fmt_ms).unwrap_or_else(|| "open".into()),
            i.detail
        );
    }
}

/// `k=v` pairs joined by `sep`, or `empty` when there are none.
fn pairs<K: std::fmt::Display, V: std::fmt::Display>(
    m: &BTreeMap<K, V>,
    sep: &str,
    empty: &str,
) -> String {
    if m.is_empty() {
        return empty.into();
    }
    m.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(sep)
}

fn print_nics(nics: &[(String, Nic)]) {
    if nics.is_empty() {
        println!("no NICs");
        return;
    }
    println!(
        "{:<14} {:<8} {:>4} {:<8} {:<15} {:<10} {:>6} {:>8}  LAST CHANGE",
        "HOST", "NIC", "RAIL", "BACKUP", "ADDR", "STATE", "FLAPS", "PENALTY"
    );
    for (h, n) in nics {
        println!("{h:<14} {}", nic_row(n));
    }
}

/// One NIC's columns: name, rail, backup, address, state, flaps, penalty,
/// last change.
fn nic_row(n: &Nic) -> String {
    format!(
        "{:<8} {:>4} {:<8} {:<15} {:<10} {:>6} {:>8.0}  {}",
        n.name,
        n.rail.map(|r| r.to_string()).unwrap_or_else(|| "-".into()),
        n.backup.as_deref().unwrap_or("-"),
        n.addr.as_deref().unwrap_or("-"),
        format!("{:?}", n.state),
        n.flaps,
        n.damping_penalty,
        fmt_ms(n.last_change_ms)
    )
}

fn print_hosts(hosts: &[Host]) {
    if hosts.is_empty() {
        println!("no hosts registered");
        return;
    }
    println!(
        "{:<14} {:<10} {:<9} {:<9} {:>5}  LABELS",
        "HOST", "STATUS", "LIVENESS", "CLOCK", "NICS"
    );
    for h in hosts {
        println!(
            "{:<14} {:<10} {:<9} {:<9} {:>5}  {}",
            h.name,
            h.status().to_string(),
            format!("{:?}", h.liveness),
            format!("{:?}", h.clock.state),
            h.nics.len(),
            pairs(&h.labels, ",", "")
        );
    }
}

/// A float with `digits` decimals, or `-`.
fn num(x: Option<f64>, digits: usize) -> String {
    x.map(|v| format!("{v:.digits$}"))
        .unwrap_or_else(|| "-".into())
}

fn print_clock(v: &ClockView) {
    match (&v.solution, &v.reference) {
        (Some(s), Some(r)) => {
            println!(
                "reference: {r} (id {}); solution at {} ns on its clock, solved {:.1} s ago; \
                 {} edges used, {} rejected; chi2/dof {}",
                v.reference_id.unwrap_or_default(),
                s.at_ns,
                s.age_ms as f64 / 1e3,
                s.edges_used,
                s.edges_rejected,
                num(s.chi2_per_dof, 2)
            );
        }
        _ => println!("no clock solution yet (no fresh probe summaries from connected hosts)"),
    }
    if let Some(e) = &v.solve_error {
        println!("last solve failed: {e}");
    }
    if v.hosts.is_empty() {
        println!("no hosts registered");
        return;
    }
    println!(
        "{:>5}  {:<14} {:<9} {:>14} {:>10} {:>10} {:>9} {:>6}  SINCE",
        "ID", "HOST", "STATE", "OFFSET ns", "DRIFT ppb", "ERROR ns", "PROBE/s", "CPU%"
    );
    for h in &v.hosts {
        let live = h.live.as_ref();
        let held = live
            .and_then(|l| l.holdover_ms)
            .map(|ms| format!("  (held over {:.1} s)", ms as f64 / 1e3))
            .unwrap_or_default();
        // Pairs/s per peer now / configured, and the probe thread's CPU.
        let rate = h
            .probe
            .as_ref()
            .map(|p| format!("{}/{}", p.pairs_per_s, p.max_pairs_per_s))
            .unwrap_or_else(|| "-".into());
        println!(
            "{:>5}  {:<14} {:<9} {:>14} {:>10} {:>10} {:>9} {:>6}  {}{held}",
            h.id,
            h.host,
            format!("{:?}", h.state),
            num(live.map(|l| l.offset_ns), 1),
            num(live.map(|l| l.drift_ppb), 1),
            num(live.map(|l| l.error_bound_ns), 1),
            rate,
            num(h.probe.as_ref().and_then(|p| p.cpu_pct), 2),
            fmt_ms(h.state_changed_ms)
        );
    }
}

fn print_paths(v: &PathsView) {
    if v.paths.is_empty() {
        println!("no paths measured in the last {} s", v.window_s);
        return;
    }
    println!(
        "last {} s; min = min of per-second minima, p50 = median of per-second medians, \
         p99 = max of per-second p99s",
        v.window_s
    );
    println!(
        "{:<22} {:<22} {:>4} {:>9} {:>9} {:>9} {:>7} {:>8} {:>6}  CORR",
        "SRC", "DST", "RAIL", "MIN µs", "P50 µs", "P99 µs", "LOSS %", "SAMPLES", "AGE s"
    );
    for p in &v.paths {
        let corr = match p.correction {
            supervisor::api::Correction::Network => "network",
            supervisor::api::Correction::Pair => "pair",
            supervisor::api::Correction::Raw => "raw",
        };
        println!(
            "{:<22} {:<22} {:>4} {:>9} {:>9} {:>9} {:>7} {:>8} {:>6.1}  {corr}",
            format!("{}/{}", p.src, p.src_nic),
            format!("{}/{}", p.dst, p.dst_nic),
            p.rail,
            num(p.min_us, 1),
            num(p.p50_us, 1),
            num(p.p99_us, 1),
            num(p.loss_pct, 1),
            p.samples,
            p.age_ms as f64 / 1e3,
        );
    }
    if v.paths.len() < v.total {
        println!("({} of {} paths shown)", v.paths.len(), v.total);
    }
}

fn print_queueing(v: &supervisor::api::QueueingView) {
    if !v.topology {
        println!("(no topology loaded: contended paths are not localised to a link)");
    }
    if v.paths.is_empty() {
        println!(
            "no such paths (contended: a second's median queueing ≥ {:.0} µs)",
            v.enter_us
        );
        return;
    }
    println!(
        "{:<24} {:<24} {:>11} {:>11} {:>11} {:>9}  CONTENDED FOR s",
        "SRC", "DST", "BASE µs", "QUEUE p50", "QUEUE p99", "AGE s"
    );
    for p in &v.paths {
        println!(
            "{:<24} {:<24} {:>11.1} {:>11.1} {:>11.1} {:>9.1}  {}",
            format!("{}/{}", p.path.src, p.path.src_nic),
            format!("{}/{}", p.path.dst, p.path.dst_nic),
            p.baseline_us,
            p.queueing_p50_us,
            p.queueing_p99_us,
            p.age_ms as f64 / 1e3,
            p.contended_ms
                .map_or("-".into(), |ms| format!("{:.1}", ms as f64 / 1e3)),
        );
    }
    if v.paths.len() < v.total {
        println!("({} of {} paths shown)", v.paths.len(), v.total);
    }
}

fn rate(bps: Option<u64>) -> String {
    match bps {
        None => "-".into(),
        Some(b) if b >= 1_000_000_000 && b % 1_000_000_000 == 0 => {
            format!("{}Gbit", b / 1_000_000_000)
        }
        Some(b) => format!("{}Mbit", b / 1_000_000),
    }
}

fn print_links(v: &supervisor::api::LinksView) {
    let Some(file) = &v.topology else {
        println!("no topology loaded (start the supervisors with --topology FILE)");
        return;
    };
    println!("topology: {file}");
    println!(
        "{:<20} {:<30} {:>8} {:>6} {:>10} {:>7} {:>12}  BOTTLENECK",
        "LINK", "DIRECTION", "RATE", "PATHS", "CONTENDED", "SCORE", "QUEUE p99 µs"
    );
    // One directed link's row (its rate is the topology's).
    let score_row = |s: &supervisor::api::LinkScore| {
        println!(
            "{:<20} {:<30} {:>8} {:>6} {:>10} {:>7.2} {:>12}  {}",
            s.link.link,
            format!("{} → {}", s.link.from, s.link.to),
            rate(s.rate_bps),
            s.paths,
            s.contended,
            s.score,
            num(s.queueing_p99_us, 0),
            if s.bottleneck { "yes" } else { "" }
        );
    };
    for l in v.links.iter().filter(|l| !l.access) {
        let dirs: Vec<&supervisor::api::LinkScore> =
            v.scores.iter().filter(|s| s.link.link == l.name).collect();
        if dirs.is_empty() {
            println!(
                "{:<20} {:<30} {:>8} {:>6} {:>10} {:>7} {:>12}",
                l.name,
                format!("{} ↔ {}", l.a, l.b),
                rate(l.rate_bps),
                0,
                0,
                "-",
                "-"
            );
        }
        dirs.into_iter().for_each(score_row);
    }
    v.scores
        .iter()
        .filter(|s| s.access && s.contended > 0)
        .for_each(score_row);
    let cables = v.links.iter().filter(|l| l.access).count();
    println!("({cables} NIC cables; those with contended paths are listed)");
    for i in &v.incidents {
        println!(
            "incident {} open since {}: {}",
            i.id,
            fmt_ms(i.opened_ms),
            i.detail
        );
    }
}

fn print_shapes(rows: &[supervisor::api::ShapeRow]) {
    if rows.is_empty() {
        println!("no shapes");
        return;
    }
    for r in rows {
        let state = match (&r.desired, r.applied_version) {
            (Some(d), Some(v)) if d.version == v => "applied".to_string(),
            (Some(d), _) if d.failures >= supervisor::shaping::MAX_SHAPE_FAILURES => {
                format!("refused {} times", d.failures)
            }
            (Some(_), _) => "pending".to_string(),
            (None, Some(_)) => "to be removed".to_string(),
            (None, None) => "-".to_string(),
        };
        match &r.desired {
            Some(d) => {
                println!(
                    "{}/{}: {state} (incident {}, {}, version {})",
                    r.host, r.nic, d.incident, d.link, d.version
                );
                for c in &d.classes {
                    let flows: Vec<String> = c
                        .flows
                        .iter()
                        .map(|f| match (f.protocol, f.dst_port, f.src_port) {
                            (0, _, _) => format!("dst {}", f.dst),
                            (_, p, 0) => format!("dst {} tcp dport {p}", f.dst),
                            (_, _, p) => format!("dst {} tcp sport {p}", f.dst),
                        })
                        .collect();
                    println!(
                        "  1:{:x} {:<16} {:>9}  {}",
                        c.minor,
                        c.label,
                        rate(Some(c.rate_bps)),
                        flows.join(", ")
                    );
                }
                for (job, bps) in &d.pace {
                    println!("  pace job {job}: {} per connection", rate(Some(*bps)));
                }
            }
            None => println!("{}/{}: {state}", r.host, r.nic),
        }
    }
}

fn render(reply: &AdminReply) {
    match reply {
        AdminReply::Status(s) => {
            println!("answered by: supervisor {}", s.answered_by);
            println!(
                "leader:      {}",
                s.leader
                    .map(|l| format!("supervisor {l}"))
                    .unwrap_or_else(|| "none (election in progress?)".into())
            );
            println!("term:        {}", s.term);
            println!(
                "commit:      {} (applied {})",
                s.commit_index, s.applied_index
            );
            println!(
                "snapshot:    {} (log compacted through {})",
                s.snapshot_index
                    .map(|i| i.to_string())
                    .unwrap_or_else(|| "none".into()),
                s.purged_index
                    .map(|i| i.to_string())
                    .unwrap_or_else(|| "-".into())
            );
            println!("members:");
            for m in &s.members {
                println!(
                    "  {:>3}  {:<22} {:<8}{}",
                    m.id,
                    m.addr,
                    if m.voter { "voter" } else { "learner" },
                    if m.leader { " leader" } else { "" }
                );
            }
            println!("hosts:       {}", pairs(&s.hosts_by_status, " ", "none"));
            println!("open incidents: {}", s.open_incidents.len());
            for i in &s.open_incidents {
                println!(
                    "  #{} {} on {}{}",
                    i.id,
                    i.kind,
                    i.host,
                    i.nic.as_ref().map(|n| format!("/{n}")).unwrap_or_default()
                );
            }
            if !s.open_intents.is_empty() {
                println!("open intents: {}", s.open_intents.len());
                for i in &s.open_intents {
                    println!("  #{} {:?}", i.id, i.action);
                }
            }
        }
        AdminReply::Members { members } => {
            println!(
                "{:>4}  {:<22} {:<8} {:<7} MATCHED",
                "ID", "ADDRESS", "ROLE", "LEADER"
            );
            for m in members {
                println!(
                    "{:>4}  {:<22} {:<8} {:<7} {}",
                    m.id,
                    m.addr,
                    if m.voter { "voter" } else { "learner" },
                    if m.leader { "yes" } else { "" },
                    m.matched
                        .map(|x| x.to_string())
                        .unwrap_or_else(|| "-".into())
                );
            }
        }
        AdminReply::Hosts { hosts } => print_hosts(hosts),
        AdminReply::Host { host, jobs } => {
            println!("host:       {} (probe id {})", host.name, host.id);
            println!("status:     {}", host.status());
            println!("liveness:   {:?}", host.liveness);
            println!(
                "clock:      {:?}{}",
                host.clock.state,
                if host.clock.changed_ms > 0 {
                    format!(" since {}", fmt_ms(host.clock.changed_ms))
                } else {
                    String::new()
                }
            );
            println!("cordoned:   {}", host.cordoned);
            if let Some(d) = &host.drain {
                println!(
                    "drain:      {:?} since {} by {}: {}{}",
                    d.phase,
                    fmt_ms(d.since_ms),
                    d.by,
                    d.reason,
                    d.deadline_ms
                        .map(|x| format!(" (deadline {})", fmt_ms(x)))
                        .unwrap_or_default()
                );
            }
            println!("labels:     {}", pairs(&host.labels, ",", "-"));
            println!(
                "jobs:       {}",
                if jobs.is_empty() {
                    "-".into()
                } else {
                    jobs.join(",")
                }
            );
            println!("events:     applied through seq {}", host.last_event_seq);
            println!("NICS:");
            println!(
                "  {:<8} {:>4} {:<8} {:<15} {:<10} {:>6} {:>8}  LAST CHANGE",
                "NIC", "RAIL", "BACKUP", "ADDR", "STATE", "FLAPS", "PENALTY"
            );
            for n in host.nics.values() {
                println!("  {}", nic_row(n));
            }
        }
        AdminReply::Incidents { incidents } => print_incidents(incidents),
        AdminReply::Nics { nics } => print_nics(nics),
        AdminReply::Events { events } => {
            if events.is_empty() {
                println!("no events");
            }
            for e in events {
                print_event(e);
            }
        }
        AdminReply::History { records } => {
            for r in records {
                println!(
                    "{}  {:<10} {:>8}  {}",
                    fmt_ms(r.at_ms),
                    r.actor,
                    r.log_index,
                    r.op.summary()
                );
            }
        }
        AdminReply::Committed { log_index, detail } => {
            if *log_index > 0 {
                println!("ok (log index {log_index}): {detail}");
            } else {
                println!("ok: {detail}");
            }
        }
        AdminReply::Qps { qps, truncated } => print_qps(qps, *truncated),
        AdminReply::Intents { intents } => print_intents(intents),
        AdminReply::Intent { intent } => println!("{}", intent_line(intent)),
        AdminReply::IntentOpened {
            id,
            log_index,
            detail,
        } => println!("intent {id} opened (log index {log_index}): {detail}"),
        AdminReply::Clock(v) => print_clock(v),
        AdminReply::Paths(v) => print_paths(v),
        AdminReply::Queueing(v) => print_queueing(v),
        AdminReply::Links(v) => print_links(v),
        AdminReply::Shapes { shapes } => print_shapes(shapes),
        AdminReply::Jobs { jobs } => print_jobs(jobs),
        AdminReply::Playbooks { playbooks, version } => print_playbooks(playbooks, *version),
        AdminReply::Playbook { playbook } => {
            println!(
                "# playbook {} version {} from {} (applied by {} at {})",
                playbook.name,
                playbook.version,
                playbook.file,
                playbook.applied_by,
                fmt_ms(playbook.applied_ms)
            );
            print!("{}", playbook.source);
        }
        AdminReply::PlaybookPlan { plan, matched_now } => print_plan(plan, matched_now.as_deref()),
        AdminReply::PlaybookRuns { runs, truncated } => print_runs(runs, *truncated),
        AdminReply::Job { job } => print_job(job),
        AdminReply::JobLogs {
            host,
            incarnation,
            text,
        } => {
            eprintln!("--- {host}, incarnation {incarnation} ---");
            print!("{text}");
            if !text.ends_with('\n') && !text.is_empty() {
                println!();
            }
        }
    }
}
