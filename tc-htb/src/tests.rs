//! Unit tests of the encoders, the parsers and validation (no kernel
//! needed; the netns tests in chaos-tests/tests/shape_netns.rs drive a real
//! interface).

use std::net::Ipv4Addr;

use netlink_packet_core::{Emitable, Nla, Parseable};
use netlink_packet_route::tc::{TcAttribute, TcHandle, TcMessage, TcStats2};

use crate::encode::*;
use crate::model::*;
use crate::parse::*;
use crate::stats::stats_of;
use crate::validate::validate;
use crate::wire::*;
use crate::ShapeError;

fn flow(dst: [u8; 4], dport: Option<L4Port>, sport: Option<L4Port>) -> FlowMatch {
    FlowMatch {
        dst: Ipv4Addr::from(dst),
        dst_port: dport,
        src_port: sport,
    }
}

fn shape(minor: u16, rate: u64, ceil: u64, dst: [u8; 4], port: Option<L4Port>) -> Shape {
    Shape {
        class_minor: minor,
        rate_bps: rate,
        ceil_bps: ceil,
        matches: vec![flow(dst, port, None)],
    }
}

/// Emits a filter message and parses it back as a dump would.
fn filter_round_trip(f: &TcMessage) -> InstalledFilter {
    let mut buf = vec![0u8; f.buffer_len()];
    f.emit(&mut buf);
    parse_filter(&TcMessage::parse(&buf).unwrap()).unwrap()
}

#[test]
fn psched_parsing_matches_iproute2() {
    let c = PschedClock::parse("000003e8 00000040 000f4240 3b9aca00\n").unwrap();
    assert_eq!(c, PschedClock::default());
    // 50 Mbit/s = 6.25e6 B/s: burst 1600 B = 256 µs = 4000 ticks of 64 ns.
    assert_eq!(c.default_burst(6_250_000), 1600);
    assert_eq!(c.xmit_ticks(6_250_000, 1600), 4000);
    // Old low-resolution kernels: hz from the fallback.
    let old = PschedClock::parse("000003e8 00000400 000f4240 00000064").unwrap();
    assert_eq!(old.hz, 100);
    assert!(PschedClock::parse("garbage").is_none());
    assert!(PschedClock::parse("0 0 0 0").is_none());
    // Saturates instead of wrapping.
    assert_eq!(c.xmit_ticks(1, u64::MAX / 1_000_000), u32::MAX);
}

#[test]
fn tc_htb_opt_bytes_for_a_32_bit_rate() {
    let c = PschedClock::default();
    let p = HtbClassParams::new(&c, 400_000_000, 800_000_000);
    assert_eq!(p.rate_bytes, 50_000_000);
    let b = p.encode_opt();
    assert_eq!(b.len(), 44);
    // rate ratespec: cell_log 0, linklayer ethernet, overhead 0, cell_align -1, mpu 0.
    assert_eq!(&b[0..8], &[0, 1, 0, 0, 0xff, 0xff, 0, 0]);
    assert_eq!(u32_at(&b, 8), 50_000_000);
    assert_eq!(b[13], 1);
    assert_eq!(u32_at(&b, 20), 100_000_000);
    // burst 1600 B at 50e6 B/s = 32 µs = 500 ticks; at 100e6: 250.
    assert_eq!(u32_at(&b, 24), 500);
    assert_eq!(u32_at(&b, 28), 250);
    assert_eq!(u32_at(&b, 32), 200_000); // quantum clamped
    assert_eq!(u32_at(&b, 36), 0);
    assert_eq!(u32_at(&b, 40), 0);
    let opts = p.options();
    assert_eq!(opts.len(), 1, "no 64-bit attributes below 2^32 B/s");
    assert_eq!(opts[0].kind(), TCA_HTB_PARMS);
}

