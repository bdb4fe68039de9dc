//! The client side: a tonic `ClientTlsConfig` that presents this process's
//! certificate and trusts only the cluster CA, verifying any supervisor by
//! the fixed name [`SERVER_NAME`] whatever address it was dialled at; and
//! an `https://` endpoint helper (tonic only does TLS for `https` URIs);
//! [`ClientTls`], reloadable like the server side.

use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

use crate::mode::TlsMode;
use crate::server::ServerTlsFiles;

use crate::error::PkiError;
use crate::files::{read_cert, read_certs, read_key, read_small};
use crate::identity::Identity;
use crate::incoming::HANDSHAKE_TIMEOUT;
use crate::issue::SERVER_NAME;

/// A tonic client TLS configuration from PEM files: `ca` (the cluster CA,
/// the only trust anchor), `cert` and `key` (this client's certificate and
/// key). Checks now that the files hold a CA, a certificate naming a
/// railguard identity and a key, so a misconfiguration fails at start, not
/// at the first call. The handshake times out after
/// [`HANDSHAKE_TIMEOUT`].
pub fn client_tls(ca: &Path, cert: &Path, key: &Path) -> Result<ClientTlsConfig, PkiError> {
    read_cert(ca)?;
    let leaf = read_cert(cert)?;
    Identity::from_cert_der(&leaf)?;
    read_key(key)?;
    let ca_pem = read_small(ca)?;
    let cert_pem = read_small(cert)?;
    let key_pem = read_small(key)?;
    Ok(ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .identity(tonic::transport::Identity::from_pem(cert_pem, key_pem))
        .domain_name(SERVER_NAME)
        .timeout(HANDSHAKE_TIMEOUT))
}

/// An endpoint for `addr` (`host:port`, or a URI whose scheme is replaced)
/// that speaks TLS with `tls`. Prefer this over building the URI by hand:
/// tonic silently skips TLS for an `http://` URI.
pub fn https_endpoint(addr: &str, tls: ClientTlsConfig) -> Result<Endpoint, PkiError> {
    let host_port = addr.split_once("://").map(|(_, rest)| rest).unwrap_or(addr);
    let err = |e: tonic::transport::Error| PkiError::Endpoint {
        addr: addr.into(),
        reason: e.to_string(),
    };
    Endpoint::from_shared(format!("https://{host_port}"))
        .map_err(err)?
        .tls_config(tls)
        .map_err(err)
}

/// What a client presents now, and which load it is.
struct ClientLoaded {
    config: ClientTlsConfig,
    identity: Identity,
    generation: u64,
}

/// The shared, reloadable state behind [`ClientTls::Mtls`]: a client's
/// files and the configuration last loaded from them.
pub struct ClientShared {
    files: ServerTlsFiles,
    current: RwLock<Arc<ClientLoaded>>,
    /// Serializes reloads so two SIGHUPs cannot interleave.
    reloading: Mutex<()>,
}

/// How this process dials supervisors: mutual TLS with its certificate,
/// or plain text (`--insecure`, a lab). Clones share one configuration,
/// which [`ClientTls::reload`] swaps (on SIGHUP) for the files' current
/// content: connections made afterwards present the new certificate;
/// holders of long-lived channels compare [`ClientTls::generation`] to
/// know when to dial again.
#[derive(Clone)]
pub enum ClientTls {
    /// TLS 1.3 presenting this process's certificate; the server must be a
    /// supervisor of the cluster CA ([`client_tls`]).
    Mtls(Arc<ClientShared>),
    /// Plain text, no authentication.
    Insecure,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientTls::Mtls(h) => {
                let cur = h.current();
                f.debug_struct("ClientTls::Mtls")
                    .field("files", &h.files)
                    .field("identity", &cur.identity)
                    .field("generation", &cur.generation)
                    .finish()
            }
            ClientTls::Insecure => f.write_str("ClientTls::Insecure"),
        }
    }
}

impl ClientShared {
    fn current(&self) -> Arc<ClientLoaded> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

fn load_client(files: &ServerTlsFiles, generation: u64) -> Result<ClientLoaded, PkiError> {
    let config = client_tls(&files.ca, &files.cert, &files.key)?;
    let identity = Identity::from_cert_der(&read_cert(&files.cert)?)?;
    Ok(ClientLoaded {
        config,
        identity,
        generation,
    })
}

impl ClientTls {
    /// The client side of a resolved TLS mode (reads and checks the files).
    pub fn from_mode(mode: &TlsMode) -> Result<ClientTls, PkiError> {
        Ok(match mode {
            TlsMode::Mtls(f) => ClientTls::Mtls(Arc::new(ClientShared {
                files: f.clone(),
                current: RwLock::new(Arc::new(load_client(f, 0)?)),
                reloading: Mutex::new(()),
            })),
            TlsMode::Insecure => ClientTls::Insecure,
        })
    }

