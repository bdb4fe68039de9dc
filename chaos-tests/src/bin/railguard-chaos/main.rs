//! `railguard-chaos`: demo, scenarios and benchmarks. Progress goes to
//! stderr; the last line on stdout is one JSON object with `"ok"` and the
//! figures; the exit status is non-zero when not ok.
//!
//! Every subcommand is one row of a table ([`SCENARIOS`], [`BENCHES`],
//! [`DEMO`]): its name, its help line, and a [`Runner`] — a `clap::Args`
//! struct holding its flags whose `run` checks them, asks for root where
//! the run needs it and returns `(ok, report)`. The command line is built
//! from the tables, and one dispatcher finds the row and prints the report.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use anyhow::{bail, ensure};
use clap::{ArgMatches, Args, Command};
use serde::Serialize;

/// Large messages are allocated and freed at GB/s on the receive path;
/// mimalloc keeps freed pages for reuse where glibc returns them to the
/// kernel and faults them in again (measured: up to 2x on `bench failover`).
mod fault_runs;
mod runner;
mod training_runs;

use fault_runs::{DiskFaults, Fuzz};
use runner::{need_root, report, value_report, Outcome, Runner};
use training_runs::{
    CutOffHost, Drain, Goodput, HostLoss, NoCommonRail, TcpFailover, TorchDrain, TorchGoodput,
    TorchHostLoss, TorchNicFlap, TrainNicFlap,
};

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A started run.
type Run = Pin<Box<dyn Future<Output = Outcome>>>;

/// One row of a subcommand table.
struct Entry {
    /// The subcommand's name, as typed (`nic-flap`).
    name: &'static str,
    /// The line `--help` shows for it.
    help: &'static str,
    /// Adds its flags to the subcommand.
    args: fn(Command) -> Command,
    /// Parses its flags from the matches and starts the run.
    run: fn(&ArgMatches, String) -> anyhow::Result<Run>,
}

/// The table row of runner `R`.
const fn entry<R: Runner>(name: &'static str, help: &'static str) -> Entry {
    Entry {
        name,
        help,
        args: R::augment_args,
        run: start::<R>,
    }
}

fn start<R: Runner>(m: &ArgMatches, what: String) -> anyhow::Result<Run> {
    let r = R::from_arg_matches(m)?;
    Ok(Box::pin(r.run(what)))
}

/// `railguard-chaos fuzz`.
const FUZZ: Entry = entry::<Fuzz>(
    "fuzz",
    "A deterministic simulation of the supervisor cluster (openraft and the replicated \
     model, one thread, tokio's clock paused): seeded schedules of writes, partitions, \
     crashes, loss and delays, the Raft and model invariants checked after every step; \
     a failing seed replays with --first SEED --seeds 1. No root",
);

/// `railguard-chaos demo`.
const DEMO: Entry = entry::<Demo>(
    "demo",
    "A real cluster in network namespaces, a NIC flap and a storm, a printed \
     timeline (needs root). `--drain`: a loopback drain-through-failover demo",
);

