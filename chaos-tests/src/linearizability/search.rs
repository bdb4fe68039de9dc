//! The search within one segment: Wing & Gong's backtracking with Lowe's
//! memoisation, over linearizations of the canonical form in which an
//! unknown-outcome operation takes effect only right before an operation
//! that depends on it, from every configuration of the frontier; and the
//! small data structures it runs on (operation entries in a doubly linked
//! list, bit sets, multisets of pending operations, a fast hasher).

use std::collections::HashMap;
use std::hash::Hash;

use super::entries::{build_entries, lift, unlift, Bits, Entry, Fast, NIL};
use super::model::{Model, Operation};
use super::segment::Segment;

/// What is fixed during one check.
pub(super) struct Ctx<'a, M: Model> {
    pub(super) model: &'a M,
    pub(super) ops: &'a [Operation<M::Input, M::Output>],
    /// Per operation: its class if it is an unknown-outcome one.
    pub(super) class_of: &'a [u32],
    /// Per class: an operation of that class (its input is the class's).
    pub(super) class_rep: &'a [usize],
    pub(super) max_steps: u64,
}

/// Where a linearization of a prefix of the history can end: the model
/// state, and the classes of the pending operations that have not taken
/// effect.
#[derive(Debug, Clone)]
pub(super) struct Config<S> {
    pub(super) state: S,
    pub(super) pending: Multiset,
}

pub(super) enum SegmentOutcome<S> {
    OutOfSteps,
    /// The frontier at the end of the segment (empty: no linearization),
    /// and the most completed operations of the segment any branch of the
    /// search linearized.
    Done {
        end: Vec<Config<S>>,
        best: usize,
    },
}

/// One move of the segment search.
#[derive(Clone, Copy)]
enum Move {
    /// Linearize an operation of the segment, by its call entry.
    Entry(usize),
    /// Let a pending operation of this class take effect.
    Pending(u32),
}

/// The completed operations of a segment linearized so far, by local index
/// (call order). Every index below `lo` is in and `lo` is not; none at or
/// above `hi` is. Only the window between them varies much during a
/// search, and it is as wide as the concurrency, not the segment.
struct Placed {
    bits: Bits,
    lo: usize,
    hi: usize,
}

impl Placed {
    fn new(n: usize) -> Self {
        Placed {
            bits: Bits::new(n),
            lo: 0,
            hi: 0,
        }
    }
    /// Adds `i`; returns what [`Placed::remove`] needs to undo it.
    fn add(&mut self, i: usize) -> (usize, usize) {
        let prev = (self.lo, self.hi);
        self.bits.set(i);
        self.hi = self.hi.max(i + 1);
        while self.lo < self.hi && self.bits.get(self.lo) {
            self.lo += 1;
        }
        prev
    }
    /// Undoes the [`Placed::add`] of `i` that returned `prev`.
    fn remove(&mut self, i: usize, prev: (usize, usize)) {
        self.bits.clear(i);
        (self.lo, self.hi) = prev;
    }
    /// A key naming the set: `lo`, then the words from `lo`'s to `hi`'s.
    fn key(&self) -> Vec<u64> {
        let words = &self.bits.0[self.lo / 64..self.hi.div_ceil(64).max(self.lo / 64)];
        let mut k = Vec::with_capacity(words.len() + 1);
        k.push(self.lo as u64);
        k.extend_from_slice(words);
        k
    }
}

/// After an unknown-outcome operation took effect: its class and the state
/// before it (the next move must not commute with it; see
/// [`search_segment`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Guard {
    class: u32,
    before: u32,
}

/// A search node: the completed operations of the segment linearized so
/// far (`done`, as a [`Placed::key`]), the state, the guard, the segment's
/// unknown-outcome operations that took effect (`fresh`) and the classes
/// still pending from earlier segments (`carried`). Node A covers node B
/// when they agree on `done` and the state, A has no guard or B's, and A
/// has everything B still has (A's `fresh` is a subset of B's, A's
/// `carried` a super-multiset of B's): every continuation of B is one of A
/// (a guard only rules moves out).
type Memo = HashMap<(Vec<u64>, u32), Vec<(Option<Guard>, Bits, Multiset)>, Fast>;

