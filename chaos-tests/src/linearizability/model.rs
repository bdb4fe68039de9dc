//! The checker's vocabulary: a sequential specification ([`Model`]), one
//! [`Operation`] of a concurrent history (with or without a known
//! outcome), the [`Verdict`], the search's [`Limits`] and the [`Report`]
//! of a check.

use std::hash::Hash;

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
    /// Whether `input` only reads (for the counts a scenario reports).
    fn is_read(&self, _input: &Self::Input) -> bool {
        false
    }
    /// Whether `output` says the operation was refused and had no effect.
    fn is_refused(&self, _output: &Self::Output) -> bool {
        false
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

impl<I, O> Operation<I, O> {
    /// An operation of `client` called at `call` that returned `out` at
    /// `ret`.
    pub fn done(client: usize, input: I, call: u64, ret: u64, out: O) -> Self {
        Operation {
            client,
            input,
            call,
            ret: Some(ret),
            output: Some(out),
        }
    }
}

/// The checker's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Linearizable,
    /// No linearization exists. Holds how far the search got, to help
    /// debugging: for [`check`](super::check::check), the number of completed operations in the
    /// segments before the one that cannot be linearized plus the most of
    /// that segment's completed operations any branch of its search
    /// linearized (so the violation is among the operations right after
    /// that many, in call order); for [`check_unsegmented`](super::unsegmented::check_unsegmented), the longest
    /// prefix (by number of operations) the search linearized.
    NotLinearizable {
        best_prefix: usize,
    },
    /// The step budget ran out, or the frontier outgrew its bound, before a
    /// decision.
    Undecided,
}

/// Bounds of one [`check_with`](super::check::check_with) run.
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
