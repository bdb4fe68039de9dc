//! Unit tests of the audit archive.

use super::*;
use crate::model::limits::{MAX_ADMIN_HISTORY, MAX_EVENT_LOG};
use crate::model::{AdminOp, Event};

/// `n` more events in the state (the model's cap applies).
fn events(st: &mut ClusterState, n: usize) {
    for _ in 0..n {
        st.log_event(1, Some("h0"), Event::HostReRegistered);
    }
}

/// `n` more admin records, one per log index, capped as the model caps them.
fn history(st: &mut ClusterState, n: usize) {
    for _ in 0..n {
        st.last_log_index += 1;
        st.admin_history.push_back(AdminRecord {
            at_ms: 1,
            actor: "alice".into(),
            op: AdminOp::Cordon { host: "h0".into() },
            log_index: st.last_log_index,
        });
        while st.admin_history.len() > MAX_ADMIN_HISTORY {
            st.admin_history.pop_front();
        }
    }
}

fn pass(a: &mut Archiver, st: &ClusterState) -> Written {
    let b = Batch::collect(a.cursor(), st);
    a.write(&b).unwrap()
}

/// The lines of `<log>.jsonl` and its rotated files, oldest first.
fn lines(dir: &Path, log: &str) -> Vec<serde_json::Value> {
    let mut files: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let p = e.unwrap().path();
            let name = p.file_name()?.to_str()?.to_owned();
            let rest = name.strip_prefix(log)?.strip_suffix(".jsonl")?;
            let n = match rest.strip_prefix('.') {
                Some(n) => n.parse().ok()?,
                None if rest.is_empty() => u64::MAX,
                None => return None,
            };
            Some((n, p))
        })
        .collect();
    files.sort();
    files
        .iter()
        .flat_map(|(_, p)| {
            std::fs::read_to_string(p)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn field(lines: &[serde_json::Value], name: &str) -> Vec<u64> {
    lines.iter().filter_map(|l| l[name].as_u64()).collect()
}

#[test]
fn every_entry_is_archived_once_across_passes_and_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let mut st = ClusterState::default();
    let mut a = Archiver::open(dir.path()).unwrap();
    assert_eq!(pass(&mut a, &st), Written::default(), "nothing yet");
    events(&mut st, 2_500);
    history(&mut st, 1_200);
    let w = pass(&mut a, &st);
    assert_eq!((w.events, w.history, w.events_lost), (2_500, 1_200, 0));
    // The model rolls its oldest out; each pass sees less than its cap.
    for _ in 0..3 {
        events(&mut st, 9_000);
        history(&mut st, 9_000);
        pass(&mut a, &st);
    }
    assert!(st.events.front().unwrap().seq > 1, "the model dropped some");
    // A restarted supervisor goes on from its cursor: nothing twice.
    let mut a = Archiver::open(dir.path()).unwrap();
    assert_eq!(pass(&mut a, &st), Written::default());
    events(&mut st, 10);
    assert_eq!(pass(&mut a, &st).events, 10);
    let ev = lines(dir.path(), "events");
    let total = 2_500 + 27_000 + 10;
    assert_eq!(field(&ev, "seq"), (1..=total).collect::<Vec<u64>>());
    let hi = lines(dir.path(), "history");
    assert_eq!(field(&hi, "log_index"), (1..=28_200).collect::<Vec<u64>>());
    assert!(hi.iter().all(|l| l["actor"] == "alice"));
}

#[test]
fn a_flood_past_the_cap_is_a_recorded_gap() {
    let dir = tempfile::tempdir().unwrap();
    let mut st = ClusterState::default();
    let mut a = Archiver::open(dir.path()).unwrap();
    events(&mut st, 100);
    history(&mut st, 100);
    pass(&mut a, &st);
    // More than the caps between two passes.
    events(&mut st, MAX_EVENT_LOG + 5_000);
    history(&mut st, MAX_ADMIN_HISTORY + 2_000);
    let w = pass(&mut a, &st);
    assert_eq!(w.events_lost, 5_000);
    assert_eq!(w.events, MAX_EVENT_LOG);
    assert!(w.history_gap);
    let ev = lines(dir.path(), "events");
    let gap = ev
        .iter()
        .find(|l| l.get("gap").is_some())
        .expect("a gap line");
    assert_eq!(gap["gap"]["events"], serde_json::json!([101, 5_100]));
    assert_eq!(ev.len(), 100 + 1 + MAX_EVENT_LOG);
    let hi = lines(dir.path(), "history");
    let gap = hi
        .iter()
        .find(|l| l.get("gap").is_some())
        .expect("a gap line");
    assert_eq!(
        gap["gap"]["history_between"],
        serde_json::json!([100, 2_101])
    );
    // No gap while each pass keeps up.
    events(&mut st, 10);
    history(&mut st, 10);
    let w = pass(&mut a, &st);
    assert_eq!((w.events_lost, w.history_gap), (0, false));
}

#[test]
fn files_rotate_and_only_the_newest_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let mut st = ClusterState::default();
    let mut a = Archiver::open(dir.path()).unwrap().with_limits(4_096, 2);
    for _ in 0..40 {
        events(&mut st, 50);
        pass(&mut a, &st);
    }
    let names: std::collections::BTreeSet<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("events"))
        .collect();
    assert_eq!(
        names.len(),
        3,
        "the current file and two rotated: {names:?}"
    );
    assert!(names.contains("events.jsonl"));
    // What is kept is the newest, in order and without holes.
    let seqs = field(&lines(dir.path(), "events"), "seq");
    assert_eq!(*seqs.last().unwrap(), 2_000);
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "consecutive");
    assert!(seqs[0] > 1, "the oldest files were deleted");
}

