//! The plain Wing & Gong search over a whole history at once: no
//! segmentation, no pruning of unknown-outcome operations. Slow on long
//! histories; kept as the reference the segmented checker is tested
//! against.

use std::collections::HashSet;

use super::entries::{build_entries, lift, unlift, Bits, Entry, Fast, NIL};
use super::model::{Model, Operation, Verdict};

/// Checks one history against `model` with the plain search over the whole
/// history at once (no segmentation, no pruning of unknown-outcome
/// operations), with at most `max_steps` search steps.
///
/// Sound and complete like [`check_with`](super::check::check_with), but its cost grows quickly with
/// the length of the history and the number of unknown-outcome operations;
/// it is the reference [`check`](super::check::check) is tested against.
pub fn check_unsegmented<M: Model>(
    model: &M,
    ops: &[Operation<M::Input, M::Output>],
    max_steps: u64,
) -> Verdict {
    let n = ops.len();
    if n == 0 {
        return Verdict::Linearizable;
    }
    let all: Vec<usize> = (0..n).collect();
    let mut entries = build_entries(ops, &all);

    // Candidates at a point of the search: every call before the first
    // return still in the list (a later call cannot precede that return's
    // operation). Operations with a known outcome are tried first; those
    // with an unknown outcome never block anything, so trying them only
    // when nothing else explains what follows keeps the search small.
    let candidates = |entries: &[Entry]| -> Vec<usize> {
        let mut known = Vec::new();
        let mut unknown = Vec::new();
        let mut i = entries[0].next;
        while i != NIL && entries[i].is_call {
            if ops[entries[i].op].ret.is_some() {
                known.push(i);
            } else {
                unknown.push(i);
            }
            i = entries[i].next;
        }
        known.extend(unknown);
        known
    };

    struct Frame<S> {
        entry: usize,
        prev_state: S,
        cands: Vec<usize>,
        next: usize,
    }

    let mut cache: HashSet<(Bits, M::State), Fast> = HashSet::default();
    let mut stack: Vec<Frame<M::State>> = Vec::new();
    let mut linearized = Bits::new(n);
    let mut state = model.init();
    let mut cands = candidates(&entries);
    let mut next = 0usize;
    let mut best = 0usize;
    let mut steps = 0u64;
    while entries[0].next != NIL {
        steps += 1;
        if steps > max_steps {
            return Verdict::Undecided;
        }
        if next < cands.len() {
            let entry = cands[next];
            next += 1;
            let op = &ops[entries[entry].op];
            let Some(new_state) = model.step(&state, &op.input, op.output.as_ref()) else {
                continue;
            };
            let mut nl = linearized.clone();
            nl.set(entries[entry].op);
            if !cache.insert((nl.clone(), new_state.clone())) {
                continue; // this (set, state) was explored already
            }
            lift(&mut entries, entry);
            stack.push(Frame {
                entry,
                prev_state: std::mem::replace(&mut state, new_state),
                cands: std::mem::take(&mut cands),
                next,
            });
            linearized = nl;
            best = best.max(stack.len());
            cands = candidates(&entries);
            next = 0;
        } else {
            // Every candidate failed here: undo the last choice.
            let Some(f) = stack.pop() else {
                return Verdict::NotLinearizable { best_prefix: best };
            };
            unlift(&mut entries, f.entry);
            linearized.clear(entries[f.entry].op);
            state = f.prev_state;
            cands = f.cands;
            next = f.next;
        }
    }
    debug_assert_eq!(linearized.count(), n);
    Verdict::Linearizable
}
