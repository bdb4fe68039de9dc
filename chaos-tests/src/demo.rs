//! `railguard-chaos demo`: the README's first command.
//!
//! - [`nic_flap`] (default, needs root): three supervisors and four hosts in
//!   network namespaces with real agents; a cable is pulled and restored, a
//!   NIC is stormed; a timeline shows the injected fault, when the agent saw
//!   it, when it was committed, the incident opening and closing; then
//!   `ringtrain` across the four hosts, fault-free and again with a cable
//!   pulled under it: no restart, the same digest.
//! - [`drain`] (`--drain`): a loopback cluster, a drain issued through a
//!   follower, the leader SIGKILLed, the drain still there.

use std::time::{Duration, Instant};

use anyhow::bail;
use serde::Serialize;
use supervisor::api::{AdminReply, AdminRequest};
use supervisor::model::{ClusterEvent, Event, HostStatus, IncidentKind};

use testbed::cluster::SupervisorCluster;

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

fn cli(c: &SupervisorCluster, addrs: &[String], args: &[&str]) -> anyhow::Result<String> {
    let out = c.cli_at(addrs, args)?;
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

/// The loopback demo: a drain through a leader crash (no root needed).
pub async fn drain() -> anyhow::Result<DemoReport> {
    let t = Timeline(Instant::now());
    t.say("starting 3 supervisors (Raft over gRPC, sled on disk) on loopback");
    let mut cluster = SupervisorCluster::start(3)?;
    let leader = cluster.init().await?;
    t.say(&format!("cluster initialised; supervisor {leader} leads"));
    for i in 0..4 {
        let h = format!("h{i}");
        testbed::agentsim::register_host(&cluster.addrs(), &h, &cluster.agent_tls(&h)?).await?;
    }
    t.say("4 hosts registered through the agent API (h0..h3, rails rail0/rail1)");
    let addrs = cluster.addrs();
    show("status", &cli(&cluster, &addrs, &["status"])?);
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
            &cluster,
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
    show("node list", &cli(&cluster, &addrs, &["node", "list"])?);
    t.say(&format!("SIGKILL the leader (supervisor {leader})"));
    let t_kill = Instant::now();
    cluster.kill(leader);
    let new_leader = cluster.wait_leader(Duration::from_secs(10)).await?;
    let failover_ms = t_kill.elapsed().as_millis() as u64;
    t.say(&format!(
        "supervisor {new_leader} leads after {failover_ms} ms"
    ));
    let live = cluster.live_addrs();
    let show_h1 = cli(&cluster, &live, &["node", "show", "h1"])?;
    show("node show h1", &show_h1);
    let survived = show_h1.contains("Drained");
    cluster.restart(leader)?;
    t.say(&format!(
        "supervisor {leader} restarted on its data dir and rejoins"
    ));
    cluster.wait_leader(Duration::from_secs(10)).await?;
    show("events", &cli(&cluster, &addrs, &["events"])?);
    show(
        "node undrain h1",
        &cli(&cluster, &addrs, &["node", "undrain", "h1"])?,
    );
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

#[derive(Debug, Serialize)]
pub struct NicFlapDemoReport {
    pub ok: bool,
    pub demo: &'static str,
    pub agent_saw_ms: f64,
    pub committed_ms: f64,
    pub incident_opened: bool,
    pub incident_closed: bool,
    pub storm_suppressed: bool,
    pub training: Option<crate::training::DemoTraining>,
    pub namespaces_left: usize,
}

fn ms_since(t_ns: u64, at_ns: u64) -> f64 {
    at_ns.saturating_sub(t_ns) as f64 / 1e6
}

/// The leader's event log as `railguard events --follow` receives it, each
/// event stamped with its arrival (wall-clock ns, the clock the fault is
/// stamped with). The leader streams an event the moment it applies the
/// entry, so an arrival bounds the commit from above.
struct EventTap {
    child: std::process::Child,
    rx: std::sync::mpsc::Receiver<(u64, ClusterEvent)>,
}

impl EventTap {
    fn start(c: &testbed::netcluster::NetCluster, since: u64) -> anyhow::Result<EventTap> {
        use std::io::BufRead;
        let leader = c.sup_addrs()[c.leader_index()?].clone();
        let since = since.to_string();
        let mut child = c
            .cli_command(
                &[leader],
                &["-o", "json", "events", "--follow", "--since", &since],
            )?
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        testbed::register_pid(child.id());
        let out = child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
        let (tx, rx) = std::sync::mpsc::sync_channel(4096);
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                let at = nodeagent::link::unix_ns();
                if let Ok(e) = serde_json::from_str::<ClusterEvent>(&line) {
                    if tx.send((at, e)).is_err() {
                        return;
                    }
                }
            }
        });
        Ok(EventTap { child, rx })
    }

    /// When the first event matching `f` arrived, waiting at most `within`.
    fn arrival(&self, within: Duration, f: impl Fn(&ClusterEvent) -> bool) -> Option<u64> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            match self.rx.recv_timeout(left) {
                Ok((at, e)) if f(&e) => return Some(at),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
    }
}

