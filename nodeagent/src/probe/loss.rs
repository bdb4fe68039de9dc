//! Gray links: a NIC that loses a share of the probes sent to it while its
//! link stays up (a dirty fibre, a failing transceiver, a congested port
//! that drops). Without sockets (unit-testable).
//!
//! The mesh counts, per (peer, rail), the probes a peer's sequence numbers
//! say were sent and those that arrived ([`super::mesh::Mesh::loss_counts`]).
//! Every [`MARK_EVERY`] the judge keeps a mark of those totals per rail;
//! the loss of the last `window` is the difference between now and the
//! newest mark at least a window old. One of this host's NICs is *lossy*
//! when, over that window:
//! - at least [`MIN_LOSSY_PEERS`] witnesses, and at least half of those
//!   counted, each lost `threshold` or more of their probes to it (one peer
//!   that restarted or flapped shows a burst of "loss" alone);
//! - [`MIN_LOST`] probes at least were lost in all;
//! - every other rail of this host lost less than a quarter of `threshold`
//!   (a receive buffer that overflows because the probe thread was starved
//!   loses on every rail: that is this host's trouble, not one link's).
//!
//! A peer counts only while it is a witness (heard lately, its own NIC on
//! the rail settled) and expected [`MIN_PEER_EXPECTED`] probes at least in
//! the window. A NIC is judged only once it has been up for the mesh's up
//! grace and while it is not probe-dead (silence is the liveness check's);
//! its marks start again whenever that changes, so an outage's missing
//! probes are never read as loss. A lossy NIC is clean again once its loss
//! over the window is below a quarter of `threshold` and it has been lossy
//! for `hold` at least; a NIC that goes down (or down and up between two
//! looks) loses its verdict without a report (the link tracker forgets it
//! too). A host with one rail is never judged. Loss on what a host sends
//! is seen by each receiver from one sender only, below the two
//! witnesses: it is not found here.
//!
//! Every queue here is bounded.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// How often a rail's totals are marked.
pub const MARK_EVERY: Duration = Duration::from_millis(100);
/// Probes a peer must have been expected to send in the window to count.
pub const MIN_PEER_EXPECTED: u64 = 20;
/// Probes lost in all (over the counted peers) before a NIC is lossy.
pub const MIN_LOST: u64 = 6;
/// Witnesses that must each see the loss.
pub const MIN_LOSSY_PEERS: usize = 2;
/// Longest loss window accepted (the marks kept follow from it).
pub const MAX_WINDOW: Duration = Duration::from_secs(10);

/// Tuning of the loss judge.
#[derive(Debug, Clone, PartialEq)]
pub struct LossConfig {
    /// Window over which loss is measured. Default 1 s.
    pub window: Duration,
    /// Share of probes lost (0–1) that makes a NIC lossy. Default 0.02;
    /// 0 turns the judge off.
    pub threshold: f64,
    /// Least time a NIC stays lossy once found so. Default 3 s.
    pub hold: Duration,
}

impl Default for LossConfig {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(1),
            threshold: 0.02,
            hold: Duration::from_secs(3),
        }
    }
}

/// One peer's probe totals on one of this host's rails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCounts {
    pub peer: u32,
    /// Probes expected from the peer's sequence numbers, ever.
    pub expected: u64,
    /// Probes received, ever.
    pub received: u64,
    /// Heard lately (on any rail) with its own NIC on the rail settled.
    pub witness: bool,
    /// Raw one-way delays (rx − tx, ns) of the peer's pairs that completed
    /// on the rail lately, newest first ([`super::jitter::samples`]).
    pub delays: Vec<i64>,
}

/// One of this host's rails as the loss and delay judges see it
/// ([`super::mesh::Mesh::loss_counts`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RailCounts {
    pub rail: u32,
    pub nic: String,
    /// Since when netlink has the NIC up (None: down).
    pub up_since: Option<Instant>,
    /// Whether the NIC may be judged now.
    pub judged: bool,
    pub peers: Vec<PeerCounts>,
}

