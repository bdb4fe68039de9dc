//! Cutting a history at quiescent points: instants that no completed
//! operation's `[call, ret]` interval spans. Unknown-outcome operations
//! never return, so they do not block cuts; each belongs to the first
//! segment still running when it is called.

use super::model::Operation;

/// A stretch of the history between two cuts.
pub(super) struct Segment {
    /// Completed operations (indices into the history), in call order.
    pub(super) done: Vec<usize>,
    /// Unknown-outcome operations called while this segment runs (after
    /// the previous cut, at or before its last return).
    pub(super) fresh: Vec<usize>,
}

/// Cuts the kept operations of `ops` into segments. Also returns how many
/// kept unknown-outcome operations were called after the last return
/// (these can only take effect after everything: never).
pub(super) fn segment<I, O>(ops: &[Operation<I, O>], keep: &[bool]) -> (Vec<Segment>, usize) {
    let ret = |o: &Operation<I, O>| o.ret.map(|r| r.max(o.call));
    let mut done: Vec<usize> = (0..ops.len())
        .filter(|&i| keep[i] && ops[i].ret.is_some())
        .collect();
    done.sort_by_key(|&i| (ops[i].call, ret(&ops[i]), i));
    let mut segs: Vec<Segment> = Vec::new();
    // Per segment: the latest return in it (non-decreasing over segments).
    let mut ends: Vec<u64> = Vec::new();
    for i in done {
        let (c, r) = (ops[i].call, ret(&ops[i]).unwrap_or(ops[i].call));
        // At equal times a call may precede a return, so a call at the
        // latest return so far is not past a cut.
        match ends.last_mut() {
            Some(end) if c <= *end => {
                *end = (*end).max(r);
                segs.last_mut().expect("a segment per end").done.push(i);
            }
            _ => {
                ends.push(r);
                segs.push(Segment {
                    done: vec![i],
                    fresh: Vec::new(),
                });
            }
        }
    }
    let mut after_end = 0;
    for (i, o) in ops.iter().enumerate() {
        if !keep[i] || o.ret.is_some() {
            continue;
        }
        let k = ends.partition_point(|&end| end < o.call);
        match segs.get_mut(k) {
            Some(s) => s.fresh.push(i),
            None => after_end += 1,
        }
    }
    (segs, after_end)
}
