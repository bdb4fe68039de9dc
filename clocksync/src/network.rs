//! The network effect: loop correction over the probe mesh.
//!
//! Every probed pair `(a, b)` contributes an [`EdgeEstimate`] of
//! `clock_b - clock_a` and of the pair's drift. Around any loop of hosts the
//! true offsets (taken at one physical instant) sum to zero, and the true
//! log-rates `ln(1 + drift)` sum to zero exactly. [`solve`] finds the
//! per-host offsets and drifts relative to a reference host (fixed at zero)
//! by weighted least squares — the minimum-variance way to impose the loop
//! constraints — and reports:
//!
//! * each host's offset and drift and their error bounds, from the inverse
//!   normal matrix (the propagated edge errors), inflated by the reduced
//!   χ² when the edges disagree more than their stated errors allow;
//! * each edge's residual (measured minus fitted) and its studentised value
//!   `z = r / (σ·√(1 - h))` (`h` the edge's leverage): the loop
//!   inconsistency Huygens uses to find bad estimates. By default the edge
//!   with the largest `|z|` above [`SolveConfig::reject_z`] (relative to the
//!   median `|z|`, so uniformly understated errors reject nothing) is set
//!   aside and the solve repeated, a bounded number of times. A bridge edge
//!   (leverage 1) has residual 0 and is never rejected, so rejection never
//!   disconnects the graph.
//!
//! # Time alignment
//!
//! Edges are measured at different times, each on its `from` host's clock,
//! and clocks differ by up to seconds: evaluating every edge "at time T" on
//! different clocks would, at 200 ppm, misalign them by up to 200 µs per
//! second of offset. The solve therefore brings each edge to the common
//! physical instant at which the reference clock reads `at_ns`: on host `a`
//! that instant reads `at_ns + x_a`, where `x_a` is `a`'s offset being
//! solved for. Starting from `x = 0`, fixed-point passes make the
//! misalignment negligible (each pass shrinks it by the drift, ≤ 1e-3;
//! passes stop when no offset moves by more than 1e-6 ns, at most 8). An
//! edge's error grows with its drift error times its distance from that
//! instant.
//!
//! # Cost
//!
//! Dense Cholesky factorisations of the `(n-1)×(n-1)` normal matrix (one
//! for the drifts, two or three for the offsets while the weights settle)
//! and one inverse factor each for the error bounds: O(n³) time, O(n²)
//! memory. Measured in a release build on K=6 meshes: 0.4 ms for 64 hosts,
//! 19 ms for 256, 130 ms for 512, each rejected edge adding one more round.
//! Hosts are capped by [`SolveConfig::max_hosts`].
//!
//! # Error bounds
//!
//! A host's `error_bound_ns` is the edge errors propagated through the
//! solve (`√(N⁻¹)_hh`), so it is in the edges' units: with the per-pair
//! bounds of [`crate::pair`] (≈ 99 % coverage) as edge errors it is a bound
//! of the same kind, and it is smaller than an edge's because every host is
//! reached over many paths. It is statistical: a path asymmetry on an edge
//! is a bias the solve cannot see unless loops expose it as a residual.
//!
//! Duplicate edges and both directions of a pair are independent
//! observations to the solve. If they come from the same probes (both agents
//! reporting one pair), their weight is double-counted and the host bounds
//! are optimistic by up to √2: report each pair once.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::host::HostId;
use crate::linalg::{Cholesky, CovFactor};
use crate::pair::Estimate;

/// One pair's measurement, as an agent reports it to the supervisor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EdgeEstimate {
    /// The host whose clock is the time axis (A).
    pub from: HostId,
    /// The other host (B).
    pub to: HostId,
    /// When the estimate holds, on `from`'s clock (ns).
    pub at_ns: i64,
    /// `clock_to - clock_from` at `at_ns` (ns).
    pub offset_ns: f64,
    /// `d(clock_to - clock_from)/d(clock_from)` in ppb.
    pub drift_ppb: f64,
    /// Error scale of `offset_ns` (ns); the weight is its inverse square.
    pub offset_error_ns: f64,
    /// Error scale of `drift_ppb`.
    pub drift_error_ppb: f64,
}

