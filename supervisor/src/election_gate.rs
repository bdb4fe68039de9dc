//! When this node may start an election on its own: the one owner of
//! openraft's `elect` switch.
//!
//! openraft campaigns whenever its election timer runs out and its
//! *effective* membership (the last one appended, committed or not) makes
//! it a voter. Two kinds of node do that in vain and harm the cluster:
//! - a spare whose only voter configuration never committed (its leader
//!   appended the promotion, then paused or died), or a member removed
//!   before it heard its removal: everyone else refuses its votes
//!   ([`crate::node::Supervisor::hears_candidate`]), yet each campaign
//!   raises its term, and the next time a leader replicates to it (as a
//!   learner again) its answer carries that higher term and deposes the
//!   leader. Campaigning every election timeout, it stays one term ahead
//!   of every new leader: no leader lasts (`scenario pause-leader`,
//!   `leader-kill` with the spare in the membership).
//! - a node that leadership transfer asked to hold still.
//!
//! So the gate is open only when no transfer holds it, this node is a
//! voter of its *applied* (committed) membership, and no peer refused one
//! of its vote requests in the last [`REFUSAL_BACKOFF`] (a peer refuses
//! a candidate that is neither a voter of the peer's applied membership
//! nor ahead of it in the log: [`crate::node::Supervisor::hears_candidate`]).
//! Raft stays safe whatever the gate does: not campaigning only delays an
//! election. What it costs in liveness: a member whose own promotion it
//! has not applied yet (its leader died before telling it the commit)
//! waits for another member to be elected, and cannot be elected itself
//! unless it is ahead in the log of those it asks. An election that
//! leadership transfer triggers goes ahead regardless (openraft's
//! `trigger().elect()` ignores the switch).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::Raft;

use crate::model::TypeConfig;

/// How long a refused vote request keeps this node from campaigning.
pub const REFUSAL_BACKOFF: Duration = Duration::from_secs(2);
/// How often the gate is re-evaluated (membership applied, holds and
/// back-offs ending).
pub const TICK: Duration = Duration::from_millis(50);

/// When peers last refused this node's vote requests; the network layer
/// records, the gate reads.
#[derive(Debug)]
pub struct VoteRefusals {
    base: Instant,
    /// Milliseconds after `base`, plus one (0: never).
    last: AtomicU64,
}

impl Default for VoteRefusals {
    fn default() -> Self {
        Self {
            base: Instant::now(),
            last: AtomicU64::new(0),
        }
    }
}

impl VoteRefusals {
    /// A peer refused a vote request just now.
    pub fn record(&self) {
        let ms = self.base.elapsed().as_millis() as u64 + 1;
        self.last.store(ms, Ordering::Relaxed);
    }

    /// Whether a refusal came within `within` of `now`.
    fn recent(&self, now: Instant, within: Duration) -> bool {
        match self.last.load(Ordering::Relaxed) {
            0 => false,
            ms => {
                let at = self.base + Duration::from_millis(ms - 1);
                now.saturating_duration_since(at) < within
            }
        }
    }
}

/// Why the gate is shut, if it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shut {
    /// Leadership transfer holds this node still.
    Held,
    /// Not a voter of the applied membership.
    NotVoter,
    /// A peer refused a vote request within the back-off.
    Refused,
}

/// The gate's inputs at one moment.
#[derive(Debug, Clone, Copy)]
pub struct Inputs {
    pub held: bool,
    pub committed_voter: bool,
    pub refused_recently: bool,
}

/// The gate's rule: `None` when this node may campaign.
pub fn shut(i: Inputs) -> Option<Shut> {
    if i.held {
        Some(Shut::Held)
    } else if !i.committed_voter {
        Some(Shut::NotVoter)
    } else if i.refused_recently {
        Some(Shut::Refused)
    } else {
        None
    }
}

/// The gate of one node.
pub struct ElectionGate {
    raft: Raft<TypeConfig>,
    refusals: Arc<VoteRefusals>,
    /// Held while the switch is decided and set, so a hold and an
    /// evaluation never interleave (an evaluation that read "not held"
    /// must not open the switch after a hold shut it).
    state: Mutex<GateState>,
}

#[derive(Default)]
struct GateState {
    /// Until when leadership transfer holds this node.
    held_until: Option<Instant>,
    /// What the switch was last set to (`None`: open).
    last: Option<Shut>,
    /// The last evaluation's standing in the applied membership.
    committed_voter: bool,
}

impl ElectionGate {
    pub fn new(raft: Raft<TypeConfig>, refusals: Arc<VoteRefusals>) -> Self {
        Self {
            raft,
            refusals,
            state: Mutex::new(GateState {
                committed_voter: true,
                ..GateState::default()
            }),
        }
    }

    /// Holds this node from campaigning for `d` (or until [`Self::release`]).
    pub fn hold(&self, d: Duration) {
        self.update(|s| s.held_until = Some(Instant::now() + d));
    }

    /// Ends a hold.
    pub fn release(&self) {
        self.update(|s| s.held_until = None);
    }

    /// Sets the switch from the current inputs; `committed_voter` is this
    /// node's standing in its applied membership.
    pub fn evaluate(&self, committed_voter: bool) {
        self.update(|s| s.committed_voter = committed_voter);
    }

    /// Applies `change`, then decides and sets the switch, all under the
    /// state's lock.
    fn update(&self, change: impl FnOnce(&mut GateState)) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        change(&mut st);
        let now = Instant::now();
        let s = shut(Inputs {
            held: st.held_until.is_some_and(|t| now < t),
            committed_voter: st.committed_voter,
            refused_recently: self.refusals.recent(now, REFUSAL_BACKOFF),
        });
        self.raft.runtime_config().elect(s.is_none());
        if st.last != s {
            tracing::info!(shut = ?s, was = ?st.last, "election gate");
            st.last = s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(held: bool, committed_voter: bool, refused_recently: bool) -> Inputs {
        Inputs {
            held,
            committed_voter,
            refused_recently,
        }
    }

    #[test]
    fn only_an_unheld_committed_voter_nobody_refused_campaigns() {
        assert_eq!(shut(inputs(false, true, false)), None);
        assert_eq!(shut(inputs(true, true, false)), Some(Shut::Held));
        assert_eq!(shut(inputs(false, false, false)), Some(Shut::NotVoter));
        assert_eq!(shut(inputs(false, true, true)), Some(Shut::Refused));
        assert_eq!(shut(inputs(true, false, true)), Some(Shut::Held));
    }

    #[test]
    fn a_refusal_counts_for_the_back_off_only() {
        let r = VoteRefusals::default();
        let now = Instant::now();
        assert!(!r.recent(now, REFUSAL_BACKOFF), "never refused");
        r.record();
        let now = Instant::now();
        assert!(r.recent(now, REFUSAL_BACKOFF));
        assert!(!r.recent(
            now + REFUSAL_BACKOFF + Duration::from_millis(5),
            REFUSAL_BACKOFF
        ));
    }
}
