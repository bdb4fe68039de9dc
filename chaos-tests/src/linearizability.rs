//! A porcupine-style linearizability checker (Wing & Gong's search with
//! Lowe's memoisation), and the model of one host's admin-visible state that
//! the supervisor scenarios check against.
//!
//! An operation whose outcome the client could not learn (timeout, lost
//! connection) has no return time and no output: it may take effect at any
//! point after its call, or never (linearising it after every other
//! operation is the same as never, since nothing later observes it).
//!
//! # Segmentation
//!
//! A long history is not searched as a whole. [`check`] cuts it at
//! quiescent points: instants that no *completed* operation's
//! `[call, ret]` interval spans. Every completed operation before a cut
//! returned before every completed operation after it was called, so any
//! linearization orders them the same way, and the segments between cuts
//! can be searched one after the other.
//!
//! Unknown-outcome operations never return, so they do not block cuts.
//! Such an operation belongs to the first segment that is still running
//! when it is called; from the next segment on it is *pending*: it may be
//! linearized at any point of any later segment, or never. What crosses a
//! cut is therefore the *frontier*: every configuration (model state, and
//! the multiset of pending operations that have not taken effect) in which
//! a linearization of everything before the cut can end. Pending operations
//! are kept by input, not by identity: two pending operations with equal
//! inputs are interchangeable. Each segment is searched exhaustively from
//! every configuration of the frontier (with one memo shared by all of
//! them), producing the frontier at its end; the history is linearizable
//! iff the frontier after the last segment is non-empty.
//!
//! Two configurations with the same state where one has a superset of the
//! other's pending operations: everything the smaller one can do, the
//! larger one can do too (it may leave the extra operations pending
//! forever). Only the larger is kept, in the frontier and in the search's
//! memo, which is what keeps both small.
//!
//! Within a segment, the search only builds linearizations of a canonical
//! form (see `search_segment`) in which an unknown-outcome operation takes
//! effect only right before an operation that depends on it; every
//! linearizable history has one. The segment's own completed operations are
//! searched as in the plain algorithm, with the memo keyed by the set of
//! linearized operations as a low-water mark and the window above it.
//!
//! A model may also name unknown-outcome operations that cannot matter
//! ([`Model::unobservable`], e.g. a label write whose value no read ever
//! returned); they are left out before the search.
//!
//! Both the search steps (`max_steps`, over all segments) and the frontier
//! size ([`Limits::max_frontier`]) are bounded; exceeding either is
//! reported as [`Verdict::Undecided`], never as success, and the frontier is
//! never truncated.
//!
//! [`check_unsegmented`] is the plain search over the whole history, kept
//! as the reference the segmented checker is tested against.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hash, Hasher};

/// A sequential specification.
pub trait Model {
    type State: Clone + Eq + Hash + std::fmt::Debug;
    /// Equal inputs are interchangeable: two pending unknown-outcome
    /// operations with equal inputs are tracked as two copies of one.
    type Input: Eq + Hash + std::fmt::Debug;
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
    /// Unknown-outcome operations of `history` the checker may leave out
    /// (one flag per operation; flags on completed operations are ignored).
    ///
    /// The model guarantees that `history` is linearizable iff it is with
    /// all the flagged operations removed, i.e. that none of them can be
    /// needed to explain what the other operations observed. The default
    /// flags nothing.
    fn unobservable(&self, history: &[Operation<Self::Input, Self::Output>]) -> Vec<bool> {
        vec![false; history.len()]
    }
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
    /// No linearization exists. Holds how far the search got, to help
    /// debugging: for [`check`], the number of completed operations in the
    /// segments before the one that cannot be linearized plus the most of
    /// that segment's completed operations any branch of its search
    /// linearized (so the violation is among the operations right after
    /// that many, in call order); for [`check_unsegmented`], the longest
    /// prefix (by number of operations) the search linearized.
    NotLinearizable {
        best_prefix: usize,
    },
    /// The step budget ran out, or the frontier outgrew its bound, before a
    /// decision.
    Undecided,
}

