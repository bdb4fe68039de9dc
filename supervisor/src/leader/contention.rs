//! The leader's contention detector (DESIGN.md flow 4): queueing delay per
//! path from the synchronised one-way delays, contended paths with
//! hysteresis, the bottleneck localised over the topology, and
//! `link_contention` incidents opened and closed through Raft.
//!
//! **Per path** (directed, per NIC pair), every second the agents report:
//! queueing = the second's median OWD − the path's baseline, the baseline
//! being the minimum of its per-second minimum OWDs over the last
//! [`ContentionConfig::baseline_seconds`] *uncontended* seconds (a standing
//! queue does not raise it). A path becomes contended when one second's
//! median queueing reaches `enter_us` (1 ms) or its p99 queueing
//! `enter_p99_us` (5 ms: bursty contention) in `enter_seconds` (2) seconds
//! in a row, and clears after `exit_seconds` seconds in a row with the
//! median below `exit_us` and the p99 below half of `enter_p99_us`. A
//! change of correction (raw → pair → network) restarts the baseline, since
//! the delays' zero moved.
//!
//! **Clock steps.** A queue can only add delay: a second whose minimum
//! falls below the path's baseline by more than `enter_us` means the
//! delays' zero moved — a host's clock stepped (an NTP daemon stepping it,
//! a VM resumed), and until the clock solution follows, the corrected
//! delays of its paths are off by the step, up one way and down the
//! other. That path and its reverse (the other half of the same clock
//! difference) restart their baselines and are not judged for
//! `clock_hold` (10 s, extended by every further drop below the lowest
//! delay seen while held: the up-side path comes down step by step while
//! the clock solution catches up). A second whose minimum delay rose by
//! more than `max_queue_us` (500 ms: no fabric queue holds that) is taken
//! the same way, so the up-side path of a large step is held at once even
//! when its reverse's drop arrives late (a loaded leader); for smaller
//! steps `enter_seconds` = 2 gives the reverse a second to show its drop
//! (two seconds that follow each other: a missing second starts the count
//! again).
//!
//! **Localisation** (network tomography over a tree): every fresh path is
//! routed over the topology; each directed link scores the share of its
//! paths that are contended. Greedily, the link that explains the most
//! contended paths (with at least `min_paths` of them from at least two
//! distinct host pairs, and a share of at least `min_share`) is named, its
//! paths are explained, and the search goes on for what is left. A host's
//! cable only wins when its own paths are what is contended; an uplink
//! explains the paths of every host behind it.
//!
//! **Incidents**: a localised link without an open incident gets one
//! (`ContentionCommand::Open`, with the link's rate and both sides' NICs
//! from the topology); a host's cable only once it is localised two rounds
//! in a row (at a load's start one host's burst can look like its own
//! cable's). An open one closes after `quiet` without the link
//! being localised *and* without its shaped NICs being busy (shaping hides
//! the queue it removes; the demand behind it is what has to go).
//!
//! Leader memory only: a new leader starts empty and rebuilds within
//! seconds; nothing opens or closes during its first `quiet`.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::api::{Correction, LinkScore, PathKey, PathQueueing};
use crate::leader::clock::{ClockService, PathSample};
use crate::model::shaping::{ContentionCommand, HostNic, LinkContention, MAX_INCIDENT_PATHS};
use crate::model::{ClusterState, Command};
use crate::node::Supervisor;
use crate::topology::{DirLink, Topology};

/// Detector settings (DESIGN.md defaults; TIMELY's T_high is 500 µs).
#[derive(Debug, Clone, PartialEq)]
pub struct ContentionConfig {
    /// A second's median queueing at or above this makes a path contended.
    pub enter_us: f64,
    /// …and so does a second's p99 queueing at or above this (bursty
    /// contention: a ring all-reduce fills a queue for part of a second).
    pub enter_p99_us: f64,
    /// Seconds in a row that must reach a threshold before a path is
    /// contended.
    pub enter_seconds: u32,
    /// How long a path whose delays fell below its baseline (a clock
    /// step) and its reverse are not judged.
    pub clock_hold: Duration,
    /// A second whose *minimum* delay is this far above the path's floor
    /// is a clock step too, not a queue: even its fastest packet would
    /// have waited that long (a fabric's buffers hold milliseconds).
    pub max_queue_us: f64,
    /// Below this for `exit_seconds` seconds in a row clears it.
    pub exit_us: f64,
    pub exit_seconds: u32,
    /// Uncontended seconds the baseline is the minimum of.
    pub baseline_seconds: usize,
    /// Contended paths a link needs to be named.
    pub min_paths: usize,
    /// Share of its paths that must be contended.
    pub min_share: f64,
    /// A path whose last second is older is not scored.
    pub fresh: Duration,
    /// An incident closes after this long without its link named.
    pub quiet: Duration,
    /// How often the detector reads new seconds.
    pub tick: Duration,
}

