//! Unit tests of `probe::mesh`.

use super::*;
use std::net::Ipv4Addr;

/// A simulated cluster: hosts with known clock offsets exchanging the
/// mesh's real packets through in-memory links with delays and drops.
struct Sim {
    meshes: Vec<Mesh>,
    offsets_ns: Vec<i64>,
    base: Instant,
    t_ns: i64,
    /// (deliver at true ns, to host, rail, from addr, packet, tx true ns)
    wire: Vec<(i64, usize, u32, SocketAddrV4, [u8; PACKET_LEN])>,
    rng: u64,
    /// Drop every packet to or from (host, rail).
    dead: Option<(usize, u32)>,
    /// Extra delay (ns) of every packet from one host to another.
    queue: Option<(usize, usize, i64)>,
    /// Every probe this host sends is stamped again just before it
    /// arrives (a later hop in the same kernel): (host, stamps due).
    hop_stamps: Option<(usize, Vec<HopStamp>)>,
}

/// A later hop's transmit stamp of a probe, due at `at_ns`.
struct HopStamp {
    at_ns: i64,
    rail: u32,
    packet: [u8; PACKET_LEN],
    stamp: i64,
}

fn addr(host: usize, rail: u32) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::new(10, 201 + rail as u8, 0, host as u8 + 1), 7947)
}

impl Sim {
    fn new(offsets_ns: Vec<i64>, rails: u32) -> Self {
        let base = Instant::now();
        let n = offsets_ns.len();
        let mut meshes = Vec::new();
        for h in 0..n {
            let local = (0..rails)
                .map(|r| LocalNic {
                    name: format!("rail{r}"),
                    rail: r,
                })
                .collect();
            let mut m =
                Mesh::new(MeshConfig::default(), local, 1_000 * (h as u64 + 1), base).unwrap();
            let peers = (0..n)
                .filter(|p| *p != h)
                .map(|p| PeerSpec {
                    host: format!("h{p}"),
                    id: p as u32,
                    nics: (0..rails)
                        .map(|r| {
                            (
                                r,
                                PeerNic {
                                    nic: format!("rail{r}"),
                                    addr: addr(p, r),
                                },
                            )
                        })
                        .collect(),
                })
                .collect();
            m.set_plan(
                &Plan {
                    self_id: h as u32,
                    version: 1,
                    peers,
                },
                base,
            );
            meshes.push(m);
        }
        Self {
            meshes,
            offsets_ns,
            base,
            t_ns: 1_700_000_000_000_000_000,
            wire: Vec::new(),
            rng: 0x1234_5678_9ABC_DEF1,
            dead: None,
            queue: None,
            hop_stamps: None,
        }
    }