/// `railguard-chaos scenario <name>`: runs that check invariants.
const SCENARIOS: &[Entry] = &[
    entry::<LeaderKill>(
        "leader-kill",
        "Concurrent admin writes and linearizable reads while the leader is SIGKILLed every round",
    ),
    entry::<NicFlap>(
        "nic-flap",
        "Random NIC flaps (host and fabric side, storms, overlaps) in a netns cluster with an \
         agent and the leader SIGKILLed; every transition must commit exactly once, in order. \
         Needs root",
    ),
    entry::<QpMigrate>(
        "qp-migrate",
        "Two hosts stream checksummed messages of mixed sizes over resilient connections while \
         NICs flap on both ends (host and fabric side), both NICs of one host go down for a \
         while and an agent is restarted: nothing lost, duplicated, reordered or corrupted. \
         Needs root",
    ),
    entry::<MgmtPartition>(
        "mgmt-partition",
        "A host's management link is cut: it must go Suspect and never Down while its peers \
         hear its probes; afterwards it is Ready and its outbox drains. Needs root",
    ),
    entry::<Contention>(
        "contention",
        "Two leaves joined by a shaped uplink, two ringtrain jobs crossing it and a bulk flow: \
         the link_contention incident must name the uplink within 2 s of the load starting, \
         shapes must be applied on the senders and removed (nothing left on any NIC) when the \
         load ends; a quiet run before the load must raise no incident. Needs root",
    ),
    entry::<ProbeBlackhole>(
        "probe-blackhole",
        "A NIC's cable is detached from its rail bridge (carrier stays up, netlink sees \
         nothing): probe loss must take it Down within 1 s, and reattaching must bring it \
         back. Needs root",
    ),
    entry::<TrainNicFlap>(
        "train-nic-flap",
        "ringtrain across the hosts under a NIC flap storm on random hosts: it must finish \
         with no restart and the fault-free run's digest. Prints goodput (steps/s against the \
         fault-free run). Needs root",
    ),
    entry::<HostLoss>(
        "host-loss",
        "A host running a rank is lost mid-run (agent and ranks SIGKILLed, links down): the \
         job resumes on a spare from its latest complete checkpoint, loses at most one \
         checkpoint interval, and ends with the fault-free digest. Needs root",
    ),
    entry::<Drain>(
        "drain",
        "A host running a rank is drained mid-run: the job halts at a checkpoint and moves to \
         a spare with 0 lost steps and the fault-free digest. Needs root",
    ),
    entry::<TorchHostLoss>(
        "torch-host-loss",
        "The host-loss scenario with an unmodified PyTorch DDP job (gloo, \
         python/examples/torch_ddp.py) instead of ringtrain: resumed on a spare from the latest \
         complete checkpoint, at most one interval lost, the fault-free digest. Needs root and \
         python3-torch",
    ),
    entry::<TorchDrain>(
        "torch-drain",
        "The drain scenario with the PyTorch DDP job: it halts at an ordered checkpoint and \
         moves to a spare with 0 lost steps and the fault-free digest. Needs root and \
         python3-torch",
    ),
    entry::<BadPlaybooks>(
        "bad-playbooks",
        "The shipped playbook library is applied to a 3-supervisor cluster, then every \
         invalid playbook of `playbooks/tests/bad/` through the CLI and the API: each refused \
         with its file:line:column and message, the stored playbooks unchanged",
    ),
    entry::<PlaybookLeaderKill>(
        "playbook-leader-kill",
        "NIC flap storms open `nic_flapping` incidents whose shipped playbook (migrate off, \
         wait until reusable, fail back) runs while the leader is SIGKILLed at a random moment \
         of every wave: every playbook must complete and no agent may execute an order twice \
         (checked against the agents' execution journals). Needs root",
    ),
    entry::<PauseLeader>(
        "pause-leader",
        "The leader SIGSTOPped (10 s by default) and resumed, believing it still leads: \
         admin writes and linearizable reads on loopback (no acknowledged write lost, \
         linearizable), then NIC flap storms with playbook orders in a netns cluster (every \
         playbook completes, no order executed twice). Needs root",
    ),
    entry::<DiskFaults>(
        "disk-faults",
        "Each supervisor on its own small ext4 disk: the leader's disk, then a follower's, \
         fills, turns read-only (an ext4 error) and stalls (frozen) under admin writes and \
         linearizable reads; the member stops on a failed write and catches up once repaired \
         and restarted, survives a stall, no acknowledged write is lost and the history is \
         linearizable. Then two hosts' clocks step by ±1 s and back in a netns cluster: no \
         NIC, host or contention finding, and the clock solution follows. Needs root",
    ),
    entry::<Partitions>(
        "partitions",
        "The management network split around the leader once a wave (symmetric; asymmetric: \
         the others stop hearing it; the leader with two agents against the rest) while admin \
         clients on a host write and read, and NIC flap storms make playbooks order agents: \
         no acknowledged write lost, the history linearizable, no order executed twice, every \
         playbook completes. Needs root",
    ),
    entry::<ClusterCrash>(
        "cluster-crash",
        "The same load while all supervisors are SIGKILLed at once and restarted",
    ),
    entry::<TorchNicFlap>(
        "torch-nic-flap",
        "An unmodified PyTorch DDP job (gloo, python/examples/torch_ddp.py) under pulled cables \
         (3 s and 60 s by default): restarts, the final digest against a fault-free run's, and \
         each rank's longest step stall. Needs root and python3-torch",
    ),
    entry::<CutOffHost>(
        "cut-off-host",
        "ringtrain on four hosts and a spare; both data rails of h1 are cut (its agent and \
         management link alive) at offsets around a checkpoint, once per offset: h1 must be \
         cut off (its own incident, open until a rail returns), the job resumed on the spare \
         from its latest complete checkpoint (never on h1) within 3 s p99 without spending its \
         restart budget, and end with the fault-free digest. Needs root",
    ),
    entry::<NoCommonRail>(
        "no-common-rail",
        "ringtrain on four hosts and a spare; ring neighbours h1 and h2 lose different rails \
         (h1 rail0, h2 rail1; agents alive) at offsets around a checkpoint, once per offset: \
         each keeps a local backup but they share no working rail, so a path incident naming \
         both must open (and stay open until the cables return), the job resume from its \
         latest complete checkpoint with the two no longer in one job (a spare takes one) \
         within 3 s p99, 0 restarts spent (no crash loop), and end with the fault-free \
         digest. Needs root",
    ),
    entry::<AdminFailover>(
        "admin-failover",
        "ringtrain on three hosts; `railguard nic failover h1 rail0` must hold for the hold \
         period (60 s by default) through a leader SIGKILL and two pulls of rail0's cable (the \
         NIC recovers each time): no connection back on rail0 in any `qp list` sample, the NIC \
         shown held in `nic list`, training going on; then `nic failback` brings them home. \
         Needs root",
    ),
    entry::<GrayLink>(
        "gray-link",
        "ringtrain on four hosts; the fabric end of h1's rail0 drops a share of the packets it \
         sends (random; one round per --loss-pct), then stalls for random moments (one round \
         per --stall-ms), the link up throughout (netlink sees nothing): the probe mesh must \
         find rail0 Degraded, h1's connections must leave it, the job's step rate stay within \
         --max-slowdown-pct of the fault-free one, rail0 be Up again after the fault; no other \
         NIC Degraded or Down, no restart. Needs root",
    ),
    entry::<Security>(
        "security",
        "A mutual-TLS netns cluster attacked from a GPU host: strangers, wrong roles, an agent \
         for another host, the Raft port, a non-rank on the control socket — all refused, \
         nothing changed. Needs root",
    ),
];

