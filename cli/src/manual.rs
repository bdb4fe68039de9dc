//! `railguard completion SHELL` and `railguard man --dir DIR`: shell
//! completions and man pages generated from the clap definitions, so they
//! never drift from the commands (offline; no supervisor is contacted).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Command;

/// The shells `railguard completion` writes for.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// Prints the completion script for `shell` on stdout. A reader that goes
/// away ends the process quietly with status 141, like every other
/// command.
pub fn completion(mut cmd: Command, shell: Shell) -> anyhow::Result<()> {
    let shell = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    // Into memory first: the generator panics on a failed write.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "railguard", &mut script);
    let mut out = std::io::stdout().lock();
    match out.write_all(&script).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(141),
        Err(e) => Err(e).context("cannot write the completion script"),
    }
}

/// Writes `railguard.1` and one page per subcommand (`railguard-job-submit.1`)
/// into `dir` (created if missing); prints each file written.
pub fn man(mut cmd: Command, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    cmd.build();
    let mut written = Vec::new();
    write_pages(&cmd, "railguard", dir, &mut written)?;
    for p in written {
        println!("{}", p.display());
    }
    Ok(())
}

/// Bounded by the command tree's depth (three levels today).
fn write_pages(
    cmd: &Command,
    name: &str,
    dir: &Path,
    written: &mut Vec<PathBuf>,
) -> anyhow::Result<()> {
    let page = cmd.clone().name(name.to_owned());
    let mut out = Vec::new();
    clap_mangen::Man::new(page)
        .render(&mut out)
        .with_context(|| format!("cannot render the man page of {name}"))?;
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, out).with_context(|| format!("cannot write {}", path.display()))?;
    written.push(path);
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        write_pages(sub, &format!("{name}-{}", sub.get_name()), dir, written)?;
    }
    Ok(())
}
