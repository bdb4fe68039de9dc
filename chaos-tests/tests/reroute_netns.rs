//! Detour routes (`nodeagent::reroute`) on the real kernel inside the
//! testbed (needs root; fails instead of skipping when `CI` is set): the
//! agent's `Reroute` set is applied idempotently, replaced by a newer set,
//! tagged so another's routes are never touched, flushed without a trace;
//! and an established TCP connection between two hosts keeps moving data
//! through the detours while one host's rail0 cable is pulled, with no
//! reconnect; the reflex installs a NIC's standby detours and holds them
//! across orders while it is down; and in a real cluster whose only
//! supervisor is dead, a host whose cable is pulled still installs its
//! own part of the detours by itself.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nodeagent::reroute::{Rerouter, DETOUR_RTO_MIN_MS, RTPROT_RAILGUARD};
use proto::agent::{RouteVia, Standby};
use testbed::netcluster::NetCluster;
use testbed::{rail_addr, require_root, Node, Side, Testbed, TestbedSpec};

async fn hosts(n: usize) -> Testbed {
    Testbed::build(TestbedSpec {
        supervisors: 0,
        hosts: n,
    })
    .await
    .expect("build testbed")
}

/// Host `to`'s rail0 address via its rail1 address, through rail1.
fn detour(to: usize) -> RouteVia {
    RouteVia {
        dst: rail_addr(to, 0),
        via: rail_addr(to, 1),
        dev: "rail1".into(),
    }
}

