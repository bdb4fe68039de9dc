//! Who a rank runs as: the `[jobs]` policy (default user, allowed users,
//! root, allowed command prefixes), resolving a user through the system's
//! user database (`getpwnam_r`, `getgrouplist`), dropping to it in the
//! child before `exec`, and the checkpoint directory the rank must be able
//! to write.

use std::ffi::{CStr, CString};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

/// The job user an agent runs ranks as when the order names none.
pub const DEFAULT_JOB_USER: &str = "railguard-job";
/// Most supplementary groups a job user keeps.
const MAX_GROUPS: usize = 256;
/// Ancestors of a checkpoint directory checked for search permission.
const MAX_DEPTH: usize = 64;

/// The `[jobs]` policy: who ranks may run as and what they may run.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JobsPolicy {
    /// The user of a rank whose order names none.
    pub default_user: String,
    /// Users an order may name (empty in the file: just `default_user`).
    pub allowed_users: Vec<String>,
    /// Absolute path prefixes `argv[0]` must be under (empty: any command).
    pub allowed_commands: Vec<PathBuf>,
    /// Whether a rank may run as root (uid 0).
    pub allow_root: bool,
}

impl Default for JobsPolicy {
    fn default() -> Self {
        JobsPolicy {
            default_user: DEFAULT_JOB_USER.into(),
            allowed_users: Vec::new(),
            allowed_commands: Vec::new(),
            allow_root: false,
        }
    }
}

/// A user a rank runs as, resolved on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobUser {
    pub name: String,
    pub uid: u32,
    /// The primary group.
    pub gid: u32,
    /// Every group of the user (primary first), as `initgroups` would set.
    pub groups: Vec<u32>,
    pub home: PathBuf,
}

impl JobsPolicy {
    /// Checks the policy itself (at configuration load).
    pub fn validate(&self) -> Result<(), String> {
        if self.default_user.is_empty() {
            return Err("[jobs] default_user must not be empty".into());
        }
        for p in &self.allowed_commands {
            if !p.is_absolute() || p.components().any(|c| c == Component::ParentDir) {
                return Err(format!(
                    "[jobs] allowed_commands: {} is not an absolute path without ..",
                    p.display()
                ));
            }
        }
        Ok(())
    }

    /// Whether an order may name `user` (the default user always may).
    fn allows(&self, user: &str) -> bool {
        user == self.default_user || self.allowed_users.iter().any(|u| u == user)
    }

    /// The users whose processes may speak for jobs the agent did not
    /// launch (besides root): the default and the allowed users that exist.
    pub fn allowed_uids(&self) -> Vec<u32> {
        std::iter::once(&self.default_user)
            .chain(&self.allowed_users)
            .filter_map(|u| lookup_user(u).ok().flatten())
            .map(|u| u.uid)
            .collect()
    }

