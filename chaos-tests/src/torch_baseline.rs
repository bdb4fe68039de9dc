//! `scenario torch-nic-flap --without-railguard`: what users get today. The
//! same PyTorch DDP example (gloo, `init_process_group(timeout=30s)`) runs
//! as plain processes on one rail of a testbed with no railguard at all,
//! and h1's rail0 cable is pulled once the job is a quarter through, one
//! fresh job per outage (a job that raised cannot take the next pull).
//!
//! Per pull: the longest time between two step ends of any rank (from the
//! script's `--step-log`; a rank that never stepped again counts until it
//! exited or was killed), how many ranks exited with an error and how many
//! printed gloo's `Timed out`, and whether the job finished.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde::Serialize;
use testbed::{rail_addr, Node, Side, Testbed, TestbedSpec};

use crate::training::install_python;

/// The scenario's settings (as for `torch-nic-flap`).
#[derive(Debug, Clone)]
pub struct BaselineRun {
    pub hosts: usize,
    pub steps: u64,
    pub step_delay_ms: u64,
    /// Each pull's outage (`None`: the cable stays out).
    pub outages: Vec<Option<Duration>>,
}

/// One pull's figures.
#[derive(Debug, Clone, Serialize)]
pub struct PullFigures {
    /// `null`: never put back.
    pub outage_ms: Option<u64>,
    /// The longest time between two step ends of any rank, or from a
    /// rank's last step until it exited or was killed (ms).
    pub longest_stall_ms: f64,
    /// Ranks that exited with an error.
    pub ranks_raised: usize,
    /// Ranks whose output says gloo timed out.
    pub ranks_timed_out: usize,
    /// Every rank finished its steps.
    pub finished: bool,
    /// Ranks still running at the deadline (killed).
    pub ranks_hung: usize,
}

/// The scenario's report.
#[derive(Debug, Clone, Serialize)]
pub struct BaselineReport {
    pub ok: bool,
    pub scenario: &'static str,
    pub railguard: bool,
    pub hosts: usize,
    pub steps: u64,
    pub pulls: Vec<PullFigures>,
}

fn unix_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// Step end times (unix ms) of one rank's `--step-log`.
fn step_times(path: &Path) -> Vec<f64> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()?["unix_ms"].as_f64())
        .collect()
}

/// The longest gap between consecutive step ends, and from the last one to
/// `end_ms` when the rank did not finish.
pub fn longest_stall(times: &[f64], end_ms: Option<f64>) -> f64 {
    let inner = times.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
    match (end_ms, times.last()) {
        (Some(end), Some(last)) => inner.max(end - last),
        _ => inner,
    }
}

/// Plain PyTorch processes started in the testbed's namespaces (gloo on
/// rail0, one thread, output to a log file), killed when dropped.
#[derive(Default)]
pub(crate) struct Procs(pub(crate) Vec<Child>);

impl Procs {
    /// Starts `cmd` with its stdout and stderr going to `log`.
    pub(crate) fn spawn(&mut self, mut cmd: Command, log: &Path) -> anyhow::Result<()> {
        let log = std::fs::File::create(log)?;
        cmd.env("GLOO_SOCKET_IFNAME", "rail0")
            .env("OMP_NUM_THREADS", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = cmd
            .spawn()
            .context("start python3 (is python3-torch installed?)")?;
        testbed::register_pid(child.id());
        self.0.push(child);
        Ok(())
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
            testbed::unregister_pid(c.id());
        }
    }
}

