//! Named contexts, like kubeconfig's: which supervisors to talk to and with
//! which certificate, kept in a file so an admin of several clusters
//! switches with one word.
//!
//! The file is `$RAILGUARD_CONFIG`, else
//! `$XDG_CONFIG_HOME/railguard/config.toml`, else
//! `~/.config/railguard/config.toml`:
//!
//! ```toml
//! current = "prod"
//! [contexts.prod]
//! supervisors = ["10.0.0.1:7400", "10.0.0.2:7400", "10.0.0.3:7400"]
//! ca = "prod/ca.pem"            # relative to this file's directory
//! cert = "prod/admin-ops.pem"
//! key = "prod/admin-ops.key"
//! timeout = "10s"
//! [contexts.lab]
//! supervisors = ["127.0.0.1:7400"]
//! insecure = true
//! ```
//!
//! What a call uses, each setting on its own: a flag or its environment
//! variable, else the context's value (`--context`, `RAILGUARD_CONTEXT`,
//! else the file's `current`), else the built-in default. A context named
//! but not in the file, or a file that does not parse, is an error that
//! changes nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context as _};
use serde::{Deserialize, Serialize};

/// The address used when neither a flag nor a context names one.
pub const DEFAULT_SUPERVISOR: &str = "127.0.0.1:7400";
/// The call time limit used when neither a flag nor a context sets one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// A config file larger than this is refused (it holds a few paths).
const MAX_FILE_BYTES: u64 = 1 << 20;

/// The file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    /// The context used without `--context`.
    current: Option<String>,
    #[serde(default)]
    contexts: BTreeMap<String, Ctx>,
}

/// One context: every field optional.
#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Ctx {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub supervisors: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure: bool,
    /// A duration such as `10s` or `1m`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
}

/// What the flags (and their environment variables) said.
#[derive(Debug, Default, Clone)]
pub struct Flags {
    pub supervisors: Option<Vec<String>>,
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub insecure: bool,
    pub timeout: Option<Duration>,
    pub context: Option<String>,
}

/// Where and with what a call goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub supervisors: Vec<String>,
    pub tls: pki::TlsArgs,
    pub timeout: Duration,
}

/// The config file's path (it need not exist).
pub fn config_path() -> Option<PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(p) = env("RAILGUARD_CONFIG") {
        return Some(PathBuf::from(p));
    }
    if let Some(x) = env("XDG_CONFIG_HOME") {
        return Some(Path::new(&x).join("railguard/config.toml"));
    }
    env("HOME").map(|h| Path::new(&h).join(".config/railguard/config.toml"))
}

/// Reads the file at `path`: `None` when it does not exist.
fn load(path: &Path) -> anyhow::Result<Option<File>> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("config file {}", path.display())),
    };
    if meta.len() > MAX_FILE_BYTES {
        bail!(
            "config file {}: {} bytes (at most {MAX_FILE_BYTES})",
            path.display(),
            meta.len()
        );
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    let file: File = toml::from_str(&text)
        .map_err(|e| anyhow::anyhow!("config file {}: {e}", path.display()))?;
    if let Some(c) = &file.current {
        if !file.contexts.contains_key(c) {
            bail!(
                "config file {}: current context {c:?} is not one of its contexts ({})",
                path.display(),
                names(&file)
            );
        }
    }
    Ok(Some(file))
}

fn names(f: &File) -> String {
    if f.contexts.is_empty() {
        return "it has none".into();
    }
    f.contexts.keys().cloned().collect::<Vec<_>>().join(", ")
}

/// A path from the file: `~/` is the home directory, a relative path is
/// relative to the file's directory.
fn file_relative(file: &Path, p: &Path) -> PathBuf {
    if let (Ok(rest), Some(home)) = (p.strip_prefix("~"), std::env::var_os("HOME")) {
        return Path::new(&home).join(rest);
    }
    if p.is_relative() {
        if let Some(dir) = file.parent() {
            return dir.join(p);
        }
    }
    p.to_path_buf()
}

/// The context the flags or the file choose, with its paths resolved:
/// `(name, context)`, or `None` when no context is chosen.
fn chosen(flags: &Flags, path: Option<&Path>) -> anyhow::Result<Option<(String, Ctx)>> {
    let file = match path {
        Some(p) => load(p)?.map(|f| (p, f)),
        None => None,
    };
    let want = flags
        .context
        .clone()
        .or_else(|| file.as_ref().and_then(|(_, f)| f.current.clone()));
    let Some(name) = want else {
        return Ok(None);
    };
    let Some((p, f)) = file else {
        bail!(
            "context {name:?}: no config file ({})",
            path.map_or("no $HOME".into(), |p| p.display().to_string())
        );
    };
    let Some(ctx) = f.contexts.get(&name) else {
        bail!(
            "context {name:?} is not in {} (contexts: {})",
            p.display(),
            names(&f)
        );
    };
    let mut ctx = ctx.clone();
    for v in [&mut ctx.ca, &mut ctx.cert, &mut ctx.key]
        .into_iter()
        .flatten()
    {
        *v = file_relative(p, v);
    }
    Ok(Some((name, ctx)))
}