/// A change of a NIC's loss verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct NicLoss {
    pub nic: String,
    pub lossy: bool,
    /// Share of the counted peers' probes lost over the window (%).
    pub loss_pct: f64,
    /// Peers counted, and those that each saw the threshold exceeded.
    pub peers: usize,
    pub lossy_peers: usize,
}

#[derive(Debug)]
struct Mark {
    at: Instant,
    /// Peer → (expected, received) totals, witnesses only.
    totals: BTreeMap<u32, (u64, u64)>,
}

#[derive(Debug, Default)]
struct RailState {
    marks: VecDeque<Mark>,
    up_since: Option<Instant>,
    lossy_since: Option<Instant>,
}

/// Loss of one rail over the window.
#[derive(Debug, Clone, Copy, Default)]
struct Window {
    expected: u64,
    lost: u64,
    peers: usize,
    lossy_peers: usize,
}

impl Window {
    fn ratio(&self) -> f64 {
        if self.expected == 0 {
            0.0
        } else {
            self.lost as f64 / self.expected as f64
        }
    }
}

/// Judges this host's NICs by the probes they lose.
#[derive(Debug)]
pub struct LossJudge {
    cfg: LossConfig,
    rails: BTreeMap<u32, RailState>,
}

impl LossJudge {
    pub fn new(cfg: LossConfig) -> Self {
        Self {
            cfg,
            rails: BTreeMap::new(),
        }
    }

    fn max_marks(&self) -> usize {
        let w = self.cfg.window.min(MAX_WINDOW);
        (w.as_millis() / MARK_EVERY.as_millis()) as usize + 2
    }

