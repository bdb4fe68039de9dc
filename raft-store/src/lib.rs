//! Durable Raft storage for railguard: openraft 0.9 (`storage-v2`) log storage
//! and state machine on sled 0.34.
//!
//! # Layout
//! - [`SledLogStore`]: the Raft log, the vote, the committed log id and the
//!   purge marker. Every write that openraft must be able to rely on after a
//!   crash (appends, votes, truncation, purge) is flushed before it is
//!   acknowledged — through [`durable_sled::DurableDb`], whose flush also
//!   fsyncs what sled's own leaves to the filesystem's next journal commit,
//!   so "flushed" holds across a machine crash or a disk error, not only a
//!   killed process.
//! - [`SledStateMachine`]: applies committed entries to an in-memory
//!   [`StateModel`] and persists snapshots (meta and data) in sled. After a
//!   restart the model is loaded from the last snapshot and openraft re-applies
//!   the committed tail of the log (the committed log id is stored too).
//! - [`mem`]: the same store in memory (a [`mem::MemDisk`] survives a
//!   simulated crash), for the deterministic simulation.
//! - [`StateModel`]: the small trait through which an application's replicated
//!   model (railguard's cluster model, or openraft's test types) plugs into the
//!   same store.
//!
//! # On-disk format
//! One sled database per node with three trees:
//! - `log`: key = log index as big-endian `u64`, value = an `Entry`;
//! - `meta`: `vote`, `committed`, `last_purged`, and `format` (the store
//!   marker: the format version byte alone);
//! - `snapshot`: `meta` (the `SnapshotMeta`) and `data` (the model bytes).
//!
//! Every value is one format version byte ([`FORMAT_VERSION`]) followed by
//! bincode (for snapshot data: by the model's bytes); a reader refuses another
//! version, or a damaged value, with a [`StoreError`] naming the tree and key.
//! A database with data but no `format` marker predates versioned records and
//! is refused ([`StoreError::Unversioned`]). See the `format` module.
//!
//! The store does not lock the data directory itself; the daemon that opens it
//! holds an exclusive lock file (see the supervisor's `datadir` module), and
//! sled additionally refuses a second opener in the same process tree.

// openraft dictates `StorageError` (large) as the error of every storage call.
#![allow(clippy::result_large_err)]

mod error;
mod format;
mod log_store;
pub mod mem;
mod state_machine;

use std::path::Path;

use durable_sled::DurableDb;

pub use error::StoreError;
pub use format::FORMAT_VERSION;
pub use log_store::SledLogStore;
pub use state_machine::{Applied, SharedApplied, SledStateMachine, StateModel};

/// Opens (or creates) the store in `dir` and returns the log store and the
/// state machine, which share the same sled database.
///
/// The state machine starts from the latest persisted snapshot, if any; the
/// caller hands both halves to `openraft::Raft::new`, which re-applies the
/// committed log tail.
pub fn open<C, M>(dir: &Path) -> Result<(SledLogStore<C>, SledStateMachine<C, M>), StoreError>
where
    C: openraft::RaftTypeConfig<
        Entry = openraft::Entry<C>,
        SnapshotData = std::io::Cursor<Vec<u8>>,
    >,
    C::D: serde::Serialize + serde::de::DeserializeOwned,
    M: StateModel<C>,
{
    let db = DurableDb::open(sled::Config::new().mode(sled::Mode::HighThroughput), dir).map_err(
        |source| StoreError::Sled {
            path: dir.display().to_string(),
            source,
        },
    )?;
    format::check_store(&db, dir)?;
    let log = SledLogStore::new(&db, M::FORMAT_VERSION).map_err(|source| StoreError::Sled {
        path: dir.display().to_string(),
        source,
    })?;
    let sm = SledStateMachine::new(&db, dir)?;
    Ok((log, sm))
}
