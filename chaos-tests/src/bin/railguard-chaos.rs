//! `railguard-chaos`: demo, scenarios and benchmarks. Progress goes to
//! stderr; the last line on stdout is one JSON object with `"ok"` and the
//! figures; the exit status is non-zero when not ok.

use clap::{Parser, Subcommand};

/// Large messages are allocated and freed at GB/s on the receive path;
/// mimalloc keeps freed pages for reuse where glibc returns them to the
/// kernel and faults them in again (measured: up to 2x on `bench failover`).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
use serde::Serialize;

/// railguard chaos suite.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// A real cluster in network namespaces, a NIC flap and a storm, a
    /// printed timeline (needs root). `--drain`: a loopback drain-through-failover demo.
    Demo {
        /// Run the loopback drain demo instead (no root needed).
        #[arg(long)]
        drain: bool,
    },
    /// Run a scenario and check its invariants.
    #[command(subcommand)]
    Scenario(Scenario),
    /// Measure and print figures.
    #[command(subcommand)]
    Bench(Bench),
}

#[derive(clap::Args, Debug, Clone)]
struct ContentionArgs {
    /// Hosts on each leaf (3..=8): jobs on the first two of each, the
    /// bulk flow from the third of leaf 0 to the third of leaf 1.
    #[arg(long, default_value_t = 3)]
    hosts_per_leaf: usize,
    /// Rate of each direction of the uplink between the leaves (Mbit/s).
    #[arg(long, default_value_t = 400)]
    uplink_mbit: u64,
    /// Steps of each ringtrain job.
    #[arg(long, default_value_t = 150)]
    steps: u64,
    /// ringtrain's hidden width (default 1024: 4.5 MB of gradients per step).
    #[arg(long)]
    hidden: Option<u32>,
    /// Longest one phase may take (s).
    #[arg(long, default_value_t = 600)]
    deadline_secs: u64,
}

impl ContentionArgs {
    fn opts(&self, quiet_secs: u64) -> anyhow::Result<chaos_tests::contention::ContentionOpts> {
        if !(10..=3_600).contains(&self.deadline_secs) {
            anyhow::bail!("--deadline-secs takes 10..=3600");
        }
        if quiet_secs > 3_600 {
            anyhow::bail!("--quiet-secs takes 0..=3600");
        }
        Ok(chaos_tests::contention::ContentionOpts {
            hosts_per_leaf: self.hosts_per_leaf,
            uplink_mbit: self.uplink_mbit,
            steps: self.steps,
            hidden: self.hidden,
            quiet: std::time::Duration::from_secs(quiet_secs),
            reshaping: true,
            deadline: std::time::Duration::from_secs(self.deadline_secs),
        })
    }
}

