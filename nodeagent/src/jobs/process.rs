//! What the launcher asks of the OS about a rank's process: its
//! `/proc/<pid>/stat`, signals to its process group, waiting for its exit
//! without reaping it, and signal names for exit details.

/// What the launcher reads of `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcStat {
    pub(crate) state: char,
    /// The parent process.
    pub(crate) ppid: u32,
    /// The process group.
    pub(crate) pgrp: u32,
    pub(crate) start_time: u64,
}

pub(crate) fn proc_stat(pid: u32) -> Option<ProcStat> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: the
    // fields after it start after the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(ProcStat {
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: fields.get(2)?.parse().ok()?,
        // Field 22; `rest` starts at field 3.
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// Most parents walked up from a process to find a rank's leader.
const MAX_TREE_DEPTH: usize = 64;

/// Whether process `pid` belongs to the rank whose leader (and process
/// group id) is `leader`: it is in that group, or descends from the leader.
pub(crate) fn in_rank(pid: u32, leader: u32) -> bool {
    let Some(st) = proc_stat(pid) else {
        return false;
    };
    if pid == leader || st.pgrp == leader {
        return true;
    }
    let mut p = st.ppid;
    for _ in 0..MAX_TREE_DEPTH {
        if p == leader {
            return true;
        }
        match proc_stat(p) {
            Some(s) if p > 1 => p = s.ppid,
            _ => return false,
        }
    }
    false
}

/// Sends `sig` to the process group `pgid` (never to groups 0 or 1, which
/// would mean the caller's group or every process).
pub(crate) fn kill_group(pgid: u32, sig: i32) -> bool {
    let Ok(g) = i32::try_from(pgid) else {
        return false;
    };
    if g <= 1 {
        return false;
    }
    // SAFETY: kill(2) only sends a signal; a negative pid names a group.
    unsafe { libc::kill(-g, sig) == 0 }
}

/// Blocks until the child `pid` has exited, leaving it waitable (so
/// `Child::wait` reaps it and gets its status).
pub(crate) fn wait_exited(pid: u32) -> std::io::Result<()> {
    loop {
        // SAFETY: siginfo_t is plain data; all-zero is a valid value.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a valid, writable siginfo_t for the call.
        let r = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if r == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// `signal N (NAME)` for an exit detail.
pub(crate) fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGTERM => "SIGTERM",
        _ => return format!("signal {sig}"),
    };
    format!("signal {sig} ({name})")
}
