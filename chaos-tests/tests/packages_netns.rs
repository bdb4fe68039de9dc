//! The Debian packages (`scripts/package.sh`) install and run (needs root;
//! fails instead of skipping when `CI` is set). The three packages are
//! built from this build's binaries and unpacked into a fresh root, which
//! gets the binaries' shared libraries so it runs on its own (a chroot).
//! The shipped configs are used as shipped, with certificates where they
//! say. The supervisor and the agent start through their units' exact
//! `ExecStart` lines, inside a testbed host's network namespace (systemd
//! itself cannot run here). The agent registers the host with its two
//! rails, and the packaged CLI, its man pages and completions work.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use testbed::{require_root, Node, Testbed, TestbedSpec};

/// Runs `cmd`, asserts it succeeded, returns its stdout.
fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Copies every shared library `bin` (inside `root`) needs into `root`,
/// at the same path.
fn copy_libraries(root: &Path, bin: &Path) {
    let ldd = run(Command::new("ldd").arg(root.join(bin)));
    for lib in ldd
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
        .map(PathBuf::from)
    {
        let to = root.join(lib.strip_prefix("/").unwrap());
        if to.exists() {
            continue;
        }
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(&lib, &to).unwrap_or_else(|e| panic!("{}: {e}", lib.display()));
    }
}

/// The `ExecStart` line of a unit in `root`, split into words.
fn exec_start(root: &Path, unit: &str) -> Vec<String> {
    let text = std::fs::read_to_string(root.join("lib/systemd/system").join(unit)).unwrap();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .unwrap_or_else(|| panic!("{unit} has no ExecStart"));
    line.split_whitespace().map(str::to_owned).collect()
}

/// The packaged CLI inside `root`, in host 0's namespace, with the admin
/// certificate issued below.
fn cli(tb: &Testbed, root: &Path, args: &[&str]) -> std::process::Output {
    let mut c = tb.command(Node::Host(0), "chroot").unwrap();
    c.arg(root)
        .arg("/usr/bin/railguard")
        .args([
            "--ca",
            "/etc/railguard/tls/ca.pem",
            "--cert",
            "/etc/railguard/tls/admin-root.pem",
            "--key",
            "/etc/railguard/tls/admin-root.key",
            "--timeout",
            "3s",
        ])
        .args(args);
    c.output().unwrap()
}

