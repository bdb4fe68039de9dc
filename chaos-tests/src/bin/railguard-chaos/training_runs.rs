//! The training and TCP runs of `railguard-chaos`: ringtrain and the
//! PyTorch example under flap storms, host loss and drain, the goodput
//! benches, and iperf3 across pulled cables.

use std::time::Duration;

use anyhow::{bail, ensure};
use clap::Args;

use crate::runner::{need_root, report, value_report, Outcome, Runner};

/// The training job of the ringtrain scenarios.
#[derive(Args, Debug, Clone)]
struct TrainArgs {
    /// Hosts in the testbed (ranks plus spares); default: ranks + 1.
    #[arg(long)]
    hosts: Option<usize>,
    #[arg(long, default_value_t = 4)]
    ranks: u32,
    /// Ranks on each host (torchrun's --nproc-per-node); must divide
    /// --ranks.
    #[arg(long, default_value_t = 1)]
    ranks_per_host: u32,
    #[arg(long, default_value_t = 300)]
    steps: u64,
    #[arg(long, default_value_t = 50)]
    checkpoint_every: u64,
    /// The model's hidden width (default: the program's own; ringtrain's
    /// is ~4.5 MB of gradients).
    #[arg(long)]
    hidden: Option<u32>,
    /// PyTorch scenarios: sleep after each step (ms), so faults land
    /// mid-run.
    #[arg(long, default_value_t = 20)]
    step_delay_ms: u64,
    #[arg(long, default_value_t = 1)]
    supervisors: usize,
    /// Longest the job may take (s).
    #[arg(long, default_value_t = 600)]
    deadline_secs: u64,
}

impl TrainArgs {
    fn opts(&self, spare: bool, torch: bool) -> anyhow::Result<chaos_tests::training::TrainOpts> {
        ensure!(
            (1..=16).contains(&self.ranks)
                && (1..=self.ranks).contains(&self.ranks_per_host)
                && self.ranks.is_multiple_of(self.ranks_per_host),
            "--ranks takes 1..=16 and --ranks-per-host a divisor of it"
        );
        let needed = (self.ranks / self.ranks_per_host) as usize;
        let hosts = self.hosts.unwrap_or(needed + usize::from(spare));
        ensure!(
            (needed..=32).contains(&hosts),
            "--hosts takes ranks/ranks-per-host..=32"
        );
        ensure!(
            (1..=100_000).contains(&self.steps) && self.checkpoint_every <= self.steps,
            "--steps takes 1..=100000 and --checkpoint-every at most --steps"
        );
        ensure!(
            (1..=7).contains(&self.supervisors) && (1..=7200).contains(&self.deadline_secs),
            "--supervisors takes 1..=7 and --deadline-secs 1..=7200"
        );
        ensure!(self.step_delay_ms <= 1000, "--step-delay-ms takes 0..=1000");
        Ok(chaos_tests::training::TrainOpts {
            workload: if torch {
                chaos_tests::training::Workload::Torch {
                    step_delay_ms: self.step_delay_ms,
                }
            } else {
                chaos_tests::training::Workload::Ringtrain
            },
            hosts,
            supervisors: self.supervisors,
            ranks: self.ranks,
            ranks_per_host: self.ranks_per_host,
            steps: self.steps,
            checkpoint_every: self.checkpoint_every,
            hidden: self.hidden,
            deadline: Duration::from_secs(self.deadline_secs),
            ..Default::default()
        })
    }
}

/// The flap storm of the training scenarios.
#[derive(Args, Debug, Clone)]
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
        ensure!(
            (100..=600_000).contains(&self.flap_every_ms)
                && (10..=20_000).contains(&self.flap_down_ms),
            "--flap-every-ms takes 100..=600000 and --flap-down-ms 10..=20000"
        );
        Ok(chaos_tests::training::Storm::short(
            Duration::from_millis(self.flap_every_ms),
            Duration::from_millis(self.flap_down_ms),
            self.seed,
        ))
    }
}

/// `scenario train-nic-flap`: the job must ride out the storm.
#[derive(Args, Debug)]
pub(crate) struct TrainNicFlap {
    #[command(flatten)]
    train: TrainArgs,
    #[command(flatten)]
    storm: StormArgs,
}

impl Runner for TrainNicFlap {
    async fn run(self, what: String) -> Outcome {
        let (o, st) = (self.train.opts(false, false)?, self.storm.storm()?);
        need_root(&what)?;
        value_report(chaos_tests::training::train_nic_flap(&o, st).await?)
    }
}

