//! Tests of the clock service: ingest, the solve, holdover, views.

use super::records::*;
use super::*;
use crate::api::{ApiError, Correction, EdgeFit, ErrorKind, ProbeLoad};
use crate::model::testkit::apply_for_test;
use crate::model::NicSpec;
use crate::model::{ClockState, ClusterState, Command, Liveness};
use clocksync::{HostId, SolveConfig};
use proto::v1::ProbeSummary;
use proto::v1::{PathStats, PeerClock};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Hosts `h0..hn` with one data NIC `rail0` on rail 0.
fn state(n: usize) -> ClusterState {
    state_with_rails(n, 1)
}

/// Hosts `h0..hn` with data NICs `rail0..rail<rails>`, one per rail.
fn state_with_rails(n: usize, rails: u32) -> ClusterState {
    let mut st = ClusterState::default();
    for i in 0..n {
        let cmd = Command::RegisterHost {
            host: format!("h{i}"),
            nics: (0..rails)
                .map(|r| {
                    NicSpec::named(format!("rail{r}"))
                        .on_rail(r)
                        .at(format!("10.{r}.0.{i}"))
                })
                .collect(),
            labels: Default::default(),
        };
        apply_for_test(&mut st, i as u64 + 1, 1, vec![cmd]);
    }
    st
}

const T0: i64 = 1_700_000_000_000_000_000;

/// True clocks: host i is `offsets[i]` ns ahead of the reference h0,
/// without drift.
fn peer_clock(offsets: &[f64], me: usize, peer: usize, err: f64) -> PeerClock {
    PeerClock {
        peer: format!("h{peer}"),
        rail: 0,
        at_ns: T0 + offsets[me] as i64,
        offset_ns: offsets[peer] - offsets[me],
        drift_ppb: 0.0,
        error_bound_ns: err,
        drift_error_ppb: 1.0,
        samples: 100,
        has_ntp: true,
        ntp_at_ns: T0 + offsets[me] as i64,
        ntp_offset_ns: offsets[peer] - offsets[me] + 500.0,
        ntp_rtt_ns: 40_000,
    }
}

/// Every host reports a clock to every other (a complete graph) with
/// error bound `err`, received at `at`.
fn report_all(svc: &ClockService, st: &ClusterState, offsets: &[f64], err: f64, at: Instant) {
    let n = offsets.len();
    for me in 0..n {
        let clocks = (0..n)
            .filter(|&p| p != me)
            .map(|p| peer_clock(offsets, me, p, err))
            .collect();
        svc.ingest(st, &summary(&format!("h{me}"), clocks, vec![]), at)
            .unwrap();
    }
}

/// Three hosts (`state(3)`), a fresh service, now, and the true offsets
/// h1 100 ns ahead of h0, h2 50 ns behind.
fn three_hosts() -> (ClusterState, ClockService, Instant, [f64; 3]) {
    let offsets = [0.0, 100.0, -50.0];
    (state(3), ClockService::default(), Instant::now(), offsets)
}

/// `offsets.len()` hosts, each reporting a clock to every other with
/// error bound `err` (see [`report_all`]), received now.
fn reported(offsets: &[f64], err: f64) -> (ClusterState, ClockService, Instant) {
    let st = state(offsets.len());
    let svc = ClockService::default();
    let now = Instant::now();
    report_all(&svc, &st, offsets, err, now);
    (st, svc, now)
}

/// Four hosts at known offsets, fully reported and solved once at `t0`.
fn four_hosts_solved() -> (ClusterState, ClockService, Instant, Solved) {
    let (st, svc, t0) = reported(&[0.0, 1_000.0, -2_500.0, 40_000.0], 200.0);
    let first = svc.solve_input(&st, t0).unwrap().solve(svc.config(), t0, 0);
    (st, svc, t0, first)
}

