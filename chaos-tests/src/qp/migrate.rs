//! The `qp-migrate` scenario: two hosts stream self-checking messages over
//! resilient connections while NICs flap on both ends, both NICs of one
//! host go down for a while and an agent is restarted; nothing may be
//! lost, duplicated, reordered or corrupted, and `qp list` must match
//! every connection's NIC afterwards (the placement checker).

use std::sync::atomic::Ordering;
use std::time::Duration;

use rand::{Rng, SeedableRng};

use super::traffic::{
    drain, totals, wait_established, AgentLink, HostTraffic, Sizes, Totals, TrafficSpec,
};

/// `scenario qp-migrate` settings.
#[derive(Debug, Clone)]
pub struct QpMigrateRun {
    pub flaps: usize,
    pub conns: usize,
    pub max_message: usize,
    pub seed: u64,
    /// Keep both NICs of one host down this long once (stall, then resume).
    pub outage: Duration,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct QpMigrateReport {
    pub ok: bool,
    pub scenario: &'static str,
    pub flaps: usize,
    pub connections: usize,
    #[serde(flatten)]
    pub totals: Totals,
    pub both_nics_down_ms: u64,
    pub agent_restarts: usize,
    /// Migrate orders the agents sent the job (their reflex on NIC down).
    pub agent_migrate_orders: u64,
    /// Moves the job reported to its agent.
    pub moves_reported: u64,
    /// `qp list` (Raft) matches every connection's NIC after the quiet.
    pub placements_match: bool,
    pub errors: Vec<String>,
}

/// Runs the scenario.
pub async fn qp_migrate(cfg: QpMigrateRun) -> anyhow::Result<QpMigrateReport> {
    use testbed::netcluster::NetCluster;
    use testbed::{Node, Side as CableSide, TestbedSpec};
    let mut rng = rand::rngs::StdRng::seed_from_u64(cfg.seed);
    eprintln!("[qp-migrate] building 1 supervisor + 2 hosts (agents running)");
    let mut nc = NetCluster::start(TestbedSpec {
        supervisors: 1,
        hosts: 2,
    })
    .await?;
    let spec = TrafficSpec {
        conns: cfg.conns,
        sizes: Sizes::Mixed {
            max: cfg.max_message,
        },
        rate_per_conn: Some(4 << 20),
        both_ways: true,
        failback: true,
        window_bytes: (32 << 20).max(2 * cfg.max_message),
        stall_timeout: Duration::from_secs(30),
        seed: cfg.seed,
        agent: None,
    };
    let with_agent = |h: usize| TrafficSpec {
        agent: Some(AgentLink {
            socket: nc.control_socket(h),
            job: JOB.into(),
        }),
        ..spec.clone()
    };
    let a = HostTraffic::start(nc.tb.ns(Node::Host(0)), 0, 1, with_agent(0))?;
    let b = HostTraffic::start(nc.tb.ns(Node::Host(1)), 1, 0, with_agent(1))?;
    anyhow::ensure!(
        wait_established(&a, &b, Duration::from_secs(15)).await,
        "connections did not come up: {:?}",
        a.errors.lock().expect("errors")
    );
    eprintln!("[qp-migrate] {} connections up; flapping", cfg.conns);
    let mut agent_restarts = 0;
    let outage_at = cfg.flaps / 3;
    let agent_at = 2 * cfg.flaps / 3;
    for i in 0..cfg.flaps {
        if i == outage_at && !cfg.outage.is_zero() {
            eprintln!(
                "[qp-migrate] both NICs of h1 down for {:?} (stall, then resume)",
                cfg.outage
            );
            nc.tb.set_cable(1, 0, CableSide::Host, false).await?;
            nc.tb.set_cable(1, 1, CableSide::Fabric, false).await?;
            tokio::time::sleep(cfg.outage).await;
            nc.tb.set_cable(1, 1, CableSide::Fabric, true).await?;
            nc.tb.set_cable(1, 0, CableSide::Host, true).await?;
        }
        if i == agent_at {
            eprintln!("[qp-migrate] SIGKILL and restart the agent of h0");
            nc.tb.kill_node(Node::Host(0));
            nc.start_agent(0)?;
            agent_restarts += 1;
        }
        let host = rng.gen_range(0..2);
        let rail = rng.gen_range(0..2);
        let side = if rng.gen_bool(0.5) {
            CableSide::Host
        } else {
            CableSide::Fabric
        };
        nc.tb.set_cable(host, rail, side, false).await?;
        tokio::time::sleep(Duration::from_millis(rng.gen_range(20..400))).await;
        nc.tb.set_cable(host, rail, side, true).await?;
        tokio::time::sleep(Duration::from_millis(rng.gen_range(50..300))).await;
        if (i + 1) % 20 == 0 {
            let t = totals(&a, &b);
            eprintln!(
                "[qp-migrate] {} flaps: {} messages delivered, {} migrations",
                i + 1,
                t.messages,
                t.migrations
            );
        }
    }
    // The cluster's record of every connection's NIC (reported by the
    // agents, one of them restarted, through Raft) must match where each
    // connection ended up.
    eprintln!("[qp-migrate] checking the QP placements in the supervisor");
    let placements_match = nc
        .wait_until(
            "QP placements match the connections",
            Duration::from_secs(20),
            |nc| check_placements(nc, &[&a, &b]).is_ok(),
        )
        .await
        .is_ok();
    let placement_error = if placements_match {
        None
    } else {
        Some(format!(
            "qp list disagrees with the connections: {}",
            check_placements(&nc, &[&a, &b]).err().unwrap_or_default()
        ))
    };
    eprintln!("[qp-migrate] quiet: draining every connection");
    let drained = drain(&a, &b, Duration::from_secs(60)).await;
    let t = totals(&a, &b);
    let mut errors: Vec<String> = a.errors.lock().expect("errors").clone();
    errors.extend(b.errors.lock().expect("errors").iter().cloned());
    if !drained {
        errors.push("not every message arrived within 60 s of the quiet period".into());
    }
    errors.extend(placement_error);
    let migrate_orders = [&a, &b]
        .iter()
        .map(|h| h.contract.migrate_orders.load(Ordering::Relaxed))
        .sum();
    let moves_reported = [&a, &b]
        .iter()
        .map(|h| h.contract.moves_reported.load(Ordering::Relaxed))
        .sum();
    a.join();
    b.join();
    let ok = errors.is_empty()
        && t.lost == 0
        && t.duplicated == 0
        && t.reordered == 0
        && t.bad_checksum == 0
        && t.messages > 0
        && t.migrations > 0
        && placements_match;
    if !ok {
        let dir = nc.keep_logs();
        eprintln!("[qp-migrate] FAILED; logs kept in {}", dir.display());
    }
    Ok(QpMigrateReport {
        ok,
        scenario: "qp-migrate",
        flaps: cfg.flaps,
        connections: cfg.conns,
        totals: t,
        both_nics_down_ms: cfg.outage.as_millis() as u64,
        agent_restarts,
        agent_migrate_orders: migrate_orders,
        moves_reported,
        placements_match,
        errors,
    })
}

/// Job name the scenario's connections register under.
const JOB: &str = "qp-migrate";

/// Placement checker: every connection of `hosts` appears in `qp list` on
/// the NIC it is on now. The error names the first disagreement.
fn check_placements(
    nc: &testbed::netcluster::NetCluster,
    hosts: &[&HostTraffic],
) -> Result<(), String> {
    let v = nc
        .cli_json(&["qp", "list", "--job", JOB])
        .map_err(|e| e.to_string())?;
    let rows = v["qps"].as_array().cloned().unwrap_or_default();
    for h in hosts {
        let host = format!("h{}", h.host);
        for (c, st) in h.conn_stats().iter().enumerate() {
            let conn_id = 1000 + c as u64;
            let want = st.rail.map(|r| format!("rail{r}"));
            let got = rows
                .iter()
                .find(|q| q["host"] == host.as_str() && q["conn_id"].as_u64() == Some(conn_id))
                .and_then(|q| q["nic"].as_str().map(str::to_owned));
            if want.is_none() || got != want {
                return Err(format!(
                    "{host} conn {conn_id}: recorded {got:?}, actual {want:?}"
                ));
            }
        }
    }
    Ok(())
}
