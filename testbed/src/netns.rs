//! Network namespaces, made the way `ip netns add` makes them: a thread
//! unshares its network namespace and the namespace is bind-mounted on
//! `/run/netns/<name>`, so `ip netns exec <name> …` works on it too.
//!
//! Netlink sockets and processes enter a namespace with `setns`, always on a
//! throwaway thread or in the child between fork and exec, so no thread of
//! the caller ever changes namespace.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use rtnetlink::Handle;

/// Where named namespaces live.
pub const NETNS_DIR: &str = "/run/netns";

/// A named network namespace, held open.
#[derive(Debug)]
pub struct Netns {
    pub name: String,
    pub path: PathBuf,
    file: File,
}

fn cstr(p: &Path) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl Netns {
    /// Creates the namespace `name` (fails if it exists).
    pub fn create(name: &str) -> io::Result<Netns> {
        if name.is_empty() || name.contains('/') || name.len() > 64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bad namespace name {name:?}"),
            ));
        }
        std::fs::create_dir_all(NETNS_DIR)?;
        let path = Path::new(NETNS_DIR).join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)?;
        let target = cstr(&path)?;
        let result = std::thread::spawn(move || -> io::Result<()> {
            // SAFETY: unshare/mount on this short-lived thread only; the
            // strings outlive the calls.
            unsafe {
                check(libc::unshare(libc::CLONE_NEWNET))?;
                let src = c"/proc/thread-self/ns/net";
                check(libc::mount(
                    src.as_ptr(),
                    target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                ))
            }
        })
        .join()
        .map_err(|_| io::Error::other("namespace thread panicked"))?;
        if let Err(e) = result {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        Self::open(name)
    }

    /// Opens an existing named namespace.
    pub fn open(name: &str) -> io::Result<Netns> {
        let path = Path::new(NETNS_DIR).join(name);
        let file = File::open(&path)?;
        Ok(Netns {
            name: name.into(),
            path,
            file,
        })
    }

    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Runs `f` on a new thread inside this namespace.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
        self.spawn(f)?
            .join()
            .map_err(|_| io::Error::other("namespace thread panicked"))?
    }

    /// Starts `f` on a new thread inside this namespace (every socket it
    /// opens lives there) and returns at once; join the handle for its
    /// result.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> io::Result<std::thread::JoinHandle<io::Result<T>>> {
        let fd = self.file.try_clone()?;
        Ok(std::thread::spawn(move || -> io::Result<T> {
            // SAFETY: setns on this thread only, with an fd we own.
            check(unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) })?;
            Ok(f())
        }))
    }

    /// A netlink handle whose socket lives in this namespace (the socket's
    /// namespace is fixed when it is created). Must be called from a tokio
    /// runtime.
    pub fn netlink(&self) -> io::Result<Handle> {
        let rt = tokio::runtime::Handle::current();
        let (conn, handle) = self.run(move || {
            let _enter = rt.enter();
            rtnetlink::new_connection().map(|(c, h, _)| (c, h))
        })??;
        tokio::spawn(conn);
        Ok(handle)
    }

    /// A command that runs `program` inside this namespace.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> io::Result<Command> {
        let fd = self.file.try_clone()?;
        let mut cmd = Command::new(program);
        // SAFETY: setns is async-signal-safe; `fd` stays open in the child
        // until exec (it is moved into the closure).
        unsafe {
            cmd.pre_exec(move || check(libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET)));
        }
        Ok(cmd)
    }
}

/// Deletes the named namespace (unmount and remove). Interfaces inside it
/// are destroyed by the kernel once nothing holds the namespace.
pub fn delete(name: &str) -> io::Result<()> {
    let path = Path::new(NETNS_DIR).join(name);
    let c = cstr(&path)?;
    // SAFETY: plain syscall on a path we built.
    let rc = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINVAL) && e.raw_os_error() != Some(libc::ENOENT) {
            return Err(e);
        }
    }
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Names of namespaces under `/run/netns` starting with `prefix`.
pub fn list(prefix: &str) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(NETNS_DIR) else {
        return Vec::new();
    };
    let mut v: Vec<String> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(prefix))
        .collect();
    v.sort();
    v
}
