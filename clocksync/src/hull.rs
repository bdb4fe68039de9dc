//! Exact maximum-margin strip between two point sets in the plane.
//!
//! Given points `A` that must lie on or above a line and points `B` that must
//! lie on or below a parallel line, find the slope `b` (within `±max_slope`)
//! that maximises the vertical gap between the two lines:
//!
//! ```text
//! gap(b) = min_{i∈A} (y_i - b·t_i)  -  max_{j∈B} (y_j - b·t_j)
//! ```
//!
//! This is the linear programme "maximise m subject to y_i ≥ a + b·t_i + m
//! (A) and y_j ≤ a + b·t_j - m (B)" — the hard-margin SVM of Huygens with the
//! margin measured vertically (the natural metric here: offsets are in ns,
//! time in ns, and slopes are ≤ 1e-3, so vertical and Euclidean margins agree
//! to 1e-6 relative). The answer's midline `a + b·t` is the offset line.
//!
//! `gap` is concave and piecewise linear; only the lower convex hull of `A`
//! and the upper convex hull of `B` matter, and its breakpoints are their edge
//! slopes. Its derivative at `b` is `t_B*(b) - t_A*(b)` (the times of the two
//! supporting vertices), which starts positive and decreases as `b` grows, so
//! one merge-like walk over both hulls finds the maximum: O(h) after O(n)
//! hull construction on time-sorted input. Hulls are built with exact integer
//! (i128) orientation tests, and the derivative's sign is an exact integer
//! comparison, so the search itself never suffers from rounding.

/// A point: time `t` and value `y`, both in ns, relative to a local origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Pt {
    pub t: i64,
    pub y: i64,
}

/// The maximum-margin strip.
#[derive(Debug, Clone)]
pub(crate) struct Strip {
    /// Slope `b` of both lines.
    pub slope: f64,
    /// Midline value at `t = 0`.
    pub intercept: f64,
    /// Half the vertical gap between the lines (negative if not separable).
    pub half_gap: f64,
    /// Indices (into the caller's index lists) of supporting points of `A`.
    pub above_contacts: Vec<usize>,
    /// Indices of supporting points of `B`.
    pub below_contacts: Vec<usize>,
}

/// Why no strip was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StripError {
    /// One of the sets is empty.
    Empty,
    /// The optimum sits at `-max_slope` (`lower = true`) or `+max_slope`: the
    /// data do not pin the slope down inside the allowed range.
    SlopeAtBound { lower: bool },
}

fn cross(o: Pt, a: Pt, b: Pt) -> i128 {
    let (ot, oy) = (i128::from(o.t), i128::from(o.y));
    (i128::from(a.t) - ot) * (i128::from(b.y) - oy)
        - (i128::from(a.y) - oy) * (i128::from(b.t) - ot)
}

/// Lower hull (for `lower = true`) or upper hull of `pts[sel[..]]`; `sel`
/// must be ordered so that the points are sorted by `(t, y)`. Points sharing
/// a `t` are reduced to their lowest (lower hull) or highest (upper hull).
/// Returns positions into `sel`.
fn hull(pts: &[Pt], sel: &[usize], lower: bool, out: &mut Vec<usize>) {
    out.clear();
    for k in 0..sel.len() {
        let p = pts[sel[k]];
        if lower {
            if k > 0 && pts[sel[k - 1]].t == p.t {
                continue; // an earlier point at this t is lower
            }
        } else if k + 1 < sel.len() && pts[sel[k + 1]].t == p.t {
            continue; // a later point at this t is higher
        }
        while out.len() >= 2 {
            let c = cross(
                pts[sel[out[out.len() - 2]]],
                pts[sel[out[out.len() - 1]]],
                p,
            );
            if (lower && c <= 0) || (!lower && c >= 0) {
                out.pop();
            } else {
                break;
            }
        }
        out.push(k);
    }
}

fn slope(p: Pt, q: Pt) -> f64 {
    // Distinct t guaranteed by hull construction. Differences fit i64 for
    // the caller's relative coordinates; computed in i128 anyway.
    (i128::from(q.y) - i128::from(p.y)) as f64 / (i128::from(q.t) - i128::from(p.t)) as f64
}

