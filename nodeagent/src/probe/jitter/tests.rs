use super::*;
use crate::probe::loss::PeerCounts;

/// A host with rails 0 and 1 and `peers` peers, each completing 50 pairs a
/// second on each rail. Every peer's raw delays carry its own clock offset
/// and ±20 µs of noise; `extra(rail, peer, rng)` adds a delay per sample.
struct World {
    t0: Instant,
    judge: JitterJudge,
    peers: u32,
    rng: u64,
    up_since: Instant,
}

impl World {
    fn new(peers: u32) -> Self {
        let t0 = Instant::now();
        Self {
            t0,
            judge: JitterJudge::new(JitterConfig::default()),
            peers,
            rng: 0x9e37_79b9_7f4a_7c15,
            up_since: t0,
        }
    }

    fn next(&mut self) -> u64 {
        // xorshift64: deterministic noise.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// The judge's view at `ms`: the last second's 50 samples per path.
    fn look(&mut self, ms: u64, extra: &dyn Fn(u32, u32, u64) -> i64) -> Vec<NicJitter> {
        let mut rails = Vec::new();
        for rail in 0..2u32 {
            let mut peers = Vec::new();
            for p in 0..self.peers {
                let delays = (0..50)
                    .map(|_| {
                        let r = self.next();
                        let noise = (r % 40_000) as i64 - 20_000;
                        1_000_000 * i64::from(p) + 30_000 + noise + extra(rail, p, self.next())
                    })
                    .collect();
                peers.push(PeerCounts {
                    peer: p,
                    expected: 0,
                    received: 0,
                    witness: true,
                    delays,
                });
            }
            rails.push(RailCounts {
                rail,
                nic: format!("rail{rail}"),
                up_since: Some(self.up_since),
                judged: true,
                peers,
            });
        }
        self.judge
            .observe(self.t0 + Duration::from_millis(ms), &rails)
    }

    /// Looks every 100 ms from `from` to `to`; every change with its time.
    fn run(
        &mut self,
        from: u64,
        to: u64,
        extra: &dyn Fn(u32, u32, u64) -> i64,
    ) -> Vec<(u64, NicJitter)> {
        let mut out = Vec::new();
        for ms in (from..to).step_by(100) {
            for c in self.look(ms, extra) {
                out.push((ms, c));
            }
        }
        out
    }
}

/// Rails 0 and 1, never down, each with three witness peers whose raw
/// delays are `rail0` and `rail1`.
fn three_peers(rail0: Vec<i64>, rail1: Vec<i64>) -> Vec<RailCounts> {
    [rail0, rail1]
        .into_iter()
        .enumerate()
        .map(|(rail, delays)| RailCounts {
            rail: rail as u32,
            nic: format!("rail{rail}"),
            up_since: None,
            judged: true,
            peers: (0..3)
                .map(|peer| PeerCounts {
                    peer,
                    expected: 0,
                    received: 0,
                    witness: true,
                    delays: delays.clone(),
                })
                .collect(),
        })
        .collect()
}

/// A fifth of the samples held back by up to `max_ns` (a port that stands
/// still a fifth of the time).
fn pauses(max_ns: u64) -> impl Fn(u64) -> i64 {
    move |r| {
        if r % 5 == 0 {
            ((r >> 8) % max_ns) as i64
        } else {
            0
        }
    }
}

#[test]
fn a_rail_that_holds_back_every_peers_probes_is_delayed_at_once_and_clean_after_the_hold() {
    let mut w = World::new(3);
    // Judged from the first look: settled a window and SETTLE later.
    assert_eq!(
        SETTLE + JitterConfig::default().window,
        Duration::from_secs(3)
    );
    assert!(w.run(0, 3_000, &|_, _, _| 0).is_empty());
    let p = pauses(6_000_000);
    let found = w.run(3_000, 6_000, &|rail, _, r| if rail == 0 { p(r) } else { 0 });
    assert_eq!(found.len(), 1, "{found:?}");
    let (at, c) = &found[0];
    assert!(c.delayed && c.nic == "rail0", "{c:?}");
    assert_eq!(*at, 3_000, "found at {at} ms");
    assert_eq!((c.peers, c.delayed_peers), (3, 3), "{c:?}");
    // A fifth held back, nearly all of those by more than 300 µs.
    assert!(c.late_pct > 10.0 && c.late_pct <= 30.0, "{c:?}");
    // The pauses end: clean at the first look after the 3 s hold.
    let clean = w.run(6_000, 9_000, &|_, _, _| 0);
    assert_eq!(clean.len(), 1, "{clean:?}");
    assert!(!clean[0].1.delayed && clean[0].0 == 6_000, "{clean:?}");
    // Still pausing after the hold: stays delayed (no report).
    let mut w = World::new(3);
    assert_eq!(
        w.run(0, 6_000, &|rail, _, r| if rail == 0 { p(r) } else { 0 })
            .len(),
        1
    );
}

#[test]
fn a_congested_uplink_some_peers_cross_slow_peers_host_wide_delays_and_short_holds_are_no_verdict()
{
    let p = pauses(6_000_000);
    // Three of five peers cross a congested uplink into rail 0 (the
    // contention scenario's two leaves): under three quarters.
    let mut w = World::new(5);
    let uplink = w.run(0, 5_000, &|rail, peer, r| {
        if rail == 0 && peer >= 2 {
            p(r)
        } else {
            0
        }
    });
    assert!(uplink.is_empty(), "{uplink:?}");
    // Every peer's probes on every rail (this host's receive path late).
    let mut w = World::new(3);
    let all = w.run(0, 5_000, &|_, _, r| p(r));
    assert!(all.is_empty(), "{all:?}");
    // Two peers delay every rail they send on (their clocks step, their
    // senders stall): they are no witnesses, one delayed peer is not two.
    let mut w = World::new(3);
    let peers = w.run(0, 5_000, &|rail, peer, r| {
        if peer < 2 || rail == 0 {
            p(r)
        } else {
            0
        }
    });
    assert!(peers.is_empty(), "{peers:?}");
    // Held back, but never by 300 µs.
    let mut w = World::new(3);
    let low = w.run(0, 5_000, &|rail, _, r| {
        if rail == 0 {
            pauses(250_000)(r)
        } else {
            0
        }
    });
    assert!(low.is_empty(), "{low:?}");
}

#[test]
fn a_bounce_forgets_the_verdict_and_too_few_samples_count_no_peer() {
    let p = pauses(6_000_000);
    let delayed = |rail: u32, _: u32, r: u64| if rail == 0 { p(r) } else { 0 };
    let mut w = World::new(3);
    assert_eq!(w.run(0, 4_000, &delayed).len(), 1);
    // Down and up between two looks: forgotten, settled again, found
    // again (a report each time).
    w.up_since += Duration::from_millis(4_000);
    let again = w.run(4_000, 7_500, &delayed);
    assert_eq!(again.len(), 1, "{again:?}");
    assert!(again[0].1.delayed && again[0].0 == 7_000, "{again:?}");

    // Peers with fewer than MIN_SAMPLES samples are not counted.
    let mut judge = JitterJudge::new(JitterConfig::default());
    let rails = three_peers(vec![0, 5_000_000, 0, 5_000_000], vec![0; 4]);
    let t0 = Instant::now();
    for s in 0..5 {
        assert!(judge
            .observe(t0 + Duration::from_secs(s), &rails)
            .is_empty());
    }
}

#[test]
fn extreme_delays_from_the_wire_count_without_overflow() {
    // A peer's timestamps are what it sends: the raw delays may be
    // anything, and the judge must neither panic nor wrap.
    let mut v = vec![i64::MIN; 5];
    v.extend([i64::MAX; 20]);
    assert_eq!(late_count(&mut v, 300_000), 20);
    let mut judge = JitterJudge::new(JitterConfig::default());
    let mut rail0 = vec![i64::MIN; 20];
    rail0.extend([i64::MAX; 10]);
    let rails = three_peers(rail0, vec![0; 30]);
    let t0 = Instant::now();
    assert!(judge.observe(t0, &rails).is_empty(), "not settled yet");
    let found = judge.observe(t0 + Duration::from_secs(3), &rails);
    assert!(
        found.len() == 1 && found[0].nic == "rail0" && found[0].delayed,
        "{found:?}"
    );
}

#[test]
fn a_nic_back_from_an_outage_is_not_judged_by_its_first_late_probes() {
    let p = pauses(6_000_000);
    let delayed = |rail: u32, _: u32, r: u64| if rail == 0 { p(r) } else { 0 };
    let mut w = World::new(3);
    // Late from the first look (the probes the peers queued while the NIC
    // was dead): nothing before SETTLE and a window have passed.
    let early = w.run(0, 2_900, &delayed);
    assert!(early.is_empty(), "{early:?}");
    assert_eq!(w.run(2_900, 3_100, &delayed).len(), 1);
}

#[test]
fn a_slowed_mesh_reaches_back_for_its_samples_but_not_past_the_reach() {
    let now = Instant::now() + Duration::from_secs(60);
    let window = Duration::from_secs(1);
    // 50 a second: the last second's 50.
    let fast: VecDeque<(Instant, i64)> = (0..200)
        .map(|i: u64| (now - Duration::from_millis(20 * (200 - i)), i as i64))
        .collect();
    assert_eq!(samples(&fast, now, window).len(), 49);
    // 12.5 a second (the governor's floor): the newest 20, 1.6 s back.
    let slow: VecDeque<(Instant, i64)> = (0..100)
        .map(|i: u64| (now - Duration::from_millis(80 * (100 - i)), i as i64))
        .collect();
    let got = samples(&slow, now, window);
    assert_eq!(got.len(), MIN_SAMPLES);
    assert_eq!(got[0], 99, "newest first");
    // One every second: never older than the reach.
    let sparse: VecDeque<(Instant, i64)> = (0..30)
        .map(|i: u64| (now - Duration::from_secs(30 - i), i as i64))
        .collect();
    assert_eq!(samples(&sparse, now, window).len(), 3);
}
