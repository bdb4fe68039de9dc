//! `bench torch-goodput`: the PyTorch DDP example under one fault schedule,
//! once as a railguard job and once the way people run it today — plain
//! `torchrun --max-restarts 3` on one rail, no railguard — with the same
//! checkpoint interval and the same collective timeout (30 s, set in the
//! script). Each side gets a fresh testbed; the schedule is the same list
//! of cable pulls at the same times after the job's first step:
//!
//! 1. a flap storm: for `storm` seconds, every `flap_every` (± half) a
//!    random host's rail0 cable is out for `flap_down`;
//! 2. h1's rail0 cable out for `outage` (60 s by default);
//! 3. 10 s later, h2's rail0 cable out for good.
//!
//! Figures per side: useful steps (the steps whose result survives: all of
//! them when the job finished, else its newest complete checkpoint), wall
//! time from the first step to the end, useful steps/s, process restarts,
//! lost steps (computed and thrown away by a restart or the failure), and
//! the ratio of the two sides' useful steps/s.

use std::path::Path;

use std::time::{Duration, Instant};

use anyhow::bail;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use testbed::{rail_addr, Node, Side, Testbed, TestbedSpec};

use crate::torch_baseline::Procs;
use crate::training::{install_python, last_step, TrainOpts, Training, Watch, Workload};

/// The bench's settings.
#[derive(Debug, Clone)]
pub struct GoodputRun {
    pub hosts: usize,
    pub steps: u64,
    pub step_delay_ms: u64,
    pub checkpoint_every: u64,
    pub storm: Duration,
    pub flap_every: Duration,
    pub flap_down: Duration,
    pub outage: Duration,
    pub seed: u64,
    /// Longest either side may take.
    pub deadline: Duration,
}

/// One cable change, `at` after the job's first step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CableChange {
    pub at: Duration,
    pub host: usize,
    pub up: bool,
}

/// The fault schedule: changes in time order; the last pull is never
/// undone.
pub fn schedule(r: &GoodputRun) -> Vec<CableChange> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(r.seed);
    let mut out = Vec::new();
    let mut t = Duration::from_secs(2);
    let half = r.flap_every / 2;
    while t + r.flap_down < r.storm {
        let host = rng.gen_range(0..r.hosts);
        out.push(CableChange {
            at: t,
            host,
            up: false,
        });
        out.push(CableChange {
            at: t + r.flap_down,
            host,
            up: true,
        });
        let jitter = Duration::from_millis(rng.gen_range(0..=r.flap_every.as_millis() as u64));
        t += r.flap_down + half + jitter;
    }
    let t = r.storm.max(t) + Duration::from_secs(2);
    out.push(CableChange {
        at: t,
        host: 1,
        up: false,
    });
    out.push(CableChange {
        at: t + r.outage,
        host: 1,
        up: true,
    });
    out.push(CableChange {
        at: t + r.outage + Duration::from_secs(10),
        host: 2 % r.hosts,
        up: false,
    });
    out
}

/// One side's figures.
#[derive(Debug, Clone, Serialize)]
pub struct SideFigures {
    pub finished: bool,
    pub useful_steps: u64,
    pub wall_s: f64,
    pub useful_steps_per_s: f64,
    pub restarts: u64,
    pub lost_steps: u64,
    /// Every cable change of the schedule happened while the job ran.
    pub schedule_done: bool,
    pub detail: String,
}

/// The bench's report.
#[derive(Debug, Clone, Serialize)]
pub struct GoodputReport {
    pub ok: bool,
    pub bench: &'static str,
    pub hosts: usize,
    pub steps: u64,
    pub checkpoint_every: u64,
    pub cable_pulls: usize,
    pub railguard: SideFigures,
    pub torchrun: SideFigures,
    /// railguard's useful steps/s ÷ torchrun's (`null` when torchrun kept
    /// no step at all).
    pub ratio: Option<f64>,
}

/// Attempts in a log, in order: (the step it started from, the last step
/// it finished). An attempt starts at a `start … step=S` line.
pub fn attempts(log: &str) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for l in log.lines() {
        let mut words = l.split_whitespace();
        match words.next() {
            Some("start") => {
                let s = words
                    .find_map(|w| w.strip_prefix("step=")?.parse().ok())
                    .unwrap_or(0);
                out.push((s, s));
            }
            Some(w) => {
                if let (Some(n), Some(last)) = (
                    w.strip_prefix("step=").and_then(|n| n.parse().ok()),
                    out.last_mut(),
                ) {
                    last.1 = last.1.max(n);
                }
            }
            None => {}
        }
    }
    out
}

