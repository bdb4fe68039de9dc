//! The versioned on-disk format: every value the store writes carries the
//! format version; a value of another version, a damaged value and a data
//! directory from before versions are refused with an error naming the
//! value's tree and key, never misread and never a panic.

mod common;

use std::path::Path;

use common::{fill, log_id, put, KvModel, TestConfig, KV_FORMAT};
use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::{RaftLogReader, Vote};
use raft_store::{StoreError, FORMAT_VERSION};

/// A store in a new temporary directory with entries 1..=10, a vote, a
/// committed id, a purge through 2 and a snapshot through 6, closed again.
fn populated() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(fill(dir.path(), 2));
    dir
}

/// Opens the sled database directly. sled's background flusher may hold
/// the directory's lock for a moment after the store that used it was
/// dropped: a few tries, a bounded wait.
fn open_db(dir: &Path) -> sled::Db {
    for _ in 0..50 {
        match sled::open(dir) {
            Ok(db) => return db,
            Err(sled::Error::Io(e)) if e.to_string().contains("could not acquire lock") => {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Err(e) => panic!("open {}: {e}", dir.display()),
        }
    }
    panic!("{}: still locked after 5 s", dir.display())
}

/// Rewrites one stored value (the store must be closed).
fn tamper(dir: &Path, tree: &str, key: &[u8], f: impl FnOnce(Vec<u8>) -> Vec<u8>) {
    let db = open_db(dir);
    let t = db.open_tree(tree).unwrap();
    let old = t.get(key).unwrap().expect("value to tamper with").to_vec();
    t.insert(key, f(old)).unwrap();
    db.flush().unwrap();
}

fn with_version(v: u8) -> impl FnOnce(Vec<u8>) -> Vec<u8> {
    move |mut b| {
        b[0] = v;
        b
    }
}

/// Opens the store, expecting an error other than the directory's lock
/// (which sled may hold for a moment after the last user dropped it, as in
/// [`open_db`]: a few tries, a bounded wait).
fn open_err(dir: &Path) -> StoreError {
    for _ in 0..50 {
        match raft_store::open::<TestConfig, KvModel>(dir) {
            Ok(_) => panic!("the store opened"),
            Err(e) if e.to_string().contains("could not acquire lock") => {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Err(e) => return e,
        }
    }
    panic!("{}: still locked after 5 s", dir.display())
}

/// Reads the log of a reopened store; the error as text.
fn read_log_err(dir: &Path) -> String {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (mut log, _sm) = raft_store::open::<TestConfig, KvModel>(dir).unwrap();
        let e = log.try_get_log_entries(0..100).await.unwrap_err();
        format!("{e}: {:?}", e)
    })
}

#[test]
fn every_stored_value_starts_with_the_format_version() {
    let dir = populated();
    let db = open_db(dir.path());
    let meta = db.open_tree("meta").unwrap();
    assert_eq!(
        meta.get("format").unwrap().unwrap().as_ref(),
        &[FORMAT_VERSION]
    );
    let mut seen = 0;
    for tree in ["log", "meta", "snapshot"] {
        for kv in db.open_tree(tree).unwrap().iter() {
            let (k, v) = kv.unwrap();
            assert_eq!(v[0], FORMAT_VERSION, "{tree}/{k:?}");
            seen += 1;
        }
    }
    // 8 log entries; vote, committed, last_purged, format; snapshot meta, data.
    assert_eq!(seen, 8 + 4 + 2);
}

#[test]
fn current_version_reads_back() {
    let dir = populated();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (mut log, mut sm) = raft_store::open::<TestConfig, KvModel>(dir.path()).unwrap();
        let entries = log.try_get_log_entries(0..100).await.unwrap();
        assert_eq!(entries.len(), 8);
        assert_eq!(entries[0].log_id, log_id(1, 3));
        assert_eq!(
            log.read_vote().await.unwrap(),
            Some(Vote::new_committed(1, 1))
        );
        assert_eq!(log.read_committed().await.unwrap(), Some(log_id(1, 10)));
        let st = log.get_log_state().await.unwrap();
        assert_eq!(st.last_purged_log_id, Some(log_id(1, 2)));
        let snap = sm.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(snap.meta.last_log_id, Some(log_id(1, 6)));
        let model: serde_json::Value = serde_json::from_slice(snap.snapshot.get_ref()).unwrap();
        assert_eq!(
            model["kv"]["k6"], "v6",
            "snapshot data without the envelope"
        );
    });
}

#[test]
fn log_entry_of_another_version_is_refused() {
    let dir = populated();
    tamper(dir.path(), "log", &5u64.to_be_bytes(), with_version(9));
    let e = read_log_err(dir.path());
    assert!(
        e.contains("stored log entry at log/5 has format version 9"),
        "{e}"
    );
    assert!(
        e.contains(&format!("reads only version {FORMAT_VERSION}")),
        "{e}"
    );
}