fn summary(host: &str, clocks: Vec<PeerClock>, paths: Vec<PathStats>) -> ProbeSummary {
    ProbeSummary {
        host: host.into(),
        sent_ns: T0,
        plan_version: 1,
        clocks,
        paths,
        bytes_sent: 0,
        shaped: Vec::new(),
        pairs_per_s: 80,
        max_pairs_per_s: 100,
        probe_cpu_pct: Some(0.9),
        probe_cpu_budget_pct: 1.0,
    }
}

fn path(peer: &str, received: u32) -> PathStats {
    PathStats {
        peer: peer.into(),
        rail: 0,
        nic: "rail0".into(),
        peer_nic: "rail0".into(),
        expected: 100,
        received,
        delays: received,
        min_ns: 10_000,
        p50_ns: 12_000,
        p99_ns: 20_000,
        line_at_ns: T0,
        line_offset_ns: 0.0,
        corrected: true,
    }
}

fn is_empty(svc: &ClockService) -> bool {
    let s = svc.lock();
    s.clocks.is_empty() && s.paths.is_empty() && s.evidence.is_empty()
}

#[test]
fn malformed_summaries_are_refused_and_store_nothing() {
    let (st, svc, now, offsets) = three_hosts();
    let good = || peer_clock(&offsets, 0, 1, 100.0);
    // h0's summary with one good clock changed by `f`, and no paths.
    let bad_clock = |f: fn(&mut PeerClock)| {
        let mut c = good();
        f(&mut c);
        summary("h0", vec![c], vec![])
    };
    // h0's summary with a good clock and one path to h1 changed by `f`.
    let bad_path = |f: fn(&mut PathStats)| {
        let mut p = path("h1", 5);
        f(&mut p);
        summary("h0", vec![good()], vec![p])
    };
    let cases: Vec<(ProbeSummary, &str)> = vec![
        (
            summary("ghost", vec![good()], vec![]),
            "\"ghost\" is not registered",
        ),
        (
            summary("h0", vec![good(); MAX_SUMMARY_CLOCKS + 1], vec![]),
            "at most 256 peer clocks",
        ),
        (
            summary("h0", vec![], vec![path("h1", 1); MAX_SUMMARY_PATHS + 1]),
            "at most 256 path statistics",
        ),
        (
            summary(
                "h0",
                vec![PeerClock {
                    offset_ns: f64::NAN,
                    ..good()
                }],
                vec![path("h1", 5)],
            ),
            "must be finite",
        ),
        (
            bad_clock(|c| c.error_bound_ns = f64::INFINITY),
            "must be finite",
        ),
        (bad_clock(|c| c.error_bound_ns = -1.0), "≥ 0"),
        (bad_clock(|c| c.ntp_offset_ns = f64::NAN), "NTP offset"),
        (bad_clock(|c| c.peer = "h0".into()), "against itself"),
        (
            bad_path(|p| p.line_offset_ns = f64::NEG_INFINITY),
            "line offset",
        ),
        (bad_path(|p| p.p50_ns = 1), "min ≤ p50 ≤ p99"),
    ];
    for (i, (s, want)) in cases.into_iter().enumerate() {
        let e = svc.ingest(&st, &s, now).unwrap_err();
        assert!(e.to_string().contains(want), "case {i}: {e}");
        let api = ApiError::from(e);
        let kind = if i == 0 {
            ErrorKind::NotFound
        } else {
            ErrorKind::InvalidArgument
        };
        assert_eq!(api.kind, kind, "case {i}");
        assert!(is_empty(&svc), "case {i}: nothing stored");
    }
}