/// `bench goodput`: railguard's job and two baselines under one storm of
/// short flaps and outages longer than NCCL's retries.
#[derive(Args, Debug)]
pub(crate) struct Goodput {
    #[command(flatten)]
    train: TrainArgs,
    #[command(flatten)]
    storm: StormArgs,
    /// Every this many flaps, one is a long outage (0: none).
    #[arg(long, default_value_t = 4)]
    long_flap_every: u32,
    /// How long a long outage lasts (ms): by default longer than the
    /// NCCL-like baseline's stall timeout, so it is fatal to it.
    #[arg(long, default_value_t = 35_000)]
    long_flap_down_ms: u64,
    /// The NCCL-like baseline's stall timeout (ms): how long it waits for
    /// a path to come back before the rank dies (NCCL's socket transport
    /// retries for about 30 s).
    #[arg(long, default_value_t = 30_000)]
    nccl_like_timeout_ms: u64,
}

impl Runner for Goodput {
    async fn run(self, what: String) -> Outcome {
        let (o, mut st) = (self.train.opts(false, false)?, self.storm.storm()?);
        ensure!(
            self.long_flap_every <= 1000
                && (self.long_flap_every == 0
                    || (self.storm.flap_down_ms < self.long_flap_down_ms
                        && self.long_flap_down_ms <= 600_000)),
            "--long-flap-every takes 0..=1000; --long-flap-down-ms must exceed --flap-down-ms and be at most 600000"
        );
        ensure!(
            (100..=600_000).contains(&self.nccl_like_timeout_ms),
            "--nccl-like-timeout-ms takes 100..=600000"
        );
        st.long_every = self.long_flap_every;
        st.long_down = Duration::from_millis(self.long_flap_down_ms);
        need_root(&what)?;
        value_report(
            chaos_tests::training::goodput(
                &o,
                st,
                Duration::from_millis(self.nccl_like_timeout_ms),
            )
            .await?,
        )
    }
}

/// `host-loss` and `drain` (`AtStep<false|true, _>`): a host running a
/// rank is lost or drained mid-run; `torch-` runs the PyTorch example
/// (`AtStep<_, true>`) instead of ringtrain.
#[derive(Args, Debug)]
pub(crate) struct AtStep<const DRAIN: bool, const TORCH: bool> {
    #[command(flatten)]
    train: TrainArgs,
    /// Lose (host-loss) or drain (drain) the host once the job reached
    /// this step.
    #[arg(long, default_value_t = 120)]
    at_step: u64,
}

/// `cut-off-host` (both data rails of a rank's host) and `no-common-rail`
/// (different rails of two ring neighbours): cables cut around a
/// checkpoint, once per offset.
#[derive(Args, Debug)]
pub(crate) struct RailCuts<const PATH: bool> {
    #[command(flatten)]
    train: TrainArgs,
    /// Cut this many steps after the second checkpoint (negative: before
    /// it), one run each.
    #[arg(
        long,
        value_delimiter = ',',
        allow_hyphen_values = true,
        default_value = "-10,-3,0,3,10"
    )]
    offsets: Vec<i64>,
    /// How long the cables stay cut (ms).
    #[arg(long, default_value_t = 60_000)]
    cut_ms: u64,
    /// Cut silently: detach the cables from their rail bridges (links stay
    /// up, netlink sees nothing; the probe mesh and the ranks' stalled
    /// connections must tell).
    #[arg(long)]
    silent: bool,
}

pub(crate) type CutOffHost = RailCuts<false>;
pub(crate) type NoCommonRail = RailCuts<true>;

impl<const PATH: bool> Runner for RailCuts<PATH> {
    async fn run(self, what: String) -> Outcome {
        let mut o = self.train.opts(true, false)?;
        o.ringtrain_step_delay_ms = self.train.step_delay_ms;
        ensure!(
            (1..=20).contains(&self.offsets.len()),
            "--offsets takes 1..=20 offsets"
        );
        ensure!(
            self.offsets
                .iter()
                .all(|x| (1..o.steps as i64).contains(&(2 * o.checkpoint_every as i64 + x))),
            "each offset must cut within the run (after step 0, before --steps), counted from the second checkpoint"
        );
        ensure!(
            (1000..=600_000).contains(&self.cut_ms),
            "--cut-ms takes 1000..=600000"
        );
        ensure!(
            o.rank_hosts().len() >= 3 && o.hosts > o.rank_hosts().len(),
            "the ranks must fill at least 3 hosts (h1 and h2 run ranks) and --hosts leave a spare"
        );
        need_root(&what)?;
        use chaos_tests::rail_cuts::{run, Cut, RailCutRun};
        let r = run(RailCutRun {
            cut_kind: if PATH { Cut::NoCommonRail } else { Cut::Host },
            train: o,
            offsets: self.offsets,
            cut: Duration::from_millis(self.cut_ms),
            silent: self.silent,
        })
        .await?;
        report(r.ok, &r)
    }
}

