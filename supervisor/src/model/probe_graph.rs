//! The probe graph: whom each host probes. A random K-regular graph over the
//! registered hosts (DESIGN.md flow 3), kept in the replicated model and
//! changed only by Raft apply, so it must be a deterministic function of the
//! log: the randomness comes from a small PRNG ([`SplitMix64`]) seeded from
//! the joining host's name and the host count ([`join_seed`]), never from
//! the OS.
//!
//! **Join rule.** With at most K+1 hosts the graph is complete. Beyond that
//! a newcomer takes ⌊K/2⌋ random existing edges `(a, b)`, pairwise disjoint
//! and not touching the newcomer's neighbours, and splits each into
//! `(a, new), (new, b)`: `a` and `b` keep their degree, the newcomer gains
//! two. With K odd it needs one more: it joins the one host of degree K−1
//! if there is one, else it splits one more edge keeping one end `(a, new)`
//! and the other end becomes the single host of degree K−1. Every other
//! edge stays as it was, so a join changes O(K) edges and the probes of
//! most hosts are untouched.
//!
//! **Invariant** (checked by the property tests): no self loops or
//! duplicate edges; with n ≤ K+1 hosts the graph is complete; beyond, every
//! host has degree K except, when n·K is odd, exactly one with K−1; the
//! graph is connected (for K ≥ 2).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

/// Default number of probe peers per host (DESIGN.md: K = 5).
pub const PROBE_DEGREE: usize = 5;

/// An undirected graph over host ids (`clocksync::HostId` numbers).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProbeGraph {
    /// Every host's neighbours (both directions stored; every host present,
    /// even without edges).
    adj: BTreeMap<u32, BTreeSet<u32>>,
}

/// What one join changed (for tests and logs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JoinChange {
    /// Edges added, each as (smaller id, larger id).
    pub added: Vec<(u32, u32)>,
    /// Edges removed (split), each as (smaller id, larger id).
    pub removed: Vec<(u32, u32)>,
}

/// splitmix64 (Steele, Lea, Flood 2014): a tiny, well-mixed, deterministic
/// generator, enough to pick random edges identically on every replica.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`); the modulo bias is irrelevant here.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// The seed of a join: FNV-1a of the host's name, mixed with the number of
/// hosts before it joins. Stable across platforms and releases (unlike
/// `std`'s hasher), which a replicated log needs.
pub fn join_seed(host: &str, hosts_before: usize) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for b in host.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01B3);
    }
    SplitMix64::new(h ^ (hosts_before as u64).rotate_left(32)).next_u64()
}

fn edge(a: u32, b: u32) -> (u32, u32) {
    (a.min(b), a.max(b))
}

impl ProbeGraph {
    /// Number of hosts.
    pub fn len(&self) -> usize {
        self.adj.len()
    }

    /// Whether no host is in the graph.
    pub fn is_empty(&self) -> bool {
        self.adj.is_empty()
    }

    /// Whether `h` is in the graph.
    pub fn contains(&self, h: u32) -> bool {
        self.adj.contains_key(&h)
    }