#[derive(Subcommand, Debug)]
enum Scenario {
    /// Concurrent admin writes and linearizable reads while the leader is SIGKILLed every round.
    LeaderKill {
        #[arg(long, default_value_t = 20)]
        rounds: usize,
        #[arg(long, default_value_t = 4)]
        hosts: usize,
        #[arg(long, default_value_t = 6)]
        clients: usize,
        /// Load time before each kill, in ms.
        #[arg(long, default_value_t = 1500)]
        load_ms: u64,
        #[arg(long, default_value_t = 7)]
        seed: u64,
    },
    /// Random NIC flaps (host and fabric side, storms, overlaps) in a netns
    /// cluster with an agent and the leader SIGKILLed; every transition must
    /// commit exactly once, in order. Needs root.
    NicFlap {
        #[arg(long, default_value_t = 4)]
        hosts: usize,
        #[arg(long, default_value_t = 50)]
        flaps: usize,
        #[arg(long, default_value_t = 3)]
        seed: u64,
        /// Skip waiting for damping to release every NIC at the end.
        #[arg(long)]
        no_quiet: bool,
    },
    /// Two hosts stream checksummed messages of mixed sizes over resilient
    /// connections while NICs flap on both ends (host and fabric side), both
    /// NICs of one host go down for a while and an agent is restarted:
    /// nothing lost, duplicated, reordered or corrupted. Needs root.
    QpMigrate {
        #[arg(long, default_value_t = 100)]
        flaps: usize,
        /// Resilient connections between the two hosts.
        #[arg(long, default_value_t = 4)]
        conns: usize,
        /// Largest message, bytes (sizes are log-uniform from 1 byte).
        #[arg(long, default_value_t = 4 << 20)]
        max_message: usize,
        /// How long both NICs of one host stay down (ms; 0: skip).
        #[arg(long, default_value_t = 2000)]
        outage_ms: u64,
        #[arg(long, default_value_t = 5)]
        seed: u64,
    },
    /// A host's management link is cut: it must go Suspect and never Down
    /// while its peers hear its probes; afterwards it is Ready and its
    /// outbox drains. Needs root.
    MgmtPartition {
        #[arg(long, default_value_t = 4)]
        hosts: usize,
        /// How long the link stays cut (s).
        #[arg(long, default_value_t = 10.0)]
        cut_secs: f64,
        #[arg(long, default_value_t = 21)]
        seed: u64,
    },
    /// Two leaves joined by a shaped uplink, two ringtrain jobs crossing it
    /// and a bulk flow: the link_contention incident must name the uplink
    /// within 2 s of the load starting, shapes must be applied on the
    /// senders and removed (nothing left on any NIC) when the load ends;
    /// a quiet run before the load must raise no incident. Needs root.
    Contention {
        #[command(flatten)]
        args: ContentionArgs,
        /// Length of the quiet run before the load (s).
        #[arg(long, default_value_t = 300)]
        quiet_secs: u64,
    },
    /// A NIC's cable is detached from its rail bridge (carrier stays up,
    /// netlink sees nothing): probe loss must take it Down within 1 s, and
    /// reattaching must bring it back. Needs root.
    ProbeBlackhole {
        #[arg(long, default_value_t = 4)]
        hosts: usize,
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// How long each blackhole lasts (s).
        #[arg(long, default_value_t = 2.0)]
        hold_secs: f64,
        #[arg(long, default_value_t = 31)]
        seed: u64,
    },
    /// ringtrain across the hosts under a NIC flap storm on random hosts:
    /// it must finish with no restart and the fault-free run's digest.
    /// Prints goodput (steps/s against the fault-free run). Needs root.
    TrainNicFlap {
        #[command(flatten)]
        train: TrainArgs,
        #[command(flatten)]
        storm: StormArgs,
    },
    /// A host running a rank is lost mid-run (agent and ranks SIGKILLed,
    /// links down): the job resumes on a spare from its latest complete
    /// checkpoint, loses at most one checkpoint interval, and ends with the
    /// fault-free digest. Needs root.
    HostLoss {
        #[command(flatten)]
        train: TrainArgs,
        /// Lose the host once the job reached this step.
        #[arg(long, default_value_t = 120)]
        at_step: u64,
    },
    /// A host running a rank is drained mid-run: the job halts at a
    /// checkpoint and moves to a spare with 0 lost steps and the fault-free
    /// digest. Needs root.
    Drain {
        #[command(flatten)]
        train: TrainArgs,
        /// Drain once the job reached this step.
        #[arg(long, default_value_t = 120)]
        at_step: u64,
    },
    /// The shipped playbook library is applied to a 3-supervisor cluster,
    /// then every invalid playbook of `playbooks/tests/bad/` through the
    /// CLI and the API: each refused with its file:line:column and message,
    /// the stored playbooks unchanged.
    BadPlaybooks,
    /// NIC flap storms open `nic_flapping` incidents whose shipped playbook
    /// (migrate off, wait until reusable, fail back) runs while the leader
    /// is SIGKILLed at a random moment of every wave: every playbook must
    /// complete and no agent may execute an order twice (checked against
    /// the agents' execution journals). Needs root.
    PlaybookLeaderKill {
        /// Playbooks to complete (one nic_flapping incident each).
        #[arg(long, default_value_t = 50)]
        rounds: usize,
        /// Incidents per wave (hosts flapping at once), 1..=4.
        #[arg(long, default_value_t = 4)]
        parallel: usize,
        #[arg(long, default_value_t = 7)]
        seed: u64,
    },
    /// The same load while all supervisors are SIGKILLed at once and restarted.
    ClusterCrash {
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        #[arg(long, default_value_t = 4)]
        hosts: usize,
        #[arg(long, default_value_t = 6)]
        clients: usize,
        #[arg(long, default_value_t = 1500)]
        load_ms: u64,
        #[arg(long, default_value_t = 11)]
        seed: u64,
    },
}