/// Records node (`done`, `state`, `guard`, `fresh`, `carried`) as explored;
/// `false` if an explored node covers it (nothing new to find from it).
fn memo_insert(
    memo: &mut Memo,
    (done, state, guard): (Vec<u64>, u32, Option<Guard>),
    fresh: &Bits,
    carried: &Multiset,
) -> bool {
    let seen = memo.entry((done, state)).or_default();
    let covers = |g: &Option<Guard>,
                  f: &Bits,
                  c: &Multiset,
                  by_g: &Option<Guard>,
                  by_f: &Bits,
                  by_c: &Multiset| {
        (by_g.is_none() || by_g == g) && by_f.is_subset(f) && c.is_subset(by_c)
    };
    if seen
        .iter()
        .any(|(g, f, c)| covers(&guard, fresh, carried, g, f, c))
    {
        return false;
    }
    seen.retain(|(g, f, c)| !covers(g, f, c, &guard, fresh, carried));
    seen.push((guard, fresh.clone(), carried.clone()));
    true
}

/// A multiset of classes of unknown-outcome operations: (class, count)
/// pairs sorted by class, counts positive.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Multiset(Vec<(u32, u32)>);

impl Multiset {
    fn contains(&self, c: u32) -> bool {
        self.0.binary_search_by_key(&c, |e| e.0).is_ok()
    }
    fn classes(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().map(|e| e.0)
    }
    fn add(&mut self, c: u32) {
        match self.0.binary_search_by_key(&c, |e| e.0) {
            Ok(i) => self.0[i].1 += 1,
            Err(i) => self.0.insert(i, (c, 1)),
        }
    }
    /// Takes one `c` out (it must be in); returns what
    /// [`Multiset::put_back`] needs.
    fn take(&mut self, c: u32) -> usize {
        let i = self
            .0
            .binary_search_by_key(&c, |e| e.0)
            .expect("a class in the multiset");
        if self.0[i].1 == 1 {
            self.0.remove(i);
            i
        } else {
            self.0[i].1 -= 1;
            usize::MAX
        }
    }
    /// Undoes the [`Multiset::take`] of `c` that returned `removed_at`.
    fn put_back(&mut self, c: u32, removed_at: usize) {
        if removed_at == usize::MAX {
            self.add(c);
        } else {
            self.0.insert(removed_at, (c, 1));
        }
    }
    /// Whether every class of `self` is in `other` at least as many times.
    fn is_subset(&self, other: &Multiset) -> bool {
        let mut j = 0;
        for &(c, n) in &self.0 {
            while j < other.0.len() && other.0[j].0 < c {
                j += 1;
            }
            if j == other.0.len() || other.0[j].0 != c || other.0[j].1 < n {
                return false;
            }
            j += 1;
        }
        true
    }
}

/// The model as one segment search uses it: states are stored once and
/// named by index (so memo keys and frames hold a number, not a state),
/// and transitions are cached, since the same operation is tried from the
/// same state at many points of the search.
///
/// A move is named by a key: local operation `l < nd` for a completed one,
/// `nd + class` for an unknown-outcome one (applied with no output).
struct Stepper<'a, M: Model> {
    ctx: &'a Ctx<'a, M>,
    local: &'a [usize],
    nd: usize,
    ids: HashMap<M::State, u32, Fast>,
    all: Vec<M::State>,
    /// (state, move key) -> resulting state, or `u32::MAX`: impossible.
    next: HashMap<(u32, u32), u32, Fast>,
}

impl<'a, M: Model> Stepper<'a, M> {
    fn new(ctx: &'a Ctx<'a, M>, local: &'a [usize], nd: usize) -> Self {
        Stepper {
            ctx,
            local,
            nd,
            ids: HashMap::default(),
            all: Vec::new(),
            next: HashMap::default(),
        }
    }
    fn intern(&mut self, s: M::State) -> u32 {
        if let Some(&id) = self.ids.get(&s) {
            return id;
        }
        let id = self.all.len() as u32;
        self.all.push(s.clone());
        self.ids.insert(s, id);
        id
    }
    /// The state after move `key` from `state`, if possible.
    fn step(&mut self, state: u32, key: u32) -> Option<u32> {
        if let Some(&to) = self.next.get(&(state, key)) {
            return (to != u32::MAX).then_some(to);
        }
        let k = key as usize;
        let (input, output) = if k < self.nd {
            let op = &self.ctx.ops[self.local[k]];
            (&op.input, op.output.as_ref())
        } else {
            let rep = self.ctx.class_rep[k - self.nd];
            (&self.ctx.ops[rep].input, None)
        };
        let to = match self
            .ctx
            .model
            .step(&self.all[state as usize], input, output)
        {
            Some(s) => self.intern(s),
            None => u32::MAX,
        };
        self.next.insert((state, key), to);
        (to != u32::MAX).then_some(to)
    }
}

