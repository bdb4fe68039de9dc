//! Test support: the `railguard-job` system user the agent runs ranks as by
//! default, created when missing (tests run as root). The testbed has the
//! same helper for the netns clusters (`testbed::job_user`); this copy
//! serves nodeagent's own tests, which cannot depend on the testbed.

// Each test crate including this uses part of it.
#![allow(dead_code)]

use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

/// The default job user.
pub const JOB_USER: &str = "railguard-job";

/// (uid, gid) of [`JOB_USER`], creating it (`useradd --system`) if missing.
/// Panics with what to do when it cannot.
pub fn ensure_job_user() -> (u32, u32) {
    static ONE: Mutex<()> = Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..50 {
        if let Some(ids) = lookup() {
            return ids;
        }
        let out = Command::new("useradd")
            .args(["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", JOB_USER])
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run useradd to create the {JOB_USER} user the agent runs ranks as ({e}); install it (passwd/shadow-utils) or create the user")
            });
        // 9: it exists (another test process made it); 10: /etc/passwd
        // was locked by one: look again.
        match out.status.code() {
            Some(0) | Some(9) | Some(10) => {}
            _ => panic!(
                "useradd {JOB_USER} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("user {JOB_USER} still missing after useradd");
}

/// (uid, gid) of [`JOB_USER`] from `getent passwd` (None: no such user).
fn lookup() -> Option<(u32, u32)> {
    let out = Command::new("getent")
        .args(["passwd", JOB_USER])
        .output()
        .ok()?;
    let line = String::from_utf8(out.stdout).ok()?;
    let f: Vec<&str> = line.trim().split(':').collect();
    Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?))
}
