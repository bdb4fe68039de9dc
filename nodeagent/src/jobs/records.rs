//! Rank records, durable in the tree `job_ranks` of the agent's database:
//! every launched rank from before its start is answered until its exit is
//! in the outbox, so a restarted agent finds (and reports) the ranks an
//! earlier run left.

use durable_sled::DurableDb;
use serde::{Deserialize, Serialize};

use crate::store_format::{self, FormatError};

use super::model::{RankKey, RANK_TREE};

/// The format of the `job_ranks` records (bincode [`RankRecord`]).
pub(crate) const RANK_FORMAT: u32 = 1;

/// A launched rank, durable until its exit is in the outbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RankRecord {
    pub(crate) job: String,
    pub(crate) incarnation: u64,
    pub(crate) rank: u32,
    pub(crate) pid: u32,
    /// Field 22 of `/proc/<pid>/stat` (clock ticks since boot).
    pub(crate) start_time: u64,
}

impl RankRecord {
    /// The rank this record is of.
    pub(crate) fn rank_key(&self) -> RankKey {
        RankKey {
            job: self.job.clone(),
            incarnation: self.incarnation,
            rank: self.rank,
        }
    }
}

/// The tree key of a rank: job, NUL, incarnation and rank big-endian.
fn record_key(k: &RankKey) -> Vec<u8> {
    let mut v = k.job.as_bytes().to_vec();
    v.push(0);
    v.extend_from_slice(&k.incarnation.to_be_bytes());
    v.extend_from_slice(&k.rank.to_be_bytes());
    v
}

/// The `job_ranks` tree.
#[derive(Clone)]
pub(crate) struct RankStore {
    db: DurableDb,
    tree: sled::Tree,
}

impl RankStore {
    /// Opens the tree in the agent's database (at `path`), checking its
    /// format ([`RANK_FORMAT`]; a tree written before formats were kept is
    /// that format and is stamped now).
    pub(crate) fn open(db: &DurableDb, path: &str) -> Result<RankStore, FormatError> {
        let tree = db
            .open_tree(RANK_TREE)
            .map_err(|source| FormatError::Sled {
                path: path.to_owned(),
                tree: RANK_TREE.to_owned(),
                source,
            })?;
        store_format::open(db, path, &tree, RANK_FORMAT, &[RANK_FORMAT])?;
        store_format::stamp(db, path, &tree, RANK_FORMAT)?;
        Ok(RankStore {
            db: db.clone(),
            tree,
        })
    }

    /// Every record; an unreadable one is logged and removed.
    pub(crate) fn load(&self) -> Result<Vec<RankRecord>, sled::Error> {
        let mut found = Vec::new();
        for kv in self.tree.iter() {
            let (k, v) = kv?;
            match bincode::deserialize::<RankRecord>(&v) {
                Ok(r) => found.push(r),
                Err(e) => {
                    tracing::warn!(error = %e, "unreadable rank record; forgetting it");
                    self.tree.remove(k)?;
                }
            }
        }
        Ok(found)
    }

    /// Stores a record durably (flushed).
    pub(crate) async fn insert(&self, rec: &RankRecord) -> Result<(), String> {
        let b = bincode::serialize(rec).map_err(|e| e.to_string())?;
        self.tree
            .insert(record_key(&rec.rank_key()), b)
            .map_err(|e| e.to_string())?;
        self.db.flush_async().await.map_err(|e| e.to_string())?;
        Ok(())
    }

    /// No record stored.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.tree.is_empty()
    }

    /// Removes the record of `key` (flushed with the next write).
    pub(crate) fn remove(&self, key: &RankKey) -> Result<(), sled::Error> {
        self.tree.remove(record_key(key)).map(|_| ())
    }
}
