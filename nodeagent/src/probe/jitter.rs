//! Gray links that delay: a NIC whose link stays up, loses nothing, but
//! holds packets back now and then (a port receiving pause frames, a link
//! that retries at the link layer, a failing transceiver). Without sockets
//! (unit-testable).
//!
//! Only what a NIC receives is judged (a NIC that holds back what it
//! sends shows as one slow sender to each peer, below the two witnesses,
//! as with loss).
//!
//! **Samples.** For every pair of a peer's that completes on a path
//! peer → me, the raw delay of its first probe, `rx − tx` (my clock minus
//! the peer's, so the clocks' offset is in it; over one window it moves by
//! the drift alone, tens of µs at most). The mesh hands the judge each
//! path's samples of the last `window` (or its newest [`MIN_SAMPLES`],
//! up to [`MAX_REACH`] old, when the window holds fewer)
//! ([`super::mesh::Mesh::loss_counts`], beside the loss totals).
//!
//! **Late share.** Of one path over the window: the share of its samples
//! more than `late` above the window's floor (its 10th percentile: the
//! offset cancels). A port that stops now and then holds back the probes
//! that meet a stop and no others, so the share is the part of the time
//! the port stands still, seen by every peer alike; a queue that builds
//! slowly would lift the floor with it. A peer is a *delayed witness* of
//! one of this host's rails when, over the window,
//! - it is a witness (heard lately, its own NIC on the rail settled) with
//!   [`MIN_SAMPLES`] samples at least on the rail;
//! - [`LATE_SHARE`] of them at least, and two at least, are late;
//! - on each other rail it probes this host on, under half that share is
//!   late (a peer whose clock stepped, or this host's own receive path
//!   running late, delays every rail alike: that is no link's fault).
//!
//! **Verdict.** Only once the NIC has been judged for [`SETTLE`] and a
//! window without a break (a returning NIC's first probes come in a late
//! burst). A NIC is *delayed* when at least [`MIN_DELAYED_PEERS`]
//! peers and three quarters of those counted are delayed witnesses: its
//! own cable delays what every peer sends, whereas a congested uplink in
//! the fabric delays only the peers whose path crosses it (that is the
//! contention detector's to find, and reshaping's to cure). It is clean
//! again once at most a quarter of the counted peers see half the share
//! late and it has been delayed for `hold` at least. As in
//! [`super::loss`], a NIC is judged only once up for the mesh's up grace
//! and while not probe-dead, loses its verdict without a report when it
//! goes down (or down and up between two looks), and a host with one rail
//! is never judged.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use super::loss::RailCounts;

/// Samples a peer needs on a rail to count (at the default rate a peer
/// completes 50 pairs a second on each of two rails, a second's worth;
/// a mesh the CPU governor slowed reaches back further for them, up to
/// [`MAX_REACH`]: at the governor's floor, 12.5 pairs a second per path,
/// 1.6 s).
pub const MIN_SAMPLES: usize = 20;
/// How far back the mesh reaches for [`MIN_SAMPLES`] when the window holds
/// fewer.
pub const MAX_REACH: Duration = Duration::from_secs(4);
/// Share of a path's samples that must be late for its peer to be a
/// delayed witness.
pub const LATE_SHARE: f64 = 0.03;
/// Delayed witnesses needed at least.
pub const MIN_DELAYED_PEERS: usize = 2;
/// How long a NIC must have been judged (up past the mesh's grace, not
/// probe-dead) before a window of it counts: after an outage the peers'
/// neighbour entries resolve again and the probes they queued meanwhile
/// arrive late in a burst, which is no trait of the link. The first
/// verdict comes a window after this at the earliest.
pub const SETTLE: Duration = Duration::from_secs(2);

/// Tuning of the delay judge.
#[derive(Debug, Clone, PartialEq)]
pub struct JitterConfig {
    /// Window over which each path's samples are taken. Default 1 s.
    pub window: Duration,
    /// How far above the window's floor a sample is late. Default 300 µs;
    /// zero turns the judge off.
    pub late: Duration,
    /// Least time a NIC stays delayed once found so. Default 3 s.
    pub hold: Duration,
}

impl Default for JitterConfig {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(1),
            late: Duration::from_micros(300),
            hold: Duration::from_secs(3),
        }
    }
}

/// A change of a NIC's delay verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct NicJitter {
    pub nic: String,
    pub delayed: bool,
    /// The median of the counted peers' late shares on the NIC (%).
    pub late_pct: f64,
    /// Peers counted, and the delayed witnesses among them.
    pub peers: usize,
    pub delayed_peers: usize,
}