    fn rand(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    fn now(&self, t0: i64) -> Instant {
        self.base + Duration::from_nanos((self.t_ns - t0) as u64)
    }

    /// Runs for `ms` of simulated time in 100 µs steps.
    fn run(&mut self, t0: i64, ms: i64) {
        let end = self.t_ns + ms * 1_000_000;
        while self.t_ns < end {
            self.t_ns += 100_000;
            let now = self.now(t0);
            for h in 0..self.meshes.len() {
                for op in self.meshes[h].due(now) {
                    let to = (op.to.ip().octets()[3] - 1) as usize;
                    self.meshes[h].on_sent(2);
                    for (i, pkt) in op.packets.iter().enumerate() {
                        let tx = self.t_ns + i as i64 * 2_000;
                        // The transmit stamp comes back on the error queue.
                        let p = Probe::decode(pkt).unwrap();
                        let own = tx + self.offsets_ns[h];
                        self.meshes[h].on_tx_stamp(op.rail, &p, own, now);
                        let dropped = self
                            .dead
                            .is_some_and(|(dh, dr)| dr == op.rail && (dh == h || dh == to));
                        if dropped {
                            continue;
                        }
                        // 20 µs floor; 30 % of first probes queue up to 200 µs
                        // (their pair then fails the purity test).
                        let r = self.rand();
                        let mut q = if i == 0 && r % 10 < 3 {
                            (r >> 8) as i64 % 200_000
                        } else {
                            0
                        };
                        if let Some((from, dst, extra)) = self.queue {
                            if (from, dst) == (h, to) {
                                q += extra;
                            }
                        }
                        let at = tx + 20_000 + q;
                        if let Some((_, late)) = self.hop_stamps.as_mut().filter(|l| l.0 == h) {
                            late.push(HopStamp {
                                at_ns: at - 1_000,
                                rail: op.rail,
                                packet: *pkt,
                                stamp: at - 1_000 + self.offsets_ns[h],
                            });
                        }
                        self.wire.push((at, to, op.rail, addr(h, op.rail), *pkt));
                    }
                }
            }
            let t = self.t_ns;
            if let Some((sender, late)) = &mut self.hop_stamps {
                let (due, rest): (Vec<_>, Vec<_>) = late.drain(..).partition(|l| l.at_ns <= t);
                *late = rest;
                for l in due {
                    let p = Probe::decode(&l.packet).unwrap();
                    self.meshes[*sender].on_tx_stamp(l.rail, &p, l.stamp, now);
                }
            }
            let (ready, rest): (Vec<_>, Vec<_>) = self.wire.drain(..).partition(|w| w.0 <= t);
            self.wire = rest;
            for (at, to, rail, from, pkt) in ready {
                let p = Probe::decode(&pkt).unwrap();
                let rx = at + self.offsets_ns[to];
                self.meshes[to].on_probe(rail, from, &p, rx, now);
            }
        }
    }
}

#[test]
fn a_tick_probes_every_path_and_each_peer_gets_its_rate() {
    // Three hosts on two rails: host 0 probes two peers, two paths each.
    let mut sim = Sim::new(vec![0, 0, 0], 2);
    let m = &mut sim.meshes[0];
    let mut t = sim.base;
    let (mut ticks, mut per_path) = (0, BTreeMap::<(SocketAddrV4, u32), u32>::new());
    // One simulated second in 1 ms steps.
    for _ in 0..1_000 {
        t += Duration::from_millis(1);
        let ops = m.due(t);
        if !ops.is_empty() {
            ticks += 1;
            assert_eq!(ops.len(), 4, "a tick sends on every path of every peer");
        }
        for op in ops {
            *per_path.entry((op.to, op.rail)).or_default() += 1;
        }
    }
    // 100 pairs/s per peer over two paths: a tick every 20 ms.
    assert!((49..=51).contains(&ticks), "ticks in 1 s: {ticks}");
    assert_eq!(per_path.len(), 4);
    assert!(
        per_path.values().all(|n| (49..=51).contains(n)),
        "pairs per path in 1 s: {per_path:?}"
    );
    assert_eq!(m.next_due().map(|d| d > t), Some(true));
}

#[test]
fn a_governed_rate_stretches_the_ticks_and_stays_under_the_configured_one() {
    let mut sim = Sim::new(vec![0, 0, 0], 2);
    let m = &mut sim.meshes[0];
    let mut t = sim.base;
    let count = |m: &mut Mesh, t: &mut Instant| {
        let mut ticks = 0;
        for _ in 0..1_000 {
            *t += Duration::from_millis(1);
            if !m.due(*t).is_empty() {
                ticks += 1;
            }
        }
        ticks
    };
    count(m, &mut t);
    m.set_rate(40);
    assert_eq!(m.rate(), 40);
    count(m, &mut t); // the first tick after the change keeps its due time
    let ticks = count(m, &mut t);
    // 40 pairs/s per peer over two paths: a tick every 50 ms.
    assert!((19..=21).contains(&ticks), "ticks in 1 s: {ticks}");
    m.set_rate(5_000);
    assert_eq!(m.rate(), 100, "never above the configured rate");
    m.set_rate(0);
    assert_eq!(m.rate(), 1);
    // The governor's floor keeps MIN_PAIRS_PER_PATH on every path.
    assert_eq!(m.min_rate(), 20, "two rails");
    let eight = Sim::new(vec![0, 0], 8);
    assert_eq!(eight.meshes[0].min_rate(), 80, "eight rails");
}

#[test]
fn no_peer_is_always_first_in_a_tick() {
    // Four hosts on one rail: host 0 probes three peers per tick.
    let mut sim = Sim::new(vec![0, 0, 0, 0], 1);
    let m = &mut sim.meshes[0];
    let mut t = sim.base;
    let mut first: BTreeMap<SocketAddrV4, u32> = BTreeMap::new();
    let mut ticks = 0;
    for _ in 0..1_000 {
        if ticks == 30 {
            break;
        }
        t += Duration::from_millis(10);
        let ops = m.due(t);
        if ops.len() == 3 {
            *first.entry(ops[0].to).or_default() += 1;
            ticks += 1;
        }
    }
    assert_eq!(ticks, 30, "every tick probes all three peers");
    assert_eq!(first.len(), 3, "every peer leads some ticks: {first:?}");
    assert!(first.values().all(|&n| n == 10), "evenly: {first:?}");
}

#[test]
fn estimates_offsets_and_one_way_delays_between_two_hosts() {
    let mut sim = Sim::new(vec![0, 300_000], 2);
    let t0 = sim.t_ns;
    sim.run(t0, 3_000);
    let now = sim.now(t0);
    let a = sim.meshes[0].summarise(now);
    assert_eq!(a.len(), 2, "one path per rail");
    for p in &a {
        let e = p.estimate.as_ref().expect("an estimate per path");
        let at_b = e.offset_at(e.at_ns);
        assert!((at_b - 300_000.0).abs() < 100.0, "offset {at_b}");
        // Nothing lost: the peer's random first phase may leave one probe
        // in flight at the window's edge, so one fewer is no loss.
        assert!(
            p.expected > 0 && p.received + 1 >= p.expected && p.received <= p.expected,
            "{p:?}"
        );
        assert!(!p.delays_ns.is_empty());
        // Corrected one-way delays: the floor is the true 20 µs.
        assert!(
            (p.delays_ns[0] - 20_000).abs() < 200,
            "{:?}",
            &p.delays_ns[..3]
        );
        assert!(p.ntp.is_some());
    }
    let b = sim.meshes[1].summarise(now);
    for p in &b {
        let e = p.estimate.as_ref().unwrap();
        assert!((e.offset_ns + 300_000.0).abs() < 100.0, "{}", e.offset_ns);
    }
    assert!(sim.meshes[0].counters.pairs_pure > 100);
    assert!(sim.meshes[0].counters.pairs_impure > 10);
    assert_eq!(sim.meshes[0].counters.refused, 0);
    // Counters reset with each summary.
    let again = sim.meshes[0].summarise(now);
    assert!(again
        .iter()
        .all(|p| p.expected == 0 && p.delays_ns.is_empty()));
}

/// rail1's liveness change, as `check_liveness` reports it.
fn rail1(alive: bool) -> Vec<NicLiveness> {
    vec![NicLiveness {
        nic: "rail1".into(),
        alive,
    }]
}

#[test]
fn a_nic_whose_probes_die_is_found_and_revived() {
    let mut sim = Sim::new(vec![0, 5_000, -7_000], 2);
    let t0 = sim.t_ns;
    sim.run(t0, 1_000);
    for m in &mut sim.meshes {
        let now = sim.base + Duration::from_secs(1);
        assert!(m.check_liveness(now).is_empty(), "all alive");
    }
    let now = sim.now(t0);
    sim.meshes[1].summarise(now);
    sim.dead = Some((0, 1));
    sim.run(t0, 300);
    let now = sim.now(t0);
    assert!(sim.meshes[0].check_liveness(now).is_empty(), "not yet");
    sim.run(t0, 200);
    let now = sim.now(t0);
    assert_eq!(sim.meshes[0].check_liveness(now), rail1(false));
    // The peers still hear each other on rail1: their NICs are fine.
    assert!(sim.meshes[1].check_liveness(now).is_empty());
    assert!(sim.meshes[2].check_liveness(now).is_empty());
    // Loss shows on the paths into the dead NIC.
    // 100 % loss shows on the path into the dead NIC while it is dead
    // (50 pairs/s on it: about 50 probes in the half second).
    let paths = sim.meshes[1].summarise(now);
    let on_rail1 = |peer: &str| {
        paths
            .iter()
            .find(|p| p.peer == peer && p.rail == 1)
            .unwrap()
    };
    let from0 = on_rail1("h0");
    assert_eq!(from0.received, 0, "{from0:?}");
    assert!((40..=60).contains(&from0.expected), "{from0:?}");
    // No loss on the healthy path: everything expected arrived (a probe
    // sent at the window's edge may count on either side of it, so one
    // more or less is no loss).
    let from2 = on_rail1("h2");
    assert!(
        from2.received + 1 >= from2.expected && from2.received <= from2.expected + 1,
        "{from2:?}"
    );
    sim.dead = None;
    sim.run(t0, 50);
    let now = sim.now(t0);
    assert_eq!(sim.meshes[0].check_liveness(now), rail1(true));
}

#[test]
fn a_repaired_nic_is_judged_only_by_its_silence_since_it_came_up() {
    let mut sim = Sim::new(vec![0, 5_000, -7_000], 2);
    let t0 = sim.t_ns;
    sim.run(t0, 1_000);
    // rail1 of h0 goes down (netlink says so) and its probes die.
    let now = sim.now(t0);
    sim.meshes[0].set_netdev("rail1", None);
    sim.dead = Some((0, 1));
    sim.run(t0, 1_000);
    let now_down = sim.now(t0);
    assert!(now_down > now);
    assert!(
        sim.meshes[0].check_liveness(now_down).is_empty(),
        "a NIC netlink has down is not judged"
    );
    // It comes back up; the peers' probes take a while to arrive again:
    // until the first one, the up grace (2 s) applies, not the silence.
    let up_at = sim.now(t0);
    sim.meshes[0].set_netdev("rail1", Some(up_at));
    sim.run(t0, 1_500);
    let now = sim.now(t0);
    assert!(
        sim.meshes[0].check_liveness(now).is_empty(),
        "not condemned for the outage, nor in its up grace"
    );
    // Still silent past the grace: now it is probe-dead.
    sim.run(t0, 600);
    let now = sim.now(t0);
    assert_eq!(sim.meshes[0].check_liveness(now), rail1(false));
    sim.dead = None;
    sim.run(t0, 50);
    let now = sim.now(t0);
    assert_eq!(sim.meshes[0].check_liveness(now), rail1(true));
    // Once probes have arrived since it came up, the ordinary silence
    // (400 ms) judges it again.
    sim.dead = Some((0, 1));
    sim.run(t0, 500);
    let now = sim.now(t0);
    assert_eq!(sim.meshes[0].check_liveness(now), rail1(false));
}

/// Peers whose own NIC on a rail just came up cannot vouch for it: their
/// probes on that rail may not be able to arrive yet (their neighbour
/// entries for us failed while they were down), so our silence on it is
/// no evidence against our NIC until their NICs have settled (the up
/// grace, 2 s). Their probes on the other rail say so.
#[test]
fn peers_whose_nic_just_came_up_are_no_witnesses() {
    let mut sim = Sim::new(vec![0, 5_000, -7_000], 2);
    let t0 = sim.t_ns;
    sim.run(t0, 1_000);
    let up = sim.now(t0);
    for peer in [1, 2] {
        sim.meshes[peer].set_netdev("rail1", Some(up));
    }
    // Nothing arrives on h0's rail1 from now on.
    sim.dead = Some((0, 1));
    sim.run(t0, 1_500);
    let now = sim.now(t0);
    assert!(
        sim.meshes[0].check_liveness(now).is_empty(),
        "silent 1.5 s, but both witnesses' rail1 came up 1.5 s ago"
    );
    // Their rail1 settles (2 s up); the silence now convicts.
    sim.run(t0, 700);
    let now = sim.now(t0);
    assert_eq!(sim.meshes[0].check_liveness(now), rail1(false));
}

#[test]
fn one_peer_cannot_convict_my_nic() {
    // Two hosts: h1's rail1 dies; h0 hears nothing from h1 on rail1
    // but must not blame its own NIC (nor can h1, with one witness).
    let mut sim = Sim::new(vec![0, 0], 2);
    let t0 = sim.t_ns;
    sim.run(t0, 500);
    sim.dead = Some((1, 1));
    sim.run(t0, 1_000);
    let now = sim.now(t0);
    assert!(sim.meshes[0].check_liveness(now).is_empty());
    assert!(sim.meshes[1].check_liveness(now).is_empty());
}

#[test]
fn probes_from_strangers_or_wrong_addresses_are_refused() {
    let mut sim = Sim::new(vec![0, 0], 1);
    let t0 = sim.t_ns;
    sim.run(t0, 100);
    let now = sim.now(t0);
    let good = Probe {
        index: 0,
        rail: 0,
        from: 1,
        to: 0,
        seq: 5,
        settled: 0,
        records: Records::new(),
    };
    let m = &mut sim.meshes[0];
    let before = m.counters.refused;
    // Unknown sender id, spoofed address, wrong rail, not for me.
    m.on_probe(
        0,
        addr(1, 0),
        &Probe {
            from: 9,
            ..good.clone()
        },
        1,
        now,
    );
    m.on_probe(0, addr(7, 0), &good, 1, now);
    m.on_probe(
        0,
        addr(1, 0),
        &Probe {
            rail: 1,
            ..good.clone()
        },
        1,
        now,
    );
    m.on_probe(
        0,
        addr(1, 0),
        &Probe {
            to: 3,
            ..good.clone()
        },
        1,
        now,
    );
    assert_eq!(m.counters.refused - before, 4);
    // One rail only: never probe-dead, whatever the silence.
    assert!(m.check_liveness(now + Duration::from_secs(10)).is_empty());
}

#[test]
fn a_new_plan_keeps_the_state_of_peers_that_stay() {
    let mut sim = Sim::new(vec![0, 1_000, 2_000], 1);
    let t0 = sim.t_ns;
    sim.run(t0, 500);
    let now = sim.now(t0);
    let m = &mut sim.meshes[0];
    assert_eq!(m.paths(), vec![(1, 0), (2, 0)]);
    let keep = PeerSpec {
        host: "h1".into(),
        id: 1,
        nics: [(
            0,
            PeerNic {
                nic: "rail0".into(),
                addr: addr(1, 0),
            },
        )]
        .into(),
    };
    m.set_plan(
        &Plan {
            self_id: 0,
            version: 2,
            peers: vec![keep],
        },
        now,
    );
    assert_eq!(m.paths(), vec![(1, 0)]);
    assert_eq!(m.plan_version(), 2);
    let s = m.summarise(now);
    assert!(
        s[0].estimate.is_some(),
        "h1's estimator survived the new plan"
    );
}

#[test]
fn the_drift_is_disciplined_over_the_recent_windows() {
    let mut path = PathState::new(&PairConfig::default(), 1);
    let mut x: u64 = 99;
    let mut last = None;
    // True drift 150 ppm; each window's own drift is off by up to
    // ±500 ppb and its offset by up to ±200 ns.
    for k in 0..16i64 {
        let mut r = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 2001) as f64 / 1000.0 - 1.0
        };
        let t = 1_000_000_000_000 + k * 1_000_000_000;
        let truth = 5_000.0 + 150_000.0 * (k as f64);
        let e = clocksync::Estimate {
            at_ns: t,
            offset_ns: truth + 200.0 * r(),
            drift_ppb: 150_000.0 + 500.0 * r(),
            error_bound_ns: 400.0,
            drift_error_ppb: 1_000.0,
            half_gap_ns: 1_000.0,
            samples: 200,
            forward_samples: 100,
            reverse_samples: 100,
            outliers: 0,
            bound_from_subsets: true,
        };
        last = Some((path.discipline(e), truth));
    }
    let (d, truth) = last.unwrap();
    assert!((d.drift_ppb - 150_000.0).abs() < 60.0, "{}", d.drift_ppb);
    assert!(
        (d.offset_ns - truth).abs() < 150.0,
        "{} vs {truth}",
        d.offset_ns
    );
    assert!(d.drift_error_ppb < 200.0, "{}", d.drift_error_ppb);
    // A step restarts the history: the window's own figures again.
    let step = clocksync::Estimate {
        at_ns: d.at_ns + 1_000_000_000,
        offset_ns: d.offset_ns + 1_000_000.0,
        ..d.clone()
    };
    let after = path.discipline(step.clone());
    assert_eq!(after, step);
    assert_eq!(path.history.len(), 1);
}

