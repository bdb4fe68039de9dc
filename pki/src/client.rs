//! The client side: a tonic `ClientTlsConfig` that presents this process's
//! certificate and trusts only the cluster CA, verifying any supervisor by
//! the fixed name [`SERVER_NAME`] whatever address it was dialled at; and
//! an `https://` endpoint helper (tonic only does TLS for `https` URIs).

use std::path::Path;

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

use crate::mode::TlsMode;

use crate::error::PkiError;
use crate::files::{read_cert, read_key, read_small};
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

/// How this process dials supervisors: mutual TLS with its certificate,
/// or plain text (`--insecure`, a lab).
#[derive(Clone, Debug)]
pub enum ClientTls {
    /// TLS 1.3 presenting this process's certificate; the server must be a
    /// supervisor of the cluster CA ([`client_tls`]).
    Mtls(Box<ClientTlsConfig>),
    /// Plain text, no authentication.
    Insecure,
}

impl ClientTls {
    /// The client side of a resolved TLS mode (reads and checks the files).
    pub fn from_mode(mode: &TlsMode) -> Result<ClientTls, PkiError> {
        Ok(match mode {
            TlsMode::Mtls(f) => ClientTls::Mtls(Box::new(client_tls(&f.ca, &f.cert, &f.key)?)),
            TlsMode::Insecure => ClientTls::Insecure,
        })
    }

    /// An endpoint for `addr`: `https://` with the TLS settings, or
    /// `http://` without (tonic only does TLS for `https`).
    pub fn endpoint(&self, addr: &str) -> Result<Endpoint, tonic::transport::Error> {
        match self {
            ClientTls::Mtls(c) => {
                Endpoint::from_shared(format!("https://{addr}"))?.tls_config((**c).clone())
            }
            ClientTls::Insecure => Endpoint::from_shared(format!("http://{addr}")),
        }
    }
}
