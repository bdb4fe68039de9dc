//! One byte flipped anywhere in a store's files is refused or read around
//! — never a panic (one offset used to panic a follower at start with
//! "tried to serialize Uninitialized"). Its own test binary: the panic
//! hook it sets sees every thread of the process.

mod common;

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use common::{fill, put, KvModel, TestConfig};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{RaftLogReader, RaftSnapshotBuilder, Vote};

/// Panics of any thread (sled's own included) while the hook is set.
static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Restores the default panic hook when dropped, unwinding included.
struct Hook;

impl Hook {
    fn set() -> Hook {
        std::panic::set_hook(Box::new(|info| {
            PANICS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(info.to_string());
        }));
        Hook
    }
}

impl Drop for Hook {
    fn drop(&mut self) {
        let _ = std::panic::take_hook();
    }
}

/// Opens the store, reads everything openraft reads at start and writes
/// as a member would; whether it opened.
async fn open_and_use(dir: &Path) -> bool {
    let Ok((mut log, mut sm)) = raft_store::open::<TestConfig, KvModel>(dir) else {
        return false;
    };
    let _ = log.read_vote().await;
    let _ = log.read_committed().await;
    if let Ok(st) = log.get_log_state().await {
        if let Some(last) = st.last_log_id {
            let _ = log.try_get_log_entries(0..=last.index).await;
        }
        let next = st.last_log_id.map_or(1, |l| l.index + 1);
        let _ = log.blocking_append([put(1, next)]).await;
    }
    let _ = sm.applied_state().await;
    let _ = sm.get_current_snapshot().await;
    let _ = log.save_vote(&Vote::new_committed(2, 1)).await;
    let _ = sm.get_snapshot_builder().await.build_snapshot().await;
    true
}

/// Every file under `dir`, its sub-directories' (sled's `blobs/`) too.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// A copy of the store in `from` with one byte of `file` flipped.
fn flipped_copy(
    from: &Path,
    files: &[std::path::PathBuf],
    file: &Path,
    at: usize,
) -> tempfile::TempDir {
    let copy = tempfile::tempdir().unwrap();
    for f in files {
        let to = copy.path().join(f.strip_prefix(from).unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(f, &to).unwrap();
    }
    let target = copy.path().join(file.strip_prefix(from).unwrap());
    let mut bytes = std::fs::read(&target).unwrap();
    bytes[at] ^= 0x5a;
    std::fs::write(&target, &bytes).unwrap();
    copy
}

#[test]
fn a_flipped_byte_in_the_database_files_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        fill(dir.path(), 2).await;
        // More of sled's structures: many entries, a later snapshot.
        let (mut log, mut sm) = raft_store::open::<TestConfig, KvModel>(dir.path()).unwrap();
        log.blocking_append((11..=2000).map(|i| put(1, i)))
            .await
            .unwrap();
        sm.apply((7..=1500).map(|i| put(1, i))).await.unwrap();
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
    });
    drop(rt);
    let files = files_under(dir.path());
    let _hook = Hook::set();
    let (mut tried, mut opened) = (0, 0);
    for file in &files {
        let len = std::fs::metadata(file).unwrap().len() as usize;
        // Every byte of small files, about 300 spread over large ones.
        let step = (len / 300).max(1);
        for at in (0..len).step_by(step) {
            let copy = flipped_copy(dir.path(), &files, file, at);
            tried += 1;
            // In a thread of its own, so a flip that hangs fails the test.
            let (tx, rx) = std::sync::mpsc::channel();
            let path = copy.path().to_path_buf();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Runtime::new().unwrap();
                let _ = tx.send(rt.block_on(open_and_use(&path)));
            });
            match rx.recv_timeout(Duration::from_secs(30)) {
                Ok(true) => opened += 1,
                Ok(false) => {}
                // The thread panicked (the hook has it) or hangs.
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    panic!("{}@{at}: no answer within 30 s", file.display())
                }
            }
        }
    }
    let panics = std::mem::take(&mut *PANICS.lock().unwrap());
    assert!(tried > 100, "{tried} flips");
    assert!(opened > tried / 10, "only {opened} of {tried} opened");
    assert!(
        panics.is_empty(),
        "{} panics over {tried} flips: {panics:#?}",
        panics.len()
    );
}