#[test]
fn a_rate_above_u32_bytes_uses_the_64_bit_attributes() {
    let c = PschedClock::default();
    // 40 Gbit/s = 5e9 B/s > u32::MAX; ceil 80 Gbit/s.
    let p = HtbClassParams::new(&c, 40_000_000_000, 80_000_000_000);
    let b = p.encode_opt();
    assert_eq!(u32_at(&b, 8), u32::MAX);
    assert_eq!(u32_at(&b, 20), u32::MAX);
    let opts = p.options();
    assert_eq!(opts.len(), 3);
    let mut raw = vec![0u8; opts.as_slice().buffer_len()];
    opts.as_slice().emit(&mut raw);
    // PARMS nla: 4-byte header + 44.
    assert_eq!(u16::from_ne_bytes([raw[0], raw[1]]), 48);
    assert_eq!(u16::from_ne_bytes([raw[2], raw[3]]), TCA_HTB_PARMS);
    // RATE64: header (len 12, type 6) then the u64.
    assert_eq!(&raw[48..52], &[12, 0, 6, 0]);
    assert_eq!(&raw[52..60], &5_000_000_000u64.to_ne_bytes());
    assert_eq!(&raw[60..64], &[12, 0, 7, 0]);
    assert_eq!(&raw[64..72], &10_000_000_000u64.to_ne_bytes());
    // And it parses back to the 64-bit values.
    let parsed = parse_class_options(&raw).unwrap();
    assert_eq!(parsed.rate_bytes, 5_000_000_000);
    assert_eq!(parsed.ceil_bytes, 10_000_000_000);
    assert_eq!(parsed.buffer_ticks, p.buffer_ticks);
    // 1605 B at 5e9 B/s = 0.321 µs = 5 ticks.
    assert_eq!(parsed.buffer_ticks, 5);
}

#[test]
fn glob_bytes() {
    let g = encode_glob(DEFAULT_MINOR);
    assert_eq!(u32_at(&g, 0), 3);
    assert_eq!(u32_at(&g, 4), 10);
    assert_eq!(u32_at(&g, 8), 0xfffe);
    assert_eq!(&g[12..], &[0; 8]);
    let m = qdisc_message(7);
    let mut buf = vec![0u8; m.buffer_len()];
    m.emit(&mut buf);
    let back = TcMessage::parse(&buf).unwrap();
    assert_eq!(back.header.handle, handle_of(1, 0));
    assert_eq!(back.header.parent, TcHandle::ROOT);
    let n = raw_options(&back).unwrap();
    assert_eq!(parse_qdisc_options(&n).unwrap(), 0xfffe);
}

#[test]
fn a_dumped_class_parses() {
    // A class message as the kernel dumps it: kind, options (PARMS +
    // RATE64), stats2 basic.
    let c = PschedClock::default();
    let p = HtbClassParams::new(&c, 40_000_000_000, 40_000_000_000);
    let m = class_message(3, 0x20, ROOT_MINOR, &p);
    let mut buf = vec![0u8; m.buffer_len()];
    m.emit(&mut buf);
    let back = TcMessage::parse(&buf).unwrap();
    let ic = parse_class(&back).unwrap().unwrap();
    assert_eq!(ic.minor, 0x20);
    assert_eq!(ic.parent_minor, Some(1));
    assert_eq!(ic.rate_bps, 40_000_000_000);
    assert_eq!(ic.ceil_bps, 40_000_000_000);
    assert_eq!(ic.quantum, 200_000);
    // A top-level class reports parent ffff:ffff.
    let mut top = back.clone();
    top.header.parent = TcHandle::ROOT;
    assert_eq!(parse_class(&top).unwrap().unwrap().parent_minor, None);
    // Truncated PARMS is an error, not a panic.
    assert!(parse_class_options(&[8, 0, 1, 0, 0, 0, 0, 0]).is_err());
    assert!(parse_class_options(&[]).is_err());
}

