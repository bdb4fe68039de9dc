//! The same store in memory, for simulations: [`MemDisk`] is what a node
//! keeps across a crash (log, vote, committed id, purge marker, snapshot);
//! [`MemLogStore`] and [`MemStateMachine`] are opened on it as the sled
//! store is opened on a directory. A simulated crash drops the node's
//! stores and opens new ones on the same disk: the model is rebuilt from
//! the snapshot and openraft re-applies the committed tail, exactly the
//! sled store's start-up path. Every write is "flushed" when the call
//! returns. Passes openraft's storage `Suite` (`tests/mem_suite.rs`).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::RangeBounds;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    Entry, LogId, OptionalSend, RaftLogId, RaftLogReader, RaftSnapshotBuilder, RaftTypeConfig,
    SnapshotMeta, StorageError, StorageIOError, StoredMembership, Vote,
};

use crate::state_machine::{
    apply_entries, snapshot_of, Applied, SharedApplied, SnapshotParts, StateModel,
};

/// What survives a crash of a simulated node.
pub struct MemDisk<C: RaftTypeConfig> {
    log: BTreeMap<u64, Entry<C>>,
    vote: Option<Vote<C::NodeId>>,
    committed: Option<LogId<C::NodeId>>,
    last_purged: Option<LogId<C::NodeId>>,
    /// The latest snapshot.
    snapshot: Option<SnapshotParts<C>>,
}

impl<C: RaftTypeConfig> Default for MemDisk<C> {
    fn default() -> Self {
        MemDisk {
            log: BTreeMap::new(),
            vote: None,
            committed: None,
            last_purged: None,
            snapshot: None,
        }
    }
}

impl<C: RaftTypeConfig> MemDisk<C> {
    /// The stored vote.
    pub fn vote(&self) -> Option<&Vote<C::NodeId>> {
        self.vote.as_ref()
    }

    /// The id of the stored entry at `index`, if the log still has it.
    pub fn log_id_at(&self, index: u64) -> Option<LogId<C::NodeId>>
    where
        Entry<C>: RaftLogId<C::NodeId>,
    {
        self.log.get(&index).map(|e| e.get_log_id().clone())
    }

    /// The last entry the stored snapshot covers (the log may have been
    /// purged up to it).
    pub fn snapshot_last(&self) -> Option<LogId<C::NodeId>> {
        self.snapshot
            .as_ref()
            .and_then(|(m, _)| m.last_log_id.clone())
    }

    /// Fault injection: loses the last `n` log entries, the vote and a
    /// committed id past what is left, as a disk that acknowledged writes
    /// it had not stored does at a crash
    /// (sled's flush before `durable-sled`). A simulation run with it
    /// must find violations; the checkers are worthless otherwise.
    pub fn forget_tail(&mut self, n: usize) {
        for _ in 0..n {
            if self.log.pop_last().is_none() {
                break;
            }
        }
        self.vote = None;
        // The committed id went with them (it is never ahead of the log).
        let last = self.log.keys().next_back().copied();
        if self.committed.as_ref().map(|c| c.index) > last {
            self.committed = last
                .and_then(|i| self.log.get(&i))
                .map(|e| e.get_log_id().clone());
        }
    }
}

/// A disk shared by the stores opened on it.
pub type SharedDisk<C> = Arc<Mutex<MemDisk<C>>>;

fn lock<C: RaftTypeConfig>(d: &SharedDisk<C>) -> MutexGuard<'_, MemDisk<C>> {
    d.lock().unwrap_or_else(|e| e.into_inner())
}

/// Opens the stores on `disk`, as [`crate::open`] does on a directory.
pub fn open_mem<C, M>(
    disk: &SharedDisk<C>,
) -> Result<(MemLogStore<C>, MemStateMachine<C, M>), String>
where
    C: RaftTypeConfig<Entry = Entry<C>, SnapshotData = Cursor<Vec<u8>>>,
    M: StateModel<C>,
{
    let mut applied = Applied::<C, M>::default();
    if let Some((meta, data)) = &lock(disk).snapshot {
        applied.model = M::decode(data)?;
        applied.last_applied = meta.last_log_id.clone();
        applied.membership = meta.last_membership.clone();
    }
    Ok((
        MemLogStore { disk: disk.clone() },
        MemStateMachine {
            disk: disk.clone(),
            state: Arc::new(RwLock::new(applied)),
            seq: 0,
        },
    ))
}

/// The log half, on a [`MemDisk`].
pub struct MemLogStore<C: RaftTypeConfig> {
    disk: SharedDisk<C>,
}

impl<C: RaftTypeConfig> Clone for MemLogStore<C> {
    fn clone(&self) -> Self {
        MemLogStore {
            disk: self.disk.clone(),
        }
    }
}

