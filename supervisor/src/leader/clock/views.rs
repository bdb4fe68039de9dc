//! Views: what `railguard clock` (every host's committed and live clock,
//! the solve's edges and fit) and `railguard paths` (per-path delays over
//! the window, worst p99 first) show, built from the store and the model.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use clocksync::{EdgeStatus, SolveConfig};

use crate::api::{
    ApiError, ClockEdgeView, ClockHostView, ClockView, EdgeFit, ErrorKind, LiveClock, PathsView,
    ProbeLoad, SolutionInfo,
};
use crate::leader::clock::paths::{network_offset, PathAggregate};
use crate::leader::clock::records::{
    finite, model_state, ms, PathSecond, Solved, Store, AGGREGATION, MAX_PATHS_PER_CALL,
    PATH_WINDOW,
};
use crate::leader::clock::states::host_clock;
use crate::model::{ClusterState, NodeId};

/// What `railguard clock` shows from the store, taken under its lock.
pub(super) struct ClockShown {
    /// The latest solution (or failed solve).
    pub(super) solved: Option<Arc<Solved>>,
    /// Each host's probe rate and cost, and when it was reported.
    pub(super) probe_load: HashMap<String, (ProbeLoad, Instant)>,
    /// Why the latest tick brought no solution.
    pub(super) solve_error: Option<String>,
}

/// `railguard clock`.
pub(super) fn clock_view(
    shown: ClockShown,
    cfg: &SolveConfig,
    st: &ClusterState,
    leader: NodeId,
    now: Instant,
) -> ClockView {
    let ClockShown {
        solved,
        probe_load,
        solve_error,
    } = shown;
    let mut hosts: Vec<&crate::model::Host> = st.hosts.values().collect();
    hosts.sort_by_key(|h| h.id);
    let sol = solved.as_ref().and_then(|s| s.solution.as_ref());
    let hosts = hosts
        .into_iter()
        .map(|h| ClockHostView {
            host: h.name.clone(),
            id: h.id,
            state: h.clock.state,
            state_changed_ms: h.clock.changed_ms,
            live: solved
                .as_ref()
                .and_then(|s| host_clock(s, h, now, cfg))
                .and_then(|(c, held_for)| {
                    let all = [
                        c.offset_ns,
                        c.drift_ppb,
                        c.error_bound_ns,
                        c.drift_error_ppb,
                    ];
                    all.iter().all(|x| x.is_finite()).then(|| LiveClock {
                        offset_ns: c.offset_ns,
                        drift_ppb: c.drift_ppb,
                        error_bound_ns: c.error_bound_ns,
                        drift_error_ppb: c.drift_error_ppb,
                        state: model_state(c.state),
                        holdover_ms: held_for.map(ms),
                    })
                }),
            ntp: solved.as_ref().and_then(|s| s.ntp.get(&h.id).cloned()),
            probe: probe_load.get(&h.name).map(|(r, at)| ProbeLoad {
                age_ms: ms(now.saturating_duration_since(*at)),
                ..r.clone()
            }),
        })
        .collect();
    let Some(solved) = solved.as_deref() else {
        return ClockView {
            answered_by: leader,
            reference: None,
            reference_id: None,
            solution: None,
            solve_error,
            hosts,
            edges: Vec::new(),
        };
    };
    let edges = solved
        .edges
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let fit = sol.and_then(|s| s.edges.get(i));
            ClockEdgeView {
                from: e.from.clone(),
                to: e.to.clone(),
                from_id: e.from_id,
                to_id: e.to_id,
                rail: e.rail,
                at_ns: e.report.at_ns,
                offset_ns: e.report.offset_ns,
                drift_ppb: e.report.drift_ppb,
                error_bound_ns: e.report.error_bound_ns,
                drift_error_ppb: e.report.drift_error_ppb,
                samples: e.report.samples,
                report_age_ms: ms(now.saturating_duration_since(e.report.arrived)),
                ntp_at_ns: e.report.ntp.map(|n| n.at_ns),
                ntp_offset_ns: e.report.ntp.map(|n| n.offset_ns),
                ntp_rtt_ns: e.report.ntp.map(|n| n.rtt_ns),
                queueing_ns: e.queueing_ns,
                residual_ns: fit.and_then(|f| finite(f.residual_ns)),
                z: fit.and_then(|f| finite(f.z)),
                drift_residual_ppb: fit.and_then(|f| finite(f.drift_residual_ppb)),
                status: fit.map(|f| match f.status {
                    EdgeStatus::Used => EdgeFit::Used,
                    EdgeStatus::Rejected => EdgeFit::Rejected,
                    EdgeStatus::Unreachable => EdgeFit::Unreachable,
                }),
            }
        })
        .collect();
    ClockView {
        answered_by: leader,
        reference: st.host_ids.get(&solved.reference).cloned(),
        reference_id: Some(solved.reference),
        solution: sol.map(|s| SolutionInfo {
            at_ns: s.at_ns,
            solved_unix_ms: solved.unix_ms,
            age_ms: ms(now.saturating_duration_since(solved.at)),
            chi2_per_dof: finite(s.chi2_per_dof),
            dof: s.dof,
            edges_used: s
                .edges
                .iter()
                .filter(|e| e.status == EdgeStatus::Used)
                .count(),
            edges_rejected: s
                .edges
                .iter()
                .filter(|e| e.status == EdgeStatus::Rejected)
                .count(),
            hosts_solved: s.hosts.len(),
        }),
        solve_error,
        hosts,
        edges,
    }
}

