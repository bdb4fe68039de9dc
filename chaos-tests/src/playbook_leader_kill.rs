//! `scenario playbook-leader-kill`: multi-step playbooks survive leader
//! crashes, and no action runs twice.
//!
//! A netns cluster (3 supervisors, 4 hosts) runs with the shipped playbooks
//! the first leader installs. Agents damp flaps with a short half-life, so a
//! NIC that flaps three times is suppressed (Flapping) for a few seconds.
//! Each wave flaps one rail on several hosts at once: each flap storm opens
//! a `nic_flapping` incident whose `nic-flapping` run has three steps — an
//! agent order (`migrate_qps` off the NIC), a wait until the damper says
//! the NIC is reusable, and another agent order (`failback`). At a random
//! moment of the wave the leader is SIGKILLed and restarted on its data
//! directory: a new leader must resume every open step intent, re-sending
//! the same order id, and the agent must answer a repeat from its order log.
//!
//! **Checker.** Every agent appends each order it executes (not the repeats
//! it answers from its log) to its execution journal (`executed.jsonl`).
//! After the last wave the journals of all hosts are read: an order id
//! executed more than once is a duplicated action. Every `nic_flapping` run
//! must be Completed (a run that failed, was cancelled or is still active
//! is lost), and every agent-order step of a completed run must appear in
//! its host's journal exactly once. `nic_down` incidents opened by the
//! first flap of a storm have their own runs, cancelled when the link
//! returns (the incident's condition cleared): those are counted, not
//! judged, but their orders are checked for duplicates like all others.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rand::{Rng, SeedableRng};
use serde::Serialize;

use supervisor::model::{Action, Intent, IntentStatus, Outcome, StepOp};
use testbed::netcluster::NetCluster;
use testbed::{Node, TestbedSpec};

use crate::admin_history::{HistoryVerdict, NsHistory};
use crate::splits::PartitionKind;

/// Hosts of the cluster.
const HOSTS: usize = 4;
/// Down/up phases of one flap, and flaps per storm (3 flaps × 1000 > the
/// suppress threshold of 2000).
const FLAP_DOWN: Duration = Duration::from_millis(250);
const FLAP_UP: Duration = Duration::from_millis(250);
const FLAPS: usize = 3;
/// Every agent waits this long before executing an order (the test-only
/// `--test-order-delay-ms`: a slow action), so kills land while orders are
/// in flight.
const ORDER_DELAY_MS: u64 = 800;
/// Agents' damping: suppressed for about half_life × log2(3000 / 750)
/// = 6 s after a storm, so every run spends a while in its wait step.
const AGENT_CONFIG: &str = r#"
[damping]
penalty_per_flap = 1000.0
half_life = "3s"
suppress = 2000.0
reuse = 750.0
max_suppress = "20s"
"#;

#[derive(Debug, Clone)]
pub struct LeaderKillRun {
    /// Playbooks to run to completion (each one a `nic_flapping` incident).
    pub rounds: usize,
    /// Incidents per wave (hosts flapping at once), 1..=4.
    pub parallel: usize,
    pub seed: u64,
    /// Longest a wave may take to complete.
    pub wave_timeout: Duration,
    /// What befalls the leader once a wave.
    pub fault: LeaderFault,
    /// Admin clients writing and reading (simulated) hosts throughout, from
    /// the last host's namespace, checked for durability and
    /// linearizability at the end (0: none).
    pub history_clients: usize,
}

/// What befalls the leader once a wave.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LeaderFault {
    /// SIGKILL, restarted on its data directory 0.2–1.5 s later.
    Kill,
    /// SIGSTOP this long, then SIGCONT: it wakes up believing it leads,
    /// with its agents' order streams still open.
    Pause(Duration),
    /// The management network split around it this long, then healed; the
    /// kind of split cycles wave by wave ([`PartitionKind`]). The CLI runs
    /// from the last host, which is never cut.
    Partition(Duration),
}