#[test]
fn u32_selector_round_trips() {
    let m = flow([10, 201, 0, 2], Some(L4Port::Tcp(5201)), None);
    let sel = u32_selector(&m);
    assert_eq!(sel.nkeys, 3);
    assert_eq!(sel.keys[0].off, 16);
    assert_eq!(sel.keys[0].val, 0x0ac9_0002);
    assert_eq!(sel.keys[1].val, 6 << 16);
    assert_eq!(sel.keys[2].val, 5201);
    assert_eq!(flow_from_selector(&sel), Some(m));
    let f = filter_message(9, 1, 0x10, &m);
    assert_eq!(u32::from(f.header.handle), 0x8000_0001);
    assert_eq!(f.header.info >> 16, u32::from(FILTER_PRIO));
    let mut buf = vec![0u8; f.buffer_len()];
    f.emit(&mut buf);
    // Key 0 on the wire: mask and value in network order.
    let needle = [0xff, 0xff, 0xff, 0xff, 10, 201, 0, 2, 16, 0, 0, 0];
    assert!(buf.windows(needle.len()).any(|w| w == needle));
    let back = TcMessage::parse(&buf).unwrap();
    let pf = parse_filter(&back).unwrap();
    assert_eq!(pf.flow, Some(m));
    assert_eq!(pf.class_minor, Some(0x10));
    assert_eq!(pf.protocol, ETH_P_IP);
    let plain = FlowMatch::to_addr(Ipv4Addr::new(10, 0, 0, 1));
    assert_eq!(flow_from_selector(&u32_selector(&plain)), Some(plain));
}

#[test]
fn a_source_port_is_the_high_half_of_the_word_at_20() {
    let m = flow([10, 201, 0, 2], None, Some(L4Port::Tcp(40000)));
    let sel = u32_selector(&m);
    assert_eq!(sel.nkeys, 3);
    assert_eq!((sel.keys[1].off, sel.keys[1].mask), (8, 0x00ff_0000));
    assert_eq!(sel.keys[1].val, 6 << 16);
    assert_eq!((sel.keys[2].off, sel.keys[2].mask), (20, 0xffff_0000));
    assert_eq!(sel.keys[2].val, 40000 << 16);
    assert_eq!(flow_from_selector(&sel), Some(m));
    let f = filter_message(9, 4, 0x11, &m);
    let mut buf = vec![0u8; f.buffer_len()];
    f.emit(&mut buf);
    // The key on the wire: mask ffff0000, value 40000 << 16 (network
    // order), offset 20.
    let p = 40000u16.to_be_bytes();
    let needle = [0xff, 0xff, 0, 0, p[0], p[1], 0, 0, 20, 0, 0, 0];
    assert!(buf.windows(needle.len()).any(|w| w == needle));
    let pf = filter_round_trip(&f);
    assert_eq!((pf.flow, pf.class_minor), (Some(m), Some(0x11)));
    assert_eq!(pf.handle, 0x8000_0004);

    // Both ports: one protocol key, two port keys.
    let both = flow(
        [10, 0, 0, 1],
        Some(L4Port::Udp(4791)),
        Some(L4Port::Udp(5000)),
    );
    let sel = u32_selector(&both);
    assert_eq!(sel.nkeys, 4);
    assert_eq!(sel.keys[1].val, 17 << 16);
    assert_eq!(
        filter_round_trip(&filter_message(1, 1, 2, &both)).flow,
        Some(both)
    );
    assert_eq!(both.to_string(), "dst 10.0.0.1 udp sport 5000 dport 4791");
    // tc's merged form (one key, mask ffffffff) parses as well.
    let mut merged = u32_selector(&both);
    merged.keys.truncate(2);
    merged.keys.push(key(20, u32::MAX, (5000 << 16) | 4791));
    merged.nkeys = 3;
    assert_eq!(flow_from_selector(&merged), Some(both));
    // Selectors that are not ours: no flow.
    let mut proto_only = u32_selector(&both);
    proto_only.keys.truncate(2);
    proto_only.nkeys = 2;
    assert_eq!(flow_from_selector(&proto_only), None);
    let mut odd = u32_selector(&plain_of(&both));
    odd.keys.push(key(12, u32::MAX, 1));
    assert_eq!(flow_from_selector(&odd), None);
}

fn plain_of(f: &FlowMatch) -> FlowMatch {
    FlowMatch::to_addr(f.dst)
}