impl Default for ContentionConfig {
    fn default() -> Self {
        Self {
            enter_us: 1_000.0,
            enter_p99_us: 5_000.0,
            exit_us: 300.0,
            enter_seconds: 2,
            clock_hold: Duration::from_secs(10),
            max_queue_us: 500_000.0,
            exit_seconds: 3,
            baseline_seconds: 120,
            min_paths: 2,
            min_share: 0.5,
            fresh: Duration::from_secs(3),
            quiet: Duration::from_secs(10),
            tick: Duration::from_millis(200),
        }
    }
}

struct Track {
    /// Per-second minimum OWDs (ns) of uncontended seconds, newest last.
    baseline: VecDeque<f64>,
    correction: Correction,
    last: Instant,
    queue_p50_us: f64,
    queue_p99_us: f64,
    contended: bool,
    /// Seconds in a row below `exit_us` while contended.
    calm: u32,
    /// Seconds in a row at or above a threshold while not contended.
    entering: u32,
    since: Option<Instant>,
    /// Not judged before this (a clock moved under the path).
    held_until: Option<Instant>,
    /// The lowest minimum seen while held: a further drop below it means
    /// the zero is still moving (the clock solution catching up), and the
    /// hold is extended.
    hold_min: f64,
}

impl Track {
    fn new(correction: Correction, at: Instant) -> Track {
        Track {
            baseline: VecDeque::new(),
            correction,
            last: at,
            queue_p50_us: 0.0,
            queue_p99_us: 0.0,
            contended: false,
            calm: 0,
            entering: 0,
            since: None,
            held_until: None,
            hold_min: f64::INFINITY,
        }
    }

    /// Forgets the baseline and any contention: the delays' zero moved.
    fn restart(&mut self) {
        self.baseline.clear();
        self.queue_p50_us = 0.0;
        self.queue_p99_us = 0.0;
        self.contended = false;
        self.calm = 0;
        self.entering = 0;
        self.since = None;
    }
}

/// One named bottleneck.
#[derive(Debug, Clone, PartialEq)]
pub struct Localised {
    pub link: DirLink,
    pub contended: Vec<PathKey>,
    pub paths: usize,
    pub queueing_p99_us: f64,
}

/// Per-path queueing state.
pub struct Detector {
    cfg: ContentionConfig,
    tracks: HashMap<PathKey, Track>,
}

impl Detector {
    pub fn new(cfg: ContentionConfig) -> Self {
        Self {
            cfg,
            tracks: HashMap::new(),
        }
    }

    pub fn config(&self) -> &ContentionConfig {
        &self.cfg
    }

    pub fn clear(&mut self) {
        self.tracks.clear();
    }