/// The training job of the ringtrain scenarios.
#[derive(clap::Args, Debug, Clone)]
struct TrainArgs {
    /// Hosts in the testbed (ranks plus spares); default: ranks + 1.
    #[arg(long)]
    hosts: Option<usize>,
    #[arg(long, default_value_t = 4)]
    ranks: u32,
    #[arg(long, default_value_t = 300)]
    steps: u64,
    #[arg(long, default_value_t = 50)]
    checkpoint_every: u64,
    /// ringtrain's hidden width (default: its own, ~4.5 MB of gradients).
    #[arg(long)]
    hidden: Option<u32>,
    #[arg(long, default_value_t = 1)]
    supervisors: usize,
    /// Longest the job may take (s).
    #[arg(long, default_value_t = 600)]
    deadline_secs: u64,
}

impl TrainArgs {
    fn opts(&self, spare: bool) -> anyhow::Result<chaos_tests::training::TrainOpts> {
        let hosts = self
            .hosts
            .unwrap_or(self.ranks as usize + usize::from(spare));
        if !(1..=16).contains(&self.ranks) || hosts < self.ranks as usize || hosts > 32 {
            anyhow::bail!("--ranks takes 1..=16 and --hosts ranks..=32");
        }
        if !(1..=100_000).contains(&self.steps) || self.checkpoint_every > self.steps {
            anyhow::bail!("--steps takes 1..=100000 and --checkpoint-every at most --steps");
        }
        if !(1..=7).contains(&self.supervisors) || !(1..=7200).contains(&self.deadline_secs) {
            anyhow::bail!("--supervisors takes 1..=7 and --deadline-secs 1..=7200");
        }
        Ok(chaos_tests::training::TrainOpts {
            hosts,
            supervisors: self.supervisors,
            ranks: self.ranks,
            steps: self.steps,
            checkpoint_every: self.checkpoint_every,
            hidden: self.hidden,
            deadline: std::time::Duration::from_secs(self.deadline_secs),
            ..Default::default()
        })
    }
}

/// The flap storm of the training scenarios.
#[derive(clap::Args, Debug, Clone)]
struct StormArgs {
    /// Mean time between flaps (ms).
    #[arg(long, default_value_t = 4000)]
    flap_every_ms: u64,
    /// How long a cable stays down (ms). The default outlasts the fragile
    /// baseline's 2 s stall timeout, so a flap on its rail is fatal to it,
    /// as a link loss is to an NCCL job once its retries run out.
    #[arg(long, default_value_t = 2500)]
    flap_down_ms: u64,
    #[arg(long, default_value_t = 41)]
    seed: u64,
}

impl StormArgs {
    fn storm(&self) -> anyhow::Result<chaos_tests::training::Storm> {
        if !(100..=600_000).contains(&self.flap_every_ms)
            || !(10..=20_000).contains(&self.flap_down_ms)
        {
            anyhow::bail!("--flap-every-ms takes 100..=600000 and --flap-down-ms 10..=20000");
        }
        Ok(chaos_tests::training::Storm {
            every: std::time::Duration::from_millis(self.flap_every_ms),
            down: std::time::Duration::from_millis(self.flap_down_ms),
            seed: self.seed,
        })
    }
}

impl Scenario {
    /// The admin-history run of `leader-kill` / `cluster-crash`.
    fn history_run(&self) -> Option<chaos_tests::admin_history::HistoryRun> {
        let (rounds, hosts, clients, load_ms, seed, whole_cluster) = match *self {
            Scenario::LeaderKill {
                rounds,
                hosts,
                clients,
                load_ms,
                seed,
            } => (rounds, hosts, clients, load_ms, seed, false),
            Scenario::ClusterCrash {
                rounds,
                hosts,
                clients,
                load_ms,
                seed,
            } => (rounds, hosts, clients, load_ms, seed, true),
            _ => return None,
        };
        Some(chaos_tests::admin_history::HistoryRun {
            rounds,
            hosts,
            clients,
            whole_cluster,
            load_per_round: std::time::Duration::from_millis(load_ms),
            seed,
        })
    }
}

