//! `railguard job …`: training jobs — submit (a TOML job file), list,
//! show, checkpoint (waiting for it), restart, cancel, logs.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Subcommand;
use supervisor::api::{AdminReply, AdminRequest, ApiError, ErrorKind};
use supervisor::client::AdminClient;
use supervisor::model::jobs::{Job, JobOp, JobState};
use supervisor::model::AdminOp;

use crate::output::{fmt_ms, pairs, parse_duration, print_json, table};

/// `railguard job …`.
#[derive(Subcommand, Debug)]
pub enum JobCmd {
    /// Submit a job described by a TOML file.
    ///
    /// Fields: name, ranks, command, checkpoint_dir; optionally hosts, labels,
    /// env, checkpoint_every, max_restarts (3) and backoff ("1s").
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
        /// Keep printing new output as the rank writes it, across restarts
        /// (a new incarnation's log starts under its own header), until
        /// Ctrl-C.
        #[arg(long, short)]
        follow: bool,
    },
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
    /// The user the ranks run as (default: each agent's default user).
    user: Option<String>,
    /// Ranks on each host (default 1).
    ranks_per_host: Option<u32>,
}

/// Reads and validates a job file.
pub fn read_job_file(path: &std::path::Path) -> anyhow::Result<supervisor::model::jobs::JobSpec> {
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
    let spec = supervisor::model::jobs::JobSpec {
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
        user: f.user,
        ranks_per_host: f.ranks_per_host.unwrap_or(1),
    };
    spec.validate()
        .map_err(|e| ApiError::invalid(format!("{}: {e}", path.display())))?;
    Ok(spec)
}

