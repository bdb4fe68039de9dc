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