impl EdgeEstimate {
    /// The edge for a [`PairEstimator`](crate::pair::PairEstimator)'s
    /// estimate, `from` being the estimator's host A.
    pub fn from_estimate(from: HostId, to: HostId, est: &Estimate) -> Self {
        Self {
            from,
            to,
            at_ns: est.at_ns,
            offset_ns: est.offset_ns,
            drift_ppb: est.drift_ppb,
            offset_error_ns: est.error_bound_ns,
            drift_error_ppb: est.drift_error_ppb,
        }
    }
}

/// Tuning of [`solve_with`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SolveConfig {
    /// A host is [`ClockState::Synced`] if its error bound is at most this
    /// (ns). Default 1 µs.
    pub synced_ns: f64,
    /// A host is [`ClockState::Degraded`] if its error bound is at most this
    /// (ns), else Unsynced. Default 100 µs.
    pub degraded_ns: f64,
    /// Floor on edge offset errors (ns), so no edge gets infinite weight.
    /// Default 1.
    pub min_offset_error_ns: f64,
    /// Floor on edge drift errors (ppb). Default 1.
    pub min_drift_error_ppb: f64,
    /// Reject the worst edge while its `|z|` exceeds this times
    /// `max(1, median|z|/0.6745)`. `f64::INFINITY` disables. Default 6.
    pub reject_z: f64,
    /// Most edges rejected per solve. Default 8.
    pub max_rejected_edges: usize,
    /// Most hosts accepted. Default 1024.
    pub max_hosts: usize,
    /// Most edges accepted. Default 65,536.
    pub max_edges: usize,
}

impl Default for SolveConfig {
    fn default() -> Self {
        Self {
            synced_ns: 1_000.0,
            degraded_ns: 100_000.0,
            min_offset_error_ns: 1.0,
            min_drift_error_ppb: 1.0,
            reject_z: 6.0,
            max_rejected_edges: 8,
            max_hosts: 1024,
            max_edges: 65_536,
        }
    }
}

impl SolveConfig {
    /// The state an error bound of `bound_ns` earns.
    pub fn state_of(&self, bound_ns: f64) -> ClockState {
        if bound_ns <= self.synced_ns {
            ClockState::Synced
        } else if bound_ns <= self.degraded_ns {
            ClockState::Degraded
        } else {
            ClockState::Unsynced
        }
    }
}

/// A host's synchronisation state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ClockState {
    /// Error bound within [`SolveConfig::synced_ns`].
    Synced,
    /// Error bound within [`SolveConfig::degraded_ns`].
    Degraded,
    /// Worse, or not connected to the reference.
    Unsynced,
}

/// One host's solved clock, relative to the reference host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostClock {
    /// The host.
    pub host: HostId,
    /// `clock_host - clock_ref` when the reference clock reads the
    /// solution's `at_ns` (ns).
    pub offset_ns: f64,
    /// `d(clock_host - clock_ref)/d(clock_ref)` in ppb.
    pub drift_ppb: f64,
    /// Error bound of `offset_ns` (ns), in the units of the edge errors.
    pub error_bound_ns: f64,
    /// Error bound of `drift_ppb`.
    pub drift_error_ppb: f64,
    /// Classification of `error_bound_ns`.
    pub state: ClockState,
}

impl HostClock {
    /// `clock_host - clock_ref` when the reference clock reads `t_ref_ns`,
    /// given the solution's `at_ns`.
    pub fn offset_at(&self, at_ns: i64, t_ref_ns: i64) -> f64 {
        self.offset_ns + self.drift_ppb * 1e-9 * crate::timestamp::ns_diff(t_ref_ns, at_ns)
    }
}

/// What the solve did with an edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EdgeStatus {
    /// In the fit.
    Used,
    /// Set aside for its loop residual.
    Rejected,
    /// Between hosts not connected to the reference; residual 0.
    Unreachable,
}

