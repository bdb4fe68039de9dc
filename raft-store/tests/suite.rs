//! openraft's storage conformance `Suite`, every case, against the sled store.
//!
//! Each case gets a fresh sled database in its own temporary directory; the
//! directory guard is returned to the Suite so it outlives the case.

mod common;

use common::{fill, log_id, KvModel, TestConfig};
use openraft::testing::{StoreBuilder, Suite};
use openraft::StorageError;
use raft_store::{SledLogStore, SledStateMachine};

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

/// Log, vote, purge marker, applied model and snapshot all come back after
/// the store is closed and reopened on the same directory.
#[test]
fn reopen_restores_log_vote_purge_and_snapshot() {
    use openraft::storage::{RaftLogStorage, RaftStateMachine};
    use openraft::{RaftLogReader, Vote};
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let snapshot_through = rt.block_on(fill(dir.path(), 3));
    assert_eq!(snapshot_through, Some(log_id(1, 6)));
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