/// Bounds of one [`check_with`] run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Search steps (one per attempt to linearize an operation), over all
    /// segments.
    pub max_steps: u64,
    /// Configurations the frontier may hold at a cut.
    pub max_frontier: usize,
}

/// Default [`Limits::max_frontier`].
pub const MAX_FRONTIER: usize = 4096;

/// A verdict with figures about the search that reached it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub verdict: Verdict,
    /// Segments the history was cut into (searched: up to the decision).
    pub segments: usize,
    /// Completed operations in the largest segment.
    pub largest_segment: usize,
    /// Search steps taken.
    pub steps: u64,
    /// Largest frontier at a cut.
    pub max_frontier: usize,
    /// Unknown-outcome operations left out: flagged by
    /// [`Model::unobservable`], or called after every completed operation
    /// returned (nothing can observe them).
    pub dropped: usize,
}

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

/// A stretch of the history between two cuts.
struct Segment {
    /// Completed operations (indices into the history), in call order.
    done: Vec<usize>,
    /// Unknown-outcome operations called while this segment runs (after
    /// the previous cut, at or before its last return).
    fresh: Vec<usize>,
}

/// Cuts the kept operations of `ops` into segments. Also returns how many
/// kept unknown-outcome operations were called after the last return
/// (these can only take effect after everything: never).
fn segment<I, O>(ops: &[Operation<I, O>], keep: &[bool]) -> (Vec<Segment>, usize) {
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

/// What is fixed during one check.
struct Ctx<'a, M: Model> {
    model: &'a M,
    ops: &'a [Operation<M::Input, M::Output>],
    /// Per operation: its class if it is an unknown-outcome one.
    class_of: &'a [u32],
    /// Per class: an operation of that class (its input is the class's).
    class_rep: &'a [usize],
    max_steps: u64,
}

/// Where a linearization of a prefix of the history can end: the model
/// state, and the classes of the pending operations that have not taken
/// effect.
#[derive(Debug, Clone)]
struct Config<S> {
    state: S,
    pending: Multiset,
}

