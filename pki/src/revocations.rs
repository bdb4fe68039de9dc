//! [`Revocations`]: the shared set of revoked serials that every server
//! handshake checks. Its owner (later: a Raft-replicated list) replaces or
//! extends it; the change applies to the next handshake, not to
//! connections already open.

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::serial::Serial;

/// A cheap-to-clone handle on one set of revoked serials; every clone
/// sees every change at once.
#[derive(Debug, Clone, Default)]
pub struct Revocations {
    set: Arc<RwLock<BTreeSet<Serial>>>,
}

impl Revocations {
    /// An empty set.
    pub fn new() -> Revocations {
        Revocations::default()
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
            tracing::info!(%serial, "certificate serial revoked");
        }
        added
    }

    /// Takes `serial` off the list; returns whether it was there.
    pub fn unrevoke(&self, serial: &Serial) -> bool {
        self.write().remove(serial)
    }

    /// Replaces the whole list (e.g. with the replicated one).
    pub fn replace(&self, serials: impl IntoIterator<Item = Serial>) {
        let new: BTreeSet<Serial> = serials.into_iter().collect();
        let count = new.len();
        *self.write() = new;
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