/// Waits (bounded) until `f` holds.
fn wait_for(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while t0.elapsed() < within {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("timed out after {within:?} waiting for {what}");
}

fn hostname() -> String {
    run(&mut Command::new("hostname")).trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packages_install_and_their_units_start_a_working_cluster() {
    if !require_root("packages_install_and_their_units_start_a_working_cluster").unwrap() {
        return;
    }
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let bins = testbed::cluster::bin_path("railguard").unwrap();
    let bins = bins.parent().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let debs = tmp.path().join("debs");
    let built = run(Command::new("bash")
        .arg(ws.join("scripts/package.sh"))
        .arg("--bins")
        .arg(bins)
        .arg("--out")
        .arg(&debs));
    assert_eq!(built.lines().count(), 3, "{built}");

    // Each package: its name, what it depends on, what it installs.
    let root = tmp.path().join("root");
    for (name, files, conffile) in [
        (
            "railguard",
            &[
                "./usr/bin/railguard",
                "./usr/share/man/man1/railguard.1.gz",
                "./usr/share/man/man1/railguard-job-submit.1.gz",
                "./usr/share/bash-completion/completions/railguard",
                "./usr/share/zsh/vendor-completions/_railguard",
                "./usr/share/fish/vendor_completions.d/railguard.fish",
            ][..],
            None,
        ),
        (
            "railguard-supervisor",
            &[
                "./usr/bin/railguard-supervisor",
                "./lib/systemd/system/railguard-supervisor.service",
                "./etc/railguard/supervisor.toml",
            ][..],
            Some("/etc/railguard/supervisor.toml"),
        ),
        (
            "railguard-agent",
            &[
                "./usr/bin/railguard-agent",
                "./lib/systemd/system/railguard-agent.service",
                "./etc/railguard/agent.toml",
            ][..],
            Some("/etc/railguard/agent.toml"),
        ),
    ] {
        let deb = built
            .lines()
            .find(|l| {
                Path::new(l)
                    .file_name()
                    .and_then(|f| f.to_str())
                    .is_some_and(|f| f.starts_with(&format!("{name}_")))
            })
            .unwrap_or_else(|| panic!("no {name} package in {built}"));
        let fields = run(Command::new("dpkg-deb").args(["-f", deb, "Package", "Depends"]));
        assert!(fields.contains(&format!("Package: {name}\n")), "{fields}");
        assert!(
            fields.contains("libc6"),
            "{name} depends on libc6: {fields}"
        );
        let listing = run(Command::new("dpkg-deb").args(["-c", deb]));
        for f in files {
            assert!(
                listing.lines().any(|l| l.ends_with(f)),
                "{name} installs {f}: {listing}"
            );
        }
        if let Some(c) = conffile {
            let conffiles = run(Command::new("dpkg-deb").args(["-I", deb, "conffiles"]));
            assert_eq!(conffiles.trim(), c, "{name}: the config is a conffile");
        }
        run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&root));
    }
    for b in ["railguard", "railguard-supervisor", "railguard-agent"] {
        copy_libraries(&root, &Path::new("usr/bin").join(b));
    }

    // The units are valid systemd units, hardened: systemd's own offline
    // exposure score (0 safest, 10 worst) for copies that name the
    // unpacked binaries.
    for (unit, most) in [
        ("railguard-supervisor.service", 3.0),
        ("railguard-agent.service", 6.0),
    ] {
        let text = std::fs::read_to_string(root.join("lib/systemd/system").join(unit)).unwrap();
        let copy = tmp.path().join(unit);
        let bin = format!("{}/usr/bin/", root.display());
        std::fs::write(&copy, text.replace("/usr/bin/", &bin)).unwrap();
        let verify = Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(&copy)
            .output()
            .expect("systemd-analyze (the systemd package)");
        let said = String::from_utf8_lossy(&verify.stderr).into_owned()
            + &String::from_utf8_lossy(&verify.stdout);
        assert!(
            verify.status.success() && said.trim().is_empty(),
            "{unit}: {said}"
        );
        let security = run(Command::new("systemd-analyze")
            .args(["security", "--offline=yes"])
            .arg(&copy));
        let score: f64 = security
            .lines()
            .find_map(|l| l.split("Overall exposure level for ").nth(1))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|x| x.parse().ok())
            .unwrap_or_else(|| panic!("{unit}: no exposure level in {security}"));
        assert!(score <= most, "{unit}: exposure {score} > {most}");
    }

    // The man pages and completions came from the CLI itself.
    let bash =
        std::fs::read_to_string(root.join("usr/share/bash-completion/completions/railguard"))
            .unwrap();
    assert!(
        bash.contains("drain") && bash.contains("failover"),
        "{bash}"
    );
    run(Command::new("bash")
        .arg("-n")
        .arg(root.join("usr/share/bash-completion/completions/railguard")));

    // Certificates where the shipped configs look for them.
    let host = hostname();
    let tls = "/etc/railguard/tls";
    let ca_dir = "/root-ca";
    let pki = |args: &[&str]| {
        let mut c = Command::new("chroot");
        c.arg(&root).arg("/usr/bin/railguard").arg("pki").args(args);
        run(&mut c);
    };
    pki(&["init", "--dir", ca_dir]);
    std::fs::create_dir_all(root.join("etc/railguard/tls")).unwrap();
    std::fs::copy(
        root.join("root-ca/ca.pem"),
        root.join("etc/railguard/tls/ca.pem"),
    )
    .unwrap();
    pki(&[
        "issue",
        "supervisor",
        "--member",
        "1",
        "--ca-dir",
        ca_dir,
        "--out",
        tls,
    ]);
    pki(&[
        "issue", "agent", "--host", &host, "--ca-dir", ca_dir, "--out", tls,
    ]);
    pki(&[
        "issue", "admin", "--user", "root", "--role", "admin", "--ca-dir", ca_dir, "--out", tls,
    ]);
    for ext in ["pem", "key"] {
        std::fs::rename(
            root.join(format!("etc/railguard/tls/agent-{host}.{ext}")),
            root.join(format!("etc/railguard/tls/agent.{ext}")),
        )
        .unwrap();
    }
    // What systemd creates for the units (StateDirectory, RuntimeDirectory).
    for d in [
        "var/lib/railguard/supervisor",
        "var/lib/railguard/agent",
        "run/railguard",
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }

    // Both services by their units' ExecStart, in one host's namespace
    // (rail0 and rail1, the names the shipped agent config discovers).
    let tb = Testbed::build(TestbedSpec {
        supervisors: 0,
        hosts: 1,
    })
    .await
    .unwrap();
    // Run as root here: the chroot has no `railguard` user (the unit's
    // User= for the supervisor).
    let start = |unit: &str, log: &str| {
        let argv = exec_start(&root, unit);
        let mut c = tb.command(Node::Host(0), "chroot").unwrap();
        c.arg(&root)
            .args(&argv)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(tmp.path().join(log)).unwrap());
        let child = c.spawn().unwrap();
        testbed::register_pid(child.id());
        child
    };
    let logs = |log: &str| std::fs::read_to_string(tmp.path().join(log)).unwrap_or_default();
    let sup = start("railguard-supervisor.service", "supervisor.log");
    wait_for(
        "the packaged supervisor to lead",
        Duration::from_secs(60),
        || {
            let out = cli(&tb, &root, &["status"]);
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("leader")
        },
    );
    let agent = start("railguard-agent.service", "agent.log");
    wait_for(
        "the packaged agent to register this host with rail0 and rail1",
        Duration::from_secs(60),
        || {
            let out = cli(&tb, &root, &["-o", "json", "nic", "list"]);
            let text = String::from_utf8_lossy(&out.stdout);
            out.status.success()
                && ["rail0", "rail1"]
                    .iter()
                    .all(|n| text.contains(&format!("\"{n}\"")))
                && text.contains(&format!("\"{host}\""))
        },
    );
    // A clean stop (SIGTERM, as systemd sends it) ends both with status 0.
    for (mut child, log) in [(agent, "agent.log"), (sup, "supervisor.log")] {
        // SAFETY: kill has no memory-safety preconditions; the pid is a
        // child this test started and has not reaped.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let t0 = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "{log}: no exit 30 s after SIGTERM: {}",
                logs(log)
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        testbed::unregister_pid(child.id());
        assert!(status.success(), "{log}: {status}: {}", logs(log));
    }
}
