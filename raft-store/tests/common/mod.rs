//! The test fixture of raft-store's integration tests: a type config with
//! key/value writes, its model, and log-entry builders.

use std::io::Cursor;

use openraft::LogId;
use raft_store::StateModel;
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
pub struct KvModel {
    pub kv: std::collections::BTreeMap<String, String>,
}

/// The test model's format byte in log entries.
pub const KV_FORMAT: u8 = 7;

impl StateModel<TestConfig> for KvModel {
    const FORMAT_VERSION: u8 = KV_FORMAT;

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

pub fn log_id(term: u64, index: u64) -> LogId<u64> {
    LogId::new(openraft::CommittedLeaderId::new(term, 1), index)
}

pub fn put(term: u64, index: u64) -> openraft::Entry<TestConfig> {
    openraft::Entry {
        log_id: log_id(term, index),
        payload: openraft::EntryPayload::Normal(Put {
            key: format!("k{index}"),
            value: format!("v{index}"),
        }),
    }
}

/// Opens a store in `dir` and fills it: entries 1..=10 of term 1, a
/// committed vote, committed id 10, entries 1..=6 applied and snapshotted,
/// the log purged through `purge`; closes it again. Returns the snapshot's
/// last log id.
pub async fn fill(dir: &std::path::Path, purge: u64) -> Option<LogId<u64>> {
    use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
    use openraft::{RaftSnapshotBuilder, Vote};
    let (mut log, mut sm) = raft_store::open::<TestConfig, KvModel>(dir).unwrap();
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
    log.purge(log_id(1, purge)).await.unwrap();
    snap.meta.last_log_id
}
