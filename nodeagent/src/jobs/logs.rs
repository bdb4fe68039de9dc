//! Rank logs: copying a rank's output into its capped log, the log
//! directories per incarnation (pruned to the newest), and log tails.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use super::model::{job_dir_name, LogTail, KEEP_INCARNATION_LOGS};

/// Copies the rank's output into its log until end-of-file, up to `cap`
/// bytes (then a note, and the rest is discarded).
pub(crate) fn copy_log(
    mut reader: std::io::PipeReader,
    mut file: File,
    mut written: u64,
    cap: u64,
) {
    let mut buf = vec![0u8; 64 << 10];
    let mut capped = false;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::warn!(error = %e, "reading a rank's output failed");
                return;
            }
        };
        if capped {
            continue;
        }
        let take = (cap.saturating_sub(written) as usize).min(n);
        if take > 0 {
            if let Err(e) = file.write_all(&buf[..take]) {
                tracing::warn!(error = %e, "writing a rank's log failed; discarding its output");
                capped = true;
                continue;
            }
            written += take as u64;
        }
        if take < n {
            let note = format!(
                "\n[railguard-agent: log capped at {} MiB; further output discarded]\n",
                cap >> 20
            );
            let _ = file.write_all(note.as_bytes());
            capped = true;
        }
    }
}

/// The incarnations that have a log directory under `dir`.
fn incarnation_dirs(dir: &Path) -> Vec<u64> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// Keeps the newest log directories of `job` under `jobs_dir` (the new
/// incarnation's is made next): at most [`KEEP_INCARNATION_LOGS`] with the
/// new one.
pub(crate) fn prune_logs(jobs_dir: &Path, job: &str, incarnation: u64) {
    let dir = jobs_dir.join(job_dir_name(job));
    let mut incs = incarnation_dirs(&dir);
    incs.retain(|i| *i < incarnation);
    incs.sort_unstable_by(|a, b| b.cmp(a));
    for old in incs.iter().skip(KEEP_INCARNATION_LOGS.saturating_sub(1)) {
        let p = dir.join(old.to_string());
        if let Err(e) = std::fs::remove_dir_all(&p) {
            tracing::warn!(path = %p.display(), error = %e, "cannot remove an old log directory");
        }
    }
}

/// The last `n` bytes of the newest incarnation's log of `rank` under
/// `dir` (the job's log directory), as lossy UTF-8; or, with `from`
/// (incarnation, offset), up to `n` bytes after that offset of that
/// incarnation's log (the newest's from its start when that log is gone),
/// ending on a whole UTF-8 character.
pub(crate) fn read_log(
    dir: &Path,
    job: &str,
    rank: u32,
    n: usize,
    from: Option<(u64, u64)>,
) -> LogTail {
    let name = format!("rank-{rank}.log");
    let mut incs = incarnation_dirs(dir);
    incs.retain(|i| dir.join(i.to_string()).join(&name).exists());
    incs.sort_unstable_by(|a, b| b.cmp(a));
    let Some(newest) = incs.first().copied() else {
        return LogTail {
            text: format!("no log of job {job} rank {rank} on this host"),
            ..LogTail::default()
        };
    };
    let (inc, start) = match from {
        Some((inc, off)) if incs.contains(&inc) => (inc, Some(off)),
        Some(_) => (newest, Some(0)),
        None => (newest, None),
    };
    let path = dir.join(inc.to_string()).join(&name);
    let fail = |e: std::io::Error| LogTail {
        text: format!("cannot read {}: {e}", path.display()),
        incarnation: inc,
        newest,
        ..LogTail::default()
    };
    let mut f = match File::open(&path) {
        Ok(f) => f,
        Err(e) => return fail(e),
    };
    let len = match f.metadata() {
        Ok(m) => m.len(),
        Err(e) => return fail(e),
    };
    let from_byte = start.map_or(len.saturating_sub(n as u64), |o| o.min(len));
    let mut buf = Vec::with_capacity(n.min(len.saturating_sub(from_byte) as usize));
    if let Err(e) = f
        .seek(SeekFrom::Start(from_byte))
        .and_then(|_| f.take(n as u64).read_to_end(&mut buf))
    {
        return fail(e);
    }
    // A tail does not start in the middle of a UTF-8 sequence; a forward
    // read does not end in one (the rest comes with the next read).
    let skip = if start.is_none() && from_byte > 0 {
        buf.iter()
            .take(3)
            .take_while(|b| (**b & 0xC0) == 0x80)
            .count()
    } else {
        0
    };
    let mut end = buf.len();
    if start.is_some() {
        if let Err(e) = std::str::from_utf8(&buf) {
            if e.error_len().is_none() {
                end = e.valid_up_to();
            }
        }
    }
    LogTail {
        ok: true,
        text: String::from_utf8_lossy(&buf[skip..end]).into_owned(),
        incarnation: inc,
        end_offset: from_byte + end as u64,
        newest,
    }
}