    /// Folds in new seconds (oldest first) and forgets paths silent for
    /// longer than the clock service keeps them.
    pub fn ingest(&mut self, samples: &[PathSample], now: Instant) {
        for s in samples {
            let key = PathKey {
                src: s.src.clone(),
                src_nic: s.src_nic.clone(),
                dst: s.dst.clone(),
                dst_nic: s.dst_nic.clone(),
                rail: s.rail,
            };
            if !(s.min_ns.is_finite() && s.p50_ns.is_finite() && s.p99_ns.is_finite()) {
                continue;
            }
            let t = self
                .tracks
                .entry(key.clone())
                .or_insert_with(|| Track::new(s.correction, s.arrived));
            if t.correction != s.correction {
                t.restart();
                t.correction = s.correction;
            }
            // "In a row" means consecutive seconds: a missing one breaks it.
            if s.arrived.saturating_duration_since(t.last) > Duration::from_millis(1_500) {
                t.entering = 0;
            }
            t.last = s.arrived;
            let enter_ns = self.cfg.enter_us * 1_000.0;
            let base = t.baseline.iter().copied().fold(f64::INFINITY, f64::min);
            let held = t.held_until.is_some_and(|h| s.arrived < h);
            // A drop below the floor, or (while held) below what the hold
            // has seen: the delays' zero moved, or is still moving.
            let floor = if held { t.hold_min } else { base };
            let jumped =
                !held && base.is_finite() && s.min_ns - base > self.cfg.max_queue_us * 1_000.0;
            if jumped || (floor.is_finite() && floor - s.min_ns > enter_ns) {
                if !held {
                    tracing::info!(path = %key, moved_us = (s.min_ns - floor) / 1_000.0, "path delays moved past what a queue can do: a clock moved; the path and its reverse are held");
                }
                let until = s.arrived + self.cfg.clock_hold;
                for k in [key.reversed(), key.clone()] {
                    if let Some(t) = self.tracks.get_mut(&k) {
                        if t.held_until.is_none_or(|h| s.arrived >= h) {
                            t.restart();
                            t.hold_min = f64::INFINITY;
                        }
                        t.held_until = Some(until);
                    }
                }
                if let Some(t) = self.tracks.get_mut(&key) {
                    t.hold_min = t.hold_min.min(s.min_ns);
                }
                continue;
            }
            if held {
                t.hold_min = t.hold_min.min(s.min_ns);
                continue;
            }
            t.held_until = None;
            t.hold_min = f64::INFINITY;
            let floor = base.min(s.min_ns);
            t.queue_p50_us = (s.p50_ns - floor).max(0.0) / 1_000.0;
            t.queue_p99_us = (s.p99_ns - floor).max(0.0) / 1_000.0;
            let entering =
                t.queue_p50_us >= self.cfg.enter_us || t.queue_p99_us >= self.cfg.enter_p99_us;
            let calm =
                t.queue_p50_us < self.cfg.exit_us && t.queue_p99_us < self.cfg.enter_p99_us / 2.0;
            if entering {
                t.calm = 0;
                t.entering = t.entering.saturating_add(1);
                if !t.contended && t.entering >= self.cfg.enter_seconds {
                    tracing::info!(path = %key, queueing_p50_us = t.queue_p50_us, queueing_p99_us = t.queue_p99_us, "path contended");
                    t.since = Some(s.arrived);
                    t.contended = true;
                }
            } else if t.contended {
                t.entering = 0;
                if calm {
                    t.calm += 1;
                    if t.calm >= self.cfg.exit_seconds {
                        tracing::info!(path = %key, "path clear");
                        t.contended = false;
                        t.since = None;
                        t.calm = 0;
                    }
                } else {
                    t.calm = 0;
                }
            } else {
                t.entering = 0;
            }
            // Only calm seconds move the baseline: a standing queue would
            // otherwise become the new zero.
            if !t.contended && !entering {
                t.baseline.push_back(s.min_ns);
                while t.baseline.len() > self.cfg.baseline_seconds {
                    t.baseline.pop_front();
                }
            }
        }
        let keep = crate::leader::clock::PATH_WINDOW;
        self.tracks
            .retain(|_, t| now.saturating_duration_since(t.last) <= keep);
    }

    /// Every path's state, contended first, then worst queueing.
    pub fn paths(&self, now: Instant) -> Vec<PathQueueing> {
        let mut out: Vec<PathQueueing> = self
            .tracks
            .iter()
            .map(|(k, t)| PathQueueing {
                path: k.clone(),
                baseline_us: t.baseline.iter().copied().fold(f64::INFINITY, f64::min) / 1_000.0,
                queueing_p50_us: t.queue_p50_us,
                queueing_p99_us: t.queue_p99_us,
                contended: t.contended,
                contended_ms: t
                    .since
                    .map(|s| now.saturating_duration_since(s).as_millis() as u64),
                age_ms: now.saturating_duration_since(t.last).as_millis() as u64,
            })
            .map(|mut p| {
                if !p.baseline_us.is_finite() {
                    p.baseline_us = 0.0;
                }
                p
            })
            .collect();
        out.sort_by(|a, b| {
            b.contended
                .cmp(&a.contended)
                .then(b.queueing_p50_us.total_cmp(&a.queueing_p50_us))
                .then_with(|| a.path.cmp(&b.path))
        });
        out
    }

