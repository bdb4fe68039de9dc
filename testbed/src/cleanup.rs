//! Cleanup of testbeds: the registry of live namespaces, processes and
//! run directories that a Ctrl-C handler flushes ([`cleanup_all_live`]),
//! owner files, and the sweeper that removes leftovers of dead runs
//! ([`sweep`]).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::plan::NS_PREFIX;

/// Directory of owner files: `<prefix>.owner` holds the creating pid.
pub const OWNER_DIR: &str = "/run/railguard-testbed";

/// Namespaces and processes of live testbeds, for Ctrl-C handlers.
static LIVE: Mutex<Vec<(Vec<String>, Vec<u32>)>> = Mutex::new(Vec::new());

/// Other processes of this run (e.g. loopback supervisors) to kill on Ctrl-C.
static LIVE_PIDS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// Run directories of live clusters (logs, sockets, certificates), removed
/// on Ctrl-C unless `RAILGUARD_KEEP_RUN_DIR` is set.
static LIVE_DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Registers a run directory for [`cleanup_all_live`].
pub fn register_dir(dir: &Path) {
    LIVE_DIRS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(dir.to_path_buf());
}

/// Forgets a run directory its owner removed or kept.
pub fn unregister_dir(dir: &Path) {
    LIVE_DIRS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|d| d != dir);
}

/// Registers a process for [`cleanup_all_live`].
pub fn register_pid(pid: u32) {
    LIVE_PIDS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(pid);
}

/// Forgets a process that was reaped.
pub fn unregister_pid(pid: u32) {
    LIVE_PIDS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|p| *p != pid);
}

/// Undoes every test disk, kills every registered process, deletes every
/// registered namespace and removes every registered run directory (for a
/// SIGINT handler; `Drop` does the same for one testbed).
pub fn cleanup_all_live() {
    // First, since a process blocked on a frozen disk cannot die.
    crate::disk::cleanup_disks();
    for pid in std::mem::take(&mut *LIVE_PIDS.lock().unwrap_or_else(|e| e.into_inner())) {
        // SAFETY: signalling a process this run started.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    let live = std::mem::take(&mut *LIVE.lock().unwrap_or_else(|e| e.into_inner()));
    for (names, pids) in live {
        for pid in pids {
            // SAFETY: signalling processes this run started.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        for n in names {
            let _ = crate::netns::delete(&n);
        }
    }
    let dirs = std::mem::take(&mut *LIVE_DIRS.lock().unwrap_or_else(|e| e.into_inner()));
    if std::env::var_os("RAILGUARD_KEEP_RUN_DIR").is_none() {
        for d in dirs {
            let _ = std::fs::remove_dir_all(&d);
        }
    }
}

fn pid_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks existence.
    unsafe { libc::kill(pid, 0) == 0 || *libc::__errno_location() == libc::EPERM }
}

/// Removes `rg*-` namespaces whose owning process is gone (or unknown).
/// Returns the names removed.
pub fn sweep() -> Vec<String> {
    let mut removed = Vec::new();
    for name in crate::netns::list(NS_PREFIX) {
        let Some((prefix, _)) = name.split_once('-') else {
            continue;
        };
        let owner = std::fs::read_to_string(format!("{OWNER_DIR}/{prefix}.owner"))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok());
        if owner.is_some_and(pid_alive) {
            continue;
        }
        if crate::netns::delete(&name).is_ok() {
            removed.push(name);
        }
    }
    // Owner files of prefixes that have no namespace left.
    if let Ok(rd) = std::fs::read_dir(OWNER_DIR) {
        for e in rd.flatten() {
            let f = e.file_name().to_string_lossy().to_string();
            if let Some(prefix) = f.strip_suffix(".owner") {
                let any = !crate::netns::list(&format!("{prefix}-")).is_empty();
                let alive = std::fs::read_to_string(e.path())
                    .ok()
                    .and_then(|s| s.trim().parse::<i32>().ok())
                    .is_some_and(pid_alive);
                if !any && !alive {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
    removed
}

/// Records (or replaces) the namespaces and processes of the testbed whose
/// fabric namespace is `names[0]`, for [`cleanup_all_live`].
pub(crate) fn register_testbed(names: Vec<String>, pids: Vec<u32>) {
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(fab) = names.first() {
        live.retain(|(n, _)| n.first().is_none_or(|n| n != fab));
    }
    live.push((names, pids));
}

/// Forgets the testbed whose fabric namespace is `fab` (it tore itself
/// down).
pub(crate) fn forget_testbed(fab: &str) {
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    live.retain(|(names, _)| names.first().is_none_or(|n| n != fab));
}
