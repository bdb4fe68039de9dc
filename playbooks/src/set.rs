//! Checks across a set of playbooks (escalation references and cycles,
//! duplicate names), and file loading for the CLI and scenarios.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::diag::{closest, Diagnostic, PlaybookError};
use crate::parse::{parse_located, Located};
use crate::types::bounds::{MAX_FILES, MAX_FILE_BYTES, MAX_SET};
use crate::types::Playbook;

/// A problem with a set of playbooks taken together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetError {
    /// The set holds more playbooks than a set may.
    #[error("{count} playbooks, more than the {max} a set may hold")]
    TooMany {
        /// Playbooks in the set.
        count: usize,
        /// The bound ([`MAX_SET`]).
        max: usize,
    },
    /// Two playbooks share a name (names identify playbooks in escalations).
    #[error("two playbooks are named \"{name}\"")]
    DuplicateName {
        /// The shared name.
        name: String,
    },
    /// A playbook escalates to a playbook the set does not hold.
    #[error("playbook \"{playbook}\" escalates to missing playbook \"{target}\"")]
    MissingEscalation {
        /// The escalating playbook.
        playbook: String,
        /// The name it escalates to.
        target: String,
        /// The closest name in the set, if one is close.
        suggestion: Option<String>,
    },
    /// Escalations form a loop, so an incident could escalate forever.
    #[error("escalation cycle: {}", .cycle.join(" -> "))]
    EscalationCycle {
        /// The playbooks in escalation order, starting from the smallest
        /// name; the last escalates back to the first.
        cycle: Vec<String>,
    },
    /// No incident can start a playbook: it has no trigger and nothing
    /// escalates to it.
    #[error("playbook \"{playbook}\" has no trigger and no playbook escalates to it")]
    Unused {
        /// The unreachable playbook.
        playbook: String,
    },
}

impl SetError {
    /// The playbook the error is reported against.
    pub fn playbook(&self) -> Option<&str> {
        match self {
            SetError::TooMany { .. } => None,
            SetError::DuplicateName { name } => Some(name),
            SetError::MissingEscalation { playbook, .. } | SetError::Unused { playbook } => {
                Some(playbook)
            }
            SetError::EscalationCycle { cycle } => cycle.first().map(String::as_str),
        }
    }

    pub fn hint(&self) -> Option<String> {
        match self {
            SetError::TooMany { .. } => Some("delete playbooks that are no longer used".into()),
            SetError::DuplicateName { .. } => Some("playbook names must be unique".into()),
            SetError::MissingEscalation { suggestion, .. } => Some(match suggestion {
                Some(s) => format!("did you mean \"{s}\"?"),
                None => "apply the target playbook too, or fix the name".into(),
            }),
            SetError::EscalationCycle { .. } => {
                Some("escalation must end: make one playbook in the cycle stop escalating".into())
            }
            SetError::Unused { .. } => {
                Some("add a [trigger], or name it in another playbook's on_failure".into())
            }
        }
    }
}

