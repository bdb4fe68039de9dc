//! Connection placement and failover orders end to end: real supervisors
//! and a real agent in network namespaces, and a fake job speaking the job
//! contract (`rdma::contract::ContractClient`) over the agent's real Unix
//! socket. Needs root; fails instead of skipping when `CI` is set.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdma::contract::{ClientOptions, ConnUp, ContractClient, Order, OrderKind};
use testbed::netcluster::NetCluster;
use testbed::{require_root, Node, TestbedSpec};
use tokio::sync::{mpsc, watch};

const WAIT: Duration = Duration::from_secs(20);

/// A job that records every order it gets and, unless held, moves the
/// connections (`conn_moved` each) and answers ok.
struct FakeJob {
    client: ContractClient,
    seen: Arc<Mutex<Vec<Order>>>,
    hold: watch::Sender<bool>,
    arrived: mpsc::UnboundedReceiver<Order>,
}

impl FakeJob {
    async fn start(socket: &std::path::Path) -> FakeJob {
        let (client, mut orders) = ContractClient::connect_rank(
            socket,
            "train",
            0,
            ClientOptions {
                connect_within: WAIT,
                ..Default::default()
            },
        )
        .await
        .expect("the agent's control socket answers");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (hold, mut held) = watch::channel(false);
        let (arrived_tx, arrived) = mpsc::unbounded_channel();
        let (c, s) = (client.clone(), seen.clone());
        tokio::spawn(async move {
            while let Some(o) = orders.next().await {
                s.lock().unwrap().push(o.clone());
                let _ = arrived_tx.send(o.clone());
                let _ = held.wait_for(|h| !*h).await;
                let mut n = 0;
                if let OrderKind::Migrate { conn_ids, to_nic } = &o.kind {
                    for id in conn_ids {
                        let to = to_nic.as_deref().unwrap_or("rail1");
                        c.conn_moved(*id, to).await.expect("conn_moved");
                        n += 1;
                    }
                }
                c.order_done(o.order_id, true, &format!("job moved {n}"))
                    .await
                    .expect("order_done");
            }
        });
        FakeJob {
            client,
            seen,
            hold,
            arrived,
        }
    }

    async fn next_order(&mut self) -> Order {
        tokio::time::timeout(WAIT, self.arrived.recv())
            .await
            .expect("an order reaches the job")
            .expect("job running")
    }