/// Two hosts, both rails: rail 0 stays queued one way (its offset is
/// 3 µs off, its round trip 6 µs longer). The two edges are parallel,
/// so no loop can expose either; the round-trip excess gives rail 0 a
/// 3 µs error and the solve follows the quiet rail.
#[test]
fn a_rail_that_stays_queued_weighs_little_next_to_a_quiet_one() {
    let st = state_with_rails(2, 2);
    let svc = ClockService::default();
    let now = Instant::now();
    let offsets = [0.0, 100.0];
    let clean = peer_clock(&offsets, 0, 1, 10.0);
    let queued = PeerClock {
        rail: 0,
        offset_ns: clean.offset_ns + 3_000.0,
        ntp_rtt_ns: clean.ntp_rtt_ns + 6_000,
        ..clean.clone()
    };
    let quiet = PeerClock { rail: 1, ..clean };
    svc.ingest(&st, &summary("h0", vec![queued, quiet], vec![]), now)
        .unwrap();
    let input = svc.solve_input(&st, now).expect("fresh edges");
    let q: Vec<(u32, f64)> = input
        .edges
        .iter()
        .map(|e| (e.rail, e.queueing_ns))
        .collect();
    assert_eq!(q, vec![(0, 3_000.0), (1, 0.0)]);
    let solved = input.solve(&SolveConfig::default(), now, 0);
    let sol = solved.solution.expect("solved");
    let h1 = sol.host(HostId(1)).expect("h1 solved");
    // Equal weights would land half way, 1.5 µs off.
    assert!((h1.offset_ns - 100.0).abs() < 5.0, "{h1:?}");
}

/// Regression: a negative NTP-style round trip (relative drift over
/// the gap between the paired one-way probes) once made the leader
/// refuse whole summaries, and with them every clock, path and probe
/// evidence of the host.
#[test]
fn a_negative_ntp_round_trip_is_a_measurement_not_malformed() {
    let (st, svc, now, offsets) = three_hosts();
    let s = summary(
        "h0",
        vec![
            PeerClock {
                ntp_rtt_ns: -1_500,
                ..peer_clock(&offsets, 0, 1, 100.0)
            },
            peer_clock(&offsets, 0, 2, 100.0),
        ],
        vec![path("h1", 0)],
    );
    let got = svc.ingest(&st, &s, now).unwrap();
    assert_eq!((got.clocks, got.paths, got.ignored), (2, 1, 0));
    let input = svc.solve_input(&st, now).expect("fresh edges");
    assert_eq!(input.edges.len(), 2);
    let ntp = input.edges[0].report.ntp.expect("the NTP estimate is kept");
    assert_eq!(ntp.rtt_ns, -1_500);
}

#[test]
fn unknown_peers_rails_and_nics_are_ignored_and_evidence_needs_received_probes() {
    let (st, svc, now, offsets) = three_hosts();
    let s = summary(
        "h0",
        vec![
            peer_clock(&offsets, 0, 1, 100.0),
            PeerClock {
                peer: "ghost".into(),
                ..peer_clock(&offsets, 0, 1, 100.0)
            },
            PeerClock {
                rail: 7,
                ..peer_clock(&offsets, 0, 2, 100.0)
            },
        ],
        vec![
            path("h1", 0),
            path("h2", 3),
            path("ghost", 3),
            PathStats {
                nic: "eth9".into(),
                ..path("h1", 3)
            },
        ],
    );
    let got = svc.ingest(&st, &s, now).unwrap();
    assert_eq!(
        got,
        Ingested {
            clocks: 1,
            paths: 2,
            ignored: 4
        }
    );
    let ev = svc.probe_evidence();
    // h1's probes: 0 received on rail0, 3 on a path naming an unknown
    // NIC (still evidence that h1 is alive); h2's: 3 received.
    assert_eq!(
        ev.keys().collect::<BTreeSet<_>>(),
        BTreeSet::from([&"h1".to_string(), &"h2".to_string()])
    );
    let s = summary("h1", vec![], vec![path("h0", 0)]);
    svc.ingest(&st, &s, now).unwrap();
    assert!(
        !svc.probe_evidence().contains_key("h0"),
        "nothing received is no evidence"
    );
}