/// Scratch buffers, reused across fits.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    ha: Vec<usize>,
    hb: Vec<usize>,
}

/// Fit the maximum-margin strip between `above` points (selected by
/// `sel_a`, sorted by `(t, y)`) and `below` points (selected by `sel_b`,
/// sorted likewise). Contacts are reported as positions into `sel_a` /
/// `sel_b`.
pub(crate) fn fit_strip(
    above: &[Pt],
    sel_a: &[usize],
    below: &[Pt],
    sel_b: &[usize],
    max_slope: f64,
    scratch: &mut Scratch,
) -> Result<Strip, StripError> {
    if sel_a.is_empty() || sel_b.is_empty() {
        return Err(StripError::Empty);
    }
    let Scratch { ha, hb } = scratch;
    hull(above, sel_a, true, ha);
    hull(below, sel_b, false, hb);
    let pa = |k: usize| above[sel_a[ha[k]]];
    let pb = |k: usize| below[sel_b[hb[k]]];
    // Edge slopes: increasing along the lower hull, decreasing along the
    // upper hull.
    let sa = |i: usize| slope(pa(i), pa(i + 1));
    let sb = |j: usize| slope(pb(j), pb(j + 1));
    let (na, nb) = (ha.len(), hb.len());

    // Supporting vertices at b = -max_slope. Vertex i of A is optimal for
    // b ∈ [sa(i-1), sa(i)]; vertex j of B for b ∈ [sb(j), sb(j-1)].
    let lo = -max_slope;
    let mut i = (0..na - 1).find(|&i| sa(i) >= lo).unwrap_or(na - 1);
    let mut j = (0..nb - 1).find(|&j| sb(j) <= lo).unwrap_or(nb - 1);
    let mut b = lo;
    let mut first = true;
    loop {
        let deriv = i128::from(pb(j).t) - i128::from(pa(i).t);
        let next_a = if i + 1 < na { sa(i) } else { f64::INFINITY };
        let next_b = if j > 0 { sb(j - 1) } else { f64::INFINITY };
        let next = next_a.min(next_b);
        if deriv < 0 {
            if first {
                return Err(StripError::SlopeAtBound { lower: true });
            }
            break; // maximum at the current breakpoint
        }
        if deriv == 0 {
            // Plateau: every slope in [b, next] is optimal; take the middle.
            // A plateau that reaches a bound leaves the slope unidentified.
            if first {
                return Err(StripError::SlopeAtBound { lower: true });
            }
            if next >= max_slope {
                return Err(StripError::SlopeAtBound { lower: false });
            }
            b = 0.5 * (b + next);
            break;
        }
        if next >= max_slope {
            return Err(StripError::SlopeAtBound { lower: false });
        }
        b = next;
        first = false;
        if next_a == next {
            i += 1;
        }
        if next_b == next {
            j -= 1;
        }
    }

    // Evaluate the strip at b over the hull vertices and collect contacts.
    let mut g = f64::INFINITY;
    for k in 0..na {
        g = g.min(pa(k).y as f64 - b * pa(k).t as f64);
    }
    let mut h = f64::NEG_INFINITY;
    for k in 0..nb {
        h = h.max(pb(k).y as f64 - b * pb(k).t as f64);
    }
    let tol = 1e-6 * (1.0 + g.abs().max(h.abs()));
    let above_contacts = (0..na)
        .filter(|&k| pa(k).y as f64 - b * pa(k).t as f64 <= g + tol)
        .map(|k| ha[k])
        .collect();
    let below_contacts = (0..nb)
        .filter(|&k| pb(k).y as f64 - b * pb(k).t as f64 >= h - tol)
        .map(|k| hb[k])
        .collect();
    Ok(Strip {
        slope: b,
        intercept: 0.5 * (g + h),
        half_gap: 0.5 * (g - h),
        above_contacts,
        below_contacts,
    })
}

#[cfg(test)]
mod tests {
    use crate::hull::*;

    fn pts(v: &[(i64, i64)]) -> Vec<Pt> {
        let mut p: Vec<Pt> = v.iter().map(|&(t, y)| Pt { t, y }).collect();
        p.sort();
        p
    }

