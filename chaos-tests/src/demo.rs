//! `railguard-chaos demo`: a real three-supervisor cluster on loopback, four
//! registered hosts, a drain issued with the `railguard` CLI, the leader
//! SIGKILLed, and the drain still there on the new leader. Prints a
//! timeline; the NIC-flap demo replaces this once the agent exists.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;
use supervisor::api::{AdminReply, AdminRequest};
use supervisor::model::HostStatus;

use crate::cluster::{bin_path, SupervisorCluster};

#[derive(Debug, Serialize)]
pub struct DemoReport {
    pub ok: bool,
    pub demo: &'static str,
    pub drained_ms: u64,
    pub failover_ms: u64,
    pub drain_survived_failover: bool,
}

struct Timeline(Instant);

impl Timeline {
    fn say(&self, what: &str) {
        println!("[{:>7.3}s] {what}", self.0.elapsed().as_secs_f64());
    }
}

fn cli(addrs: &[String], args: &[&str]) -> anyhow::Result<String> {
    let bin = bin_path("railguard")?;
    let out = Command::new(bin)
        .arg("--supervisor")
        .arg(addrs.join(","))
        .arg("--as")
        .arg("demo-admin")
        .args(args)
        .output()
        .context("run railguard")?;
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("railguard {} failed: {text}", args.join(" "));
    }
    Ok(text)
}

fn show(cmd: &str, out: &str) {
    println!("  $ railguard {cmd}");
    for l in out.lines() {
        println!("    {l}");
    }
}

pub async fn run() -> anyhow::Result<DemoReport> {
    let t = Timeline(Instant::now());
    t.say("starting 3 supervisors (Raft over gRPC, sled on disk) on loopback");
    let mut cluster = SupervisorCluster::start(3)?;
    let leader = cluster.init().await?;
    t.say(&format!("cluster initialised; supervisor {leader} leads"));
    for i in 0..4 {
        crate::agentsim::register_host(&cluster.addrs(), &format!("h{i}")).await?;
    }
    t.say("4 hosts registered through the agent API (h0..h3, rails rail0/rail1)");
    let addrs = cluster.addrs();
    show("status", &cli(&addrs, &["status"])?);
    // Send the drain to a follower on purpose: it forwards to the leader.
    let follower = cluster
        .nodes
        .iter()
        .find(|n| n.id != leader)
        .map(|n| n.addr.clone())
        .unwrap_or_default();
    t.say(&format!(
        "admin drains h1 through follower {follower} (forwarded to the leader)"
    ));
    let t_drain = Instant::now();
    show(
        "node drain h1 --reason 'replace optics'",
        &cli(
            std::slice::from_ref(&follower),
            &[
                "node",
                "drain",
                "h1",
                "--reason",
                "replace optics",
                "--deadline",
                "30m",
            ],
        )?,
    );
    let client = cluster.client("demo", 0, Duration::from_secs(2))?;
    let drained_ms = loop {
        if let Ok(AdminReply::Host { host, .. }) = client
            .call(AdminRequest::NodeShow { host: "h1".into() }, false)
            .await
        {
            if host.status() == HostStatus::Drained {
                break t_drain.elapsed().as_millis() as u64;
            }
        }
        if t_drain.elapsed() > Duration::from_secs(10) {
            bail!("h1 did not reach Drained");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    t.say(&format!(
        "h1 is Drained after {drained_ms} ms (no jobs on it; the reconciler's intent completed it)"
    ));
    show("node list", &cli(&addrs, &["node", "list"])?);
    t.say(&format!("SIGKILL the leader (supervisor {leader})"));
    let t_kill = Instant::now();
    cluster.kill(leader);
    let new_leader = cluster.wait_leader(Duration::from_secs(10)).await?;
    let failover_ms = t_kill.elapsed().as_millis() as u64;
    t.say(&format!(
        "supervisor {new_leader} leads after {failover_ms} ms"
    ));
    let live: Vec<String> = cluster
        .nodes
        .iter()
        .filter(|n| n.is_running())
        .map(|n| n.addr.clone())
        .collect();
    let show_h1 = cli(&live, &["node", "show", "h1"])?;
    show("node show h1", &show_h1);
    let survived = show_h1.contains("Drained");
    cluster.restart(leader)?;
    t.say(&format!(
        "supervisor {leader} restarted on its data dir and rejoins"
    ));
    cluster.wait_leader(Duration::from_secs(10)).await?;
    show("events", &cli(&addrs, &["events"])?);
    show("node undrain h1", &cli(&addrs, &["node", "undrain", "h1"])?);
    t.say("h1 back in service; tearing down (all supervisor processes killed, data removed)");
    drop(cluster);
    Ok(DemoReport {
        ok: survived,
        demo: "drain-through-failover",
        drained_ms,
        failover_ms,
        drain_survived_failover: survived,
    })
}