/// Runs one job under one pull.
async fn one_pull(
    r: &BaselineRun,
    outage: Option<Duration>,
    i: usize,
) -> anyhow::Result<PullFigures> {
    let mut tb = Testbed::build(TestbedSpec {
        supervisors: 0,
        hosts: r.hosts,
    })
    .await?;
    let dir = tempfile::Builder::new()
        .prefix("railguard-baseline-")
        .tempdir()?;
    let script = install_python(dir.path())?;
    let mut ranks = Procs::default();
    for h in 0..r.hosts {
        let mut cmd = tb.ns(Node::Host(h)).command("/usr/bin/python3")?;
        cmd.arg(&script)
            .args(["--steps", &r.steps.to_string()])
            .args(["--step-delay-ms", &r.step_delay_ms.to_string()])
            .args(["--log-every", "100"])
            .arg("--step-log")
            .arg(dir.path().join(format!("steps-{h}.jsonl")))
            .env("RANK", h.to_string())
            .env("WORLD_SIZE", r.hosts.to_string())
            .env("MASTER_ADDR", rail_addr(0, 0).to_string())
            .env("MASTER_PORT", "29500");
        ranks.spawn(cmd, &dir.path().join(format!("rank-{h}.log")))?;
    }
    let steps0 = dir.path().join("steps-0.jsonl");
    let quarter = (r.steps / 4) as usize;
    let t0 = Instant::now();
    while step_times(&steps0).len() < quarter {
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(120),
            "the job never reached step {quarter}; logs in {}",
            dir.keep().display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tb.set_cable(1, 0, Side::Fabric, false).await?;
    eprintln!(
        "[torch-baseline] pull {i}: {}",
        outage.map_or("for good".to_string(), |o| format!("{} ms", o.as_millis()))
    );
    let pulled = Instant::now();
    let mut restored = outage.is_none();
    // Long enough for gloo's 30 s timeout after the cable is back (or
    // after the pull, when it is never put back), TCP's backoff, and the
    // rest of the steps at up to 40 ms of compute each.
    let rest = Duration::from_millis(r.steps * (r.step_delay_ms + 40));
    let deadline = pulled + outage.unwrap_or_default() + Duration::from_secs(90) + rest;
    let mut ended: Vec<Option<(i32, f64)>> = vec![None; r.hosts];
    loop {
        if !restored && outage.is_some_and(|o| pulled.elapsed() >= o) {
            tb.set_cable(1, 0, Side::Fabric, true).await?;
            restored = true;
        }
        for (h, c) in ranks.0.iter_mut().enumerate() {
            if ended[h].is_none() {
                if let Ok(Some(s)) = c.try_wait() {
                    ended[h] = Some((s.code().unwrap_or(-1), unix_ms()));
                }
            }
        }
        if ended.iter().all(Option::is_some) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let now = unix_ms();
    let mut stall: f64 = 0.0;
    let mut raised = 0;
    let mut timed_out = 0;
    let mut hung = 0;
    let mut finished = true;
    for (h, ended) in ended.iter().enumerate() {
        let times = step_times(&dir.path().join(format!("steps-{h}.jsonl")));
        let done = times.len() as u64 >= r.steps;
        finished &= done;
        let end = match *ended {
            Some((code, at)) => {
                raised += usize::from(code != 0);
                (!done).then_some(at)
            }
            None => {
                hung += 1;
                Some(now)
            }
        };
        stall = stall.max(longest_stall(&times, end));
        let log =
            std::fs::read_to_string(dir.path().join(format!("rank-{h}.log"))).unwrap_or_default();
        timed_out += usize::from(log.contains("Timed out"));
    }
    drop(ranks);
    tb.teardown();
    Ok(PullFigures {
        outage_ms: outage.map(|o| o.as_millis() as u64),
        longest_stall_ms: (stall * 10.0).round() / 10.0,
        ranks_raised: raised,
        ranks_timed_out: timed_out,
        finished,
        ranks_hung: hung,
    })
}

/// Runs one fresh job per outage.
pub async fn run(r: BaselineRun) -> anyhow::Result<BaselineReport> {
    anyhow::ensure!(r.hosts >= 2, "at least two hosts");
    let mut pulls = Vec::new();
    for (i, o) in r.outages.iter().enumerate() {
        let p = one_pull(&r, *o, i).await?;
        eprintln!("[torch-baseline] {p:?}");
        pulls.push(p);
    }
    Ok(BaselineReport {
        // A measurement: ok once every pull was measured.
        ok: pulls.len() == r.outages.len(),
        scenario: "torch-nic-flap",
        railguard: false,
        hosts: r.hosts,
        steps: r.steps,
        pulls,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_counts_until_a_rank_that_never_stepped_again_ended() {
        assert_eq!(longest_stall(&[0.0, 10.0, 3310.0, 3320.0], None), 3300.0);
        assert_eq!(longest_stall(&[0.0, 10.0], Some(30_010.0)), 30_000.0);
        assert_eq!(longest_stall(&[], Some(5.0)), 0.0);
    }
}