/// `railguard paths`: paths touching `host` (all without), worst p99
/// first, at most `top`.
pub(super) fn paths_view(
    store: &Store,
    st: &ClusterState,
    leader: NodeId,
    host: Option<&str>,
    top: Option<u32>,
    now: Instant,
) -> Result<PathsView, ApiError> {
    if top == Some(0) {
        return Err(ApiError::invalid("--top must be at least 1"));
    }
    if let Some(h) = host {
        if !st.hosts.contains_key(h) {
            return Err(ApiError::new(
                ErrorKind::NotFound,
                format!("host {h:?} not found"),
            ));
        }
    }
    let sol = store.solved.as_ref().and_then(|s| {
        s.solution
            .as_ref()
            .map(|x| (x, now.saturating_duration_since(s.at)))
    });
    let mut paths = Vec::new();
    for (dst, table) in &store.paths {
        let Some(dh) = st.hosts.get(dst) else {
            continue;
        };
        for (k, ring) in table {
            let Some(sh) = st.hosts.get(&k.src) else {
                continue;
            };
            if host.is_some_and(|f| f != dst && f != k.src) {
                continue;
            }
            let seconds: Vec<&PathSecond> = ring
                .iter()
                .filter(|s| now.saturating_duration_since(s.arrived) <= PATH_WINDOW)
                .collect();
            let Some(last) = seconds.last() else {
                continue;
            };
            let theta = |at_ns| sol.and_then(|(s, _)| network_offset(s, dh.id, sh.id, at_ns));
            let mut agg = PathAggregate::default();
            for s in &seconds {
                agg.add(s, theta(s.at_ns));
            }
            paths.push(agg.finish(k, dst, ms(now.saturating_duration_since(last.arrived))));
        }
    }
    paths.sort_by(|a, b| {
        b.p99_us
            .unwrap_or(f64::NEG_INFINITY)
            .total_cmp(&a.p99_us.unwrap_or(f64::NEG_INFINITY))
            .then_with(|| {
                (&a.src, &a.src_nic, &a.dst, &a.dst_nic, a.rail)
                    .cmp(&(&b.src, &b.src_nic, &b.dst, &b.dst_nic, b.rail))
            })
    });
    let total = paths.len();
    let limit = top.map_or(MAX_PATHS_PER_CALL, |t| (t as usize).min(MAX_PATHS_PER_CALL));
    paths.truncate(limit);
    Ok(PathsView {
        answered_by: leader,
        window_s: PATH_WINDOW.as_secs(),
        aggregation: AGGREGATION.into(),
        solution_age_ms: sol.map(|(_, age)| ms(age)),
        total,
        paths,
    })
}
