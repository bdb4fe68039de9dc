//! Scenarios of the probe mesh: `mgmt-partition` and `probe-blackhole`.
//!
//! * **mgmt-partition**: a host's management link is cut (its fabric end
//!   down) for a while. Its heartbeats and reports stop, but its peers
//!   still hear its probes on the rails, so the leader marks it Suspect and
//!   never Down (DESIGN.md's invariant): no `host_down` incident, nothing
//!   done to its jobs. A NIC flap made during the cut sits in the agent's
//!   outbox; after the link returns the host is Ready again and the outbox
//!   drains (the flap's transitions are committed).
//! * **probe-blackhole**: a NIC's fabric-side cable end is detached from
//!   its rail bridge. Both veth ends stay up with carrier, so netlink sees
//!   nothing; the host's agent finds the NIC silent while its peers are
//!   heard on the other rail, marks it Down (probes lost) and the
//!   supervisor commits it. Reattaching brings it back Up. Detection and
//!   recovery times are measured from the injection to the committed state
//!   (CLI polling every 25 ms, so they are upper bounds).

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rand::{Rng, SeedableRng};
use serde::Serialize;

use testbed::netcluster::NetCluster;
use testbed::{Node, TestbedSpec};

/// Waits until every host's probes are flowing: all NICs up and the
/// leader's clock solution covers every host.
async fn wait_probing(c: &NetCluster, hosts: usize, within: Duration) -> anyhow::Result<()> {
    c.wait_until("every NIC up", within, |c| {
        (0..hosts).all(|h| {
            (0..2).all(|r| {
                c.nic_state(&format!("h{h}"), &format!("rail{r}"))
                    .is_ok_and(|s| s == "up")
            })
        })
    })
    .await?;
    let solved = c
        .wait_until("probe evidence of every host", within, |c| {
            c.cli_json(&["clock"]).is_ok_and(|v| {
                v["hosts"].as_array().is_some_and(|hs| {
                    hs.len() == hosts
                        && hs.iter().all(|h| h["live"]["offset_ns"].as_f64().is_some())
                })
            })
        })
        .await;
    if let Err(e) = solved {
        // What the leader had: which hosts and edges the solve lacked.
        let clock = c.cli(&["--output", "json", "clock"]).unwrap_or_default();
        let paths = c.cli(&["paths"]).unwrap_or_default();
        return Err(e.context(format!(
            "last `railguard clock`: {clock}\nlast `railguard paths`:\n{paths}"
        )));
    }
    Ok(())
}

fn liveness(c: &NetCluster, host: &str) -> anyhow::Result<String> {
    let v = c.cli_json(&["node", "show", host])?;
    Ok(v["host"]["liveness"].as_str().unwrap_or("?").to_string())
}

fn link_transitions(c: &NetCluster, host: &str, nic: &str) -> anyhow::Result<u64> {
    let v = c.cli_json(&["node", "show", host])?;
    v["host"]["nics"][nic]["link_transitions"]
        .as_u64()
        .context("no link_transitions")
}