impl Drop for EventTap {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        testbed::unregister_pid(self.child.id());
    }
}

/// The netns NIC-flap demo.
pub async fn nic_flap() -> anyhow::Result<NicFlapDemoReport> {
    use testbed::netcluster::NetCluster;
    use testbed::{Side, TestbedSpec};
    let t = Timeline(Instant::now());
    if !testbed::require_root("demo")? {
        bail!("the NIC-flap demo builds network namespaces and needs root (try `railguard-chaos demo --drain`)");
    }
    t.say("building the testbed: namespaces for a fabric, 3 supervisors and 4 GPU hosts (rail0, rail1, mgmt0 each)");
    let mut c = NetCluster::start(TestbedSpec {
        supervisors: 3,
        hosts: 4,
    })
    .await?;
    t.say("supervisors started inside their namespaces and the cluster initialised; agents started on h0..h3");
    c.wait_until("every NIC up", Duration::from_secs(20), |c| {
        c.nics_up() == 8
    })
    .await?;
    t.say("all 8 data NICs reported Up by their agents");
    show("status", &c.cli(&["status"])?);
    let since = c.last_event_seq()?;
    let events_after = |c: &NetCluster, since: u64| -> Vec<ClusterEvent> {
        c.cli_json(&["events", "--since", &since.to_string(), "--limit", "5000"])
            .ok()
            .and_then(|v| serde_json::from_value(v["events"].clone()).ok())
            .unwrap_or_default()
    };
    let tap = EventTap::start(&c, since)?;
    t.say(
        "FAULT: pulling the cable of h2/rail0 (fabric-side veth down: the host sees carrier loss)",
    );
    let t_inj = nodeagent::link::unix_ns();
    c.tb.set_cable(2, 0, Side::Fabric, false).await?;
    c.wait_until("h2/rail0 down", Duration::from_secs(10), |c| {
        c.nic_state("h2", "rail0").is_ok_and(|s| s == "down")
    })
    .await?;
    let t_seen_committed = nodeagent::link::unix_ns();
    let evs = events_after(&c, since);
    let down = evs.iter().find(|e| {
        e.host.as_deref() == Some("h2")
            && matches!(&e.event, Event::NicLink { nic, up: false, .. } if nic == "rail0")
    });
    let agent_saw_ms = down
        .and_then(|e| e.observed_unix_ns)
        .map(|o| ms_since(t_inj, o))
        .unwrap_or(f64::NAN);
    let committed_ms = tap
        .arrival(Duration::from_secs(5), |e| {
            e.host.as_deref() == Some("h2")
                && matches!(&e.event, Event::NicLink { nic, up: false, .. } if nic == "rail0")
        })
        .map(|at| ms_since(t_inj, at))
        .unwrap_or(f64::NAN);
    drop(tap);
    t.say(&format!(
        "  agent on h2 saw rail0 go down      +{agent_saw_ms:.3} ms after the netlink change"
    ));
    t.say(&format!("  committed in Raft and applied by the leader, streamed to `railguard events --follow` +{committed_ms:.1} ms (a CLI poll saw it within {:.0} ms)", ms_since(t_inj, t_seen_committed)));
    let opened = evs.iter().any(|e| {
        e.host.as_deref() == Some("h2")
            && matches!(
                e.event,
                Event::IncidentOpened {
                    kind: IncidentKind::NicDown,
                    ..
                }
            )
    });
    t.say(&format!("  incident nic_down opened: {opened}"));
    show(
        "nic list --state down",
        &c.cli(&["nic", "list", "--state", "down"])?,
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    t.say("REPAIR: cable of h2/rail0 back");
    c.tb.set_cable(2, 0, Side::Fabric, true).await?;
    c.wait_until("h2/rail0 up", Duration::from_secs(10), |c| {
        c.nic_state("h2", "rail0").is_ok_and(|s| s == "up")
    })
    .await?;
    let evs = events_after(&c, since);
    let closed = evs.iter().any(|e| {
        e.host.as_deref() == Some("h2")
            && matches!(
                e.event,
                Event::IncidentClosed {
                    kind: IncidentKind::NicDown,
                    ..
                }
            )
    });
    t.say(&format!("  h2/rail0 Up again; incident closed: {closed}"));
    t.say("STORM: 3 quick flaps of h3/rail1 (host side, admin down/up)");
    for _ in 0..3 {
        c.tb.set_cable(3, 1, Side::Host, false).await?;
        tokio::time::sleep(Duration::from_millis(40)).await;
        c.tb.set_cable(3, 1, Side::Host, true).await?;
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    let suppressed = c
        .wait_until("h3/rail1 suppressed", Duration::from_secs(10), |c| {
            c.nic_state("h3", "rail1").is_ok_and(|s| s == "recovering")
        })
        .await
        .is_ok();
    t.say(&format!(
        "  flap damping suppressed h3/rail1 (Recovering until its penalty decays): {suppressed}"
    ));
    show("node show h3", &c.cli(&["node", "show", "h3"])?);
    println!("  $ railguard events   (this run)");
    for e in events_after(&c, since) {
        println!(
            "    {:>5}  {:<4} {}",
            e.seq,
            e.host.as_deref().unwrap_or("-"),
            e.what
        );
    }
    // The penalty decays with its half-life: say so while it does, instead
    // of a silent wait.
    t.say("waiting for h3/rail1's damping penalty to decay before training (up to 60 s)");
    let t_wait = Instant::now();
    let mut said = Duration::ZERO;
    loop {
        let state = c.nic_state("h3", "rail1").unwrap_or_else(|e| e.to_string());
        if state == "up" {
            t.say(&format!(
                "  h3/rail1 Up again after {:.0} s",
                t_wait.elapsed().as_secs_f64()
            ));
            break;
        }
        if t_wait.elapsed() > Duration::from_secs(60) {
            bail!("h3/rail1 not Up 60 s after the storm (it is {state})");
        }
        if t_wait.elapsed() >= said + Duration::from_secs(5) {
            said = t_wait.elapsed();
            t.say(&format!(
                "  h3/rail1 still {state} after {:.0} s (damped: its penalty halves every half-life)",
                said.as_secs_f64()
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut tr = crate::training::Training::from_cluster(c, crate::training::Workload::Ringtrain)?;
    let opts = crate::training::TrainOpts {
        steps: 150,
        checkpoint_every: 50,
        deadline: Duration::from_secs(300),
        ..Default::default()
    };
    let training =
        crate::training::demo_training(&mut tr, &opts, Duration::from_secs(3), &|m| t.say(m))
            .await?;
    show("job list", &tr.c.cli(&["job", "list"])?);
    let c = tr.c;
    let names = c.tb.namespace_names();
    t.say("tearing down: every process killed, every namespace removed");
    drop(c);
    let left = names
        .iter()
        .filter(|n| !testbed::netns::list(n).is_empty())
        .count();
    t.say(&format!("namespaces left behind: {left}"));
    Ok(NicFlapDemoReport {
        ok: opened && closed && suppressed && left == 0 && agent_saw_ms.is_finite() && training.ok,
        demo: "nic-flap",
        agent_saw_ms,
        committed_ms,
        incident_opened: opened,
        incident_closed: closed,
        storm_suppressed: suppressed,
        training: Some(training),
        namespaces_left: left,
    })
}