#[test]
fn an_unreadable_cursor_archives_the_state_again_and_skips_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut st = ClusterState::default();
    let mut a = Archiver::open(dir.path()).unwrap();
    events(&mut st, 30);
    pass(&mut a, &st);
    std::fs::write(dir.path().join(CURSOR), b"\x00garbage{").unwrap();
    let mut a = Archiver::open(dir.path()).unwrap();
    assert_eq!(a.cursor(), Cursor::default());
    events(&mut st, 5);
    assert_eq!(pass(&mut a, &st).events, 35);
    let seqs = field(&lines(dir.path(), "events"), "seq");
    assert_eq!(seqs.len(), 65, "the 30 again (repeats, told apart by seq)");
    assert_eq!(
        seqs.iter()
            .copied()
            .collect::<std::collections::BTreeSet<_>>(),
        (1..=35).collect()
    );
}

#[test]
fn an_archive_that_cannot_be_written_is_a_clear_error_and_keeps_its_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let mut st = ClusterState::default();
    let mut a = Archiver::open(dir.path()).unwrap();
    events(&mut st, 3);
    // A directory where the log file should be.
    std::fs::create_dir(dir.path().join("events.jsonl")).unwrap();
    let e = a.write(&Batch::collect(a.cursor(), &st)).unwrap_err();
    assert!(e.to_string().contains("events.jsonl"), "{e}");
    assert_eq!(a.cursor(), Cursor::default());
}

#[test]
fn a_log_that_keeps_failing_does_not_make_the_other_repeat() {
    let dir = tempfile::tempdir().unwrap();
    let mut st = ClusterState::default();
    let mut a = Archiver::open(dir.path()).unwrap();
    std::fs::create_dir(dir.path().join("history.jsonl")).unwrap();
    events(&mut st, 40);
    history(&mut st, 3);
    for _ in 0..5 {
        let b = Batch::collect(a.cursor(), &st);
        assert!(a.write(&b).is_err(), "history cannot be written");
    }
    assert_eq!(
        field(&lines(dir.path(), "events"), "seq"),
        (1..=40).collect::<Vec<u64>>()
    );
    assert_eq!(a.cursor().history_index, 0, "history not archived yet");
    std::fs::remove_dir(dir.path().join("history.jsonl")).unwrap();
    assert_eq!(pass(&mut a, &st).history, 3);
}

#[test]
fn a_partial_last_line_is_cut_when_the_archive_opens() {
    let dir = tempfile::tempdir().unwrap();
    let mut st = ClusterState::default();
    let mut a = Archiver::open(dir.path()).unwrap();
    events(&mut st, 3);
    pass(&mut a, &st);
    // A crash mid-write left half a line.
    let path = dir.path().join("events.jsonl");
    let mut f = OpenOptions::new().append(true).open(&path).unwrap();
    f.write_all(br#"{"seq":4,"at_"#).unwrap();
    drop(f);
    let mut a = Archiver::open(dir.path()).unwrap();
    events(&mut st, 2);
    pass(&mut a, &st);
    assert_eq!(
        field(&lines(dir.path(), "events"), "seq"),
        vec![1, 2, 3, 4, 5]
    );
}
