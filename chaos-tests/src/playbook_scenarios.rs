//! `scenario bad-playbooks`: a three-supervisor cluster (loopback) gets the
//! shipped library through `railguard playbook apply`, then every file of
//! the invalid corpus, one at a time, through the same real CLI process.
//! Each must be refused (exit 2) with its expected `file:line:column` and
//! message, and the stored playbooks (`playbook list`, and every stored
//! source through `playbook show`) must be exactly what they were.

use std::path::{Path, PathBuf};

use std::time::Duration;

use anyhow::{bail, Context};
use serde::Serialize;

use testbed::cluster::SupervisorCluster;

/// One corpus file's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct Rejection {
    pub file: String,
    pub expected: String,
    pub refused: bool,
    pub located: bool,
    pub message: String,
}

#[derive(Debug, Serialize)]
pub struct BadPlaybooksReport {
    pub ok: bool,
    pub library_applied: usize,
    pub corpus: usize,
    pub rejected_as_expected: usize,
    pub state_unchanged: bool,
    pub failures: Vec<Rejection>,
}

/// The repository's `playbooks/` directory (next to the binaries' target).
pub fn playbooks_dir() -> anyhow::Result<PathBuf> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let d = here.parent().context("workspace root")?.join("playbooks");
    if !d.is_dir() {
        bail!("{} not found", d.display());
    }
    Ok(d)
}

fn cli(
    c: &SupervisorCluster,
    addrs: &[String],
    args: &[&str],
) -> anyhow::Result<(i32, String, String)> {
    let out = c.cli_at(addrs, args)?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// `# expect: L:C fragment` on a corpus file's first line.
fn expectation(text: &str) -> Option<(String, String)> {
    let rest = text.lines().next()?.strip_prefix("# expect: ")?;
    let (at, frag) = rest.split_once(' ')?;
    Some((at.to_owned(), frag.trim().to_owned()))
}

/// Everything stored: the list and every playbook's source.
fn stored(c: &SupervisorCluster, addrs: &[String]) -> anyhow::Result<String> {
    let (code, list, err) = cli(c, addrs, &["--output", "json", "playbook", "list"])?;
    if code != 0 {
        bail!("playbook list failed: {err}");
    }
    let v: serde_json::Value = serde_json::from_str(&list)?;
    let mut all = list.clone();
    for p in v["playbooks"].as_array().into_iter().flatten() {
        let name = p["name"].as_str().unwrap_or_default();
        let (_, src, _) = cli(c, addrs, &["playbook", "show", name])?;
        all.push_str(&src);
    }
    Ok(all)
}

pub async fn bad_playbooks() -> anyhow::Result<BadPlaybooksReport> {
    let dir = playbooks_dir()?;
    let library = playbooks::toml_files(&dir.join("library"))?;
    let corpus = playbooks::toml_files(&dir.join("tests").join("bad"))?;
    let c = SupervisorCluster::start(3)?;
    c.init().await?;
    let addrs = c.addrs();
    eprintln!(
        "bad-playbooks: 3 supervisors up; applying the library ({} files)",
        library.len()
    );
    let mut args = vec!["playbook".to_string(), "apply".to_string()];
    args.extend(library.iter().map(|p| p.display().to_string()));
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, err) = cli(&c, &addrs, &argv)?;
    if code != 0 {
        bail!("the shipped library was refused: {err}");
    }
    let before = stored(&c, &addrs)?;
    let applied = serde_json::from_str::<serde_json::Value>(
        &cli(&c, &addrs, &["--output", "json", "playbook", "list"])?.1,
    )?["playbooks"]
        .as_array()
        .map_or(0, Vec::len);
    let mut failures = Vec::new();
    let mut good = 0;
    for f in &corpus {
        let text = std::fs::read_to_string(f)?;
        let Some((at, frag)) = expectation(&text) else {
            bail!("{}: no `# expect: L:C fragment` first line", f.display());
        };
        let path = f.display().to_string();
        // Through the supervisor, not only the CLI's local check: send the
        // file as a set with the whole library, which the server validates.
        let (code, _, err) = cli(&c, &addrs, &["playbook", "apply", &path])?;
        let located = err.contains(&format!("{path}:{at}:")) && err.contains(&frag);
        let refused = code == 2;
        if refused && located {
            good += 1;
        } else {
            failures.push(Rejection {
                file: path,
                expected: format!("{at} {frag}"),
                refused,
                located,
                message: err.trim().to_owned(),
            });
        }
    }
    // The same refusals must come from the supervisor itself (not just the
    // CLI's local check): apply through the API, bypassing the CLI.
    let client = c.client("chaos", 0, Duration::from_secs(5))?;
    let mut server_refused = 0;
    for f in &corpus {
        let text = std::fs::read_to_string(f)?;
        let op = supervisor::model::AdminOp::PlaybookApply {
            files: vec![supervisor::model::playbook_store::PlaybookFile {
                file: f.display().to_string(),
                text,
            }],
        };
        match client
            .call(supervisor::api::AdminRequest::Write { op }, false)
            .await
        {
            Err(e) if e.kind == supervisor::api::ErrorKind::InvalidArgument => server_refused += 1,
            other => failures.push(Rejection {
                file: f.display().to_string(),
                expected: "refused by the supervisor".into(),
                refused: false,
                located: false,
                message: format!("{other:?}"),
            }),
        }
    }
    let after = stored(&c, &addrs)?;
    let unchanged = before == after;
    eprintln!(
        "bad-playbooks: {good} of {} refused by the CLI with the expected location and message; {server_refused} refused by the supervisor's API; stored playbooks {}",
        corpus.len(),
        if unchanged { "unchanged" } else { "CHANGED" }
    );
    Ok(BadPlaybooksReport {
        ok: failures.is_empty() && unchanged && corpus.len() >= 30 && applied > 0,
        library_applied: applied,
        corpus: corpus.len(),
        rejected_as_expected: good,
        state_unchanged: unchanged,
        failures,
    })
}
