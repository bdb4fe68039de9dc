//! The solve: one edge per host pair and rail from fresh reports, the
//! reference host, [`clocksync::solve_with`] over them, and the NTP-style
//! baseline composed along a BFS tree from the reference.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Instant;

use clocksync::{EdgeEstimate, HostId, SolveConfig};

use crate::api::{NtpComposition, NtpHop};
use crate::leader::clock::records::{
    ClockReport, NtpReport, SelectedEdge, SolveInput, Solved, Store, CLOCK_FRESH,
};
use crate::model::{ClusterState, Liveness};

impl SelectedEdge {
    /// The edge as the solve sees it: its error is the pair fit's bound
    /// and the possible queueing bias together, so a rail that stays
    /// queued weighs little next to a quiet rail between the same hosts.
    pub(super) fn estimate(&self) -> EdgeEstimate {
        EdgeEstimate {
            from: HostId(self.from_id),
            to: HostId(self.to_id),
            at_ns: self.report.at_ns,
            offset_ns: self.report.offset_ns,
            drift_ppb: self.report.drift_ppb,
            offset_error_ns: self.report.error_bound_ns.hypot(self.queueing_ns),
            drift_error_ppb: self.report.drift_error_ppb,
        }
    }
}

impl SolveInput {
    /// Runs the network solve and the NTP composition (CPU-bound: O(n³)).
    pub fn solve(self, cfg: &SolveConfig, at: Instant, unix_ms: u64) -> Solved {
        let estimates: Vec<EdgeEstimate> = self.edges.iter().map(SelectedEdge::estimate).collect();
        let (solution, error) =
            match clocksync::solve_with(&estimates, HostId(self.reference), self.at_ns, cfg) {
                Ok(s) => (Some(s), None),
                Err(e) => (None, Some(e.to_string())),
            };
        let ntp = ntp_tree(&self.edges, self.reference, &self.names);
        Solved {
            at,
            unix_ms,
            reference: self.reference,
            edges: self.edges,
            solution,
            error,
            ntp,
            held: BTreeMap::new(),
        }
    }
}

/// Gathers the next solve's input from a pruned store (none without
/// fresh edges).
pub(super) fn solve_input(store: &Store, st: &ClusterState, now: Instant) -> Option<SolveInput> {
    let edges = select_edges(st, &store.clocks, now);
    let reference = pick_reference(st, &edges)?;
    let at_ns = reference_time(&edges, reference)?;
    let names = st.hosts.values().map(|h| (h.id, h.name.clone())).collect();
    Some(SolveInput {
        edges,
        reference,
        at_ns,
        names,
    })
}

/// One edge per host pair and rail from fresh reports, the smaller-id
/// reporter's when both ends' are fresh; ordered by (pair, rail).
pub fn select_edges(
    st: &ClusterState,
    clocks: &HashMap<String, HashMap<(String, u32), ClockReport>>,
    now: Instant,
) -> Vec<SelectedEdge> {
    let mut best: BTreeMap<(u32, u32, u32), SelectedEdge> = BTreeMap::new();
    for (reporter, table) in clocks {
        let Some(rh) = st.hosts.get(reporter) else {
            continue;
        };
        for ((peer, rail), r) in table {
            if now.saturating_duration_since(r.arrived) > CLOCK_FRESH {
                continue;
            }
            let Some(ph) = st.hosts.get(peer) else {
                continue;
            };
            let key = (rh.id.min(ph.id), rh.id.max(ph.id), *rail);
            if best.get(&key).is_some_and(|e| e.from_id < rh.id) {
                continue;
            }
            best.insert(
                key,
                SelectedEdge {
                    from: reporter.clone(),
                    to: peer.clone(),
                    from_id: rh.id,
                    to_id: ph.id,
                    rail: *rail,
                    report: r.clone(),
                    queueing_ns: 0.0,
                },
            );
        }
    }
    let mut quietest: BTreeMap<(u32, u32), i64> = BTreeMap::new();
    for ((a, b, _), e) in &best {
        if let Some(n) = e.report.ntp {
            let q = quietest.entry((*a, *b)).or_insert(n.rtt_ns);
            *q = (*q).min(n.rtt_ns);
        }
    }
    best.into_iter()
        .map(|((a, b, _), mut e)| {
            if let (Some(n), Some(q)) = (e.report.ntp, quietest.get(&(a, b))) {
                e.queueing_ns = (n.rtt_ns.saturating_sub(*q)) as f64 / 2.0;
            }
            e
        })
        .collect()
}

