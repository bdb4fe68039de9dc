//! `--output yaml` prints the same data as `--output json`: read back by a
//! YAML parser (Python's), it equals the JSON.

use std::io::Write;
use std::process::{Command, Stdio};

fn railguard(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_railguard"))
        .args(args)
        .output()
        .unwrap()
}

/// `text` (YAML) as JSON, by python3's yaml module (python3-yaml).
fn yaml_to_json(text: &[u8]) -> serde_json::Value {
    let mut py = Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(yaml.safe_load(sys.stdin)))",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 (with python3-yaml)");
    py.stdin.take().unwrap().write_all(text).unwrap();
    let out = py.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "not YAML: {}",
        String::from_utf8_lossy(text)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn yaml_output_is_the_json_output() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    let init = railguard(&["pki", "init", "--dir", ca.to_str().unwrap()]);
    assert!(init.status.success(), "{init:?}");
    let cert = ca.join("ca.pem");
    let json = railguard(&["-o", "json", "pki", "show", cert.to_str().unwrap()]);
    let yaml = railguard(&["-o", "yaml", "pki", "show", cert.to_str().unwrap()]);
    assert!(json.status.success() && yaml.status.success());
    let want: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(want.is_object(), "{want}");
    assert_eq!(yaml_to_json(&yaml.stdout), want);
    // Names with characters YAML gives meaning to come back unchanged.
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        "[contexts.\"a: b # c\"]\nsupervisors = [\"[::1]:7400\", \"- x\"]\n",
    )
    .unwrap();
    let list = |o: &str| {
        Command::new(env!("CARGO_BIN_EXE_railguard"))
            .args(["-o", o, "context", "list"])
            .env("RAILGUARD_CONFIG", &config)
            .output()
            .unwrap()
    };
    let want: serde_json::Value = serde_json::from_slice(&list("json").stdout).unwrap();
    assert_eq!(want[0]["name"], "a: b # c");
    assert_eq!(yaml_to_json(&list("yaml").stdout), want);
}
