//! The netdev (soft) backend against real links: each test runs on a thread
//! of its own that unshares into a fresh network namespace (released when
//! the thread ends), creates veth pairs there and flips them. The machine's
//! own interfaces are never touched.
//!
//! Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN). Without it the namespace tests
//! print "SKIPPED: needs root" and pass, unless `CI` is set: then they fail.

use std::future::Future;
use std::time::{Duration, Instant};

use futures::StreamExt;
use rdma::model::{
    AsyncEvent, AsyncEventKind, Backend, EventStream, LinkLayer, PortState, RdmaError,
};
use rdma::netdev::NetdevBackend;
use rtnetlink::{Handle, LinkUnspec, LinkVeth};

const TIMEOUT: Duration = Duration::from_secs(5);

fn skip(why: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("{why} (CI is set: not skipping)");
    }
    eprintln!("SKIPPED: {why}");
}

/// Runs `body` in a new network namespace on a dedicated thread with its
/// own tokio runtime. Returns false (after printing why) if it could not.
fn in_own_netns<F, Fut>(body: F) -> bool
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip("needs root");
        return false;
    }
    let t = std::thread::spawn(move || -> Result<(), String> {
        // SAFETY: unshare affects only this thread's namespaces; the host's
        // namespace is left before anything is created.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error().to_string());
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(body());
        Ok(())
    });
    match t.join() {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            skip(&format!("needs root (unshare(CLONE_NEWNET): {e})"));
            false
        }
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

fn rtnl() -> Handle {
    let (conn, handle, _) = rtnetlink::new_connection().expect("netlink connection");
    tokio::spawn(conn);
    handle
}

async fn veth(h: &Handle, a: &str, b: &str) {
    h.link()
        .add(LinkVeth::new(a, b).build())
        .execute()
        .await
        .unwrap_or_else(|e| panic!("create veth {a}/{b}: {e}"));
}

async fn set_up(h: &Handle, nic: &str, up: bool) {
    let b = LinkUnspec::new_with_name(nic);
    let msg = if up { b.up() } else { b.down() }.build();
    h.link()
        .set(msg)
        .execute()
        .await
        .unwrap_or_else(|e| panic!("set {nic} up={up}: {e}"));
}

