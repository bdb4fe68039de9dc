//! The Raft log, vote, committed id and purge marker on sled.
//!
//! **Durability:** an append is reported to openraft (through `LogFlushed`)
//! only after `flush_async` has completed, and votes, truncations and purges
//! are flushed before they return (a durable flush: `durable_sled`). A
//! crash, of the process or of the machine, therefore never loses something
//! openraft was told is stored.

use durable_sled::DurableDb;
use std::fmt::Debug;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{
    Entry, LogId, OptionalSend, RaftLogId, RaftLogReader, RaftTypeConfig, StorageError,
    StorageIOError, Vote,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::StoreError;
use crate::format::{decode, decode_entry, encode, encode_entry, TREE_LOG, TREE_META};

const KEY_VOTE: &[u8] = b"vote";
const KEY_COMMITTED: &[u8] = b"committed";
const KEY_LAST_PURGED: &[u8] = b"last_purged";

/// Log storage backed by the `log` and `meta` trees of a sled database.
///
/// Cloning is cheap (sled handles are reference counted); clones serve as
/// openraft's log readers and see every flushed write.
pub struct SledLogStore<C: RaftTypeConfig> {
    db: DurableDb,
    log: sled::Tree,
    meta: sled::Tree,
    /// The model's format byte in every entry written and read.
    model_format: u8,
    _c: PhantomData<C>,
}

impl<C: RaftTypeConfig> Clone for SledLogStore<C> {
    fn clone(&self) -> Self {
        Self {
            db: self.db.clone(),
            log: self.log.clone(),
            meta: self.meta.clone(),
            model_format: self.model_format,
            _c: PhantomData,
        }
    }
}

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

/// The index a `log` key holds; a key of another length is corruption.
fn key_index(key: &[u8]) -> Result<u64, StoreError> {
    let b: [u8; 8] = key.try_into().map_err(|_| StoreError::Corrupt {
        what: "log key",
        tree: TREE_LOG,
        key: format!("{key:02x?}"),
        detail: format!("{} bytes where a big-endian u64 index belongs", key.len()),
    })?;
    Ok(u64::from_be_bytes(b))
}

/// What the value under a `meta` key is, for errors.
fn meta_what(key: &[u8]) -> &'static str {
    match key {
        KEY_VOTE => "vote",
        KEY_COMMITTED => "committed log id",
        KEY_LAST_PURGED => "purge marker",
        _ => "meta value",
    }
}

impl<C> SledLogStore<C>
where
    C: RaftTypeConfig<Entry = Entry<C>>,
    C::D: Serialize + DeserializeOwned,
{
    pub(crate) fn new(db: &DurableDb, model_format: u8) -> Result<Self, sled::Error> {
        Ok(Self {
            db: db.clone(),
            log: db.open_tree(TREE_LOG)?,
            meta: db.open_tree(TREE_META)?,
            model_format,
            _c: PhantomData,
        })
    }

    fn read_meta<T: DeserializeOwned>(
        &self,
        key: &[u8],
    ) -> Result<Option<T>, StorageError<C::NodeId>> {
        match self.meta.get(key).map_err(|e| StorageIOError::read(&e))? {
            None => Ok(None),
            Some(bytes) => {
                let name = String::from_utf8_lossy(key);
                let value = decode(&bytes, meta_what(key), TREE_META, &name)
                    .map_err(|e| StorageIOError::read(&e))?;
                Ok(Some(value))
            }
        }
    }

    async fn flush(&self) -> Result<(), sled::Error> {
        self.db.flush_async().await.map(|_| ())
    }
}