#[test]
fn both_ends_report_one_edge_the_smaller_id_preferred_while_fresh() {
    let (st, svc, t, offsets) = three_hosts();
    // `me` reports its clock against `peer` with bound `err`, received at `at`.
    let report = |me: usize, peer: usize, err: f64, at: Instant| {
        let clocks = vec![peer_clock(&offsets, me, peer, err)];
        svc.ingest(&st, &summary(&format!("h{me}"), clocks, vec![]), at)
            .unwrap();
    };
    report(1, 0, 90.0, t);
    report(0, 1, 80.0, t + Duration::from_millis(500));
    let store = svc.lock();
    let edges = select_edges(&st, &store.clocks, t + Duration::from_secs(1));
    assert_eq!(edges.len(), 1);
    assert_eq!((edges[0].from_id, edges[0].to_id), (0, 1));
    // Both go stale; then only h1 reports again, and its report is used.
    let edges = select_edges(&st, &store.clocks, t + Duration::from_millis(3_600));
    assert_eq!(edges.len(), 0, "both stale");
    drop(store);
    report(1, 0, 90.0, t + Duration::from_secs(4));
    let store = svc.lock();
    let edges = select_edges(&st, &store.clocks, t + Duration::from_millis(4_100));
    assert_eq!((edges[0].from_id, edges[0].to_id), (1, 0));
    assert_eq!(edges[0].report.offset_ns, -100.0);
}

/// A 5-host mesh with known offsets, every host reporting its
/// neighbours: the solve recovers the offsets, every host is Synced,
/// the NTP composition sums its hops.
#[test]
fn a_consistent_mesh_solves_synced_with_an_ntp_baseline() {
    let offsets = [0.0, 1_000.0, -2_500.0, 40_000.0, 7.0];
    let (mut st, svc, now) = reported(&offsets, 200.0);
    // The reference skips a Down host.
    st.hosts.get_mut("h0").unwrap().liveness = Liveness::Down;
    let input = svc.solve_input(&st, now).unwrap();
    assert_eq!(input.reference, 1);
    assert_eq!(input.edges.len(), 10, "one edge per pair");
    st.hosts.get_mut("h0").unwrap().liveness = Liveness::Ready;
    let input = svc.solve_input(&st, now).unwrap();
    assert_eq!(input.reference, 0);
    assert_eq!(input.at_ns, T0);
    let solved = input.solve(svc.config(), now, 0);
    let sol = solved.solution.as_ref().expect("solved");
    for (i, want) in offsets.iter().enumerate() {
        let got = sol.host(HostId(i as u32)).unwrap();
        assert!(
            (got.offset_ns - want).abs() < 1.0,
            "h{i}: {}",
            got.offset_ns
        );
        assert!(got.error_bound_ns < 200.0);
        let ntp = &solved.ntp[&(i as u32)];
        let sum: f64 = ntp.hops.iter().map(|h| h.offset_ns).sum();
        assert_eq!(ntp.offset_ns, sum);
        assert_eq!(
            ntp.hops.len(),
            usize::from(i != 0),
            "complete graph: one hop"
        );
        if i > 0 {
            // h0 reports every edge to it; each carries a +500 ns bias.
            assert_eq!(ntp.offset_ns, want + 500.0);
        }
    }
    let changes = clock_changes(&st, Some(&solved), svc.config(), now);
    assert_eq!(changes.len(), 5);
    assert!(changes.iter().all(|c| c.state == ClockState::Synced));
    // Views.
    svc.set_solved(Some(solved), now);
    let v = svc.clock_view(&st, 1, now);
    assert_eq!(v.reference.as_deref(), Some("h0"));
    assert_eq!(v.edges.len(), 10);
    assert!(v.edges.iter().all(|e| e.status == Some(EdgeFit::Used)));
    assert!(v.hosts.iter().all(|h| h.live.is_some() && h.ntp.is_some()));
    // Each host's probe rate and cost, as its summary gave them.
    assert!(
        v.hosts.iter().all(|h| h.probe
            == Some(ProbeLoad {
                pairs_per_s: 80,
                max_pairs_per_s: 100,
                cpu_pct: Some(0.9),
                cpu_budget_pct: 1.0,
                age_ms: 0,
            })),
        "{:?}",
        v.hosts
    );
    // The JSON parses back (no NaN/inf anywhere; serde_json's float
    // parsing may differ in the last bit, so compare the shape).
    let json = serde_json::to_string(&crate::api::AdminReply::Clock(v.clone())).unwrap();
    let back: crate::api::AdminReply = serde_json::from_str(&json).unwrap();
    let crate::api::AdminReply::Clock(b) = back else {
        panic!("not a clock reply: {json}");
    };
    assert_eq!(
        (b.reference, b.edges.len(), b.hosts.len()),
        (v.reference, 10, 5)
    );
}

