//! sled databases whose flush survives a crash of the machine, not only
//! of the process.
//!
//! sled 0.34 ends its flush with `sync_file_range` on Linux. That writes
//! the data pages but commits no filesystem metadata: when the log file
//! grew or its blocks were only now allocated (ext4's delayed
//! allocation), the new size and extents sit in the filesystem's journal
//! until its next commit (up to 5 s on ext4). A power cut, a kernel crash
//! or an ext4 error that aborts the journal in that window loses writes
//! sled reported flushed. Values over sled's blob threshold go to files
//! under `blobs/` that sled never syncs at all. A process killed with
//! SIGKILL loses nothing (the page cache survives it), which is why only a
//! real disk fault shows this: `scenario disk-faults` turned a
//! supervisor's ext4 read-only under load, and after the repair its Raft
//! log had lost acknowledged entries, so a committed write vanished once
//! it led again.
//!
//! [`DurableDb`] wraps a [`sled::Db`] (and derefs to it) with a `flush`
//! and `flush_async` that, after sled's own, `fdatasync` the data file,
//! every blob file not synced before (or grown since: sled may still be
//! writing one) and, when one was new, the blob directory. The database
//! directory and its parent are synced once at open (the data file's and
//! the directory's own entries). After a failed sync every later flush
//! fails too (Linux may forget a write error once it reported it). Callers
//! keep calling `flush_async` as before.
//!
//! Not covered: sled's background flusher may make a log record that
//! points to a new blob durable before the blob itself is synced; a crash
//! in between leaves a value sled cannot read (one that was never
//! acknowledged, but the store may then refuse to open). Keeping values
//! under sled's blob size would close it.
//!
//! **Invariant:** when `flush` or `flush_async` returns `Ok`, everything
//! written before the call is on stable storage, metadata included.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A sled database with a durable flush. Cloning is cheap.
#[derive(Clone)]
pub struct DurableDb {
    db: sled::Db,
    files: Arc<Files>,
}

/// What is synced after sled's flush.
struct Files {
    dir: PathBuf,
    /// sled's data file, opened read-only: `fdatasync` works on any
    /// descriptor of the file.
    data: File,
    /// Blob files already synced, with the length synced: sled writes a
    /// blob in several calls while its insert runs, so a sync may catch
    /// one half-written; a longer file is synced again.
    synced_blobs: Mutex<HashMap<OsString, u64>>,
    /// A sync failed once. Linux may clear a failed write's error after
    /// reporting it, so a later sync could succeed over lost data: from
    /// the first failure on, every flush fails.
    failed: AtomicBool,
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl Files {
    fn open(dir: &Path) -> io::Result<Files> {
        let data = File::open(dir.join("db"))?;
        // The data file's and the blob directory's entries, and the
        // database directory's own (it may have just been created).
        sync_dir(dir)?;
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
        let blobs = dir.join("blobs");
        if blobs.is_dir() {
            sync_dir(&blobs)?;
        }
        let files = Files {
            dir: dir.to_path_buf(),
            data,
            synced_blobs: Mutex::new(HashMap::new()),
            failed: AtomicBool::new(false),
        };
        // Blobs written by an earlier run may never have been synced.
        files.sync()?;
        Ok(files)
    }

    /// Syncs the data file and every blob not synced yet (or grown since);
    /// fails for good after a first failure.
    fn sync(&self) -> io::Result<()> {
        if self.failed.load(Ordering::Acquire) {
            return Err(io::Error::other(
                "an earlier sync of this database failed; restart once the disk is sound",
            ));
        }
        let r = self.sync_all();
        if r.is_err() {
            self.failed.store(true, Ordering::Release);
        }
        r
    }

    fn sync_all(&self) -> io::Result<()> {
        self.data.sync_data()?;
        let blobs = self.dir.join("blobs");
        let entries = match std::fs::read_dir(&blobs) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut synced = self.synced_blobs.lock().unwrap_or_else(|e| e.into_inner());
        let mut present = HashMap::new();
        let mut new = false;
        for e in entries {
            let e = e?;
            let name = e.file_name();
            let f = match File::open(e.path()) {
                Ok(f) => f,
                // Collected by sled since the listing.
                Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
                Err(err) => return Err(err),
            };
            // The length before the sync: what is written after it is
            // synced next time.
            let len = f.metadata()?.len();
            if synced.get(&name) != Some(&len) {
                f.sync_data()?;
                new = true;
            }
            present.insert(name, len);
        }
        if new {
            sync_dir(&blobs)?;
        }
        // Forget blobs sled has removed, so the set stays bounded.
        *synced = present;
        Ok(())
    }
}

impl DurableDb {
    /// Opens the database `config` describes; `config` must have a path
    /// (not `temporary`).
    pub fn open(config: sled::Config, dir: &Path) -> sled::Result<DurableDb> {
        let db = config.path(dir).open()?;
        let files = Files::open(dir).map_err(sled::Error::Io)?;
        Ok(DurableDb {
            db,
            files: Arc::new(files),
        })
    }