/// The lowest-id host that is not Down and is on an edge.
pub fn pick_reference(st: &ClusterState, edges: &[SelectedEdge]) -> Option<u32> {
    let on_edge: BTreeSet<u32> = edges.iter().flat_map(|e| [e.from_id, e.to_id]).collect();
    on_edge.into_iter().find(|id| {
        st.host_ids
            .get(id)
            .and_then(|n| st.hosts.get(n))
            .is_some_and(|h| h.liveness != Liveness::Down)
    })
}

/// The median time among the reference's edges, on the reference's clock
/// (an edge reported by a peer is converted with its offset).
fn reference_time(edges: &[SelectedEdge], reference: u32) -> Option<i64> {
    let mut times: Vec<i64> = edges
        .iter()
        .filter_map(|e| {
            if e.from_id == reference {
                Some(e.report.at_ns)
            } else if e.to_id == reference {
                Some(
                    e.report
                        .at_ns
                        .saturating_add(e.report.offset_ns.round() as i64),
                )
            } else {
                None
            }
        })
        .collect();
    // The median: each estimate holds best at its own window's centre, so
    // the instant closest to most of them keeps the drift extrapolation
    // (and its error) smallest.
    times.sort_unstable();
    times.get(times.len() / 2).copied()
}

/// The NTP-style composition per host: BFS from the reference over edges
/// with an NTP estimate (the smallest round trip per pair), neighbours in
/// id order; each host's offset is the sum of its hops.
pub fn ntp_tree(
    edges: &[SelectedEdge],
    reference: u32,
    names: &BTreeMap<u32, String>,
) -> BTreeMap<u32, NtpComposition> {
    let mut best: BTreeMap<(u32, u32), (&SelectedEdge, NtpReport)> = BTreeMap::new();
    for e in edges {
        let Some(n) = e.report.ntp else { continue };
        let key = (e.from_id.min(e.to_id), e.from_id.max(e.to_id));
        if best.get(&key).is_none_or(|(_, b)| n.rtt_ns < b.rtt_ns) {
            best.insert(key, (e, n));
        }
    }
    let mut adj: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    for &(a, b) in best.keys() {
        adj.entry(a).or_default().insert(b);
        adj.entry(b).or_default().insert(a);
    }
    let name = |id: u32| names.get(&id).cloned().unwrap_or_else(|| id.to_string());
    let mut out = BTreeMap::new();
    out.insert(
        reference,
        NtpComposition {
            offset_ns: 0.0,
            hops: Vec::new(),
        },
    );
    let mut queue = VecDeque::from([reference]);
    while let Some(parent) = queue.pop_front() {
        let base = out[&parent].clone();
        for &child in adj.get(&parent).into_iter().flatten() {
            if out.contains_key(&child) {
                continue;
            }
            let (e, n) = best[&(parent.min(child), parent.max(child))];
            // The report says clock_to − clock_from.
            let offset_ns = if e.from_id == parent {
                n.offset_ns
            } else {
                -n.offset_ns
            };
            let mut hops = base.hops.clone();
            hops.push(NtpHop {
                from: name(parent),
                to: name(child),
                rail: e.rail,
                reporter: e.from.clone(),
                at_ns: n.at_ns,
                offset_ns,
                rtt_ns: n.rtt_ns,
            });
            out.insert(
                child,
                NtpComposition {
                    offset_ns: base.offset_ns + offset_ns,
                    hops,
                },
            );
            queue.push_back(child);
        }
    }
    out
}