/// `railguard-chaos bench <name>`: runs that measure and print figures.
const BENCHES: &[Entry] = &[
    entry::<Failover>(
        "failover",
        "Link down to first message delivered over the backup (p50/p99 over many flaps), \
         steady throughput of a resilient connection against plain TCP on the same veth, and \
         the throughput dip around a flap. Needs root",
    ),
    entry::<Detect>(
        "detect",
        "Time from a netlink link change to the agent seeing it and to the state being \
         committed; time from host loss to Down. Needs root",
    ),
    entry::<ClockSync>(
        "clock-sync",
        "Software clock sync against the truth: random test clock errors (±1 s, ±200 ppm) on \
         every agent; per-host error of railguard's network solution and of an NTP-style \
         estimator from the same probes, convergence time, probe CPU and bytes per agent. \
         Needs root",
    ),
    entry::<Goodput>(
        "goodput",
        "The same ringtrain job under the same flap storm (2.5 s flaps and, every 4th, a 35 s \
         outage), three times: with railguard's migration; without it, dying after 2 s without \
         a path; and NCCL-like, dying only after 30 s without a path. No baseline has a backup \
         rail; both restart from their checkpoint. Steps/s of each and railguard's ratio to \
         each baseline. Needs root",
    ),
    entry::<Reshaping>(
        "reshaping",
        "The contention setup with reshaping off, then on (fresh clusters): p99 OWD across \
         the uplink and each job's mean/p99 step time side by side. Needs root",
    ),
    entry::<TcpFailover>(
        "tcp-failover",
        "An unmodified iperf3 stream across pulled cables (h1's rail0, fabric side): the \
         longest time without progress around each pull (failover through the detour routes \
         and failback), p50/p99 over the pulls, throughput against a fault-free baseline, and \
         whether iperf3 kept its one connection. Needs root and iperf3",
    ),
    entry::<TorchGoodput>(
        "torch-goodput",
        "The PyTorch DDP example under one fault schedule (a flap storm, a 60 s outage, a NIC \
         lost for good), as a railguard job and as plain `torchrun --max-restarts 3` on one \
         rail, same checkpoint interval and timeout: useful steps/s of each, their ratio, \
         restarts, lost steps. Needs root and python3-torch",
    ),
    entry::<RaftCommit>(
        "raft-commit",
        "Committed events/s and latency of 3 supervisors at 1, 16 and 256 clients",
    ),
];

// ---- demo ----

#[derive(Args, Debug)]
struct Demo {
    /// Run the loopback drain demo instead (no root needed).
    #[arg(long)]
    drain: bool,
}

impl Runner for Demo {
    async fn run(self, _what: String) -> Outcome {
        if self.drain {
            let r = chaos_tests::demo::drain().await?;
            report(r.ok, &r)
        } else {
            let r = chaos_tests::demo::nic_flap().await?;
            report(r.ok, &r)
        }
    }
}

// ---- flags shared by several runs ----

#[derive(Args, Debug, Clone)]
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
        ensure!(
            (10..=3_600).contains(&self.deadline_secs),
            "--deadline-secs takes 10..=3600"
        );
        ensure!(quiet_secs <= 3_600, "--quiet-secs takes 0..=3600");
        Ok(chaos_tests::contention::ContentionOpts {
            hosts_per_leaf: self.hosts_per_leaf,
            uplink_mbit: self.uplink_mbit,
            steps: self.steps,
            hidden: self.hidden,
            quiet: Duration::from_secs(quiet_secs),
            reshaping: true,
            deadline: Duration::from_secs(self.deadline_secs),
        })
    }
}

// ---- scenarios ----

