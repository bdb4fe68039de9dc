//! The state machine: an in-memory [`StateModel`] fed by committed entries,
//! with snapshots persisted in sled.
//!
//! The model itself is not written on every apply (that would double every
//! write); it is rebuilt on start-up from the latest snapshot plus openraft's
//! re-application of the committed log tail. Snapshots are flushed before
//! openraft is told they exist, so a purge never removes log entries that are
//! not covered by a durable snapshot.

use durable_sled::DurableDb;
use std::io::Cursor;
use std::marker::PhantomData;
use std::path::Path;
use std::sync::{Arc, RwLock};

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    Entry, EntryPayload, LogId, RaftSnapshotBuilder, RaftTypeConfig, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};

use crate::error::StoreError;
use crate::format::{decode, decode_raw, encode, encode_raw, TREE_SNAPSHOT};

const KEY_SNAPSHOT_META: &str = "meta";
const KEY_SNAPSHOT_DATA: &str = "data";

/// An application's replicated model.
///
/// `apply` must be deterministic: it may only depend on the model and the
/// entry (no clocks, no randomness, no I/O), so every replica reaches the same
/// state. (A model may keep local observations beside the replicated state,
/// such as when it applied an entry, as long as they never feed back into
/// it and `encode` leaves them out.) Validation errors are part of the
/// response, never a panic.
pub trait StateModel<C: RaftTypeConfig>: Default + Send + Sync + 'static + Sized {
    /// Applies one application entry at `log_id` and returns its response.
    fn apply(&mut self, log_id: &LogId<C::NodeId>, data: &C::D) -> C::R;

    /// The response for an entry without application data (blank or
    /// membership entries), which openraft still expects one for.
    fn non_app_response(&mut self, log_id: &LogId<C::NodeId>) -> C::R;

    /// The format of the model's types inside log entries (the commands,
    /// `C::D`): the second byte of every stored entry, checked on load.
    /// Bump it whenever a command's encoding changes; a store written with
    /// another value is refused rather than misread.
    const FORMAT_VERSION: u8;

    /// Serialises the whole model for a snapshot.
    fn encode(&self) -> Result<Vec<u8>, String>;

    /// Restores a model from [`StateModel::encode`]'s output.
    fn decode(bytes: &[u8]) -> Result<Self, String>;
}

/// What has been applied: the model plus the Raft bookkeeping openraft needs.
#[derive(Debug, Default)]
pub struct Applied<C: RaftTypeConfig, M> {
    /// Id of the last applied entry.
    pub last_applied: Option<LogId<C::NodeId>>,
    /// Membership as of the last applied membership entry.
    pub membership: StoredMembership<C::NodeId, C::Node>,
    /// The application model.
    pub model: M,
}

/// Shared read access to the applied state, for the application's queries.
pub type SharedApplied<C, M> = Arc<RwLock<Applied<C, M>>>;

/// The state machine half of the store.
pub struct SledStateMachine<C: RaftTypeConfig, M> {
    db: DurableDb,
    snapshots: sled::Tree,
    state: SharedApplied<C, M>,
    snapshot_seq: u64,
    _c: PhantomData<C>,
}

type Meta<C> = SnapshotMeta<<C as RaftTypeConfig>::NodeId, <C as RaftTypeConfig>::Node>;