/// `ip route show` inside host `h`.
fn ip_routes(tb: &Testbed, h: usize) -> String {
    let out = tb
        .ns(Node::Host(h))
        .command("ip")
        .unwrap()
        .args(["route", "show"])
        .output()
        .expect("ip route");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detour_routes_apply_idempotently_and_leave_nothing() {
    if !require_root("detour_routes_apply_idempotently_and_leave_nothing").unwrap() {
        return;
    }
    let tb = hosts(3).await;
    let r = Rerouter::new(tb.ns(Node::Host(0)).netlink().unwrap());
    let both = vec![detour(1), detour(2)];
    let a = r.apply(&both).await.unwrap();
    assert_eq!((a.installed, a.removed, a.kept), (2, 0, 0));
    assert_eq!(r.current().await.unwrap(), both);
    let shown = ip_routes(&tb, 0);
    let line = shown
        .lines()
        .find(|l| l.starts_with(&format!("{} ", rail_addr(1, 0))))
        .unwrap_or_else(|| panic!("no detour in:\n{shown}"));
    assert!(
        line.contains(&format!("via {} dev rail1", rail_addr(1, 1)))
            && line.contains(&format!("proto {RTPROT_RAILGUARD}"))
            && line.contains(&format!("rto_min lock {DETOUR_RTO_MIN_MS}ms")),
        "{line}"
    );
    // The same set again changes nothing; a smaller set removes the rest.
    let a = r.apply(&both).await.unwrap();
    assert_eq!((a.installed, a.removed, a.kept), (0, 0, 2));
    let a = r.apply(&both[..1]).await.unwrap();
    assert_eq!((a.installed, a.removed, a.kept), (0, 1, 1));
    assert_eq!(r.current().await.unwrap(), both[..1].to_vec());
    // Someone else's route to the same kind of place is not ours.
    let st = tb
        .ns(Node::Host(0))
        .command("ip")
        .unwrap()
        .args(["route", "add", "10.250.0.1/32", "via"])
        .arg(rail_addr(2, 1).to_string())
        .args(["dev", "rail1", "proto", "static"])
        .status()
        .unwrap();
    assert!(st.success());
    // A set naming a NIC this host lacks: the rest is installed, the
    // answer says what was not.
    let mut bad = both.clone();
    bad.push(RouteVia {
        dst: Ipv4Addr::new(10, 201, 0, 9),
        via: Ipv4Addr::new(10, 202, 0, 9),
        dev: "rail7".into(),
    });
    let e = r.apply(&bad).await.unwrap_err().to_string();
    assert!(e.contains("1 of 3") && e.contains("rail7"), "{e}");
    assert_eq!(r.current().await.unwrap(), both);
    let (ok, detail) = r.execute(&[], &[]).await;
    assert!(ok, "{detail}");
    assert!(r.current().await.unwrap().is_empty());
    r.apply(&both).await.unwrap();
    assert_eq!(r.flush().await.unwrap(), 2);
    let shown = ip_routes(&tb, 0);
    assert!(
        !shown.contains(&format!("proto {RTPROT_RAILGUARD}")),
        "{shown}"
    );
    assert!(
        shown.contains("10.250.0.1 via"),
        "the other route stays:\n{shown}"
    );
    // The fabric routes: the kernel's connected routes get rto_min, once.
    let rails = ["rail0".to_string(), "rail1".to_string()];
    assert_eq!(r.tune_fabric(&rails, 10).await.unwrap(), 2);
    assert_eq!(r.tune_fabric(&rails, 10).await.unwrap(), 0, "already right");
    let shown = ip_routes(&tb, 0);
    for rail in 0..2 {
        let line = shown
            .lines()
            .find(|l| l.contains(&format!("dev rail{rail} proto kernel")))
            .unwrap_or_else(|| panic!("no connected route of rail{rail}:\n{shown}"));
        assert!(line.contains("rto_min lock 10ms"), "{line}");
    }
    assert_eq!(r.tune_fabric(&rails, 0).await.unwrap(), 2);
    assert!(!ip_routes(&tb, 0).contains("rto_min"), "taken off again");
}

/// Bytes a reader in one namespace has taken from a writer in another.
struct Flow {
    got: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Flow {
    /// A TCP connection from host `from`'s rail0 address to host `to`'s,
    /// with a writer on `from` pushing 16 KiB chunks and a reader on `to`
    /// counting.
    fn start(tb: &Testbed, from: usize, to: usize, port: u16) -> Flow {
        let server = SocketAddr::from((rail_addr(to, 0), port));
        let listener = tb
            .ns(Node::Host(to))
            .run(move || TcpListener::bind(server))
            .unwrap()
            .expect("listen on rail0");
        let client = tb
            .ns(Node::Host(from))
            .run(move || TcpStream::connect_timeout(&server, Duration::from_secs(5)))
            .unwrap()
            .expect("connect");
        let (mut conn, peer) = listener.accept().unwrap();
        assert_eq!(peer.ip(), rail_addr(from, 0), "the flow starts on rail0");
        let got = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (g, s) = (got.clone(), stop.clone());
        conn.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 65_536];
            while !s.load(Ordering::Relaxed) {
                match conn.read(&mut buf) {
                    Ok(0) => return,
                    Ok(n) => {
                        g.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    Err(_) => {}
                }
            }
        });
        let s = stop.clone();
        let mut client = client;
        client
            .set_write_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        std::thread::spawn(move || {
            let chunk = vec![7u8; 16_384];
            while !s.load(Ordering::Relaxed) {
                match client.write(&chunk) {
                    Ok(_) => {}
                    Err(e)
                        if e.kind() == std::io::ErrorKind::WouldBlock
                            || e.kind() == std::io::ErrorKind::TimedOut => {}
                    Err(_) => return,
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        Flow { got, stop }
    }

    /// Whether the reader gets more bytes within `within`.
    async fn moves(&self, within: Duration) -> bool {
        let before = self.got.load(Ordering::Relaxed);
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if self.got.load(Ordering::Relaxed) > before + 65_536 {
                return true;
            }
        }
        false
    }
}

impl Drop for Flow {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_connection_carries_on_through_detours_while_its_cable_is_out() {
    if !require_root("a_tcp_connection_carries_on_through_detours_while_its_cable_is_out").unwrap()
    {
        return;
    }
    let mut tb = hosts(2).await;
    // Both ways: into the host whose cable is pulled, and out of it (its
    // segments in flight when the cable goes are retransmitted over the
    // detour).
    let flow = Flow::start(&tb, 0, 1, 47_001);
    let back = Flow::start(&tb, 1, 0, 47_002);
    assert!(
        flow.moves(Duration::from_secs(5)).await,
        "flow never started"
    );
    assert!(
        back.moves(Duration::from_secs(5)).await,
        "flow never started"
    );
    // Pull host 1's rail0 cable (fabric side: h1 sees carrier loss).
    tb.set_cable(1, 0, Side::Fabric, false).await.unwrap();
    assert!(
        !flow.moves(Duration::from_secs(1)).await,
        "without detours the connection is stalled"
    );
    // The detours the supervisor would order: h0 reaches h1's rail0
    // address through h1's rail1; h1 reaches h0's rail0 address through
    // h0's rail1.
    let r0 = Rerouter::new(tb.ns(Node::Host(0)).netlink().unwrap());
    let r1 = Rerouter::new(tb.ns(Node::Host(1)).netlink().unwrap());
    r0.apply(&[detour(1)]).await.unwrap();
    r1.apply(&[detour(0)]).await.unwrap();
    assert!(
        flow.moves(Duration::from_secs(10)).await,
        "the same connection moves data through rail1 while the cable is out"
    );
    assert!(
        back.moves(Duration::from_secs(10)).await,
        "and so does the one out of the host whose cable is out"
    );
    // Cable back, detours gone (the failback): still the same connection.
    tb.set_cable(1, 0, Side::Fabric, true).await.unwrap();
    r0.flush().await.unwrap();
    r1.flush().await.unwrap();
    assert!(
        flow.moves(Duration::from_secs(10)).await,
        "the connection carries on over rail0 again"
    );
    assert!(back.moves(Duration::from_secs(10)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reflex_holds_standby_detours_while_the_nic_is_down() {
    if !require_root("the_reflex_holds_standby_detours_while_the_nic_is_down").unwrap() {
        return;
    }
    let tb = hosts(3).await;
    let r = Rerouter::new(tb.ns(Node::Host(0)).netlink().unwrap());
    let standby = vec![Standby {
        nic: "rail0".into(),
        routes: vec![detour(1), detour(2)],
    }];
    // No standby set for a NIC: the reflex does nothing.
    assert!(r.reflex_down("rail0").await.is_none());
    let (ok, detail) = r.execute(&[], &standby).await;
    assert!(ok, "{detail}");
    assert!(
        r.current().await.unwrap().is_empty(),
        "standby is not installed"
    );
    let a = r
        .reflex_down("rail0")
        .await
        .expect("a standby set")
        .unwrap();
    assert_eq!(a.installed, 2);
    assert_eq!(r.current().await.unwrap(), vec![detour(1), detour(2)]);
    assert!(r.reflex_down("rail0").await.is_none(), "held already");
    // An order computed before the leader knew (its set empty) keeps the
    // held routes while the NIC is down; a set of its own joins them.
    let (ok, detail) = r.execute(&[], &standby).await;
    assert!(ok, "{detail}");
    assert_eq!(r.current().await.unwrap(), vec![detour(1), detour(2)]);
    // Up again: held until the next order, which then decides alone.
    r.link_up("rail0").await;
    assert_eq!(r.current().await.unwrap(), vec![detour(1), detour(2)]);
    let (ok, detail) = r.execute(&[detour(2)], &standby).await;
    assert!(ok, "{detail}");
    assert_eq!(r.current().await.unwrap(), vec![detour(2)]);
    let (ok, _) = r.execute(&[], &standby).await;
    assert!(ok);
    assert!(r.current().await.unwrap().is_empty());
    // A flush forgets the standby sets too.
    r.flush().await.unwrap();
    assert!(r.reflex_down("rail0").await.is_none());
}

/// Whether every host's agent confirmed a detour order with standby sets.
fn standby_confirmed(c: &NetCluster, hosts: usize) -> bool {
    let Ok(v) = c.cli_json(&["intents", "--limit", "1000"]) else {
        return false;
    };
    let Some(intents) = v["intents"].as_array() else {
        panic!("`railguard intents -o json` is not a list of intents: {v}");
    };
    (0..hosts).all(|h| {
        intents.iter().any(|i| {
            i["action"]["Reroute"]["host"] == format!("h{h}")
                && i["status"] != "open"
                // Only a carried-out order says this.
                && i["detail"]
                    .as_str()
                    .is_some_and(|d| d.contains("standby for 2 NIC(s)"))
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_installs_its_own_detours_when_its_cable_goes_without_a_leader() {
    if !require_root("a_host_installs_its_own_detours_when_its_cable_goes_without_a_leader")
        .unwrap()
    {
        return;
    }
    let mut c = NetCluster::start_all_up(
        TestbedSpec {
            supervisors: 1,
            hosts: 3,
        },
        Duration::from_secs(90),
    )
    .await
    .unwrap();
    c.wait_until(
        "every agent confirmed its standby detours",
        Duration::from_secs(60),
        |c| standby_confirmed(c, 3),
    )
    .await
    .unwrap();
    // No leader from now on: nobody can order anything.
    c.tb.kill_node(Node::Supervisor(0));
    let h1 = Rerouter::new(c.tb.ns(Node::Host(1)).netlink().unwrap());
    assert!(h1.current().await.unwrap().is_empty());
    c.tb.set_cable(1, 0, Side::Fabric, false).await.unwrap();
    // h1 reaches its peers' rail0 addresses through their rail1 ones.
    let t0 = Instant::now();
    let mut routes = Vec::new();
    while t0.elapsed() < Duration::from_secs(10) {
        routes = h1.current().await.unwrap();
        if !routes.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(routes, vec![detour(0), detour(2)], "the reflex's detours");
    // The peers' part needs the leader: h0 has none.
    let h0 = Rerouter::new(c.tb.ns(Node::Host(0)).netlink().unwrap());
    assert!(h0.current().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_failover_short() {
    // The short form of `bench tcp-failover`: the whole system (one
    // supervisor, two agents) installs the detours by itself. Each cable
    // stays out 3 s; without detours the stream would stall at least that
    // long, so a gap well under it shows the detours carried it.
    if !require_root("tcp_failover_short").unwrap() {
        return;
    }
    let r = chaos_tests::tcp_failover::run(chaos_tests::tcp_failover::TcpFailoverRun {
        pulls: 2,
        down: Duration::from_secs(3),
        mbit: 100,
        supervisors: 1,
        baseline: Duration::from_secs(2),
        keep_logs: false,
        congestion: "cubic".into(),
    })
    .await
    .unwrap();
    assert!(r.ok, "{r:?}");
    assert!(r.iperf3_ok, "iperf3 kept its connection: {r:?}");
    assert!(r.gap_max_ms < 1500.0, "{r:?}");
    assert!(r.throughput_ratio > 0.5, "{r:?}");
}