/// `leader-kill` (`History<false>`: the leader is killed every round) and
/// `cluster-crash` (`History<true>`: every supervisor at once): one flag
/// set, their defaults per scenario. The per-scenario defaults are strings
/// (`default_value`): `default_value_t` renders its default once into a
/// static that every instance of a generic struct would share.
#[derive(Args, Debug)]
struct History<const WHOLE_CLUSTER: bool> {
    #[arg(long, default_value = if WHOLE_CLUSTER { "3" } else { "20" })]
    rounds: usize,
    #[arg(long, default_value_t = 4)]
    hosts: usize,
    #[arg(long, default_value_t = 6)]
    clients: usize,
    /// Load time before each kill, in ms.
    #[arg(long, default_value_t = 1500)]
    load_ms: u64,
    #[arg(long, default_value = if WHOLE_CLUSTER { "11" } else { "7" })]
    seed: u64,
}

type LeaderKill = History<false>;
type ClusterCrash = History<true>;

impl<const WHOLE_CLUSTER: bool> Runner for History<WHOLE_CLUSTER> {
    async fn run(self, _what: String) -> Outcome {
        let r = chaos_tests::admin_history::run(chaos_tests::admin_history::HistoryRun {
            pause: None,
            rounds: self.rounds,
            hosts: self.hosts,
            clients: self.clients,
            whole_cluster: WHOLE_CLUSTER,
            load_per_round: Duration::from_millis(self.load_ms),
            seed: self.seed,
        })
        .await?;
        report(r.ok, &r)
    }
}

#[derive(Args, Debug)]
struct NicFlap {
    #[arg(long, default_value_t = 4)]
    hosts: usize,
    #[arg(long, default_value_t = 50)]
    flaps: usize,
    #[arg(long, default_value_t = 3)]
    seed: u64,
    /// Skip waiting for damping to release every NIC at the end.
    #[arg(long)]
    no_quiet: bool,
}

impl Runner for NicFlap {
    async fn run(self, what: String) -> Outcome {
        ensure!(
            (2..=50).contains(&self.hosts) && (1..=10_000).contains(&self.flaps),
            "--hosts takes 2..=50 and --flaps 1..=10000"
        );
        need_root(&what)?;
        let r = chaos_tests::nic_flap::run(chaos_tests::nic_flap::NicFlapRun {
            hosts: self.hosts,
            flaps: self.flaps,
            seed: self.seed,
            wait_quiet: !self.no_quiet,
        })
        .await?;
        report(r.ok, &r)
    }
}

#[derive(Args, Debug)]
struct AdminFailover {
    /// How long the failover must hold, in seconds.
    #[arg(long, default_value_t = 60)]
    hold_s: u64,
    /// How long each of the two cable pulls lasts, in ms.
    #[arg(long, default_value_t = 3000)]
    pull_ms: u64,
}

impl Runner for AdminFailover {
    async fn run(self, what: String) -> Outcome {
        ensure!(
            (4..=3600).contains(&self.hold_s) && (100..=60_000).contains(&self.pull_ms),
            "--hold-s takes 4..=3600 and --pull-ms 100..=60000"
        );
        ensure!(
            self.pull_ms < self.hold_s * 1000 / 5,
            "--pull-ms must be under a fifth of the hold (both pulls end inside it)"
        );
        need_root(&what)?;
        let r = chaos_tests::admin_failover::run(chaos_tests::admin_failover::AdminFailoverRun {
            hold: Duration::from_secs(self.hold_s),
            pull: Duration::from_millis(self.pull_ms),
        })
        .await?;
        report(r.ok, &r)
    }
}

#[derive(Args, Debug)]
struct GrayLink {
    /// Loss of each round, % of the packets the fabric sends to h1 on rail0
    /// (the flag alone: no loss rounds).
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "2,5,10,20")]
    loss_pct: Vec<f64>,
    /// Then one round per value: the fabric end of h1's rail0 stalls for
    /// up to this many ms at a time, dropping nothing (the flag alone: no
    /// stalls rounds).
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "2,4,8")]
    stall_ms: Vec<u64>,
    /// Mean time from one stall to the next, ms.
    #[arg(long, default_value_t = 20)]
    stall_every_ms: u64,
    /// Fault-free stretch before each round, in seconds.
    #[arg(long, default_value_t = 5)]
    baseline_s: u64,
    /// How long each round's fault lasts, in seconds.
    #[arg(long, default_value_t = 8)]
    fault_s: u64,
    /// Largest slowdown of the job's step rate allowed, %.
    #[arg(long, default_value_t = 10.0)]
    max_slowdown_pct: f64,
    /// Each rank sleeps this long after each step, as a GPU computes (0:
    /// the ranks compute on the CPU alone, back to back; they then fill
    /// both cores and the fault-free rate moves by ±10 % with the
    /// machine's load, as much as the goal).
    #[arg(long, default_value_t = 3)]
    step_delay_ms: u64,
    /// Run with the agents' loss and delay checks off (what the job
    /// suffers without them); ok when no NIC is found Degraded.
    #[arg(long)]
    no_detect: bool,
}

