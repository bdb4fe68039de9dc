//! Exclusive ownership of a data directory.
//!
//! A supervisor holds an `flock` on `<data_dir>/LOCK` for its whole life; a
//! second process pointed at the same directory gets a clear error naming
//! the holder instead of two processes corrupting one Raft log. The kernel
//! drops the lock when the process dies, even on SIGKILL.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// Why the data directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    /// The directory cannot be created.
    #[error("cannot create data directory {path}: {source}")]
    Create {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// Another process holds the lock.
    #[error("data directory {path} is in use by another process (pid {holder}); stop it or pass a different --data-dir")]
    InUse { path: String, holder: String },
    /// The lock file cannot be opened or locked.
    #[error("cannot lock data directory {path}: {source}")]
    Lock {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// The held lock; released when dropped or when the process exits.
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
    pub path: PathBuf,
}

/// Creates `dir` if needed and takes its exclusive lock.
pub fn lock(dir: &Path) -> Result<DataDirLock, DataDirError> {
    std::fs::create_dir_all(dir).map_err(|source| DataDirError::Create {
        path: dir.display().to_string(),
        source,
    })?;
    let path = dir.join("LOCK");
    let lock_err = |source| DataDirError::Lock {
        path: dir.display().to_string(),
        source,
    };
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(lock_err)?;
    // SAFETY: flock on a file descriptor we own; no memory is shared.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            return Err(DataDirError::InUse {
                path: dir.display().to_string(),
                holder: if holder.is_empty() {
                    "unknown".into()
                } else {
                    holder.into()
                },
            });
        }
        return Err(lock_err(err));
    }
    file.set_len(0).map_err(lock_err)?;
    file.seek(SeekFrom::Start(0)).map_err(lock_err)?;
    write!(file, "{}", std::process::id()).map_err(lock_err)?;
    file.sync_all().map_err(lock_err)?;
    Ok(DataDirLock { _file: file, path })
}

#[cfg(test)]
mod tests {
    #[test]
    fn second_lock_on_same_dir_is_refused_with_holder() {
        let dir = tempfile::tempdir().unwrap();
        let held = super::lock(dir.path()).unwrap();
        let err = super::lock(dir.path()).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("in use"), "{msg}");
        assert!(msg.contains(&std::process::id().to_string()), "{msg}");
        drop(held);
        super::lock(dir.path()).expect("lock is free after drop");
    }
}