impl<C> RaftLogReader<C> for SledLogStore<C>
where
    C: RaftTypeConfig<Entry = Entry<C>>,
    C::D: Serialize + DeserializeOwned,
{
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<C::Entry>, StorageError<C::NodeId>> {
        let start = match range.start_bound() {
            Bound::Included(i) => *i,
            Bound::Excluded(i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let iter = match range.end_bound() {
            Bound::Included(i) => self.log.range(index_key(start)..=index_key(*i)),
            Bound::Excluded(i) => self.log.range(index_key(start)..index_key(*i)),
            Bound::Unbounded => self.log.range(index_key(start)..),
        };
        let mut out = Vec::new();
        for kv in iter {
            let (k, v) = kv.map_err(|e| StorageIOError::read_logs(&e))?;
            let index = key_index(&k).map_err(|e| StorageIOError::read_logs(&e))?;
            let entry: Entry<C> = decode_entry(&v, self.model_format, index)
                .map_err(|e| StorageIOError::read_log_at_index(index, &e))?;
            out.push(entry);
        }
        Ok(out)
    }
}

impl<C> RaftLogStorage<C> for SledLogStore<C>
where
    C: RaftTypeConfig<Entry = Entry<C>>,
    C::D: Serialize + DeserializeOwned,
{
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<C>, StorageError<C::NodeId>> {
        let last_purged: Option<LogId<C::NodeId>> = self.read_meta(KEY_LAST_PURGED)?;
        let last = match self.log.last().map_err(|e| StorageIOError::read_logs(&e))? {
            None => None,
            Some((k, v)) => {
                let index = key_index(&k).map_err(|e| StorageIOError::read_logs(&e))?;
                let entry: Entry<C> = decode_entry(&v, self.model_format, index)
                    .map_err(|e| StorageIOError::read_log_at_index(index, &e))?;
                Some(entry.get_log_id().clone())
            }
        };
        Ok(LogState {
            last_log_id: last.or_else(|| last_purged.clone()),
            last_purged_log_id: last_purged,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        let bytes = encode(vote).map_err(|e| StorageIOError::write_vote(&*e))?;
        self.meta
            .insert(KEY_VOTE, bytes)
            .map_err(|e| StorageIOError::write_vote(&e))?;
        self.flush()
            .await
            .map_err(|e| StorageIOError::write_vote(&e))?;
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<C::NodeId>>, StorageError<C::NodeId>> {
        self.read_meta(KEY_VOTE)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<C::NodeId>>,
    ) -> Result<(), StorageError<C::NodeId>> {
        // Not flushed on its own (a flush here would stall openraft's core on
        // every commit): after a crash the stored id may be behind, so
        // openraft re-applies less on start-up and learns the rest from the
        // cluster. Caution for read-index users: a node restarting as leader
        // of its old term serves reads from max(noop, committed), which can
        // then be behind writes it acknowledged; the supervisor's
        // linearizable read also waits for its whole log (see
        // `Supervisor::read_linearizable`).
        let bytes = encode(&committed).map_err(|e| StorageIOError::write(&*e))?;
        self.meta
            .insert(KEY_COMMITTED, bytes)
            .map_err(|e| StorageIOError::write(&e))?;
        Ok(())
    }

    async fn read_committed(
        &mut self,
    ) -> Result<Option<LogId<C::NodeId>>, StorageError<C::NodeId>> {
        Ok(self
            .read_meta::<Option<LogId<C::NodeId>>>(KEY_COMMITTED)?
            .flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<C>,
    ) -> Result<(), StorageError<C::NodeId>>
    where
        I: IntoIterator<Item = C::Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        // Plain inserts, not a `sled::Batch`: sled makes a batch atomic by
        // sealing and writing its current IO buffer before the batch and
        // the batch's own buffer after it, two more writes (each a job on
        // sled's thread pool and a `sync_file_range`) ahead of the flush
        // below, for every append. Atomicity is not needed here: sled
        // recovers a prefix of its log (except a value large enough for a
        // blob file after a machine crash: see `durable_sled`), so a crash
        // before the flush completes leaves a prefix of these entries,
        // none of them yet acknowledged, which is what a Raft log may hold
        // after a crash. Readers may see a part of the append meanwhile;
        // openraft reads no entry of it before `append` and its callback
        // have returned. Everything is encoded first, so an entry that
        // cannot be encoded leaves nothing written.
        let mut encoded = Vec::new();
        for entry in entries {
            let log_id = entry.get_log_id().clone();
            let bytes = encode_entry(&entry, self.model_format)
                .map_err(|e| StorageIOError::write_log_entry(log_id.clone(), &*e))?;
            encoded.push((index_key(log_id.index), bytes));
        }
        for (key, bytes) in encoded {
            self.log
                .insert(key, bytes)
                .map_err(|e| StorageIOError::write_logs(&e))?;
        }
        // Acknowledge only once the entries are on disk.
        let flushed = self.flush().await.map_err(std::io::Error::other);
        let report = match &flushed {
            Ok(()) => Ok(()),
            Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
        };
        callback.log_io_completed(report);
        flushed.map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        tracing::debug!(since = log_id.index, "truncate raft log");
        self.remove_range(log_id.index..)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        self.flush()
            .await
            .map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        tracing::debug!(upto = log_id.index, "purge raft log");
        // Record the purge marker first: if we crash between the two steps the
        // log state still reports a consistent `last_purged_log_id`.
        let bytes = encode(&log_id).map_err(|e| StorageIOError::write(&*e))?;
        self.meta
            .insert(KEY_LAST_PURGED, bytes)
            .map_err(|e| StorageIOError::write(&e))?;
        self.flush().await.map_err(|e| StorageIOError::write(&e))?;
        self.remove_range(..=log_id.index)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        self.flush()
            .await
            .map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }
}

impl<C: RaftTypeConfig> SledLogStore<C> {
    fn remove_range<R: RangeBounds<u64>>(&self, range: R) -> Result<(), sled::Error> {
        let start = match range.start_bound() {
            Bound::Included(i) => Bound::Included(index_key(*i)),
            Bound::Excluded(i) => Bound::Excluded(index_key(*i)),
            Bound::Unbounded => Bound::Unbounded,
        };
        let end = match range.end_bound() {
            Bound::Included(i) => Bound::Included(index_key(*i)),
            Bound::Excluded(i) => Bound::Excluded(index_key(*i)),
            Bound::Unbounded => Bound::Unbounded,
        };
        let mut batch = sled::Batch::default();
        for key in self.log.range::<[u8; 8], _>((start, end)).keys() {
            batch.remove(key?);
        }
        self.log.apply_batch(batch)
    }
}