impl Runner for GrayLink {
    async fn run(self, what: String) -> Outcome {
        ensure!(
            (1..=20).contains(&(self.loss_pct.len() + self.stall_ms.len()))
                && self.loss_pct.iter().all(|p| (0.1..=50.0).contains(p))
                && self
                    .stall_ms
                    .iter()
                    .all(|ms| (1..self.stall_every_ms).contains(ms))
                && (2..=1_000).contains(&self.stall_every_ms),
            "--loss-pct (each 0.1..=50) and --stall-ms (each 1 ms up to --stall-every-ms, \
             2..=1000) take 1 to 20 rounds in all"
        );
        ensure!(
            (2..=600).contains(&self.baseline_s) && (2..=600).contains(&self.fault_s),
            "--baseline-s and --fault-s take 2..=600"
        );
        ensure!(
            (0.0..=100.0).contains(&self.max_slowdown_pct),
            "--max-slowdown-pct takes 0..=100"
        );
        ensure!(self.step_delay_ms <= 1000, "--step-delay-ms takes 0..=1000");
        need_root(&what)?;
        use chaos_tests::gray_link::GrayFault;
        let every = Duration::from_millis(self.stall_every_ms);
        let faults = (self.loss_pct.into_iter().map(GrayFault::Loss))
            .chain(self.stall_ms.into_iter().map(|ms| {
                GrayFault::Stalls(testbed::stalls::StallSpec {
                    max_stall: Duration::from_millis(ms),
                    every,
                })
            }))
            .collect();
        let r = chaos_tests::gray_link::run(chaos_tests::gray_link::GrayLinkRun {
            faults,
            baseline: Duration::from_secs(self.baseline_s),
            fault: Duration::from_secs(self.fault_s),
            max_slowdown_pct: self.max_slowdown_pct,
            step_delay: Duration::from_millis(self.step_delay_ms),
            detect: !self.no_detect,
        })
        .await?;
        report(r.ok, &r)
    }
}

#[derive(Args, Debug)]
struct Security {}

impl Runner for Security {
    async fn run(self, what: String) -> Outcome {
        need_root(&what)?;
        let r = chaos_tests::security::run().await?;
        report(r.ok, &r)
    }
}

#[derive(Args, Debug)]
struct QpMigrate {
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
}

impl Runner for QpMigrate {
    async fn run(self, what: String) -> Outcome {
        ensure!(
            (1..=10_000).contains(&self.flaps) && (1..=64).contains(&self.conns),
            "--flaps takes 1..=10000 and --conns 1..=64"
        );
        ensure!(
            (16..=(64 << 20)).contains(&self.max_message) && self.outage_ms <= 25_000,
            "--max-message takes 16..=67108864 and --outage-ms at most 25000 (under the 30 s stall timeout)"
        );
        need_root(&what)?;
        let r = chaos_tests::qp::qp_migrate(chaos_tests::qp::QpMigrateRun {
            flaps: self.flaps,
            conns: self.conns,
            max_message: self.max_message,
            seed: self.seed,
            outage: Duration::from_millis(self.outage_ms),
        })
        .await?;
        report(r.ok, &r)
    }
}

#[derive(Args, Debug)]
struct MgmtPartition {
    #[arg(long, default_value_t = 4)]
    hosts: usize,
    /// How long the link stays cut (s).
    #[arg(long, default_value_t = 10.0)]
    cut_secs: f64,
    #[arg(long, default_value_t = 21)]
    seed: u64,
}

impl Runner for MgmtPartition {
    async fn run(self, what: String) -> Outcome {
        ensure!(
            (0.5..=120.0).contains(&self.cut_secs),
            "--cut-secs takes 0.5..=120"
        );
        need_root(&what)?;
        let r = chaos_tests::probe_scenarios::mgmt_partition(
            chaos_tests::probe_scenarios::MgmtPartitionRun {
                hosts: self.hosts,
                cut: Duration::from_secs_f64(self.cut_secs),
                seed: self.seed,
            },
        )
        .await?;
        report(r.ok, &r)
    }
}

#[derive(Args, Debug)]
struct Contention {
    #[command(flatten)]
    args: ContentionArgs,
    /// Length of the quiet run before the load (s).
    #[arg(long, default_value_t = 300)]
    quiet_secs: u64,
}

impl Runner for Contention {
    async fn run(self, what: String) -> Outcome {
        let o = self.args.opts(self.quiet_secs)?;
        need_root(&what)?;
        value_report(chaos_tests::contention::scenario(&o).await?)
    }
}