/// Polls `devices()` until `nic`'s port is `want` (carrier and operstate
/// settle asynchronously in the kernel).
async fn wait_state(b: &NetdevBackend, nic: &str, want: PortState) {
    let start = Instant::now();
    loop {
        let devs = b.devices().expect("devices");
        let d = devs.iter().find(|d| d.name == nic).expect("device listed");
        if d.ports[0].state == want {
            return;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "{nic}: still {:?}, want {want:?}",
            d.ports[0].state
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn next_event(s: &mut EventStream) -> AsyncEvent {
    tokio::time::timeout(TIMEOUT, s.next())
        .await
        .expect("an event within 5 s")
        .expect("stream still open")
}

#[test]
fn devices_follow_admin_state_and_carrier() {
    in_own_netns(|| async {
        let h = rtnl();
        veth(&h, "rg0", "rg0p").await;
        let b = NetdevBackend::new(vec!["rg0".into(), "rg0".into()]);
        assert_eq!(b.name(), "netdev");
        assert_eq!(b.nics(), ["rg0".to_string()], "duplicates dropped");

        let devs = b.devices().expect("devices");
        assert_eq!(devs.len(), 1);
        let d = &devs[0];
        assert_eq!(d.name, "rg0");
        assert!(d.node_guid.is_some(), "veths have a MAC");
        assert_eq!(d.ports.len(), 1);
        let p = &d.ports[0];
        assert_eq!(p.num, 1);
        assert_eq!(p.state, PortState::Down, "admin down");
        assert_eq!(p.link_layer, LinkLayer::Ethernet);
        assert_eq!(p.netdev.as_deref(), Some("rg0"));
        assert_eq!(p.gid.map(|g| [g[0], g[1]]), Some([0xfe, 0x80]));

        // Admin up, but the peer is down: no carrier.
        set_up(&h, "rg0", true).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            b.devices().expect("devices")[0].ports[0].state,
            PortState::Down
        );

        set_up(&h, "rg0p", true).await;
        wait_state(&b, "rg0", PortState::Active).await;

        // Far end down (the fabric-side cable): carrier loss.
        set_up(&h, "rg0p", false).await;
        wait_state(&b, "rg0", PortState::Down).await;
        set_up(&h, "rg0p", true).await;
        wait_state(&b, "rg0", PortState::Active).await;

        // Near end admin down.
        set_up(&h, "rg0", false).await;
        wait_state(&b, "rg0", PortState::Down).await;

        // NICs that do not exist here.
        for nic in ["rg9", "a-name-far-too-long-for-linux", ""] {
            match NetdevBackend::new(vec!["rg0".into(), nic.into()]).devices() {
                Err(RdmaError::NoSuchNic(n)) => assert_eq!(n, nic),
                other => panic!("{nic:?}: expected NoSuchNic, got {other:?}"),
            }
        }
    });
}

#[test]
fn events_report_each_change_once() {
    in_own_netns(|| async {
        let h = rtnl();
        for (a, b) in [("rg0", "rg0p"), ("rg1", "rg1p")] {
            veth(&h, a, b).await;
            set_up(&h, a, true).await;
            set_up(&h, b, true).await;
        }
        let both = NetdevBackend::new(vec!["rg0".into(), "rg1".into()]);
        wait_state(&both, "rg0", PortState::Active).await;
        wait_state(&both, "rg1", PortState::Active).await;

        let b = NetdevBackend::new(vec!["rg0".into()]);
        let mut events = b.events().expect("events");

        // A NIC nobody watches flaps: nothing on the stream.
        set_up(&h, "rg1p", false).await;
        wait_state(&both, "rg1", PortState::Down).await;
        set_up(&h, "rg1p", true).await;
        wait_state(&both, "rg1", PortState::Active).await;

        let err = AsyncEvent {
            device: "rg0".into(),
            kind: AsyncEventKind::PortError { port: 1 },
        };
        let act = AsyncEvent {
            device: "rg0".into(),
            kind: AsyncEventKind::PortActive { port: 1 },
        };

        // Far end down and up (carrier), then near end down and up (admin).
        for nic in ["rg0p", "rg0"] {
            set_up(&h, nic, false).await;
            assert_eq!(next_event(&mut events).await, err, "{nic} down");
            set_up(&h, nic, true).await;
            assert_eq!(next_event(&mut events).await, act, "{nic} up");
        }

        // Deduplicated: the follow-up messages (operstate settling) and
        // non-state changes add nothing.
        h.link()
            .set(LinkUnspec::new_with_name("rg0").mtu(1400).build())
            .execute()
            .await
            .expect("set mtu");
        let extra = tokio::time::timeout(Duration::from_millis(700), events.next()).await;
        assert!(extra.is_err(), "unexpected event {extra:?}");

        // Deleting the watched NIC while it is active reports it down.
        h.link()
            .del_with_message(LinkUnspec::new_with_name("rg0").build())
            .execute()
            .await
            .expect("delete rg0");
        assert_eq!(next_event(&mut events).await, err, "deleted");
    });
}

#[test]
fn a_flap_storm_yields_alternating_events_ending_in_the_final_state() {
    in_own_netns(|| async {
        let h = rtnl();
        veth(&h, "rg0", "rg0p").await;
        set_up(&h, "rg0", true).await;
        set_up(&h, "rg0p", true).await;
        let b = NetdevBackend::new(vec!["rg0".into()]);
        wait_state(&b, "rg0", PortState::Active).await;
        let mut events = b.events().expect("events");
        for _ in 0..25 {
            set_up(&h, "rg0p", false).await;
            set_up(&h, "rg0p", true).await;
        }
        wait_state(&b, "rg0", PortState::Active).await;
        let mut kinds = Vec::new();
        while let Ok(Some(e)) =
            tokio::time::timeout(Duration::from_millis(1500), events.next()).await
        {
            assert_eq!(e.device, "rg0");
            kinds.push(e.kind);
        }
        let err = AsyncEventKind::PortError { port: 1 };
        let act = AsyncEventKind::PortActive { port: 1 };
        assert!(kinds.len() >= 2, "the storm was seen: {kinds:?}");
        assert_eq!(kinds[0], err, "starts from the active baseline");
        assert_eq!(kinds.last(), Some(&act), "ends in the final state");
        assert!(
            kinds.windows(2).all(|w| w[0] != w[1]),
            "deduplicated, alternating: {kinds:?}"
        );
    });
}

#[test]
fn events_need_existing_nics_and_a_runtime() {
    // Outside a runtime: a clear error, no panic (needs no privileges).
    match NetdevBackend::new(vec!["lo".into()]).events() {
        Err(e @ RdmaError::NoRuntime(_)) => assert!(e.to_string().contains("tokio runtime")),
        other => panic!("expected NoRuntime, got {:?}", other.map(|_| ())),
    }
    in_own_netns(|| async {
        match NetdevBackend::new(vec!["lo".into(), "rg7".into()]).events() {
            Err(RdmaError::NoSuchNic(n)) => assert_eq!(n, "rg7"),
            other => panic!("expected NoSuchNic, got {:?}", other.map(|_| ())),
        }
        // No NICs: nothing to report, ever (and no error).
        let mut none = NetdevBackend::new(vec![]).events().expect("empty stream");
        assert!(tokio::time::timeout(Duration::from_millis(50), none.next())
            .await
            .is_err());
    });
}

#[test]
fn loopback_is_a_device_in_any_namespace() {
    // Read-only, so it also runs without root, in the test's own namespace.
    let devs = NetdevBackend::new(vec!["lo".into()])
        .devices()
        .expect("lo exists in every namespace");
    assert_eq!(devs.len(), 1);
    assert_eq!(devs[0].ports[0].netdev.as_deref(), Some("lo"));
    assert_eq!(devs[0].node_guid, None, "lo has an all-zero MAC");
    // A fresh namespace's lo is down until someone brings it up.
    in_own_netns(|| async {
        let devs = NetdevBackend::new(vec!["lo".into()]).devices().expect("lo");
        assert_eq!(devs[0].ports[0].state, PortState::Down);
    });
}
