//! A porcupine-style linearizability checker (Wing & Gong's search with
//! Lowe's memoisation), and the model of one host's admin-visible state that
//! the supervisor scenarios check against.
//!
//! An operation whose outcome the client could not learn (timeout, lost
//! connection) has no return time and no output: it may take effect at any
//! point after its call, or never (linearising it after every other
//! operation is the same as never, since nothing later observes it).
//!
//! The search is bounded by a step budget; running out is reported as
//! [`Verdict::Undecided`], never as success.

use std::collections::{BTreeMap, HashSet};
use std::hash::Hash;

/// A sequential specification.
pub trait Model {
    type State: Clone + Eq + Hash + std::fmt::Debug;
    type Input: std::fmt::Debug;
    type Output: std::fmt::Debug;
    fn init(&self) -> Self::State;
    /// The state after applying `input` in `state`, if `output` is a
    /// possible result (`None` output: unknown, any result is acceptable).
    fn step(
        &self,
        state: &Self::State,
        input: &Self::Input,
        output: Option<&Self::Output>,
    ) -> Option<Self::State>;
}

/// One operation in a history.
#[derive(Debug, Clone)]
pub struct Operation<I, O> {
    pub client: usize,
    pub input: I,
    /// When the call was made (any monotonic unit, e.g. ns since start).
    pub call: u64,
    /// When it returned; `None` = outcome unknown.
    pub ret: Option<u64>,
    /// The result; `None` = outcome unknown.
    pub output: Option<O>,
}

/// The checker's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Linearizable,
    /// No linearization exists. Holds the longest prefix (by number of
    /// operations) the search managed to linearize, to help debugging.
    NotLinearizable {
        best_prefix: usize,
    },
    /// The step budget ran out before a decision.
    Undecided,
}

#[derive(Clone, Copy)]
struct Entry {
    is_call: bool,
    op: usize,
    /// For a call: index of its return entry.
    matching: usize,
    prev: usize,
    next: usize,
}

const NIL: usize = usize::MAX;

/// Fixed-size bit set used as part of the memo key.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Bits(Vec<u64>);

impl Bits {
    fn new(n: usize) -> Self {
        Bits(vec![0; n.div_ceil(64)])
    }
    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    fn clear(&mut self, i: usize) {
        self.0[i / 64] &= !(1 << (i % 64));
    }
    fn count(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }
}

/// Checks one history against `model` with at most `max_steps` search steps.
pub fn check<M: Model>(
    model: &M,
    ops: &[Operation<M::Input, M::Output>],
    max_steps: u64,
) -> Verdict {
    let n = ops.len();
    if n == 0 {
        return Verdict::Linearizable;
    }
    // Build entries: calls and returns sorted by time; at equal times calls
    // come first (an operation that starts when another ends may be ordered
    // either way).
    let mut ev: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * n);
    for (i, op) in ops.iter().enumerate() {
        ev.push((op.call, true, i));
        ev.push((op.ret.unwrap_or(u64::MAX), false, i));
    }
    ev.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
    // Entry 0 is a sentinel head.
    let mut entries: Vec<Entry> = Vec::with_capacity(2 * n + 1);
    entries.push(Entry {
        is_call: false,
        op: NIL,
        matching: NIL,
        prev: NIL,
        next: 1,
    });
    let mut ret_pos = vec![NIL; n];
    for (k, (_, is_call, op)) in ev.iter().enumerate() {
        let idx = k + 1;
        entries.push(Entry {
            is_call: *is_call,
            op: *op,
            matching: NIL,
            prev: idx - 1,
            next: if k + 1 < ev.len() { idx + 1 } else { NIL },
        });
        if !is_call {
            ret_pos[*op] = idx;
        }
    }
    for e in entries.iter_mut().skip(1) {
        if e.is_call {
            e.matching = ret_pos[e.op];
        }
    }

    let lift = |entries: &mut Vec<Entry>, i: usize| {
        let (p, nx) = (entries[i].prev, entries[i].next);
        entries[p].next = nx;
        if nx != NIL {
            entries[nx].prev = p;
        }
        let m = entries[i].matching;
        let (mp, mn) = (entries[m].prev, entries[m].next);
        entries[mp].next = mn;
        if mn != NIL {
            entries[mn].prev = mp;
        }
    };
    let unlift = |entries: &mut Vec<Entry>, i: usize| {
        let m = entries[i].matching;
        let (mp, mn) = (entries[m].prev, entries[m].next);
        entries[mp].next = m;
        if mn != NIL {
            entries[mn].prev = m;
        }
        let (p, nx) = (entries[i].prev, entries[i].next);
        entries[p].next = i;
        if nx != NIL {
            entries[nx].prev = i;
        }
    };

    // Candidates at a point of the search: every call before the first
    // return still in the list (a later call cannot precede that return's
    // operation). Operations with a known outcome are tried first; those
    // with an unknown outcome never block anything, so trying them only
    // when nothing else explains what follows keeps the search small.
    let candidates = |entries: &Vec<Entry>| -> Vec<usize> {
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

    let mut cache: HashSet<(Bits, M::State)> = HashSet::new();
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

/// Admin-visible state of one host as the scenarios observe it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct HostView {
    pub cordoned: bool,
    /// A drain is in progress or done (the reconciler moves Draining to
    /// Drained on its own, so the two are one observable fact here).
    pub draining: bool,
    /// Label key -> value; each client writes its own key with increasing
    /// values.
    pub labels: BTreeMap<String, u64>,
}