    /// Takes the mesh's totals at `now`; returns the NICs whose verdict
    /// changed.
    pub fn observe(&mut self, now: Instant, counts: &[RailCounts]) -> Vec<NicLoss> {
        // One rail alone cannot tell a bad link from this host's own
        // receive path losing (the liveness check needs two rails too).
        if self.cfg.threshold <= 0.0 || counts.len() < 2 {
            return Vec::new();
        }
        let cap = self.max_marks();
        let window = self.cfg.window;
        let thr = self.cfg.threshold;
        let mut windows: BTreeMap<u32, Window> = BTreeMap::new();
        for rc in counts {
            let st = self.rails.entry(rc.rail).or_default();
            if st.up_since != rc.up_since {
                // Down, or down and up again (however briefly): the link
                // tracker forgets its verdict, and so does the judge.
                st.marks.clear();
                st.up_since = rc.up_since;
                st.lossy_since = None;
            }
            if !rc.judged {
                st.marks.clear();
                continue;
            }
            let totals: BTreeMap<u32, (u64, u64)> = rc
                .peers
                .iter()
                .filter(|p| p.witness)
                .map(|p| (p.peer, (p.expected, p.received)))
                .collect();
            let base = st
                .marks
                .iter()
                .rev()
                .find(|m| now.saturating_duration_since(m.at) >= window);
            if let Some(base) = base {
                let mut w = Window::default();
                for (peer, (e1, r1)) in &totals {
                    let Some((e0, r0)) = base.totals.get(peer) else {
                        continue;
                    };
                    let e = e1.saturating_sub(*e0);
                    let r = r1.saturating_sub(*r0);
                    if e < MIN_PEER_EXPECTED {
                        continue;
                    }
                    let lost = e.saturating_sub(r);
                    w.peers += 1;
                    w.expected += e;
                    w.lost += lost;
                    if lost as f64 >= thr * e as f64 {
                        w.lossy_peers += 1;
                    }
                }
                windows.insert(rc.rail, w);
            }
            if st
                .marks
                .back()
                .is_none_or(|m| now.saturating_duration_since(m.at) >= MARK_EVERY)
            {
                if st.marks.len() >= cap {
                    st.marks.pop_front();
                }
                st.marks.push_back(Mark { at: now, totals });
            }
        }
        let mut out = Vec::new();
        for rc in counts {
            let Some(w) = windows.get(&rc.rail).copied() else {
                continue;
            };
            let others_clean = windows
                .iter()
                .filter(|(r, _)| **r != rc.rail)
                .all(|(_, o)| o.ratio() < thr / 4.0);
            let st = self.rails.get_mut(&rc.rail).expect("entered above");
            let change = match st.lossy_since {
                None => {
                    let lossy = w.lossy_peers >= MIN_LOSSY_PEERS
                        && 2 * w.lossy_peers >= w.peers
                        && w.lost >= MIN_LOST
                        && w.ratio() >= thr
                        && others_clean;
                    lossy.then(|| {
                        st.lossy_since = Some(now);
                        true
                    })
                }
                Some(since) => {
                    let clean = now.saturating_duration_since(since) >= self.cfg.hold
                        && w.ratio() < thr / 4.0;
                    clean.then(|| {
                        st.lossy_since = None;
                        false
                    })
                }
            };
            if let Some(lossy) = change {
                out.push(NicLoss {
                    nic: rc.nic.clone(),
                    lossy,
                    loss_pct: 100.0 * w.ratio(),
                    peers: w.peers,
                    lossy_peers: w.lossy_peers,
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host with rails 0 and 1 and `peers` peers, each sending 100
    /// probes a second on each rail; rail 0 loses `loss0` of them (per
    /// peer, from `lossy` peers on), rail 1 `loss1`.
    struct World {
        t0: Instant,
        judge: LossJudge,
        totals: BTreeMap<(u32, u32), (f64, f64)>,
        peers: u32,
    }

    impl World {
        fn new(peers: u32) -> Self {
            Self {
                t0: Instant::now(),
                judge: LossJudge::new(LossConfig::default()),
                totals: BTreeMap::new(),
                peers,
            }
        }

        /// Advances 50 ms with the given per-peer loss on each rail;
        /// returns the verdict changes.
        fn step(&mut self, ms: u64, loss: impl Fn(u32, u32) -> f64) -> Vec<NicLoss> {
            let now = self.t0 + Duration::from_millis(ms);
            let mut counts = Vec::new();
            for rail in 0..2 {
                let mut peers = Vec::new();
                for p in 0..self.peers {
                    let t = self.totals.entry((rail, p)).or_default();
                    t.0 += 5.0;
                    t.1 += 5.0 * (1.0 - loss(rail, p));
                    peers.push(PeerCounts {
                        peer: p,
                        expected: t.0 as u64,
                        received: t.1 as u64,
                        witness: true,
                        delays: Vec::new(),
                    });
                }
                counts.push(RailCounts {
                    rail,
                    nic: format!("rail{rail}"),
                    up_since: Some(self.t0),
                    judged: true,
                    peers,
                });
            }
            self.judge.observe(now, &counts)
        }

        /// Runs from `from` to `to` ms in 50 ms steps; every change with
        /// its time.
        fn run(
            &mut self,
            from: u64,
            to: u64,
            loss: impl Fn(u32, u32) -> f64,
        ) -> Vec<(u64, NicLoss)> {
            let mut out = Vec::new();
            for ms in (from..to).step_by(50) {
                for c in self.step(ms, &loss) {
                    out.push((ms, c));
                }
            }
            out
        }
    }

    #[test]
    fn a_rail_losing_a_tenth_of_every_peers_probes_is_lossy_within_half_a_second_and_clean_after_it_ends(
    ) {
        let mut w = World::new(3);
        assert!(w.run(0, 3_000, |_, _| 0.0).is_empty());
        let found = w.run(3_000, 6_000, |r, _| if r == 0 { 0.1 } else { 0.0 });
        assert_eq!(found.len(), 1, "{found:?}");
        let (at, c) = &found[0];
        assert!(c.lossy && c.nic == "rail0", "{c:?}");
        assert!(*at < 3_500, "found at {at} ms");
        assert_eq!(c.lossy_peers, 3, "{c:?}");
        // Loss ends: clean once the window has no loss and the hold ran.
        let clean = w.run(6_000, 10_000, |_, _| 0.0);
        assert_eq!(clean.len(), 1, "{clean:?}");
        // (Most of the last lossy 100 ms rounds to no probe lost.)
        assert!(!clean[0].1.lossy && clean[0].0 >= 6_800, "{clean:?}");
    }

    #[test]
    fn one_peer_losing_alone_loss_on_every_rail_and_loss_below_the_threshold_are_no_verdict() {
        // One peer (it restarted, or its own link is bad).
        let mut w = World::new(3);
        let one = w.run(0, 5_000, |r, p| if r == 0 && p == 0 { 0.5 } else { 0.0 });
        assert!(one.is_empty(), "{one:?}");
        // Every rail loses: this host's receive path, not a link.
        let mut w = World::new(3);
        let all = w.run(0, 5_000, |_, _| 0.1);
        assert!(all.is_empty(), "{all:?}");
        // 1 % stays under the 2 % threshold.
        let mut w = World::new(3);
        let low = w.run(0, 5_000, |r, _| if r == 0 { 0.01 } else { 0.0 });
        assert!(low.is_empty(), "{low:?}");
        // A single peer cannot be two witnesses.
        let mut w = World::new(1);
        let lone = w.run(0, 5_000, |r, _| if r == 0 { 0.2 } else { 0.0 });
        assert!(lone.is_empty(), "{lone:?}");
    }

    #[test]
    fn a_bounce_between_two_looks_forgets_the_verdict_so_a_still_lossy_nic_is_found_again() {
        let mut w = World::new(3);
        let lossy = |r: u32, _: u32| if r == 0 { 0.1 } else { 0.0 };
        let found = w.run(0, 2_000, lossy);
        assert!(found.iter().any(|(_, c)| c.lossy), "{found:?}");
        // Down and up again between two looks: only "up since" changed.
        w.t0 += Duration::from_millis(1);
        let t = w.t0;
        w.totals.clear();
        let mut again = Vec::new();
        for ms in (2_000..5_000).step_by(50) {
            let now = t + Duration::from_millis(ms);
            let mut counts = Vec::new();
            for rail in 0..2u32 {
                let peers = (0..3u32)
                    .map(|p| {
                        let e = (ms - 2_000) / 10;
                        let lost = if rail == 0 { e / 10 } else { 0 };
                        PeerCounts {
                            peer: p,
                            expected: e,
                            received: e - lost,
                            witness: true,
                            delays: Vec::new(),
                        }
                    })
                    .collect();
                counts.push(RailCounts {
                    rail,
                    nic: format!("rail{rail}"),
                    up_since: Some(t + Duration::from_millis(1_999)),
                    judged: true,
                    peers,
                });
            }
            again.extend(w.judge.observe(now, &counts));
        }
        assert!(
            again.iter().any(|c| c.lossy && c.nic == "rail0"),
            "still losing after the bounce, but not found again: {again:?}"
        );
    }

    #[test]
    fn a_nic_not_judged_loses_its_marks_so_an_outage_is_not_read_as_loss() {
        let mut w = World::new(3);
        let t0 = w.t0;
        let counts = |ms: u64, judged: bool, lost: u64| {
            (0..2)
                .map(|rail| RailCounts {
                    rail,
                    nic: format!("rail{rail}"),
                    up_since: Some(t0),
                    judged: judged || rail == 1,
                    peers: (0..3)
                        .map(|p| PeerCounts {
                            peer: p,
                            expected: ms / 10,
                            received: ms / 10 - if rail == 0 { lost } else { 0 },
                            witness: true,
                            delays: Vec::new(),
                        })
                        .collect(),
                })
                .collect::<Vec<_>>()
        };
        let at = |ms| t0 + Duration::from_millis(ms);
        for ms in (0..2_000).step_by(50) {
            assert!(w.judge.observe(at(ms), &counts(ms, true, 0)).is_empty());
        }
        // Probe-dead for a while: 150 probes per peer vanish meanwhile.
        for ms in (2_000..3_000).step_by(50) {
            assert!(w.judge.observe(at(ms), &counts(ms, false, 150)).is_empty());
        }
        for ms in (3_000..6_000).step_by(50) {
            let c = w.judge.observe(at(ms), &counts(ms, true, 150));
            assert!(c.is_empty(), "{ms}: {c:?}");
        }
    }
}