#[test]
fn a_multi_match_class_gets_one_node_per_match_in_order() {
    let job_a = Shape {
        class_minor: 0x10,
        rate_bps: 120_000_000,
        ceil_bps: 120_000_000,
        matches: vec![
            flow([10, 0, 0, 2], Some(L4Port::Tcp(7000)), None),
            flow([10, 0, 0, 2], None, Some(L4Port::Tcp(7000))),
            flow([10, 0, 0, 3], Some(L4Port::Tcp(7000)), None),
        ],
    };
    let other = Shape {
        class_minor: 0x20,
        rate_bps: 120_000_000,
        ceil_bps: 120_000_000,
        matches: vec![
            FlowMatch::to_addr(Ipv4Addr::new(10, 0, 0, 2)),
            FlowMatch::to_addr(Ipv4Addr::new(10, 0, 0, 3)),
        ],
    };
    let set = [job_a.clone(), other.clone()];
    assert!(validate(&set, 1_000_000_000).is_ok());
    let plan = filter_plan(&set);
    let want: Vec<(u32, u16, FlowMatch)> = vec![
        (1, 0x10, job_a.matches[0]),
        (2, 0x10, job_a.matches[1]),
        (3, 0x10, job_a.matches[2]),
        (4, 0x20, other.matches[0]),
        (5, 0x20, other.matches[1]),
    ];
    assert_eq!(plan, want);
    // Each node's message parses back to its class and match, with a
    // handle that orders it (800::n).
    for (node, minor, m) in plan {
        let pf = filter_round_trip(&filter_message(3, node, minor, &m));
        assert_eq!(pf.handle, U32_ROOT_HT | node);
        assert_eq!((pf.class_minor, pf.flow), (Some(minor), Some(m)));
    }
}

#[test]
fn class_counters_come_from_stats2_or_the_old_stats() {
    let c = PschedClock::default();
    let p = HtbClassParams::new(&c, 8_000_000, 8_000_000);
    let mut m = class_message(3, 0x10, ROOT_MINOR, &p);
    let mut basic = netlink_packet_route::tc::TcStatsBasic::default();
    basic.bytes = 123_456;
    basic.packets = 78;
    let mut queue = netlink_packet_route::tc::TcStatsQueue::default();
    queue.drops = 3;
    queue.overlimits = 9;
    m.attributes.push(TcAttribute::Stats2(vec![
        TcStats2::Basic(basic),
        TcStats2::Queue(queue),
    ]));
    let mut buf = vec![0u8; m.buffer_len()];
    m.emit(&mut buf);
    let back = TcMessage::parse(&buf).unwrap();
    let want = ClassStats {
        bytes: 123_456,
        packets: 78,
        drops: 3,
        overlimits: 9,
    };
    assert_eq!(stats_of(&back), want);
    let ic = parse_class(&back).unwrap().unwrap();
    assert_eq!(
        (ic.stats, ic.sent_bytes, ic.sent_packets),
        (want, 123_456, 78)
    );
    // Only TCA_STATS (old kernels).
    let mut old = class_message(3, 0x10, ROOT_MINOR, &p);
    let mut st = netlink_packet_route::tc::TcStats::default();
    st.bytes = 5;
    st.packets = 1;
    st.drops = 2;
    st.overlimits = 4;
    old.attributes.push(TcAttribute::Stats(st));
    let mut buf = vec![0u8; old.buffer_len()];
    old.emit(&mut buf);
    let back = TcMessage::parse(&buf).unwrap();
    assert_eq!(
        stats_of(&back),
        ClassStats {
            bytes: 5,
            packets: 1,
            drops: 2,
            overlimits: 4
        }
    );
    // None at all: zeros.
    assert_eq!(
        stats_of(&class_message(3, 0x10, ROOT_MINOR, &p)),
        ClassStats::default()
    );
}

