//! The client side: a tonic `ClientTlsConfig` that presents this process's
//! certificate and trusts only the cluster CA, verifying any supervisor by
//! the fixed name [`SERVER_NAME`] whatever address it was dialled at; and
//! an `https://` endpoint helper (tonic only does TLS for `https` URIs).

use std::path::Path;

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

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