#[derive(Args, Debug)]
struct ProbeBlackhole {
    #[arg(long, default_value_t = 4)]
    hosts: usize,
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// How long each blackhole lasts (s).
    #[arg(long, default_value_t = 2.0)]
    hold_secs: f64,
    #[arg(long, default_value_t = 31)]
    seed: u64,
}

impl Runner for ProbeBlackhole {
    async fn run(self, what: String) -> Outcome {
        ensure!(
            (0.1..=60.0).contains(&self.hold_secs),
            "--hold-secs takes 0.1..=60"
        );
        need_root(&what)?;
        let r = chaos_tests::probe_scenarios::probe_blackhole(
            chaos_tests::probe_scenarios::BlackholeRun {
                hosts: self.hosts,
                rounds: self.rounds,
                hold: Duration::from_secs_f64(self.hold_secs),
                seed: self.seed,
            },
        )
        .await?;
        report(r.ok, &r)
    }
}

#[derive(Args, Debug)]
struct BadPlaybooks {}

impl Runner for BadPlaybooks {
    async fn run(self, _what: String) -> Outcome {
        let r = chaos_tests::playbook_scenarios::bad_playbooks().await?;
        report(r.ok, &r)
    }
}

#[derive(Args, Debug)]
struct PlaybookLeaderKill {
    /// Playbooks to complete (one nic_flapping incident each).
    #[arg(long, default_value_t = 50)]
    rounds: usize,
    /// Incidents per wave (hosts flapping at once), 1..=4.
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

impl Runner for PlaybookLeaderKill {
    async fn run(self, what: String) -> Outcome {
        need_root(&what)?;
        let r = chaos_tests::playbook_leader_kill::playbook_leader_kill(
            chaos_tests::playbook_leader_kill::LeaderKillRun {
                rounds: self.rounds,
                parallel: self.parallel,
                seed: self.seed,
                ..Default::default()
            },
        )
        .await?;
        report(r.ok, &r)
    }
}

#[derive(Args, Debug)]
struct Partitions {
    /// Partitions, one per wave of four flap storms (their playbooks order
    /// agents); the kind cycles symmetric, asymmetric, leader with its
    /// agents.
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    /// How long each partition lasts, in seconds.
    #[arg(long, default_value_t = 5)]
    hold_s: u64,
    /// Admin clients writing and reading throughout.
    #[arg(long, default_value_t = 6)]
    clients: usize,
    #[arg(long, default_value_t = 9)]
    seed: u64,
}

impl Runner for Partitions {
    async fn run(self, what: String) -> Outcome {
        need_root(&what)?;
        let r = chaos_tests::partitions::partitions(chaos_tests::partitions::PartitionsRun {
            rounds: self.rounds,
            hold: Duration::from_secs(self.hold_s),
            clients: self.clients,
            seed: self.seed,
        })
        .await?;
        report(r.ok, &r)
    }
}

#[derive(Args, Debug)]
struct PauseLeader {
    /// Pauses in the admin-history part.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Flap waves (four playbooks and one pause each) in the playbook part.
    #[arg(long, default_value_t = 3)]
    waves: usize,
    /// How long each pause lasts, in seconds.
    #[arg(long, default_value_t = 10.0)]
    pause_s: f64,
    #[arg(long, default_value_t = 5)]
    seed: u64,
}

impl Runner for PauseLeader {
    async fn run(self, what: String) -> Outcome {
        need_root(&what)?;
        ensure!(
            self.pause_s.is_finite() && (1.0..=60.0).contains(&self.pause_s),
            "--pause-s takes 1..=60 (shorter pauses end before another leader is elected)"
        );
        let r =
            chaos_tests::pause_leader::pause_leader(chaos_tests::pause_leader::PauseLeaderRun {
                rounds: self.rounds,
                waves: self.waves,
                pause: Duration::from_secs_f64(self.pause_s),
                seed: self.seed,
            })
            .await?;
        report(r.ok, &r)
    }
}

// ---- benches ----

#[derive(Args, Debug)]
struct Failover {
    #[arg(long, default_value_t = 100)]
    flaps: usize,
    /// Seconds of each steady-throughput run.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    #[arg(long, default_value_t = 13)]
    seed: u64,
}

impl Runner for Failover {
    async fn run(self, what: String) -> Outcome {
        ensure!(
            (1..=10_000).contains(&self.flaps) && (0.5..=120.0).contains(&self.seconds),
            "--flaps takes 1..=10000 and --seconds 0.5..=120"
        );
        need_root(&what)?;
        let r = chaos_tests::qp::failover(chaos_tests::qp::FailoverRun {
            flaps: self.flaps,
            seed: self.seed,
            throughput_secs: self.seconds,
        })
        .await?;
        report(r.ok, &r)
    }
}

#[derive(Args, Debug)]
struct Detect {
    #[arg(long, default_value_t = 200)]
    flaps: usize,
    #[arg(long, default_value_t = 10)]
    host_losses: usize,
    #[arg(long, default_value_t = 9)]
    seed: u64,
}

impl Runner for Detect {
    async fn run(self, what: String) -> Outcome {
        ensure!(
            (1..=100_000).contains(&self.flaps) && self.host_losses <= 1000,
            "--flaps takes 1..=100000 and --host-losses at most 1000"
        );
        need_root(&what)?;
        let r = chaos_tests::detect::run(self.flaps, self.host_losses, self.seed).await?;
        report(r.ok, &r)
    }
}

#[derive(Args, Debug)]
struct ClockSync {
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
}

impl Runner for ClockSync {
    async fn run(self, what: String) -> Outcome {
        ensure!(
            (1..=3600).contains(&self.seconds) && (1..=5).contains(&self.supervisors),
            "--seconds takes 1..=3600 and --supervisors 1..=5"
        );
        ensure!(
            self.uplink_load_mbit <= 10_000 && self.cross_load_mbit <= 10_000,
            "--uplink-load-mbit and --cross-load-mbit take 0 (off) or 1..=10000"
        );
        ensure!(
            (0.05..=1.2).contains(&self.cross_load_util),
            "--cross-load-util takes 0.05..=1.2"
        );
        need_root(&what)?;
        let r = chaos_tests::clock_sync::run(chaos_tests::clock_sync::ClockSyncRun {
            hosts: self.hosts,
            supervisors: self.supervisors,
            seconds: self.seconds,
            seed: self.seed,
            converge_timeout: Duration::from_secs(60),
            uplink_load_mbit: self.uplink_load_mbit,
            cross_load_mbit: self.cross_load_mbit,
            cross_load_util: self.cross_load_util,
            probe_cpu_budget_pct: self.probe_cpu_budget_pct,
            probe_rate: self.probe_rate,
            pin_agents_cpu: self.pin_agents_cpu,
        })
        .await?;
        report(r.ok, &r)
    }
}

#[derive(Args, Debug)]
struct Reshaping {
    #[command(flatten)]
    args: ContentionArgs,
}

impl Runner for Reshaping {
    async fn run(self, what: String) -> Outcome {
        let o = self.args.opts(0)?;
        need_root(&what)?;
        value_report(chaos_tests::contention::bench(&o).await?)
    }
}

#[derive(Args, Debug)]
struct RaftCommit {
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
    /// Measure what mutual TLS costs: the levels on a plain-text cluster,
    /// then on a mutual-TLS one, side by side (otherwise mutual TLS only,
    /// as a cluster runs).
    #[arg(long, conflicts_with = "peer")]
    tls: bool,
    /// Compare with another system under the same load: `etcd` starts
    /// three etcd members (Debian's etcd-server, mutual TLS) beside
    /// railguard's cluster.
    #[arg(long, value_enum)]
    peer: Option<Peer>,
}

/// Systems `bench raft-commit --peer` compares with.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Peer {
    Etcd,
}