pub(crate) type HostLoss = AtStep<false, false>;
pub(crate) type Drain = AtStep<true, false>;
pub(crate) type TorchHostLoss = AtStep<false, true>;
pub(crate) type TorchDrain = AtStep<true, true>;

impl<const DRAIN: bool, const TORCH: bool> Runner for AtStep<DRAIN, TORCH> {
    async fn run(self, what: String) -> Outcome {
        let o = self.train.opts(true, TORCH)?;
        ensure!(
            (1..o.steps).contains(&self.at_step),
            "--at-step must be within 1..steps"
        );
        need_root(&what)?;
        value_report(if DRAIN {
            chaos_tests::training::drain(&o, self.at_step).await?
        } else {
            chaos_tests::training::host_loss(&o, self.at_step).await?
        })
    }
}

#[derive(Args, Debug)]
pub(crate) struct TorchNicFlap {
    #[arg(long, default_value_t = 4)]
    hosts: usize,
    #[arg(long, default_value_t = 1)]
    supervisors: usize,
    /// Steps of the job (enough to train through every outage).
    #[arg(long, default_value_t = 4000)]
    steps: u64,
    /// Sleep after each step (ms).
    #[arg(long, default_value_t = 20)]
    step_delay_ms: u64,
    /// The outages in order, in ms, comma-separated; the last may be
    /// `forever` (the cable is never put back).
    #[arg(long, value_delimiter = ',', default_value = "3000,60000,forever")]
    outages_ms: Vec<String>,
    /// What users get today: the same job as plain processes on one rail
    /// of a testbed with no railguard, one fresh job per outage.
    #[arg(long)]
    without_railguard: bool,
}

impl Runner for TorchNicFlap {
    async fn run(self, what: String) -> Outcome {
        let mut outages = Vec::new();
        for o in &self.outages_ms {
            outages.push(match o.as_str() {
                "forever" => None,
                ms => match ms.parse::<u64>() {
                    Ok(ms) if (100..=600_000).contains(&ms) => Some(Duration::from_millis(ms)),
                    _ => bail!("--outages-ms: {ms:?} is neither 100..=600000 nor `forever`"),
                },
            });
        }
        ensure!(
            (2..=16).contains(&self.hosts)
                && (1..=7).contains(&self.supervisors)
                && (20..=100_000).contains(&self.steps)
                && self.step_delay_ms <= 1000
                && outages.len() <= 20
                && outages.iter().rev().skip(1).all(Option::is_some),
            "--hosts takes 2..=16, --supervisors 1..=7, --steps 20..=100000, \
             --step-delay-ms 0..=1000, --outages-ms at most 20 values, only the last `forever`"
        );
        need_root(&what)?;
        if self.without_railguard {
            let r = chaos_tests::torch_baseline::run(chaos_tests::torch_baseline::BaselineRun {
                hosts: self.hosts,
                steps: self.steps,
                step_delay_ms: self.step_delay_ms,
                outages,
            })
            .await?;
            return report(r.ok, &r);
        }
        let total: Duration = outages.iter().flatten().sum();
        let r = chaos_tests::torch::run(chaos_tests::torch::TorchRun {
            hosts: self.hosts,
            supervisors: self.supervisors,
            steps: self.steps,
            step_delay_ms: self.step_delay_ms,
            outages,
            deadline: Duration::from_secs(600) + total * 2,
        })
        .await?;
        report(r.ok, &r)
    }
}

