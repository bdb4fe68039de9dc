//! `railguard completion` and `railguard man`: generated from the clap
//! definitions, offline, so they cover every command there is.

use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Stdio};

fn railguard(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_railguard"))
        .args(args)
        // No supervisor may be contacted: this address has nobody.
        .env("RAILGUARD_SUPERVISORS", "192.0.2.1:7400")
        .output()
        .unwrap()
}

#[test]
fn completions_cover_the_commands_and_parse() {
    for shell in ["bash", "zsh", "fish"] {
        let out = railguard(&["completion", shell]);
        assert!(out.status.success(), "{shell}: {out:?}");
        let script = String::from_utf8(out.stdout).unwrap();
        for word in ["drain", "failover", "submit", "completion", "supervisor"] {
            assert!(script.contains(word), "{shell} completes {word}");
        }
    }
    // The bash script is valid bash.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("railguard.bash");
    std::fs::write(&file, railguard(&["completion", "bash"]).stdout).unwrap();
    let check = Command::new("bash").arg("-n").arg(&file).output().unwrap();
    assert!(check.status.success(), "{check:?}");
    // An unknown shell is refused with the choices.
    let out = railguard(&["completion", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bash, zsh, fish"));
}

#[test]
fn a_closed_pipe_ends_completion_quietly() {
    let mut fds = [0; 2];
    // SAFETY: pipe fills two new descriptors, each owned exactly once below.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    let out = Command::new(env!("CARGO_BIN_EXE_railguard"))
        .args(["completion", "bash"])
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(141), "{out:?}");
}

#[test]
fn man_pages_are_written_for_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let man = dir.path().join("man1");
    let out = railguard(&["man", "--dir", man.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let listed = String::from_utf8(out.stdout).unwrap();
    for page in [
        "railguard.1",
        "railguard-status.1",
        "railguard-node-drain.1",
        "railguard-job-submit.1",
        "railguard-pki-issue-agent.1",
        "railguard-completion.1",
    ] {
        let path = man.join(page);
        assert!(listed.contains(path.to_str().unwrap()), "{page} listed");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with(".ie") || text.contains(".TH"),
            "{page} is roff"
        );
    }
    let drain = std::fs::read_to_string(man.join("railguard-node-drain.1")).unwrap();
    assert!(drain.contains("\\-\\-reason"), "{drain}");
    assert!(
        !listed.contains("railguard-help"),
        "no pages for clap's help"
    );
    // A directory that cannot be made is a clear error.
    let out = railguard(&["man", "--dir", "/proc/railguard-man"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot create /proc/railguard-man"));
}
