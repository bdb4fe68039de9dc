//! The segmented checker: cuts a history at quiescent points (instants no
//! completed operation spans), searches the segments one after the other
//! and carries the frontier (every configuration a linearization of the
//! prefix can end in) across the cuts (see the module above for why this
//! is sound and complete).

use std::collections::HashMap;

use super::entries::Fast;
use super::model::{Limits, Model, Operation, Report, Verdict, MAX_FRONTIER};
use super::search::{search_segment, Config, Ctx, Multiset, SegmentOutcome};
use super::segment::segment;

/// Checks one history against `model` with at most `max_steps` search steps
/// (and at most [`MAX_FRONTIER`] configurations at a cut); see
/// [`check_with`].
pub fn check<M: Model>(
    model: &M,
    ops: &[Operation<M::Input, M::Output>],
    max_steps: u64,
) -> Verdict {
    let limits = Limits {
        max_steps,
        max_frontier: MAX_FRONTIER,
    };
    check_with(model, ops, limits).verdict
}

/// Checks one history against `model` by segments (see the module
/// documentation).
///
/// Sound and complete: [`Verdict::Linearizable`] iff a linearization exists
/// and [`Verdict::NotLinearizable`] iff none does, unless a limit is hit
/// first, which gives [`Verdict::Undecided`]. A completed operation's `ret`
/// is taken to be at least its `call`.
pub fn check_with<M: Model>(
    model: &M,
    ops: &[Operation<M::Input, M::Output>],
    limits: Limits,
) -> Report {
    let flagged = model.unobservable(ops);
    let keep: Vec<bool> = ops
        .iter()
        .enumerate()
        .map(|(i, o)| o.ret.is_some() || !flagged.get(i).copied().unwrap_or(false))
        .collect();
    let (segs, mut dropped) = segment(ops, &keep);
    dropped += keep.iter().filter(|k| !**k).count();
    let mut report = Report {
        verdict: Verdict::Linearizable,
        segments: segs.len(),
        largest_segment: segs.iter().map(|s| s.done.len()).max().unwrap_or(0),
        steps: 0,
        max_frontier: 1,
        dropped,
    };

    // Classes of unknown-outcome operations: equal inputs, one class.
    let mut class_of = vec![u32::MAX; ops.len()];
    let mut class_rep: Vec<usize> = Vec::new();
    {
        let mut ids: HashMap<&M::Input, u32, Fast> = HashMap::default();
        for s in &segs {
            for &i in &s.fresh {
                class_of[i] = *ids.entry(&ops[i].input).or_insert_with(|| {
                    class_rep.push(i);
                    (class_rep.len() - 1) as u32
                });
            }
        }
    }
    let ctx = Ctx {
        model,
        ops,
        class_of: &class_of,
        class_rep: &class_rep,
        max_steps: limits.max_steps,
    };

    let mut frontier = vec![Config {
        state: model.init(),
        pending: Multiset::default(),
    }];
    let mut before = 0usize;
    for (k, seg) in segs.iter().enumerate() {
        let out = search_segment(&ctx, seg, &frontier, &mut report.steps);
        match out {
            SegmentOutcome::OutOfSteps => {
                report.verdict = Verdict::Undecided;
                report.segments = k + 1;
                return report;
            }
            SegmentOutcome::Done { end, best } => {
                if end.is_empty() {
                    report.verdict = Verdict::NotLinearizable {
                        best_prefix: before + best,
                    };
                    report.segments = k + 1;
                    return report;
                }
                report.max_frontier = report.max_frontier.max(end.len());
                if end.len() > limits.max_frontier {
                    report.verdict = Verdict::Undecided;
                    report.segments = k + 1;
                    return report;
                }
                frontier = end;
            }
        }
        before += seg.done.len();
    }
    report
}
