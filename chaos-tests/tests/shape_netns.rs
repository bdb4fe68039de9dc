//! HTB shaping through raw rtnetlink (the `tc-htb` crate) on a real veth
//! NIC inside the testbed (needs root; fails instead of skipping when `CI`
//! is set): the kernel holds exactly the rates we asked for (64-bit rates
//! included) and the filters in the order given (several per class), apply
//! is idempotent, a new set replaces the old, clear leaves nothing, a shape
//! really limits a TCP flow, a source-port match takes the traffic of the
//! side that listened (first listed, first matched), and the agent's
//! `ShapeNic`/`ClearShape` orders (`nodeagent::shaping`) apply, verify by
//! dump, count bytes and clear.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use nodeagent::shaping::{ShapeOrder, Shaper};
use proto::v1::{ClearShape, PaceJob, ShapeClass, ShapeNic};
use tc_htb::{
    self as shape, FlowMatch, Installed, L4Port, Shape, ShapeError, DEFAULT_MINOR, FILTER_PRIO,
    ROOT_MINOR,
};
use testbed::{rail_addr, require_root, Node, Testbed, TestbedSpec};

async fn two_hosts() -> Testbed {
    Testbed::build(TestbedSpec {
        supervisors: 0,
        hosts: 2,
    })
    .await
    .expect("build testbed")
}

async fn rail0(tb: &Testbed) -> (rtnetlink::Handle, u32) {
    let h = tb.ns(Node::Host(0)).netlink().expect("netlink in h0");
    let link = h
        .link()
        .get()
        .match_name("rail0")
        .execute()
        .try_next()
        .await
        .expect("find rail0")
        .expect("rail0 exists");
    (h, link.header.index)
}

/// The two-host testbed with h0's rail0 (a netlink handle in h0 and the
/// NIC's ifindex); `None` when not root (`require_root` says why).
async fn rail0_bed(test: &str) -> Option<(Testbed, rtnetlink::Handle, u32)> {
    if !require_root(test).unwrap() {
        return None;
    }
    let tb = two_hosts().await;
    let (h, ifindex) = rail0(&tb).await;
    Some((tb, h, ifindex))
}

fn shape(minor: u16, rate: u64, ceil: u64, dst: Ipv4Addr, port: Option<L4Port>) -> Shape {
    Shape {
        class_minor: minor,
        rate_bps: rate,
        ceil_bps: ceil,
        matches: vec![FlowMatch {
            dst,
            dst_port: port,
            src_port: None,
        }],
    }
}

/// (minor, parent, rate, ceil) of a class.
type ClassRow = (u16, Option<u16>, u64, u64);
/// (class, flow) of a filter.
type FilterRow = (Option<u16>, Option<FlowMatch>);

/// The (minor, parent, rate, ceil) of every class, and the (class, flow)
/// of every filter: what must match the shapes.
fn summary(i: &Installed) -> (Vec<ClassRow>, Vec<FilterRow>) {
    (
        i.classes
            .iter()
            .map(|c| (c.minor, c.parent_minor, c.rate_bps, c.ceil_bps))
            .collect(),
        i.filters.iter().map(|f| (f.class_minor, f.flow)).collect(),
    )
}

fn expected(shapes: &[Shape], default_bps: u64) -> Vec<ClassRow> {
    let link = shapes
        .iter()
        .map(|s| s.ceil_bps)
        .max()
        .unwrap_or(0)
        .max(default_bps);
    let mut v = vec![
        (ROOT_MINOR, None, link, link),
        (DEFAULT_MINOR, Some(ROOT_MINOR), default_bps, default_bps),
    ];
    v.extend(
        shapes
            .iter()
            .map(|s| (s.class_minor, Some(ROOT_MINOR), s.rate_bps, s.ceil_bps)),
    );
    v.sort();
    v
}

/// Applies `shapes` to the NIC, lists what the kernel holds and
/// [`check`]s it against them; returns the listing.
async fn apply_checked(
    h: &rtnetlink::Handle,
    ifindex: u32,
    shapes: &[Shape],
    default_bps: u64,
) -> Installed {
    shape::apply(h, ifindex, shapes, default_bps).await.unwrap();
    let i = shape::list(h, ifindex).await.unwrap();
    check(&i, shapes, default_bps);
    i
}

