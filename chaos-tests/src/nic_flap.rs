//! `scenario nic-flap`: random flap patterns on random NICs of a netns
//! cluster (host side and fabric side, single flaps, storms, overlapping
//! outages on two NICs), one agent SIGKILLed and restarted, the supervisor
//! leader SIGKILLed and restarted — then the checker
//! [`check_transitions`] compares, per NIC, the committed link transitions
//! with the injected ones: every one exactly once, in order.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use serde::Serialize;

use testbed::netcluster::NetCluster;
use testbed::{Node, Side, TestbedSpec};

#[derive(Debug, Clone)]
pub struct NicFlapRun {
    pub hosts: usize,
    pub flaps: usize,
    pub seed: u64,
    /// Wait for damping to release every NIC at the end (up to 70 s).
    pub wait_quiet: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct NicFlapReport {
    pub ok: bool,
    pub scenario: &'static str,
    pub hosts: usize,
    pub flaps_injected: usize,
    pub transitions_injected: u64,
    pub transitions_committed: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub out_of_order: usize,
    pub nics_reached_flapping: usize,
    pub all_up_after_quiet: Option<bool>,
    pub agent_restarts: usize,
    pub leader_kills: usize,
}

/// Per NIC: injected transitions (count) vs. the committed sequence of link
/// states (true = up) since the baseline. Returns (lost, duplicated,
/// NICs whose committed sequence does not alternate down, up, down, ...).
pub fn check_transitions(
    injected: &BTreeMap<(String, String), u64>,
    committed: &BTreeMap<(String, String), Vec<bool>>,
) -> (u64, u64, usize) {
    let mut lost = 0;
    let mut dup = 0;
    let mut disorder = 0;
    let keys: std::collections::BTreeSet<_> = injected.keys().chain(committed.keys()).collect();
    for k in keys {
        let inj = injected.get(k).copied().unwrap_or(0);
        let seq = committed.get(k).cloned().unwrap_or_default();
        let got = seq.len() as u64;
        lost += inj.saturating_sub(got);
        dup += got.saturating_sub(inj);
        // Injection starts from up, so committed must be down, up, down, ...
        if seq.iter().enumerate().any(|(i, up)| *up != (i % 2 == 1)) {
            disorder += 1;
        }
    }
    (lost, dup, disorder)
}

/// Committed link transitions per (host, nic) from the event log, after
/// event sequence `since`.
fn committed_since(
    c: &NetCluster,
    since: u64,
) -> anyhow::Result<BTreeMap<(String, String), Vec<bool>>> {
    let v = c.cli_json(&["events", "--since", &since.to_string(), "--limit", "5000"])?;
    let mut out: BTreeMap<(String, String), Vec<bool>> = BTreeMap::new();
    for e in v["events"].as_array().cloned().unwrap_or_default() {
        // The typed event (`Event::NicLink`), not its rendered line.
        let link = &e["event"]["NicLink"];
        let (Some(nic), Some(up)) = (link["nic"].as_str(), link["up"].as_bool()) else {
            continue;
        };
        let host = e["host"].as_str().unwrap_or_default().to_string();
        out.entry((host, nic.to_string())).or_default().push(up);
    }
    Ok(out)
}

pub async fn run(cfg: NicFlapRun) -> anyhow::Result<NicFlapReport> {
    let hosts = cfg.hosts.max(2);
    eprintln!("[nic-flap] building testbed: 3 supervisors, {hosts} hosts");
    let spec = TestbedSpec {
        supervisors: 3,
        hosts,
    };
    let mut c = NetCluster::start_all_up(spec, Duration::from_secs(20)).await?;
    let nics = hosts * 2;
    let since = c.last_event_seq()?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(cfg.seed);
    let mut injected: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut stormed = std::collections::BTreeSet::new();
    let (mut agent_restarts, mut leader_kills) = (0, 0);
    let victim = rng.gen_range(0..hosts);
    let mut dead_agent: Option<(usize, usize)> = None; // (host, flap index to restart at)
    let mut flaps = 0usize;
    let mut step = 0usize;
    while flaps < cfg.flaps && step < cfg.flaps * 4 {
        step += 1;
        if flaps >= cfg.flaps / 3 && agent_restarts == 0 && dead_agent.is_none() {
            eprintln!("[nic-flap] SIGKILL the agent of h{victim}");
            c.tb.kill_node(Node::Host(victim));
            dead_agent = Some((victim, flaps + 5));
        }
        if let Some((h, at)) = dead_agent {
            if flaps >= at {
                eprintln!("[nic-flap] restart the agent of h{h}");
                c.start_agent(h)?;
                dead_agent = None;
                agent_restarts += 1;
            }
        }
        if flaps >= 2 * cfg.flaps / 3 && leader_kills == 0 {
            let l = c.leader_index()?;
            eprintln!("[nic-flap] SIGKILL the supervisor leader s{l}");
            c.tb.kill_node(Node::Supervisor(l));
            leader_kills += 1;
            tokio::time::sleep(Duration::from_millis(300)).await;
            c.start_supervisor(l)?;
        }
        // Hosts whose agent is dead are left alone (their flaps could only
        // be counted after restart, from the kernel counters).
        let host = loop {
            let h = rng.gen_range(0..hosts);
            if dead_agent.map(|(d, _)| d) != Some(h) {
                break h;
            }
        };
        let rail = rng.gen_range(0..2);
        let side = if rng.gen_bool(0.5) {
            Side::Host
        } else {
            Side::Fabric
        };
        let key = |h: usize, r: usize| (format!("h{h}"), format!("rail{r}"));
        match rng.gen_range(0..10) {
            // A storm: 3-4 quick flaps of one NIC (drives it to Flapping).
            0..=1 => {
                let n = rng.gen_range(3..=4).min(cfg.flaps - flaps).max(1);
                for _ in 0..n {
                    c.tb.set_cable(host, rail, side, false).await?;
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    c.tb.set_cable(host, rail, side, true).await?;
                    tokio::time::sleep(Duration::from_millis(30)).await;
                }
                *injected.entry(key(host, rail)).or_default() += 2 * n as u64;
                stormed.insert(key(host, rail));
                flaps += n;
            }
            // Overlapping outages of both NICs of a host, mixed sides.
            2 => {
                let other = if side == Side::Host {
                    Side::Fabric
                } else {
                    Side::Host
                };
                c.tb.set_cable(host, 0, side, false).await?;
                c.tb.set_cable(host, 1, other, false).await?;
                tokio::time::sleep(Duration::from_millis(rng.gen_range(20..150))).await;
                c.tb.set_cable(host, 0, side, true).await?;
                c.tb.set_cable(host, 1, other, true).await?;
                *injected.entry(key(host, 0)).or_default() += 2;
                *injected.entry(key(host, 1)).or_default() += 2;
                flaps += 2;
            }
            _ => {
                c.tb.set_cable(host, rail, side, false).await?;
                tokio::time::sleep(Duration::from_millis(rng.gen_range(10..300))).await;
                c.tb.set_cable(host, rail, side, true).await?;
                *injected.entry(key(host, rail)).or_default() += 2;
                flaps += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(20..200))).await;
    }
    if let Some((h, _)) = dead_agent {
        c.start_agent(h)?;
        agent_restarts += 1;
    }
    eprintln!("[nic-flap] {flaps} flaps injected; waiting for every transition to commit");
    let want: u64 = injected.values().sum();
    let _ = c
        .wait_until("all transitions committed", Duration::from_secs(30), |c| {
            committed_since(c, since)
                .map(|m| m.values().map(|v| v.len() as u64).sum::<u64>() >= want)
                .unwrap_or(false)
        })
        .await;
    // Let stragglers (duplicates, if any) arrive before counting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let committed = committed_since(&c, since)?;
    let (lost, duplicated, out_of_order) = check_transitions(&injected, &committed);
    let ev = c.cli_json(&["events", "--since", &since.to_string(), "--limit", "5000"])?;
    let reached_flapping: std::collections::BTreeSet<(String, String)> = ev["events"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|e| {
            // A NIC transition (with or without a link change) to Flapping.
            let t = ["NicLink", "NicState"]
                .iter()
                .map(|k| &e["event"][*k])
                .find(|t| t.is_object())?;
            (t["to"] == "flapping").then(|| {
                Some((
                    e["host"].as_str()?.to_string(),
                    t["nic"].as_str()?.to_string(),
                ))
            })?
        })
        .collect();
    let all_up_after_quiet = if cfg.wait_quiet {
        eprintln!("[nic-flap] quiet: waiting for damping to release every NIC");
        Some(
            c.wait_until("all NICs up", Duration::from_secs(75), |c| {
                c.nics_up() == nics
            })
            .await
            .is_ok(),
        )
    } else {
        None
    };
    let storms_flapped = stormed.iter().all(|k| reached_flapping.contains(k));
    let ok = lost == 0
        && duplicated == 0
        && out_of_order == 0
        && storms_flapped
        && all_up_after_quiet != Some(false);
    if !ok {
        eprintln!("[nic-flap] FAILED: stormed {stormed:?}, reached Flapping {reached_flapping:?}");
        eprintln!("[nic-flap] injected {injected:?}");
        eprintln!("[nic-flap] committed {committed:?}");
        let dir = c.keep_logs();
        eprintln!("[nic-flap] logs kept in {}", dir.display());
    }
    Ok(NicFlapReport {
        ok,
        scenario: "nic-flap",
        hosts,
        flaps_injected: flaps,
        transitions_injected: want,
        transitions_committed: committed.values().map(|v| v.len() as u64).sum(),
        lost,
        duplicated,
        out_of_order,
        nics_reached_flapping: reached_flapping.len(),
        all_up_after_quiet,
        agent_restarts,
        leader_kills,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checker_finds_lost_duplicated_and_reordered() {
        let k = ("h0".to_string(), "rail0".to_string());
        let inj = BTreeMap::from([(k.clone(), 4)]);
        let ok = BTreeMap::from([(k.clone(), vec![false, true, false, true])]);
        assert_eq!(check_transitions(&inj, &ok), (0, 0, 0));
        let lost = BTreeMap::from([(k.clone(), vec![false, true])]);
        assert_eq!(check_transitions(&inj, &lost), (2, 0, 0));
        let dup = BTreeMap::from([(k.clone(), vec![false, true, false, true, false, true])]);
        assert_eq!(check_transitions(&inj, &dup), (0, 2, 0));
        let disorder = BTreeMap::from([(k, vec![true, false, false, true])]);
        assert_eq!(check_transitions(&inj, &disorder).2, 1);
    }
}
