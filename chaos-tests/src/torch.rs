//! `scenario torch-nic-flap`: an unmodified PyTorch DDP job (gloo over TCP,
//! `python/examples/torch_ddp.py`, launched by the agents with torchrun's
//! environment) trains across pulled cables. railguard's detour routes keep
//! the pulled NIC's address reachable through the backup rail, so gloo's
//! established connections carry on: no rank raises, no restart, and the
//! final weights are bit-identical to a fault-free run's.
//!
//! One run: a fault-free job for the reference digest, then the same job
//! with host 1's rail0 cable pulled (fabric side) once it is a quarter
//! through, for each outage in `outages` (put back after it, the next pull
//! once the NIC is up again). Figures: restarts, the ranks' exit states,
//! both digests, and the longest step stall each rank measured itself
//! (`STALL {...}`: the longest time between two step ends).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde::Serialize;
use testbed::netcluster::NetCluster;
use testbed::{Side, TestbedSpec};

use crate::training::{digest_of, install_python, job_view, last_step, rank_log, JobFile};

/// The scenario's settings.
#[derive(Debug, Clone)]
pub struct TorchRun {
    pub hosts: usize,
    pub supervisors: usize,
    pub steps: u64,
    /// Sleep after each step (ms): paces the job so a pull lands mid-run.
    pub step_delay_ms: u64,
    /// Each pull's outage, in order (`None`: the cable stays out, the NIC
    /// never comes back; only last).
    pub outages: Vec<Option<Duration>>,
    pub deadline: Duration,
}

/// The scenario's report.
#[derive(Debug, Clone, Serialize)]
pub struct TorchReport {
    pub ok: bool,
    pub scenario: &'static str,
    pub hosts: usize,
    pub steps: u64,
    /// Each outage in ms (`null`: never put back).
    pub outages_ms: Vec<Option<u64>>,
    /// Process restarts of the faulted job (incarnations after the first).
    pub restarts: u64,
    pub state: String,
    pub reference_digest: Option<String>,
    pub digest: Option<String>,
    pub same_digest: bool,
    /// Per rank: the longest time between two step ends (ms).
    pub max_step_stall_ms: Vec<f64>,
    /// The fault-free run's, for comparison.
    pub reference_max_step_stall_ms: Vec<f64>,
}

/// `max_step_gap_ms` of the `STALL {...}` line of a log.
pub fn stall_of(log: &str) -> Option<f64> {
    let line = log
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("STALL "))?;
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    v["max_step_gap_ms"].as_f64()
}

fn submit(c: &NetCluster, name: &str, r: &TorchRun, script: &Path) -> anyhow::Result<()> {
    let ckpt = c.run_dir.path().join("ckpt").join(name);
    if let Some(parent) = ckpt.parent() {
        std::fs::create_dir_all(parent)?;
    }
    JobFile {
        name,
        ranks: r.hosts as u32,
        ranks_per_host: 1,
        hosts: (0..r.hosts).map(|h| format!("h{h}")).collect(),
        command: vec![
            "/usr/bin/python3".into(),
            script.display().to_string(),
            "--steps".into(),
            r.steps.to_string(),
            "--step-delay-ms".into(),
            r.step_delay_ms.to_string(),
            "--log-every".into(),
            "1".into(),
        ],
        checkpoint_dir: ckpt.display().to_string(),
        checkpoint_every: 100,
        max_restarts: 3,
        backoff: "500ms".into(),
    }
    .submit(c)
}