#[test]
fn log_entry_of_another_model_format_is_refused() {
    let dir = populated();
    tamper(dir.path(), "log", &5u64.to_be_bytes(), |mut b| {
        assert_eq!(b[1], KV_FORMAT, "the entry's second byte is the model's");
        b[1] = KV_FORMAT + 1;
        b
    });
    let e = read_log_err(dir.path());
    assert!(
        e.contains(&format!(
            "stored log entry's model format at log/5 has format version {}; this build reads only version {KV_FORMAT}",
            KV_FORMAT + 1
        )),
        "{e}"
    );
}

#[test]
fn last_log_entry_of_another_version_is_refused_by_the_log_state() {
    let dir = populated();
    tamper(dir.path(), "log", &10u64.to_be_bytes(), with_version(0));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let e = rt.block_on(async {
        let (mut log, _sm) = raft_store::open::<TestConfig, KvModel>(dir.path()).unwrap();
        log.get_log_state().await.unwrap_err().to_string()
    });
    assert!(
        e.contains("stored log entry at log/10 has format version 0"),
        "{e}"
    );
}

#[test]
fn vote_of_another_version_is_refused() {
    let dir = populated();
    tamper(dir.path(), "meta", b"vote", with_version(9));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let e = rt.block_on(async {
        let (mut log, _sm) = raft_store::open::<TestConfig, KvModel>(dir.path()).unwrap();
        log.read_vote().await.unwrap_err().to_string()
    });
    assert!(
        e.contains("stored vote at meta/vote has format version 9"),
        "{e}"
    );
}

#[test]
fn snapshot_of_another_version_is_refused() {
    for key in ["meta", "data"] {
        let dir = populated();
        tamper(dir.path(), "snapshot", key.as_bytes(), with_version(3));
        match open_err(dir.path()) {
            StoreError::UnsupportedVersion {
                what,
                tree,
                key: k,
                found,
                supported,
            } => {
                assert_eq!(what, format!("snapshot {key}"));
                assert_eq!((tree, k.as_str()), ("snapshot", key));
                assert_eq!((found, supported), (3, FORMAT_VERSION));
            }
            other => panic!("{other}"),
        }
    }
}

#[test]
fn truncated_or_garbled_values_are_refused() {
    // A log entry cut in half.
    let dir = populated();
    tamper(dir.path(), "log", &4u64.to_be_bytes(), |b| {
        b[..b.len() / 2].to_vec()
    });
    let e = read_log_err(dir.path());
    assert!(e.contains("stored log entry at log/4 is corrupt"), "{e}");

    // A log entry with bytes after its end.
    let dir = populated();
    tamper(dir.path(), "log", &4u64.to_be_bytes(), |mut b| {
        b.extend_from_slice(&[0xde, 0xad]);
        b
    });
    let e = read_log_err(dir.path());
    assert!(e.contains("stored log entry at log/4 is corrupt"), "{e}");

    // A vote of the right version whose body is garbage, and an empty one.
    for garbage in [vec![FORMAT_VERSION, 0xff, 0xff, 0xff], Vec::new()] {
        let dir = populated();
        tamper(dir.path(), "meta", b"vote", |_| garbage);
        let rt = tokio::runtime::Runtime::new().unwrap();
        let e = rt.block_on(async {
            let (mut log, _sm) = raft_store::open::<TestConfig, KvModel>(dir.path()).unwrap();
            log.read_vote().await.unwrap_err().to_string()
        });
        assert!(e.contains("stored vote at meta/vote is corrupt"), "{e}");
    }

    // Snapshot meta with a length prefix claiming far more than is there.
    let dir = populated();
    tamper(dir.path(), "snapshot", b"meta", |b| {
        let mut g = vec![FORMAT_VERSION];
        g.extend_from_slice(&[0xff; 16]);
        g.extend_from_slice(&b[17.min(b.len())..]);
        g
    });
    match open_err(dir.path()) {
        StoreError::Corrupt {
            what, tree, key, ..
        } => {
            assert_eq!(
                (what, tree, key.as_str()),
                ("snapshot meta", "snapshot", "meta")
            );
        }
        other => panic!("{other}"),
    }
}

#[test]
fn data_directory_without_format_marker_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        // What an earlier railguard left: bare bincode, no marker.
        let db = open_db(dir.path());
        let log = db.open_tree("log").unwrap();
        log.insert(1u64.to_be_bytes(), bincode::serialize(&put(1, 1)).unwrap())
            .unwrap();
        db.flush().unwrap();
    }
    let e = open_err(dir.path());
    assert!(matches!(e, StoreError::Unversioned { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains(&dir.path().display().to_string()), "{msg}");
    assert!(msg.contains("without store format versions"), "{msg}");
}

#[test]
fn store_marker_of_another_version_is_refused() {
    let dir = populated();
    tamper(dir.path(), "meta", b"format", |_| vec![7]);
    let e = open_err(dir.path());
    assert!(
        e.to_string()
            .contains("stored store format marker at meta/format has format version 7"),
        "{e}"
    );
}
