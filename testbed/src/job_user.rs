//! The `railguard-job` system user agents run ranks as by default: made
//! when missing before a cluster's agents start (tests run as root), so
//! jobs run as a real non-root user and can reach the control socket (its
//! group is taken when the agent starts).

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{bail, Context};

/// The agents' default job user.
pub const JOB_USER: &str = nodeagent::jobs::DEFAULT_JOB_USER;

/// (uid, gid) of [`JOB_USER`], creating it with `useradd --system` if it
/// is missing (idempotent; safe against other test processes doing the
/// same). Fails saying what to do when `useradd` is missing or fails.
pub fn ensure_job_user() -> anyhow::Result<(u32, u32)> {
    static ONE: Mutex<()> = Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..50 {
        if let Some(u) = nodeagent::jobs::lookup_user(JOB_USER).map_err(anyhow::Error::msg)? {
            return Ok((u.uid, u.gid));
        }
        let out = Command::new("useradd")
            .args(["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", JOB_USER])
            .output()
            .with_context(|| {
                format!("cannot run useradd to create the {JOB_USER} user agents run ranks as; install it (passwd / shadow-utils) or create the user")
            })?;
        // 9: it exists (made meanwhile); 10: /etc/passwd was locked by
        // someone making it: look again.
        match out.status.code() {
            Some(0) | Some(9) | Some(10) => {}
            _ => bail!(
                "useradd {JOB_USER} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("user {JOB_USER} is still missing after useradd")
}

/// The workspace binary `name` copied into `run_dir/bin` (mode 0755), so
/// ranks running as [`JOB_USER`] can execute it wherever the target
/// directory is (a checkout under /root is not theirs to reach).
pub fn job_binary(run_dir: &tempfile::TempDir, name: &str) -> anyhow::Result<PathBuf> {
    let src = crate::cluster::bin_path(name)?;
    let dir = run_dir.path().join("bin");
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    let dst = dir.join(name);
    std::fs::copy(&src, &dst)
        .with_context(|| format!("copy {} to {}", src.display(), dst.display()))?;
    std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o755))?;
    Ok(dst)
}
