//! The execution journal: one JSON line per order the agent starts to
//! execute (not per repeat answered from the order log), appended and
//! synced before the work begins.
//!
//! It is the agent's audit trail of what it did, and the ground truth the
//! chaos suite's duplicate-action checker reads: an order id that appears
//! twice was executed twice. The file is bounded: past
//! [`MAX_JOURNAL_BYTES`] it is renamed to `<name>.1` (replacing the older
//! one) and a new file begins, so at most two files exist.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// File name inside the agent's data directory.
pub const JOURNAL_FILE: &str = "executed.jsonl";
/// Size at which the journal rotates.
pub const MAX_JOURNAL_BYTES: u64 = 8 << 20;

/// One executed order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    pub order_id: u64,
    /// The order's description (what was done).
    pub order: String,
    pub started_unix_ms: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The journal file could not be opened, written or read.
    #[error("execution journal {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A journal line is not a journal entry.
    #[error("execution journal {path} line {line}: {source}")]
    Parse {
        path: PathBuf,
        line: usize,
        source: serde_json::Error,
    },
}

struct Open {
    file: File,
    len: u64,
}

/// The journal of one agent.
pub struct Journal {
    path: PathBuf,
    max_bytes: u64,
    open: Mutex<Open>,
}

impl Journal {
    /// Opens (creating) the journal in `dir`.
    pub fn open(dir: &Path) -> Result<Journal, JournalError> {
        Self::open_with_limit(dir, MAX_JOURNAL_BYTES)
    }

    fn open_with_limit(dir: &Path, max_bytes: u64) -> Result<Journal, JournalError> {
        let path = dir.join(JOURNAL_FILE);
        let open = open_append(&path)?;
        Ok(Journal {
            path,
            max_bytes: max_bytes.max(1),
            open: Mutex::new(open),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `e` and syncs it to disk.
    pub fn record(&self, e: &JournalEntry) -> Result<(), JournalError> {
        let io = |source| JournalError::Io {
            path: self.path.clone(),
            source,
        };
        let mut line = serde_json::to_vec(e).expect("a journal entry serialises");
        line.push(b'\n');
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.len > 0 && open.len + line.len() as u64 > self.max_bytes {
            std::fs::rename(&self.path, rotated(&self.path)).map_err(io)?;
            *open = open_append(&self.path)?;
        }
        open.file.write_all(&line).map_err(io)?;
        open.file.sync_data().map_err(io)?;
        open.len += line.len() as u64;
        Ok(())
    }
}

fn rotated(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".1");
    PathBuf::from(s)
}

fn open_append(path: &Path) -> Result<Open, JournalError> {
    let io = |source| JournalError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    Ok(Open { file, len })
}

/// Every entry of the journal in `dir`, oldest first (the rotated file,
/// then the current one). A torn last line (a crash mid-append) is
/// skipped; any other bad line is an error.
pub fn read_journal(dir: &Path) -> Result<Vec<JournalEntry>, JournalError> {
    let current = dir.join(JOURNAL_FILE);
    let mut out = Vec::new();
    for path in [rotated(&current), current] {
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(JournalError::Io { path, source }),
        };
        let complete = text.ends_with('\n');
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if l.is_empty() {
                continue;
            }
            match serde_json::from_str(l) {
                Ok(e) => out.push(e),
                Err(_) if i + 1 == lines.len() && !complete => {}
                Err(source) => {
                    return Err(JournalError::Parse {
                        path,
                        line: i + 1,
                        source,
                    })
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u64) -> JournalEntry {
        JournalEntry {
            order_id: id,
            order: format!("migrate rail0 -> rail1 ({id})"),
            started_unix_ms: 1_700_000_000_000 + id,
        }
    }

    #[test]
    fn entries_survive_reopening_in_order() {
        let d = tempfile::tempdir().unwrap();
        let j = Journal::open(d.path()).unwrap();
        j.record(&entry(1)).unwrap();
        j.record(&entry(2)).unwrap();
        drop(j);
        let j = Journal::open(d.path()).unwrap();
        j.record(&entry(3)).unwrap();
        let ids: Vec<u64> = read_journal(d.path())
            .unwrap()
            .iter()
            .map(|e| e.order_id)
            .collect();
        assert_eq!(ids, [1, 2, 3]);
    }

    #[test]
    fn rotation_keeps_two_files_and_the_newest_entries() {
        let d = tempfile::tempdir().unwrap();
        let one = serde_json::to_vec(&entry(10)).unwrap().len() as u64 + 1;
        // Room for three entries per file.
        let j = Journal::open_with_limit(d.path(), 3 * one + 2).unwrap();
        for id in 10..20 {
            j.record(&entry(id)).unwrap();
        }
        let files = std::fs::read_dir(d.path()).unwrap().count();
        assert_eq!(files, 2, "current and one rotated file");
        let ids: Vec<u64> = read_journal(d.path())
            .unwrap()
            .iter()
            .map(|e| e.order_id)
            .collect();
        // 10..20 in files of three: [16,17,18] rotated, [19] current.
        assert_eq!(ids, [16, 17, 18, 19]);
    }

    #[test]
    fn a_torn_last_line_is_skipped_and_a_bad_middle_line_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        let j = Journal::open(d.path()).unwrap();
        j.record(&entry(1)).unwrap();
        drop(j);
        let p = d.path().join(JOURNAL_FILE);
        let mut f = OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"{\"order_id\":2,\"ord").unwrap();
        assert_eq!(read_journal(d.path()).unwrap(), vec![entry(1)]);
        f.write_all(b"\n").unwrap();
        let j = Journal::open(d.path()).unwrap();
        j.record(&entry(3)).unwrap();
        let e = read_journal(d.path()).unwrap_err();
        assert!(matches!(e, JournalError::Parse { line: 2, .. }), "{e}");
    }
}