/// `scenario mgmt-partition`.
#[derive(Debug, Clone)]
pub struct MgmtPartitionRun {
    pub hosts: usize,
    pub cut: Duration,
    pub seed: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct MgmtPartitionReport {
    pub ok: bool,
    pub scenario: &'static str,
    pub host: String,
    pub cut_ms: u64,
    /// Liveness values seen during the cut, in order, without repeats.
    pub liveness_seen: Vec<String>,
    pub went_suspect: bool,
    pub went_down: bool,
    pub host_down_incidents: usize,
    /// Link transitions made during the cut and committed after it.
    pub outbox_transitions: u64,
    pub outbox_drained: bool,
    pub ready_again_ms: u64,
    pub drained_ms: u64,
    pub errors: Vec<String>,
}

pub async fn mgmt_partition(p: MgmtPartitionRun) -> anyhow::Result<MgmtPartitionReport> {
    if !(3..=16).contains(&p.hosts) {
        bail!("--hosts takes 3..=16 (peers must be able to vouch for the host)");
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(p.seed);
    let t = rng.gen_range(0..p.hosts);
    let host = format!("h{t}");
    let mut c = NetCluster::start(TestbedSpec {
        supervisors: 3,
        hosts: p.hosts,
    })
    .await?;
    wait_probing(&c, p.hosts, Duration::from_secs(40)).await?;
    let before = link_transitions(&c, &host, "rail1")?;
    let mut errors = Vec::new();
    eprintln!(
        "[mgmt-partition] cutting {host}'s management link for {:?}",
        p.cut
    );
    c.tb.set_mgmt(Node::Host(t), false).await?;
    let t0 = Instant::now();
    let mut seen: Vec<String> = Vec::new();
    let mut flapped = false;
    while t0.elapsed() < p.cut {
        if !flapped && t0.elapsed() > p.cut / 3 {
            // A flap the agent must keep in its outbox until it reconnects.
            c.tb.set_host_nic(t, 1, false).await?;
            tokio::time::sleep(Duration::from_millis(300)).await;
            c.tb.set_host_nic(t, 1, true).await?;
            flapped = true;
        }
        if let Ok(l) = liveness(&c, &host) {
            if seen.last() != Some(&l) {
                eprintln!(
                    "[mgmt-partition] {:>5} ms: {host} is {l}",
                    t0.elapsed().as_millis()
                );
                seen.push(l);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    c.tb.set_mgmt(Node::Host(t), true).await?;
    let cut_ms = t0.elapsed().as_millis() as u64;
    let t1 = Instant::now();
    let ready = c
        .wait_until("the host Ready again", Duration::from_secs(15), |c| {
            liveness(c, &host).is_ok_and(|l| l == "ready")
        })
        .await;
    let ready_again_ms = match ready {
        Ok(d) => d.as_millis() as u64,
        Err(e) => {
            errors.push(format!("{e:#}"));
            0
        }
    };
    let drained = c
        .wait_until("the outbox drained", Duration::from_secs(15), |c| {
            link_transitions(c, &host, "rail1").is_ok_and(|n| n >= before + 2)
        })
        .await;
    let drained_ms = match &drained {
        Ok(_) => t1.elapsed().as_millis() as u64,
        Err(e) => {
            errors.push(format!("{e:#}"));
            0
        }
    };
    let after = link_transitions(&c, &host, "rail1").unwrap_or(before);
    let incidents = c.cli_json(&["incidents"])?;
    let host_down_incidents = incidents
        .as_array()
        .or_else(|| incidents["incidents"].as_array())
        .map(|a| {
            a.iter()
                .filter(|i| i["kind"] == "host_down" && i["host"] == host.as_str())
                .count()
        })
        .unwrap_or(0);
    let went_suspect = seen.iter().any(|l| l == "suspect");
    let went_down = seen.iter().any(|l| l == "down");
    if !went_suspect {
        errors.push("the host never went Suspect during the cut".into());
    }
    if went_down || host_down_incidents > 0 {
        errors.push("the host was declared Down although its peers heard it".into());
    }
    let ok = errors.is_empty();
    if !ok {
        eprintln!("[mgmt-partition] logs kept in {}", c.keep_logs().display());
    } else {
        c.tb.teardown();
    }
    Ok(MgmtPartitionReport {
        ok,
        scenario: "mgmt-partition",
        host,
        cut_ms,
        liveness_seen: seen,
        went_suspect,
        went_down,
        host_down_incidents,
        outbox_transitions: after.saturating_sub(before),
        outbox_drained: drained.is_ok(),
        ready_again_ms,
        drained_ms,
        errors,
    })
}

/// `scenario probe-blackhole`.
#[derive(Debug, Clone)]
pub struct BlackholeRun {
    pub hosts: usize,
    pub rounds: usize,
    pub hold: Duration,
    pub seed: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct BlackholeReport {
    pub ok: bool,
    pub scenario: &'static str,
    pub rounds: usize,
    /// Injection → the supervisor shows the NIC down (ms), per round.
    pub detect_ms: Vec<u64>,
    pub detect_p50_ms: u64,
    pub detect_max_ms: u64,
    /// Reattach → the supervisor shows the NIC up again (ms).
    pub recover_ms: Vec<u64>,
    pub recover_max_ms: u64,
    /// The blackholed NIC's link stayed up in netlink the whole time.
    pub netlink_stayed_up: bool,
    /// The same rail's NICs on the other hosts stayed up.
    pub others_stayed_up: bool,
    pub committed_link_down: bool,
    pub goal: &'static str,
    pub goal_met: bool,
    pub errors: Vec<String>,
}

pub async fn probe_blackhole(p: BlackholeRun) -> anyhow::Result<BlackholeReport> {
    if !(3..=16).contains(&p.hosts) || !(1..=100).contains(&p.rounds) {
        bail!("--hosts takes 3..=16 and --rounds 1..=100");
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(p.seed);
    let mut c = NetCluster::start(TestbedSpec {
        supervisors: 3,
        hosts: p.hosts,
    })
    .await?;
    wait_probing(&c, p.hosts, Duration::from_secs(40)).await?;
    let mut errors = Vec::new();
    let (mut detect, mut recover) = (Vec::new(), Vec::new());
    let (mut netlink_up, mut others_up, mut committed_link_down) = (true, true, true);
    for round in 0..p.rounds {
        let t = rng.gen_range(0..p.hosts);
        let r = rng.gen_range(0..2usize);
        let (host, nic) = (format!("h{t}"), format!("rail{r}"));
        eprintln!("[probe-blackhole] round {round}: detaching {host}/{nic} from its rail");
        c.tb.set_blackhole(t, r, true).await?;
        let t0 = Instant::now();
        let down = c
            .wait_until("the NIC down", Duration::from_secs(5), |c| {
                c.nic_state(&host, &nic).is_ok_and(|s| s == "down")
            })
            .await;
        match down {
            Ok(_) => detect.push(t0.elapsed().as_millis() as u64),
            Err(e) => {
                errors.push(format!("round {round}: {e:#}"));
                c.tb.set_blackhole(t, r, false).await?;
                break;
            }
        }
        let v = c.cli_json(&["node", "show", &host])?;
        committed_link_down &= v["host"]["nics"][&nic]["link_up"] == false;
        let ns = c.tb.hosts[t].name.clone();
        let st = c.tb.link_status(&ns, &nic).await?;
        netlink_up &= st.admin_up && st.oper_up && st.carrier;
        tokio::time::sleep(p.hold).await;
        for o in (0..p.hosts).filter(|o| *o != t) {
            let s = c.nic_state(&format!("h{o}"), &nic)?;
            if s != "up" {
                others_up = false;
                errors.push(format!(
                    "round {round}: h{o}/{nic} is {s} (only {host}'s was cut)"
                ));
            }
        }
        let st = c.tb.link_status(&ns, &nic).await?;
        netlink_up &= st.admin_up && st.oper_up && st.carrier;
        c.tb.set_blackhole(t, r, false).await?;
        let t1 = Instant::now();
        match c
            .wait_until("the NIC up again", Duration::from_secs(10), |c| {
                c.nic_state(&host, &nic).is_ok_and(|s| s == "up")
            })
            .await
        {
            Ok(_) => recover.push(t1.elapsed().as_millis() as u64),
            Err(e) => {
                errors.push(format!("round {round}: {e:#}"));
                break;
            }
        }
        eprintln!(
            "[probe-blackhole] round {round}: down after {} ms, up again {} ms after reattaching",
            detect.last().unwrap_or(&0),
            recover.last().unwrap_or(&0)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if !netlink_up {
        errors.push("netlink saw the blackholed NIC go down: the fault was not silent".into());
    }
    let mut sorted = detect.clone();
    sorted.sort_unstable();
    let detect_max_ms = sorted.last().copied().unwrap_or(0);
    let ok = errors.is_empty() && detect.len() == p.rounds && recover.len() == p.rounds;
    if !ok {
        eprintln!("[probe-blackhole] logs kept in {}", c.keep_logs().display());
    } else {
        c.tb.teardown();
    }
    Ok(BlackholeReport {
        ok,
        scenario: "probe-blackhole",
        rounds: p.rounds,
        detect_p50_ms: sorted.get(sorted.len() / 2).copied().unwrap_or(0),
        detect_max_ms,
        recover_max_ms: recover.iter().copied().max().unwrap_or(0),
        detect_ms: detect,
        recover_ms: recover,
        netlink_stayed_up: netlink_up,
        others_stayed_up: others_up,
        committed_link_down,
        goal: "Down within 1 s of the blackhole (committed state)",
        goal_met: ok && detect_max_ms <= 1_000,
        errors,
    })
}