/// An edge's loop inconsistency.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EdgeResidual {
    /// Edge source.
    pub from: HostId,
    /// Edge target.
    pub to: HostId,
    /// Measured offset (at the common instant) minus fitted `x_to - x_from`
    /// (ns).
    pub residual_ns: f64,
    /// Studentised residual (for rejected edges: residual over its
    /// prediction error).
    pub z: f64,
    /// Measured minus fitted drift (ppb, log-rate).
    pub drift_residual_ppb: f64,
    /// Used, rejected or unreachable.
    pub status: EdgeStatus,
}

/// The network solution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Solution {
    /// The reference host (offset 0, drift 0).
    pub reference: HostId,
    /// The reference clock's reading at which offsets hold (ns).
    pub at_ns: i64,
    /// Hosts connected to the reference (the reference included), by id.
    pub hosts: Vec<HostClock>,
    /// Hosts with edges but no path to the reference (Unsynced).
    pub unreachable: Vec<HostId>,
    /// One entry per input edge, in input order.
    pub edges: Vec<EdgeResidual>,
    /// Offset χ² per degree of freedom (NaN-free: 0 with no redundancy).
    pub chi2_per_dof: f64,
    /// Degrees of freedom: used edges minus solved hosts.
    pub dof: usize,
}

impl Solution {
    /// The solved clock of `host`, if it is connected to the reference.
    pub fn host(&self, host: HostId) -> Option<&HostClock> {
        self.hosts
            .binary_search_by_key(&host, |h| h.host)
            .ok()
            .map(|i| &self.hosts[i])
    }

    /// The state of `host`; Unsynced if unreachable or unknown.
    pub fn state(&self, host: HostId) -> ClockState {
        self.host(host).map_or(ClockState::Unsynced, |h| h.state)
    }

    /// Edges in the fit whose `|z|` exceeds `z`, and the rejected ones.
    pub fn suspect_edges(&self, z: f64) -> impl Iterator<Item = &EdgeResidual> {
        self.edges.iter().filter(move |e| {
            e.status == EdgeStatus::Rejected || (e.status == EdgeStatus::Used && e.z.abs() > z)
        })
    }
}

/// Errors of the network solve.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NetworkError {
    /// A configuration value is out of range.
    #[error("invalid solve config: {0}")]
    InvalidConfig(&'static str),
    /// An input edge is malformed.
    #[error("edge {index} ({from} -> {to}): {reason}")]
    InvalidEdge {
        /// Position in the input.
        index: usize,
        /// Its source.
        from: HostId,
        /// Its target.
        to: HostId,
        /// What is wrong.
        reason: &'static str,
    },
    /// No edge touches the reference host.
    #[error("reference {0} is on no edge")]
    ReferenceNotInGraph(HostId),
    /// Too many hosts for the dense solver.
    #[error("{hosts} hosts exceed the limit of {max}")]
    TooManyHosts {
        /// Hosts in the input.
        hosts: usize,
        /// The limit.
        max: usize,
    },
    /// Too many edges.
    #[error("{edges} edges exceed the limit of {max}")]
    TooManyEdges {
        /// Edges in the input.
        edges: usize,
        /// The limit.
        max: usize,
    },
    /// The normal matrix is numerically singular (weights spanning too many
    /// orders of magnitude).
    #[error("normal matrix is numerically singular")]
    Singular,
}

/// [`solve_with`] with the default [`SolveConfig`].
pub fn solve(
    edges: &[EdgeEstimate],
    reference: HostId,
    at_ns: i64,
) -> Result<Solution, NetworkError> {
    solve_with(edges, reference, at_ns, &SolveConfig::default())
}

/// Most fixed-point passes of the time alignment; each shrinks the
/// misalignment by the drift (≤ 1e-3), so 1 s of offset is below 1e-6 ns
/// after five.
const MAX_ALIGN_PASSES: usize = 8;

