//! Unix conventions of the `railguard` binary: when the reader of its
//! output goes away (`railguard … | head`) it ends quietly with status
//! 141 (what a filter killed by SIGPIPE shows), never with a panic;
//! `--version` names it.

use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Stdio};

#[test]
fn a_closed_pipe_ends_the_cli_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    let init = Command::new(env!("CARGO_BIN_EXE_railguard"))
        .args(["pki", "init", "--dir"])
        .arg(&ca)
        .output()
        .unwrap();
    assert!(init.status.success(), "{init:?}");
    // A pipe whose read end is already closed: the first write fails.
    let mut fds = [0; 2];
    // SAFETY: pipe fills two new descriptors, each owned exactly once below.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    let out = Command::new(env!("CARGO_BIN_EXE_railguard"))
        .args(["pki", "show"])
        .arg(ca.join("ca.pem"))
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    assert_eq!(out.status.code(), Some(141), "{out:?}");
}

#[test]
fn every_binary_names_itself_in_its_version() {
    let out = Command::new(env!("CARGO_BIN_EXE_railguard"))
        .arg("--version")
        .output()
        .unwrap();
    let v = String::from_utf8_lossy(&out.stdout);
    assert!(v.starts_with("railguard "), "{v}");
}