    /// The user a rank of an order naming `requested` (empty: the default)
    /// runs as; refused when it does not exist here, is not allowed, or is
    /// root without `allow_root`.
    pub fn resolve(&self, requested: &str) -> Result<JobUser, String> {
        let name = if requested.is_empty() {
            self.default_user.as_str()
        } else {
            requested
        };
        if !self.allows(name) {
            return Err(format!(
                "user {name} is not allowed on this host (its [jobs] allowed_users: {})",
                std::iter::once(&self.default_user)
                    .chain(&self.allowed_users)
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let user = match lookup_user(name)? {
            Some(u) => u,
            None if name == self.default_user => {
                return Err(format!(
                    "user {name} does not exist on this host; create it (useradd --system {name}) or set [jobs] default_user"
                ))
            }
            None => return Err(format!("user {name} does not exist on this host")),
        };
        if user.uid == 0 && !self.allow_root {
            return Err(format!(
                "user {name} is root (uid 0); ranks run as root only with [jobs] allow_root = true"
            ));
        }
        Ok(user)
    }

    /// Refuses `argv0` unless it is under one of `allowed_commands` (any
    /// command when the list is empty).
    pub fn check_command(&self, argv0: &str) -> Result<(), String> {
        if self.allowed_commands.is_empty() {
            return Ok(());
        }
        let p = Path::new(argv0);
        let plain = p.is_absolute() && !p.components().any(|c| c == Component::ParentDir);
        if plain && self.allowed_commands.iter().any(|pre| p.starts_with(pre)) {
            return Ok(());
        }
        Err(format!(
            "command {argv0} is not under this host's [jobs] allowed_commands ({})",
            self.allowed_commands
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }
}

/// Looks `name` up in the user database (None: no such user).
pub fn lookup_user(name: &str) -> Result<Option<JobUser>, String> {
    let Ok(cname) = CString::new(name) else {
        return Ok(None);
    };
    let mut buf = vec![0u8; 16 << 10];
    // SAFETY: passwd is plain data; all-zero is a valid value.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; `buf` outlives the use
    // of the strings `pw` points into.
    let rc = unsafe {
        libc::getpwnam_r(
            cname.as_ptr(),
            &mut pw,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut found,
        )
    };
    if found.is_null() {
        return match rc {
            0 | libc::ENOENT | libc::ESRCH | libc::EBADF | libc::EPERM => Ok(None),
            e => Err(format!(
                "cannot look user {name} up: {}",
                std::io::Error::from_raw_os_error(e)
            )),
        };
    }
    // SAFETY: on success pw_dir points to a NUL-terminated string in `buf`.
    let home = unsafe { CStr::from_ptr(pw.pw_dir) }
        .to_string_lossy()
        .into_owned();
    let (uid, gid) = (pw.pw_uid, pw.pw_gid);
    let mut groups = vec![gid];
    let mut list = vec![0 as libc::gid_t; MAX_GROUPS];
    let mut n = MAX_GROUPS as libc::c_int;
    // SAFETY: `list` holds `n` entries; getgrouplist writes at most `n`.
    let rc = unsafe { libc::getgrouplist(cname.as_ptr(), gid, list.as_mut_ptr(), &mut n) };
    if rc >= 0 {
        let n = usize::try_from(n).unwrap_or(0).min(MAX_GROUPS);
        groups.extend(list[..n].iter().filter(|g| **g != gid));
    }
    Ok(Some(JobUser {
        name: name.to_owned(),
        uid,
        gid,
        groups,
        home: PathBuf::from(home),
    }))
}

/// The id of group `name` (None: no such group).
pub fn lookup_group(name: &str) -> Option<u32> {
    let cname = CString::new(name).ok()?;
    let mut buf = vec![0u8; 16 << 10];
    // SAFETY: group is plain data; all-zero is a valid value.
    let mut gr: libc::group = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call.
    unsafe {
        libc::getgrnam_r(
            cname.as_ptr(),
            &mut gr,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut found,
        )
    };
    (!found.is_null()).then_some(gr.gr_gid)
}

/// Makes `path` the user's (what the agent created for the rank).
pub(crate) fn chown_to(path: &Path, user: &JobUser) -> Result<(), String> {
    std::os::unix::fs::chown(path, Some(user.uid), Some(user.gid))
        .map_err(|e| format!("cannot give {} to user {}: {e}", path.display(), user.name))
}

/// Drops the calling (child) process to `user`: groups, group, user, in
/// that order. Only async-signal-safe calls: run between fork and exec.
pub(crate) fn become_user(user: &JobUser) -> std::io::Result<()> {
    let cvt = |r: libc::c_int| {
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    // SAFETY: plain system calls on values owned by `user`.
    unsafe {
        cvt(libc::setgroups(user.groups.len(), user.groups.as_ptr()))?;
        cvt(libc::setgid(user.gid))?;
        cvt(libc::setuid(user.uid))?;
    }
    Ok(())
}

/// Whether `user` has the permission `bits` (r=4, w=2, x=1) on a file with
/// these metadata (mode bits only; root has them all).
fn may(user: &JobUser, m: &std::fs::Metadata, bits: u32) -> bool {
    if user.uid == 0 {
        return true;
    }
    let mode = m.mode();
    let class = if m.uid() == user.uid {
        mode >> 6
    } else if user.groups.contains(&m.gid()) {
        mode >> 3
    } else {
        mode
    };
    class & bits == bits
}

/// Creates the missing directory `path` and its missing parents, all the
/// user's. The last one appears by an atomic no-replace rename, so nobody
/// sees it root-owned; losing that race to another creator is fine.
fn create_owned(user: &JobUser, path: &Path) -> Result<(), String> {
    let cannot =
        |e: &dyn std::fmt::Display| format!("cannot create checkpoint_dir {}: {e}", path.display());
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(cannot(&"no parent directory"));
    };
    let mut missing = Vec::new();
    let mut p = parent;
    while !p.exists() && missing.len() < MAX_DEPTH {
        missing.push(p.to_path_buf());
        match p.parent() {
            Some(q) => p = q,
            None => break,
        }
    }
    std::fs::create_dir_all(parent).map_err(|e| cannot(&e))?;
    for d in missing.iter().rev() {
        chown_to(d, user)?;
    }
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(
        ".{}.{:x}",
        std::process::id(),
        rand::random::<u64>()
    ));
    let tmp = parent.join(tmp_name);
    std::fs::create_dir(&tmp).map_err(|e| cannot(&e))?;
    let placed = chown_to(&tmp, user).and_then(|()| rename_noreplace(&tmp, path));
    match placed {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_dir(&tmp);
            if path.is_dir() {
                Ok(()) // another agent (or rank) made it first
            } else {
                Err(e)
            }
        }
    }
}

/// `renameat2(RENAME_NOREPLACE)`: fails when `to` exists.
fn rename_noreplace(from: &Path, to: &Path) -> Result<(), String> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| format!("{} contains NUL", p.display()))
    };
    let (f, t) = (c(from)?, c(to)?);
    // SAFETY: both are valid NUL-terminated paths for the call's duration.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(format!(
            "cannot create checkpoint_dir {}: {}",
            to.display(),
            std::io::Error::last_os_error()
        ))
    }
}

