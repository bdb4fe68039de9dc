//! How railguard's programs log: `tracing` to stderr, either as text —
//! coloured only when stderr is a terminal, so log files, journald and the
//! rank logs an agent captures get plain text — or as one JSON object per
//! line (`--log-format json`) for a log pipeline. `RUST_LOG` overrides each
//! program's default filter.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (ANSI colours only on a terminal).
    #[default]
    Text,
    /// One JSON object per line: timestamp, level, target, fields.
    Json,
}

/// Installs the process's subscriber, writing to stderr with `RUST_LOG`,
/// else `default_filter`. Returns false when one was installed already
/// (the first stays).
pub fn init(format: LogFormat, default_filter: &str) -> bool {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init()
            .is_ok(),
        LogFormat::Json => builder.json().with_ansi(false).try_init().is_ok(),
    }
}
