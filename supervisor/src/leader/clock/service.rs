//! [`ClockService`]: the clock store behind one lock and the operations
//! the gRPC services and the leader loops call; the work is done by the
//! sibling modules.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use clocksync::SolveConfig;
use proto::v1::ProbeSummary;

use crate::api::{ApiError, ClockView, PathsView};
use crate::leader::clock::holdover;
use crate::leader::clock::ingest::{self, SummaryError};
use crate::leader::clock::paths;
use crate::leader::clock::records::{Ingested, PathSample, SolveInput, Solved, Store, CLOCK_FRESH};
use crate::leader::clock::solve;
use crate::leader::clock::views::{self, ClockShown};
use crate::model::{ClusterState, NodeId};

/// The leader's clock service (see the module docs).
pub struct ClockService {
    store: Mutex<Store>,
    cfg: SolveConfig,
}

impl Default for ClockService {
    fn default() -> Self {
        Self::new(SolveConfig::default())
    }
}

impl ClockService {
    /// A service classifying clocks with `cfg`'s thresholds.
    pub fn new(cfg: SolveConfig) -> Self {
        Self {
            store: Mutex::new(Store::default()),
            cfg,
        }
    }

    /// The solve configuration.
    pub fn config(&self) -> &SolveConfig {
        &self.cfg
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().expect("clock store poisoned")
    }

    /// Forgets everything (this supervisor stopped leading).
    pub fn clear(&self) {
        *self.lock() = Store::default();
    }

    /// When a peer last reported receiving each host's probes.
    pub fn probe_evidence(&self) -> HashMap<String, Instant> {
        self.lock().evidence.clone()
    }

    /// Probe evidence from a heartbeat: each host was heard (its probes
    /// received by the heartbeat's sender) at the given instant. Keeps the
    /// newer of what it knew and what it hears.
    pub fn heard(&self, heard: impl IntoIterator<Item = (String, Instant)>) {
        let mut store = self.lock();
        for (host, at) in heard {
            store.heard(host, at);
        }
    }

    /// The latest solve, if any.
    pub fn solved(&self) -> Option<Arc<Solved>> {
        self.lock().solved.clone()
    }

    /// Validates and stores one summary received at `now`. A refused
    /// summary stores nothing; entries naming unknown peers, rails or NICs
    /// are skipped (logged at debug).
    pub fn ingest(
        &self,
        st: &ClusterState,
        s: &ProbeSummary,
        now: Instant,
    ) -> Result<Ingested, SummaryError> {
        ingest::check_summary(st, s)?;
        Ok(ingest::store_summary(&mut self.lock(), st, s, now))
    }

    /// Prunes the store and gathers the next solve's input (none without
    /// fresh edges).
    pub fn solve_input(&self, st: &ClusterState, now: Instant) -> Option<SolveInput> {
        let mut store = self.lock();
        ingest::prune(&mut store, st, now);
        solve::solve_input(&store, st, now)
    }

    /// Every path's seconds that arrived after `after` (all without),
    /// oldest first per path, with the delays corrected like `paths`
    /// does: what the contention detector ([`crate::leader::contention`])
    /// reads.
    pub fn path_seconds_after(
        &self,
        st: &ClusterState,
        after: Option<Instant>,
        now: Instant,
    ) -> Vec<PathSample> {
        paths::path_seconds_after(&self.lock(), st, after, now)
    }

    /// When `host`'s shaped classes on `nic` last carried at least
    /// [`SHAPED_BUSY_SHARE`](super::records::SHAPED_BUSY_SHARE) of their
    /// rate (none: not since reported).
    pub fn shaped_busy(&self, host: &str, nic: &str) -> Option<Instant> {
        self.lock()
            .shaped
            .get(&(host.to_owned(), nic.to_owned()))
            .and_then(|t| t.busy_at)
    }

    /// Carries forward, into `new`, the clocks of hosts that the previous
    /// solve had (solved or held) and `new` lacks: for at most
    /// [`MAX_HOLDOVER`](super::records::MAX_HOLDOVER) since their last
    /// solution, and only while the reference is the same (offsets against
    /// another reference mean nothing), and only for hosts in `keep`
    /// (registered, not Down). The bound grows by the drift's error over
    /// the time carried.
    pub fn hold_over(&self, new: &mut Solved, keep: &BTreeSet<u32>, now: Instant) {
        let prev = self.solved();
        holdover::hold_over(prev.as_deref(), new, keep, now, &self.cfg);
    }

    /// Keeps the latest solve made at `now` (none: no fresh edges). One
    /// without a solution does not replace the last solution while that
    /// is at most [`MAX_HOLDOVER`](super::records::MAX_HOLDOVER) old: it
    /// stands in (see the module docs).
    pub fn set_solved(&self, solved: Option<Solved>, now: Instant) {
        let error = match &solved {
            Some(s) if s.solution.is_some() => None,
            Some(s) => Some(
                s.error
                    .clone()
                    .unwrap_or_else(|| "the solve found no solution".into()),
            ),
            None => Some(format!(
                "no fresh probe edges (none reported within {CLOCK_FRESH:?}) or no host to be the reference"
            )),
        };
        holdover::settle(&mut self.lock(), solved, error, now);
    }

    /// Records a tick whose solve could not run (`why`), like a failed
    /// solve: the last solution stands in.
    pub fn set_solve_failed(&self, why: String, now: Instant) {
        holdover::settle(&mut self.lock(), None, Some(why), now);
    }

    /// `railguard clock`.
    pub fn clock_view(&self, st: &ClusterState, leader: NodeId, now: Instant) -> ClockView {
        let shown = {
            let store = self.lock();
            ClockShown {
                solved: store.solved.clone(),
                probe_load: store.probe_load.clone(),
                solve_error: store.solve_error.clone(),
            }
        };
        views::clock_view(shown, &self.cfg, st, leader, now)
    }

    /// `railguard paths`: paths touching `host` (all without), worst p99
    /// first, at most `top`.
    pub fn paths_view(
        &self,
        st: &ClusterState,
        leader: NodeId,
        host: Option<&str>,
        top: Option<u32>,
        now: Instant,
    ) -> Result<PathsView, ApiError> {
        views::paths_view(&self.lock(), st, leader, host, top, now)
    }
}