/// Readies a rank's checkpoint directory (`dir`; relative paths are under
/// the rank's working directory `cwd`): created if missing and then given
/// to the user; an existing one must be a directory the user may write.
/// Either way the user must be able to reach it.
///
/// The ranks of one job on several hosts (agents sharing the directory)
/// and on one host start at once, so the directory appears atomically,
/// already the user's: it is made under a private name, chowned, and
/// renamed into place without replacing one another agent put there first.
pub(crate) fn prepare_checkpoint_dir(user: &JobUser, dir: &str, cwd: &Path) -> Result<(), String> {
    if dir.is_empty() {
        return Ok(());
    }
    let path = cwd.join(dir);
    let m = match std::fs::metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            create_owned(user, &path)?;
            std::fs::metadata(&path)
        }
        r => r,
    };
    match m {
        Ok(m) if !m.is_dir() => {
            return Err(format!(
                "checkpoint_dir {} exists and is not a directory",
                path.display()
            ))
        }
        Ok(m) => {
            if !may(user, &m, 3) {
                return Err(format!(
                    "checkpoint_dir {} is not writable by user {} (owner uid {}, mode {:o}); chown it to the job user or let the agent create it",
                    path.display(),
                    user.name,
                    m.uid(),
                    m.mode() & 0o7777
                ));
            }
        }
        Err(e) => {
            return Err(format!(
                "cannot read checkpoint_dir {}: {e}",
                path.display()
            ))
        }
    }
    for a in path.ancestors().skip(1).take(MAX_DEPTH) {
        if let Ok(m) = std::fs::metadata(a) {
            if !may(user, &m, 1) {
                return Err(format!(
                    "user {} cannot reach checkpoint_dir {}: no search permission on {}",
                    user.name,
                    path.display(),
                    a.display()
                ));
            }
        }
    }
    Ok(())
}