    fn orders_seen(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

fn conn(conn_id: u64, nic: &str, rail: u32) -> ConnUp {
    ConnUp {
        job: "train".into(),
        rank: 0,
        conn_id,
        nic: nic.into(),
        peer_host: "h7".into(),
        peer_rank: 1,
        rail,
    }
}

fn migrate(o: &Order) -> (Vec<u64>, Option<String>) {
    match &o.kind {
        OrderKind::Migrate { conn_ids, to_nic } => {
            let mut ids = conn_ids.clone();
            ids.sort_unstable();
            (ids, to_nic.clone())
        }
        k => panic!("expected a migrate order, got {k:?}"),
    }
}

/// (conn_id, nic, moved) of h0's connections, per `qp list`.
fn placements(c: &NetCluster) -> anyhow::Result<Vec<(u64, String, bool)>> {
    let v = c.cli_json(&["qp", "list", "--host", "h0", "--job", "train"])?;
    let mut out: Vec<_> = v["qps"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|q| {
                    (
                        q["conn_id"].as_u64().unwrap_or(0),
                        q["nic"].as_str().unwrap_or("?").to_string(),
                        q["moved"].as_bool().unwrap_or(false),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    Ok(out)
}

fn all_on(c: &NetCluster, ids: &[u64], nic: &str, moved: bool) -> bool {
    placements(c).is_ok_and(|p| {
        ids.iter()
            .all(|id| p.iter().any(|(i, n, m)| i == id && n == nic && *m == moved))
    })
}

/// The intent's status string ("open", or the outcome) and detail.
fn intent(c: &NetCluster, id: u64) -> Option<(String, String)> {
    let v = c.cli_json(&["intents"]).ok()?;
    let i = v["intents"]
        .as_array()?
        .iter()
        .find(|i| i["id"].as_u64() == Some(id))?
        .clone();
    let status = match &i["status"] {
        serde_json::Value::String(s) => s.clone(),
        other => other["closed"].to_string().trim_matches('"').to_string(),
    };
    Some((status, i["detail"].as_str().unwrap_or("").to_string()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_orders_reach_the_job_once_across_leader_loss() {
    if !require_root("qp_orders::failover_orders").unwrap() {
        return;
    }
    let spec = TestbedSpec {
        supervisors: 3,
        hosts: 1,
    };
    let mut c = NetCluster::start_all_up(spec, WAIT).await.unwrap();

    // The job registers three connections on rail0 and one on rail1.
    let mut job = FakeJob::start(&c.control_socket(0)).await;
    for id in 1..=3 {
        job.client.conn_up(conn(id, "rail0", 0)).await.unwrap();
    }
    job.client.conn_up(conn(4, "rail1", 1)).await.unwrap();
    let e = job.client.conn_up(conn(5, "eth9", 0)).await.unwrap_err();
    assert!(e.to_string().contains("not a data NIC"), "{e}");
    c.wait_until("the placements in qp list", WAIT, |c| {
        all_on(c, &[1, 2, 3], "rail0", false) && all_on(c, &[4], "rail1", false)
    })
    .await
    .unwrap();
    let table = c.cli(&["qp", "list"]).unwrap();
    assert!(table.starts_with("HOST"), "{table}");
    assert!(table.contains("train") && table.contains("h7/1"), "{table}");

    // Bad orders are refused and write nothing.
    for (args, want) in [
        (vec!["nic", "failover", "h9", "rail0"], "not found"),
        (vec!["nic", "failover", "h0", "rail7"], "not found"),
        (
            vec!["nic", "failover", "h0", "rail0", "--to", "rail0"],
            "is the NIC being failed over",
        ),
        (
            vec!["nic", "failover", "h0", "rail0", "--to", "mgmt0"],
            "is not a NIC of host",
        ),
    ] {
        let e = c.cli(&args).unwrap_err().to_string();
        assert!(e.contains(want), "{args:?}: {e}");
    }
    // Refused commands record no intent (each host's detour order, with
    // its standby sets, is the leader's own).
    let v = c.cli_json(&["intents"]).unwrap();
    let others: Vec<_> = v["intents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["action"].get("Reroute").is_none())
        .collect();
    assert!(others.is_empty(), "{v}");

    // Failover: the job gets one migrate order for exactly the connections
    // on rail0, answers, and the CLI (waiting) sees the intent done.
    let out = tokio::task::block_in_place(|| {
        c.cli_json(&["nic", "failover", "h0", "rail0", "--to", "rail1"])
    })
    .unwrap();
    assert_eq!(out["status"]["closed"], "Done", "{out}");
    assert!(
        out["detail"]
            .as_str()
            .unwrap()
            .contains("3 connections moved off rail0 to rail1"),
        "{out}"
    );
    let o = job.next_order().await;
    assert_eq!(migrate(&o), (vec![1, 2, 3], Some("rail1".into())));
    c.wait_until("connections 1-3 moved to rail1", WAIT, |c| {
        all_on(c, &[1, 2, 3], "rail1", true)
    })
    .await
    .unwrap();

    // Failback: the same three come home; connection 4 (home rail1) stays.
    let out =
        tokio::task::block_in_place(|| c.cli_json(&["nic", "failback", "h0", "rail0"])).unwrap();
    assert_eq!(out["status"]["closed"], "Done", "{out}");
    let o = job.next_order().await;
    assert_eq!(migrate(&o), (vec![1, 2, 3], Some("rail0".into())));
    c.wait_until("connections 1-3 back on rail0", WAIT, |c| {
        all_on(c, &[1, 2, 3], "rail0", false) && all_on(c, &[4], "rail1", false)
    })
    .await
    .unwrap();
    assert_eq!(job.orders_seen(), 2);

    // A failover whose answer cannot reach the supervisor: the job holds
    // its answer until h0's management link is down and the leader is
    // dead, then answers. The agent stores the outcome, fails to report it,
    // and the new leader re-sends the open order when the link is back: the
    // agent answers from its record and the job is not ordered again.
    job.hold.send_replace(true);
    let v = c
        .cli_json(&["nic", "failover", "h0", "rail0", "--no-wait"])
        .unwrap();
    let id = v["id"].as_u64().expect("intent id");
    let o = job.next_order().await;
    assert_eq!(migrate(&o), (vec![1, 2, 3], Some("rail1".into())));
    c.tb.set_mgmt(Node::Host(0), false).await.unwrap();
    let leader = c.leader_index().unwrap();
    c.tb.kill_node(Node::Supervisor(leader));
    job.hold.send_replace(false);
    // Longer than the agent offers an outcome to the leader (2 s).
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        intent(&c, id).map(|i| i.0).as_deref(),
        Some("open"),
        "the outcome has not reached the cluster yet"
    );
    c.tb.set_mgmt(Node::Host(0), true).await.unwrap();
    c.wait_until("the intent closed by the new leader", WAIT, |c| {
        intent(c, id).is_some_and(|(s, _)| s == "Done")
    })
    .await
    .unwrap();
    let (_, detail) = intent(&c, id).unwrap();
    assert!(detail.contains("3 connections moved"), "{detail}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        job.orders_seen(),
        3,
        "the repeated order id was not executed again"
    );
    c.start_supervisor(leader).unwrap();

    // The reflex: rail1 loses carrier; the agent orders every connection
    // still on it to rail0 by itself, and the outcome lands in the events.
    c.wait_until("connections 1-3 on rail1", WAIT, |c| {
        all_on(c, &[1, 2, 3, 4], "rail1", false) || all_on(c, &[1, 2, 3], "rail1", true)
    })
    .await
    .unwrap();
    c.tb.set_fabric_link(0, 1, false).await.unwrap();
    let o = job.next_order().await;
    assert_eq!(migrate(&o), (vec![1, 2, 3, 4], Some("rail0".into())));
    c.wait_until("the reflex recorded", WAIT, |c| {
        c.cli(&["events", "--limit", "1000"])
            .is_ok_and(|e| e.contains("reflex: NIC rail1 down, 4 connections ordered off it: done"))
    })
    .await
    .unwrap();
    c.wait_until("every connection on rail0", WAIT, |c| {
        all_on(c, &[1, 2, 3], "rail0", false) && all_on(c, &[4], "rail0", true)
    })
    .await
    .unwrap();
    c.tb.set_fabric_link(0, 1, true).await.unwrap();
    assert_eq!(job.orders_seen(), 4);
    if std::env::var_os("RAILGUARD_KEEP").is_some() {
        eprintln!("kept logs in {}", c.keep_logs().display());
    }
}