    /// Scores every directed link crossed by a fresh path and names the
    /// bottlenecks (see the module docs).
    pub fn localise(&self, topo: &Topology, now: Instant) -> (Vec<LinkScore>, Vec<Localised>) {
        struct Acc<'a> {
            paths: usize,
            contended: Vec<(&'a PathKey, f64)>,
        }
        let mut per: BTreeMap<DirLink, Acc> = BTreeMap::new();
        for (k, t) in &self.tracks {
            if now.saturating_duration_since(t.last) > self.cfg.fresh {
                continue;
            }
            let Some(route) = topo.route(&k.src, &k.src_nic, &k.dst, &k.dst_nic) else {
                continue;
            };
            for l in route {
                let a = per.entry(l).or_insert(Acc {
                    paths: 0,
                    contended: Vec::new(),
                });
                a.paths += 1;
                if t.contended {
                    a.contended.push((k, t.queue_p99_us));
                }
            }
        }
        let mut explained: BTreeSet<&PathKey> = BTreeSet::new();
        let mut named = Vec::new();
        // Bounded: each round explains at least `min_paths` new paths.
        loop {
            let best = per
                .iter()
                .filter_map(|(l, a)| {
                    let left: Vec<&(&PathKey, f64)> = a
                        .contended
                        .iter()
                        .filter(|(k, _)| !explained.contains(k))
                        .collect();
                    let pairs: BTreeSet<(&str, &str)> = left
                        .iter()
                        .map(|(k, _)| (k.src.as_str(), k.dst.as_str()))
                        .collect();
                    let share = a.contended.len() as f64 / a.paths as f64;
                    (left.len() >= self.cfg.min_paths
                        && pairs.len() >= 2
                        && share >= self.cfg.min_share)
                        .then_some((l, left.len(), share))
                })
                .max_by(|a, b| a.1.cmp(&b.1).then(a.2.total_cmp(&b.2)));
            let Some((link, _, _)) = best else {
                break;
            };
            let a = &per[link];
            let mut contended: Vec<PathKey> =
                a.contended.iter().map(|(k, _)| (*k).clone()).collect();
            contended.sort();
            let q = a.contended.iter().map(|(_, q)| *q).fold(0.0, f64::max);
            explained.extend(a.contended.iter().map(|(k, _)| *k));
            named.push(Localised {
                link: link.clone(),
                contended,
                paths: a.paths,
                queueing_p99_us: q,
            });
        }
        let scores = per
            .iter()
            .map(|(l, a)| {
                let link = topo.link(&l.link);
                LinkScore {
                    link: l.clone(),
                    rate_bps: link.as_ref().and_then(|x| x.rate_bps),
                    access: link.is_some_and(|x| x.access),
                    paths: a.paths,
                    contended: a.contended.len(),
                    score: a.contended.len() as f64 / a.paths as f64,
                    bottleneck: named.iter().any(|n| &n.link == l),
                    queueing_p99_us: a.contended.iter().map(|(_, q)| *q).reduce(f64::max),
                }
            })
            .collect();
        (scores, named)
    }
}

/// The host NICs on each side of a directed link: (senders, receivers).
pub fn sides(topo: &Topology, l: &DirLink) -> (Vec<HostNic>, Vec<HostNic>) {
    let to_vec = |s: BTreeSet<(String, String)>| -> Vec<HostNic> {
        s.into_iter()
            .map(|(host, nic)| HostNic { host, nic })
            .collect()
    };
    let Some(link) = topo.link(&l.link) else {
        return (Vec::new(), Vec::new());
    };
    if let Some(me) = link.cable.clone() {
        // `a` is the NIC's end, `b` its switch.
        let mut rest = topo.side(&l.link, &link.b);
        rest.remove(&me);
        let me = to_vec(BTreeSet::from([me]));
        if l.from == link.a {
            (me, to_vec(rest))
        } else {
            (to_vec(rest), me)
        }
    } else {
        (
            to_vec(topo.side(&l.link, &l.from)),
            to_vec(topo.side(&l.link, &l.to)),
        )
    }
}

/// Rounds in a row a host's cable must be named before it gets an incident.
const CABLE_ROUNDS: u32 = 2;

/// The leader's detector and its last view, shared with the admin API.
pub struct ContentionService {
    inner: Mutex<Inner>,
}

struct Inner {
    detector: Detector,
    last_seen: Option<Instant>,
    scores: Vec<LinkScore>,
    /// When each directed link was last named.
    named_at: HashMap<DirLink, Instant>,
    /// Host cables named in the latest rounds, and in how many in a row.
    cable_streak: HashMap<DirLink, u32>,
}

impl Default for ContentionService {
    fn default() -> Self {
        Self::new(ContentionConfig::default())
    }
}