#[test]
fn a_host_that_drops_out_is_held_over_with_a_growing_bound_then_unsynced() {
    let (mut st, svc, t0, first) = four_hosts_solved();
    for c in clock_changes(&st, Some(&first), svc.config(), t0) {
        st.hosts.get_mut(&c.host).unwrap().clock.state = c.state;
    }
    let base = first
        .solution
        .as_ref()
        .unwrap()
        .host(HostId(3))
        .unwrap()
        .clone();
    svc.set_solved(Some(first.clone()), t0);
    // 5 s later h3 is missing from the solution (its paths too busy).
    let later = |secs: u64, drop: bool| {
        let mut s = first.clone();
        let sol = s.solution.as_mut().unwrap();
        sol.at_ns += secs as i64 * 1_000_000_000;
        if drop {
            sol.hosts.retain(|c| c.host != HostId(3));
        }
        s.at = t0 + Duration::from_secs(secs);
        s
    };
    let all: BTreeSet<u32> = (0..4).collect();
    // A Down host is not held over.
    let mut down = later(5, true);
    let not_h3: BTreeSet<u32> = (0..3).collect();
    svc.hold_over(&mut down, &not_h3, t0 + Duration::from_secs(5));
    assert!(down.held.is_empty(), "h3 Down: not held");
    let mut second = later(5, true);
    let now = t0 + Duration::from_secs(5);
    svc.hold_over(&mut second, &all, now);
    let held = second.held.get(&3).expect("h3 held over");
    let want = base.offset_ns + base.drift_ppb * 5.0;
    assert!((held.clock.offset_ns - want).abs() < 1e-6, "{held:?}");
    let grown = base.error_bound_ns + base.drift_error_ppb * 5.0;
    assert!((held.clock.error_bound_ns - grown).abs() < 1e-6, "{held:?}");
    assert!(held.clock.error_bound_ns >= base.error_bound_ns);
    assert_eq!(second.held.len(), 1, "only the host that dropped out");
    assert!(
        clock_changes(&st, Some(&second), svc.config(), now).is_empty(),
        "h3 keeps its state while its bound allows"
    );
    svc.set_solved(Some(second), now);
    let v = svc.clock_view(&st, 1, now);
    let h3 = v.hosts.iter().find(|h| h.host == "h3").unwrap();
    let live = h3.live.as_ref().expect("held clock shown");
    assert_eq!(live.holdover_ms, Some(5_000));
    assert!(v
        .hosts
        .iter()
        .filter(|h| h.host != "h3")
        .all(|h| h.live.as_ref().is_some_and(|l| l.holdover_ms.is_none())));
    // Still missing after the longest holdover: Unsynced.
    let mut third = later(31, true);
    svc.hold_over(&mut third, &all, t0 + Duration::from_secs(31));
    assert!(third.held.is_empty(), "held at most {MAX_HOLDOVER:?}");
    let c = clock_changes(
        &st,
        Some(&third),
        svc.config(),
        t0 + Duration::from_secs(31),
    );
    assert_eq!(c.len(), 1);
    assert_eq!(
        (c[0].host.as_str(), c[0].state),
        ("h3", ClockState::Unsynced)
    );
    // Another reference: nothing carries over.
    let mut other = later(6, true);
    other.reference = 1;
    svc.hold_over(&mut other, &all, t0 + Duration::from_secs(6));
    assert!(other.held.is_empty());
    // Back in the solution: solved again, not held.
    let mut back = later(7, false);
    svc.hold_over(&mut back, &all, t0 + Duration::from_secs(7));
    assert!(back.held.is_empty());
}

