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
    Table,
    Json,
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

pub fn print_json<T: Serialize>(v: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
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
        | ErrorKind::PermissionDenied => 2,
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