/// A torchrun log without the `[default<N>]:` prefix `--tee` puts before
/// each line of a worker's output.
pub fn untee(log: &str) -> String {
    log.lines()
        .map(|l| match l.strip_prefix("[default") {
            Some(rest) => rest.split_once("]:").map_or(l, |(_, line)| line),
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Steps computed and thrown away: each attempt's progress past where the
/// next one started, and the last one's past `useful`.
pub fn lost_steps(attempts: &[(u64, u64)], useful: u64) -> u64 {
    let mut lost = 0;
    for (i, (_, reached)) in attempts.iter().enumerate() {
        let kept = attempts.get(i + 1).map_or(useful, |n| n.0);
        lost += reached.saturating_sub(kept);
    }
    lost
}

/// The newest step for which every rank's checkpoint file exists.
pub fn newest_complete_checkpoint(dir: &Path, world: usize) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .filter_map(|e| {
            let n: u64 = e
                .file_name()
                .to_str()?
                .strip_prefix("step-")?
                .parse()
                .ok()?;
            (0..world)
                .all(|r| e.path().join(format!("rank-{r}.pt")).is_file())
                .then_some(n)
        })
        .max()
        .unwrap_or(0)
}

fn side(
    finished: bool,
    useful: u64,
    wall: Duration,
    restarts: u64,
    lost: u64,
    schedule_done: bool,
    detail: String,
) -> SideFigures {
    let wall_s = wall.as_secs_f64();
    SideFigures {
        finished,
        useful_steps: useful,
        wall_s: (wall_s * 10.0).round() / 10.0,
        useful_steps_per_s: ((useful as f64 / wall_s.max(1e-9)) * 100.0).round() / 100.0,
        restarts,
        lost_steps: lost,
        schedule_done,
        detail,
    }
}

/// Applies the changes that are due; returns how many were applied.
async fn drive(
    tb: &mut Testbed,
    plan: &[CableChange],
    done: usize,
    since: Instant,
) -> anyhow::Result<usize> {
    let mut i = done;
    while i < plan.len() && since.elapsed() >= plan[i].at {
        let c = plan[i];
        tb.set_cable(c.host, 0, Side::Fabric, c.up).await?;
        eprintln!(
            "  {:>6.1}s  h{}/rail0 cable {}",
            c.at.as_secs_f64(),
            c.host,
            if c.up { "back" } else { "pulled" }
        );
        i += 1;
    }
    Ok(i)
}

/// Runs both sides.
pub async fn run(r: GoodputRun) -> anyhow::Result<GoodputReport> {
    anyhow::ensure!(r.hosts >= 3, "at least three hosts (h1 and h2 are faulted)");
    let plan = schedule(&r);
    eprintln!(
        "[torch-goodput] {} cable changes; railguard first",
        plan.len()
    );
    let railguard = under_railguard(&r, &plan).await?;
    eprintln!("[torch-goodput] railguard: {railguard:?}");
    eprintln!("[torch-goodput] plain torchrun --max-restarts 3, one rail");
    let torchrun = under_torchrun(&r, &plan).await?;
    eprintln!("[torch-goodput] torchrun: {torchrun:?}");
    let ratio = (torchrun.useful_steps_per_s > 0.0).then(|| {
        (railguard.useful_steps_per_s / torchrun.useful_steps_per_s * 100.0).round() / 100.0
    });
    Ok(GoodputReport {
        // The whole schedule must have happened while the job ran.
        ok: railguard.finished && railguard.useful_steps == r.steps && railguard.schedule_done,
        bench: "torch-goodput",
        hosts: r.hosts,
        steps: r.steps,
        checkpoint_every: r.checkpoint_every,
        cable_pulls: plan.iter().filter(|c| !c.up).count(),
        railguard,
        torchrun,
        ratio,
    })
}

async fn under_railguard(r: &GoodputRun, plan: &[CableChange]) -> anyhow::Result<SideFigures> {
    let o = TrainOpts {
        workload: Workload::Torch {
            step_delay_ms: r.step_delay_ms,
        },
        hosts: r.hosts,
        ranks: r.hosts as u32,
        steps: r.steps,
        checkpoint_every: r.checkpoint_every,
        max_restarts: 3,
        deadline: r.deadline,
        ..Default::default()
    };
    let mut t = Training::start(&o).await?;
    let hosts = o.rank_hosts();
    t.submit("goodput", &o, &hosts)?;
    let mut w = Watch::new("goodput", o.deadline);
    let mut first: Option<Instant> = None;
    let mut done = 0;
    let run = loop {
        if let Some(run) = w.poll(&t, &o)? {
            break run;
        }
        match first {
            None if t.max_step("goodput", 1, o.hosts, o.ranks) >= 1 => first = Some(Instant::now()),
            Some(at) => done = drive(&mut t.c.tb, plan, done, at).await?,
            None => {}
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let wall = first.map_or(Duration::ZERO, |f| f.elapsed());
    let finished = run.state == "succeeded";
    let useful = if finished {
        r.steps
    } else {
        newest_complete_checkpoint(&t.checkpoint_dir("goodput"), r.hosts)
    };
    let all: Vec<(u64, u64)> = (1..=run.incarnations)
        .flat_map(|inc| {
            (0..o.hosts)
                .map(|h| t.rank_log(h, "goodput", inc, 0))
                .find(|l| !l.is_empty())
                .map(|l| attempts(&l))
                .unwrap_or_default()
        })
        .collect();
    if !finished || done < plan.len() {
        t.keep_run_dir();
    }
    Ok(side(
        finished,
        useful,
        wall,
        run.restarts,
        lost_steps(&all, useful),
        done == plan.len(),
        format!(
            "{} ({} of {} cable changes applied)",
            run.state,
            done,
            plan.len()
        ),
    ))
}

async fn under_torchrun(r: &GoodputRun, plan: &[CableChange]) -> anyhow::Result<SideFigures> {
    let mut tb = Testbed::build(TestbedSpec {
        supervisors: 0,
        hosts: r.hosts,
    })
    .await?;
    let dir = tempfile::Builder::new()
        .prefix("railguard-torchrun-")
        .tempdir()?;
    let script = install_python(dir.path())?;
    let ckpt = dir.path().join("ckpt");
    std::fs::create_dir_all(&ckpt)?;
    let master = rail_addr(0, 0);
    let mut procs = Procs::default();
    for h in 0..r.hosts {
        let mut cmd = tb.ns(Node::Host(h)).command("/usr/bin/python3")?;
        // torch 1.13's launcher spells its options with underscores.
        cmd.args(["-m", "torch.distributed.run"])
            .args(["--nnodes", &r.hosts.to_string(), "--nproc_per_node", "1"])
            .args(["--node_rank", &h.to_string()])
            .args([
                "--master_addr",
                &master.to_string(),
                "--master_port",
                "29400",
            ])
            .args(["--max_restarts", "3", "--monitor_interval", "1"])
            // Debian's torch 1.13 on Python 3.11 crashes at start with the
            // default `--redirects 0 --tee 0` (`Std.from_str("0")` finds no
            // member and returns None); stdout teed to a file and the
            // console works, and the console is our log.
            .args(["--redirects", "1", "--tee", "1", "--log_dir"])
            .arg(dir.path().join(format!("torchrun-h{h}")))
            .arg(&script)
            .args(["--steps", &r.steps.to_string()])
            .args(["--step-delay-ms", &r.step_delay_ms.to_string()])
            .args(["--log-every", "1"])
            .arg("--checkpoint-dir")
            .arg(&ckpt)
            .args(["--checkpoint-every", &r.checkpoint_every.to_string()]);
        procs.spawn(cmd, &dir.path().join(format!("h{h}.log")))?;
    }
    let log0 = dir.path().join("h0.log");
    let t0 = Instant::now();
    let mut first: Option<Instant> = None;
    let mut done = 0;
    let codes = loop {
        let codes: Vec<Option<i32>> = procs
            .0
            .iter_mut()
            .map(|c| c.try_wait().ok().flatten().map(|s| s.code().unwrap_or(-1)))
            .collect();
        // The job is over once every agent ended, or as soon as one gave
        // up (no restarts left): it cannot finish without that node, and a
        // scheduler would tear the rest down.
        if codes.iter().all(Option::is_some) || codes.iter().any(|c| c.is_some_and(|c| c != 0)) {
            break codes;
        }
        if t0.elapsed() > r.deadline {
            let kept = dir.keep();
            bail!(
                "torchrun did not end within {:?}; logs in {}",
                r.deadline,
                kept.display()
            );
        }
        match first {
            None if last_step(&untee(&std::fs::read_to_string(&log0).unwrap_or_default())) >= 1 => {
                first = Some(Instant::now())
            }
            Some(at) => done = drive(&mut tb, plan, done, at).await?,
            None => {}
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let wall = first.map_or(Duration::ZERO, |f| f.elapsed());
    let log = untee(&std::fs::read_to_string(&log0).unwrap_or_default());
    let finished =
        codes.iter().all(|c| *c == Some(0)) && crate::training::digest_of(&log).is_some();
    let useful = if finished {
        r.steps
    } else {
        newest_complete_checkpoint(&ckpt, r.hosts)
    };
    let tried = attempts(&log);
    // Every failure of h0's worker group is logged by its agent; each but
    // a final one was followed by a restart (a restarted worker that never
    // got through `init_process_group` prints no `start` line).
    let failures = log.matches("failed (exitcode").count() as u64;
    let restarts = failures.saturating_sub(u64::from(!finished));
    let lost = lost_steps(&tried, useful);
    let detail = format!(
        "exit codes {} (-: still running when one gave up, then killed); {} of {} cable changes applied",
        codes
            .iter()
            .map(|c| c.map_or("-".to_string(), |c| c.to_string()))
            .collect::<Vec<_>>()
            .join(","),
        done,
        plan.len()
    );
    if !finished {
        eprintln!(
            "[torch-goodput] torchrun logs kept in {}",
            dir.keep().display()
        );
    }
    drop(procs);
    tb.teardown();
    Ok(side(
        finished,
        useful,
        wall,
        restarts,
        lost,
        done == plan.len(),
        detail,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_and_lost_steps_are_read_from_logs() {
        let log = "start rank=0 world=4 step=0 steps=100\nstep=1 unix_ms=1 loss=1\nstep=37 unix_ms=1 loss=1\n\
                   Traceback …\nresumed step=30 path=x\nstart rank=0 world=4 step=30 steps=100\nstep=31 unix_ms=1 loss=1\nstep=44 unix_ms=1 loss=1\n";
        let a = attempts(log);
        assert_eq!(a, vec![(0, 37), (30, 44)]);
        // 7 steps redone after the restart; 4 more lost when the job then
        // failed with its newest checkpoint at 40.
        assert_eq!(lost_steps(&a, 40), 7 + 4);
        assert_eq!(lost_steps(&[(0, 100)], 100), 0);
        assert!(attempts("").is_empty());
        let teed = "[default0]:start rank=0 world=4 step=0\n[default0]:step=9 unix_ms=1 loss=1\nWARNING x\n";
        assert_eq!(attempts(&untee(teed)), vec![(0, 9)]);
        assert_eq!(last_step(&untee(teed)), 9);
    }

    #[test]
    fn the_schedule_storms_then_pulls_for_60_s_then_for_good() {
        let r = GoodputRun {
            hosts: 4,
            steps: 100,
            step_delay_ms: 0,
            checkpoint_every: 10,
            storm: Duration::from_secs(30),
            flap_every: Duration::from_secs(4),
            flap_down: Duration::from_millis(2500),
            outage: Duration::from_secs(60),
            seed: 1,
            deadline: Duration::from_secs(1),
        };
        let s = schedule(&r);
        assert!(s.windows(2).all(|w| w[0].at <= w[1].at), "{s:?}");
        let last = s.last().unwrap();
        assert_eq!((last.host, last.up), (2, false));
        let pulls = s.iter().filter(|c| !c.up).count();
        let backs = s.iter().filter(|c| c.up).count();
        assert_eq!(pulls, backs + 1, "only the last pull is for good");
        assert!(pulls >= 4, "{s:?}");
        assert_eq!(schedule(&r), s, "the same seed, the same schedule");
    }
}
