//! openraft's storage conformance `Suite`, every case, against the sled store.
//!
//! Each case gets a fresh sled database in its own temporary directory; the
//! directory guard is returned to the Suite so it outlives the case.

use std::io::Cursor;

use openraft::testing::{StoreBuilder, Suite};
use openraft::{LogId, StorageError};
use raft_store::{SledLogStore, SledStateMachine, StateModel};
use serde::{Deserialize, Serialize};

/// Application data for the Suite's type config: a key/value write.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Put {
    key: String,
    value: String,
}

openraft::declare_raft_types!(
    pub TestConfig:
        D = Put,
        R = Option<String>,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TestConfig>,
        SnapshotData = Cursor<Vec<u8>>,
);

/// A tiny key/value model: applies `Put` and returns the previous value.
#[derive(Debug, Default, Serialize, Deserialize)]
struct KvModel {
    kv: std::collections::BTreeMap<String, String>,
}

impl StateModel<TestConfig> for KvModel {
    fn apply(&mut self, _log_id: &LogId<u64>, data: &Put) -> Option<String> {
        self.kv.insert(data.key.clone(), data.value.clone())
    }
    fn non_app_response(&mut self, _log_id: &LogId<u64>) -> Option<String> {
        None
    }
    fn encode(&self) -> Result<Vec<u8>, String> {
        serde_json::to_vec(self).map_err(|e| e.to_string())
    }
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }
}

struct SledBuilder;

impl
    StoreBuilder<
        TestConfig,
        SledLogStore<TestConfig>,
        SledStateMachine<TestConfig, KvModel>,
        tempfile::TempDir,
    > for SledBuilder
{
    async fn build(
        &self,
    ) -> Result<
        (
            tempfile::TempDir,
            SledLogStore<TestConfig>,
            SledStateMachine<TestConfig, KvModel>,
        ),
        StorageError<u64>,
    > {
        let dir = tempfile::tempdir().expect("tempdir");
        let (log, sm) = raft_store::open::<TestConfig, KvModel>(dir.path()).expect("open store");
        Ok((dir, log, sm))
    }
}

#[test]
fn openraft_storage_suite_all_cases() {
    Suite::test_all(SledBuilder).expect("every Suite case passes");
}

fn log_id(term: u64, index: u64) -> LogId<u64> {
    LogId::new(openraft::CommittedLeaderId::new(term, 1), index)
}

fn put(term: u64, index: u64) -> openraft::Entry<TestConfig> {
    openraft::Entry {
        log_id: log_id(term, index),
        payload: openraft::EntryPayload::Normal(Put {
            key: format!("k{index}"),
            value: format!("v{index}"),
        }),
    }
}

/// Log, vote, purge marker, applied model and snapshot all come back after
/// the store is closed and reopened on the same directory.
#[test]
fn reopen_restores_log_vote_purge_and_snapshot() {
    use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
    use openraft::{RaftLogReader, RaftSnapshotBuilder, Vote};
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (mut log, mut sm) = raft_store::open::<TestConfig, KvModel>(dir.path()).unwrap();
        log.blocking_append((1..=10).map(|i| put(1, i)))
            .await
            .unwrap();
        log.save_vote(&Vote::new_committed(1, 1)).await.unwrap();
        log.save_committed(Some(log_id(1, 10))).await.unwrap();
        sm.apply((1..=6).map(|i| put(1, i))).await.unwrap();
        let snap = sm
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        assert_eq!(snap.meta.last_log_id, Some(log_id(1, 6)));
        log.purge(log_id(1, 3)).await.unwrap();
    });
    rt.block_on(async {
        let (mut log, mut sm) = raft_store::open::<TestConfig, KvModel>(dir.path()).unwrap();
        let st = log.get_log_state().await.unwrap();
        assert_eq!(st.last_log_id, Some(log_id(1, 10)));
        assert_eq!(st.last_purged_log_id, Some(log_id(1, 3)));
        let entries = log.try_get_log_entries(0..100).await.unwrap();
        assert_eq!(
            entries.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
            (4..=10).collect::<Vec<_>>()
        );
        assert_eq!(
            log.read_vote().await.unwrap(),
            Some(Vote::new_committed(1, 1))
        );
        assert_eq!(log.read_committed().await.unwrap(), Some(log_id(1, 10)));
        let (applied, _) = sm.applied_state().await.unwrap();
        assert_eq!(
            applied,
            Some(log_id(1, 6)),
            "model restored from the snapshot"
        );
        let shared = sm.shared();
        assert_eq!(
            shared
                .read()
                .unwrap()
                .model
                .kv
                .get("k6")
                .map(String::as_str),
            Some("v6")
        );
        assert!(sm.get_current_snapshot().await.unwrap().is_some());
    });
}
