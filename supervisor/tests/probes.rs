//! The probe mesh's supervisor side against real processes: probe plans
//! from the replicated graph, probe summaries validated (bad ones change
//! nothing), the leader's clock solution committed as clock states, and the
//! `clock` / `paths` admin reads (leader memory: forwarded by a follower,
//! Unavailable without a leader).

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{agent, cli, free_port, Sup, SUPERVISOR};
use proto::v1::{Nic, PathStats, PeerClock, ProbePlanRequest, ProbeSummary, RegisterHost};
use supervisor::api::{AdminReply, AdminRequest};
use supervisor::model::events::Event;
use supervisor::model::ClockState;

fn nic(name: &str, rail: Option<u32>, addr: &str) -> Nic {
    Nic {
        name: name.into(),
        rail,
        addr: addr.into(),
        ..Default::default()
    }
}

/// Host `i` with a management NIC and two data NICs (rails 0 and 1).
async fn register(addr: &str, i: u32) -> Result<(), tonic::Status> {
    agent(addr, &format!("h{i}"))
        .await
        .register(RegisterHost {
            host: format!("h{i}"),
            nics: vec![
                nic("eth0", None, &format!("192.168.0.{i}")),
                nic("rail0", Some(0), &format!("10.0.0.{i}")),
                nic("rail1", Some(1), &format!("10.0.1.{i}")),
            ],
            labels: Default::default(),
            agent_version: "test".into(),
        })
        .await
        .map(|_| ())
}

const T0: i64 = 1_700_000_000_000_000_000;
/// True offsets of h0..h2 (h0 is the reference), ns.
const OFFSETS: [f64; 3] = [0.0, 2_000.0, -750.0];

/// What host `me` reports about both peers on both rails: exact offsets
/// (error bound 200 ns), a +300 ns biased NTP estimate, and one second of
/// each incoming path (true OWD 10 µs, pair line exact).
fn summary(me: usize) -> ProbeSummary {
    let mut clocks = Vec::new();
    let mut paths = Vec::new();
    for peer in (0..3).filter(|&p| p != me) {
        for rail in 0..2u32 {
            let offset = OFFSETS[peer] - OFFSETS[me];
            clocks.push(PeerClock {
                peer: format!("h{peer}"),
                rail,
                at_ns: T0 + OFFSETS[me] as i64,
                offset_ns: offset,
                drift_ppb: 0.0,
                error_bound_ns: 200.0,
                drift_error_ppb: 1.0,
                samples: 200,
                has_ntp: true,
                ntp_at_ns: T0 + OFFSETS[me] as i64,
                ntp_offset_ns: offset + 300.0,
                ntp_rtt_ns: 20_000,
            });
            paths.push(PathStats {
                peer: format!("h{peer}"),
                rail,
                nic: format!("rail{rail}"),
                peer_nic: format!("rail{rail}"),
                expected: 100,
                received: 99,
                delays: 99,
                min_ns: 10_000,
                p50_ns: 11_000 + 1_000 * peer as i64,
                p99_ns: 15_000 + 1_000 * peer as i64,
                line_at_ns: T0 + OFFSETS[me] as i64,
                line_offset_ns: offset,
                corrected: true,
            });
        }
    }
    ProbeSummary {
        host: format!("h{me}"),
        sent_ns: T0 + OFFSETS[me] as i64,
        plan_version: 3,
        clocks,
        paths,
        bytes_sent: 1_000,
        shaped: Vec::new(),
        // h2's probe thread is over its budget and governed down.
        pairs_per_s: if me == 2 { 62 } else { 100 },
        max_pairs_per_s: 100,
        probe_cpu_pct: Some(if me == 2 { 0.93 } else { 0.4 }),
        probe_cpu_budget_pct: 1.0,
    }
}