/// What a call uses: each setting from its flag, else the chosen
/// context, else the default.
pub fn resolve(flags: &Flags) -> anyhow::Result<Target> {
    let ctx = chosen(flags, config_path().as_deref())?
        .map(|(_, c)| c)
        .unwrap_or_default();
    let timeout = match (&flags.timeout, &ctx.timeout) {
        (Some(t), _) => *t,
        (None, Some(t)) => crate::output::parse_duration(t)
            .map_err(|e| anyhow::anyhow!("the context's timeout {t:?}: {e}"))?,
        (None, None) => DEFAULT_TIMEOUT,
    };
    let supervisors = match &flags.supervisors {
        Some(s) => s.clone(),
        None if !ctx.supervisors.is_empty() => ctx.supervisors.clone(),
        None => vec![DEFAULT_SUPERVISOR.to_owned()],
    };
    // Certificates come as a set: a flag for any of them replaces the
    // context's TLS settings, so two sources are never mixed.
    let any_flag =
        flags.ca.is_some() || flags.cert.is_some() || flags.key.is_some() || flags.insecure;
    let tls = if any_flag {
        pki::TlsArgs {
            ca: flags.ca.clone(),
            cert: flags.cert.clone(),
            key: flags.key.clone(),
            insecure: flags.insecure,
        }
    } else {
        pki::TlsArgs {
            ca: ctx.ca,
            cert: ctx.cert,
            key: ctx.key,
            insecure: ctx.insecure,
        }
    };
    Ok(Target {
        supervisors,
        tls,
        timeout,
    })
}

/// `railguard context …` (offline: only the file is read or written).
#[derive(clap::Subcommand, Debug)]
pub enum ContextCmd {
    /// The contexts in the config file; `*` marks the current one.
    List,
    /// A context's settings, paths resolved (default: the one in use).
    Show {
        /// The context.
        name: Option<String>,
    },
    /// Make NAME the current context (writes the file's `current`, keeping
    /// the rest of the file as it is).
    Use {
        /// The context.
        name: String,
    },
}

/// Runs a `context` subcommand.
pub fn run(cmd: ContextCmd, flags: &Flags, json: bool) -> anyhow::Result<()> {
    let path = config_path().context("no config file: set $RAILGUARD_CONFIG or $HOME")?;
    match cmd {
        ContextCmd::List => {
            let file = load(&path)?.unwrap_or_default();
            let current = flags.context.clone().or(file.current.clone());
            if json {
                let list: Vec<serde_json::Value> = file
                    .contexts
                    .iter()
                    .map(|(n, c)| {
                        serde_json::json!({
                            "name": n,
                            "current": Some(n) == current.as_ref(),
                            "supervisors": c.supervisors,
                        })
                    })
                    .collect();
                crate::output::print_json(&list)?;
            } else if file.contexts.is_empty() {
                println!("no contexts in {}", path.display());
            } else {
                for (n, c) in &file.contexts {
                    let mark = if Some(n) == current.as_ref() {
                        "*"
                    } else {
                        " "
                    };
                    println!("{mark} {n}\t{}", c.supervisors.join(","));
                }
            }
        }
        ContextCmd::Show { name } => {
            let f = Flags {
                context: name.or_else(|| flags.context.clone()),
                ..Flags::default()
            };
            let Some((name, ctx)) = chosen(&f, Some(&path))? else {
                bail!(
                    "no context chosen: give a name, --context, or `current` in {}",
                    path.display()
                );
            };
            if json {
                crate::output::print_json(&serde_json::json!({"name": name, "context": ctx}))?;
            } else {
                println!("context {name} ({})", path.display());
                print!(
                    "{}",
                    toml::to_string(&ctx).context("cannot show the context")?
                );
            }
        }
        ContextCmd::Use { name } => {
            let file = load(&path)?.unwrap_or_default();
            if !file.contexts.contains_key(&name) {
                bail!(
                    "context {name:?} is not in {} (contexts: {})",
                    path.display(),
                    names(&file)
                );
            }
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let mut doc: toml_edit::DocumentMut = text
                .parse()
                .map_err(|e| anyhow::anyhow!("config file {}: {e}", path.display()))?;
            doc["current"] = toml_edit::value(name.as_str());
            write_atomically(&path, doc.to_string().as_bytes())?;
            println!("current context: {name}");
        }
    }
    Ok(())
}

/// Replaces `path` with `bytes` (a new file renamed over it, so a reader
/// never sees half a file; the old file's mode is kept).
fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mode = std::fs::metadata(path).map_or(0o600, |m| m.permissions().mode() & 0o7777);
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("config"),
        std::process::id()
    ));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        anyhow::anyhow!("cannot write {}: {e}", path.display())
    })
}
