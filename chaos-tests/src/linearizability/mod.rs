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
//! A long history is not searched as a whole. [`check`](fn@check) cuts it at
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
//!
//! # Layout
//! - [`model`]: the vocabulary: a sequential specification ([`Model`]),
//!   an [`Operation`] of a history, the [`Verdict`], [`Limits`], [`Report`].
//! - [`check`](mod@check): the segmented checker ([`check`](fn@check), [`check_with`]): cuts at
//!   quiescent points and carries the frontier across them.
//! - `segment`: the cuts at quiescent points.
//! - `entries`: the operation list, bit set and hasher both searches use.
//! - `search`: the search within one segment (canonical linearizations,
//!   memo of configurations) and its data structures.
//! - [`unsegmented`]: the plain search over a whole history, the reference.
//! - [`host`]: [`HostModel`], the sequential spec of a host's
//!   admin-visible state.
//! - [`playbook`]: [`playbook::PlaybookModel`], one stored playbook
//!   (apply, delete, show); [`job`]: [`job::JobModel`], one job name
//!   (submit, cancel, show); [`member`]: [`member::MemberModel`], a spare
//!   supervisor's place in the membership (add-member, remove-member,
//!   members).

pub mod check;
mod entries;
pub mod host;
pub mod job;
pub mod member;
pub mod model;
pub mod playbook;
mod search;
mod segment;
pub mod unsegmented;

pub use check::{check, check_with};
pub use host::{HostModel, HostOp, HostResult, HostView};
pub use model::{Limits, Model, Operation, Report, Verdict, MAX_FRONTIER};
pub use unsegmented::check_unsegmented;

#[cfg(test)]
mod tests;