#[test]
fn ticks_without_a_solution_let_the_last_one_stand_in_aged_then_unsync() {
    let (mut st, svc, t0, mut first) = four_hosts_solved();
    // h2's drift is known to 50 ppm only: its bound grows fast.
    let sol = first.solution.as_mut().unwrap();
    sol.hosts
        .iter_mut()
        .find(|c| c.host == HostId(2))
        .unwrap()
        .drift_error_ppb = 50_000.0;
    svc.set_solved(Some(first), t0);
    for c in clock_changes(&st, svc.solved().as_deref(), svc.config(), t0) {
        st.hosts.get_mut(&c.host).unwrap().clock.state = c.state;
    }
    assert!(st
        .hosts
        .values()
        .all(|h| h.clock.state == ClockState::Synced));
    let at = |secs: u64| t0 + Duration::from_secs(secs);
    // 5 s of summaries lost (no fresh edges), then a failing solve:
    // the last solution stands in; nobody is unsynced for it.
    svc.set_solved(None, at(5));
    let failed = Solved {
        solution: None,
        error: Some("singular".into()),
        at: at(6),
        ..(*svc.solved().unwrap()).clone()
    };
    svc.set_solve_failed("the solve task failed: panicked".into(), at(6));
    assert_eq!(
        svc.clock_view(&st, 1, at(6)).solve_error.as_deref(),
        Some("the solve task failed: panicked")
    );
    svc.set_solved(Some(failed), at(6));
    let standing = svc.solved().unwrap();
    assert!(standing.solution.is_some(), "the last solution stands in");
    let changes = clock_changes(&st, Some(&standing), svc.config(), at(6));
    // ...but its bounds age: h2's by 50 ppm × 6 s = 300 µs (Unsynced),
    // the others' by their ppb-level drift errors (still Synced).
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(
        (changes[0].host.as_str(), changes[0].state),
        ("h2", ClockState::Unsynced)
    );
    let v = svc.clock_view(&st, 1, at(6));
    assert_eq!(v.solve_error.as_deref(), Some("singular"));
    assert_eq!(v.solution.as_ref().map(|s| s.age_ms), Some(6_000));
    for h in v.hosts.iter().filter(|h| h.host != "h0") {
        let live = h.live.as_ref().expect("aged clock shown");
        assert_eq!(live.holdover_ms, Some(6_000), "{h:?}");
    }
    let h2 = v.hosts.iter().find(|h| h.host == "h2").unwrap();
    let b = h2.live.as_ref().unwrap().error_bound_ns;
    assert!((300_000.0..301_000.0).contains(&b), "{b}");
    // A host that goes Down meanwhile is not held.
    st.hosts.get_mut("h1").unwrap().liveness = Liveness::Down;
    let changes = clock_changes(&st, Some(&standing), svc.config(), at(6));
    assert!(changes
        .iter()
        .any(|c| c.host == "h1" && c.state == ClockState::Unsynced));
    let v = svc.clock_view(&st, 1, at(6));
    assert!(v.hosts.iter().any(|h| h.host == "h1" && h.live.is_none()));
    st.hosts.get_mut("h1").unwrap().liveness = Liveness::Ready;
    // A solution again: it takes over, fresh.
    let fresh = svc
        .solve_input(&st, at(2))
        .unwrap()
        .solve(svc.config(), at(7), 0);
    svc.set_solved(Some(fresh), at(7));
    let v = svc.clock_view(&st, 1, at(7));
    assert_eq!(v.solve_error, None);
    assert!(v
        .hosts
        .iter()
        .all(|h| h.live.as_ref().is_some_and(|l| l.holdover_ms.is_none())));
    // Nothing for longer than the longest holdover: every host Unsynced.
    svc.set_solved(None, at(20));
    assert!(
        svc.solved().unwrap().solution.is_some(),
        "13 s old: stands in"
    );
    svc.set_solved(None, at(38));
    assert!(svc.solved().is_none(), "31 s old: gone");
    let c = clock_changes(&st, svc.solved().as_deref(), svc.config(), at(38));
    assert_eq!(c.len(), 4);
    assert!(c.iter().all(|c| c.state == ClockState::Unsynced));
}