impl ContentionService {
    pub fn new(cfg: ContentionConfig) -> Self {
        Self {
            inner: Mutex::new(Inner {
                detector: Detector::new(cfg),
                last_seen: None,
                scores: Vec::new(),
                named_at: HashMap::new(),
                cable_streak: HashMap::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn config(&self) -> ContentionConfig {
        self.lock().detector.config().clone()
    }

    pub fn clear(&self) {
        let mut g = self.lock();
        g.detector.clear();
        g.last_seen = None;
        g.scores.clear();
        g.named_at.clear();
    }

    /// Path states (all, or contended only).
    pub fn paths(&self, contended_only: bool, now: Instant) -> Vec<PathQueueing> {
        let mut v = self.lock().detector.paths(now);
        if contended_only {
            v.retain(|p| p.contended);
        }
        v
    }

    /// The latest link scores.
    pub fn scores(&self) -> Vec<LinkScore> {
        self.lock().scores.clone()
    }

    /// One detector round: read new seconds, score, and decide which
    /// incidents to open and close.
    fn round(
        &self,
        sup: &Supervisor,
        clocks: &ClockService,
        topo: Option<&Topology>,
        now: Instant,
        settled: bool,
    ) -> Vec<ContentionCommand> {
        let mut g = self.lock();
        let after = g.last_seen;
        let samples = sup.read(|st| clocks.path_seconds_after(st, after, now));
        if let Some(last) = samples.last() {
            g.last_seen = Some(last.arrived);
        }
        g.detector.ingest(&samples, now);
        let Some(topo) = topo else {
            return Vec::new();
        };
        let (scores, mut named) = g.detector.localise(topo, now);
        g.scores = scores;
        for n in &named {
            g.named_at.insert(n.link.clone(), now);
        }
        g.cable_streak = persistent_cables(topo, &mut named, &g.cable_streak);
        if !settled {
            return Vec::new();
        }
        let quiet = g.detector.config().quiet;
        let named_at = g.named_at.clone();
        drop(g);
        sup.read(|st| {
            decide(
                st,
                topo,
                &named,
                &named_at,
                |h, n| clocks.shaped_busy(h, n),
                quiet,
                now,
            )
        })
    }
}

/// Keeps of `named` the inter-switch links and the host cables named in
/// [`CABLE_ROUNDS`] rounds in a row (`streak`: the cables of the rounds
/// before, and in how many in a row); returns the new streaks. In the
/// first second of a load one host's burst may be all that crosses a
/// contended uplink, and its cable then explains those paths as well as
/// the uplink does; a second later the other senders' paths settle it.
pub fn persistent_cables(
    topo: &Topology,
    named: &mut Vec<Localised>,
    streak: &HashMap<DirLink, u32>,
) -> HashMap<DirLink, u32> {
    let cables: HashMap<DirLink, u32> = named
        .iter()
        .filter(|n| topo.link(&n.link.link).is_some_and(|l| l.access))
        .map(|n| {
            let s = streak.get(&n.link).copied().unwrap_or(0);
            (n.link.clone(), s.saturating_add(1))
        })
        .collect();
    named.retain(|n| cables.get(&n.link).is_none_or(|s| *s >= CABLE_ROUNDS));
    cables
}

/// Which incidents to open (named links without one) and close (open
/// ones whose link has been quiet and whose shaped NICs idle for `quiet`).
pub fn decide(
    st: &ClusterState,
    topo: &Topology,
    named: &[Localised],
    named_at: &HashMap<DirLink, Instant>,
    busy_at: impl Fn(&str, &str) -> Option<Instant>,
    quiet: Duration,
    now: Instant,
) -> Vec<ContentionCommand> {
    let mut out = Vec::new();
    for n in named {
        if st.open_link_incident(&n.link).is_some() {
            continue;
        }
        let (senders, receivers) = sides(topo, &n.link);
        let host = n
            .contended
            .iter()
            .map(|k| &k.src)
            .find(|h| st.hosts.contains_key(*h));
        let Some(host) = host else {
            continue;
        };
        let mut paths: Vec<String> = n.contended.iter().map(|k| k.to_string()).collect();
        paths.truncate(MAX_INCIDENT_PATHS);
        out.push(ContentionCommand::Open {
            host: host.clone(),
            info: LinkContention {
                link: n.link.clone(),
                rate_bps: topo.link(&n.link.link).and_then(|l| l.rate_bps),
                senders,
                receivers,
                paths,
                queueing_p99_us: n.queueing_p99_us,
            },
        });
    }
    for inc in st.open_incidents() {
        let Some(info) = &inc.link else {
            continue;
        };
        let quiet_since =
            |t: Option<Instant>| t.is_none_or(|t| now.saturating_duration_since(t) >= quiet);
        if !quiet_since(named_at.get(&info.link).copied()) {
            continue;
        }
        let busy = st.shapes.iter().any(|(h, m)| {
            m.iter()
                .any(|(nic, s)| s.incident == inc.id && !quiet_since(busy_at(h, nic)))
        });
        if busy {
            continue;
        }
        out.push(ContentionCommand::Close {
            incident: inc.id,
            why: format!(
                "no contention on {} for {} s and its shaped traffic idle",
                info.link,
                quiet.as_secs()
            ),
        });
    }
    out
}

/// Runs on every supervisor; detects while it leads, forgets when not.
pub async fn run(
    sup: Arc<Supervisor>,
    contention: Arc<ContentionService>,
    clocks: Arc<ClockService>,
) {
    let tick_every = contention.config().tick;
    let quiet = contention.config().quiet;
    let mut tick = tokio::time::interval(tick_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut leading_since: Option<Instant> = None;
    let topo = sup.config.topology.clone();
    if topo.is_none() {
        tracing::info!("no topology: contended paths are reported, no link is localised");
    }
    loop {
        tick.tick().await;
        if !sup.leads() {
            if leading_since.take().is_some() {
                tracing::info!("no longer leading: contention data forgotten");
            }
            contention.clear();
            continue;
        }
        let now = Instant::now();
        let since = *leading_since.get_or_insert(now);
        let settled = now.saturating_duration_since(since) >= quiet;
        let cmds = contention.round(&sup, &clocks, topo.as_ref(), now, settled);
        for c in cmds {
            match &c {
                ContentionCommand::Open { host, info } => {
                    tracing::warn!(link = %info.link, host = %host, paths = info.paths.len(), queueing_p99_us = info.queueing_p99_us, "link contended: opening an incident")
                }
                ContentionCommand::Close { incident, why } => {
                    tracing::info!(incident, why = %why, "link contention over: closing the incident")
                }
            }
            if let Err(e) = sup.propose(Command::Contention(c)).await {
                tracing::warn!(error = %e, "cannot commit a contention decision");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOPO: &str = r#"
[[switches]]
name = "l0"
[[switches]]
name = "l1"
[[links]]
name = "up"
a = "l0"
b = "l1"
rate = "400Mbit"
[[attach]]
host = "h0"
nic = "rail0"
switch = "l0"
[[attach]]
host = "h1"
nic = "rail0"
switch = "l0"
[[attach]]
host = "h2"
nic = "rail0"
switch = "l1"
[[attach]]
host = "h3"
nic = "rail0"
switch = "l1"
"#;

    fn sample(src: &str, dst: &str, at: Instant, min_us: f64, p50_us: f64) -> PathSample {
        PathSample {
            src: src.into(),
            src_nic: "rail0".into(),
            dst: dst.into(),
            dst_nic: "rail0".into(),
            rail: 0,
            arrived: at,
            min_ns: min_us * 1e3,
            p50_ns: p50_us * 1e3,
            p99_ns: p50_us * 1.5e3,
            correction: Correction::Network,
        }
    }

    const ALL: [(&str, &str); 12] = [
        ("h0", "h1"),
        ("h1", "h0"),
        ("h2", "h3"),
        ("h3", "h2"),
        ("h0", "h2"),
        ("h0", "h3"),
        ("h1", "h2"),
        ("h1", "h3"),
        ("h2", "h0"),
        ("h3", "h0"),
        ("h2", "h1"),
        ("h3", "h1"),
    ];

    /// `secs` seconds of every path; paths from l0 to l1 queue
    /// `queue_us` from second `from` on.
    fn feed(d: &mut Detector, t0: Instant, secs: u64, from: u64, queue_us: f64) -> Instant {
        let mut at = t0;
        for i in 0..secs {
            at = t0 + Duration::from_secs(i + 1);
            let batch: Vec<PathSample> = ALL
                .iter()
                .map(|(s, dd)| {
                    let cross = matches!(*s, "h0" | "h1") && matches!(*dd, "h2" | "h3");
                    let q = if cross && i >= from { queue_us } else { 0.0 };
                    sample(s, dd, at, 20.0 + q * 0.8, 30.0 + q)
                })
                .collect();
            d.ingest(&batch, at);
        }
        at
    }

    #[test]
    fn an_uplink_queue_is_named_and_only_in_its_direction() {
        let topo = Topology::parse(TOPO).unwrap();
        let mut d = Detector::new(ContentionConfig::default());
        let t0 = Instant::now();
        let now = feed(&mut d, t0, 20, 10, 5_000.0);
        let (scores, named) = d.localise(&topo, now);
        assert_eq!(named.len(), 1, "{named:?}");
        assert_eq!(
            named[0].link,
            DirLink {
                link: "up".into(),
                from: "l0".into(),
                to: "l1".into()
            }
        );
        assert_eq!(named[0].contended.len(), 4);
        assert!(named[0].queueing_p99_us > 5_000.0);
        let back = scores
            .iter()
            .find(|s| s.link.link == "up" && s.link.from == "l1")
            .unwrap();
        assert_eq!(back.contended, 0);
        // The senders' cables see half their paths contended: not named.
        let cable = scores.iter().find(|s| s.link.link == "h0:rail0").unwrap();
        assert!(!cable.bottleneck && cable.score > 0.0 && cable.score < 1.0);
        let (senders, receivers) = sides(&topo, &named[0].link);
        assert_eq!(
            senders.iter().map(|h| h.host.as_str()).collect::<Vec<_>>(),
            ["h0", "h1"]
        );
        assert_eq!(receivers.len(), 2);
    }

    #[test]
    fn quiet_paths_and_single_spikes_name_nothing() {
        let topo = Topology::parse(TOPO).unwrap();
        let mut d = Detector::new(ContentionConfig::default());
        let t0 = Instant::now();
        // Noise below the threshold.
        let now = feed(&mut d, t0, 30, 0, 400.0);
        let (_, named) = d.localise(&topo, now);
        assert!(named.is_empty(), "{named:?}");
        // One path alone queueing: below min_paths.
        let at = now + Duration::from_secs(1);
        d.ingest(&[sample("h0", "h2", at, 20.0, 9_000.0)], at);
        let (_, named) = d.localise(&topo, at);
        assert!(named.is_empty(), "{named:?}");
    }

    #[test]
    fn hysteresis_and_a_standing_queue_do_not_move_the_baseline() {
        let mut d = Detector::new(ContentionConfig::default());
        let t0 = Instant::now();
        // 5 calm seconds, then 150 s of a standing queue (longer than the
        // baseline window): still contended.
        let now = feed(&mut d, t0, 155, 5, 3_000.0);
        let p = d.paths(now);
        assert_eq!(p.iter().filter(|p| p.contended).count(), 4);
        assert!((p[0].baseline_us - 20.0).abs() < 1e-6, "{:?}", p[0]);
        // Two calm seconds: still contended (exit needs three).
        let mut at = now;
        for _ in 0..2 {
            at += Duration::from_secs(1);
            d.ingest(&[sample("h0", "h2", at, 20.0, 30.0)], at);
        }
        assert!(d
            .paths(at)
            .iter()
            .any(|p| p.path.src == "h0" && p.path.dst == "h2" && p.contended));
        at += Duration::from_secs(1);
        d.ingest(&[sample("h0", "h2", at, 20.0, 30.0)], at);
        assert!(!d
            .paths(at)
            .iter()
            .any(|p| p.path.src == "h0" && p.path.dst == "h2" && p.contended));
    }

    #[test]
    fn bursty_queueing_enters_on_the_p99_alone() {
        let mut d = Detector::new(ContentionConfig::default());
        let t0 = Instant::now();
        let mut s = sample("h0", "h2", t0, 20.0, 30.0);
        d.ingest(&[s.clone()], t0);
        // Median calm, p99 8 ms above the baseline for two seconds:
        // contended (one second is not enough).
        let mut at = t0;
        for second in 1..=2 {
            at += Duration::from_secs(1);
            s.arrived = at;
            s.p99_ns = 8_020e3;
            d.ingest(&[s.clone()], at);
            assert_eq!(d.paths(at)[0].contended, second == 2);
        }
        // p99 3 ms: not calm yet (needs < 2.5 ms), so it stays contended
        // however long it lasts.
        for _ in 0..5 {
            at += Duration::from_secs(1);
            s.arrived = at;
            s.p99_ns = 3_020e3;
            d.ingest(&[s.clone()], at);
        }
        assert!(d.paths(at)[0].contended);
        for _ in 0..3 {
            at += Duration::from_secs(1);
            s.arrived = at;
            s.p99_ns = 500e3;
            d.ingest(&[s.clone()], at);
        }
        assert!(!d.paths(at)[0].contended);
    }

    /// h1's clock steps +1 s: its incoming paths read 1 s more (first, a
    /// batch before the rest), its outgoing ones 1 s less; then the clock
    /// solution catches up over four seconds. Nothing is contended or
    /// named throughout; once the hold is over, a real uplink queue still
    /// is.
    #[test]
    fn a_clock_step_is_not_contention() {
        // The step, then the clock solution following it: fast (gone in
        // four seconds) and slow (fifteen seconds, longer than the hold,
        // which each further drop extends).
        let slow: Vec<f64> = std::iter::once(1.0)
            .chain((0..=15).map(|i| 1.0 - f64::from(i) / 15.0))
            .chain([0.0])
            .collect();
        for ramp in [vec![1.0, 1.0, 0.6, 0.3, 0.1, 0.0, 0.0], slow] {
            step_then(&ramp);
        }
    }

    /// A loaded leader: after a 1 s step, the up-side paths' seconds keep
    /// arriving while their reverses' stay away for three seconds. The
    /// rise alone (no queue holds half a second) holds them.
    #[test]
    fn a_large_step_is_held_before_its_reverse_arrives() {
        let topo = Topology::parse(TOPO).unwrap();
        let mut d = Detector::new(ContentionConfig::default());
        let mut at = feed(&mut d, Instant::now(), 10, 100, 0.0);
        for _ in 0..3 {
            at += Duration::from_secs(1);
            let up: Vec<PathSample> = ALL
                .iter()
                .filter(|p| p.1 == "h1")
                .map(|(s, dd)| sample(s, dd, at, 20.0 + 1e6, 30.0 + 1e6))
                .collect();
            d.ingest(&up, at);
            assert!(d.paths(at).iter().all(|p| !p.contended));
            assert!(d.localise(&topo, at).1.is_empty());
        }
    }

    /// Feeds calm seconds, then h1's clock off by `ramp[i]` seconds in
    /// second i, and checks nothing is ever contended or named; then a
    /// real uplink queue after the hold still is.
    fn step_then(ramp: &[f64]) {
        let topo = Topology::parse(TOPO).unwrap();
        let mut d = Detector::new(ContentionConfig::default());
        let t0 = Instant::now();
        let mut at = feed(&mut d, t0, 10, 100, 0.0);
        let calm = |(s, dd): &(&str, &str), at: Instant, shift_us: f64| {
            sample(s, dd, at, 20.0 + shift_us, 30.0 + shift_us)
        };
        for (i, left) in ramp.iter().enumerate() {
            at += Duration::from_secs(1);
            let shift = |p: &(&str, &str)| match *p {
                (_, "h1") => left * 1e6,
                ("h1", _) => -left * 1e6,
                _ => 0.0,
            };
            let (into, rest): (Vec<_>, Vec<_>) = ALL.iter().partition(|p| p.1 == "h1");
            // The paths into h1 (reading more) arrive first every second.
            let first: Vec<PathSample> = into.iter().map(|p| calm(p, at, shift(p))).collect();
            d.ingest(&first, at);
            let later = at + Duration::from_millis(400);
            let second: Vec<PathSample> = rest.iter().map(|p| calm(p, later, shift(p))).collect();
            d.ingest(&second, later);
            assert!(
                d.paths(later).iter().all(|p| !p.contended),
                "ramp {ramp:?}, second {i}: {:?}",
                d.paths(later)
                    .iter()
                    .filter(|p| p.contended)
                    .collect::<Vec<_>>()
            );
            assert!(d.localise(&topo, later).1.is_empty(), "second {i}");
        }
        // The hold ends; a real queue on the uplink is named again.
        let now = feed(&mut d, at + Duration::from_secs(10), 20, 10, 5_000.0);
        let (_, named) = d.localise(&topo, now);
        assert_eq!(named.len(), 1, "{named:?}");
        assert_eq!(named[0].link.link, "up");
    }

    #[test]
    fn a_new_correction_restarts_the_baseline() {
        let mut d = Detector::new(ContentionConfig::default());
        let t0 = Instant::now();
        let mut s = sample("h0", "h2", t0, 20.0, 30.0);
        s.correction = Correction::Raw;
        // Raw delays carry the clock offset: 1 s.
        s.min_ns += 1e9;
        s.p50_ns += 1e9;
        d.ingest(&[s], t0);
        let at = t0 + Duration::from_secs(1);
        d.ingest(&[sample("h0", "h2", at, 20.0, 30.0)], at);
        let p = &d.paths(at)[0];
        assert!(!p.contended && p.queueing_p50_us < 20.0, "{p:?}");
    }

    #[test]
    fn a_host_cable_is_named_when_its_own_paths_queue() {
        let topo = Topology::parse(TOPO).unwrap();
        let mut d = Detector::new(ContentionConfig::default());
        let t0 = Instant::now();
        let mut at = t0;
        for i in 0..10u64 {
            at = t0 + Duration::from_secs(i + 1);
            let batch: Vec<PathSample> = ALL
                .iter()
                .map(|(s, dd)| {
                    let q = if *s == "h0" && i >= 5 { 4_000.0 } else { 0.0 };
                    sample(s, dd, at, 20.0, 30.0 + q)
                })
                .collect();
            d.ingest(&batch, at);
        }
        let (_, named) = d.localise(&topo, at);
        assert_eq!(named.len(), 1, "{named:?}");
        assert_eq!(named[0].link.link, "h0:rail0");
        assert_eq!(named[0].contended.len(), 3);
        // It takes an incident only when named again in the next round;
        // an uplink is kept at once.
        let up = Localised {
            link: DirLink {
                link: "up".into(),
                from: "l0".into(),
                to: "l1".into(),
            },
            contended: Vec::new(),
            paths: 4,
            queueing_p99_us: 6_000.0,
        };
        let mut first = vec![named[0].clone(), up.clone()];
        let streak = persistent_cables(&topo, &mut first, &HashMap::new());
        assert_eq!(first.len(), 1, "{first:?}");
        assert_eq!(first[0].link.link, "up");
        let mut second = named.clone();
        let again = persistent_cables(&topo, &mut second, &streak);
        assert_eq!(second.len(), 1);
        assert_eq!(second[0].link.link, "h0:rail0");
        // A round without it starts the count over.
        let gap = persistent_cables(&topo, &mut Vec::new(), &again);
        let mut third = named.clone();
        persistent_cables(&topo, &mut third, &gap);
        assert!(third.is_empty(), "{third:?}");
    }
}