/// The configurations at the end of a segment, keeping only maximal
/// pending multisets per state.
struct EndFrontier {
    by_state: HashMap<u32, Vec<Multiset>, Fast>,
}

impl EndFrontier {
    fn insert(&mut self, state: u32, pending: Multiset) {
        let list = self.by_state.entry(state).or_default();
        if list.iter().any(|p| pending.is_subset(p)) {
            return;
        }
        list.retain(|p| !p.is_subset(&pending));
        list.push(pending);
    }
}

/// Searches one segment from every configuration of `start`; see
/// [`SegmentOutcome`]. Exhaustive up to covering: every configuration a
/// linearization of the segment can end in is in the result or covered by
/// one there (same state, more pending).
///
/// The search only builds linearizations of a canonical form, in which
/// every unknown-outcome operation `u` that takes effect changes the state
/// and is immediately followed by an operation `y` that depends on it:
/// without `u`, `y`'s output is impossible or `y` ends in another state;
/// and `y` cannot go first (its output is impossible before `u`, or `u`
/// after it, or the two orders end in different states) unless `y` is an
/// unknown-outcome operation of a class not below `u`'s.
///
/// Every linearization can be rearranged into that form. Among the
/// linearizations of a history take one with the fewest unknown operations
/// taking effect, then the most completed operations before them, then the
/// fewest pairs of unknown operations out of class order. Dropping an
/// unknown operation that changes nothing, comes last, or is not needed by
/// the next operation would leave a linearization with fewer; swapping `u`
/// with a `y` that can go first would add a completed operation before `u`
/// or remove an out-of-order pair, and is allowed: `u` has no return, so no
/// real-time constraint keeps `y` after it, and `y` could already be called
/// before `u`. So a segment's linearizations end in no configuration the
/// canonical ones miss (an unknown operation right before the cut is
/// pending at the cut and takes effect first thing in the next segment).
/// This is what stops pending operations from being tried, and kept
/// taking effect, at every point of every segment.
pub(super) fn search_segment<M: Model>(
    ctx: &Ctx<'_, M>,
    seg: &Segment,
    start: &[Config<M::State>],
    steps: &mut u64,
) -> SegmentOutcome<M::State> {
    let ops = ctx.ops;
    let nd = seg.done.len();
    // Local operation l: seg.done[l] if l < nd, else seg.fresh[l - nd].
    let local: Vec<usize> = seg.done.iter().chain(&seg.fresh).copied().collect();
    let class = |l: usize| ctx.class_of[local[l]];
    let mut entries = build_entries(ops, &local);
    let mut stepper = Stepper::new(ctx, &local, nd);
    let mut memo: Memo = HashMap::default();
    let mut end = EndFrontier {
        by_state: HashMap::default(),
    };
    let mut best = 0usize;

    // The moves from a node: the calls before the first remaining return,
    // completed operations first; then one move per class of unknown-outcome
    // operations that may take effect now. Such operations with equal inputs
    // are interchangeable (each may take effect at any later point), so
    // trying one of them is enough: a pending one if any, else the first
    // called one of the segment.
    let candidates = |entries: &[Entry], carried: &Multiset| -> Vec<Move> {
        let mut moves = Vec::new();
        let mut fresh = Vec::new();
        let mut i = entries[0].next;
        while i != NIL && entries[i].is_call {
            if entries[i].op < nd {
                moves.push(Move::Entry(i));
            } else {
                fresh.push(i);
            }
            i = entries[i].next;
        }
        moves.extend(carried.classes().map(Move::Pending));
        let mut seen: Vec<u32> = Vec::new();
        for e in fresh {
            let c = class(entries[e].op);
            if !carried.contains(c) && !seen.contains(&c) {
                seen.push(c);
                moves.push(Move::Entry(e));
            }
        }
        moves
    };

    struct Frame {
        mv: Move,
        /// What undoing the move needs: the previous bounds of `done`, or
        /// where a pending class was removed from `carried`.
        undo: (usize, usize),
        prev_state: u32,
        prev_guard: Option<Guard>,
        cands: Vec<Move>,
        next: usize,
    }

    for cfg in start {
        let mut state = stepper.intern(cfg.state.clone());
        let mut carried = cfg.pending.clone();
        let mut done = Placed::new(nd);
        let mut fresh = Bits::new(seg.fresh.len());
        let mut guard: Option<Guard> = None;
        if !memo_insert(&mut memo, (done.key(), state, None), &fresh, &carried) {
            continue;
        }
        let mut left = nd;
        let mut stack: Vec<Frame> = Vec::new();
        let mut cands = candidates(&entries, &carried);
        let mut next = 0usize;
        loop {
            if next < cands.len() {
                *steps += 1;
                if *steps > ctx.max_steps {
                    return SegmentOutcome::OutOfSteps;
                }
                let mv = cands[next];
                next += 1;
                // The move's key, and its class if it is unknown-outcome.
                let (key, unknown) = match mv {
                    Move::Entry(e) if entries[e].op < nd => (entries[e].op as u32, None),
                    Move::Entry(e) => {
                        let c = class(entries[e].op);
                        ((nd as u32) + c, Some(c))
                    }
                    Move::Pending(c) => ((nd as u32) + c, Some(c)),
                };
                let Some(new_state) = stepper.step(state, key) else {
                    continue;
                };
                if unknown.is_some() && new_state == state {
                    // Canonical linearizations have no unknown operation
                    // that changes nothing.
                    continue;
                }
                if let Some(g) = guard {
                    // Keep the canonical form: skip this move if, from the
                    // state before the unknown operation just applied, it
                    // is possible and ends in the same state without it,
                    // or could go first.
                    if let Some(a) = stepper.step(g.before, key) {
                        if a == new_state {
                            continue;
                        }
                        let swaps = stepper.step(a, (nd as u32) + g.class) == Some(new_state);
                        if swaps && unknown.is_none_or(|c| c < g.class) {
                            continue;
                        }
                    }
                }
                let new_guard = unknown.map(|class| Guard {
                    class,
                    before: state,
                });
                // Take the move on the node's sets, then look the node up.
                let undo = match mv {
                    Move::Entry(e) if entries[e].op < nd => {
                        left -= 1;
                        done.add(entries[e].op)
                    }
                    Move::Entry(e) => {
                        fresh.set(entries[e].op - nd);
                        (0, 0)
                    }
                    Move::Pending(c) => (carried.take(c), 0),
                };
                let key = (done.key(), new_state, new_guard);
                let new = memo_insert(&mut memo, key, &fresh, &carried);
                if new && left == 0 {
                    // Every completed operation of the segment is placed:
                    // a configuration of the next frontier. Pending
                    // operations that take effect later belong to later
                    // segments.
                    best = nd;
                    let mut pending = carried.clone();
                    for f in 0..seg.fresh.len() {
                        if !fresh.get(f) {
                            pending.add(class(nd + f));
                        }
                    }
                    end.insert(new_state, pending);
                }
                if !new || left == 0 {
                    let sets = (&mut done, &mut left, &mut fresh, &mut carried);
                    undo_move(mv, undo, &entries, nd, sets);
                    continue;
                }
                if let Move::Entry(e) = mv {
                    lift(&mut entries, e);
                }
                stack.push(Frame {
                    mv,
                    undo,
                    prev_state: std::mem::replace(&mut state, new_state),
                    prev_guard: std::mem::replace(&mut guard, new_guard),
                    cands: std::mem::take(&mut cands),
                    next,
                });
                best = best.max(nd - left);
                cands = candidates(&entries, &carried);
                next = 0;
            } else {
                // Every move from here was tried: undo the last one.
                let Some(f) = stack.pop() else {
                    break;
                };
                if let Move::Entry(e) = f.mv {
                    unlift(&mut entries, e);
                }
                let sets = (&mut done, &mut left, &mut fresh, &mut carried);
                undo_move(f.mv, f.undo, &entries, nd, sets);
                state = f.prev_state;
                guard = f.prev_guard;
                cands = f.cands;
                next = f.next;
            }
        }
    }

    let mut configs = Vec::new();
    for (s, list) in end.by_state {
        for pending in list {
            configs.push(Config {
                state: stepper.all[s as usize].clone(),
                pending,
            });
        }
    }
    SegmentOutcome::Done { end: configs, best }
}

/// Reverts the effect of `mv` on a node's sets (see [`search_segment`]).
fn undo_move(
    mv: Move,
    undo: (usize, usize),
    entries: &[Entry],
    nd: usize,
    (done, left, fresh, carried): (&mut Placed, &mut usize, &mut Bits, &mut Multiset),
) {
    match mv {
        Move::Entry(e) if entries[e].op < nd => {
            done.remove(entries[e].op, undo);
            *left += 1;
        }
        Move::Entry(e) => fresh.clear(entries[e].op - nd),
        Move::Pending(c) => carried.put_back(c, undo.0),
    }
}
