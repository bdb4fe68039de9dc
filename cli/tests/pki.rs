//! `railguard pki …` run as a process: init, issue and show work offline,
//! write 0600 files, print serial and expiry, and refuse clearly (exit 2,
//! nothing written) on a missing CA, an existing file or a bad name.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

fn railguard(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_railguard"))
        .args(args)
        // Proves the commands are offline: this address is never parsed.
        .env("RAILGUARD_SUPERVISORS", "not-an-address")
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = railguard(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn refused(args: &[&str]) -> String {
    let out = railguard(args);
    assert_eq!(out.status.code(), Some(2), "{args:?} should fail");
    String::from_utf8(out.stderr).unwrap()
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

fn field<'a>(out: &'a str, name: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(name))
        .unwrap_or_else(|| panic!("no {name} in {out}"))
        .trim()
}

#[test]
fn init_issue_show() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    let out_dir = dir.path().join("certs");
    let (ca_s, out_s) = (ca.to_str().unwrap(), out_dir.to_str().unwrap());

    let out = ok(&["pki", "init", "--dir", ca_s, "--days", "100"]);
    assert!(field(&out, "expires:").ends_with("(in 100 days)"), "{out}");
    assert_eq!(field(&out, "serial:").len(), 32);
    assert_eq!(mode(&ca.join("ca.pem")), 0o600);
    assert_eq!(mode(&ca.join("ca.key")), 0o600);
    let err = refused(&["pki", "init", "--dir", ca_s]);
    assert!(err.contains("already exists"), "{err}");

    let out = ok(&[
        "pki",
        "issue",
        "supervisor",
        "--member",
        "3",
        "--san",
        "10.1.0.3,sup3.lan",
        "--san",
        "::1",
        "--days",
        "30",
        "--ca-dir",
        ca_s,
        "--out",
        out_s,
    ]);
    assert!(out.starts_with("issued supervisor:3"), "{out}");
    let serial = field(&out, "serial:").to_string();
    let cert = out_dir.join("supervisor-3.pem");
    assert_eq!(mode(&cert), 0o600);
    assert_eq!(mode(&out_dir.join("supervisor-3.key")), 0o600);

    let shown = ok(&["pki", "show", cert.to_str().unwrap()]);
    assert_eq!(field(&shown, "holder:"), "supervisor:3");
    assert_eq!(field(&shown, "serial:"), serial);
    assert_eq!(
        field(&shown, "names:"),
        "supervisor.railguard, 10.1.0.3, sup3.lan, ::1"
    );
    assert!(field(&shown, "issuer:").contains("railguard cluster CA"));
    assert!(field(&shown, "expires:").contains("days)"));

    // The default validity (365 days) would outlive this 100-day CA.
    let err = refused(&[
        "pki", "issue", "agent", "--host", "gpu-1", "--ca-dir", ca_s, "--out", out_s,
    ]);
    assert!(err.contains("outlive the CA"), "{err}");
    ok(&[
        "pki", "issue", "agent", "--host", "gpu-1", "--days", "50", "--ca-dir", ca_s, "--out",
        out_s,
    ]);
    ok(&[
        "pki", "issue", "admin", "--user", "alice", "--role", "operator", "--days", "50",
        "--ca-dir", ca_s, "--out", out_s,
    ]);
    let json = ok(&[
        "-o",
        "json",
        "pki",
        "show",
        out_dir.join("admin-alice.pem").to_str().unwrap(),
    ]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["identity"]["admin"]["user"], "alice");
    assert_eq!(v["identity"]["admin"]["role"], "operator");
    assert_eq!(v["expired"], false);
    let shown = ok(&["pki", "show", ca.join("ca.pem").to_str().unwrap()]);
    assert_eq!(field(&shown, "holder:"), "cluster CA");
}

#[test]
fn refusals_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    let out_dir = dir.path().join("certs");
    let (ca_s, out_s) = (ca.to_str().unwrap(), out_dir.to_str().unwrap());

    let err = refused(&[
        "pki", "issue", "agent", "--host", "h1", "--ca-dir", ca_s, "--out", out_s,
    ]);
    assert!(err.contains("no CA in"), "{err}");
    assert!(!out_dir.exists());

    ok(&["pki", "init", "--dir", ca_s]);
    for (args, says) in [
        (vec!["agent", "--host", "bad host"], "whitespace"),
        (vec!["agent", "--host", ""], "empty"),
        (
            vec!["admin", "--user", "al\nice", "--role", "admin"],
            "control",
        ),
        (
            vec!["agent", "--host", "h1", "--san", "not a name"],
            "subject alternative name",
        ),
        (vec!["agent", "--host", "h1", "--days", "0"], "validity"),
    ] {
        let mut full = vec!["pki", "issue"];
        full.extend(args);
        full.extend(["--ca-dir", ca_s, "--out", out_s]);
        let err = refused(&full);
        assert!(err.contains(says), "{full:?}: {err}");
        assert!(!out_dir.exists() || std::fs::read_dir(&out_dir).unwrap().count() == 0);
    }
    // clap refuses an unknown role and a negative member id itself.
    let out = railguard(&[
        "pki", "issue", "admin", "--user", "u", "--role", "root", "--ca-dir", ca_s, "--out", out_s,
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("viewer, operator, admin"));

    ok(&[
        "pki", "issue", "agent", "--host", "h1", "--ca-dir", ca_s, "--out", out_s,
    ]);
    let before = std::fs::read(out_dir.join("agent-h1.key")).unwrap();
    let err = refused(&[
        "pki", "issue", "agent", "--host", "h1", "--ca-dir", ca_s, "--out", out_s,
    ]);
    assert!(err.contains("already exists"), "{err}");
    assert_eq!(std::fs::read(out_dir.join("agent-h1.key")).unwrap(), before);

    let err = refused(&["pki", "show", dir.path().join("nope.pem").to_str().unwrap()]);
    assert!(err.contains("nope.pem"), "{err}");
}
