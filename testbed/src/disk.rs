//! A real disk to break: a small ext4 filesystem on a loop device, mounted
//! where a supervisor keeps its data, with the three faults a disk does to
//! a server — it fills ([`LoopDisk::fill`]), it turns read-only after an
//! error ([`LoopDisk::fail_read_only`]: ext4's own error path, mounted
//! `errors=remount-ro`), and it stalls ([`LoopDisk::freeze`]: every write
//! and fsync blocks until the thaw, as on a disk that stops answering).
//!
//! Nothing here is simulated: the supervisor sees the kernel's `ENOSPC`,
//! `EROFS` and blocked system calls. Every disk is registered for the
//! Ctrl-C clean-up and undone on drop (thawed, unmounted, the loop device
//! detached): a frozen filesystem left behind would hang every process
//! that touches it, so the thaw comes first on every path.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use anyhow::{bail, Context};

/// Disks of this run, for [`cleanup_disks`]: (mount point, loop device).
static LIVE_DISKS: Mutex<Vec<(PathBuf, String)>> = Mutex::new(Vec::new());

/// The file [`LoopDisk::fill`] writes.
const FILLER: &str = "railguard-test-filler";

/// An ext4 filesystem in an image file, mounted through a loop device.
#[derive(Debug)]
pub struct LoopDisk {
    image: PathBuf,
    mount: PathBuf,
    device: String,
    frozen: bool,
}

fn run(cmd: &mut Command) -> anyhow::Result<std::process::Output> {
    let out = cmd
        .output()
        .with_context(|| format!("run {:?}", cmd.get_program()))?;
    Ok(out)
}