/// The raw delays the judge takes from one path's latest samples
/// `(completed at, delay)`, oldest first: those of the last `window`, or
/// the newest [`MIN_SAMPLES`] while they are under [`MAX_REACH`] old (a
/// mesh the CPU governor slowed completes fewer pairs a second).
pub fn samples(recent: &VecDeque<(Instant, i64)>, now: Instant, window: Duration) -> Vec<i64> {
    recent
        .iter()
        .rev()
        .enumerate()
        .take_while(|(i, (at, _))| {
            let age = now.saturating_duration_since(*at);
            age < window || (*i < MIN_SAMPLES && age < MAX_REACH)
        })
        .map(|(_, (_, d))| *d)
        .collect()
}

/// Of `v` (reordered in place): how many samples are more than `late` ns
/// above its 10th percentile.
fn late_count(v: &mut [i64], late: i64) -> usize {
    if v.is_empty() {
        return 0;
    }
    let k = (v.len() - 1) / 10;
    let floor = *v.select_nth_unstable(k).1;
    // Saturating: the delays are differences of a peer's timestamps.
    v.iter().filter(|d| d.saturating_sub(floor) > late).count()
}

/// One rail over the window.
#[derive(Debug, Clone, Copy, Default)]
struct Window {
    peers: usize,
    delayed: usize,
    /// Peers that see at least half the share late.
    half: usize,
    median_late: f64,
}

#[derive(Debug, Default)]
struct RailState {
    up_since: Option<Instant>,
    /// Since when the NIC has been judged without a break.
    judged_since: Option<Instant>,
    delayed_since: Option<Instant>,
}

/// Judges this host's NICs by how unevenly their probes arrive.
#[derive(Debug)]
pub struct JitterJudge {
    cfg: JitterConfig,
    rails: BTreeMap<u32, RailState>,
}

impl JitterJudge {
    pub fn new(cfg: JitterConfig) -> Self {
        Self {
            cfg,
            rails: BTreeMap::new(),
        }
    }

    /// Takes the mesh's view at `now` (each peer's samples of the last
    /// window); returns the NICs whose verdict changed.
    pub fn observe(&mut self, now: Instant, rails: &[RailCounts]) -> Vec<NicJitter> {
        let late = i64::try_from(self.cfg.late.as_nanos()).unwrap_or(i64::MAX);
        if late == 0 || rails.len() < 2 {
            return Vec::new();
        }
        // Late share and count per (peer, rail), over witnesses with
        // enough samples.
        let mut shares: BTreeMap<(u32, u32), (f64, usize)> = BTreeMap::new();
        for rc in rails {
            for p in rc.peers.iter().filter(|p| p.witness) {
                if p.delays.len() >= MIN_SAMPLES {
                    let mut d = p.delays.clone();
                    let n = late_count(&mut d, late);
                    shares.insert((p.peer, rc.rail), (n as f64 / d.len() as f64, n));
                }
            }
        }
        let mut out = Vec::new();
        for rc in rails {
            let st = self.rails.entry(rc.rail).or_default();
            if st.up_since != rc.up_since {
                // Down, or down and up again (however briefly): the link
                // tracker forgets its verdict, and so does the judge.
                st.up_since = rc.up_since;
                st.judged_since = None;
                st.delayed_since = None;
            }
            if !rc.judged {
                st.judged_since = None;
                continue;
            }
            let judged_since = *st.judged_since.get_or_insert(now);
            if st.delayed_since.is_none()
                && now.saturating_duration_since(judged_since) < SETTLE + self.cfg.window
            {
                continue;
            }
            let mut w = Window::default();
            let mut counted = Vec::new();
            for p in rc.peers.iter().filter(|p| p.witness) {
                let Some(&(share, n)) = shares.get(&(p.peer, rc.rail)) else {
                    continue;
                };
                w.peers += 1;
                counted.push(share);
                if share >= LATE_SHARE / 2.0 {
                    w.half += 1;
                }
                let others_calm = shares
                    .iter()
                    .filter(|((peer, rail), _)| *peer == p.peer && *rail != rc.rail)
                    .all(|(_, (o, _))| *o < LATE_SHARE / 2.0);
                if share >= LATE_SHARE && n >= 2 && others_calm {
                    w.delayed += 1;
                }
            }
            if w.peers == 0 {
                continue;
            }
            counted.sort_unstable_by(f64::total_cmp);
            w.median_late = counted[counted.len() / 2];
            let change = match st.delayed_since {
                None => {
                    let delayed = w.delayed >= MIN_DELAYED_PEERS && 4 * w.delayed >= 3 * w.peers;
                    delayed.then(|| {
                        st.delayed_since = Some(now);
                        true
                    })
                }
                Some(since) => {
                    let clean = now.saturating_duration_since(since) >= self.cfg.hold
                        && 4 * w.half <= w.peers;
                    clean.then(|| {
                        st.delayed_since = None;
                        false
                    })
                }
            };
            if let Some(delayed) = change {
                out.push(NicJitter {
                    nic: rc.nic.clone(),
                    delayed,
                    late_pct: 100.0 * w.median_late,
                    peers: w.peers,
                    delayed_peers: w.delayed,
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
