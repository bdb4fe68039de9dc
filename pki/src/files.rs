//! Reading PEM certificates and keys from disk, and writing new files
//! exclusively (never over an existing one) with mode 0600.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::PkiError;

/// The largest PEM file read: far above any certificate or key, small
/// enough that a wrong path (a log, a device) is refused instead of read.
const MAX_PEM_BYTES: u64 = 1 << 20;

/// Reads a whole file of at most [`MAX_PEM_BYTES`].
pub(crate) fn read_small(path: &Path) -> Result<Vec<u8>, PkiError> {
    let meta = std::fs::metadata(path).map_err(|e| PkiError::io(path, e))?;
    if meta.len() > MAX_PEM_BYTES {
        return Err(PkiError::Pem {
            path: path.into(),
            what: format!("larger than {MAX_PEM_BYTES} bytes; not a PEM file"),
        });
    }
    std::fs::read(path).map_err(|e| PkiError::io(path, e))
}

/// Every certificate in a PEM file, in order; fails if there is none.
pub(crate) fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, PkiError> {
    let bytes = read_small(path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| PkiError::Pem {
            path: path.into(),
            what: format!("malformed PEM: {e}"),
        })?;
    if certs.is_empty() {
        return Err(PkiError::Pem {
            path: path.into(),
            what: "no CERTIFICATE block".into(),
        });
    }
    Ok(certs)
}

/// The first certificate of a PEM file.
pub(crate) fn read_cert(path: &Path) -> Result<CertificateDer<'static>, PkiError> {
    let mut certs = read_certs(path)?;
    Ok(certs.swap_remove(0))
}

/// The private key of a PEM file (PKCS#8, SEC1 or PKCS#1).
pub(crate) fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, PkiError> {
    let bytes = read_small(path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| PkiError::Pem {
        path: path.into(),
        what: format!("no usable private key: {e}"),
    })
}

/// Fails with `FileExists` if any of `paths` exists (or cannot be checked).
pub(crate) fn refuse_existing(paths: &[&Path]) -> Result<(), PkiError> {
    for p in paths {
        match std::fs::symlink_metadata(p) {
            Ok(_) => {
                return Err(PkiError::FileExists {
                    path: p.to_path_buf(),
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(PkiError::io(*p, e)),
        }
    }
    Ok(())
}

/// Writes each `(path, contents)` as a new file with mode 0600, created
/// exclusively (an existing file or symlink is never followed or
/// replaced). All or nothing: if one write fails, the files already
/// written by this call are removed.
pub(crate) fn write_new_private(files: &[(&Path, &[u8])]) -> Result<(), PkiError> {
    let mut written: Vec<PathBuf> = Vec::new();
    for (path, contents) in files {
        if let Err(e) = write_one(path, contents) {
            for w in &written {
                let _ = std::fs::remove_file(w);
            }
            return Err(e);
        }
        written.push(path.to_path_buf());
    }
    Ok(())
}

fn write_one(path: &Path, contents: &[u8]) -> Result<(), PkiError> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => PkiError::FileExists { path: path.into() },
            _ => PkiError::io(path, e),
        })?;
    let res = f.write_all(contents).and_then(|()| f.sync_all());
    if let Err(e) = res {
        drop(f);
        let _ = std::fs::remove_file(path);
        return Err(PkiError::io(path, e));
    }
    Ok(())
}