/// Per-edge inputs to one weighted least-squares solve.
struct Obs {
    a: Option<usize>,
    b: Option<usize>,
    value: f64,
    sigma: f64,
}

/// The normal equations `N·x = rhs` of weighted least squares on the graph.
fn normal_matrix(obs: &[Obs], m: usize) -> Result<Cholesky, NetworkError> {
    let mut n = vec![0.0; m * m];
    for o in obs {
        let w = 1.0 / (o.sigma * o.sigma);
        if let Some(a) = o.a {
            n[a * m + a] += w;
        }
        if let Some(b) = o.b {
            n[b * m + b] += w;
        }
        if let (Some(a), Some(b)) = (o.a, o.b) {
            n[a * m + b] -= w;
            n[b * m + a] -= w;
        }
    }
    Cholesky::factor(n, m).ok_or(NetworkError::Singular)
}

/// Solve the normal equations for the observations' values (their weights
/// must be those `chol` was built from).
fn solve_values(chol: &Cholesky, obs: &[Obs], m: usize) -> Vec<f64> {
    let mut rhs = vec![0.0; m];
    for o in obs {
        let wv = o.value / (o.sigma * o.sigma);
        if let Some(a) = o.a {
            rhs[a] -= wv;
        }
        if let Some(b) = o.b {
            rhs[b] += wv;
        }
    }
    chol.solve(&mut rhs);
    rhs
}

fn get(x: &[f64], i: Option<usize>) -> f64 {
    i.map_or(0.0, |i| x[i])
}

fn chi2_scale(chi2: f64, dof: usize) -> f64 {
    if dof > 0 {
        (chi2 / dof as f64).max(1.0)
    } else {
        1.0
    }
}

