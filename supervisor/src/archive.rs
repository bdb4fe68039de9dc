//! The audit archive: every supervisor appends the cluster's event log and
//! admin history to JSON-lines files in its own data directory before the
//! replicated model's bounded logs (10,000 entries each) roll them out.
//!
//! The model keeps only the newest entries, so snapshots stay small; the
//! archive keeps the trail. A pass every [`ARCHIVE_EVERY`] copies what is
//! new since its cursor (event sequence numbers, history log indexes) out of
//! the state under its read lock ([`Batch::collect`]), then writes it
//! outside the lock ([`Archiver::write`]): the lines first (synced), the
//! cursor after them, so a crash in between repeats lines and never skips
//! any (the `seq` and `log_index` fields tell repeats apart).
//!
//! What rolled out before a pass saw it (a flood of more than 10,000
//! entries within one interval, or a supervisor that joined late) is not
//! silently missing: a `gap` line records the exact range of event
//! sequence numbers, or the history log indexes between which records may
//! be missing, and a warning is logged. Files rotate at
//! [`FILE_BYTES`]; at most [`FILES_KEPT`] rotated files per log are kept,
//! and deleting the oldest is logged with its name.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::model::limits::MAX_ADMIN_HISTORY;
use crate::model::{AdminRecord, ClusterEvent, ClusterState};

/// How often a supervisor archives what is new.
pub const ARCHIVE_EVERY: Duration = Duration::from_millis(250);
/// A log file is rotated once it reaches this size.
pub const FILE_BYTES: u64 = 64 << 20;
/// Rotated files kept per log (with the current one: 1 GiB per log at most).
pub const FILES_KEPT: usize = 15;

const CURSOR: &str = "cursor.json";
/// A failing archive warns at most this often.
const WARN_EVERY: Duration = Duration::from_secs(30);

/// Errors of the archive (its directory or files).
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// A file or directory of the archive could not be read or written.
    #[error("archive {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// An entry could not be written as JSON.
    #[error("archive {path}: cannot encode an entry: {source}")]
    Encode {
        path: PathBuf,
        source: serde_json::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ArchiveError + '_ {
    move |source| ArchiveError::Io {
        path: path.to_owned(),
        source,
    }
}

/// How far each log has been archived.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    /// The last event sequence number written.
    pub events_seq: u64,
    /// The log index of the last admin record written.
    pub history_index: u64,
}

/// What a pass found new in the state.
#[derive(Debug, Default)]
pub struct Batch {
    events: Vec<ClusterEvent>,
    /// Event sequence numbers that rolled out unarchived (first, last).
    events_lost: Option<(u64, u64)>,
    history: Vec<AdminRecord>,
    /// Records between these log indexes may have rolled out unarchived.
    history_gap: Option<(u64, u64)>,
}

impl Batch {
    /// Copies what `st` holds beyond `cursor` (call under the read lock;
    /// linear in what is new). A state behind the cursor (a restarted
    /// supervisor still replaying its log) has nothing new.
    pub fn collect(cursor: Cursor, st: &ClusterState) -> Batch {
        let mut b = Batch::default();
        let from = cursor.events_seq;
        if let Some(first) = st.events.front() {
            if first.seq > from.saturating_add(1) {
                b.events_lost = Some((from + 1, first.seq - 1));
            }
        }
        // Sequence numbers are consecutive: skip straight to the new ones.
        let skip = st
            .events
            .front()
            .map_or(0, |f| from.saturating_sub(f.seq - 1) as usize);
        b.events = st.events.iter().skip(skip).cloned().collect();

        let after = cursor.history_index;
        let new_from = st.admin_history.partition_point(|r| r.log_index <= after);
        if let Some(first) = st.admin_history.front() {
            // A full history whose oldest record is past the cursor may have
            // dropped records in between (one log entry may hold several
            // records, so even those of `first`'s own index).
            if st.admin_history.len() >= MAX_ADMIN_HISTORY && first.log_index > after {
                b.history_gap = Some((after, first.log_index));
            }
        }
        b.history = st.admin_history.iter().skip(new_from).cloned().collect();
        b
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
            && self.history.is_empty()
            && self.events_lost.is_none()
            && self.history_gap.is_none()
    }
}

/// What one write archived.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Written {
    pub events: usize,
    pub history: usize,
    /// Events that rolled out before they could be archived.
    pub events_lost: u64,
    /// Whether history records may have rolled out unarchived.
    pub history_gap: bool,
}

/// One supervisor's archive directory.
#[derive(Debug)]
pub struct Archiver {
    dir: PathBuf,
    cursor: Cursor,
    file_bytes: u64,
    files_kept: usize,
    /// An append failed and its partial line could not be truncated: cut
    /// it before the next append.
    torn: bool,
}