    /// An endpoint for `addr`: `https://` with the TLS settings loaded
    /// now, or `http://` without (tonic only does TLS for `https`).
    pub fn endpoint(&self, addr: &str) -> Result<Endpoint, tonic::transport::Error> {
        match self {
            ClientTls::Mtls(h) => Endpoint::from_shared(format!("https://{addr}"))?
                .tls_config(h.current().config.clone()),
            ClientTls::Insecure => Endpoint::from_shared(format!("http://{addr}")),
        }
    }

    /// Which load of the files is in use: 0 at start, one more after each
    /// successful [`ClientTls::reload`]; always 0 without TLS.
    pub fn generation(&self) -> u64 {
        match self {
            ClientTls::Mtls(h) => h.current().generation,
            ClientTls::Insecure => 0,
        }
    }

    /// The identity presented now (none without TLS).
    pub fn identity(&self) -> Option<Identity> {
        match self {
            ClientTls::Mtls(h) => Some(h.current().identity.clone()),
            ClientTls::Insecure => None,
        }
    }

    /// Reads the files again and, if they hold a usable CA, certificate
    /// and key for the same identity, swaps them in: connections made from
    /// now on present the new certificate. On error the old configuration
    /// stays and the error is returned. Nothing to do without TLS.
    pub fn reload(&self) -> Result<(), PkiError> {
        let ClientTls::Mtls(h) = self else {
            return Ok(());
        };
        let _one = h.reloading.lock().unwrap_or_else(|e| e.into_inner());
        let old = h.current();
        let loaded = load_client(&h.files, old.generation + 1).and_then(|l| {
            if l.identity == old.identity {
                Ok(l)
            } else {
                Err(PkiError::TlsSettings(format!(
                    "{} now holds the certificate of {}, not of {}: a reload keeps the identity",
                    h.files.cert.display(),
                    l.identity,
                    old.identity
                )))
            }
        });
        match loaded {
            Ok(l) => {
                tracing::info!(identity = %l.identity, generation = l.generation, "client TLS certificate reloaded");
                *h.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(l);
                Ok(())
            }
            Err(e) => {
                tracing::warn!(error = %e, "client TLS reload failed; keeping the current certificate");
                Err(e)
            }
        }
    }
}

/// The trust anchors of a PEM CA bundle (e.g. the system's
/// `/etc/ssl/certs/ca-certificates.crt`), for verifying servers outside
/// the cluster such as webhook receivers. Certificates rustls cannot use
/// are skipped; a file with none it can use is an error.
pub fn ca_bundle(path: &Path) -> Result<rustls::RootCertStore, PkiError> {
    let mut roots = rustls::RootCertStore::empty();
    let (added, _skipped) = roots.add_parsable_certificates(read_certs(path)?);
    if added == 0 {
        return Err(PkiError::Pem {
            path: path.into(),
            what: "no usable CA certificate".into(),
        });
    }
    Ok(roots)
}

/// Checks a supervisor address as the operator gave it: `IP:port`, or
/// `host:port` whose host name resolves now (the name is dialled as
/// given; every supervisor certificate is verified by [`SERVER_NAME`]
/// whatever the address). The error says what is wrong.
pub fn check_supervisor_addr(addr: &str) -> Result<(), String> {
    use std::net::ToSocketAddrs;
    if addr.parse::<std::net::SocketAddr>().is_ok() {
        return Ok(());
    }
    let Some((host, port)) = addr.rsplit_once(':') else {
        return Err(format!(
            "supervisor address {addr:?} is not HOST:PORT (example: 10.0.0.1:7400 or sup1:7400)"
        ));
    };
    if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(format!(
            "supervisor address {addr:?} is not HOST:PORT with a port from 1 to 65535"
        ));
    }
    match addr.to_socket_addrs().map(|mut a| a.next()) {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(format!(
            "supervisor address {addr:?}: {host} has no address"
        )),
        Err(e) => Err(format!(
            "supervisor address {addr:?}: cannot resolve {host}: {e}"
        )),
    }
}
