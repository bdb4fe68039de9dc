//! [`LabPki`]: a cluster CA in a directory and certificates issued from it
//! on demand — what the demo, the tests and the netns scenarios use so
//! they run with mutual TLS like a real cluster.

use std::path::{Path, PathBuf};

use crate::error::PkiError;
use crate::identity::{Identity, Role};
use crate::issue::{init_ca, issue, CA_CERT_FILE};
use crate::server::ServerTlsFiles;

/// Days the lab CA and its certificates are valid.
const LAB_DAYS: u32 = 30;

/// A CA in `dir` (`dir/ca`) and the certificates issued from it
/// (`dir/<kind>-<name>.pem` and `.key`), issued once each.
#[derive(Debug, Clone)]
pub struct LabPki {
    dir: PathBuf,
}

impl LabPki {
    /// Creates the CA in `dir/ca`, or uses the one there.
    pub fn open(dir: &Path) -> Result<LabPki, PkiError> {
        let ca = dir.join("ca");
        if !ca.join(CA_CERT_FILE).exists() {
            init_ca(&ca, LAB_DAYS + 1)?;
        }
        Ok(LabPki {
            dir: dir.to_path_buf(),
        })
    }

    /// The CA certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca").join(CA_CERT_FILE)
    }

    /// The files of `id`'s certificate (issued now unless it exists).
    pub fn files(&self, id: &Identity) -> Result<ServerTlsFiles, PkiError> {
        let stem = id.file_stem();
        let cert = self.dir.join(format!("{stem}.pem"));
        let key = self.dir.join(format!("{stem}.key"));
        if cert.exists() {
            let held = crate::issue::show(&cert)?.identity;
            if held.as_ref() != Some(id) {
                return Err(PkiError::TlsSettings(format!(
                    "{} already holds the certificate of {}, not {id}",
                    cert.display(),
                    held.map_or("the CA".to_owned(), |h| h.to_string())
                )));
            }
        } else {
            let sans = if id.is_server() {
                vec!["127.0.0.1".to_owned(), "localhost".to_owned()]
            } else {
                Vec::new()
            };
            issue(&self.dir.join("ca"), id, &sans, LAB_DAYS, &self.dir)?;
        }
        Ok(ServerTlsFiles {
            ca: self.ca(),
            cert,
            key,
        })
    }

    /// Issues `id` a new certificate (new key, new serial) and puts it in
    /// place of the one its files hold, each file replaced atomically by
    /// a rename: what an operator does before sending SIGHUP. Returns the
    /// files (the same paths) and the new serial.
    pub fn renew(&self, id: &Identity) -> Result<(ServerTlsFiles, crate::Serial), PkiError> {
        let files = self.files(id)?;
        let staging = tempfile_dir(&self.dir)?;
        let sans = if id.is_server() {
            vec!["127.0.0.1".to_owned(), "localhost".to_owned()]
        } else {
            Vec::new()
        };
        let issued = issue(&self.dir.join("ca"), id, &sans, LAB_DAYS, &staging)?;
        std::fs::rename(&issued.key_path, &files.key).map_err(|e| PkiError::io(&files.key, e))?;
        std::fs::rename(&issued.cert_path, &files.cert)
            .map_err(|e| PkiError::io(&files.cert, e))?;
        let _ = std::fs::remove_dir(&staging);
        Ok((files, issued.serial))
    }

    /// Supervisor `member`'s files.
    pub fn supervisor(&self, member: u64) -> Result<ServerTlsFiles, PkiError> {
        self.files(&Identity::supervisor(member))
    }

    /// The agent of `host`.
    pub fn agent(&self, host: &str) -> Result<ServerTlsFiles, PkiError> {
        self.files(&Identity::agent(host)?)
    }

    /// Admin `user` with `role`.
    pub fn admin(&self, user: &str, role: Role) -> Result<ServerTlsFiles, PkiError> {
        self.files(&Identity::admin(user, role)?)
    }
}

impl ServerTlsFiles {
    /// `--ca FILE --cert FILE --key FILE`, for a program's command line.
    pub fn args(&self) -> Vec<String> {
        [
            ("--ca", &self.ca),
            ("--cert", &self.cert),
            ("--key", &self.key),
        ]
        .into_iter()
        .flat_map(|(f, p)| [f.to_owned(), p.display().to_string()])
        .collect()
    }

    /// `RAILGUARD_CA`, `RAILGUARD_CERT`, `RAILGUARD_KEY`: how the `railguard`
    /// CLI finds its files without flags.
    pub fn cli_env(&self) -> Vec<(&'static str, PathBuf)> {
        vec![
            ("RAILGUARD_CA", self.ca.clone()),
            ("RAILGUARD_CERT", self.cert.clone()),
            ("RAILGUARD_KEY", self.key.clone()),
        ]
    }
}

impl From<ServerTlsFiles> for crate::mode::TlsArgs {
    fn from(f: ServerTlsFiles) -> Self {
        crate::mode::TlsArgs {
            ca: Some(f.ca),
            cert: Some(f.cert),
            key: Some(f.key),
            insecure: false,
        }
    }
}

/// A new, empty directory under `dir` for one issue.
fn tempfile_dir(dir: &Path) -> Result<PathBuf, PkiError> {
    for n in 0..1000u32 {
        let p = dir.join(format!("renew-{n}"));
        match std::fs::create_dir(&p) {
            Ok(()) => return Ok(p),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(PkiError::io(p, e)),
        }
    }
    Err(PkiError::TlsSettings(format!(
        "{}: no free renew-N directory",
        dir.display()
    )))
}
