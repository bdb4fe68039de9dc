//! The test disk against the real kernel: ENOSPC, EROFS after ext4's
//! error path and a repair, and a freeze that blocks writers until the
//! thaw. Needs root.

use testbed::disk::LoopDisk;

#[test]
fn a_disk_fills_turns_read_only_is_repaired_and_freezes() {
    if !testbed::require_root("a_disk_fills_turns_read_only_is_repaired_and_freezes").unwrap() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut d = LoopDisk::create(&dir.path().join("img"), &dir.path().join("mnt"), 16).unwrap();
    let f = d.path().join("data");
    std::fs::write(&f, b"kept").unwrap();
    // Full: a write fails with ENOSPC, and works again once freed.
    d.fill().unwrap();
    let e = std::fs::write(d.path().join("more"), vec![0u8; 1 << 20]).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    d.unfill().unwrap();
    std::fs::write(d.path().join("more"), b"x").unwrap();
    // Read-only: refused with EROFS; repaired, writable again and the
    // data synced before the error still there.
    let sync = std::fs::File::open(&f).unwrap();
    sync.sync_all().unwrap();
    drop(sync);
    d.fail_read_only().unwrap();
    let e = std::fs::write(d.path().join("late"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    d.repair().unwrap();
    assert_eq!(std::fs::read(&f).unwrap(), b"kept");
    std::fs::write(d.path().join("late"), b"x").unwrap();
    // Frozen: a write in another thread waits for the thaw.
    d.freeze().unwrap();
    let p = d.path().join("during-freeze");
    let t0 = std::time::Instant::now();
    let w = std::thread::spawn(move || {
        std::fs::write(&p, b"x").unwrap();
        t0.elapsed()
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    d.thaw().unwrap();
    let took = w.join().unwrap();
    assert!(took >= std::time::Duration::from_millis(250), "{took:?}");
    // A frozen disk dropped is thawed first (else the unmount hangs).
    d.freeze().unwrap();
    let mount = d.path().to_path_buf();
    drop(d);
    assert!(!std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .contains(mount.to_str().unwrap()));
}