/// Validates a set of (individually valid) playbooks. Pure; never panics.
pub fn validate_set(set: &[Playbook]) -> Result<(), Vec<SetError>> {
    let mut errors = Vec::new();
    if set.len() > MAX_SET {
        errors.push(SetError::TooMany {
            count: set.len(),
            max: MAX_SET,
        });
        return Err(errors);
    }
    let mut by_name: BTreeMap<&str, &Playbook> = BTreeMap::new();
    for p in set {
        if by_name.insert(p.name.as_str(), p).is_some() {
            errors.push(SetError::DuplicateName {
                name: p.name.clone(),
            });
        }
    }
    let mut referenced: BTreeSet<&str> = BTreeSet::new();
    for p in by_name.values() {
        if let Some(t) = &p.on_failure {
            referenced.insert(t.as_str());
            if !by_name.contains_key(t.as_str()) {
                errors.push(SetError::MissingEscalation {
                    playbook: p.name.clone(),
                    target: t.clone(),
                    suggestion: closest(t, by_name.keys().copied()).map(str::to_string),
                });
            }
        }
    }
    // Each playbook escalates to at most one other: walk each chain, and
    // report each cycle once (rotated to start at its smallest name).
    let mut cycles: BTreeSet<Vec<String>> = BTreeSet::new();
    for start in by_name.keys() {
        let mut path: Vec<&str> = vec![start];
        let mut cur = *start;
        while let Some(next) = by_name.get(cur).and_then(|p| p.on_failure.as_deref()) {
            if !by_name.contains_key(next) || path.len() > by_name.len() {
                break;
            }
            if let Some(pos) = path.iter().position(|n| *n == next) {
                let cyc = &path[pos..];
                let min = cyc
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, n)| **n)
                    .map_or(0, |(i, _)| i);
                let rotated: Vec<String> = cyc[min..]
                    .iter()
                    .chain(&cyc[..min])
                    .map(|s| s.to_string())
                    .collect();
                cycles.insert(rotated);
                break;
            }
            path.push(next);
            cur = next;
        }
    }
    errors.extend(
        cycles
            .into_iter()
            .map(|cycle| SetError::EscalationCycle { cycle }),
    );
    for p in by_name.values() {
        if p.trigger.is_none() && !referenced.contains(p.name.as_str()) {
            errors.push(SetError::Unused {
                playbook: p.name.clone(),
            });
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Parses and validates several files' texts as one set: each file alone,
/// then the set; set errors are located at the offending `on_failure` or
/// `name`. `Ok` holds the playbooks in input order.
pub fn check_sources<'a>(
    sources: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<Vec<Playbook>, PlaybookError> {
    let mut diags = Vec::new();
    let mut parsed: Vec<Located> = Vec::new();
    for (file, text) in sources {
        match parse_located(file, text) {
            Ok(l) => parsed.push(l),
            Err(e) => diags.extend(e.0),
        }
    }
    let mut first: BTreeMap<&str, &Located> = BTreeMap::new();
    for l in &parsed {
        if let Some(prev) = first.get(l.playbook.name.as_str()) {
            diags.push(Diagnostic {
                file: l.file.clone(),
                line: l.name_at.0,
                column: l.name_at.1,
                message: format!("two playbooks are named \"{}\"", l.playbook.name),
                hint: Some(format!(
                    "also defined at {}:{}:{}; playbook names must be unique",
                    prev.file, prev.name_at.0, prev.name_at.1
                )),
            });
        } else {
            first.insert(l.playbook.name.as_str(), l);
        }
    }
    let set: Vec<Playbook> = first.values().map(|l| l.playbook.clone()).collect();
    if let Err(errs) = validate_set(&set) {
        for e in errs {
            if matches!(e, SetError::DuplicateName { .. }) {
                continue; // reported above, with both places
            }
            let at = e.playbook().and_then(|n| first.get(n));
            let (file, (line, column)) = match (at, &e) {
                (
                    Some(l),
                    SetError::MissingEscalation { .. } | SetError::EscalationCycle { .. },
                ) => (l.file.clone(), l.on_failure_at.unwrap_or(l.name_at)),
                (Some(l), _) => (l.file.clone(), l.name_at),
                (None, _) => (
                    parsed.first().map(|l| l.file.clone()).unwrap_or_default(),
                    (1, 1),
                ),
            };
            diags.push(Diagnostic {
                file,
                line,
                column,
                message: e.to_string(),
                hint: e.hint(),
            });
        }
    }
    if diags.is_empty() {
        Ok(parsed.into_iter().map(|l| l.playbook).collect())
    } else {
        Err(PlaybookError(diags))
    }
}

/// Reads, parses and validates files as one set.
pub fn load_files<P: AsRef<Path>>(paths: &[P]) -> Result<Vec<Playbook>, PlaybookError> {
    let at_start = |file: String, message: String, hint: Option<String>| Diagnostic {
        file,
        line: 1,
        column: 1,
        message,
        hint,
    };
    if paths.len() > MAX_FILES {
        return Err(PlaybookError(vec![at_start(
            paths[MAX_FILES].as_ref().display().to_string(),
            format!(
                "{} files, more than the {MAX_FILES} checked at once",
                paths.len()
            ),
            None,
        )]));
    }
    let mut diags = Vec::new();
    let mut texts: Vec<(String, String)> = Vec::new();
    for p in paths {
        let p = p.as_ref();
        let name = p.display().to_string();
        match std::fs::metadata(p) {
            Ok(m) if m.len() > MAX_FILE_BYTES as u64 => {
                diags.push(at_start(
                    name,
                    format!(
                        "file is {} bytes, more than the {MAX_FILE_BYTES} allowed",
                        m.len()
                    ),
                    None,
                ));
                continue;
            }
            Ok(_) => {}
            Err(e) => {
                diags.push(at_start(name, format!("cannot read: {e}"), None));
                continue;
            }
        }
        match std::fs::read_to_string(p) {
            Ok(t) => texts.push((name, t)),
            Err(e) => diags.push(at_start(name, format!("cannot read: {e}"), None)),
        }
    }
    let result = check_sources(texts.iter().map(|(f, t)| (f.as_str(), t.as_str())));
    match result {
        Ok(set) if diags.is_empty() => {
            tracing::debug!(
                files = paths.len(),
                playbooks = set.len(),
                "playbooks valid"
            );
            Ok(set)
        }
        Ok(_) => Err(PlaybookError(diags)),
        Err(e) => {
            diags.extend(e.0);
            tracing::debug!(
                files = paths.len(),
                errors = diags.len(),
                "playbooks rejected"
            );
            Err(PlaybookError(diags))
        }
    }
}

/// Every problem in these files taken as one set (empty: all valid).
pub fn check_files<P: AsRef<Path>>(paths: &[P]) -> Vec<Diagnostic> {
    load_files(paths).err().map(|e| e.0).unwrap_or_default()
}

/// The `*.toml` files directly in `dir`, sorted.
pub fn toml_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "toml") && path.is_file() {
            out.push(path);
            if out.len() > MAX_FILES {
                break;
            }
        }
    }
    out.sort();
    Ok(out)
}