enum SegmentOutcome<S> {
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
struct Multiset(Vec<(u32, u32)>);

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
fn search_segment<M: Model>(
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

#[derive(Clone, Copy)]
struct Entry {
    is_call: bool,
    /// The operation, as an index into the list the entries were built from.
    op: usize,
    /// For a call: index of its return entry.
    matching: usize,
    prev: usize,
    next: usize,
}

const NIL: usize = usize::MAX;

/// The call and return entries of operations `which` (indices into `ops`),
/// as a doubly linked list in time order behind a sentinel head (entry 0).
/// At equal times calls come first (an operation that starts when another
/// ends may be ordered either way); unknown-outcome operations return at
/// the end of time.
fn build_entries<I, O>(ops: &[Operation<I, O>], which: &[usize]) -> Vec<Entry> {
    let n = which.len();
    let mut ev: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * n);
    for (l, &i) in which.iter().enumerate() {
        let op = &ops[i];
        ev.push((op.call, true, l));
        ev.push((op.ret.map_or(u64::MAX, |r| r.max(op.call)), false, l));
    }
    ev.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
    let mut entries: Vec<Entry> = Vec::with_capacity(2 * n + 1);
    entries.push(Entry {
        is_call: false,
        op: NIL,
        matching: NIL,
        prev: NIL,
        next: if ev.is_empty() { NIL } else { 1 },
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
    entries
}

/// Takes call entry `i` and its return out of the list.
fn lift(entries: &mut [Entry], i: usize) {
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
}

/// Puts back what the matching [`lift`] took out (in reverse order).
fn unlift(entries: &mut [Entry], i: usize) {
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
}

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
    fn get(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
    fn count(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }
    fn is_subset(&self, other: &Bits) -> bool {
        self.0.iter().zip(&other.0).all(|(a, b)| a & !b == 0)
    }
}

/// A multiply-rotate hasher for the search's maps: their keys are states,
/// bit sets and small numbers made by the checker itself, so speed matters
/// and resistance to crafted collisions does not.
#[derive(Default, Clone, Copy)]
struct FastHasher(u64);

impl FastHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.add(i as u64);
    }
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    fn finish(&self) -> u64 {
        // Spread the last word's bits into the low bits the table uses.
        self.0 ^ (self.0 >> 32)
    }
}

type Fast = BuildHasherDefault<FastHasher>;

/// Checks one history against `model` with the plain search over the whole
/// history at once (no segmentation, no pruning of unknown-outcome
/// operations), with at most `max_steps` search steps.
///
/// Sound and complete like [`check_with`], but its cost grows quickly with
/// the length of the history and the number of unknown-outcome operations;
/// it is the reference [`check`] is tested against.
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
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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
        if *input == HostOp::Read {
            // The common case: no clone unless the read matches.
            return match out {
                None => Some(s.clone()),
                Some(HostResult::Read(v)) if v == s => Some(s.clone()),
                _ => None,
            };
        }
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
            _ => return None,
        }
        Some(n)
    }

    /// Unknown-outcome label writes whose value no read returned. If such a
    /// write took effect, then before any read of the host another write of
    /// the same key replaced its value, or nothing read the host again; and
    /// no other operation's outcome depends on labels. So a linearization
    /// that applies it stays one without it (states differ only on that
    /// label, only until it is overwritten, and nothing reads them).
    fn unobservable(&self, history: &[Operation<HostOp, HostResult>]) -> Vec<bool> {
        let seen: HashSet<(&str, u64)> = history
            .iter()
            .filter_map(|o| match &o.output {
                Some(HostResult::Read(v)) => Some(v),
                _ => None,
            })
            .flat_map(|v| v.labels.iter().map(|(k, x)| (k.as_str(), *x)))
            .collect();
        history
            .iter()
            .map(|o| {
                o.ret.is_none()
                    && matches!(&o.input, HostOp::SetLabel(k, v) if !seen.contains(&(k.as_str(), *v)))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};

    type Op = Operation<HostOp, HostResult>;

    fn op(client: usize, input: HostOp, call: u64, ret: u64, out: HostResult) -> Op {
        Operation {
            client,
            input,
            call,
            ret: Some(ret),
            output: Some(out),
        }
    }

    fn unknown(client: usize, input: HostOp, call: u64) -> Op {
        Operation {
            client,
            input,
            call,
            ret: None,
            output: None,
        }
    }

    fn read(cordoned: bool, draining: bool) -> HostResult {
        HostResult::Read(HostView {
            cordoned,
            draining,
            labels: BTreeMap::new(),
        })
    }

    fn read_labels(cordoned: bool, labels: &[(&str, u64)]) -> HostResult {
        HostResult::Read(HostView {
            cordoned,
            draining: false,
            labels: labels.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        })
    }

    const BUDGET: u64 = 1_000_000;

    fn limits(max_steps: u64) -> Limits {
        Limits {
            max_steps,
            max_frontier: MAX_FRONTIER,
        }
    }

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
        for seen in [false, true] {
            let h = vec![
                unknown(0, HostOp::Cordon, 0),
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

    #[test]
    fn empty_and_unknown_only_histories_are_linearizable() {
        assert_eq!(check(&HostModel, &[], BUDGET), Verdict::Linearizable);
        let h = vec![unknown(0, HostOp::Drain, 0), unknown(1, HostOp::Undrain, 3)];
        let r = check_with(&HostModel, &h, limits(BUDGET));
        assert_eq!(r.verdict, Verdict::Linearizable);
        assert_eq!(r.dropped, 2, "nothing completed can observe them");
    }

    #[test]
    fn quiescent_points_cut_the_history() {
        // [0,10] and [5,15] overlap; [20,30] starts after both returned; a
        // call at the instant of the latest return does not start a segment.
        let h = vec![
            op(0, HostOp::Cordon, 0, 10, HostResult::Ok),
            op(1, HostOp::Read, 5, 15, read(true, false)),
            op(0, HostOp::Uncordon, 15, 18, HostResult::Ok),
            op(1, HostOp::Read, 20, 30, read(false, false)),
            op(0, HostOp::Read, 40, 41, read(false, false)),
        ];
        let r = check_with(&HostModel, &h, limits(BUDGET));
        assert_eq!(r.verdict, Verdict::Linearizable);
        assert_eq!(r.segments, 3);
    }

    #[test]
    fn unknown_op_taking_effect_many_segments_later_is_accepted() {
        // The unknown label write is invisible to 100 sequential operations
        // (each its own segment), then a read sees it.
        let mut h = vec![unknown(0, HostOp::SetLabel("c0".into(), 1), 0)];
        let mut cordoned = false;
        for i in 0..50u64 {
            let t = 10 + 10 * i;
            cordoned = !cordoned;
            let w = if cordoned {
                HostOp::Cordon
            } else {
                HostOp::Uncordon
            };
            h.push(op(1, w, t, t + 2, HostResult::Ok));
            h.push(op(2, HostOp::Read, t + 4, t + 6, read(cordoned, false)));
        }
        h.push(op(
            2,
            HostOp::Read,
            1000,
            1001,
            read_labels(cordoned, &[("c0", 1)]),
        ));
        h.push(op(
            1,
            HostOp::Read,
            1002,
            1003,
            read_labels(cordoned, &[("c0", 1)]),
        ));
        let r = check_with(&HostModel, &h, limits(BUDGET));
        assert_eq!(r.verdict, Verdict::Linearizable);
        assert!(r.segments >= 100, "{r:?}");
        assert_eq!(r.dropped, 0, "the write is observed, so it is kept");

        // Once seen, the value cannot disappear again: nothing else writes
        // that key.
        h.push(op(1, HostOp::Read, 1004, 1005, read(cordoned, false)));
        assert!(matches!(
            check(&HostModel, &h, BUDGET),
            Verdict::NotLinearizable { best_prefix } if best_prefix == 102
        ));
    }

    #[test]
    fn unknown_op_observed_before_its_call_is_rejected() {
        for (call, linearizable) in [(20, false), (5, true)] {
            // A read sees the cordon; the only cordon is called at `call`.
            let h = vec![
                op(1, HostOp::Read, 0, 10, read(true, false)),
                unknown(0, HostOp::Cordon, call),
                op(1, HostOp::Read, 30, 40, read(true, false)),
            ];
            let v = check(&HostModel, &h, BUDGET);
            assert_eq!(
                v == Verdict::Linearizable,
                linearizable,
                "call={call}: {v:?}"
            );
            let plain = check_unsegmented(&HostModel, &h, BUDGET);
            assert_eq!(plain == Verdict::Linearizable, linearizable, "call={call}");
        }
    }

    #[test]
    fn pending_ops_with_equal_inputs_are_one_class() {
        // Ten lost cordons and ten lost uncordons, then reads that flip:
        // each flip needs one more of them.
        let mut h = Vec::new();
        for i in 0..10 {
            h.push(unknown(i, HostOp::Cordon, 0));
            h.push(unknown(10 + i, HostOp::Uncordon, 0));
        }
        h.push(op(20, HostOp::Read, 1, 2, read(false, false)));
        for i in 0..20u64 {
            h.push(op(
                20,
                HostOp::Read,
                10 + 10 * i,
                12 + 10 * i,
                read(i % 2 == 0, false),
            ));
        }
        let r = check_with(&HostModel, &h, limits(BUDGET));
        assert_eq!(r.verdict, Verdict::Linearizable, "{r:?}");
        assert!(r.max_frontier <= 2, "{r:?}");
        // One flip too many.
        h.push(op(20, HostOp::Read, 500, 501, read(false, false)));
        h.push(op(20, HostOp::Read, 510, 511, read(true, false)));
        assert!(matches!(
            check(&HostModel, &h, BUDGET),
            Verdict::NotLinearizable { .. }
        ));
    }

    #[test]
    fn unobserved_unknown_label_writes_are_left_out() {
        let h = vec![
            unknown(0, HostOp::SetLabel("c0".into(), 1), 0),
            unknown(1, HostOp::SetLabel("c1".into(), 1), 0),
            op(0, HostOp::SetLabel("c0".into(), 2), 5, 6, HostResult::Ok),
            op(
                2,
                HostOp::Read,
                10,
                11,
                read_labels(false, &[("c0", 2), ("c1", 1)]),
            ),
        ];
        assert_eq!(HostModel.unobservable(&h), vec![true, false, false, false]);
        let r = check_with(&HostModel, &h, limits(BUDGET));
        assert_eq!(r.verdict, Verdict::Linearizable);
        assert_eq!(r.dropped, 1);
    }

    #[test]
    fn frontier_overflow_is_undecided() {
        // Two clients write different values to each of four keys, all at
        // once: at the cut after them, any of the 16 combinations may be the
        // state, until a later read tells.
        let keys = ["c0", "c1", "c2", "c3"];
        let mut h = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            for v in [1, 2] {
                let w = HostOp::SetLabel(k.to_string(), v);
                h.push(op(2 * i + v as usize, w, 0, 10, HostResult::Ok));
            }
        }
        h.push(op(9, HostOp::Cordon, 20, 21, HostResult::Ok));
        let all: Vec<(&str, u64)> = keys.iter().map(|k| (*k, 2)).collect();
        h.push(op(9, HostOp::Read, 30, 31, read_labels(true, &all)));

        let r = check_with(&HostModel, &h, limits(BUDGET));
        assert_eq!(r.verdict, Verdict::Linearizable);
        assert_eq!(r.max_frontier, 16);
        let small = Limits {
            max_steps: BUDGET,
            max_frontier: 8,
        };
        let r = check_with(&HostModel, &h, small);
        assert_eq!(r.verdict, Verdict::Undecided, "{r:?}");
        assert_eq!(r.segments, 1, "stops at the first cut that overflows");
    }

    /// One operation of a simulated run (see [`simulate`]).
    #[derive(Debug, Clone)]
    struct Spec {
        client: usize,
        /// 0..=5: cordon, uncordon, drain, undrain, label write, read.
        kind: u8,
        /// Idle time of the client before the call.
        gap: u64,
        /// Length of the call's interval.
        dur: u64,
        /// When it takes effect, from the call (clamped to `dur` for
        /// completed operations).
        at: u64,
        /// Outcome lost: `Some(applied)`, with `applied` saying whether it
        /// took effect (at `at`, which may be after `dur`).
        lost: Option<bool>,
    }

    /// Runs `specs` against one atomic host: every client issues its
    /// operations one after the other, each takes effect at one instant
    /// (inside its interval unless its outcome is lost) and outputs are
    /// computed in that order, so the history is linearizable by
    /// construction. Client `c` writes label `c{c}` with increasing values.
    fn simulate(specs: &[Spec]) -> Vec<Op> {
        let clients = specs.iter().map(|s| s.client + 1).max().unwrap_or(0);
        let mut free = vec![0u64; clients];
        let mut values = vec![0u64; clients];
        let mut ops = Vec::new();
        // (instant of effect, operation index)
        let mut effects = Vec::new();
        for s in specs {
            let call = free[s.client] + s.gap;
            free[s.client] = call + s.dur + 1;
            let input = match s.kind {
                0 => HostOp::Cordon,
                1 => HostOp::Uncordon,
                2 => HostOp::Drain,
                3 => HostOp::Undrain,
                4 => {
                    values[s.client] += 1;
                    HostOp::SetLabel(format!("c{}", s.client), values[s.client])
                }
                _ => HostOp::Read,
            };
            let lost = s.lost.filter(|_| input != HostOp::Read);
            let ret = lost.is_none().then_some(call + s.dur);
            match lost {
                None => effects.push((call + s.at.min(s.dur), ops.len())),
                Some(true) => effects.push((call + s.at, ops.len())),
                Some(false) => {}
            }
            ops.push(Operation {
                client: s.client,
                input,
                call,
                ret,
                output: None,
            });
        }
        effects.sort_unstable();
        let mut state = HostView::default();
        for (_, i) in effects {
            let out = match ops[i].input {
                HostOp::Read => HostResult::Read(state.clone()),
                HostOp::Uncordon if state.draining => HostResult::Refused,
                _ => HostResult::Ok,
            };
            state = HostModel
                .step(&state, &ops[i].input, Some(&out))
                .expect("the simulated output is valid");
            if ops[i].ret.is_some() {
                ops[i].output = Some(out);
            }
        }
        ops
    }

    /// `n` operations of `clients` clients with the admin scenarios' mix,
    /// mostly short, some long, 1 in 200 with its outcome lost (half of
    /// those never take effect, some take effect late). Before each call a
    /// client idles for up to `idle` (in the scenarios, clients spread over
    /// several hosts, so one host is often idle: the history has cuts).
    fn generated(n: usize, clients: usize, idle: u64, seed: u64) -> Vec<Op> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut specs = Vec::with_capacity(n);
        for k in 0..n {
            let roll = rng.gen_range(0..100);
            let kind = match roll {
                0..=14 => 0,
                15..=29 => 1,
                30..=37 => 2,
                38..=45 => 3,
                46..=70 => 4,
                _ => 5,
            };
            let dur = if rng.gen_range(0..100) == 0 {
                rng.gen_range(50..300)
            } else {
                rng.gen_range(1..20)
            };
            let lost = (rng.gen_range(0..200) == 0).then(|| rng.gen_bool(0.5));
            let at = if lost == Some(true) && rng.gen_bool(0.3) {
                dur + rng.gen_range(0..500)
            } else {
                rng.gen_range(0..=dur)
            };
            specs.push(Spec {
                client: k % clients,
                kind,
                gap: rng.gen_range(0..idle),
                dur,
                at,
                lost,
            });
        }
        simulate(&specs)
    }

    /// Steps for the 50,000-operation histories: they take about 7.2 M
    /// (0.7 s in release); the scenarios allow 50 M per host.
    const LONG_BUDGET: u64 = 20_000_000;

    #[test]
    fn long_generated_history_is_decided() {
        let h = generated(50_000, 6, 60, 42);
        let lost = h.iter().filter(|o| o.ret.is_none()).count();
        assert!(lost > 100, "{lost} unknown-outcome operations");
        let r = check_with(&HostModel, &h, limits(LONG_BUDGET));
        assert_eq!(r.verdict, Verdict::Linearizable, "{r:?}");
        assert!(r.segments > 5_000, "{r:?}");
    }

    #[test]
    fn busy_history_with_few_cuts_is_decided() {
        // Six clients that never idle: few quiescent points, segments of
        // hundreds of operations with unknown-outcome ones inside.
        let h = generated(2_000, 6, 2, 7);
        let r = check_with(&HostModel, &h, limits(10_000_000));
        assert_eq!(r.verdict, Verdict::Linearizable, "{r:?}");
        assert!(r.largest_segment > 200, "{r:?}");
    }

    #[test]
    fn long_generated_history_with_one_stale_read_is_rejected() {
        let mut h = generated(50_000, 6, 60, 42);
        // The first read from op 40,000 on that sees a label value `v > 1`
        // written by an acknowledged write that returned before the read
        // began, the value `v - 1` having been acknowledged too (so it was
        // written before `v`, by the same client): make it return `v - 1`.
        let acked: HashMap<(String, u64), usize> = h
            .iter()
            .enumerate()
            .filter_map(|(i, o)| match (&o.input, &o.output) {
                (HostOp::SetLabel(k, v), Some(_)) => Some(((k.clone(), *v), i)),
                _ => None,
            })
            .collect();
        let (r, key, v) = (40_000..h.len())
            .find_map(|r| {
                let Some(HostResult::Read(view)) = &h[r].output else {
                    return None;
                };
                view.labels.iter().find_map(|(k, &v)| {
                    let w = *acked.get(&(k.clone(), v))?;
                    acked.get(&(k.clone(), v - 1))?;
                    (h[w].ret? < h[r].call).then(|| (r, k.clone(), v))
                })
            })
            .expect("such a read");
        let Some(HostResult::Read(view)) = &mut h[r].output else {
            unreachable!()
        };
        view.labels.insert(key, v - 1);
        let r_call = h[r].call;

        let rep = check_with(&HostModel, &h, limits(LONG_BUDGET));
        let Verdict::NotLinearizable { best_prefix } = rep.verdict else {
            panic!("{rep:?}");
        };
        // The report points at the corrupted read.
        let before = h
            .iter()
            .filter(|o| o.ret.is_some() && o.call < r_call)
            .count();
        assert!(
            best_prefix.abs_diff(before) < 200,
            "{best_prefix} vs {before}"
        );
    }

    fn spec_strategy() -> impl Strategy<Value = Spec> {
        (
            0usize..3,
            0u8..6,
            0u64..4,
            0u64..6,
            0u64..10,
            prop_oneof![4 => Just(None), 1 => any::<bool>().prop_map(Some)],
        )
            .prop_map(|(client, kind, gap, dur, at, lost)| Spec {
                client,
                kind,
                gap,
                dur,
                at,
                lost,
            })
    }

    /// Changes one operation's output: a read sees a flipped bit or another
    /// label value, an uncordon the other answer.
    fn corrupt(h: &mut [Op], which: usize, how: u8) {
        let n = h.len();
        let o = &mut h[which % n];
        match (&o.input, &mut o.output) {
            (_, Some(HostResult::Read(v))) => match how % 4 {
                0 => v.cordoned = !v.cordoned,
                1 => v.draining = !v.draining,
                2 => {
                    let x = v.labels.entry("c0".into()).or_insert(0);
                    *x = x.saturating_sub(1);
                }
                _ => {
                    *v.labels.entry("c1".into()).or_insert(0) += 1;
                }
            },
            (HostOp::Uncordon, Some(out)) => {
                *out = if *out == HostResult::Ok {
                    HostResult::Refused
                } else {
                    HostResult::Ok
                };
            }
            _ => {}
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        /// On small histories (linearizable by construction, or with one
        /// output changed) the segmented checker agrees with the plain
        /// search whenever the latter decides.
        #[test]
        fn segmented_agrees_with_plain_search(
            specs in prop::collection::vec(spec_strategy(), 1..12),
            change in prop::option::of((any::<usize>(), any::<u8>())),
        ) {
            let mut h = simulate(&specs);
            if let Some((which, how)) = change {
                corrupt(&mut h, which, how);
            }
            let plain = check_unsegmented(&HostModel, &h, BUDGET);
            let seg = check_with(&HostModel, &h, limits(BUDGET));
            if change.is_none() {
                prop_assert_eq!(&seg.verdict, &Verdict::Linearizable);
            }
            if plain != Verdict::Undecided {
                prop_assert_eq!(
                    plain == Verdict::Linearizable,
                    seg.verdict == Verdict::Linearizable,
                    "plain {:?}, segmented {:?}, history {:#?}", plain, seg, h
                );
                prop_assert!(seg.verdict != Verdict::Undecided);
            }
        }
    }
}