#[derive(Serialize)]
struct GapLine<'a> {
    gap: Gap<'a>,
}

#[derive(Serialize)]
struct Gap<'a> {
    /// First and last missing event sequence numbers.
    #[serde(skip_serializing_if = "Option::is_none")]
    events: Option<(u64, u64)>,
    /// Records after the first and before the second log index may be
    /// missing.
    #[serde(skip_serializing_if = "Option::is_none")]
    history_between: Option<(u64, u64)>,
    why: &'a str,
}

impl Archiver {
    /// Opens (creating) the archive in `dir` and reads its cursor. A cursor
    /// file that cannot be parsed is reported and archiving starts again
    /// from what the state holds (lines may repeat; nothing is skipped).
    pub fn open(dir: &Path) -> Result<Archiver, ArchiveError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        for log in ["events", "history"] {
            cut_partial_line(&dir.join(format!("{log}.jsonl")))?;
        }
        let path = dir.join(CURSOR);
        let cursor = match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice::<Cursor>(&bytes) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e,
                        "archive cursor unreadable: archiving again what the state holds");
                    Cursor::default()
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Cursor::default(),
            Err(e) => return Err(io(&path)(e)),
        };
        Ok(Archiver {
            dir: dir.to_owned(),
            cursor,
            file_bytes: FILE_BYTES,
            files_kept: FILES_KEPT,
            torn: false,
        })
    }

    /// Smaller files and fewer of them (tests).
    pub fn with_limits(mut self, file_bytes: u64, files_kept: usize) -> Archiver {
        self.file_bytes = file_bytes;
        self.files_kept = files_kept;
        self
    }

    pub fn cursor(&self) -> Cursor {
        self.cursor
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Appends `batch`, each log's lines synced and its cursor saved
    /// before the next log (a log that keeps failing never makes the other
    /// repeat its lines).
    pub fn write(&mut self, batch: &Batch) -> Result<Written, ArchiveError> {
        let mut done = Written::default();
        if batch.is_empty() {
            return Ok(done);
        }
        let mut cursor = self.cursor;
        let mut lines = Vec::new();
        if let Some((first, last)) = batch.events_lost {
            tracing::warn!(
                first,
                last,
                lost = last - first + 1,
                "events rolled out of the replicated log before they were archived"
            );
            encode(&mut lines, &self.dir, &GapLine {
                gap: Gap {
                    events: Some((first, last)),
                    history_between: None,
                    why: "rolled out of the replicated event log before this supervisor archived them",
                },
            })?;
            done.events_lost = last - first + 1;
        }
        for e in &batch.events {
            encode(&mut lines, &self.dir, e)?;
            cursor.events_seq = e.seq;
        }
        done.events = batch.events.len();
        self.commit("events", &lines, cursor)?;

        lines.clear();
        if let Some((after, before)) = batch.history_gap {
            tracing::warn!(
                after,
                before,
                "admin history records may have rolled out before they were archived"
            );
            encode(&mut lines, &self.dir, &GapLine {
                gap: Gap {
                    events: None,
                    history_between: Some((after, before)),
                    why: "the replicated admin history was full: records between these log indexes may have rolled out before this supervisor archived them",
                },
            })?;
            done.history_gap = true;
        }
        for r in &batch.history {
            encode(&mut lines, &self.dir, r)?;
            cursor.history_index = r.log_index;
        }
        done.history = batch.history.len();
        self.commit("history", &lines, cursor)?;
        Ok(done)
    }

    /// Appends `lines` to `<log>.jsonl`, then saves `cursor` (which has
    /// moved past them) and keeps it: nothing to write, nothing moves.
    fn commit(&mut self, log: &str, lines: &[u8], cursor: Cursor) -> Result<(), ArchiveError> {
        if lines.is_empty() {
            return Ok(());
        }
        self.append(log, lines)?;
        self.save_cursor(cursor)?;
        self.cursor = cursor;
        Ok(())
    }

    /// Appends `lines` to `<log>.jsonl` (synced), rotating it first when
    /// it is full.
    fn append(&mut self, log: &str, lines: &[u8]) -> Result<(), ArchiveError> {
        let path = self.dir.join(format!("{log}.jsonl"));
        if self.torn {
            for log in ["events", "history"] {
                cut_partial_line(&self.dir.join(format!("{log}.jsonl")))?;
            }
            self.torn = false;
        }
        let len = match std::fs::metadata(&path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(io(&path)(e)),
        };
        if len >= self.file_bytes {
            self.rotate(log, &path)?;
        }
        let len = if len >= self.file_bytes { 0 } else { len };
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io(&path))?;
        let written = f.write_all(lines).and_then(|()| f.sync_data());
        if let Err(e) = written {
            // No partial line stays behind for the next pass to append to.
            if f.set_len(len).is_err() {
                self.torn = true;
            }
            return Err(io(&path)(e));
        }
        Ok(())
    }

    /// `<log>.jsonl` becomes `<log>.<n>.jsonl` (n one above the newest);
    /// the oldest rotated files beyond the limit are deleted.
    fn rotate(&self, log: &str, path: &Path) -> Result<(), ArchiveError> {
        let mut rotated = self.rotated(log)?;
        let next = rotated.last().map_or(1, |(n, _)| n + 1);
        let to = self.dir.join(format!("{log}.{next}.jsonl"));
        std::fs::rename(path, &to).map_err(io(path))?;
        rotated.push((next, to));
        while rotated.len() > self.files_kept {
            let (_, old) = rotated.remove(0);
            std::fs::remove_file(&old).map_err(io(&old))?;
            tracing::warn!(file = %old.display(), "oldest archive file deleted (archive full)");
        }
        Ok(())
    }

    /// The rotated files of `log`, oldest first.
    fn rotated(&self, log: &str) -> Result<Vec<(u64, PathBuf)>, ArchiveError> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(io(&self.dir))? {
            let entry = entry.map_err(io(&self.dir))?;
            let name = entry.file_name();
            let Some(n) = name
                .to_str()
                .and_then(|s| {
                    s.strip_prefix(log)?
                        .strip_prefix('.')?
                        .strip_suffix(".jsonl")
                })
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            out.push((n, entry.path()));
        }
        out.sort();
        Ok(out)
    }

    fn save_cursor(&self, cursor: Cursor) -> Result<(), ArchiveError> {
        let path = self.dir.join(CURSOR);
        let tmp = self.dir.join(format!("{CURSOR}.tmp"));
        let bytes = serde_json::to_vec(&cursor).map_err(|source| ArchiveError::Encode {
            path: path.clone(),
            source,
        })?;
        let mut f = File::create(&tmp).map_err(io(&tmp))?;
        f.write_all(&bytes).map_err(io(&tmp))?;
        f.sync_data().map_err(io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io(&path))
    }
}