/// Runs the CLI with `--output json`; (exit code, parsed stdout, stderr).
fn cli_json(addr: &str, args: &[&str]) -> (i32, serde_json::Value, String) {
    let mut all = args.to_vec();
    all.extend(["--output", "json"]);
    let out = cli(addr, &all);
    let v = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (
        out.status.code().unwrap_or(-1),
        v,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_summaries_clock_states_and_paths() {
    let sup = Sup::start(&[]).await;
    for i in 0..3 {
        register(&sup.addr, i).await.expect("register");
    }

    // A NIC address that is not an IP address: refused, nothing written.
    let mut c = agent(&sup.addr, "h9").await;
    let e = c
        .register(RegisterHost {
            host: "h9".into(),
            nics: vec![nic("rail0", Some(0), "10.0.0.300")],
            labels: Default::default(),
            agent_version: "test".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("NIC \"rail0\"") && e.message().contains("not an IP address"),
        "{e:?}"
    );
    let AdminReply::Hosts { hosts } = sup
        .client()
        .call(AdminRequest::NodeList, false)
        .await
        .unwrap()
    else {
        panic!("not a host list")
    };
    assert_eq!(hosts.len(), 3);
    assert_eq!(
        hosts.iter().map(|h| h.id).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );

    // Probe plans: the complete graph for three hosts, data NICs only.
    // Each agent asks for its own (its certificate names the host).
    let plan = agent(&sup.addr, "h1")
        .await
        .get_probe_plan(ProbePlanRequest { host: "h1".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((plan.host_id, plan.version), (1, 3));
    let peers: Vec<_> = plan
        .peers
        .iter()
        .map(|p| (p.host.as_str(), p.host_id))
        .collect();
    assert_eq!(peers, vec![("h0", 0), ("h2", 2)]);
    let nics: Vec<_> = plan.peers[1]
        .nics
        .iter()
        .map(|n| (n.rail, n.nic.as_str(), n.addr.as_str()))
        .collect();
    assert_eq!(
        nics,
        vec![(0, "rail0", "10.0.0.2"), (1, "rail1", "10.0.1.2")]
    );
    let e = agent(&sup.addr, "ghost")
        .await
        .get_probe_plan(ProbePlanRequest {
            host: "ghost".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    assert!(e.message().contains("\"ghost\""), "{e:?}");

    // Malformed summaries: a clear error, nothing stored.
    let mut ghost = summary(0);
    ghost.host = "ghost".into();
    let mut oversized = summary(0);
    oversized.clocks = vec![oversized.clocks[0].clone(); 257];
    let mut nan = summary(0);
    nan.clocks[1].drift_ppb = f64::NAN;
    let mut inverted = summary(0);
    inverted.paths[0].p99_ns = 1;
    for (s, code, want) in [
        (ghost, tonic::Code::NotFound, "not registered"),
        (oversized, tonic::Code::InvalidArgument, "at most 256"),
        (nan, tonic::Code::InvalidArgument, "finite"),
        (inverted, tonic::Code::InvalidArgument, "min ≤ p50 ≤ p99"),
    ] {
        let e = agent(&sup.addr, &s.host)
            .await
            .send_probe_summary(s)
            .await
            .unwrap_err();
        assert_eq!(e.code(), code, "{e:?}");
        assert!(e.message().contains(want), "{e:?}");
    }
    let (code, v, err) = cli_json(&sup.addr, &["paths"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["reply"], "paths");
    assert_eq!(v["total"], 0, "nothing stored: {v}");
    let (_, v, _) = cli_json(&sup.addr, &["clock"]);
    assert_eq!(v["reply"], "clock");
    assert!(v["solution"].is_null(), "{v}");
    assert!(v["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .all(|h| h["state"] == "unsynced"));

    // The hosts are alive (heartbeats) throughout: a Down host's clock is
    // not held over.
    let beats = {
        let addr = sup.addr.clone();
        tokio::spawn(async move {
            let mut cs = Vec::new();
            for me in 0..3 {
                cs.push(agent(&addr, &format!("h{me}")).await);
            }
            loop {
                for (me, c) in cs.iter_mut().enumerate() {
                    let _ = c
                        .heartbeat(proto::v1::HeartbeatRequest {
                            host: format!("h{me}"),
                            sent_unix_ms: 0,
                            ..Default::default()
                        })
                        .await;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    // Good summaries from every host, as agents send them (every second;
    // faster here).
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let stop = stop.clone();
        let addr = sup.addr.clone();
        tokio::spawn(async move {
            let mut cs = Vec::new();
            for me in 0..3 {
                cs.push(agent(&addr, &format!("h{me}")).await);
            }
            while !stop.load(Ordering::Relaxed) {
                for (me, c) in cs.iter_mut().enumerate() {
                    c.send_probe_summary(summary(me)).await.expect("summary");
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let v = loop {
        let (code, v, err) = cli_json(&sup.addr, &["clock"]);
        assert_eq!(code, 0, "{err}");
        let hosts = v["hosts"].as_array().unwrap();
        if hosts.iter().all(|h| h["state"] == "synced") {
            break v;
        }
        assert!(Instant::now() < deadline, "clocks never synced: {v:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(v["reference"], "h0");
    assert_eq!(v["solution"]["at_ns"], T0);
    assert_eq!(v["edges"].as_array().unwrap().len(), 6, "3 pairs x 2 rails");
    for e in v["edges"].as_array().unwrap() {
        assert_eq!(e["status"], "used", "{e}");
        assert!(
            e["from_id"].as_u64() < e["to_id"].as_u64(),
            "smaller id reports: {e}"
        );
        assert!(e["ntp_offset_ns"].is_number() && e["residual_ns"].is_number());
    }
    for (i, h) in v["hosts"].as_array().unwrap().iter().enumerate() {
        assert_eq!(h["id"], i as u64);
        let live = h["live"]["offset_ns"].as_f64().unwrap();
        assert!((live - OFFSETS[i]).abs() < 1.0, "{h}");
        assert!(h["live"]["drift_ppb"].is_number() && h["live"]["error_bound_ns"].is_number());
        let ntp = h["ntp"]["offset_ns"].as_f64().unwrap();
        let want = if i == 0 { 0.0 } else { OFFSETS[i] + 300.0 };
        assert!((ntp - want).abs() < 1e-6, "{h}");
        assert!(h["state_changed_ms"].as_u64().unwrap() > 0);
        let rate = if i == 2 { 62 } else { 100 };
        assert_eq!(h["probe"]["pairs_per_s"], rate, "{h}");
        assert_eq!(h["probe"]["max_pairs_per_s"], 100, "{h}");
        assert_eq!(h["probe"]["cpu_budget_pct"], 1.0, "{h}");
    }
    let table = cli(&sup.addr, &["clock"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("reference: h0") && text.contains("Synced"),
        "{text}"
    );
    let h2 = text.lines().find(|l| l.contains(" h2 ")).expect("h2's row");
    assert!(h2.contains("62/100") && h2.contains("0.93"), "{text}");

    // The state changes were committed with events.
    let events = common::events(&sup.client()).await;
    let synced = events
        .iter()
        .filter(|e| {
            matches!(
                e.event,
                Event::Clock {
                    from: ClockState::Unsynced,
                    to: ClockState::Synced,
                    ..
                }
            )
        })
        .count();
    assert_eq!(synced, 3);

    // Paths: network-corrected, worst p99 first, filters.
    let (code, v, err) = cli_json(&sup.addr, &["paths"]);
    assert_eq!(code, 0, "{err}");
    let paths = v["paths"].as_array().unwrap();
    assert_eq!(v["total"], 12, "3 receivers x 2 senders x 2 rails");
    let p99: Vec<f64> = paths
        .iter()
        .map(|p| p["p99_us"].as_f64().unwrap())
        .collect();
    assert!(p99.windows(2).all(|w| w[0] >= w[1]), "{p99:?}");
    for p in paths {
        assert_eq!(p["correction"], "network", "{p}");
        assert!((p["min_us"].as_f64().unwrap() - 10.0).abs() < 0.01, "{p}");
        assert!((p["loss_pct"].as_f64().unwrap() - 1.0).abs() < 1e-9, "{p}");
    }
    assert_eq!(paths[0]["src"], "h2", "h2's probes have the largest p99");
    let (_, v, _) = cli_json(&sup.addr, &["paths", "--top", "2"]);
    assert_eq!(
        (v["paths"].as_array().unwrap().len(), v["total"].as_u64()),
        (2, Some(12))
    );
    let (_, v, _) = cli_json(&sup.addr, &["paths", "--host", "h1"]);
    assert_eq!(v["total"], 8, "h1 sends 4 and receives 4");
    let (code, _, err) = cli_json(&sup.addr, &["paths", "--host", "ghost"]);
    assert_eq!(code, 2);
    assert!(err.contains("\"ghost\" not found"), "{err}");
    let (code, _, err) = cli_json(&sup.addr, &["paths", "--top", "0"]);
    assert_eq!(code, 2, "{err}");
    let table = cli(&sup.addr, &["paths", "--top", "3"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("h2/rail") && text.contains("(3 of 12 paths shown)"),
        "{text}"
    );

    // Once the summaries stop, fresh edges run out (3 s): the last
    // solution stands in, every host held over and still Synced...
    stop.store(true, Ordering::Relaxed);
    sender.await.unwrap();
    let stopped = Instant::now();
    let deadline = stopped + Duration::from_secs(15);
    loop {
        let (_, v, _) = cli_json(&sup.addr, &["clock"]);
        let stale = v["solve_error"]
            .as_str()
            .is_some_and(|e| e.contains("no fresh probe edges"));
        let stale_ms = supervisor::leader::clock::STALE_AFTER.as_millis() as u64;
        if stale && v["solution"]["age_ms"].as_u64() >= Some(stale_ms + 200) {
            for h in v["hosts"].as_array().unwrap() {
                assert_eq!(h["state"], "synced", "{v:#}");
                assert!(h["live"]["holdover_ms"].as_u64() >= Some(stale_ms), "{h}");
            }
            break;
        }
        assert!(Instant::now() < deadline, "no stand-in: {v:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // ...for at most 30 s: then every host is Unsynced again.
    let deadline = stopped + Duration::from_secs(45);
    loop {
        let (_, v, _) = cli_json(&sup.addr, &["clock"]);
        if v["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|h| h["state"] == "unsynced")
        {
            break;
        }
        assert!(Instant::now() < deadline, "clocks stayed synced: {v:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    beats.abort();
}

/// Supervisors 1 and 2 knowing each other; killed on drop.
struct Pair {
    children: Vec<Option<Child>>,
    addrs: Vec<String>,
    _dir: tempfile::TempDir,
}

impl Pair {
    fn start() -> Pair {
        let dir = tempfile::tempdir().unwrap();
        let addrs: Vec<String> = (0..2)
            .map(|_| format!("127.0.0.1:{}", free_port()))
            .collect();
        let children = (0..2)
            .map(|i| {
                let other = 1 - i;
                let log =
                    std::fs::File::create(dir.path().join(format!("s{}.log", i + 1))).unwrap();
                Some(
                    Command::new(SUPERVISOR)
                        .args(["--id", &(i + 1).to_string(), "--listen", &addrs[i]])
                        .arg("--data-dir")
                        .arg(dir.path().join(format!("s{}", i + 1)))
                        .args(["--peer", &format!("{}={}", other + 1, addrs[other])])
                        .args(common::sup_args(i as u64 + 1))
                        .env_remove("RUST_BACKTRACE")
                        .stdout(Stdio::null())
                        .stderr(log)
                        .spawn()
                        .unwrap(),
                )
            })
            .collect();
        Pair {
            children,
            addrs,
            _dir: dir,
        }
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.children[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        self.kill(0);
        self.kill(1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_forward_clock_reads_and_refuse_summaries() {
    let mut pair = Pair::start();
    let client = |a: &str| {
        supervisor::client::AdminClient::new(
            &[a.to_string()],
            "test",
            Duration::from_secs(2),
            &common::tls_as(&common::admin_id()),
        )
        .unwrap()
    };
    // Initialise and find the leader.
    let deadline = Instant::now() + Duration::from_secs(20);
    let leader = loop {
        let _ = client(&pair.addrs[0])
            .call(AdminRequest::ClusterInit, false)
            .await;
        if let Ok(AdminReply::Status(s)) = client(&pair.addrs[0])
            .call(AdminRequest::Status, true)
            .await
        {
            if let Some(l) = s.leader {
                break l;
            }
        }
        assert!(Instant::now() < deadline, "no leader");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (li, fi) = ((leader - 1) as usize, (2 - leader) as usize);
    let (leader_addr, follower_addr) = (pair.addrs[li].clone(), pair.addrs[fi].clone());
    register(&leader_addr, 0).await.expect("register");

    // Any supervisor serves plans from its replicated state.
    let mut f = agent(&follower_addr, "h0").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let plan = loop {
        match f
            .get_probe_plan(ProbePlanRequest { host: "h0".into() })
            .await
        {
            Ok(p) => break p.into_inner(),
            Err(e) if e.code() == tonic::Code::NotFound && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("plan from the follower: {e:?}"),
        }
    };
    assert_eq!((plan.host_id, plan.peers.len()), (0, 0));

    // Summaries are leader only: refused with the leader's address.
    let e = f.send_probe_summary(summary(0)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert_eq!(
        e.metadata().get("rg-leader").and_then(|v| v.to_str().ok()),
        Some(leader_addr.as_str())
    );

    // Clock and paths read the leader's memory even with --stale.
    for args in [&["clock", "--stale"][..], &["paths"][..]] {
        let (code, v, err) = cli_json(&follower_addr, args);
        assert_eq!(code, 0, "{args:?}: {err}");
        assert_eq!(v["answered_by"], leader, "{args:?}: {v}");
    }

    // Without a leader: a clear Unavailable (exit 3).
    pair.kill(li);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (code, _, err) = cli_json(&follower_addr, &["clock", "--timeout", "3s"]);
        if code == 3 {
            assert!(
                err.contains("no leader") || err.contains("unreachable"),
                "{err}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "still answered: {code} {err}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