    /// Opens the database in `dir` with sled's defaults.
    pub fn open_path(dir: &Path) -> sled::Result<DurableDb> {
        Self::open(sled::Config::new(), dir)
    }

    /// The sled database.
    pub fn db(&self) -> &sled::Db {
        &self.db
    }

    /// sled's flush, then the syncs; blocks. Returns the bytes sled
    /// flushed.
    pub fn flush(&self) -> sled::Result<usize> {
        let n = self.db.flush()?;
        self.files.sync().map_err(sled::Error::Io)?;
        Ok(n)
    }

    /// [`Self::flush`] on tokio's blocking pool: sled's flush and the syncs
    /// in one hand-off. (sled's own `flush_async` runs its flush on sled's
    /// thread pool, whose every job wakes all of its idle threads; then
    /// the syncs needed a second hand-off.)
    pub async fn flush_async(&self) -> sled::Result<usize> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.flush())
            .await
            .map_err(|e| sled::Error::Io(io::Error::other(e)))?
    }
}

impl Deref for DurableDb {
    type Target = sled::Db;

    fn deref(&self) -> &sled::Db {
        &self.db
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_values_land_in_synced_blobs_and_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let db = DurableDb::open_path(dir.path()).unwrap();
        db.insert(b"small", b"v".to_vec()).unwrap();
        // Far over sled's blob threshold.
        db.insert(b"big", vec![7u8; 4 << 20]).unwrap();
        db.flush().unwrap();
        let blobs = db.files.synced_blobs.lock().unwrap().len();
        assert!(blobs >= 1, "the big value went to a blob and was synced");
        assert!(db
            .files
            .synced_blobs
            .lock()
            .unwrap()
            .values()
            .all(|&l| l > 4 << 20));
        // A blob sled removed is forgotten at the next sync.
        db.remove(b"big").unwrap();
        db.flush().unwrap();
        drop(db);
        let db = DurableDb::open_path(dir.path()).unwrap();
        assert_eq!(db.get(b"small").unwrap().unwrap().as_ref(), b"v");
        assert!(db.get(b"big").unwrap().is_none());
    }

    #[tokio::test]
    async fn flush_async_syncs_too() {
        let dir = tempfile::tempdir().unwrap();
        let db = DurableDb::open_path(dir.path()).unwrap();
        db.insert(b"k", vec![1u8; 2 << 20]).unwrap();
        db.flush_async().await.unwrap();
        assert!(!db.files.synced_blobs.lock().unwrap().is_empty());
    }

    #[test]
    fn after_a_failed_sync_every_flush_fails() {
        let dir = tempfile::tempdir().unwrap();
        let db = DurableDb::open_path(dir.path()).unwrap();
        db.insert(b"k", b"v".to_vec()).unwrap();
        db.flush().unwrap();
        // As if an fdatasync had failed once.
        db.files.failed.store(true, Ordering::Release);
        let e = db.flush().unwrap_err();
        assert!(e.to_string().contains("earlier sync"), "{e}");
    }

    #[test]
    fn a_missing_directory_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, b"x").unwrap();
        assert!(DurableDb::open_path(&file.join("db")).is_err());
    }
}