#[test]
fn probe_load_reports_from_old_agents_or_with_nonsense_are_not_shown() {
    let st = state(3);
    let svc = ClockService::default();
    let now = Instant::now();
    let mut old = summary("h0", vec![], vec![]);
    (old.pairs_per_s, old.max_pairs_per_s, old.probe_cpu_pct) = (0, 0, None);
    old.probe_cpu_budget_pct = 0.0;
    svc.ingest(&st, &old, now).unwrap();
    let mut nan = summary("h1", vec![], vec![]);
    nan.probe_cpu_budget_pct = f64::NAN;
    svc.ingest(&st, &nan, now).unwrap();
    let mut over = summary("h2", vec![], vec![]);
    over.pairs_per_s = 500;
    svc.ingest(&st, &over, now).unwrap();
    let v = svc.clock_view(&st, 1, now);
    assert!(v.hosts.iter().all(|h| h.probe.is_none()), "{:?}", v.hosts);
    // The JSON stays parseable (no NaN).
    let json = serde_json::to_string(&crate::api::AdminReply::Clock(v)).unwrap();
    serde_json::from_str::<crate::api::AdminReply>(&json).unwrap();
    // A sound one is shown.
    svc.ingest(&st, &summary("h2", vec![], vec![]), now)
        .unwrap();
    let v = svc.clock_view(&st, 1, now);
    assert!(v.hosts.iter().any(|h| h.host == "h2" && h.probe.is_some()));
}

#[test]
fn no_edges_leave_every_host_unsynced() {
    let mut st = state(1);
    let svc = ClockService::default();
    assert!(svc.solve_input(&st, Instant::now()).is_none());
    assert!(
        clock_changes(&st, None, svc.config(), Instant::now()).is_empty(),
        "already Unsynced"
    );
    st.hosts.get_mut("h0").unwrap().clock.state = ClockState::Synced;
    let c = clock_changes(&st, None, svc.config(), Instant::now());
    assert_eq!(c.len(), 1);
    assert_eq!((c[0].state, c[0].offset_ns), (ClockState::Unsynced, None));
}

#[test]
fn classification_has_hysteresis() {
    let cfg = SolveConfig::default();
    use ClockState::*;
    assert_eq!(classify(Unsynced, 900.0, &cfg), Synced);
    assert_eq!(classify(Synced, 1_200.0, &cfg), Synced);
    assert_eq!(classify(Synced, 1_300.0, &cfg), Degraded);
    assert_eq!(classify(Degraded, 1_100.0, &cfg), Degraded);
    assert_eq!(classify(Degraded, 1_000.0, &cfg), Synced);
    assert_eq!(classify(Degraded, 120_000.0, &cfg), Degraded);
    assert_eq!(classify(Synced, 120_000.0, &cfg), Degraded);
    assert_eq!(classify(Degraded, 130_000.0, &cfg), Unsynced);
    assert_eq!(classify(Unsynced, 110_000.0, &cfg), Unsynced);
}

