//! Real agents in network namespaces reporting real link changes to a real
//! supervisor cluster (needs root; fails instead of skipping when `CI` is set).

use std::time::Duration;

use testbed::netcluster::NetCluster;
use testbed::{require_root, Node, TestbedSpec};

const WAIT: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nic_flaps_reach_the_cluster_through_agents_and_failures() {
    if !require_root("agent_netns::nic_flaps").unwrap() {
        return;
    }
    let spec = TestbedSpec {
        supervisors: 3,
        hosts: 2,
    };
    let mut c = NetCluster::start_all_up(spec, WAIT).await.unwrap();

    // Fabric-side cable flap (carrier loss) on h1/rail0: Down, incident, Up.
    c.tb.set_fabric_link(1, 0, false).await.unwrap();
    c.wait_until("h1/rail0 down", WAIT, |c| {
        c.nic_state("h1", "rail0").is_ok_and(|s| s == "down")
    })
    .await
    .unwrap();
    let inc = c.cli_json(&["incidents", "--open"]).unwrap();
    assert!(
        inc["incidents"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["kind"] == "nic_down" && i["host"] == "h1"),
        "{inc}"
    );
    c.tb.set_fabric_link(1, 0, true).await.unwrap();
    c.wait_until("h1/rail0 up", WAIT, |c| {
        c.nic_state("h1", "rail0").is_ok_and(|s| s == "up")
    })
    .await
    .unwrap();

    // Host-side admin down on h0/rail1, while the leader is SIGKILLed.
    let leader = c.leader_index().unwrap();
    c.tb.kill_node(Node::Supervisor(leader));
    c.tb.set_host_nic(0, 1, false).await.unwrap();
    c.wait_until("h0/rail1 down via the new leader", WAIT, |c| {
        c.nic_state("h0", "rail1").is_ok_and(|s| s == "down")
    })
    .await
    .unwrap();
    c.start_supervisor(leader).unwrap();
    c.tb.set_host_nic(0, 1, true).await.unwrap();
    c.wait_until("h0/rail1 up", WAIT, |c| {
        c.nic_state("h0", "rail1").is_ok_and(|s| s == "up")
    })
    .await
    .unwrap();

    // A storm drives the NIC to Flapping (suppressed).
    for _ in 0..3 {
        c.tb.set_fabric_link(1, 1, false).await.unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
        c.tb.set_fabric_link(1, 1, true).await.unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    c.wait_until("h1/rail1 suppressed", WAIT, |c| {
        c.nic_state("h1", "rail1")
            .is_ok_and(|s| s == "recovering" || s == "flapping")
    })
    .await
    .unwrap();
    let v = c.cli_json(&["node", "show", "h1"]).unwrap();
    assert!(
        v["host"]["nics"]["rail1"]["flaps"].as_u64().unwrap() >= 3,
        "{v}"
    );

    // Agent killed (host silent): Suspect then Down; restarted: Ready, and
    // its outbox resumes where the cluster left off.
    c.tb.kill_node(Node::Host(0));
    c.wait_until("h0 down", WAIT, |c| {
        c.cli_json(&["node", "show", "h0"])
            .is_ok_and(|v| v["host"]["liveness"] == "down")
    })
    .await
    .unwrap();
    c.start_agent(0).unwrap();
    c.wait_until("h0 ready", WAIT, |c| {
        c.cli_json(&["node", "show", "h0"])
            .is_ok_and(|v| v["host"]["liveness"] == "ready")
    })
    .await
    .unwrap();
    let names = c.tb.namespace_names();
    drop(c);
    for n in names {
        assert!(testbed::netns::list(&n).is_empty(), "{n} left behind");
    }
}

/// Short form of `railguard-chaos scenario nic-flap`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nic_flap_scenario_short() {
    if !require_root("agent_netns::nic_flap_short").unwrap() {
        return;
    }
    let r = chaos_tests::nic_flap::run(chaos_tests::nic_flap::NicFlapRun {
        hosts: 2,
        flaps: 15,
        seed: 5,
        wait_quiet: true,
    })
    .await
    .unwrap();
    assert!(r.ok, "{r:?}");
    assert_eq!((r.lost, r.duplicated, r.out_of_order), (0, 0, 0));
    assert_eq!(r.transitions_committed, r.transitions_injected);
    assert_eq!(r.agent_restarts, 1);
    assert_eq!(r.leader_kills, 1);
    assert_eq!(r.all_up_after_quiet, Some(true));
}