impl<C, M> SledStateMachine<C, M>
where
    C: RaftTypeConfig<Entry = Entry<C>, SnapshotData = Cursor<Vec<u8>>>,
    M: StateModel<C>,
{
    pub(crate) fn new(db: &DurableDb, dir: &Path) -> Result<Self, StoreError> {
        let sled_err = |source| StoreError::Sled {
            path: dir.display().to_string(),
            source,
        };
        let snapshots = db.open_tree(TREE_SNAPSHOT).map_err(sled_err)?;
        let mut applied = Applied::<C, M>::default();
        if let Some(meta_bytes) = snapshots.get(KEY_SNAPSHOT_META).map_err(sled_err)? {
            let meta: Meta<C> = decode(
                &meta_bytes,
                "snapshot meta",
                TREE_SNAPSHOT,
                &KEY_SNAPSHOT_META,
            )?;
            let data = snapshots
                .get(KEY_SNAPSHOT_DATA)
                .map_err(sled_err)?
                .ok_or_else(|| StoreError::Decode {
                    what: "snapshot data",
                    detail: "meta present but data missing".into(),
                })?;
            let data = decode_raw(&data, "snapshot data", TREE_SNAPSHOT, &KEY_SNAPSHOT_DATA)?;
            applied.model = M::decode(data).map_err(|detail| StoreError::Decode {
                what: "snapshot data",
                detail,
            })?;
            applied.last_applied = meta.last_log_id;
            applied.membership = meta.last_membership.clone();
        }
        Ok(Self {
            db: db.clone(),
            snapshots,
            state: Arc::new(RwLock::new(applied)),
            snapshot_seq: 0,
            _c: PhantomData,
        })
    }

    /// A handle for reading the applied state from elsewhere in the process.
    pub fn shared(&self) -> SharedApplied<C, M> {
        self.state.clone()
    }

    fn read_current(&self) -> Result<Option<Snapshot<C>>, StorageError<C::NodeId>> {
        let Some(meta_bytes) = self
            .snapshots
            .get(KEY_SNAPSHOT_META)
            .map_err(|e| StorageIOError::read_snapshot(None, &e))?
        else {
            return Ok(None);
        };
        let meta: Meta<C> = decode(
            &meta_bytes,
            "snapshot meta",
            TREE_SNAPSHOT,
            &KEY_SNAPSHOT_META,
        )
        .map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        let data = self
            .snapshots
            .get(KEY_SNAPSHOT_DATA)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?
            .ok_or_else(|| {
                StorageIOError::read_snapshot(
                    Some(meta.signature()),
                    &std::io::Error::other("snapshot data missing"),
                )
            })?;
        let data = decode_raw(&data, "snapshot data", TREE_SNAPSHOT, &KEY_SNAPSHOT_DATA)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data.to_vec())),
        }))
    }
}

/// Writes snapshot meta and data in one batch and flushes them.
async fn persist_snapshot<C: RaftTypeConfig>(
    db: &DurableDb,
    snapshots: &sled::Tree,
    meta: &Meta<C>,
    data: &[u8],
) -> Result<(), StorageError<C::NodeId>> {
    let sig = Some(meta.signature());
    let meta_bytes = encode(meta).map_err(|e| StorageIOError::write_snapshot(sig.clone(), &*e))?;
    let mut batch = sled::Batch::default();
    batch.insert(KEY_SNAPSHOT_META, meta_bytes);
    batch.insert(KEY_SNAPSHOT_DATA, encode_raw(data));
    snapshots
        .apply_batch(batch)
        .map_err(|e| StorageIOError::write_snapshot(sig.clone(), &e))?;
    db.flush_async()
        .await
        .map_err(|e| StorageIOError::write_snapshot(sig, &e))?;
    Ok(())
}

/// Applies committed entries to the applied state (both stores' apply).
pub(crate) fn apply_entries<C, M, I>(st: &mut Applied<C, M>, entries: I) -> Vec<C::R>
where
    C: RaftTypeConfig<Entry = Entry<C>>,
    M: StateModel<C>,
    I: IntoIterator<Item = C::Entry>,
{
    let mut out = Vec::new();
    for entry in entries {
        st.last_applied = Some(entry.log_id.clone());
        let resp = match &entry.payload {
            EntryPayload::Blank => st.model.non_app_response(&entry.log_id),
            EntryPayload::Normal(data) => st.model.apply(&entry.log_id, data),
            EntryPayload::Membership(m) => {
                st.membership = StoredMembership::new(Some(entry.log_id.clone()), m.clone());
                st.model.non_app_response(&entry.log_id)
            }
        };
        out.push(resp);
    }
    out
}