#[derive(Subcommand, Debug)]
enum Bench {
    /// Link down to first message delivered over the backup (p50/p99 over
    /// many flaps), steady throughput of a resilient connection against
    /// plain TCP on the same veth, and the throughput dip around a flap.
    /// Needs root.
    Failover {
        #[arg(long, default_value_t = 100)]
        flaps: usize,
        /// Seconds of each steady-throughput run.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        #[arg(long, default_value_t = 13)]
        seed: u64,
    },
    /// Time from a netlink link change to the agent seeing it and to the
    /// state being committed; time from host loss to Down. Needs root.
    Detect {
        #[arg(long, default_value_t = 200)]
        flaps: usize,
        #[arg(long, default_value_t = 10)]
        host_losses: usize,
        #[arg(long, default_value_t = 9)]
        seed: u64,
    },
    /// Software clock sync against the truth: random test clock errors
    /// (±1 s, ±200 ppm) on every agent; per-host error of railguard's
    /// network solution and of an NTP-style estimator from the same probes,
    /// convergence time, probe CPU and bytes per agent. Needs root.
    ClockSync {
        #[arg(long, default_value_t = 8)]
        hosts: usize,
        /// Measurement window after convergence (s).
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Supervisors (1 keeps the 2-core testbed quieter).
        #[arg(long, default_value_t = 1)]
        supervisors: usize,
        #[arg(long, default_value_t = 17)]
        seed: u64,
        /// Queue one rail: split rail 0 into two leaves joined by an uplink
        /// shaped to this many Mbit/s and run a bulk TCP flow across it
        /// (leaf 0 → leaf 1) for the whole window; the shipped
        /// link-contention playbook is deleted first, so the flow is not
        /// reshaped away. 0: an idle fabric.
        #[arg(long, default_value_t = 0)]
        uplink_load_mbit: u64,
        /// Queue both rails both ways: split each rail into two leaves
        /// joined by an uplink shaped to this many Mbit/s and send bursty
        /// UDP cross traffic (bursts of 1400-byte datagrams, geometric size
        /// of mean 8, exponential gaps) across each uplink in both
        /// directions at --cross-load-util of its rate, so every probe path
        /// between the leaves queues on and off and no rail or direction
        /// stays idle. The link-contention playbook is deleted first. 0: off.
        #[arg(long, default_value_t = 0)]
        cross_load_mbit: u64,
        /// Offered cross traffic per direction, as a fraction of the uplink
        /// rate (0.05..=1.2).
        #[arg(long, default_value_t = 0.85)]
        cross_load_util: f64,
        /// The agents' probe CPU budget, % of one core (their governor
        /// lowers the probe rate to stay inside it; 0 turns it off).
        /// Default: the agent's (1).
        #[arg(long)]
        probe_cpu_budget_pct: Option<f64>,
        /// The agents' probe rate, pairs/s per peer (the most: the CPU
        /// governor may lower it). Default: the agent's (100).
        #[arg(long)]
        probe_rate: Option<u32>,
        /// Pin every agent to this CPU. veth runs a probe's whole path in
        /// the sender's context, so with agents on different CPUs a path's
        /// two directions run on CPUs of different speeds (an asymmetry no
        /// estimator can see); pinned, every path runs on one CPU.
        /// Default: not pinned.
        #[arg(long)]
        pin_agents_cpu: Option<usize>,
    },
    /// The same ringtrain job under the same flap storm, with railguard's
    /// migration and without it (no backup rail: the job dies on a network
    /// error and restarts from its checkpoint, as NCCL jobs do today):
    /// steps/s of each and their ratio. Needs root.
    Goodput {
        #[command(flatten)]
        train: TrainArgs,
        #[command(flatten)]
        storm: StormArgs,
    },
    /// The contention setup with reshaping off, then on (fresh clusters):
    /// p99 OWD across the uplink and each job's mean/p99 step time side by
    /// side. Needs root.
    Reshaping {
        #[command(flatten)]
        args: ContentionArgs,
    },
    /// Committed events/s and latency of 3 supervisors at 1, 16 and 256 clients.
    RaftCommit {
        /// Seconds measured per concurrency level.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// Client counts (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "1,16,256")]
        clients: Vec<usize>,
        /// Trials per level: throughput is the median over trials, latency
        /// percentiles are over every sample of every trial.
        #[arg(long, default_value_t = 3)]
        trials: usize,
    },
}

