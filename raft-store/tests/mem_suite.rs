//! openraft's storage conformance `Suite`, every case, against the
//! in-memory store the simulation runs on.

// The helpers are shared with the sled tests; `fill` is theirs alone.
#[allow(dead_code)]
mod common;

use common::{log_id, put, KvModel, TestConfig};
use openraft::testing::{StoreBuilder, Suite};
use openraft::StorageError;
use raft_store::mem::{open_mem, MemLogStore, MemStateMachine, SharedDisk};

struct MemBuilder;

impl StoreBuilder<TestConfig, MemLogStore<TestConfig>, MemStateMachine<TestConfig, KvModel>, ()>
    for MemBuilder
{
    async fn build(
        &self,
    ) -> Result<
        (
            (),
            MemLogStore<TestConfig>,
            MemStateMachine<TestConfig, KvModel>,
        ),
        StorageError<u64>,
    > {
        let disk = SharedDisk::<TestConfig>::default();
        let (log, sm) = open_mem::<TestConfig, KvModel>(&disk).expect("open the in-memory store");
        Ok(((), log, sm))
    }
}

#[test]
fn openraft_storage_suite_all_cases_in_memory() {
    Suite::test_all(MemBuilder).expect("every Suite case passes");
}

/// A simulated crash: new stores on the same disk find the log, the vote,
/// the committed id and the snapshot, and the model rebuilt from the
/// snapshot (the tail is openraft's to re-apply).
#[test]
fn a_crash_keeps_the_disk_and_rebuilds_the_model_from_its_snapshot() {
    use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
    use openraft::{RaftLogReader, RaftSnapshotBuilder, Vote};
    let disk = SharedDisk::<TestConfig>::default();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (mut log, mut sm) = open_mem::<TestConfig, KvModel>(&disk).unwrap();
        log.blocking_append((1..=8).map(|i| put(1, i)))
            .await
            .unwrap();
        log.save_vote(&Vote::new_committed(1, 1)).await.unwrap();
        log.save_committed(Some(log_id(1, 8))).await.unwrap();
        let applied: Vec<_> = log.try_get_log_entries(1..=5).await.unwrap();
        sm.apply(applied).await.unwrap();
        let snap = sm
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        assert_eq!(snap.meta.last_log_id, Some(log_id(1, 5)));
        sm.apply(log.try_get_log_entries(6..=8).await.unwrap())
            .await
            .unwrap();
        drop((log, sm));
        let (mut log, mut sm) = open_mem::<TestConfig, KvModel>(&disk).unwrap();
        assert_eq!(
            log.get_log_state().await.unwrap().last_log_id,
            Some(log_id(1, 8))
        );
        assert_eq!(
            log.read_vote().await.unwrap(),
            Some(Vote::new_committed(1, 1))
        );
        assert_eq!(log.read_committed().await.unwrap(), Some(log_id(1, 8)));
        // The model is the snapshot's: 1..=5, not what was applied after.
        let (last, _) = sm.applied_state().await.unwrap();
        assert_eq!(last, Some(log_id(1, 5)));
        let model = sm.shared();
        let m = model.read().unwrap();
        assert_eq!(m.model.kv.len(), 5);
    });
}
