//! Output helpers shared by every command group: the output format, JSON,
//! timestamps, numbers, `k=v` lists, durations and exit codes.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::ValueEnum;
use serde::Serialize;
use supervisor::api::{ApiError, ErrorKind};

/// How replies are printed.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Tables and sentences for people.
    Table,
    /// JSON (pretty; streams such as `events --follow`: one object a line).
    Json,
    /// YAML, the same data as JSON (streams stay JSON lines).
    Yaml,
    /// Tables with more columns (host, NIC and job lists); other views
    /// print as `table`.
    Wide,
}

/// Set once at start when `--output yaml`: [`print_json`] writes YAML.
static YAML: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Set once at start when `--output wide`: see [`wide`].
static WIDE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl Output {
    /// Makes this the process's output, once at start: [`print_json`]
    /// writes YAML for `yaml`, tables add their columns for `wide`.
    pub fn choose(self) {
        YAML.store(self == Output::Yaml, std::sync::atomic::Ordering::Relaxed);
        WIDE.store(self == Output::Wide, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether replies are printed as data (JSON or YAML).
    pub fn structured(self) -> bool {
        matches!(self, Output::Json | Output::Yaml)
    }
}

/// Whether tables print their extra columns (`--output wide`).
pub fn wide() -> bool {
    WIDE.load(std::sync::atomic::Ordering::Relaxed)
}

/// Prints a table: a header line, then one line per row (`|row| [cells]`),
/// both laid out by the one format string so that the header and the rows
/// cannot drift apart. The format must not use a precision (`{:>6.1}`):
/// it would cut the header's names.
macro_rules! table {
    ($rows:expr, $fmt:literal, [$($head:expr),+ $(,)?], |$row:pat_param| [$($cell:expr),+ $(,)?] $(,)?) => {{
        println!($fmt, $($head),+);
        for $row in $rows {
            println!($fmt, $($cell),+);
        }
    }};
}
pub(crate) use table;

/// Prints `v` as pretty JSON, or as YAML under `--output yaml`.
pub fn print_json<T: Serialize>(v: &T) -> anyhow::Result<()> {
    if YAML.load(std::sync::atomic::Ordering::Relaxed) {
        print!("{}", to_yaml(&serde_json::to_value(v)?));
    } else {
        println!("{}", serde_json::to_string_pretty(v)?);
    }
    Ok(())
}

/// A JSON value as YAML (block style). Strings and keys are written as
/// YAML double-quoted scalars, which share JSON's escapes, so any text
/// reads back exactly; numbers, booleans and null are plain.
pub fn to_yaml(v: &serde_json::Value) -> String {
    let mut out = String::new();
    yaml_value(v, 0, &mut out);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

fn yaml_scalar(v: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    match v {
        Value::Null => Some("null".into()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) => Some(Value::String(s.clone()).to_string()),
        Value::Array(a) if a.is_empty() => Some("[]".into()),
        Value::Object(o) if o.is_empty() => Some("{}".into()),
        _ => None,
    }
}

/// Writes `v` at `indent` (the caller has written what precedes it on
/// the line: nothing, `- ` or `key:`).
fn yaml_value(v: &serde_json::Value, indent: usize, out: &mut String) {
    use serde_json::Value;
    let pad = " ".repeat(indent);
    match v {
        Value::Object(o) if !o.is_empty() => {
            for (k, x) in o {
                let key = Value::String(k.clone()).to_string();
                match yaml_scalar(x) {
                    Some(s) => out.push_str(&format!("{pad}{key}: {s}\n")),
                    None => {
                        out.push_str(&format!("{pad}{key}:\n"));
                        yaml_value(x, indent + 2, out);
                    }
                }
            }
        }
        Value::Array(a) if !a.is_empty() => {
            for x in a {
                match yaml_scalar(x) {
                    Some(s) => out.push_str(&format!("{pad}- {s}\n")),
                    None => {
                        // The item's first line goes after the dash.
                        let mut item = String::new();
                        yaml_value(x, indent + 2, &mut item);
                        let item = item.trim_start_matches(' ');
                        out.push_str(&format!("{pad}- {item}"));
                    }
                }
            }
        }
        scalar => {
            let s = yaml_scalar(scalar).unwrap_or_default();
            out.push_str(&format!("{pad}{s}\n"));
        }
    }
}

/// A Unix-milliseconds timestamp as RFC 3339 (`-` for 0).
pub fn fmt_ms(ms: u64) -> String {
    if ms == 0 {
        return "-".into();
    }
    let t = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}

/// `k=v` pairs joined by `sep`, or `empty` when there are none.
pub fn pairs<K: std::fmt::Display, V: std::fmt::Display>(
    m: &BTreeMap<K, V>,
    sep: &str,
    empty: &str,
) -> String {
    if m.is_empty() {
        return empty.into();
    }
    m.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(sep)
}

/// A float with `digits` decimals, or `-`.
pub fn num(x: Option<f64>, digits: usize) -> String {
    x.map(|v| format!("{v:.digits$}"))
        .unwrap_or_else(|| "-".into())
}

/// A `humantime` duration (`30s`, `5m`) for clap.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{s:?} is not a duration like 30s or 5m: {e}"))
}

/// The process exit code for a supervisor's refusal (see `railguard --help`).
pub fn exit_code(e: &ApiError) -> i32 {
    match e.kind {
        ErrorKind::InvalidArgument
        | ErrorKind::NotFound
        | ErrorKind::FailedPrecondition
        | ErrorKind::PermissionDenied
        | ErrorKind::ResourceExhausted => 2,
        ErrorKind::Unavailable => 3,
        ErrorKind::Unknown | ErrorKind::Internal => 4,
    }
}

/// Wall-clock time in Unix milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod yaml_tests {
    use super::to_yaml;

    #[test]
    fn values_nest_in_block_style_with_quoted_strings() {
        let v = serde_json::json!({
            "hosts": [{"name": "h0", "labels": {}, "nics": ["rail0", "rail1"]}],
            "leader": 1,
            "note": "a: b # not a comment\n\"quoted\"",
            "none": null,
            "grid": [[1, 2], []],
        });
        let y = to_yaml(&v);
        assert_eq!(
            y,
            "\"grid\":\n  - - 1\n    - 2\n  - []\n\"hosts\":\n  - \"labels\": {}\n    \"name\": \"h0\"\n    \"nics\":\n      - \"rail0\"\n      - \"rail1\"\n\"leader\": 1\n\"none\": null\n\"note\": \"a: b # not a comment\\n\\\"quoted\\\"\"\n"
        );
        assert_eq!(to_yaml(&serde_json::json!([])), "[]\n");
    }
}
