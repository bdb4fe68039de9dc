//! [`Revocations`]: the shared set of revoked serials that every server
//! handshake checks. Its owner (the supervisor, from the Raft-replicated
//! list) replaces or extends it; the change applies to the next handshake
//! at once, and every waiter on [`Revocations::revoked`] (the guard of a
//! long-lived stream, [`crate::until_revoked`]) wakes to look.

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tokio::sync::watch;

use crate::serial::Serial;

/// A cheap-to-clone handle on one set of revoked serials; every clone
/// sees every change at once.
#[derive(Debug, Clone)]
pub struct Revocations {
    set: Arc<RwLock<BTreeSet<Serial>>>,
    /// Bumped after every change, so waiters need not poll.
    changes: Arc<watch::Sender<u64>>,
}

impl Default for Revocations {
    fn default() -> Self {
        Revocations {
            set: Arc::default(),
            changes: Arc::new(watch::Sender::new(0)),
        }
    }
}

impl Revocations {
    /// An empty set.
    pub fn new() -> Revocations {
        Revocations::default()
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Resolves once `serial` is revoked (at once if it already is). Wakes
    /// on every change of the list, never polls.
    pub async fn revoked(&self, serial: &Serial) {
        // Subscribe before looking, so a change between the look and the
        // wait is not missed.
        let mut rx = self.changes.subscribe();
        loop {
            if self.contains(serial) {
                return;
            }
            // The sender lives as long as `self`: `changed` cannot fail
            // while this future borrows it.
            if rx.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    // A poisoned lock only means a writer panicked mid-update of a plain
    // set; the set is still a set, so it is used rather than panicking.
    fn read(&self) -> RwLockReadGuard<'_, BTreeSet<Serial>> {
        self.set.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, BTreeSet<Serial>> {
        self.set.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Revokes `serial`; returns whether it was new.
    pub fn revoke(&self, serial: Serial) -> bool {
        let added = self.write().insert(serial.clone());
        if added {
            self.changed();
            tracing::info!(%serial, "certificate serial revoked");
        }
        added
    }

    /// Takes `serial` off the list; returns whether it was there.
    pub fn unrevoke(&self, serial: &Serial) -> bool {
        let removed = self.write().remove(serial);
        if removed {
            self.changed();
        }
        removed
    }

    /// Replaces the whole list (e.g. with the replicated one).
    pub fn replace(&self, serials: impl IntoIterator<Item = Serial>) {
        let new: BTreeSet<Serial> = serials.into_iter().collect();
        let count = new.len();
        *self.write() = new;
        self.changed();
        tracing::info!(count, "revocation list replaced");
    }

    /// Whether `serial` is revoked.
    pub fn contains(&self, serial: &Serial) -> bool {
        self.read().contains(serial)
    }

    /// How many serials are revoked.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// Whether nothing is revoked.
    pub fn is_empty(&self) -> bool {
        self.read().is_empty()
    }

    /// A copy of the current list.
    pub fn snapshot(&self) -> BTreeSet<Serial> {
        self.read().clone()
    }
}