/// A snapshot's meta and the model's bytes.
pub(crate) type SnapshotParts<C> = (Meta<C>, Vec<u8>);

/// A snapshot of the applied state (meta and the model's bytes); `seq`
/// tells apart snapshots of the same log id.
pub(crate) fn snapshot_of<C, M>(
    state: &SharedApplied<C, M>,
    seq: u64,
) -> Result<SnapshotParts<C>, StorageError<C::NodeId>>
where
    C: RaftTypeConfig,
    M: StateModel<C>,
{
    let st = state.read().unwrap_or_else(|e| e.into_inner());
    let data = st
        .model
        .encode()
        .map_err(|e| StorageIOError::write_snapshot(None, &std::io::Error::other(e)))?;
    let snapshot_id = match st.last_applied {
        Some(ref l) => format!("{}-{}-{}", l.leader_id, l.index, seq),
        None => format!("none-{seq}"),
    };
    let meta = SnapshotMeta {
        last_log_id: st.last_applied.clone(),
        last_membership: st.membership.clone(),
        snapshot_id,
    };
    Ok((meta, data))
}

/// Builds snapshots from the shared applied state.
pub struct SledSnapshotBuilder<C: RaftTypeConfig, M> {
    db: DurableDb,
    snapshots: sled::Tree,
    state: SharedApplied<C, M>,
    seq: u64,
}

impl<C, M> RaftSnapshotBuilder<C> for SledSnapshotBuilder<C, M>
where
    C: RaftTypeConfig<Entry = Entry<C>, SnapshotData = Cursor<Vec<u8>>>,
    M: StateModel<C>,
{
    async fn build_snapshot(&mut self) -> Result<Snapshot<C>, StorageError<C::NodeId>> {
        let (meta, data) = snapshot_of(&self.state, self.seq)?;
        persist_snapshot::<C>(&self.db, &self.snapshots, &meta, &data).await?;
        tracing::info!(snapshot_id = %meta.snapshot_id, bytes = data.len(), "snapshot built");
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl<C, M> RaftStateMachine<C> for SledStateMachine<C, M>
where
    C: RaftTypeConfig<Entry = Entry<C>, SnapshotData = Cursor<Vec<u8>>>,
    M: StateModel<C>,
{
    type SnapshotBuilder = SledSnapshotBuilder<C, M>;

    async fn applied_state(
        &mut self,
    ) -> Result<
        (
            Option<LogId<C::NodeId>>,
            StoredMembership<C::NodeId, C::Node>,
        ),
        StorageError<C::NodeId>,
    > {
        let st = self.state.read().expect("state lock poisoned");
        Ok((st.last_applied.clone(), st.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<C::R>, StorageError<C::NodeId>>
    where
        I: IntoIterator<Item = C::Entry> + openraft::OptionalSend,
        I::IntoIter: openraft::OptionalSend,
    {
        let mut st = self.state.write().expect("state lock poisoned");
        Ok(apply_entries(&mut st, entries))
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.snapshot_seq += 1;
        SledSnapshotBuilder {
            db: self.db.clone(),
            snapshots: self.snapshots.clone(),
            state: self.state.clone(),
            seq: self.snapshot_seq,
        }
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<C::NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta<C>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<C::NodeId>> {
        let data = snapshot.into_inner();
        let model = M::decode(&data).map_err(|e| {
            StorageIOError::read_snapshot(Some(meta.signature()), &std::io::Error::other(e))
        })?;
        // Durable first, then visible.
        persist_snapshot::<C>(&self.db, &self.snapshots, meta, &data).await?;
        let mut st = self.state.write().expect("state lock poisoned");
        st.model = model;
        st.last_applied = meta.last_log_id.clone();
        st.membership = meta.last_membership.clone();
        tracing::info!(snapshot_id = %meta.snapshot_id, "snapshot installed");
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<C>>, StorageError<C::NodeId>> {
        self.read_current()
    }
}