/// Admin operations on one host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostOp {
    Cordon,
    Uncordon,
    Drain,
    Undrain,
    SetLabel(String, u64),
    Read,
}

/// What an operation returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostResult {
    Ok,
    /// Refused by a precondition (uncordon while draining); no effect.
    Refused,
    Read(HostView),
}

/// The sequential specification of one host (see `supervisor::model`).
pub struct HostModel;

impl Model for HostModel {
    type State = HostView;
    type Input = HostOp;
    type Output = HostResult;

    fn init(&self) -> HostView {
        HostView::default()
    }

    fn step(&self, s: &HostView, input: &HostOp, out: Option<&HostResult>) -> Option<HostView> {
        let ok = matches!(out, None | Some(HostResult::Ok));
        let mut n = s.clone();
        match input {
            HostOp::Cordon if ok => n.cordoned = true,
            HostOp::Uncordon if s.draining => {
                return matches!(out, None | Some(HostResult::Refused)).then_some(n)
            }
            HostOp::Uncordon if ok => n.cordoned = false,
            HostOp::Drain if ok => {
                n.cordoned = true;
                n.draining = true;
            }
            HostOp::Undrain if ok => {
                n.cordoned = false;
                n.draining = false;
            }
            HostOp::SetLabel(k, v) if ok => {
                n.labels.insert(k.clone(), *v);
            }
            HostOp::Read => match out {
                None => {}
                Some(HostResult::Read(v)) if v == s => {}
                _ => return None,
            },
            _ => return None,
        }
        Some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(
        client: usize,
        input: HostOp,
        call: u64,
        ret: u64,
        out: HostResult,
    ) -> Operation<HostOp, HostResult> {
        Operation {
            client,
            input,
            call,
            ret: Some(ret),
            output: Some(out),
        }
    }

    fn read(cordoned: bool, draining: bool) -> HostResult {
        HostResult::Read(HostView {
            cordoned,
            draining,
            labels: BTreeMap::new(),
        })
    }

    const BUDGET: u64 = 1_000_000;

    #[test]
    fn sequential_history_is_linearizable() {
        let h = vec![
            op(0, HostOp::Cordon, 0, 1, HostResult::Ok),
            op(0, HostOp::Read, 2, 3, read(true, false)),
            op(0, HostOp::Drain, 4, 5, HostResult::Ok),
            op(0, HostOp::Uncordon, 6, 7, HostResult::Refused),
            op(0, HostOp::Undrain, 8, 9, HostResult::Ok),
            op(0, HostOp::Read, 10, 11, read(false, false)),
        ];
        assert_eq!(check(&HostModel, &h, BUDGET), Verdict::Linearizable);
    }

    #[test]
    fn stale_read_after_acknowledged_write_is_rejected() {
        // The cordon returned before the read began, yet the read missed it.
        let h = vec![
            op(0, HostOp::Cordon, 0, 10, HostResult::Ok),
            op(1, HostOp::Read, 20, 30, read(false, false)),
        ];
        assert!(matches!(
            check(&HostModel, &h, BUDGET),
            Verdict::NotLinearizable { .. }
        ));
    }

    #[test]
    fn concurrent_read_may_see_either_state() {
        for seen in [false, true] {
            let h = vec![
                op(0, HostOp::Cordon, 0, 10, HostResult::Ok),
                op(1, HostOp::Read, 5, 15, read(seen, false)),
            ];
            assert_eq!(
                check(&HostModel, &h, BUDGET),
                Verdict::Linearizable,
                "seen={seen}"
            );
        }
    }

    #[test]
    fn reads_must_not_go_back_in_time() {
        // Two sequential reads by different clients, both concurrent with the
        // write: new value then old value is not linearizable.
        let h = vec![
            op(0, HostOp::Cordon, 0, 100, HostResult::Ok),
            op(1, HostOp::Read, 10, 20, read(true, false)),
            op(2, HostOp::Read, 30, 40, read(false, false)),
        ];
        assert!(matches!(
            check(&HostModel, &h, BUDGET),
            Verdict::NotLinearizable { .. }
        ));
    }

    #[test]
    fn unknown_outcome_may_or_may_not_apply() {
        let unknown = Operation {
            client: 0,
            input: HostOp::Cordon,
            call: 0,
            ret: None,
            output: None,
        };
        for seen in [false, true] {
            let h = vec![
                unknown.clone(),
                op(1, HostOp::Read, 50, 60, read(seen, false)),
            ];
            assert_eq!(
                check(&HostModel, &h, BUDGET),
                Verdict::Linearizable,
                "seen={seen}"
            );
        }
    }

    #[test]
    fn refused_uncordon_requires_a_drain() {
        let h = vec![op(0, HostOp::Uncordon, 0, 1, HostResult::Refused)];
        assert!(matches!(
            check(&HostModel, &h, BUDGET),
            Verdict::NotLinearizable { .. }
        ));
    }

    #[test]
    fn lost_label_write_is_rejected() {
        let h = vec![
            op(0, HostOp::SetLabel("c0".into(), 1), 0, 1, HostResult::Ok),
            op(1, HostOp::Read, 2, 3, read(false, false)),
        ];
        assert!(matches!(
            check(&HostModel, &h, BUDGET),
            Verdict::NotLinearizable { .. }
        ));
    }

    #[test]
    fn budget_exhaustion_is_undecided_not_success() {
        let h = vec![
            op(0, HostOp::Cordon, 0, 10, HostResult::Ok),
            op(1, HostOp::Read, 5, 15, read(true, false)),
        ];
        assert_eq!(check(&HostModel, &h, 1), Verdict::Undecided);
    }
}