impl<C> RaftLogReader<C> for MemLogStore<C>
where
    C: RaftTypeConfig<Entry = Entry<C>>,
    Entry<C>: Clone,
{
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<C::Entry>, StorageError<C::NodeId>> {
        Ok(lock(&self.disk)
            .log
            .range(range)
            .map(|(_, e)| e.clone())
            .collect())
    }
}

impl<C> RaftLogStorage<C> for MemLogStore<C>
where
    C: RaftTypeConfig<Entry = Entry<C>>,
    Entry<C>: Clone,
{
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<C>, StorageError<C::NodeId>> {
        let d = lock(&self.disk);
        let last = d.log.values().next_back().map(|e| e.get_log_id().clone());
        Ok(LogState {
            last_log_id: last.or_else(|| d.last_purged.clone()),
            last_purged_log_id: d.last_purged.clone(),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        lock(&self.disk).vote = Some(vote.clone());
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<C::NodeId>>, StorageError<C::NodeId>> {
        Ok(lock(&self.disk).vote.clone())
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<C::NodeId>>,
    ) -> Result<(), StorageError<C::NodeId>> {
        lock(&self.disk).committed = committed;
        Ok(())
    }

    async fn read_committed(
        &mut self,
    ) -> Result<Option<LogId<C::NodeId>>, StorageError<C::NodeId>> {
        Ok(lock(&self.disk).committed.clone())
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
        {
            let mut d = lock(&self.disk);
            for e in entries {
                d.log.insert(e.get_log_id().index, e);
            }
        }
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        lock(&self.disk).log.split_off(&log_id.index);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        let mut d = lock(&self.disk);
        d.last_purged = Some(log_id.clone());
        d.log = d.log.split_off(&(log_id.index + 1));
        Ok(())
    }
}

/// The state machine half, on a [`MemDisk`]; the model is volatile.
pub struct MemStateMachine<C: RaftTypeConfig, M> {
    disk: SharedDisk<C>,
    state: SharedApplied<C, M>,
    seq: u64,
}

impl<C: RaftTypeConfig, M> MemStateMachine<C, M> {
    /// A handle for reading the applied state from elsewhere.
    pub fn shared(&self) -> SharedApplied<C, M> {
        self.state.clone()
    }
}

/// Builds snapshots of a [`MemStateMachine`].
pub struct MemSnapshotBuilder<C: RaftTypeConfig, M> {
    disk: SharedDisk<C>,
    state: SharedApplied<C, M>,
    seq: u64,
}

fn io_err(e: String) -> std::io::Error {
    std::io::Error::other(e)
}

impl<C, M> RaftSnapshotBuilder<C> for MemSnapshotBuilder<C, M>
where
    C: RaftTypeConfig<Entry = Entry<C>, SnapshotData = Cursor<Vec<u8>>>,
    M: StateModel<C>,
{
    async fn build_snapshot(&mut self) -> Result<Snapshot<C>, StorageError<C::NodeId>> {
        let (meta, data) = snapshot_of(&self.state, self.seq)?;
        lock(&self.disk).snapshot = Some((meta.clone(), data.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl<C, M> RaftStateMachine<C> for MemStateMachine<C, M>
where
    C: RaftTypeConfig<Entry = Entry<C>, SnapshotData = Cursor<Vec<u8>>>,
    M: StateModel<C>,
{
    type SnapshotBuilder = MemSnapshotBuilder<C, M>;

    async fn applied_state(
        &mut self,
    ) -> Result<
        (
            Option<LogId<C::NodeId>>,
            StoredMembership<C::NodeId, C::Node>,
        ),
        StorageError<C::NodeId>,
    > {
        let st = self.state.read().unwrap_or_else(|e| e.into_inner());
        Ok((st.last_applied.clone(), st.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<C::R>, StorageError<C::NodeId>>
    where
        I: IntoIterator<Item = C::Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut st = self.state.write().unwrap_or_else(|e| e.into_inner());
        Ok(apply_entries(&mut st, entries))
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.seq += 1;
        MemSnapshotBuilder {
            disk: self.disk.clone(),
            state: self.state.clone(),
            seq: self.seq,
        }
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<C::NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<C::NodeId, C::Node>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<C::NodeId>> {
        let data = snapshot.into_inner();
        let model = M::decode(&data)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &io_err(e)))?;
        lock(&self.disk).snapshot = Some((meta.clone(), data));
        let mut st = self.state.write().unwrap_or_else(|e| e.into_inner());
        st.model = model;
        st.last_applied = meta.last_log_id.clone();
        st.membership = meta.last_membership.clone();
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<C>>, StorageError<C::NodeId>> {
        Ok(lock(&self.disk)
            .snapshot
            .as_ref()
            .map(|(meta, data)| Snapshot {
                meta: meta.clone(),
                snapshot: Box::new(Cursor::new(data.clone())),
            }))
    }
}