fn check(i: &Installed, shapes: &[Shape], default_bps: u64) {
    let q = i.qdisc.as_ref().expect("root htb qdisc 1:");
    assert_eq!(q.default_minor, DEFAULT_MINOR);
    let (classes, filters) = summary(i);
    assert_eq!(classes, expected(shapes, default_bps), "{i:#?}");
    // One filter per match, classes in order, each class's matches in
    // order (the u32 nodes are listed by handle = evaluation order).
    let want: Vec<_> = shapes
        .iter()
        .flat_map(|s| s.matches.iter().map(|m| (Some(s.class_minor), Some(*m))))
        .collect();
    assert_eq!(filters, want, "{i:#?}");
    for f in &i.filters {
        assert_eq!(
            (f.kind.as_str(), f.prio, f.protocol),
            ("u32", FILTER_PRIO, 0x0800)
        );
    }
    for c in &i.classes {
        assert!(c.buffer_ticks > 0 && c.cbuffer_ticks > 0, "{c:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn htb_shapes_round_trip_through_the_kernel() {
    let Some((_tb, h, ifindex)) = rail0_bed("shape_netns::round_trip").await else {
        return;
    };
    let h1 = rail_addr(1, 0);

    // Nothing to clear on a fresh NIC.
    assert!(shape::list(&h, ifindex).await.unwrap().is_empty());
    assert!(!shape::clear(&h, ifindex).await.unwrap());

    let default_bps = 1_000_000_000;
    // 1:10 takes a TCP connection whichever side listened on 5201.
    let mut job = shape(0x10, 400_000_000, 800_000_000, h1, Some(L4Port::Tcp(5201)));
    job.matches.push(FlowMatch {
        dst: h1,
        dst_port: None,
        src_port: Some(L4Port::Tcp(5201)),
    });
    let first = [
        job,
        // 40 Gbit/s = 5e9 bytes/s > u32::MAX: the 64-bit attributes.
        shape(
            0x20,
            40_000_000_000,
            80_000_000_000,
            h1,
            Some(L4Port::Udp(4791)),
        ),
        shape(
            0x30,
            8_000_000,
            16_000_000,
            Ipv4Addr::new(10, 201, 0, 9),
            None,
        ),
    ];
    let a = apply_checked(&h, ifindex, &first, default_bps).await;
    assert_eq!(a.filters.len(), 4);
    assert_eq!(a.class(0x20).unwrap().rate_bps, 40_000_000_000);
    assert_eq!(a.class(0x20).unwrap().ceil_bps, 80_000_000_000);

    // Idempotent: the same dump, filter handles included.
    let b = apply_checked(&h, ifindex, &first, default_bps).await;
    let handles = |i: &Installed| i.filters.iter().map(|f| f.handle).collect::<Vec<_>>();
    assert_eq!(handles(&a), handles(&b));
    let params = |i: &Installed| {
        i.classes
            .iter()
            .map(|c| (c.minor, c.buffer_ticks, c.cbuffer_ticks, c.quantum))
            .collect::<Vec<_>>()
    };
    assert_eq!(params(&a), params(&b));

    // Bad input changes nothing.
    let bad = [shape(0x40, 10, 10, h1, None)];
    let e = shape::apply(&h, ifindex, &bad, default_bps)
        .await
        .unwrap_err();
    assert!(matches!(e, ShapeError::RateOutOfRange { .. }), "{e}");
    let mut mixed = shape(0x40, 8_000, 8_000, h1, Some(L4Port::Tcp(1)));
    mixed.matches[0].src_port = Some(L4Port::Udp(2));
    let e = shape::apply(&h, ifindex, &[mixed], default_bps)
        .await
        .unwrap_err();
    assert!(matches!(e, ShapeError::MixedProtocols { .. }), "{e}");
    let mut none = shape(0x40, 8_000, 8_000, h1, None);
    none.matches.clear();
    let e = shape::apply(&h, ifindex, &[none], default_bps)
        .await
        .unwrap_err();
    assert!(matches!(e, ShapeError::NoMatches { .. }), "{e}");
    assert_eq!(
        summary(&shape::list(&h, ifindex).await.unwrap()),
        summary(&b)
    );

    // A different set replaces the old one: 0x10 changes rate and match
    // (and loses its second match), 0x20 and 0x30 go, 0x50 arrives; the
    // default rate moves.
    let second = [
        shape(
            0x50,
            2_000_000_000,
            2_000_000_000,
            h1,
            Some(L4Port::Tcp(6000)),
        ),
        shape(0x10, 100_000_000, 300_000_000, h1, Some(L4Port::Tcp(7000))),
    ];
    let c = apply_checked(&h, ifindex, &second, 500_000_000).await;
    assert!(c.class(0x20).is_none() && c.class(0x30).is_none());

    // An empty set keeps only the root and default classes, no filter.
    apply_checked(&h, ifindex, &[], 500_000_000).await;

    // Clear: nothing stays behind.
    shape::apply(&h, ifindex, &first, default_bps)
        .await
        .unwrap();
    assert!(shape::clear(&h, ifindex).await.unwrap());
    let e = shape::list(&h, ifindex).await.unwrap();
    assert!(e.is_empty(), "{e:#?}");
    assert!(!shape::clear(&h, ifindex).await.unwrap());
}

/// A socket timeout (`WouldBlock` or `TimedOut`, by platform), not a failure.
fn timed_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// Bytes the receiver got in `window` after `skip`, while the sender in h0
/// pushed as fast as it could for `skip + window + 0.5 s`.
fn tcp_throughput(tb: &Testbed, port: u16, skip: Duration, window: Duration) -> u64 {
    let addr = SocketAddr::from((rail_addr(1, 0), port));
    let listener = tb
        .ns(Node::Host(1))
        .run(move || TcpListener::bind(addr))
        .expect("enter h1")
        .expect("bind in h1");
    let receiver = std::thread::spawn(move || -> u64 {
        let (mut s, _) = listener.accept().expect("accept");
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut buf = vec![0u8; 1 << 16];
        let mut start = None;
        let mut counted = 0u64;
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let n = match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n as u64,
                Err(e) if timed_out(&e) => continue,
                Err(_) => break,
            };
            let t0 = *start.get_or_insert_with(Instant::now);
            let el = t0.elapsed();
            if el >= skip && el < skip + window {
                counted += n;
            }
            if el >= skip + window {
                break;
            }
        }
        counted
    });
    let mut out = tb
        .ns(Node::Host(0))
        .run(move || TcpStream::connect_timeout(&addr, Duration::from_secs(5)))
        .expect("enter h0")
        .expect("connect from h0");
    out.set_write_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let chunk = vec![0x5au8; 1 << 16];
    let until = Instant::now() + skip + window + Duration::from_millis(500);
    while Instant::now() < until {
        match out.write(&chunk) {
            Ok(_) => {}
            Err(e) if timed_out(&e) => {}
            Err(_) => break,
        }
    }
    drop(out);
    receiver.join().expect("receiver thread")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shape_limits_a_tcp_flow() {
    let Some((tb, h, ifindex)) = rail0_bed("shape_netns::limits_a_flow").await else {
        return;
    };
    let rate_bps = 50_000_000;
    let shaped_port = 5301;
    shape::apply(
        &h,
        ifindex,
        &[shape(
            0x10,
            rate_bps,
            rate_bps,
            rail_addr(1, 0),
            Some(L4Port::Tcp(shaped_port)),
        )],
        10_000_000_000,
    )
    .await
    .unwrap();

    let window = Duration::from_millis(1500);
    let skip = Duration::from_millis(500);
    let tb_ref = &tb;
    let got = tokio::task::block_in_place(|| tcp_throughput(tb_ref, shaped_port, skip, window));
    let allowed = rate_bps / 8 * 3 / 2; // bytes in 1.5 s at the rate
    eprintln!(
        "shaped flow: {got} bytes in {window:?} ({:.1} Mbit/s; shape {} Mbit/s)",
        got as f64 * 8.0 / window.as_secs_f64() / 1e6,
        rate_bps / 1_000_000
    );
    assert!(got <= allowed * 13 / 10, "{got} > 1.3 × {allowed}");
    assert!(
        got >= allowed * 3 / 10,
        "{got} < 0.3 × {allowed}: flow barely moved"
    );

    // The kernel's counters agree: the bytes went through class 1:10.
    let i = shape::list(&h, ifindex).await.unwrap();
    let c = i.class(0x10).unwrap();
    assert!(
        c.sent_bytes >= got,
        "class 1:10 sent {} < {got}",
        c.sent_bytes
    );
    let d = i.class(DEFAULT_MINOR).unwrap();
    assert!(
        d.sent_bytes < c.sent_bytes / 10,
        "default {d:?} vs shaped {c:?}"
    );

    // Control: a flow to another port is not matched, goes through the
    // default class (10 Gbit/s) and is not held to the shape's rate.
    let free =
        tokio::task::block_in_place(|| tcp_throughput(tb_ref, shaped_port + 1, skip, window));
    eprintln!(
        "unmatched flow: {free} bytes in {window:?} ({:.1} Mbit/s)",
        free as f64 * 8.0 / window.as_secs_f64() / 1e6
    );
    assert!(free > allowed * 2, "unmatched flow {free} <= 2 × {allowed}");
    let i = shape::list(&h, ifindex).await.unwrap();
    assert!(i.class(DEFAULT_MINOR).unwrap().sent_bytes >= free);

    assert!(shape::clear(&h, ifindex).await.unwrap());
    assert!(shape::list(&h, ifindex).await.unwrap().is_empty());
}

/// h0 listens on `port` (rail0), h1 connects and reads; h0 sends `bytes`.
/// Returns what h1 received. h0's data leaves with source port `port`.
fn send_from_listener(tb: &Testbed, port: u16, bytes: usize) -> usize {
    let addr = SocketAddr::from((rail_addr(0, 0), port));
    let listener = tb
        .ns(Node::Host(0))
        .run(move || TcpListener::bind(addr))
        .expect("enter h0")
        .expect("bind in h0");
    let mut client = tb
        .ns(Node::Host(1))
        .run(move || TcpStream::connect_timeout(&addr, Duration::from_secs(5)))
        .expect("enter h1")
        .expect("connect from h1");
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let reader = std::thread::spawn(move || -> usize {
        let mut buf = vec![0u8; 1 << 16];
        let mut got = 0;
        loop {
            match client.read(&mut buf) {
                Ok(0) | Err(_) => return got,
                Ok(n) => got += n,
            }
        }
    });
    let (mut s, _) = listener.accept().expect("accept in h0");
    s.write_all(&vec![0xa5u8; bytes]).expect("send from h0");
    drop(s);
    reader.join().expect("reader thread")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_port_match_takes_the_listeners_traffic_first_match_wins() {
    let Some((tb, h, ifindex)) = rail0_bed("shape_netns::src_port").await else {
        return;
    };
    let h1 = rail_addr(1, 0);
    let port = 5401;
    let job = Shape {
        class_minor: 0x40,
        rate_bps: 1_000_000_000,
        ceil_bps: 1_000_000_000,
        matches: vec![
            FlowMatch {
                dst: h1,
                dst_port: Some(L4Port::Tcp(port)),
                src_port: None,
            },
            FlowMatch {
                dst: h1,
                dst_port: None,
                src_port: Some(L4Port::Tcp(port)),
            },
        ],
    };
    let catch_all = Shape {
        class_minor: 0x50,
        rate_bps: 1_000_000_000,
        ceil_bps: 1_000_000_000,
        matches: vec![FlowMatch::to_addr(h1)],
    };
    let bytes = 4 << 20;
    let tb_ref = &tb;

    // The job's class first: the listener's data (source port 5401) is
    // the job's, not the catch-all's.
    let set = [job.clone(), catch_all.clone()];
    apply_checked(&h, ifindex, &set, 10_000_000_000).await;
    let s0 = shape::class_stats(&h, ifindex).await.unwrap();
    let got = tokio::task::block_in_place(|| send_from_listener(tb_ref, port, bytes));
    assert_eq!(got, bytes);
    let s1 = shape::class_stats(&h, ifindex).await.unwrap();
    let delta = |m: u16,
                 a: &std::collections::BTreeMap<u16, shape::ClassStats>,
                 b: &std::collections::BTreeMap<u16, shape::ClassStats>| {
        b[&m].bytes - a.get(&m).map_or(0, |s| s.bytes)
    };
    eprintln!("job first: {s1:?}");
    assert!(
        delta(0x40, &s0, &s1) >= bytes as u64,
        "job class 1:40 sent {} < {bytes}",
        delta(0x40, &s0, &s1)
    );
    assert!(s1[&0x40].packets > 0);
    assert!(
        delta(0x50, &s0, &s1) < bytes as u64 / 10,
        "catch-all 1:50 took {} bytes",
        delta(0x50, &s0, &s1)
    );
    assert!(delta(DEFAULT_MINOR, &s0, &s1) < bytes as u64 / 10);

    // The catch-all first: it now takes the same traffic.
    let set = [catch_all, job];
    apply_checked(&h, ifindex, &set, 10_000_000_000).await;
    let got = tokio::task::block_in_place(|| send_from_listener(tb_ref, port, bytes));
    assert_eq!(got, bytes);
    let s2 = shape::class_stats(&h, ifindex).await.unwrap();
    eprintln!("catch-all first: {s2:?}");
    assert!(delta(0x50, &s1, &s2) >= bytes as u64, "{s1:?} → {s2:?}");
    assert!(delta(0x40, &s1, &s2) < bytes as u64 / 10, "{s1:?} → {s2:?}");

    assert!(shape::clear(&h, ifindex).await.unwrap());
    assert!(shape::class_stats(&h, ifindex).await.unwrap().is_empty());
}

fn wire_flow(dst: Ipv4Addr, protocol: u32, dst_port: u32, src_port: u32) -> proto::v1::FlowMatch {
    proto::v1::FlowMatch {
        dst: dst.to_string(),
        protocol,
        dst_port,
        src_port,
    }
}

fn order(nic: &str, classes: Vec<ShapeClass>, pace: Vec<PaceJob>) -> ShapeOrder {
    ShapeOrder::Shape(ShapeNic {
        nic: nic.into(),
        classes,
        default_rate_bps: 1_000_000_000,
        pace,
        hold_queueing_us: 0,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shape_orders_apply_verify_count_and_clear() {
    let Some((tb, h, ifindex)) = rail0_bed("shape_netns::orders").await else {
        return;
    };
    let h1 = rail_addr(1, 0);
    let nics = vec![nodeagent::agent::NicConfig {
        name: "rail0".into(),
        rail: Some(0),
        backup: None,
        rdma_device: None,
        addr: Some(rail_addr(0, 0)),
    }];
    let control = nodeagent::control::Control::new(nics.clone());
    let shaper = Shaper::new(h.clone(), nics, control);
    // Nothing found on a fresh NIC.
    shaper.adopt_existing().await;
    assert!(shaper.shaped_nics().is_empty());

    // A job's class (`Some(job)`) or the class of everything else.
    let class = |minor: u32, job: Option<&str>, flows| ShapeClass {
        minor,
        rate_bps: 120_000_000,
        ceil_bps: 120_000_000,
        flows,
        label: job.map_or("other".into(), |j| format!("job {j}")),
        job: job.unwrap_or_default().into(),
    };
    let classes = vec![
        class(
            0x10,
            Some("a"),
            vec![wire_flow(h1, 6, 5501, 0), wire_flow(h1, 6, 0, 5501)],
        ),
        class(
            0x20,
            Some("b"),
            vec![wire_flow(h1, 6, 5502, 0), wire_flow(h1, 6, 0, 5502)],
        ),
        class(0x30, None, vec![wire_flow(h1, 0, 0, 0)]),
    ];
    let shape_order = order(
        "rail0",
        classes.clone(),
        vec![PaceJob {
            job: "a".into(),
            rate_bps: 50_000_000,
        }],
    );
    let (ok, detail) = shaper.execute(&shape_order).await;
    eprintln!("{detail}");
    assert!(ok, "{detail}");
    assert_eq!(
        detail,
        "rail0: 3 classes (job a 120 Mbit/s, job b 120 Mbit/s, other 120 Mbit/s), 5 filters, \
         verified by dump; job a has no ranks on this host"
    );
    let installed = shape::list(&h, ifindex).await.unwrap();
    assert_eq!(installed.filters.len(), 5);
    assert_eq!(
        installed
            .classes
            .iter()
            .map(|c| (c.minor, c.rate_bps))
            .collect::<Vec<_>>(),
        [
            (ROOT_MINOR, 1_000_000_000),
            (0x10, 120_000_000),
            (0x20, 120_000_000),
            (0x30, 120_000_000),
            (DEFAULT_MINOR, 1_000_000_000)
        ]
    );
    assert_eq!(shaper.shaped_nics(), ["rail0"]);

    // The summary counts the bytes of job a's class (h0 listened on 5501).
    let before = shaper.summary().await;
    assert_eq!(before.len(), 1);
    assert_eq!(
        (before[0].nic.as_str(), before[0].limit_bps),
        ("rail0", 360_000_000)
    );
    let bytes = 1 << 20;
    let tb_ref = &tb;
    let got = tokio::task::block_in_place(|| send_from_listener(tb_ref, 5501, bytes));
    assert_eq!(got, bytes);
    let after = shaper.summary().await;
    assert!(
        after[0].shaped_bytes >= before[0].shaped_bytes + bytes as u64,
        "{before:?} → {after:?}"
    );

    // Bad orders fail and change nothing.
    let unknown = order("rail9", classes.clone(), vec![]);
    let (ok, detail) = shaper.execute(&unknown).await;
    assert!(!ok);
    assert!(
        detail.contains("NIC \"rail9\" is not a data NIC of this host (it has rail0)"),
        "{detail}"
    );
    let mut bad_classes = classes.clone();
    bad_classes[2].flows[0].dst = "10.0.0.300".into();
    let (ok, detail) = shaper.execute(&order("rail0", bad_classes, vec![])).await;
    assert!(!ok);
    assert!(detail.contains("not an IPv4 address"), "{detail}");
    let mut slow = classes.clone();
    slow[0].rate_bps = 1;
    let (ok, detail) = shaper.execute(&order("rail0", slow, vec![])).await;
    assert!(!ok);
    assert!(detail.contains("class 1:10 rate 1 bit/s"), "{detail}");
    assert_eq!(
        summary(&shape::list(&h, ifindex).await.unwrap()),
        summary(&installed)
    );

    // The same order again: same state, verified again.
    let (ok, _) = shaper.execute(&shape_order).await;
    assert!(ok);
    assert_eq!(
        summary(&shape::list(&h, ifindex).await.unwrap()),
        summary(&installed)
    );

    // Clear: nothing left; clearing again has nothing to do.
    let clear = ShapeOrder::Clear(ClearShape {
        nic: "rail0".into(),
    });
    let (ok, detail) = shaper.execute(&clear).await;
    assert!(ok, "{detail}");
    assert_eq!(detail, "rail0: shaping cleared");
    assert!(shape::list(&h, ifindex).await.unwrap().is_empty());
    assert!(shaper.shaped_nics().is_empty());
    assert!(shaper.summary().await.is_empty());
    let (ok, detail) = shaper.execute(&clear).await;
    assert!(ok);
    assert_eq!(detail, "rail0: nothing to clear");

    // A shape found at start is adopted (and counted), not removed.
    let (ok, _) = shaper.execute(&shape_order).await;
    assert!(ok);
    let control = nodeagent::control::Control::new(vec![]);
    let restarted = Shaper::new(
        h.clone(),
        vec![nodeagent::agent::NicConfig {
            name: "rail0".into(),
            rail: Some(0),
            backup: None,
            rdma_device: None,
            addr: None,
        }],
        control,
    );
    restarted.adopt_existing().await;
    assert_eq!(restarted.shaped_nics(), ["rail0"]);
    assert_eq!(restarted.summary().await[0].limit_bps, 360_000_000);
    assert_eq!(shape::list(&h, ifindex).await.unwrap().filters.len(), 5);
    let (ok, detail) = restarted.execute(&clear).await;
    assert!(ok && detail == "rail0: shaping cleared", "{detail}");
    assert!(shape::list(&h, ifindex).await.unwrap().is_empty());
}
