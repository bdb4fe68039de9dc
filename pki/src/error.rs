//! `PkiError`: every way loading, issuing, parsing or serving certificates
//! can fail, each naming the file or the rule involved.

use std::path::PathBuf;

/// An error of the PKI crate.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// The TLS settings a program was given do not make one choice (none,
    /// some of the three files, or files and `--insecure`).
    #[error("{0}")]
    TlsSettings(String),
    /// A file could not be read, created or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file concerned.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// `init_ca` found a CA (certificate or key) already in the directory;
    /// nothing was written.
    #[error("a CA already exists at {} (refusing to overwrite it)", path.display())]
    CaExists {
        /// The existing file.
        path: PathBuf,
    },
    /// `issue` found no CA (`ca.pem` and `ca.key`) in the CA directory;
    /// nothing was written.
    #[error("no CA in {} (ca.pem or ca.key is missing; create one with `railguard pki init`)", dir.display())]
    NoCa {
        /// The CA directory given.
        dir: PathBuf,
    },
    /// `issue` would overwrite a certificate or key file; nothing was
    /// written.
    #[error("{} already exists (refusing to overwrite it)", path.display())]
    FileExists {
        /// The existing file.
        path: PathBuf,
    },
    /// A PEM file holds no certificate, no private key, or is not PEM.
    #[error("{}: {what}", path.display())]
    Pem {
        /// The file concerned.
        path: PathBuf,
        /// What is missing or malformed.
        what: String,
    },
    /// A certificate's DER could not be parsed as X.509.
    #[error("certificate is not valid X.509: {0}")]
    X509(String),
    /// A certificate does not carry a railguard identity in the fixed
    /// encoding (see the crate header), or carries a malformed one.
    #[error("certificate names no valid railguard identity: {0}")]
    BadIdentity(String),
    /// A host, user or member name given to build an identity breaks the
    /// naming rules.
    #[error("invalid {what}: {reason}")]
    InvalidName {
        /// Which name (host name, user name, member id, role).
        what: &'static str,
        /// Which rule it breaks.
        reason: String,
    },
    /// A subject alternative name given to `issue` is neither an IP address
    /// nor a valid DNS name.
    #[error("invalid subject alternative name {0:?} (want a DNS name or an IP address)")]
    InvalidSan(String),
    /// An address given to `https_endpoint` does not make a URI, or tonic
    /// refused the TLS configuration for it.
    #[error("cannot make an endpoint for {addr:?}: {reason}")]
    Endpoint {
        /// The address given.
        addr: String,
        /// Why.
        reason: String,
    },
    /// A validity period that is empty or not representable.
    #[error("invalid validity: {0}")]
    InvalidValidity(String),
    /// A serial number that is not 1..=20 bytes of hex.
    #[error("invalid serial number {0:?} (want 1 to 40 hex digits)")]
    InvalidSerial(String),
    /// rcgen refused to build or sign a certificate or a key.
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    /// rustls refused a configuration (e.g. a key that does not match its
    /// certificate, or an empty CA store).
    #[error("TLS configuration refused: {0}")]
    Tls(#[from] rustls::Error),
    /// The server certificate does not chain to the CA, or does not name
    /// the fixed server name, or has expired.
    #[error("server certificate {} is not usable: {reason}", path.display())]
    ServerCert {
        /// The certificate file.
        path: PathBuf,
        /// Why it cannot serve.
        reason: String,
    },
}

impl PkiError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        PkiError::Io {
            path: path.into(),
            source,
        }
    }
}