#[test]
fn outgoing_queueing_shows_on_the_sender_only() {
    // h1's clock 300 µs ahead; 20 µs paths, then 2 ms of queue h0 → h1.
    let mut sim = Sim::new(vec![0, 300_000], 1);
    let t0 = sim.t_ns;
    sim.run(t0, 2_000);
    let now = sim.now(t0);
    sim.meshes[0].summarise(now);
    sim.meshes[1].summarise(now);
    sim.run(t0, 500);
    let calm = sim.meshes[0].outgoing(1, 0).expect("a sample");
    assert!(
        (calm.baseline_ns - 20_000).abs() < 1_000,
        "baseline under the line: {calm:?}"
    );
    assert!(calm.queueing_ns < 250_000, "{calm:?}");
    sim.queue = Some((0, 1, 2_000_000));
    sim.run(t0, 500);
    let now = sim.now(t0);
    let q = sim.meshes[0].outgoing(1, 0).unwrap();
    assert!(
        (q.queueing_ns - 2_000_000).abs() < 250_000,
        "the sender sees its queue: {q:?}"
    );
    assert!(now.saturating_duration_since(q.at) < Duration::from_millis(100));
    let back = sim.meshes[1].outgoing(0, 0).unwrap();
    assert!(back.queueing_ns < 250_000, "not the other way: {back:?}");
    // Published by peer address, once per fresh sample.
    let board = QueueingBoard::new();
    sim.meshes[0].publish_outgoing(&board);
    let e = board.get(*addr(1, 0).ip()).expect("h1 on the board");
    assert_eq!((e.peer.as_str(), e.rail), ("h1", 0));
    assert_eq!(e.sample, q);
    sim.queue = None;
    sim.run(t0, 200);
    assert!(sim.meshes[0].outgoing(1, 0).unwrap().queueing_ns < 250_000);
}