    fn all(p: &[Pt]) -> Vec<usize> {
        (0..p.len()).collect()
    }

    /// Brute force: the optimum is at one of the pairwise slopes.
    fn brute(a: &[Pt], b: &[Pt], max_slope: f64) -> f64 {
        let mut cands = vec![-max_slope, max_slope];
        for set in [a, b] {
            for p in set {
                for q in set {
                    if p.t != q.t {
                        let s = slope(*p, *q);
                        if s.abs() < max_slope {
                            cands.push(s);
                        }
                    }
                }
            }
        }
        cands
            .into_iter()
            .map(|s| {
                let g = a
                    .iter()
                    .map(|p| p.y as f64 - s * p.t as f64)
                    .fold(f64::INFINITY, f64::min);
                let h = b
                    .iter()
                    .map(|p| p.y as f64 - s * p.t as f64)
                    .fold(f64::NEG_INFINITY, f64::max);
                0.5 * (g - h)
            })
            .fold(f64::NEG_INFINITY, f64::max)
    }

    #[test]
    fn symmetric_strip() {
        // Above: y = 10 + 0.001 t at t = 0, 100, 200 with noise on top.
        let a = pts(&[(0, 10), (100, 11), (200, 30), (300, 13), (50, 40)]);
        let b = pts(&[(20, -10), (150, -9), (250, -8), (280, -30)]);
        let s = fit_strip(&a, &all(&a), &b, &all(&b), 0.5, &mut Scratch::default()).unwrap();
        let want = brute(&a, &b, 0.5);
        assert!(
            (s.half_gap - want).abs() < 1e-9,
            "{} vs {}",
            s.half_gap,
            want
        );
    }

    #[test]
    fn non_interleaved_sets_hit_the_bound() {
        let a = pts(&[(0, 10), (10, 10)]);
        let b = pts(&[(20, 0), (30, 0)]);
        let e = fit_strip(&a, &all(&a), &b, &all(&b), 1e-3, &mut Scratch::default()).unwrap_err();
        assert_eq!(e, StripError::SlopeAtBound { lower: false });
        let e = fit_strip(&b, &all(&b), &a, &all(&a), 1e-3, &mut Scratch::default()).unwrap_err();
        assert!(matches!(e, StripError::SlopeAtBound { .. }));
    }

    #[test]
    fn random_against_brute_force() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut scratch = Scratch::default();
        for _ in 0..2000 {
            let slope_true = rng.gen_range(-0.01..0.01);
            let n = rng.gen_range(1..30);
            let m = rng.gen_range(1..30);
            let mut mk = |n: usize, sign: f64| {
                let v: Vec<(i64, i64)> = (0..n)
                    .map(|_| {
                        let t = rng.gen_range(-1000..1000);
                        let noise = rng.gen_range(0.0..50.0);
                        (
                            t,
                            (slope_true * t as f64 + sign * (5.0 + noise)).round() as i64,
                        )
                    })
                    .collect();
                pts(&v)
            };
            let a = mk(n, 1.0);
            let b = mk(m, -1.0);
            let want = brute(&a, &b, 0.05);
            match fit_strip(&a, &all(&a), &b, &all(&b), 0.05, &mut scratch) {
                Ok(s) => {
                    assert!(
                        (s.half_gap - want).abs() < 1e-6,
                        "{} vs {}",
                        s.half_gap,
                        want
                    );
                    assert!(!s.above_contacts.is_empty() && !s.below_contacts.is_empty());
                    // Feasibility of the returned strip.
                    for p in &a {
                        let line = s.intercept + s.slope * p.t as f64 + s.half_gap;
                        assert!(p.y as f64 >= line - 1e-6);
                    }
                    for p in &b {
                        let line = s.intercept + s.slope * p.t as f64 - s.half_gap;
                        assert!(p.y as f64 <= line + 1e-6);
                    }
                }
                Err(StripError::SlopeAtBound { .. }) => {
                    // The brute-force optimum must then be at the bound too:
                    // no interior slope does better than the bounds.
                }
                Err(e) => panic!("{e:?}"),
            }
        }
    }
}