impl Default for LeaderKillRun {
    fn default() -> Self {
        Self {
            rounds: 50,
            parallel: 4,
            seed: 7,
            wave_timeout: Duration::from_secs(90),
            fault: LeaderFault::Kill,
            history_clients: 0,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct LeaderKillReport {
    pub ok: bool,
    pub scenario: &'static str,
    pub rounds: usize,
    pub waves: usize,
    pub playbooks_completed: usize,
    /// Order ids executed more than once (journal entries beyond the first).
    pub duplicated_actions: usize,
    /// `nic_flapping` runs that did not complete (nor, under a split, were
    /// cancelled because the NIC settled before the run could act).
    pub lost: usize,
    /// `nic_flapping` runs cancelled because their incident cleared first
    /// (under a split only; left out of the report when none).
    #[serde(skip_serializing_if = "is_zero")]
    pub cancelled: usize,
    pub leader_kills: usize,
    /// Kills that found at least one run mid-playbook (active).
    pub kills_mid_playbook: usize,
    /// Active runs at the moment of each kill, summed.
    pub runs_active_at_kills: usize,
    /// Runs at an agent-order step with its order open at the moment of
    /// each kill, summed.
    pub orders_in_flight_at_kills: usize,
    /// Orders executed by agents (journal entries, all hosts).
    pub orders_executed: usize,
    /// Agent-order steps of completed `nic_flapping` runs with no journal
    /// entry (an action the run claims but no agent did).
    pub missing_actions: usize,
    /// `nic_down` runs (first flap of each storm): completed / cancelled.
    pub nic_down_runs_completed: usize,
    pub nic_down_runs_cancelled: usize,
    /// From incident opened to run completed, ms.
    pub playbook_ms_p50: u64,
    pub playbook_ms_max: u64,
    pub wall_s: f64,
    pub errors: Vec<String>,
    /// Partitions made, per kind (with [`LeaderFault::Partition`]).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub partitions: BTreeMap<PartitionKind, usize>,
    /// Partitions at whose end the majority had another leader.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader_moved: Option<usize>,
    /// The admin history's verdict (with `history_clients`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history: Option<HistoryVerdict>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// One run as `railguard playbook runs --output json` shows it.
#[derive(Debug, Clone)]
struct RunSeen {
    id: u64,
    incident: u64,
    kind: String,
    host: String,
    state: String,
    started_ms: u64,
    ended_ms: Option<u64>,
    /// Step intents whose closing line says an order was done.
    order_intents: Vec<u64>,
    step_id: String,
    step_intent: Option<u64>,
}

impl RunSeen {
    fn active(&self) -> bool {
        matches!(self.state.as_str(), "running" | "waiting")
    }

    /// At an agent-order step whose intent (the order) is open.
    fn order_in_flight(&self) -> bool {
        self.state == "running"
            && matches!(self.step_id.as_str(), "move-off" | "failback")
            && self.step_intent.is_some()
    }
}

/// Per run id, the intents of its agent-order steps (failover, failback)
/// that closed Done, from the typed intents (`intents -o json`).
fn done_order_steps(c: &NetCluster) -> anyhow::Result<BTreeMap<u64, Vec<u64>>> {
    let v = c.cli_json(&["intents", "--limit", "5000"])?;
    let intents: Vec<Intent> =
        serde_json::from_value(v["intents"].clone()).context("intents in the reply")?;
    Ok(order_steps_of(intents))
}

/// Per run id, the ids of its Done agent-order step intents.
fn order_steps_of(intents: Vec<Intent>) -> BTreeMap<u64, Vec<u64>> {
    let mut out: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for i in intents {
        if let Action::PlaybookStep { run, op, .. } = &i.action {
            let order = matches!(op, StepOp::Failover { .. } | StepOp::Failback { .. });
            if order && i.status == IntentStatus::Closed(Outcome::Done) {
                out.entry(*run).or_default().push(i.id);
            }
        }
    }
    out
}

/// The leader a quorum confirms (a linearizable `cluster members`: a
/// deposed leader cut off from the others cannot answer it, where `status`
/// gives each supervisor's own belief).
fn quorum_leader(c: &NetCluster) -> Option<usize> {
    let v = c.cli_json(&["cluster", "members"]).ok()?;
    let id = v["members"]
        .as_array()?
        .iter()
        .find(|m| m["leader"] == true)?["id"]
        .as_u64()?;
    usize::try_from(id).ok()?.checked_sub(1)
}

fn runs(c: &NetCluster) -> anyhow::Result<Vec<RunSeen>> {
    let v = c.cli_json(&["playbook", "runs"])?;
    let arr = v["runs"].as_array().context("no runs in the reply")?;
    // Only the checker needs the order steps; the polling loop does not.
    runs_of(arr, &BTreeMap::new())
}

/// The runs with their order steps: `seen` (collected wave by wave, since
/// the cluster keeps and returns only the newest intents) and what the
/// cluster has now.
fn runs_with_orders(
    c: &NetCluster,
    seen: &mut BTreeMap<u64, Vec<u64>>,
) -> anyhow::Result<Vec<RunSeen>> {
    seen.extend(done_order_steps(c)?);
    let orders = seen.clone();
    let v = c.cli_json(&["playbook", "runs"])?;
    let arr = v["runs"].as_array().context("no runs in the reply")?;
    runs_of(arr, &orders)
}

fn runs_of(
    arr: &[serde_json::Value],
    orders: &BTreeMap<u64, Vec<u64>>,
) -> anyhow::Result<Vec<RunSeen>> {
    let mut out = Vec::new();
    for r in arr {
        let state = match &r["state"] {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Object(o) => o.keys().next().cloned().unwrap_or_default(),
            _ => String::new(),
        };
        let id = r["id"].as_u64().unwrap_or(0);
        let order_intents = orders.get(&id).cloned().unwrap_or_default();
        out.push(RunSeen {
            id,
            incident: r["incident"].as_u64().unwrap_or(0),
            kind: r["incident_kind"].as_str().unwrap_or_default().to_owned(),
            host: r["host"].as_str().unwrap_or_default().to_owned(),
            state,
            started_ms: r["started_ms"].as_u64().unwrap_or(0),
            ended_ms: r["ended_ms"].as_u64(),
            order_intents,
            step_id: r["step_id"].as_str().unwrap_or_default().to_owned(),
            step_intent: r["step_intent"].as_u64(),
        });
    }
    Ok(out)
}

fn journal_ids(c: &NetCluster, h: usize) -> anyhow::Result<Vec<u64>> {
    let dir = c.run_dir.path().join(format!("h{h}"));
    Ok(nodeagent::journal::read_journal(&dir)?
        .into_iter()
        .map(|e| e.order_id)
        .collect())
}

pub async fn playbook_leader_kill(p: LeaderKillRun) -> anyhow::Result<LeaderKillReport> {
    if p.rounds == 0 || p.rounds > 1_000 {
        bail!("--rounds takes 1..=1000");
    }
    if !(1..=HOSTS).contains(&p.parallel) {
        bail!("--parallel takes 1..={HOSTS}");
    }
    let t_start = Instant::now();
    let mut rng = rand::rngs::StdRng::seed_from_u64(p.seed);
    let cfg_dir = tempfile::tempdir()?;
    let cfg = cfg_dir.path().join("agent.toml");
    std::fs::write(&cfg, AGENT_CONFIG)?;
    let agent_args = (0..HOSTS)
        .map(|_| {
            vec![
                "--config".to_string(),
                cfg.display().to_string(),
                "--test-order-delay-ms".to_string(),
                ORDER_DELAY_MS.to_string(),
            ]
        })
        .collect();
    let mut c = NetCluster::start_with(
        TestbedSpec {
            supervisors: 3,
            hosts: HOSTS,
        },
        agent_args,
    )
    .await?;
    let r = run_waves(&mut c, &p, &mut rng, t_start).await;
    if !r.as_ref().is_ok_and(|r| r.ok) {
        c.keep_run_dir();
    }
    r
}

async fn run_waves(
    c: &mut NetCluster,
    p: &LeaderKillRun,
    rng: &mut rand::rngs::StdRng,
    t_start: Instant,
) -> anyhow::Result<LeaderKillReport> {
    c.wait_until("every host Ready", Duration::from_secs(30), |c| {
        c.cli_json(&["node", "list"]).is_ok_and(|v| {
            v["hosts"]
                .as_array()
                .is_some_and(|h| h.len() == HOSTS && h.iter().all(|x| x["liveness"] == "ready"))
        })
    })
    .await?;
    let shipped = playbooks::SHIPPED.len();
    c.wait_until(
        "the shipped playbooks installed",
        Duration::from_secs(20),
        |c| {
            c.cli_json(&["playbook", "list"]).is_ok_and(|v| {
                v["playbooks"]
                    .as_array()
                    .is_some_and(|a| a.len() == shipped)
            })
        },
    )
    .await?;
    // Partitions never cut the last host: the CLI and the admin clients
    // run from there.
    let client_node = Node::Host(HOSTS - 1);
    if matches!(p.fault, LeaderFault::Partition(_)) {
        c.set_cli_node(client_node);
    }
    let history = match p.history_clients {
        0 => None,
        n => Some(NsHistory::start(c, client_node, n, p.seed)?),
    };
    let mut partitions: BTreeMap<PartitionKind, usize> = BTreeMap::new();
    let mut leader_moved = 0;
    let mut order_steps: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let mut errors = Vec::new();
    let mut kills = 0;
    let mut kills_mid = 0;
    let mut active_at_kills = 0;
    let mut orders_in_flight_at_kills = 0;
    let mut done = 0;
    let mut wave = 0;
    while done < p.rounds {
        let n = p.parallel.min(p.rounds - done);
        let rail = wave % 2;
        let mut hosts: Vec<usize> = (0..HOSTS).collect();
        // A different subset every wave.
        for i in (1..hosts.len()).rev() {
            hosts.swap(i, rng.gen_range(0..=i));
        }
        hosts.truncate(n);
        hosts.sort_unstable();
        let before: BTreeSet<u64> = runs(c)?.iter().map(|r| r.id).collect();
        eprintln!("[playbook-leader-kill] wave {wave}: flapping rail{rail} of {hosts:?}");
        // Even waves: the kill lands while an order is in flight (its
        // intent open: sent, executing, or done but not yet committed).
        // Odd waves: anywhere from the storm to well into the wait.
        let in_flight_kill = wave % 2 == 0;
        let kill_at = Duration::from_millis(rng.gen_range(300..6_000));
        let kill_lag = Duration::from_millis(rng.gen_range(0..ORDER_DELAY_MS + 300));
        let mut in_flight_seen: Option<Instant> = None;
        let t0 = Instant::now();
        let mut killed = false;
        for _ in 0..FLAPS {
            for &h in &hosts {
                c.tb.set_host_nic(h, rail, false).await?;
            }
            tokio::time::sleep(FLAP_DOWN).await;
            for &h in &hosts {
                c.tb.set_host_nic(h, rail, true).await?;
            }
            tokio::time::sleep(FLAP_UP).await;
        }
        // Wait for this wave's nic_flapping runs to end; kill on the way.
        let deadline = t0 + p.wave_timeout;
        let mut wave_runs: Vec<RunSeen>;
        loop {
            let due = if in_flight_kill {
                if in_flight_seen.is_none()
                    && runs(c).is_ok_and(|rs| {
                        rs.iter()
                            .any(|r| !before.contains(&r.id) && r.order_in_flight())
                    })
                {
                    in_flight_seen = Some(Instant::now());
                }
                in_flight_seen.is_some_and(|t| t.elapsed() >= kill_lag)
                    || t0.elapsed() >= p.wave_timeout / 2
            } else {
                t0.elapsed() >= kill_at
            };
            if !killed && due {
                killed = true;
                match c.leader_index() {
                    Ok(l) => {
                        let (active, in_flight) = runs(c)
                            .map(|rs| {
                                let mine = || rs.iter().filter(|r| !before.contains(&r.id));
                                (
                                    mine().filter(|r| r.active()).count(),
                                    mine().filter(|r| r.order_in_flight()).count(),
                                )
                            })
                            .unwrap_or((0, 0));
                        let what = match p.fault {
                            LeaderFault::Kill => "SIGKILL leader".to_string(),
                            LeaderFault::Pause(_) => "SIGSTOP leader".to_string(),
                            LeaderFault::Partition(_) => {
                                format!(
                                    "{:?} partition around leader",
                                    PartitionKind::of_wave(wave)
                                )
                            }
                        };
                        eprintln!(
                            "[playbook-leader-kill] wave {wave}: {what} s{l} at {:?} ({}; {active} runs active, {in_flight} orders in flight)",
                            t0.elapsed(),
                            humantime::format_rfc3339_millis(std::time::SystemTime::now())
                        );
                        match p.fault {
                            LeaderFault::Pause(pause) => {
                                if c.tb.signal_node(Node::Supervisor(l), libc::SIGSTOP) == 0 {
                                    errors.push(format!(
                                        "wave {wave}: s{l} was not running to pause"
                                    ));
                                }
                                tokio::time::sleep(pause).await;
                                c.tb.signal_node(Node::Supervisor(l), libc::SIGCONT);
                                eprintln!("[playbook-leader-kill] wave {wave}: s{l} resumed after {pause:?}");
                            }
                            LeaderFault::Partition(hold) => {
                                let kind = PartitionKind::of_wave(wave);
                                let cuts = kind.cuts(l, c.tb.spec.supervisors, HOSTS);
                                c.tb.set_mgmt_cuts(&cuts).await?;
                                tokio::time::sleep(hold).await;
                                // The majority must have moved on (proof
                                // the cut was real) before it heals.
                                let now_leader = quorum_leader(c);
                                c.tb.set_mgmt_cuts(&[]).await?;
                                *partitions.entry(kind).or_default() += 1;
                                if now_leader.is_some_and(|n| n != l) {
                                    leader_moved += 1;
                                }
                                eprintln!(
                                    "[playbook-leader-kill] wave {wave}: leader {now_leader:?} before healing after {hold:?} ({})",
                                    humantime::format_rfc3339_millis(std::time::SystemTime::now())
                                );
                            }
                            LeaderFault::Kill => {
                                c.tb.kill_node(Node::Supervisor(l));
                                tokio::time::sleep(Duration::from_millis(
                                    rng.gen_range(200..1_500),
                                ))
                                .await;
                                c.start_supervisor(l)?;
                            }
                        }
                        kills += 1;
                        active_at_kills += active;
                        if active > 0 {
                            kills_mid += 1;
                        }
                        orders_in_flight_at_kills += in_flight;
                    }
                    Err(e) => errors.push(format!("wave {wave}: no leader to kill: {e}")),
                }
            }
            wave_runs = runs(c)
                .unwrap_or_default()
                .into_iter()
                .filter(|r| !before.contains(&r.id) && r.kind == "nic_flapping")
                .collect();
            let ended = wave_runs.len() >= n && wave_runs.iter().all(|r| !r.active());
            if killed && ended {
                break;
            }
            if Instant::now() > deadline {
                errors.push(format!(
                    "wave {wave}: {} of {n} nic_flapping runs ended within {:?}",
                    wave_runs.iter().filter(|r| !r.active()).count(),
                    p.wave_timeout
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let completed = wave_runs.iter().filter(|r| r.state == "completed").count();
        eprintln!(
            "[playbook-leader-kill] wave {wave}: {completed}/{n} completed in {:?}",
            t0.elapsed()
        );
        done += n;
        // This wave's order steps, while they are among the newest intents.
        if let Ok(o) = done_order_steps(c) {
            order_steps.extend(o);
        }
        wave += 1;
        // Every NIC back Up before the next wave (the damper released it).
        c.wait_until("every NIC up", Duration::from_secs(60), |c| {
            (0..HOSTS).all(|h| {
                (0..2).all(|r| {
                    c.nic_state(&format!("h{h}"), &format!("rail{r}"))
                        .is_ok_and(|s| s == "up")
                })
            })
        })
        .await?;
    }

    let history = match history {
        Some(h) => Some(h.finish()?),
        None => None,
    };
    for (host, text) in history.iter().flat_map(|h| &h.failed_histories) {
        // Kept for diagnosis (with the run directory), one op per line.
        let path = c.run_dir.path().join(format!("history-{host}.txt"));
        if std::fs::write(&path, text).is_ok() {
            errors.push(format!(
                "admin history of {host} not linearizable: {}",
                path.display()
            ));
        }
    }
    // The checker.
    let all = runs_with_orders(c, &mut order_steps)?;
    let flapping: Vec<&RunSeen> = all.iter().filter(|r| r.kind == "nic_flapping").collect();
    let completed: Vec<&RunSeen> = flapping
        .iter()
        .copied()
        .filter(|r| r.state == "completed")
        .collect();
    // A split can keep a host's agent from the leader until its NIC has
    // settled: the incident closes (the condition cleared) before the
    // playbook could act, and its run is cancelled by design. Under the
    // other faults every run must complete.
    let cancelled_ok = matches!(p.fault, LeaderFault::Partition(_));
    let cancelled = flapping.iter().filter(|r| r.state == "cancelled").count();
    let lost = p
        .rounds
        .saturating_sub(completed.len() + if cancelled_ok { cancelled } else { 0 });
    let incidents: BTreeMap<u64, u64> = c.cli_json(&["incidents"]).map_or_else(
        |_| BTreeMap::new(),
        |v| {
            v["incidents"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|i| Some((i["id"].as_u64()?, i["opened_ms"].as_u64()?)))
                .collect()
        },
    );
    let mut took: Vec<u64> = completed
        .iter()
        .filter_map(|r| {
            let opened = incidents.get(&r.incident).copied().unwrap_or(r.started_ms);
            Some(r.ended_ms?.saturating_sub(opened))
        })
        .collect();
    took.sort_unstable();
    let mut executed: BTreeMap<u64, usize> = BTreeMap::new();
    let mut by_host: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    let mut orders_executed = 0;
    for h in 0..HOSTS {
        for id in journal_ids(c, h)? {
            *executed.entry(id).or_default() += 1;
            by_host.entry(format!("h{h}")).or_default().insert(id);
            orders_executed += 1;
        }
    }
    let duplicated: usize = executed.values().map(|n| n - 1).sum();
    for (id, n) in &executed {
        if *n > 1 {
            errors.push(format!("order {id} executed {n} times"));
        }
    }
    let mut missing = 0;
    for r in &completed {
        for id in &r.order_intents {
            if !by_host.get(&r.host).is_some_and(|s| s.contains(id)) {
                missing += 1;
                errors.push(format!(
                    "run {} on {}: order step intent {id} done but not in the agent's journal",
                    r.id, r.host
                ));
            }
        }
        if r.order_intents.len() < 2 {
            errors.push(format!(
                "run {} on {}: {} order steps done (want move-off and failback)",
                r.id,
                r.host,
                r.order_intents.len()
            ));
        }
    }
    for r in flapping
        .iter()
        .filter(|r| r.state != "completed" && !(cancelled_ok && r.state == "cancelled"))
    {
        errors.push(format!(
            "run {} ({} on {}) ended {}",
            r.id, r.kind, r.host, r.state
        ));
    }
    let nic_down = |s: &str| {
        all.iter()
            .filter(|r| r.kind == "nic_down" && r.state == s)
            .count()
    };
    let history_ok = history.as_ref().is_none_or(HistoryVerdict::ok);
    let ok = errors.is_empty()
        && lost == 0
        && duplicated == 0
        && missing == 0
        && kills == wave
        && history_ok;
    Ok(LeaderKillReport {
        ok,
        scenario: "playbook-leader-kill",
        rounds: p.rounds,
        waves: wave,
        playbooks_completed: completed.len(),
        duplicated_actions: duplicated,
        lost,
        cancelled,
        leader_kills: kills,
        kills_mid_playbook: kills_mid,
        runs_active_at_kills: active_at_kills,
        orders_in_flight_at_kills,
        orders_executed,
        missing_actions: missing,
        nic_down_runs_completed: nic_down("completed"),
        nic_down_runs_cancelled: nic_down("cancelled"),
        playbook_ms_p50: took.get(took.len() / 2).copied().unwrap_or(0),
        playbook_ms_max: took.last().copied().unwrap_or(0),
        wall_s: t_start.elapsed().as_secs_f64(),
        errors,
        leader_moved: (!partitions.is_empty()).then_some(leader_moved),
        partitions,
        history,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_steps_are_the_done_failover_and_failback_intents_of_each_run() {
        let step = |id: u64, run: u64, op: StepOp, status: IntentStatus| Intent {
            id,
            action: Action::PlaybookStep {
                run,
                step: 0,
                attempt: 0,
                host: "h0".into(),
                op,
            },
            status,
            opened_ms: 0,
            closed_ms: None,
            detail: String::new(),
        };
        let failover = || StepOp::Failover {
            nic: "rail0".into(),
            to: "rail1".into(),
        };
        let failback = || StepOp::Failback {
            nic: "rail0".into(),
        };
        let done = IntentStatus::Closed(Outcome::Done);
        let failed = IntentStatus::Closed(Outcome::Failed {
            error: "timeout".into(),
        });
        let got = order_steps_of(vec![
            step(12, 1, failover(), done.clone()),
            step(13, 1, StepOp::Cordon, done.clone()),
            step(14, 1, failback(), done.clone()),
            step(15, 2, failover(), failed),
            step(16, 2, failover(), IntentStatus::Open),
            step(17, 2, failover(), done),
        ]);
        assert_eq!(got, BTreeMap::from([(1, vec![12, 14]), (2, vec![17])]));
    }
}