#[test]
fn a_probe_stamped_again_at_a_later_hop_keeps_its_first_stamp() {
    // h0's probes are also stamped just before they arrive, after any
    // queue (a bridge in the same kernel): the first stamp is the
    // sender's, so the clock line and the queueing stay right. (With
    // the last stamp, h0's one-way delays would read 1 µs against
    // h1's 20 µs: the offset ~9.5 µs off.)
    let mut sim = Sim::new(vec![0, 300_000], 1);
    sim.hop_stamps = Some((0, Vec::new()));
    let t0 = sim.t_ns;
    sim.run(t0, 2_000);
    let now = sim.now(t0);
    let summary = sim.meshes[0].summarise(now);
    let line = summary[0].estimate.as_ref().expect("a line");
    assert!(
        (line.offset_ns - 300_000.0).abs() < 1_000.0,
        "offset from the first stamps: {line:?}"
    );
    sim.meshes[1].summarise(now);
    sim.queue = Some((0, 1, 2_000_000));
    sim.run(t0, 500);
    let q = sim.meshes[0].outgoing(1, 0).unwrap();
    assert!(
        (q.queueing_ns - 2_000_000).abs() < 250_000,
        "the queue before the later hop is seen: {q:?}"
    );
    let repeated = sim.meshes[0].counters.tx_stamps_repeated;
    assert!(
        repeated > 100,
        "later stamps are counted and ignored: {repeated}"
    );
}

#[test]
fn bad_rates_are_refused() {
    let cfg = MeshConfig {
        pairs_per_s: 0,
        ..MeshConfig::default()
    };
    assert!(Mesh::new(cfg, vec![], 1, Instant::now()).is_err());
}