/// Solve the network (see the module docs). `at_ns` is the reference
/// clock's reading at which the offsets are wanted.
pub fn solve_with(
    edges: &[EdgeEstimate],
    reference: HostId,
    at_ns: i64,
    cfg: &SolveConfig,
) -> Result<Solution, NetworkError> {
    validate_config(cfg)?;
    if edges.len() > cfg.max_edges {
        return Err(NetworkError::TooManyEdges {
            edges: edges.len(),
            max: cfg.max_edges,
        });
    }
    for (index, e) in edges.iter().enumerate() {
        let bad = |reason| NetworkError::InvalidEdge {
            index,
            from: e.from,
            to: e.to,
            reason,
        };
        if e.from == e.to {
            return Err(bad("self loop"));
        }
        if !e.offset_ns.is_finite() || !e.drift_ppb.is_finite() {
            return Err(bad("offset or drift not finite"));
        }
        if e.drift_ppb.abs() >= 1e8 {
            return Err(bad("drift beyond ±10%"));
        }
        if e.offset_error_ns.is_nan()
            || e.offset_error_ns < 0.0
            || e.offset_error_ns.is_infinite()
            || e.drift_error_ppb.is_nan()
            || e.drift_error_ppb < 0.0
            || e.drift_error_ppb.is_infinite()
        {
            return Err(bad("error must be finite and ≥ 0"));
        }
    }

    // Hosts and connectivity to the reference.
    let mut ids: BTreeMap<HostId, usize> = BTreeMap::new();
    for e in edges {
        for h in [e.from, e.to] {
            let next = ids.len();
            ids.entry(h).or_insert(next);
        }
    }
    let Some(&ref_idx) = ids.get(&reference) else {
        return Err(NetworkError::ReferenceNotInGraph(reference));
    };
    if ids.len() > cfg.max_hosts {
        return Err(NetworkError::TooManyHosts {
            hosts: ids.len(),
            max: cfg.max_hosts,
        });
    }
    let mut adj = vec![Vec::new(); ids.len()];
    for e in edges {
        let (a, b) = (ids[&e.from], ids[&e.to]);
        adj[a].push(b);
        adj[b].push(a);
    }
    let mut reach = vec![false; ids.len()];
    reach[ref_idx] = true;
    let mut queue = VecDeque::from([ref_idx]);
    while let Some(a) = queue.pop_front() {
        for &b in &adj[a] {
            if !reach[b] {
                reach[b] = true;
                queue.push_back(b);
            }
        }
    }
    // Unknowns: reachable hosts except the reference, in id order.
    let mut col: BTreeMap<HostId, Option<usize>> = BTreeMap::new();
    let mut unreachable = Vec::new();
    let mut m = 0;
    for (&h, &i) in &ids {
        if !reach[i] {
            unreachable.push(h);
        } else if h == reference {
            col.insert(h, None);
        } else {
            col.insert(h, Some(m));
            m += 1;
        }
    }
    let mut status: Vec<EdgeStatus> = edges
        .iter()
        .map(|e| {
            if col.contains_key(&e.from) {
                EdgeStatus::Used
            } else {
                EdgeStatus::Unreachable
            }
        })
        .collect();
    let ends = |e: &EdgeEstimate| {
        (
            col.get(&e.from).copied().flatten(),
            col.get(&e.to).copied().flatten(),
        )
    };

    let mut rejected = 0;
    loop {
        let used: Vec<usize> = (0..edges.len())
            .filter(|&i| status[i] == EdgeStatus::Used)
            .collect();

        // Drifts, as log-rates (exactly additive around loops), in ppb.
        let dobs: Vec<Obs> = used
            .iter()
            .map(|&i| {
                let e = &edges[i];
                let (a, b) = ends(e);
                Obs {
                    a,
                    b,
                    value: (e.drift_ppb * 1e-9).ln_1p() * 1e9,
                    sigma: e.drift_error_ppb.max(cfg.min_drift_error_ppb),
                }
            })
            .collect();
        let zchol = normal_matrix(&dobs, m)?;
        let z = solve_values(&zchol, &dobs, m);

        // Offsets at the common instant, by fixed-point passes: an edge's
        // value (and, through its age, its error) depends on its source's
        // offset. Refactor while offsets still move by ≥ 1 µs (the ages, and
        // so the weights, are then right to 1e-6 relative); after that only
        // the values are refined, on the same factorisation.
        let align = |x: &[f64]| -> Vec<Obs> {
            used.iter()
                .map(|&i| {
                    let e = &edges[i];
                    let (a, b) = ends(e);
                    let dt = crate::timestamp::ns_diff(at_ns, e.at_ns) + get(x, a);
                    let s0 = e.offset_error_ns.max(cfg.min_offset_error_ns);
                    let s1 = e.drift_error_ppb * 1e-9 * dt;
                    Obs {
                        a,
                        b,
                        value: e.offset_ns + e.drift_ppb * 1e-9 * dt,
                        sigma: (s0 * s0 + s1 * s1).sqrt(),
                    }
                })
                .collect()
        };
        let mut x = vec![0.0; m];
        let mut obs = align(&x);
        let mut chol = normal_matrix(&obs, m)?;
        let mut weighted = false;
        for _ in 0..MAX_ALIGN_PASSES {
            let next = solve_values(&chol, &obs, m);
            let change = next
                .iter()
                .zip(&x)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            x = next;
            if change < 1e-6 {
                break;
            }
            let aligned = align(&x);
            if !weighted {
                obs = aligned;
                chol = normal_matrix(&obs, m)?;
                weighted = change < 1e3;
            } else {
                for (o, n) in obs.iter_mut().zip(aligned) {
                    o.value = n.value;
                }
            }
        }
        let cov = chol.cov_factor();

        // Residuals and studentised residuals.
        let mut res = vec![(0.0, 0.0, 0.0); edges.len()];
        let mut chi2 = 0.0;
        for (k, &i) in used.iter().enumerate() {
            let o = &obs[k];
            let r = o.value - (get(&x, o.b) - get(&x, o.a));
            let h = cov.diff_var(o.a, o.b) / (o.sigma * o.sigma);
            let zr = if 1.0 - h > 1e-9 {
                r / (o.sigma * (1.0 - h).sqrt())
            } else {
                0.0
            };
            let dr = dobs[k].value - (get(&z, o.b) - get(&z, o.a));
            res[i] = (r, zr, dr);
            chi2 += (r / o.sigma).powi(2);
        }
        let dof = used.len().saturating_sub(m);

        // Reject the worst edge, if it is far out relative to the bulk.
        if cfg.reject_z.is_finite() && rejected < cfg.max_rejected_edges && dof > 0 {
            let mut absz: Vec<f64> = used.iter().map(|&i| res[i].1.abs()).collect();
            absz.sort_by(f64::total_cmp);
            let median = absz[absz.len() / 2];
            let scale = (median / 0.6745).max(1.0);
            let worst = used
                .iter()
                .copied()
                .max_by(|&p, &q| res[p].1.abs().total_cmp(&res[q].1.abs()));
            if let Some(w) = worst {
                if res[w].1.abs() > cfg.reject_z * scale {
                    status[w] = EdgeStatus::Rejected;
                    rejected += 1;
                    continue;
                }
            }
        }

        // Assemble the solution.
        let oscale = chi2_scale(chi2, dof).sqrt();
        let dchi2: f64 = used
            .iter()
            .zip(&dobs)
            .map(|(&i, o)| (res[i].2 / o.sigma).powi(2))
            .sum();
        let dscale = chi2_scale(dchi2, dof).sqrt();
        let zcov: CovFactor = zchol.cov_factor();
        let hosts = col
            .iter()
            .map(|(&host, &c)| {
                let (offset_ns, drift_ppb, error_bound_ns, drift_error_ppb) = match c {
                    None => (0.0, 0.0, 0.0, 0.0),
                    Some(c) => (
                        x[c],
                        (z[c] * 1e-9).exp_m1() * 1e9,
                        cov.var(c).sqrt() * oscale,
                        zcov.var(c).sqrt() * dscale,
                    ),
                };
                let state = cfg.state_of(error_bound_ns);
                HostClock {
                    host,
                    offset_ns,
                    drift_ppb,
                    error_bound_ns,
                    drift_error_ppb,
                    state,
                }
            })
            .collect();
        let edge_res = edges
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let (r, zr, dr) = match status[i] {
                    EdgeStatus::Used => res[i],
                    EdgeStatus::Unreachable => (0.0, 0.0, 0.0),
                    EdgeStatus::Rejected => {
                        let (a, b) = ends(e);
                        let dt = crate::timestamp::ns_diff(at_ns, e.at_ns) + get(&x, a);
                        let s0 = e.offset_error_ns.max(cfg.min_offset_error_ns);
                        let s1 = e.drift_error_ppb * 1e-9 * dt;
                        let value = e.offset_ns + e.drift_ppb * 1e-9 * dt;
                        let r = value - (get(&x, b) - get(&x, a));
                        let pred = (s0 * s0 + s1 * s1 + cov.diff_var(a, b)).sqrt();
                        let dr = (e.drift_ppb * 1e-9).ln_1p() * 1e9 - (get(&z, b) - get(&z, a));
                        (r, r / pred, dr)
                    }
                };
                EdgeResidual {
                    from: e.from,
                    to: e.to,
                    residual_ns: r,
                    z: zr,
                    drift_residual_ppb: dr,
                    status: status[i],
                }
            })
            .collect();
        return Ok(Solution {
            reference,
            at_ns,
            hosts,
            unreachable,
            edges: edge_res,
            chi2_per_dof: if dof > 0 { chi2 / dof as f64 } else { 0.0 },
            dof,
        });
    }
}