impl Runner for RaftCommit {
    async fn run(self, _what: String) -> Outcome {
        ensure!((1..=50).contains(&self.trials), "--trials takes 1..=50");
        ensure!(
            !self.clients.is_empty() && self.clients.iter().all(|c| (1..=1024).contains(c)),
            "--clients takes counts between 1 and 1024"
        );
        ensure!(
            (0.5..=600.0).contains(&self.seconds),
            "--seconds must be between 0.5 and 600"
        );
        if let Some(Peer::Etcd) = self.peer {
            let r =
                chaos_tests::bench::raft_commit_vs_etcd(&self.clients, self.seconds, self.trials)
                    .await?;
            return report(r.ok, &r);
        }
        if self.tls {
            let r =
                chaos_tests::bench::raft_commit_tls_cost(&self.clients, self.seconds, self.trials)
                    .await?;
            return report(r.ok, &r);
        }
        let r =
            chaos_tests::bench::raft_commit(&self.clients, self.seconds, self.trials, true).await?;
        report(r.ok, &r)
    }
}

// ---- the command line and the dispatcher ----

/// A group of subcommands (`scenario`, `bench`) made from a table.
fn group(name: &'static str, about: &'static str, table: &[Entry]) -> Command {
    table.iter().fold(
        Command::new(name)
            .about(about)
            .subcommand_required(true)
            .arg_required_else_help(true),
        |cmd, e| cmd.subcommand(leaf(e)),
    )
}

/// The subcommand of one table row.
fn leaf(e: &Entry) -> Command {
    (e.args)(Command::new(e.name))
        .about(e.help)
        .long_about(None)
}

