//! The netns testbed against the real kernel (needs root; fails instead of
//! skipping when `CI` is set).

use std::io::{Read, Write};
use std::time::Duration;

use testbed::{
    netns, rail_addr, require_root, sweep, FlapPattern, Node, Side, Testbed, TestbedSpec, OWNER_DIR,
};

async fn wait_status(tb: &mut Testbed, ns: &str, link: &str, carrier: bool) -> testbed::LinkStatus {
    for _ in 0..100 {
        let s = tb.link_status(ns, link).await.unwrap();
        if s.carrier == carrier {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{ns}/{link} never reached carrier={carrier}");
}

/// Opens a TCP connection from host `a`'s rail to host `b`'s rail and
/// echoes one message, each end in its own namespace.
fn tcp_roundtrip(tb: &Testbed, a: usize, b: usize, rail: usize) -> std::io::Result<()> {
    let to = rail_addr(b, rail);
    let listener = tb
        .ns(Node::Host(b))
        .run(move || std::net::TcpListener::bind((to, 0)))??;
    let port = listener.local_addr()?.port();
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = listener.accept()?;
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf)?;
        s.write_all(&buf)
    });
    let mut c = tb.ns(Node::Host(a)).run(move || {
        std::net::TcpStream::connect_timeout(&(to, port).into(), Duration::from_secs(2))
    })??;
    c.write_all(b"hello")?;
    let mut back = [0u8; 5];
    c.read_exact(&mut back)?;
    server.join().unwrap()?;
    assert_eq!(&back, b"hello");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builds_topology_carries_traffic_injects_faults_and_cleans_up() {
    if !require_root("testbed::builds_topology").unwrap() {
        return;
    }
    let mut tb = Testbed::build(TestbedSpec {
        supervisors: 1,
        hosts: 2,
    })
    .await
    .unwrap();
    let names = tb.namespace_names();
    assert_eq!(names.len(), 4);
    for n in &names {
        assert!(netns::list(n).contains(n), "{n} exists");
    }
    tcp_roundtrip(&tb, 0, 1, 0).unwrap();
    tcp_roundtrip(&tb, 1, 0, 1).unwrap();

    // Fabric-side cable flap: the host sees carrier loss, counted.
    let h0 = tb.hosts[0].name.clone();
    let before = tb.link_status(&h0, "rail0").await.unwrap();
    assert!(before.oper_up && before.carrier && before.admin_up);
    tb.set_fabric_link(0, 0, false).await.unwrap();
    let down = wait_status(&mut tb, &h0, "rail0", false).await;
    assert!(
        down.admin_up && !down.oper_up,
        "admin up, carrier lost: {down:?}"
    );
    assert!(
        tcp_roundtrip(&tb, 0, 1, 0).is_err(),
        "no traffic over a dead cable"
    );
    tb.set_fabric_link(0, 0, true).await.unwrap();
    let up = wait_status(&mut tb, &h0, "rail0", true).await;
    assert!(
        up.carrier_changes >= before.carrier_changes + 2,
        "{before:?} -> {up:?}"
    );
    tcp_roundtrip(&tb, 0, 1, 0).unwrap();

    // Host-side NIC flap: admin down.
    tb.set_host_nic(0, 1, false).await.unwrap();
    let s = tb.link_status(&h0, "rail1").await.unwrap();
    assert!(!s.admin_up);
    tb.set_host_nic(0, 1, true).await.unwrap();
    wait_status(&mut tb, &h0, "rail1", true).await;

    // A storm of 3 fabric-side flaps is counted by the kernel.
    let before = tb.link_status(&h0, "rail0").await.unwrap();
    let storm = FlapPattern {
        host: 0,
        rail: 0,
        side: Side::Fabric,
        count: 3,
        down: Duration::from_millis(20),
        gap: Duration::from_millis(20),
        jitter: Duration::from_millis(5),
    };
    tb.flap_storm(&storm).await.unwrap();
    let after = wait_status(&mut tb, &h0, "rail0", true).await;
    assert!(
        after.carrier_changes >= before.carrier_changes + 6,
        "{before:?} -> {after:?}"
    );

    // Management partition and host loss take carrier off the host's links.
    tb.set_mgmt(Node::Host(1), false).await.unwrap();
    let h1 = tb.hosts[1].name.clone();
    wait_status(&mut tb, &h1, "mgmt0", false).await;
    tb.set_mgmt(Node::Host(1), true).await.unwrap();
    wait_status(&mut tb, &h1, "mgmt0", true).await;
    tb.lose_host(0).await.unwrap();
    for l in ["mgmt0", "rail0", "rail1"] {
        wait_status(&mut tb, &h0, l, false).await;
    }

    // A process inside a namespace sees only that namespace's links.
    let mut cmd = tb.command(Node::Host(1), "/bin/sleep").unwrap();
    cmd.arg("30");
    let pid = tb.spawn_command(Node::Host(1), cmd).unwrap();
    let link = std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
    let ours = std::fs::read_link("/proc/self/ns/net").unwrap();
    assert_ne!(link, ours, "child runs in the host namespace");

    tb.teardown();
    for n in &names {
        assert!(netns::list(n).is_empty(), "{n} removed");
    }
    assert!(
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.contains(" Z "))
            .unwrap_or(true),
        "process killed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panic_inside_a_run_still_removes_everything() {
    if !require_root("testbed::panic_cleanup").unwrap() {
        return;
    }
    let tb = Testbed::build(TestbedSpec {
        supervisors: 0,
        hosts: 1,
    })
    .await
    .unwrap();
    let names = tb.namespace_names();
    let r = tokio::spawn(async move {
        let _tb = tb;
        panic!("scenario failed");
    })
    .await;
    assert!(r.is_err());
    for n in &names {
        assert!(netns::list(n).is_empty(), "{n} removed after panic");
    }
}

#[test]
fn sweeper_removes_leftovers_of_dead_runs_only() {
    if !require_root("testbed::sweeper").unwrap() {
        return;
    }
    // A dead run: namespace plus an owner file naming a pid that is gone.
    let dead_prefix = format!("rgz{:04}", std::process::id() % 10_000);
    std::fs::create_dir_all(OWNER_DIR).unwrap();
    let mut child = std::process::Command::new("/bin/true").spawn().unwrap();
    let dead_pid = child.id();
    child.wait().unwrap();
    std::fs::write(
        format!("{OWNER_DIR}/{dead_prefix}.owner"),
        dead_pid.to_string(),
    )
    .unwrap();
    let dead = netns::Netns::create(&format!("{dead_prefix}-h0")).unwrap();
    drop(dead);
    // A live run: owned by us.
    let live_prefix = format!("rgy{:04}", std::process::id() % 10_000);
    std::fs::write(
        format!("{OWNER_DIR}/{live_prefix}.owner"),
        std::process::id().to_string(),
    )
    .unwrap();
    let _live = netns::Netns::create(&format!("{live_prefix}-h0")).unwrap();

    let removed = sweep();
    assert!(
        removed.contains(&format!("{dead_prefix}-h0")),
        "{removed:?}"
    );
    assert!(
        !netns::list(&format!("{live_prefix}-")).is_empty(),
        "a live run is left alone"
    );
    netns::delete(&format!("{live_prefix}-h0")).unwrap();
    let _ = std::fs::remove_file(format!("{OWNER_DIR}/{live_prefix}.owner"));
}