/// Orders a checkpoint and, unless `wait` is zero, waits until a complete
/// checkpoint newer than the one before exists (exit 2 when the job left
/// Checkpointing without one, 4 when `wait` ran out). Without waiting, the
/// write's reply is returned for the caller to print.
pub async fn checkpoint(
    client: &AdminClient,
    job: String,
    wait: Duration,
    json: bool,
) -> anyhow::Result<Option<AdminReply>> {
    let before = match client
        .call(AdminRequest::JobShow { job: job.clone() }, false)
        .await?
    {
        AdminReply::Job { job, .. } => job.latest_checkpoint,
        other => bail!(ApiError::internal(format!("unexpected reply: {other:?}"))),
    };
    let op = AdminOp::Job(JobOp::Checkpoint { job: job.clone() });
    let reply = client.call(AdminRequest::Write { op }, false).await?;
    if wait.is_zero() {
        return Ok(Some(reply));
    }
    let deadline = Instant::now() + wait;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let j = match client
            .call(AdminRequest::JobShow { job: job.clone() }, false)
            .await
        {
            Ok(AdminReply::Job { job, .. }) => *job,
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
                print_json(&serde_json::json!({"job": j.name, "step": step}))?;
                return Ok(None);
            }
            println!("job {}: checkpoint at step {step} complete", j.name);
            return Ok(None);
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

pub fn print_jobs(jobs: &[Job]) {
    if jobs.is_empty() {
        println!("no jobs");
        return;
    }
    // The columns both forms show.
    let rows: Vec<([String; 6], &Job)> = jobs
        .iter()
        .map(|j| {
            let c = [
                j.name.clone(),
                format!("{:?}", j.state).to_lowercase(),
                j.spec.ranks.to_string(),
                j.incarnation.to_string(),
                j.restarts.to_string(),
                j.latest_checkpoint
                    .map_or_else(|| "-".into(), |s| s.to_string()),
            ];
            (c, j)
        })
        .collect();
    const HEAD: [&str; 6] = ["JOB", "STATE", "RANKS", "INC", "RESTARTS", "CHECKPOINT"];
    let [a, b, c, d, e, f] = HEAD;
    if crate::output::wide() {
        table!(
            rows,
            "{:<20} {:<13} {:>5} {:>5} {:>8} {:>10} {:>6} {:<25} {:<25} {:<20} {}",
            [
                a,
                b,
                c,
                d,
                e,
                f,
                "PORT",
                "SUBMITTED",
                "STATE SINCE",
                "HOSTS",
                "PREVIOUS HOSTS"
            ],
            |([c0, c1, c2, c3, c4, c5], j)| [
                c0,
                c1,
                c2,
                c3,
                c4,
                c5,
                j.port.to_string(),
                fmt_ms(j.submitted_ms),
                fmt_ms(j.state_since_ms),
                hosts_or_dash(&j.placement),
                hosts_or_dash(&j.previous_placement)
            ],
        );
    } else {
        table!(
            rows,
            "{:<20} {:<13} {:>5} {:>5} {:>8} {:>10}  {}",
            [a, b, c, d, e, f, "HOSTS"],
            |([c0, c1, c2, c3, c4, c5], j)| [c0, c1, c2, c3, c4, c5, hosts_or_dash(&j.placement)],
        );
    }
}

fn hosts_or_dash(hosts: &[String]) -> String {
    if hosts.is_empty() {
        "-".to_string()
    } else {
        hosts.join(",")
    }
}

/// `railguard job show`; `waiting`: why a pending or restarting job is
/// not placed yet.
pub fn print_job(j: &Job, waiting: Option<&str>) {
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
    if let Some(w) = waiting {
        println!("waiting:     {w}");
    }
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

/// `railguard job logs`: the tail of a rank's output (a header on stderr).
/// How often `job logs --follow` asks for more.
const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// `job logs --follow`: the tail, then every new byte in order, like
/// `tail -f`. When the rank's newest log is a newer incarnation's (a
/// restart, maybe on another host), it goes on with that one from its
/// start. A call that fails is said on stderr and tried again.
pub async fn follow_logs(
    client: &supervisor::client::AdminClient,
    job: String,
    rank: u32,
    bytes: u32,
    json: bool,
) -> anyhow::Result<()> {
    use std::io::Write;
    use supervisor::api::{AdminReply, AdminRequest, LogPosition};
    let mut from: Option<LogPosition> = None;
    let mut shown: Option<(String, u64)> = None;
    let mut failing = false;
    loop {
        let req = AdminRequest::JobLogs {
            job: job.clone(),
            rank,
            max_bytes: bytes,
            from,
        };
        let reply = match client.call(req, false).await {
            Ok(r) => r,
            Err(e) => {
                if !failing {
                    eprintln!("error: {e:#} (trying again)");
                }
                failing = true;
                tokio::time::sleep(FOLLOW_EVERY).await;
                continue;
            }
        };
        failing = false;
        let AdminReply::JobLogs {
            host,
            incarnation,
            text,
            end_offset,
            newest_incarnation,
        } = reply
        else {
            anyhow::bail!("unexpected reply to a log read: {reply:?}");
        };
        if json {
            if !text.is_empty() {
                println!(
                    "{}",
                    serde_json::json!({"host": host, "incarnation": incarnation, "offset": end_offset, "text": text})
                );
            }
        } else {
            if shown.as_ref() != Some(&(host.clone(), incarnation)) {
                eprintln!("--- {host}, incarnation {incarnation} ---");
                shown = Some((host.clone(), incarnation));
            }
            print!("{text}");
        }
        std::io::stdout().flush()?;
        from = Some(if text.is_empty() && newest_incarnation > incarnation {
            LogPosition {
                incarnation: newest_incarnation,
                offset: 0,
            }
        } else {
            LogPosition {
                incarnation,
                offset: end_offset,
            }
        });
        // More is waiting when a read came back full; else wait a little.
        if text.len() < bytes as usize / 2 {
            tokio::time::sleep(FOLLOW_EVERY).await;
        }
    }
}

pub fn print_job_logs(host: &str, incarnation: u64, text: &str) {
    eprintln!("--- {host}, incarnation {incarnation} ---");
    print!("{text}");
    if !text.ends_with('\n') && !text.is_empty() {
        println!();
    }
}

#[cfg(test)]
mod tests {
    use super::read_job_file;

    #[test]
    fn a_job_file_may_name_the_user_its_ranks_run_as() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.toml");
        let base = "name = \"j\"\nranks = 1\ncommand = [\"/bin/true\"]\ncheckpoint_dir = \"/c\"\n";
        std::fs::write(&path, base).unwrap();
        assert_eq!(read_job_file(&path).unwrap().user, None);
        std::fs::write(&path, format!("{base}user = \"trainer\"\n")).unwrap();
        assert_eq!(
            read_job_file(&path).unwrap().user.as_deref(),
            Some("trainer")
        );
        std::fs::write(&path, format!("{base}user = \"a b\"\n")).unwrap();
        let e = read_job_file(&path).unwrap_err().to_string();
        assert!(e.contains("user \"a b\""), "{e}");
    }
}
