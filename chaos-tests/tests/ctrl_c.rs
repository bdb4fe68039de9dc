//! Ctrl-C on a running `railguard-chaos` scenario: the testbed's cleanup
//! registry removes its namespaces and kills its processes (needs root;
//! fails instead of skipping when `CI` is set; launches the binary from the
//! target directory, so `cargo build --workspace --bins` first).

use std::time::Duration;

use testbed::{netns, require_root, OWNER_DIR};

/// Ctrl-C (SIGINT) on a running scenario removes its namespaces, kills
/// its processes and removes its run directory.
#[test]
fn ctrl_c_on_a_scenario_leaves_nothing_behind() {
    if !require_root("testbed::ctrl_c").unwrap() {
        return;
    }
    let run_dirs = || -> std::collections::BTreeSet<std::path::PathBuf> {
        std::fs::read_dir(std::env::temp_dir())
            .map(|rd| {
                rd.flatten()
                    .filter(|e| {
                        e.file_name()
                            .to_string_lossy()
                            .starts_with("railguard-net-")
                    })
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default()
    };
    let dirs_before = run_dirs();
    let bin = testbed::cluster::bin_path("railguard-chaos").unwrap();
    let mut child = std::process::Command::new(bin)
        .args([
            "scenario",
            "nic-flap",
            "--hosts",
            "2",
            "--flaps",
            "2000",
            "--no-quiet",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    // Wait (bounded) until its testbed exists.
    let owned = || -> Vec<String> {
        std::fs::read_dir(OWNER_DIR)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| {
                        std::fs::read_to_string(e.path()).is_ok_and(|s| s.trim() == pid.to_string())
                    })
                    .filter_map(|e| {
                        e.file_name()
                            .to_string_lossy()
                            .strip_suffix(".owner")
                            .map(str::to_owned)
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut prefixes = Vec::new();
    for _ in 0..200 {
        prefixes = owned();
        if !prefixes.is_empty() && netns::list(&format!("{}-", prefixes[0])).len() >= 5 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!prefixes.is_empty(), "the scenario built a testbed");
    std::thread::sleep(Duration::from_millis(1500)); // supervisors and agents running
                                                     // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    let left: Vec<_> = run_dirs().difference(&dirs_before).cloned().collect();
    assert!(left.is_empty(), "run directories left: {left:?}");
    for p in &prefixes {
        assert!(
            netns::list(&format!("{p}-")).is_empty(),
            "namespaces of {p} removed"
        );
    }
    // No supervisor or agent of a netns run survives (their command lines
    // name the run's data directory, railguard-net-*).
    std::thread::sleep(Duration::from_millis(200));
    let survivors: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let cmd = std::fs::read_to_string(e.path().join("cmdline")).ok()?;
            cmd.contains("railguard-net-")
                .then(|| cmd.replace('\0', " "))
        })
        .collect();
    assert!(survivors.is_empty(), "{survivors:?}");
}