    /// The neighbours of `h`, ascending (none if `h` is unknown).
    pub fn neighbours(&self, h: u32) -> impl Iterator<Item = u32> + '_ {
        self.adj.get(&h).into_iter().flatten().copied()
    }

    /// Degree of `h`.
    pub fn degree(&self, h: u32) -> usize {
        self.adj.get(&h).map_or(0, BTreeSet::len)
    }

    /// Every edge once, as (smaller id, larger id), ascending.
    pub fn edges(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.adj
            .iter()
            .flat_map(|(&a, n)| n.range(a + 1..).map(move |&b| (a, b)))
    }

    fn connect(&mut self, a: u32, b: u32) {
        self.adj.entry(a).or_default().insert(b);
        self.adj.entry(b).or_default().insert(a);
    }

    fn disconnect(&mut self, a: u32, b: u32) {
        if let Some(n) = self.adj.get_mut(&a) {
            n.remove(&b);
        }
        if let Some(n) = self.adj.get_mut(&b) {
            n.remove(&a);
        }
    }

    fn adjacent(&self, a: u32, b: u32) -> bool {
        self.adj.get(&a).is_some_and(|n| n.contains(&b))
    }

    /// Whether every host is reachable from every other.
    pub fn is_connected(&self) -> bool {
        let Some(&start) = self.adj.keys().next() else {
            return true;
        };
        let mut seen = BTreeSet::from([start]);
        let mut queue = VecDeque::from([start]);
        while let Some(a) = queue.pop_front() {
            for &b in &self.adj[&a] {
                if seen.insert(b) {
                    queue.push_back(b);
                }
            }
        }
        seen.len() == self.adj.len()
    }

    /// Removes host `gone` and gives its place to its neighbours: they are
    /// joined in pairs (in id order, skipping pairs already adjacent), so
    /// each keeps its degree where it can; one left without a partner
    /// keeps one edge less. Removing an unknown host changes nothing.
    pub fn leave(&mut self, gone: u32) -> JoinChange {
        let mut change = JoinChange::default();
        let Some(neighbours) = self.adj.remove(&gone) else {
            return change;
        };
        for &n in &neighbours {
            if let Some(set) = self.adj.get_mut(&n) {
                set.remove(&gone);
            }
            change.removed.push(edge(gone, n));
        }
        let mut waiting: Vec<u32> = neighbours.into_iter().collect();
        while let Some(a) = waiting.first().copied() {
            waiting.remove(0);
            if let Some(pos) = waiting.iter().position(|&b| !self.adjacent(a, b)) {
                let b = waiting.remove(pos);
                self.connect(a, b);
                change.added.push(edge(a, b));
            }
        }
        change
    }

    /// Adds host `new` with degree `k` (see the module docs), drawing every
    /// random choice from `seed`. Adding a host already present changes
    /// nothing.
    pub fn join(&mut self, new: u32, k: usize, seed: u64) -> JoinChange {
        let mut change = JoinChange::default();
        if self.adj.contains_key(&new) {
            return change;
        }
        let existing: Vec<u32> = self.adj.keys().copied().collect();
        self.adj.insert(new, BTreeSet::new());
        if existing.len() <= k {
            for h in existing {
                self.connect(h, new);
                change.added.push(edge(h, new));
            }
            return change;
        }
        let mut rng = SplitMix64::new(seed);
        // The host of degree K-1, if any (the invariant allows one).
        let deficient = existing.iter().copied().find(|&h| self.degree(h) < k);
        let mut candidates: Vec<(u32, u32)> = self.edges().collect();
        for i in (1..candidates.len()).rev() {
            let j = rng.below(i + 1);
            candidates.swap(i, j);
        }
        let odd = k % 2 == 1;
        let mut touched: BTreeSet<u32> = BTreeSet::new();
        let usable = |touched: &BTreeSet<u32>, (a, b): (u32, u32)| {
            !touched.contains(&a)
                && !touched.contains(&b)
                && (!odd || (Some(a) != deficient && Some(b) != deficient))
        };
        let mut next = 0;
        let mut splits = 0;
        while splits < k / 2 && next < candidates.len() {
            let (a, b) = candidates[next];
            next += 1;
            if !usable(&touched, (a, b)) {
                continue;
            }
            self.disconnect(a, b);
            self.connect(a, new);
            self.connect(new, b);
            change.removed.push((a, b));
            change.added.push(edge(a, new));
            change.added.push(edge(new, b));
            touched.extend([a, b]);
            splits += 1;
        }
        if odd {
            match deficient {
                Some(d) if !self.adjacent(d, new) && self.degree(d) < k => {
                    self.connect(d, new);
                    change.added.push(edge(d, new));
                }
                _ => {
                    // Split one more edge keeping one end; the other end
                    // becomes the single host of degree K-1. Pick one whose
                    // removal keeps the graph connected.
                    while next < candidates.len() {
                        let (x, y) = candidates[next];
                        next += 1;
                        if !usable(&touched, (x, y)) {
                            continue;
                        }
                        let (keep, drop) = if rng.next_u64() & 1 == 0 {
                            (x, y)
                        } else {
                            (y, x)
                        };
                        self.disconnect(keep, drop);
                        self.connect(keep, new);
                        if self.is_connected() {
                            change.removed.push((x, y));
                            change.added.push(edge(keep, new));
                            break;
                        }
                        self.disconnect(keep, new);
                        self.connect(keep, drop);
                    }
                }
            }
        }
        // Fallback for graphs where not enough disjoint edges were found
        // (not reached from a valid graph; kept so a join never leaves the
        // newcomer isolated): join hosts that still have room.
        if self.degree(new) < k {
            for h in existing {
                if self.degree(new) >= k {
                    break;
                }
                if self.degree(h) < k && !self.adjacent(h, new) {
                    self.connect(h, new);
                    change.added.push(edge(h, new));
                }
            }
        }
        change
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn build(n: u32, k: usize, salt: u64) -> ProbeGraph {
        let mut g = ProbeGraph::default();
        for h in 0..n {
            g.join(h, k, join_seed(&format!("host{h}"), h as usize) ^ salt);
        }
        g
    }

    /// The module's invariant.
    fn check(g: &ProbeGraph, k: usize) -> Result<(), String> {
        let n = g.len();
        for (&h, nb) in &g.adj {
            if nb.contains(&h) {
                return Err(format!("self loop at {h}"));
            }
            for &m in nb {
                if !g.adj[&m].contains(&h) {
                    return Err(format!("edge {h}-{m} stored one way only"));
                }
            }
        }
        if n <= k + 1 {
            for h in g.adj.keys() {
                if g.degree(*h) != n - 1 {
                    return Err(format!("{h}: degree {} in a complete graph", g.degree(*h)));
                }
            }
            return Ok(());
        }
        let short: Vec<u32> = g
            .adj
            .keys()
            .copied()
            .filter(|&h| g.degree(h) != k)
            .collect();
        let odd = n * k % 2 == 1;
        match (odd, short.as_slice()) {
            (false, []) => {}
            (true, [h]) if g.degree(*h) == k - 1 => {}
            _ => {
                return Err(format!(
                    "n={n} k={k}: hosts off degree k: {:?}",
                    short.iter().map(|h| (h, g.degree(*h))).collect::<Vec<_>>()
                ))
            }
        }
        if k >= 2 && !g.is_connected() {
            return Err("not connected".into());
        }
        Ok(())
    }

    #[test]
    fn small_clusters_are_complete() {
        for n in 0..=6 {
            let g = build(n, 5, 0);
            check(&g, 5).unwrap();
            assert_eq!(g.edges().count(), (n * n.saturating_sub(1) / 2) as usize);
        }
    }

    #[test]
    fn default_degree_up_to_a_few_hundred_hosts() {
        let mut g = ProbeGraph::default();
        for h in 0..300u32 {
            g.join(
                h,
                PROBE_DEGREE,
                join_seed(&format!("gpu-{h:04}"), h as usize),
            );
            check(&g, PROBE_DEGREE).unwrap_or_else(|e| panic!("after {h}: {e}"));
        }
    }

    proptest! {
        /// Hosts leaving a random graph: no edge to them is left, the rest
        /// stays symmetric and connected, and nobody gains degree or loses
        /// more than the edge to the host that left.
        #[test]
        fn leaving_gives_the_place_to_the_neighbours(
            n in 8u32..60,
            salt in any::<u64>(),
            gone in proptest::collection::vec(any::<u32>(), 1..5),
        ) {
            let k = PROBE_DEGREE;
            let mut g = build(n, k, salt);
            for x in gone {
                let ids: Vec<u32> = g.adj.keys().copied().collect();
                let h = ids[x as usize % ids.len()];
                let before: BTreeMap<u32, usize> = ids.iter().map(|&i| (i, g.degree(i))).collect();
                let change = g.leave(h);
                prop_assert!(!g.contains(h));
                prop_assert_eq!(change.removed.len(), before[&h]);
                for (&i, nb) in &g.adj {
                    prop_assert!(!nb.contains(&h));
                    for &m in nb {
                        prop_assert!(g.adj[&m].contains(&i));
                    }
                    prop_assert!(g.degree(i) <= before[&i]);
                    prop_assert!(g.degree(i) + 1 >= before[&i], "{} lost more than one edge", i);
                }
                prop_assert!(g.is_connected());
            }
            // Unknown hosts change nothing.
            let copy = g.clone();
            g.leave(u32::MAX);
            prop_assert_eq!(g, copy);
        }
    }

    #[test]
    fn rejoining_changes_nothing() {
        let mut g = build(20, 5, 0);
        let before = g.clone();
        assert_eq!(g.join(7, 5, 99), JoinChange::default());
        assert_eq!(g, before);
    }

    #[test]
    fn seeds_are_stable() {
        // Pinned: a change here would make replicas of different versions
        // disagree on the graph.
        assert_eq!(SplitMix64::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(join_seed("h0", 0), join_seed("h0", 0));
        assert_ne!(join_seed("h0", 0), join_seed("h0", 1));
        assert_ne!(join_seed("h0", 3), join_seed("h1", 3));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn joins_keep_the_invariant_and_change_o_k_edges(
            k in 2usize..=8,
            n in 0u32..80,
            salt in any::<u64>(),
        ) {
            let mut g = ProbeGraph::default();
            for h in 0..n {
                let before: BTreeSet<(u32, u32)> = g.edges().collect();
                let change = g.join(h, k, join_seed(&format!("h{h}"), h as usize) ^ salt);
                let after: BTreeSet<(u32, u32)> = g.edges().collect();
                prop_assert!(check(&g, k).is_ok(), "after joining {}: {:?}", h, check(&g, k));
                // Only O(K) edges change, and the change is what it says.
                prop_assert!(change.removed.len() <= k / 2 + 1);
                prop_assert!(change.added.len() <= k + 1);
                let removed: BTreeSet<_> = before.difference(&after).copied().collect();
                let added: BTreeSet<_> = after.difference(&before).copied().collect();
                prop_assert_eq!(removed, change.removed.iter().copied().collect::<BTreeSet<_>>());
                prop_assert_eq!(added, change.added.iter().copied().collect::<BTreeSet<_>>());
            }
        }

        #[test]
        fn joins_are_deterministic(k in 2usize..=7, n in 0u32..60, salt in any::<u64>()) {
            prop_assert_eq!(build(n, k, salt), build(n, k, salt));
        }
    }
}