fn must(cmd: &mut Command) -> anyhow::Result<String> {
    let what = format!("{cmd:?}");
    let out = run(cmd)?;
    if !out.status.success() {
        bail!(
            "{what}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

impl LoopDisk {
    /// Makes a `size_mib` ext4 filesystem in `image` and mounts it on
    /// `mount` (created if missing, and must be empty).
    pub fn create(image: &Path, mount: &Path, size_mib: u64) -> anyhow::Result<LoopDisk> {
        if !(8..=4096).contains(&size_mib) {
            bail!("a test disk takes 8..=4096 MiB, not {size_mib}");
        }
        let f =
            std::fs::File::create(image).with_context(|| format!("create {}", image.display()))?;
        f.set_len(size_mib << 20)?;
        drop(f);
        must(
            Command::new("mkfs.ext4")
                .args(["-q", "-F", "-m", "0"])
                .arg(image),
        )?;
        std::fs::create_dir_all(mount)?;
        let device = must(Command::new("losetup").args(["-f", "--show"]).arg(image))?;
        let disk = LoopDisk {
            image: image.to_path_buf(),
            mount: mount.to_path_buf(),
            device,
            frozen: false,
        };
        LIVE_DISKS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((disk.mount.clone(), disk.device.clone()));
        disk.mount_fs()?;
        Ok(disk)
    }

    fn mount_fs(&self) -> anyhow::Result<()> {
        must(
            Command::new("mount")
                .args(["-t", "ext4", "-o", "errors=remount-ro"])
                .arg(&self.device)
                .arg(&self.mount),
        )?;
        Ok(())
    }

    /// Where the filesystem is mounted.
    pub fn path(&self) -> &Path {
        &self.mount
    }

    /// The loop device (`/dev/loopN`).
    pub fn device(&self) -> &str {
        &self.device
    }

    /// Writes zeros into a filler file until the filesystem has no block
    /// left (made with no blocks reserved for root, so a root process
    /// finds it as full as anyone).
    pub fn fill(&self) -> anyhow::Result<()> {
        let mut f = std::fs::File::create(self.mount.join(FILLER))?;
        let chunk = vec![0u8; 1 << 20];
        while f.write_all(&chunk).is_ok() {}
        while f.write_all(&chunk[..4096]).is_ok() {}
        let _ = f.sync_all();
        Ok(())
    }

    /// Frees what [`Self::fill`] took.
    pub fn unfill(&self) -> anyhow::Result<()> {
        match std::fs::remove_file(self.mount.join(FILLER)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Makes ext4 record an error (its `trigger_fs_error` knob), which
    /// with `errors=remount-ro` aborts the journal and turns the mount
    /// read-only at once: from then on every write fails with `EROFS`.
    /// Returns once a write is refused.
    pub fn fail_read_only(&self) -> anyhow::Result<()> {
        let name = self.device.trim_start_matches("/dev/");
        let knob = format!("/sys/fs/ext4/{name}/trigger_fs_error");
        std::fs::write(&knob, "1").with_context(|| format!("write {knob}"))?;
        let probe = self.mount.join(".railguard-ro-probe");
        for _ in 0..100 {
            match std::fs::File::create(&probe) {
                Err(e) if e.raw_os_error() == Some(libc::EROFS) => return Ok(()),
                Ok(_) => {
                    let _ = std::fs::remove_file(&probe);
                }
                Err(_) => {}
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        bail!("{} did not turn read-only", self.mount.display())
    }

    /// What an operator does after a read-only error: unmount, check and
    /// repair (`e2fsck -fy`), mount again. The filesystem's users must
    /// have closed it first (the unmount fails otherwise).
    pub fn repair(&self) -> anyhow::Result<()> {
        must(Command::new("umount").arg(&self.mount))?;
        let out = run(Command::new("e2fsck").args(["-fy"]).arg(&self.device))?;
        // 0: clean, 1: errors corrected, 2: corrected, reboot advised.
        if !matches!(out.status.code(), Some(0..=2)) {
            bail!(
                "e2fsck {}: {}: {}",
                self.device,
                out.status,
                String::from_utf8_lossy(&out.stdout).trim()
            );
        }
        self.mount_fs()
    }

    /// Freezes the filesystem: every write, create and fsync blocks
    /// (uninterruptibly) until [`Self::thaw`].
    pub fn freeze(&mut self) -> anyhow::Result<()> {
        must(Command::new("fsfreeze").arg("-f").arg(&self.mount))?;
        self.frozen = true;
        Ok(())
    }

    /// Ends a [`Self::freeze`]; the blocked calls go on.
    pub fn thaw(&mut self) -> anyhow::Result<()> {
        if self.frozen {
            must(Command::new("fsfreeze").arg("-u").arg(&self.mount))?;
            self.frozen = false;
        }
        Ok(())
    }
}

/// Thaws, unmounts and detaches (errors ignored: this runs on drop and on
/// Ctrl-C, where the disk may already be half undone).
fn undo(mount: &Path, device: &str) {
    let _ = Command::new("fsfreeze").arg("-u").arg(mount).output();
    let _ = Command::new("umount").arg("-l").arg(mount).output();
    let _ = Command::new("losetup").arg("-d").arg(device).output();
}

impl Drop for LoopDisk {
    fn drop(&mut self) {
        undo(&self.mount, &self.device);
        LIVE_DISKS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(m, _)| m != &self.mount);
        let _ = std::fs::remove_file(&self.image);
    }
}

/// Unmounts (lazily) every filesystem mounted under `dir`, thawing it
/// first: a cluster's run directory cannot be removed while a test disk is
/// still mounted in it.
pub fn unmount_under(dir: &Path) {
    let Ok(mounts) = std::fs::read_to_string("/proc/mounts") else {
        return;
    };
    for line in mounts.lines() {
        let Some(at) = line.split_whitespace().nth(1) else {
            continue;
        };
        // /proc/mounts escapes spaces as \040; run directories have none.
        let at = Path::new(at);
        if at.starts_with(dir) && at != dir {
            let _ = Command::new("fsfreeze").arg("-u").arg(at).output();
            let _ = Command::new("umount").arg("-l").arg(at).output();
        }
    }
}

/// Undoes every live disk (the Ctrl-C handler's part).
pub fn cleanup_disks() {
    for (mount, device) in
        std::mem::take(&mut *LIVE_DISKS.lock().unwrap_or_else(|e| e.into_inner()))
    {
        undo(&mount, &device);
    }
}
