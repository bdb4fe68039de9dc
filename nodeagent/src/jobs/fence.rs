//! Job fences, durable in the tree `job_fences` of the agent's database:
//! per job the highest incarnation seen and the highest one a `StopJob`
//! covered. The launcher decides with them (stale incarnations are
//! refused); this module only stores them, bounded by [`MAX_FENCES`].

use durable_sled::DurableDb;
use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::store_format::{self, FormatError};

use super::model::{FENCE_TREE, MAX_FENCES};

/// The format of the `job_fences` records (bincode [`Fence`]).
pub(crate) const FENCE_FORMAT: u32 = 1;
use crate::link::unix_ns;

/// Per job, durable.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Fence {
    /// The highest incarnation of the job seen here.
    pub(crate) highest: u64,
    /// The highest incarnation a stop order covered.
    pub(crate) stopped_through: Option<u64>,
    /// When it last changed (the least recently changed idle fence is
    /// forgotten first).
    pub(crate) updated_unix_ms: u64,
}

/// The `job_fences` tree.
#[derive(Clone)]
pub(crate) struct FenceStore {
    db: DurableDb,
    tree: sled::Tree,
}

impl FenceStore {
    /// Opens the tree in the agent's database (at `path`), checking its
    /// format ([`FENCE_FORMAT`]; a tree written before formats were kept is
    /// that format and is stamped now).
    pub(crate) fn open(db: &DurableDb, path: &str) -> Result<FenceStore, FormatError> {
        let tree = db
            .open_tree(FENCE_TREE)
            .map_err(|source| FormatError::Sled {
                path: path.to_owned(),
                tree: FENCE_TREE.to_owned(),
                source,
            })?;
        store_format::open(db, path, &tree, FENCE_FORMAT, &[FENCE_FORMAT])?;
        store_format::stamp(db, path, &tree, FENCE_FORMAT)?;
        Ok(FenceStore {
            db: db.clone(),
            tree,
        })
    }

    /// The fence of `job` (the default when none is stored).
    pub(crate) fn get(&self, job: &str) -> Result<Fence, String> {
        match self.tree.get(job.as_bytes()) {
            Ok(Some(b)) => bincode::deserialize(&b).map_err(|e| format!("fence of {job}: {e}")),
            Ok(None) => Ok(Fence::default()),
            Err(e) => Err(format!("cannot read the fence of job {job}: {e}")),
        }
    }

    /// Stores `f` for `job` durably (stamped now); beyond [`MAX_FENCES`]
    /// forgets the least recently updated fence of a job other than `job`
    /// and not in `busy()` (the jobs with ranks here).
    pub(crate) async fn save(
        &self,
        job: &str,
        mut f: Fence,
        busy: impl FnOnce() -> HashSet<String>,
    ) -> Result<(), String> {
        f.updated_unix_ms = unix_ns() / 1_000_000;
        let b = bincode::serialize(&f).map_err(|e| e.to_string())?;
        let store = |e: sled::Error| format!("cannot store the fence of job {job}: {e}");
        self.tree.insert(job.as_bytes(), b).map_err(store)?;
        if self.tree.len() > MAX_FENCES {
            self.evict(job, &busy());
        }
        self.db.flush_async().await.map_err(store)?;
        Ok(())
    }

    /// Forgets the least recently updated fence of a job with nothing here.
    fn evict(&self, keep: &str, busy: &HashSet<String>) {
        let mut oldest: Option<(u64, sled::IVec)> = None;
        for (k, v) in self.tree.iter().flatten() {
            let name = String::from_utf8_lossy(&k);
            if name == keep || busy.contains(name.as_ref()) {
                continue;
            }
            let at = bincode::deserialize::<Fence>(&v).map_or(0, |f| f.updated_unix_ms);
            if oldest.as_ref().is_none_or(|(t, _)| at < *t) {
                oldest = Some((at, k));
            }
        }
        if let Some((_, k)) = oldest {
            tracing::info!(job = %String::from_utf8_lossy(&k), "forgetting the fence of an idle job (too many jobs)");
            let _ = self.tree.remove(k);
        }
    }
}