/// The whole command line.
fn cli() -> Command {
    // Named like the derive named it (the package), so `--version` reads as before.
    Command::new(env!("CARGO_PKG_NAME"))
        .version(env!("CARGO_PKG_VERSION"))
        .about(env!("CARGO_PKG_DESCRIPTION"))
        .long_about(None)
        .subcommand_required(true)
        .arg_required_else_help(true)
        .subcommand(leaf(&DEMO))
        .subcommand(leaf(&FUZZ))
        .subcommand(group(
            "scenario",
            "Run a scenario and check its invariants",
            SCENARIOS,
        ))
        .subcommand(group("bench", "Measure and print figures", BENCHES))
}

/// The row the parsed command line names, with the name `require_root`
/// reports (`scenario nic-flap`) and its own matches.
fn chosen(m: &ArgMatches) -> anyhow::Result<(&'static Entry, String, &ArgMatches)> {
    let Some((top, sub)) = m.subcommand() else {
        bail!("no subcommand");
    };
    for e in [&DEMO, &FUZZ] {
        if top == e.name {
            return Ok((e, top.to_string(), sub));
        }
    }
    let table = match top {
        "scenario" => SCENARIOS,
        "bench" => BENCHES,
        other => bail!("unknown subcommand {other}"),
    };
    let Some((name, leaf_m)) = sub.subcommand() else {
        bail!("no {top} named");
    };
    let Some(e) = table.iter().find(|e| e.name == name) else {
        bail!("unknown {top} {name}");
    };
    Ok((e, format!("{top} {name}"), leaf_m))
}

fn finish<T: Serialize>(ok: bool, report: &T) -> ! {
    match serde_json::to_string(report) {
        Ok(line) => println!("{line}"),
        Err(e) => println!("{{\"ok\":false,\"error\":{:?}}}", e.to_string()),
    }
    std::process::exit(if ok { 0 } else { 1 });
}

fn main() {
    let matches = cli().get_matches();
    telemetry::init(telemetry::LogFormat::Text, "warn");
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let result: Outcome = rt.block_on(async {
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
        let (e, what, m) = chosen(&matches)?;
        (e.run)(m, what)?.await
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `railguard-chaos scenario X` / `bench X` / `demo` the README
    /// and the docs show is a row of the tables (and parses with no flags),
    /// and together they show every scenario.
    #[test]
    fn the_tables_hold_every_command_the_readme_mentions() {
        let docs = [
            include_str!("../../../../README.md"),
            include_str!("../../../../docs/benchmarks.md"),
            include_str!("../../../../docs/references.md"),
            include_str!("../../../../docs/status.md"),
            include_str!("../../../../docs/testbed.md"),
        ];
        let mut seen = 0;
        let mut named = std::collections::BTreeSet::new();
        for (doc, i) in docs.iter().flat_map(|d| {
            d.match_indices("railguard-chaos ")
                .map(move |(i, _)| (d, i))
        }) {
            let words: Vec<&str> = doc[i + "railguard-chaos ".len()..]
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .take(2)
                .collect();
            let table = match words.first().copied() {
                Some("scenario") => SCENARIOS,
                Some("bench") => BENCHES,
                Some("demo") | Some("fuzz") => {
                    seen += 1;
                    continue;
                }
                _ => continue,
            };
            let name = words.get(1).copied().unwrap_or_default();
            assert!(
                table.iter().any(|e| e.name == name),
                "README mentions `railguard-chaos {} {name}`, which is not in the table",
                words[0]
            );
            cli()
                .try_get_matches_from(["railguard-chaos", words[0], name])
                .unwrap_or_else(|e| panic!("{} {name}: {e}", words[0]));
            seen += 1;
            if words[0] == "scenario" {
                named.insert(name);
            }
        }
        assert!(seen >= SCENARIOS.len(), "the docs name {seen} commands");
        let missing: Vec<_> = SCENARIOS
            .iter()
            .map(|e| e.name)
            .filter(|n| !named.contains(n))
            .collect();
        assert!(missing.is_empty(), "no doc shows scenarios {missing:?}");
    }

    /// Rows that share a generic flag struct keep their own defaults.
    #[test]
    fn rows_of_one_generic_struct_keep_their_own_defaults() {
        for (name, rounds, seed) in [("leader-kill", 20usize, 7u64), ("cluster-crash", 3, 11)] {
            let m = cli()
                .try_get_matches_from(["railguard-chaos", "scenario", name])
                .unwrap();
            let (_, _, leaf) = chosen(&m).unwrap();
            assert_eq!(
                (leaf.get_one::<usize>("rounds"), leaf.get_one::<u64>("seed")),
                (Some(&rounds), Some(&seed)),
                "{name}"
            );
        }
    }

    /// Names are unique within a table, and every row builds a valid
    /// subcommand (clap's own consistency checks).
    #[test]
    fn the_command_line_is_consistent() {
        for table in [SCENARIOS, BENCHES] {
            let mut names: Vec<_> = table.iter().map(|e| e.name).collect();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), table.len());
        }
        cli().debug_assert();
    }
}