fn validate_config(cfg: &SolveConfig) -> Result<(), NetworkError> {
    let pos = |v: f64| v.is_finite() && v > 0.0;
    if !pos(cfg.synced_ns) || !pos(cfg.degraded_ns) || cfg.degraded_ns < cfg.synced_ns {
        return Err(NetworkError::InvalidConfig(
            "need 0 < synced_ns <= degraded_ns, finite",
        ));
    }
    if !pos(cfg.min_offset_error_ns) || !pos(cfg.min_drift_error_ppb) {
        return Err(NetworkError::InvalidConfig(
            "error floors must be finite and > 0",
        ));
    }
    if cfg.reject_z.is_nan() || cfg.reject_z <= 0.0 {
        return Err(NetworkError::InvalidConfig("reject_z must be > 0"));
    }
    if cfg.max_hosts == 0 || cfg.max_hosts > 8192 {
        return Err(NetworkError::InvalidConfig("max_hosts must be in 1..=8192"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::network::*;

    fn edge(from: u32, to: u32, offset_ns: f64) -> EdgeEstimate {
        EdgeEstimate {
            from: HostId(from),
            to: HostId(to),
            at_ns: 0,
            offset_ns,
            drift_ppb: 0.0,
            offset_error_ns: 100.0,
            drift_error_ppb: 10.0,
        }
    }

    #[test]
    fn triangle_loop_is_closed() {
        // Loop 0→1→2→0 misclosure of 300 ns, spread evenly.
        let edges = [edge(0, 1, 1000.0), edge(1, 2, 2000.0), edge(2, 0, -2700.0)];
        let s = solve(&edges, HostId(0), 0).unwrap();
        let x1 = s.host(HostId(1)).unwrap().offset_ns;
        let x2 = s.host(HostId(2)).unwrap().offset_ns;
        assert!((x1 - 900.0).abs() < 1e-6, "{x1}");
        assert!((x2 - 2800.0).abs() < 1e-6, "{x2}");
        for e in &s.edges {
            assert!((e.residual_ns.abs() - 100.0).abs() < 1e-6);
        }
        assert_eq!(s.dof, 1);
    }

    #[test]
    fn disconnected_hosts_are_unreachable() {
        let edges = [edge(0, 1, 5.0), edge(2, 3, 7.0)];
        let s = solve(&edges, HostId(0), 0).unwrap();
        assert_eq!(s.unreachable, vec![HostId(2), HostId(3)]);
        assert_eq!(s.state(HostId(2)), ClockState::Unsynced);
        assert_eq!(s.state(HostId(9)), ClockState::Unsynced);
        assert_eq!(s.state(HostId(1)), ClockState::Synced);
        assert_eq!(s.edges[1].status, EdgeStatus::Unreachable);
        assert!((s.host(HostId(1)).unwrap().offset_ns - 5.0).abs() < 1e-9);
    }

    #[test]
    fn duplicates_and_reverse_edges_average() {
        let edges = [edge(0, 1, 100.0), edge(0, 1, 120.0), edge(1, 0, -140.0)];
        let s = solve(&edges, HostId(0), 0).unwrap();
        assert!((s.host(HostId(1)).unwrap().offset_ns - 120.0).abs() < 1e-9);
    }

    #[test]
    fn bad_input_is_refused() {
        assert_eq!(
            solve(&[edge(0, 1, 1.0)], HostId(5), 0).unwrap_err(),
            NetworkError::ReferenceNotInGraph(HostId(5))
        );
        assert!(matches!(
            solve(&[edge(1, 1, 1.0)], HostId(1), 0),
            Err(NetworkError::InvalidEdge { index: 0, .. })
        ));
        let mut e = edge(0, 1, f64::NAN);
        assert!(solve(std::slice::from_ref(&e), HostId(0), 0).is_err());
        e.offset_ns = 0.0;
        e.offset_error_ns = -1.0;
        assert!(solve(std::slice::from_ref(&e), HostId(0), 0).is_err());
        e.offset_error_ns = 0.0; // floored, fine
        assert!(solve(std::slice::from_ref(&e), HostId(0), 0).is_ok());
        let cfg = SolveConfig {
            max_hosts: 2,
            ..SolveConfig::default()
        };
        assert!(matches!(
            solve_with(&[edge(0, 1, 1.0), edge(1, 2, 1.0)], HostId(0), 0, &cfg),
            Err(NetworkError::TooManyHosts { .. })
        ));
        assert!(solve(&[], HostId(0), 0).is_err());
    }
}
