//! The client side: a tonic `ClientTlsConfig` that presents this process's
//! certificate and trusts only the cluster CA, verifying any supervisor by
//! the fixed name [`SERVER_NAME`] whatever address it was dialled at; and
//! an `https://` endpoint helper (tonic only does TLS for `https` URIs);
//! [`ClientTls`], reloadable like the server side.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
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
    let leaf = read_cert(cert)?;
    Identity::from_cert_der(&leaf)?;
    read_cert(ca)?;
    check_key_matches(cert, key)?;
    let ca_pem = read_small(ca)?;
    let cert_pem = read_small(cert)?;
    let key_pem = read_small(key)?;
    Ok(ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .identity(tonic::transport::Identity::from_pem(cert_pem, key_pem))
        .domain_name(SERVER_NAME)
        .timeout(HANDSHAKE_TIMEOUT))
}

fn unusable(cert: &Path, reason: String) -> PkiError {
    PkiError::TlsSettings(format!("{}: {reason}", cert.display()))
}

/// The key in `key` belongs to the certificate in `cert`.
fn check_key_matches(cert: &Path, key: &Path) -> Result<(), PkiError> {
    let provider = rustls::crypto::ring::default_provider();
    let signing = provider
        .key_provider
        .load_private_key(read_key(key)?)
        .map_err(|e| {
            unusable(
                cert,
                format!("the key in {} is unusable: {e}", key.display()),
            )
        })?;
    rustls::sign::CertifiedKey::new(read_certs(cert)?, signing)
        .keys_match()
        .map_err(|e| {
            unusable(
                cert,
                format!(
                    "the key in {} does not belong to this certificate ({e})",
                    key.display()
                ),
            )
        })
}