#[test]
fn paths_are_network_corrected_aggregated_sorted_and_filtered() {
    // h1 is 1 µs ahead of h0, h2 3 µs behind. True OWD h1 → h0 = 10 µs.
    let (st, svc, now) = reported(&[0.0, 1_000.0, -3_000.0], 50.0);
    let solved = svc
        .solve_input(&st, now)
        .unwrap()
        .solve(svc.config(), now, 0);
    svc.set_solved(Some(solved), now);
    // h0 receives from h1 on a pair line 200 ns off (it thinks h1 is
    // 1.2 µs ahead): owd_pair = raw + line = 10 µs + 200 ns.
    for k in 0..3 {
        let p = PathStats {
            received: 90 + k,
            delays: 90 + k,
            min_ns: 10_200,
            p50_ns: 11_200 + 1_000 * i64::from(k),
            p99_ns: 20_200 + 1_000 * i64::from(k),
            line_at_ns: T0,
            line_offset_ns: 1_200.0,
            ..path("h1", 0)
        };
        svc.ingest(&st, &summary("h0", vec![], vec![p]), now)
            .unwrap();
    }
    // h2 → h0: raw delays (no pair line): raw = owd − θ = 50 µs + 3 µs.
    let raw = PathStats {
        received: 100,
        delays: 100,
        min_ns: 53_000,
        p50_ns: 53_000,
        p99_ns: 53_000,
        corrected: false,
        line_offset_ns: 0.0,
        ..path("h2", 0)
    };
    svc.ingest(&st, &summary("h0", vec![], vec![raw]), now)
        .unwrap();
    let v = svc.paths_view(&st, 1, None, None, now).unwrap();
    assert_eq!(v.total, 2);
    let first = &v.paths[0];
    assert_eq!((first.src.as_str(), first.dst.as_str()), ("h2", "h0"));
    assert_eq!(first.correction, Correction::Network);
    assert!((first.min_us.unwrap() - 50.0).abs() < 0.01, "{first:?}");
    let p = &v.paths[1];
    assert_eq!((p.src.as_str(), p.dst.as_str(), p.rail), ("h1", "h0", 0));
    assert_eq!(p.correction, Correction::Network);
    assert!((p.min_us.unwrap() - 10.0).abs() < 0.01, "{p:?}");
    assert!(
        (p.p50_us.unwrap() - 12.0).abs() < 0.01,
        "median of 11, 12, 13: {p:?}"
    );
    assert!(
        (p.p99_us.unwrap() - 22.0).abs() < 0.01,
        "max of the p99s: {p:?}"
    );
    assert_eq!(
        (p.expected, p.received, p.samples, p.seconds),
        (300, 273, 273, 3)
    );
    assert!((p.loss_pct.unwrap() - 9.0).abs() < 1e-9);
    // --top, --host and their errors.
    let v = svc.paths_view(&st, 1, None, Some(1), now).unwrap();
    assert_eq!((v.total, v.paths.len()), (2, 1));
    let v = svc.paths_view(&st, 1, Some("h2"), None, now).unwrap();
    assert_eq!(v.paths.len(), 1);
    assert_eq!(
        svc.paths_view(&st, 1, Some("ghost"), None, now)
            .unwrap_err()
            .kind,
        ErrorKind::NotFound
    );
    assert_eq!(
        svc.paths_view(&st, 1, None, Some(0), now).unwrap_err().kind,
        ErrorKind::InvalidArgument
    );
    // Without a solution (the last one too old to stand in): the pair
    // line only, or raw.
    svc.set_solved(None, now + MAX_HOLDOVER + Duration::from_secs(1));
    let v = svc.paths_view(&st, 1, None, None, now).unwrap();
    let by_src = |s: &str| v.paths.iter().find(|p| p.src == s).unwrap().clone();
    assert_eq!(by_src("h1").correction, Correction::Pair);
    assert!((by_src("h1").min_us.unwrap() - 10.2).abs() < 0.01);
    assert_eq!(by_src("h2").correction, Correction::Raw);
    // Old seconds leave the window.
    let later = now + PATH_WINDOW + Duration::from_secs(1);
    assert_eq!(svc.paths_view(&st, 1, None, None, later).unwrap().total, 0);
}