/// A log that does not end with a newline was cut mid-line (a crash, a
/// full disk): the partial line is removed, so the next line starts clean.
fn cut_partial_line(path: &Path) -> Result<(), ArchiveError> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = match OpenOptions::new().read(true).write(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(path)(e)),
    };
    let len = f.metadata().map_err(io(path))?.len();
    // Backwards in blocks to the last newline (bounded by the file).
    let mut end = len;
    let mut block = [0u8; 4096];
    while end > 0 {
        let start = end.saturating_sub(block.len() as u64);
        let n = (end - start) as usize;
        f.seek(SeekFrom::Start(start)).map_err(io(path))?;
        f.read_exact(&mut block[..n]).map_err(io(path))?;
        if let Some(i) = block[..n].iter().rposition(|b| *b == b'\n') {
            end = start + i as u64 + 1;
            break;
        }
        end = start;
    }
    if end < len {
        tracing::warn!(file = %path.display(), cut = len - end,
            "archive file ended with a partial line (cut mid-write); removed it");
        f.set_len(end).map_err(io(path))?;
    }
    Ok(())
}

fn encode<T: Serialize>(out: &mut Vec<u8>, dir: &Path, v: &T) -> Result<(), ArchiveError> {
    serde_json::to_writer(&mut *out, v).map_err(|source| ArchiveError::Encode {
        path: dir.to_owned(),
        source,
    })?;
    out.push(b'\n');
    Ok(())
}

/// Archives every [`ARCHIVE_EVERY`] on a thread of its own (file writes
/// and syncs stay off the async runtime): `collect` copies what is new
/// beyond the cursor out of the state ([`Batch::collect`] under its read
/// lock), or says `None` once the supervisor is gone, which ends the
/// thread. A failed write is logged and tried again at the next pass (the
/// cursor did not move).
pub fn spawn(
    mut archiver: Archiver,
    mut collect: impl FnMut(Cursor) -> Option<Batch> + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("archive".into())
        .spawn(move || {
            let mut warned: Option<std::time::Instant> = None;
            loop {
                std::thread::sleep(ARCHIVE_EVERY);
                let Some(batch) = collect(archiver.cursor()) else {
                    return;
                };
                match archiver.write(&batch) {
                    Ok(w) if w.events + w.history > 0 => {
                        tracing::debug!(events = w.events, history = w.history, "archived")
                    }
                    Ok(_) => {}
                    // Once per WARN_EVERY while it keeps failing.
                    Err(e) if warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) => {
                        warned = Some(std::time::Instant::now());
                        tracing::warn!(error = %e, "archiving failed; trying again every pass");
                    }
                    Err(e) => tracing::debug!(error = %e, "archiving failed again"),
                }
            }
        })
}

#[cfg(test)]
mod tests;