#[test]
fn match_lists_are_validated() {
    let mut s = shape(0x10, 8_000, 8_000, [10, 0, 0, 1], None);
    s.matches.clear();
    let e = validate(std::slice::from_ref(&s), 1_000_000).unwrap_err();
    assert!(matches!(e, ShapeError::NoMatches { minor: 0x10 }), "{e}");
    assert!(
        e.to_string().contains("class 1:10 has no flow match"),
        "{e}"
    );
    s.matches = (0..17u16)
        .map(|i| flow([10, 0, 0, 1], Some(L4Port::Tcp(i)), None))
        .collect();
    let e = validate(std::slice::from_ref(&s), 1_000_000).unwrap_err();
    assert!(e.to_string().contains("17 flow matches, at most 16"), "{e}");
    s.matches.truncate(16);
    assert!(validate(std::slice::from_ref(&s), 1_000_000).is_ok());
    // Ports of one match on two protocols.
    s.matches = vec![flow(
        [10, 0, 0, 1],
        Some(L4Port::Tcp(1)),
        Some(L4Port::Udp(2)),
    )];
    let e = validate(std::slice::from_ref(&s), 1_000_000).unwrap_err();
    assert!(
        matches!(e, ShapeError::MixedProtocols { minor: 0x10, .. }),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("dst 10.0.0.1 udp sport 2 tcp dport 1"),
        "{e}"
    );
    // The same match twice within one class.
    let m = flow([10, 0, 0, 1], None, Some(L4Port::Tcp(9)));
    s.matches = vec![m, m];
    let e = validate(std::slice::from_ref(&s), 1_000_000).unwrap_err();
    assert!(
        e.to_string()
            .contains("dst 10.0.0.1 tcp sport 9` is used more than once"),
        "{e}"
    );
    // A src-port match and a dst-port match on the same number differ.
    s.matches = vec![m, flow([10, 0, 0, 1], Some(L4Port::Tcp(9)), None)];
    assert!(validate(std::slice::from_ref(&s), 1_000_000).is_ok());
}

#[test]
fn validation_names_the_bad_value() {
    let ok = shape(0x10, 400_000_000, 800_000_000, [10, 0, 0, 1], None);
    assert!(validate(std::slice::from_ref(&ok), 1_000_000_000).is_ok());
    let e = validate(std::slice::from_ref(&ok), 0).unwrap_err();
    assert!(e.to_string().contains("default rate 0 bit/s"), "{e}");
    let e = validate(&[shape(0x10, 0, 8_000, [10, 0, 0, 1], None)], 1_000_000).unwrap_err();
    assert!(e.to_string().contains("class 1:10 rate 0 bit/s"), "{e}");
    let e = validate(
        &[shape(0x10, 8_000, 20_000_000_000_000, [10, 0, 0, 1], None)],
        1_000_000,
    )
    .unwrap_err();
    assert!(e.to_string().contains("ceil 20000000000000"), "{e}");
    let e = validate(&[shape(0x10, 9_000, 8_000, [10, 0, 0, 1], None)], 1_000_000).unwrap_err();
    assert!(
        matches!(e, ShapeError::CeilBelowRate { minor: 0x10, .. }),
        "{e}"
    );
    for m in [0, 1, DEFAULT_MINOR] {
        let e = validate(&[shape(m, 8_000, 8_000, [10, 0, 0, 1], None)], 1_000_000).unwrap_err();
        assert!(
            matches!(e, ShapeError::ReservedMinor { minor } if minor == m),
            "{e}"
        );
    }
    let e = validate(
        &[
            shape(5, 8_000, 8_000, [10, 0, 0, 1], None),
            shape(5, 8_000, 8_000, [10, 0, 0, 2], None),
        ],
        1_000_000,
    )
    .unwrap_err();
    assert!(e.to_string().contains("minor 5"), "{e}");
    let e = validate(
        &[
            shape(5, 8_000, 8_000, [10, 0, 0, 1], Some(L4Port::Tcp(1))),
            shape(6, 8_000, 8_000, [10, 0, 0, 1], Some(L4Port::Tcp(1))),
        ],
        1_000_000,
    )
    .unwrap_err();
    assert!(e.to_string().contains("dst 10.0.0.1 tcp dport 1"), "{e}");
    let many: Vec<Shape> = (0..65u16)
        .map(|i| shape(i + 2, 8_000, 8_000, [10, 0, 0, i as u8], None))
        .collect();
    let e = validate(&many, 1_000_000).unwrap_err();
    assert!(e.to_string().contains("65 shapes"), "{e}");
    assert!(validate(&many[..64], 1_000_000).is_ok());
}
