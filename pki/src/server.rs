//! [`ServerTls`]: the rustls server configuration of a railguard gRPC port
//! (TLS 1.3 only, ring, client certificates required and checked by the
//! [`PeerVerifier`]), loaded from files and swapped atomically by
//! `reload` (on SIGHUP) so new handshakes use the new certificate while
//! open connections keep theirs.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use rustls::client::danger::ServerCertVerifier;
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{ServerName, UnixTime};
use rustls::server::{NoServerSessionStorage, WebPkiClientVerifier};
use rustls::{RootCertStore, ServerConfig};

use crate::error::PkiError;
use crate::files::{read_certs, read_key};
use crate::identity::Identity;
use crate::issue::{describe, SERVER_NAME};
use crate::revocations::Revocations;
use crate::serial::Serial;
use crate::verifier::PeerVerifier;

/// Where a server's PEM files are: read at `load` and again at each
/// `reload`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTlsFiles {
    /// The cluster CA certificate (`ca.pem`): the only trust anchor for
    /// client certificates.
    pub ca: PathBuf,
    /// This supervisor's certificate (chain), leaf first.
    pub cert: PathBuf,
    /// This supervisor's private key.
    pub key: PathBuf,
}

/// What the server currently serves with.
struct Loaded {
    config: Arc<ServerConfig>,
    identity: Identity,
    serial: Serial,
    not_after: SystemTime,
}

struct Shared {
    files: ServerTlsFiles,
    revocations: Revocations,
    current: RwLock<Arc<Loaded>>,
    /// Serializes reloads so two SIGHUPs cannot interleave.
    reloading: Mutex<()>,
}

/// A handle on a server's TLS configuration; clones share it (one per
/// process is enough for all its ports). Cheap to read per handshake.
#[derive(Clone)]
pub struct ServerTls {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cur = self.current();
        f.debug_struct("ServerTls")
            .field("files", &self.shared.files)
            .field("identity", &cur.identity)
            .field("serial", &cur.serial)
            .finish_non_exhaustive()
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Builds a server configuration from the files, checking that the
/// certificate is a supervisor's, chains to the CA, names [`SERVER_NAME`]
/// and is valid now.
fn build(files: &ServerTlsFiles, revocations: &Revocations) -> Result<Loaded, PkiError> {
    let provider = provider();
    let mut roots = RootCertStore::empty();
    for ca in read_certs(&files.ca)? {
        roots.add(ca)?;
    }
    let roots = Arc::new(roots);
    let chain = read_certs(&files.cert)?;
    let key = read_key(&files.key)?;
    let leaf = &chain[0];
    let info = describe(leaf)?;
    let unusable = |reason: String| PkiError::ServerCert {
        path: files.cert.clone(),
        reason,
    };
    let identity = match info.identity {
        Some(id) if id.is_server() => id,
        Some(id) => return Err(unusable(format!("{id} may not serve (only supervisors)"))),
        None => return Err(unusable("a CA certificate cannot serve".into())),
    };
    let server_check = WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone())
        .build()
        .map_err(|e| unusable(e.to_string()))?;
    let name = ServerName::try_from(SERVER_NAME).map_err(|e| unusable(e.to_string()))?;
    server_check
        .verify_server_cert(leaf, &chain[1..], &name, &[], UnixTime::now())
        .map_err(|e| {
            unusable(format!(
                "not valid for {SERVER_NAME} under {}: {e}",
                files.ca.display()
            ))
        })?;
    let inner = WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
        .build()
        .map_err(|e| PkiError::Tls(rustls::Error::General(e.to_string())))?;
    let verifier = Arc::new(PeerVerifier {
        inner,
        revocations: revocations.clone(),
    });
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)?;
    // gRPC is HTTP/2; tonic's client insists on ALPN `h2`.
    config.alpn_protocols = vec![b"h2".to_vec()];
    // No resumption: a resumed session skips client certificate
    // verification, which would let a revoked or expired certificate in.
    config.session_storage = Arc::new(NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(Loaded {
        config: Arc::new(config),
        identity,
        serial: info.serial,
        not_after: info.not_after,
    })
}

impl ServerTls {
    /// Loads CA, certificate and key; fails if any is missing or unusable
    /// (see [`ServerTlsFiles`]). `revocations` is shared, not copied: later
    /// changes to it apply to the next handshake.
    pub fn load(files: ServerTlsFiles, revocations: Revocations) -> Result<ServerTls, PkiError> {
        let loaded = build(&files, &revocations)?;
        tracing::info!(identity = %loaded.identity, serial = %loaded.serial, "TLS certificate loaded");
        Ok(ServerTls {
            shared: Arc::new(Shared {
                files,
                revocations,
                current: RwLock::new(Arc::new(loaded)),
                reloading: Mutex::new(()),
            }),
        })
    }

    fn current(&self) -> Arc<Loaded> {
        self.shared
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Reads the files again and, if they make a usable configuration,
    /// swaps it in atomically: handshakes that start afterwards use it,
    /// open connections are untouched. On error the old configuration stays
    /// and the error is returned. Returns the serial now served.
    pub fn reload(&self) -> Result<Serial, PkiError> {
        let _one = self
            .shared
            .reloading
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match build(&self.shared.files, &self.shared.revocations) {
            Ok(loaded) => {
                let serial = loaded.serial.clone();
                let old = self.current().serial.clone();
                tracing::info!(identity = %loaded.identity, %serial, old_serial = %old, "TLS certificate reloaded");
                *self
                    .shared
                    .current
                    .write()
                    .unwrap_or_else(|e| e.into_inner()) = Arc::new(loaded);
                Ok(serial)
            }
            Err(e) => {
                tracing::warn!(error = %e, serial = %self.current().serial, "TLS reload failed; keeping the current certificate");
                Err(e)
            }
        }
    }

    /// The configuration new handshakes use now.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.current().config.clone()
    }

    /// The serial of the certificate served now.
    pub fn serial(&self) -> Serial {
        self.current().serial.clone()
    }

    /// The identity of the certificate served now (a supervisor).
    pub fn identity(&self) -> Identity {
        self.current().identity.clone()
    }

    /// When the certificate served now expires.
    pub fn not_after(&self) -> SystemTime {
        self.current().not_after
    }

    /// The revocation list every handshake checks.
    pub fn revocations(&self) -> &Revocations {
        &self.shared.revocations
    }

    /// The files read by `load` and `reload`.
    pub fn files(&self) -> &ServerTlsFiles {
        &self.shared.files
    }
}