/// What a server will check of a client's certificate, checked before a
/// reload swaps it in (so a half-copied, foreign or expired file is
/// refused while the old one keeps working): it chains to the CA and is
/// valid now. (At start the files are taken as given, so a test can
/// present a bad certificate on purpose; the server refuses it.)
fn check_chains_to_ca(ca: &Path, cert: &Path) -> Result<(), PkiError> {
    use rustls::pki_types::UnixTime;
    use rustls::server::WebPkiClientVerifier;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let chain = read_certs(cert)?;
    let mut roots = rustls::RootCertStore::empty();
    for c in read_certs(ca)? {
        roots.add(c)?;
    }
    let verifier =
        WebPkiClientVerifier::builder_with_provider(std::sync::Arc::new(roots), provider)
            .build()
            .map_err(|e| unusable(cert, e.to_string()))?;
    verifier
        .verify_client_cert(&chain[0], &chain[1..], UnixTime::now())
        .map_err(|e| unusable(cert, format!("not valid under {} now: {e}", ca.display())))?;
    Ok(())
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

/// What a client presents now.
struct ClientLoaded {
    config: ClientTlsConfig,
    identity: Identity,
}

/// The shared, reloadable state behind [`ClientTls::Mtls`]: a client's
/// files and the configuration last loaded from them.
pub struct ClientShared {
    files: ServerTlsFiles,
    current: RwLock<Arc<ClientLoaded>>,
    /// Successful reloads so far: read on every Raft RPC, so an atomic
    /// rather than the lock.
    generation: AtomicU64,
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
                    .field("generation", &h.generation.load(Ordering::Acquire))
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

fn load_client(files: &ServerTlsFiles) -> Result<ClientLoaded, PkiError> {
    let config = client_tls(&files.ca, &files.cert, &files.key)?;
    let identity = Identity::from_cert_der(&read_cert(&files.cert)?)?;
    Ok(ClientLoaded { config, identity })
}

impl ClientTls {
    /// The client side of a resolved TLS mode (reads and checks the files).
    pub fn from_mode(mode: &TlsMode) -> Result<ClientTls, PkiError> {
        Ok(match mode {
            TlsMode::Mtls(f) => ClientTls::Mtls(Arc::new(ClientShared {
                files: f.clone(),
                current: RwLock::new(Arc::new(load_client(f)?)),
                generation: AtomicU64::new(0),
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
            ClientTls::Mtls(h) => h.generation.load(Ordering::Acquire),
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
        let loaded = check_chains_to_ca(&h.files.ca, &h.files.cert)
            .and_then(|()| load_client(&h.files))
            .and_then(|l| {
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
                let identity = l.identity.clone();
                *h.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(l);
                // Bumped after the swap: whoever sees the new generation
                // dials with the new configuration.
                let generation = h.generation.fetch_add(1, Ordering::AcqRel) + 1;
                tracing::info!(%identity, generation, "client TLS certificate reloaded");
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

/// Checks a supervisor address's form: `IP:port`, or `host:port` with a
/// port from 1 to 65535 (the name is dialled as given; every supervisor
/// certificate is verified by [`SERVER_NAME`] whatever the address).
pub fn check_supervisor_addr(addr: &str) -> Result<(), String> {
    if let Ok(a) = addr.parse::<std::net::SocketAddr>() {
        return if a.port() == 0 {
            Err(format!("supervisor address {addr:?} has port 0"))
        } else {
            Ok(())
        };
    }
    match addr.rsplit_once(':') {
        Some((host, port))
            if !host.is_empty()
                && !host.contains(['/', ' '])
                && port.parse::<u16>().is_ok_and(|p| p != 0) =>
        {
            Ok(())
        }
        _ => Err(format!(
            "supervisor address {addr:?} is not HOST:PORT (example: 10.0.0.1:7400 or sup1:7400)"
        )),
    }
}

/// Checks a list of supervisor addresses: each has the right form
/// ([`check_supervisor_addr`]) and at least one can be dialled now (an IP
/// address, or a name that resolves). A name that does not resolve while
/// others do is only logged: one retired supervisor must not stop a
/// process that can reach the rest.
pub fn check_supervisor_addrs(addrs: &[String]) -> Result<(), String> {
    use std::net::ToSocketAddrs;
    for a in addrs {
        check_supervisor_addr(a)?;
    }
    let mut failures = Vec::new();
    for a in addrs {
        if a.parse::<std::net::SocketAddr>().is_ok() {
            return Ok(());
        }
        let host = a.rsplit_once(':').map_or(a.as_str(), |(h, _)| h);
        match a.to_socket_addrs().map(|mut x| x.next()) {
            Ok(Some(_)) => {
                for f in &failures {
                    tracing::warn!(problem = %f, "a supervisor address does not resolve; using the others");
                }
                return Ok(());
            }
            Ok(None) => failures.push(format!("{a:?}: {host} has no address")),
            Err(e) => failures.push(format!("{a:?}: cannot resolve {host}: {e}")),
        }
    }
    Err(format!(
        "no supervisor address can be dialled: {}",
        failures.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn supervisor_addresses_are_ip_or_host_and_one_must_be_reachable() {
        for ok in [
            "10.0.0.1:7400",
            "[::1]:7400",
            "localhost:7400",
            "sup-1.example:1",
        ] {
            assert_eq!(check_supervisor_addr(ok), Ok(()), "{ok}");
        }
        for bad in [
            "10.0.0.1",
            "localhost",
            ":7400",
            "h:0",
            "h:70000",
            "10.0.0.1:0",
            "a b:1",
        ] {
            assert!(check_supervisor_addr(bad).is_err(), "{bad}");
        }
        // One dialable address is enough; the unresolvable one is logged.
        assert_eq!(
            check_supervisor_addrs(&list(&["nosuchhost.invalid:7400", "127.0.0.1:7400"])),
            Ok(())
        );
        assert_eq!(check_supervisor_addrs(&list(&["localhost:7400"])), Ok(()));
        let e = check_supervisor_addrs(&list(&["nosuchhost.invalid:7400"])).unwrap_err();
        assert!(e.contains("cannot resolve nosuchhost.invalid"), "{e}");
        let e = check_supervisor_addrs(&list(&["127.0.0.1:7400", "nope"])).unwrap_err();
        assert!(
            e.contains("HOST:PORT"),
            "a malformed address is refused: {e}"
        );
    }
}