/// Waits until the job ended; returns (state, incarnation).
async fn wait_end(c: &NetCluster, name: &str, deadline: Instant) -> anyhow::Result<(String, u64)> {
    loop {
        if let Some(j) = job_view(c, name) {
            let state = j["state"].as_str().unwrap_or("?").to_string();
            if matches!(state.as_str(), "succeeded" | "failed" | "cancelled") {
                return Ok((state, j["incarnation"].as_u64().unwrap_or(0)));
            }
        }
        if Instant::now() > deadline {
            c.keep_run_dir();
            bail!(
                "job {name} did not end in time; logs in {}",
                c.run_dir.path().display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn stalls(c: &NetCluster, r: &TorchRun, name: &str, incarnation: u64) -> Vec<f64> {
    (0..r.hosts)
        .map(|h| {
            (0..r.hosts as u32)
                .find_map(|rank| stall_of(&rank_log(c, h, name, incarnation, rank)))
                .unwrap_or(-1.0)
        })
        .collect()
}

fn digest(c: &NetCluster, r: &TorchRun, name: &str, incarnation: u64) -> Option<String> {
    (0..r.hosts).find_map(|h| digest_of(&rank_log(c, h, name, incarnation, 0)))
}

/// Runs the scenario.
pub async fn run(r: TorchRun) -> anyhow::Result<TorchReport> {
    anyhow::ensure!(r.hosts >= 2, "at least two hosts");
    anyhow::ensure!(
        r.outages.iter().rev().skip(1).all(Option::is_some),
        "only the last pull may be for good"
    );
    let mut c = NetCluster::start_all_up(
        TestbedSpec {
            supervisors: r.supervisors,
            hosts: r.hosts,
        },
        Duration::from_secs(90),
    )
    .await?;
    let script = install_python(c.run_dir.path())?;
    let deadline = Instant::now() + r.deadline;

    eprintln!("[torch] fault-free run");
    submit(&c, "torch-ref", &r, &script)?;
    let (ref_state, ref_inc) = wait_end(&c, "torch-ref", deadline).await?;
    let reference_digest = digest(&c, &r, "torch-ref", ref_inc);
    if ref_state != "succeeded" || reference_digest.is_none() {
        c.keep_run_dir();
        bail!(
            "the fault-free run ended {ref_state} without a digest; logs in {}",
            c.run_dir.path().display()
        );
    }

    eprintln!(
        "[torch] the same job with rail0 of h1 pulled {} time(s)",
        r.outages.len()
    );
    submit(&c, "torch-flap", &r, &script)?;
    let quarter = r.steps / 4;
    while (0..r.hosts).all(|h| last_step(&rank_log(&c, h, "torch-flap", 1, 0)) < quarter) {
        if Instant::now() > deadline {
            c.keep_run_dir();
            bail!("the job never reached step {quarter}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (i, outage) in r.outages.iter().enumerate() {
        c.tb.set_cable(1, 0, Side::Fabric, false).await?;
        let Some(outage) = outage else {
            eprintln!("[torch] pull {i}: for good");
            break;
        };
        eprintln!("[torch] pull {i}: {} ms", outage.as_millis());
        tokio::time::sleep(*outage).await;
        c.tb.set_cable(1, 0, Side::Fabric, true).await?;
        c.wait_until(
            &format!("pull {i}: rail0 of h1 up again"),
            Duration::from_secs(90),
            |c| c.nic_state("h1", "rail0").is_ok_and(|s| s == "up"),
        )
        .await?;
    }
    let (state, incarnation) = wait_end(&c, "torch-flap", deadline).await?;
    let d = digest(&c, &r, "torch-flap", incarnation);
    let same = d.is_some() && d == reference_digest;
    let report = TorchReport {
        ok: state == "succeeded" && incarnation == 1 && same,
        scenario: "torch-nic-flap",
        hosts: r.hosts,
        steps: r.steps,
        outages_ms: r
            .outages
            .iter()
            .map(|o| o.map(|d| d.as_millis() as u64))
            .collect(),
        restarts: incarnation.saturating_sub(1),
        state,
        reference_digest,
        digest: d,
        same_digest: same,
        max_step_stall_ms: stalls(&c, &r, "torch-flap", incarnation),
        reference_max_step_stall_ms: stalls(&c, &r, "torch-ref", ref_inc),
    };
    if !report.ok {
        c.keep_run_dir();
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stall_lines_are_read() {
        let log = "start rank=0\nstep=1 unix_ms=5 loss=0.1\nSTALL {\"max_step_gap_ms\": 12.5, \"steps\": 3}\nDIGEST abc123\n";
        assert_eq!(stall_of(log), Some(12.5));
        assert_eq!(stall_of("STALL not json"), None);
    }
}
