//! What every subcommand of `railguard-chaos` is: a [`Runner`] (its flags
//! and how to run them) returning an [`Outcome`], and the helpers the
//! runners share.

use std::future::Future;

use anyhow::bail;
use clap::{Args, FromArgMatches};
use serde::Serialize;
use serde_json::Value;

/// What a run returns: whether its checks passed, and its report (the
/// JSON object printed as the last line of stdout).
pub(crate) type Outcome = anyhow::Result<(bool, Value)>;

/// A subcommand's flags and how to run it.
pub(crate) trait Runner: Args + FromArgMatches + 'static {
    /// Checks the flags, asks for root if needed (`what` is e.g.
    /// `"scenario nic-flap"`, the name `require_root` reports) and runs.
    fn run(self, what: String) -> impl Future<Output = Outcome>;
}

/// The report of a run whose result serializes with an `ok` field.
pub(crate) fn report<T: Serialize>(ok: bool, r: &T) -> Outcome {
    Ok((ok, serde_json::to_value(r)?))
}

/// A JSON report is ok when its `ok` field is `true`.
pub(crate) fn value_report(v: Value) -> Outcome {
    Ok((v["ok"] == true, v))
}

/// Fails unless running as root (`require_root` prints why).
pub(crate) fn need_root(what: &str) -> anyhow::Result<()> {
    if !testbed::require_root(what)? {
        bail!("{what} needs root");
    }
    Ok(())
}