#[derive(Args, Debug)]
pub(crate) struct TorchGoodput {
    #[arg(long, default_value_t = 4)]
    hosts: usize,
    /// Steps of the job (enough to train through the whole schedule).
    #[arg(long, default_value_t = 6000)]
    steps: u64,
    /// Sleep after each step (ms).
    #[arg(long, default_value_t = 20)]
    step_delay_ms: u64,
    #[arg(long, default_value_t = 100)]
    checkpoint_every: u64,
    /// Length of the flap storm (s).
    #[arg(long, default_value_t = 40)]
    storm_secs: u64,
    /// Mean time between flaps in the storm (ms).
    #[arg(long, default_value_t = 4000)]
    flap_every_ms: u64,
    /// How long a flapped cable stays out (ms).
    #[arg(long, default_value_t = 2500)]
    flap_down_ms: u64,
    /// The long outage (s).
    #[arg(long, default_value_t = 60)]
    outage_secs: u64,
    #[arg(long, default_value_t = 41)]
    seed: u64,
    /// Longest either side may take (s).
    #[arg(long, default_value_t = 1200)]
    deadline_secs: u64,
}

impl Runner for TorchGoodput {
    async fn run(self, what: String) -> Outcome {
        ensure!(
            (3..=16).contains(&self.hosts)
                && (100..=100_000).contains(&self.steps)
                && self.step_delay_ms <= 1000
                && (1..=self.steps).contains(&self.checkpoint_every)
                && self.storm_secs <= 3600
                && (100..=600_000).contains(&self.flap_every_ms)
                && (10..=60_000).contains(&self.flap_down_ms)
                && (1..=3600).contains(&self.outage_secs)
                && (60..=7200).contains(&self.deadline_secs),
            "--hosts takes 3..=16, --steps 100..=100000, --step-delay-ms 0..=1000, \
             --checkpoint-every 1..=steps, --storm-secs 0..=3600, --flap-every-ms \
             100..=600000, --flap-down-ms 10..=60000, --outage-secs 1..=3600, \
             --deadline-secs 60..=7200"
        );
        need_root(&what)?;
        let r = chaos_tests::torch_goodput::run(chaos_tests::torch_goodput::GoodputRun {
            hosts: self.hosts,
            steps: self.steps,
            step_delay_ms: self.step_delay_ms,
            checkpoint_every: self.checkpoint_every,
            storm: Duration::from_secs(self.storm_secs),
            flap_every: Duration::from_millis(self.flap_every_ms),
            flap_down: Duration::from_millis(self.flap_down_ms),
            outage: Duration::from_secs(self.outage_secs),
            seed: self.seed,
            deadline: Duration::from_secs(self.deadline_secs),
        })
        .await?;
        report(r.ok, &r)
    }
}

#[derive(Args, Debug)]
pub(crate) struct TcpFailover {
    #[arg(long, default_value_t = 20)]
    pulls: usize,
    /// How long each cable stays out (ms).
    #[arg(long, default_value_t = 3000)]
    down_ms: u64,
    /// iperf3's sending rate (Mbit/s).
    #[arg(long, default_value_t = 200)]
    mbit: u32,
    #[arg(long, default_value_t = 3)]
    supervisors: usize,
    /// The fault-free stretch before the first pull, in seconds (its
    /// longest gap is reported: the machine's own noise).
    #[arg(long, default_value_t = 4)]
    baseline_s: u64,
    /// Keep the run directory (every process's log) and print where.
    #[arg(long)]
    keep_logs: bool,
    /// iperf3's TCP congestion control, whatever the machine's default
    /// (BBR without fq paces itself and stalls the sender now and then:
    /// docs/benchmarks.md)
    #[arg(long, default_value = "cubic")]
    congestion: String,
}

impl Runner for TcpFailover {
    async fn run(self, what: String) -> Outcome {
        ensure!(
            (1..=1000).contains(&self.pulls)
                && (100..=120_000).contains(&self.down_ms)
                && (1..=10_000).contains(&self.mbit)
                && (1..=7).contains(&self.supervisors)
                && (1..=3600).contains(&self.baseline_s),
            "--pulls takes 1..=1000, --down-ms 100..=120000, --mbit 1..=10000, --supervisors 1..=7, \
             --baseline-s 1..=3600"
        );
        need_root(&what)?;
        let r = chaos_tests::tcp_failover::run(chaos_tests::tcp_failover::TcpFailoverRun {
            pulls: self.pulls,
            down: Duration::from_millis(self.down_ms),
            mbit: self.mbit,
            supervisors: self.supervisors,
            baseline: Duration::from_secs(self.baseline_s),
            keep_logs: self.keep_logs,
            congestion: self.congestion,
        })
        .await?;
        report(r.ok, &r)
    }
}
