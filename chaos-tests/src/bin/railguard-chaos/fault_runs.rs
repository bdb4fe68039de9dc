//! Runners of the fault scenarios that grew beside the first ones.

use std::time::Duration;

use anyhow::ensure;
use clap::Args;

use crate::runner::{need_root, report, Outcome, Runner};

#[derive(Args, Debug)]
pub(crate) struct DiskFaults {
    /// How long a stalled disk stays frozen, in seconds.
    #[arg(long, default_value_t = 5.0)]
    stall_s: f64,
    /// Concurrent admin clients writing and reading throughout.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Seconds of load before each fault and after the last.
    #[arg(long, default_value_t = 2.0)]
    settle_s: f64,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Size of the clock steps of the clock part, in ms.
    #[arg(long, default_value_t = 1000)]
    clock_step_ms: u64,
    /// Seconds between two clock steps (four steps).
    #[arg(long, default_value_t = 10)]
    clock_gap_s: u64,
    /// Leave out the clock part (the disks only).
    #[arg(long)]
    no_clock: bool,
}

impl Runner for DiskFaults {
    async fn run(self, what: String) -> Outcome {
        need_root(&what)?;
        ensure!(
            self.stall_s.is_finite() && (1.0..=60.0).contains(&self.stall_s),
            "--stall-s takes 1..=60"
        );
        ensure!(
            self.settle_s.is_finite() && (0.5..=60.0).contains(&self.settle_s),
            "--settle-s takes 0.5..=60"
        );
        let r = chaos_tests::disk_faults::disk_faults(chaos_tests::disk_faults::DiskFaultsRun {
            stall: Duration::from_secs_f64(self.stall_s),
            clients: self.clients,
            seed: self.seed,
            settle: Duration::from_secs_f64(self.settle_s),
            clock_step: (!self.no_clock).then(|| Duration::from_millis(self.clock_step_ms)),
            clock_gap: Duration::from_secs(self.clock_gap_s),
        })
        .await?;
        report(r.ok, &r)
    }
}

#[derive(Args, Debug)]
pub(crate) struct Fuzz {
    /// How many seeds to run.
    #[arg(long, default_value_t = 1000)]
    seeds: u64,
    /// The first seed (a failing seed replays with `--first S --seeds 1`).
    #[arg(long, default_value_t = 0)]
    first: u64,
    /// Threads running seeds side by side.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Scheduled actions per seed.
    #[arg(long, default_value_t = 150)]
    steps: usize,
}

impl Runner for Fuzz {
    async fn run(self, _what: String) -> Outcome {
        ensure!(
            (1..=1_000_000).contains(&self.seeds),
            "--seeds takes 1..=1000000"
        );
        ensure!((1..=64).contains(&self.threads), "--threads takes 1..=64");
        ensure!(
            (1..=10_000).contains(&self.steps),
            "--steps takes 1..=10000"
        );
        let opts = chaos_tests::sim::SimOptions {
            nodes: 3,
            steps: self.steps,
            amnesia: false,
        };
        let (first, seeds, threads) = (self.first, self.seeds, self.threads);
        let r = tokio::task::spawn_blocking(move || {
            chaos_tests::sim::fuzz(first, seeds, threads, opts)
        })
        .await?;
        report(r.ok, &r)
    }
}
