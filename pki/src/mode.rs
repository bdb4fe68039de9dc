//! How a process takes its TLS settings from the operator: the three files
//! (`--ca`, `--cert`, `--key`, or a config file's `[tls]`), or
//! `--insecure` for a lab. Secure by default: no files and no
//! `--insecure` is an error that says what to do, and `--insecure` with
//! files is refused rather than silently ignoring either.

use std::path::PathBuf;

use crate::error::PkiError;
use crate::server::ServerTlsFiles;

/// What the operator gave: the `[tls]` table of a daemon's config file
/// (`ca`, `cert`, `key`, or `insecure = true`), or the flags.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsArgs {
    /// The cluster CA certificate.
    pub ca: Option<PathBuf>,
    /// This process's certificate.
    pub cert: Option<PathBuf>,
    /// This process's private key.
    pub key: Option<PathBuf>,
    /// Run without TLS or authentication (a lab only).
    #[serde(default)]
    pub insecure: bool,
}

/// `--ca`, `--cert`, `--key`, `--insecure` as a daemon takes them (clap).
#[cfg(feature = "clap")]
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TlsFlags {
    /// The cluster CA certificate (PEM; `railguard pki init`).
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// This process's certificate (`railguard pki issue …`).
    #[arg(long, value_name = "FILE")]
    pub cert: Option<PathBuf>,
    /// Its private key.
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// No TLS and no authentication (a lab only; refused with certificates).
    #[arg(long)]
    pub insecure: bool,
}

#[cfg(feature = "clap")]
impl From<TlsFlags> for TlsArgs {
    fn from(f: TlsFlags) -> TlsArgs {
        TlsArgs {
            ca: f.ca,
            cert: f.cert,
            key: f.key,
            insecure: f.insecure,
        }
    }
}

/// The resolved choice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsMode {
    /// Mutual TLS with these files.
    Mtls(ServerTlsFiles),
    /// Plain text, no authentication.
    Insecure,
}

impl TlsArgs {
    /// Fills what is missing here from `other` (flags over a config file).
    pub fn or(self, other: TlsArgs) -> TlsArgs {
        TlsArgs {
            ca: self.ca.or(other.ca),
            cert: self.cert.or(other.cert),
            key: self.key.or(other.key),
            insecure: self.insecure || other.insecure,
        }
    }

    /// The mode these settings ask for; `who` names the program in the
    /// error (e.g. "the supervisor").
    pub fn resolve(self, who: &str) -> Result<TlsMode, PkiError> {
        let given = [&self.ca, &self.cert, &self.key]
            .iter()
            .filter(|p| p.is_some())
            .count();
        match (self.insecure, given, self.ca, self.cert, self.key) {
            (true, 0, ..) => Ok(TlsMode::Insecure),
            (true, ..) => Err(PkiError::TlsSettings(format!(
                "{who}: --insecure is refused when certificates are configured (--ca/--cert/--key or [tls]); remove one or the other"
            ))),
            (false, _, Some(ca), Some(cert), Some(key)) => {
                Ok(TlsMode::Mtls(ServerTlsFiles { ca, cert, key }))
            }
            (false, 0, ..) => Err(PkiError::TlsSettings(format!(
                "{who}: no certificates configured: give --ca, --cert and --key (or [tls] ca, cert and key in the config file; `railguard pki` makes them), or --insecure for a lab cluster without authentication"
            ))),
            (false, ..) => Err(PkiError::TlsSettings(format!(
                "{who}: give all three of --ca, --cert and --key (or [tls] ca, cert and key), not only some"
            ))),
        }
    }
}

impl TlsMode {
    /// Whether this is mutual TLS.
    pub fn is_mtls(&self) -> bool {
        matches!(self, TlsMode::Mtls(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(ca: bool, cert: bool, key: bool, insecure: bool) -> TlsArgs {
        let p = |b: bool, n: &str| b.then(|| PathBuf::from(n));
        TlsArgs {
            ca: p(ca, "ca.pem"),
            cert: p(cert, "c.pem"),
            key: p(key, "c.key"),
            insecure,
        }
    }

    #[test]
    fn secure_by_default_and_never_both() {
        assert!(args(true, true, true, false)
            .resolve("x")
            .unwrap()
            .is_mtls());
        assert_eq!(
            args(false, false, false, true).resolve("x").unwrap(),
            TlsMode::Insecure
        );
        let e = args(false, false, false, false).resolve("x").unwrap_err();
        assert!(e.to_string().contains("--insecure for a lab"), "{e}");
        let e = args(true, true, true, true).resolve("x").unwrap_err();
        assert!(e.to_string().contains("--insecure is refused"), "{e}");
        let e = args(true, false, true, false).resolve("x").unwrap_err();
        assert!(e.to_string().contains("all three"), "{e}");
        let merged = args(false, true, true, false).or(args(true, false, false, false));
        assert!(merged.resolve("x").unwrap().is_mtls());
    }
}