fn finish<T: Serialize>(ok: bool, report: &T) -> ! {
    match serde_json::to_string(report) {
        Ok(line) => println!("{line}"),
        Err(e) => println!("{{\"ok\":false,\"error\":{:?}}}", e.to_string()),
    }
    std::process::exit(if ok { 0 } else { 1 });
}

fn main() {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let result: anyhow::Result<(bool, serde_json::Value)> = rt.block_on(async {
        // Ctrl-C or SIGTERM (e.g. `timeout`): kill what this run started
        // and remove its namespaces.
        tokio::spawn(async {
            use tokio::signal::unix::{signal, SignalKind};
            let mut term = signal(SignalKind::terminate())
                .map_err(|e| eprintln!("warning: no SIGTERM handler ({e}); only Ctrl-C cleans up"))
                .ok();
            let sigterm = async {
                match term.as_mut() {
                    Some(t) => t.recv().await,
                    None => std::future::pending().await,
                }
            };
            // A branch whose handler cannot be installed never fires.
            let code = tokio::select! {
                Ok(()) = tokio::signal::ctrl_c() => 130,
                _ = sigterm => 143,
            };
            eprintln!("interrupted: cleaning up");
            testbed::cleanup_all_live();
            std::process::exit(code);
        });
        match cli.cmd {
            Cmd::Demo { drain: true } => {
                let r = chaos_tests::demo::drain().await?;
                Ok((r.ok, serde_json::to_value(&r)?))
            }
            Cmd::Demo { drain: false } => {
                let r = chaos_tests::demo::nic_flap().await?;
                Ok((r.ok, serde_json::to_value(&r)?))
            }
            Cmd::Scenario(s @ (Scenario::LeaderKill { .. } | Scenario::ClusterCrash { .. })) => {
                let r = chaos_tests::admin_history::run(s.history_run().expect("history scenario"))
                    .await?;
                Ok((r.ok, serde_json::to_value(&r)?))
            }
            Cmd::Scenario(Scenario::NicFlap {
                hosts,
                flaps,
                seed,
                no_quiet,
            }) => {
                if !(2..=50).contains(&hosts) || !(1..=10_000).contains(&flaps) {
                    anyhow::bail!("--hosts takes 2..=50 and --flaps 1..=10000");
                }
                if !testbed::require_root("scenario nic-flap")? {
                    anyhow::bail!("scenario nic-flap needs root");
                }
                let r = chaos_tests::nic_flap::run(chaos_tests::nic_flap::NicFlapRun {
                    hosts,
                    flaps,
                    seed,
                    wait_quiet: !no_quiet,
                })
                .await?;
                Ok((r.ok, serde_json::to_value(&r)?))
            }
            Cmd::Scenario(Scenario::QpMigrate {
                flaps,
                conns,
                max_message,
                outage_ms,
                seed,
            }) => {
                if !(1..=10_000).contains(&flaps) || !(1..=64).contains(&conns) {
                    anyhow::bail!("--flaps takes 1..=10000 and --conns 1..=64");
                }
                if !(16..=(64 << 20)).contains(&max_message) || outage_ms > 25_000 {
                    anyhow::bail!("--max-message takes 16..=67108864 and --outage-ms at most 25000 (under the 30 s stall timeout)");
                }
                if !testbed::require_root("scenario qp-migrate")? {
                    anyhow::bail!("scenario qp-migrate needs root");
                }
                let r = chaos_tests::qp::qp_migrate(chaos_tests::qp::QpMigrateRun {
                    flaps,
                    conns,
                    max_message,
                    seed,
                    outage: std::time::Duration::from_millis(outage_ms),
                })
                .await?;
                Ok((r.ok, serde_json::to_value(&r)?))
            }
            Cmd::Scenario(Scenario::PlaybookLeaderKill {
                rounds,
                parallel,
                seed,
            }) => {
                if !testbed::require_root("scenario playbook-leader-kill")? {
                    anyhow::bail!("scenario playbook-leader-kill needs root");
                }
                let r = chaos_tests::playbook_leader_kill::playbook_leader_kill(
                    chaos_tests::playbook_leader_kill::LeaderKillRun {
                        rounds,
                        parallel,
                        seed,
                        ..Default::default()
                    },
                )
                .await?;
                Ok((r.ok, serde_json::to_value(&r)?))
            }
            Cmd::Scenario(Scenario::BadPlaybooks) => {
                let r = chaos_tests::playbook_scenarios::bad_playbooks().await?;
                Ok((r.ok, serde_json::to_value(&r)?))
            }
            Cmd::Scenario(Scenario::TrainNicFlap { train, storm }) => {
                let (o, st) = (train.opts(false)?, storm.storm()?);
                if !testbed::require_root("scenario train-nic-flap")? {
                    anyhow::bail!("scenario train-nic-flap needs root");
                }
                let v = chaos_tests::training::train_nic_flap(&o, st).await?;
                Ok((v["ok"] == true, v))
            }
            Cmd::Scenario(Scenario::HostLoss { train, at_step }) => {
                let o = train.opts(true)?;
                if at_step == 0 || at_step >= o.steps {
                    anyhow::bail!("--at-step must be within 1..steps");
                }
                if !testbed::require_root("scenario host-loss")? {
                    anyhow::bail!("scenario host-loss needs root");
                }
                let v = chaos_tests::training::host_loss(&o, at_step).await?;
                Ok((v["ok"] == true, v))
            }
            Cmd::Scenario(Scenario::Drain { train, at_step }) => {
                let o = train.opts(true)?;
                if at_step == 0 || at_step >= o.steps {
                    anyhow::bail!("--at-step must be within 1..steps");
                }
                if !testbed::require_root("scenario drain")? {
                    anyhow::bail!("scenario drain needs root");
                }
                let v = chaos_tests::training::drain(&o, at_step).await?;
                Ok((v["ok"] == true, v))
            }
            Cmd::Bench(Bench::Goodput { train, storm }) => {
                let (o, st) = (train.opts(false)?, storm.storm()?);
                if !testbed::require_root("bench goodput")? {
                    anyhow::bail!("bench goodput needs root");
                }
                let v = chaos_tests::training::goodput(&o, st).await?;
                Ok((v["ok"] == true, v))
            }
            Cmd::Bench(Bench::Failover {
                flaps,
                seconds,
                seed,
            }) => {
                if !(1..=10_000).contains(&flaps) || !(0.5..=120.0).contains(&seconds) {
                    anyhow::bail!("--flaps takes 1..=10000 and --seconds 0.5..=120");
                }
                if !testbed::require_root("bench failover")? {
                    anyhow::bail!("bench failover needs root");
                }
                let r = chaos_tests::qp::failover(chaos_tests::qp::FailoverRun {
                    flaps,
                    seed,
                    throughput_secs: seconds,
                })
                .await?;
                Ok((r.ok, serde_json::to_value(&r)?))
            }
            Cmd::Bench(Bench::Detect {
                flaps,
                host_losses,
                seed,
            }) => {
                if !(1..=100_000).contains(&flaps) || host_losses > 1000 {
                    anyhow::bail!("--flaps takes 1..=100000 and --host-losses at most 1000");
                }
                if !testbed::require_root("bench detect")? {
                    anyhow::bail!("bench detect needs root");
                }
                let r = chaos_tests::detect::run(flaps, host_losses, seed).await?;
                Ok((r.ok, serde_json::to_value(&r)?))
            }
            Cmd::Scenario(Scenario::MgmtPartition {
                hosts,
                cut_secs,
                seed,
            }) => {
                if !(0.5..=120.0).contains(&cut_secs) {
                    anyhow::bail!("--cut-secs takes 0.5..=120");
                }
                if !testbed::require_root("scenario mgmt-partition")? {
                    anyhow::bail!("scenario mgmt-partition needs root");
                }
                let r = chaos_tests::probe_scenarios::mgmt_partition(
                    chaos_tests::probe_scenarios::MgmtPartitionRun {
                        hosts,
                        cut: std::time::Duration::from_secs_f64(cut_secs),
                        seed,
                    },
                )
                .await?;
                Ok((r.ok, serde_json::to_value(&r)?))
            }
            Cmd::Scenario(Scenario::Contention { args, quiet_secs }) => {
                let o = args.opts(quiet_secs)?;
                if !testbed::require_root("scenario contention")? {
                    anyhow::bail!("scenario contention needs root");
                }
                let v = chaos_tests::contention::scenario(&o).await?;
                Ok((v["ok"] == true, v))
            }
            Cmd::Bench(Bench::Reshaping { args }) => {
                let o = args.opts(0)?;
                if !testbed::require_root("bench reshaping")? {
                    anyhow::bail!("bench reshaping needs root");
                }
                let v = chaos_tests::contention::bench(&o).await?;
                Ok((v["ok"] == true, v))
            }
            Cmd::Scenario(Scenario::ProbeBlackhole {
                hosts,
                rounds,
                hold_secs,
                seed,
            }) => {
                if !(0.1..=60.0).contains(&hold_secs) {
                    anyhow::bail!("--hold-secs takes 0.1..=60");
                }
                if !testbed::require_root("scenario probe-blackhole")? {
                    anyhow::bail!("scenario probe-blackhole needs root");
                }
                let r = chaos_tests::probe_scenarios::probe_blackhole(
                    chaos_tests::probe_scenarios::BlackholeRun {
                        hosts,
                        rounds,
                        hold: std::time::Duration::from_secs_f64(hold_secs),
                        seed,
                    },
                )
                .await?;
                Ok((r.ok, serde_json::to_value(&r)?))
            }
            Cmd::Bench(Bench::ClockSync {
                hosts,
                seconds,
                supervisors,
                seed,
                uplink_load_mbit,
                cross_load_mbit,
                cross_load_util,
                probe_cpu_budget_pct,
                probe_rate,
                pin_agents_cpu,
            }) => {
                if !(1..=3600).contains(&seconds) || !(1..=5).contains(&supervisors) {
                    anyhow::bail!("--seconds takes 1..=3600 and --supervisors 1..=5");
                }
                if uplink_load_mbit > 10_000 || cross_load_mbit > 10_000 {
                    anyhow::bail!(
                        "--uplink-load-mbit and --cross-load-mbit take 0 (off) or 1..=10000"
                    );
                }
                if !(0.05..=1.2).contains(&cross_load_util) {
                    anyhow::bail!("--cross-load-util takes 0.05..=1.2");
                }
                if !testbed::require_root("bench clock-sync")? {
                    anyhow::bail!("bench clock-sync needs root");
                }
                let r = chaos_tests::clock_sync::run(chaos_tests::clock_sync::ClockSyncRun {
                    hosts,
                    supervisors,
                    seconds,
                    seed,
                    converge_timeout: std::time::Duration::from_secs(60),
                    uplink_load_mbit,
                    cross_load_mbit,
                    cross_load_util,
                    probe_cpu_budget_pct,
                    probe_rate,
                    pin_agents_cpu,
                })
                .await?;
                Ok((r.ok, serde_json::to_value(&r)?))
            }
            Cmd::Bench(Bench::RaftCommit {
                seconds,
                clients,
                trials,
            }) => {
                if !(1..=50).contains(&trials) {
                    anyhow::bail!("--trials takes 1..=50");
                }
                if clients.is_empty() || clients.iter().any(|c| *c == 0 || *c > 1024) {
                    anyhow::bail!("--clients takes counts between 1 and 1024");
                }
                if !(0.5..=600.0).contains(&seconds) {
                    anyhow::bail!("--seconds must be between 0.5 and 600");
                }
                let r = chaos_tests::bench::raft_commit(&clients, seconds, trials).await?;
                Ok((r.ok, serde_json::to_value(&r)?))
            }
        }
    });
    match result {
        Ok((ok, v)) => finish(ok, &v),
        Err(e) => {
            eprintln!("error: {e:#}");
            finish(
                false,
                &serde_json::json!({"ok": false, "error": format!("{e:#}")}),
            )
        }
    }
}
