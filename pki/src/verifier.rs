//! The client-certificate verifier of every railguard server: rustls'
//! `WebPkiClientVerifier` (chain to the cluster CA, validity period
//! including expiry, client-auth usage, signatures) wrapped to also refuse
//! a revoked serial and a certificate that names no railguard identity.

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, Error, SignatureScheme};

use crate::identity::{parse_cert, Identity};
use crate::revocations::Revocations;
use crate::serial::Serial;

/// Verifies client certificates: WebPKI first, then the revocation list
/// and the identity encoding. Client authentication is mandatory.
#[derive(Debug)]
pub(crate) struct PeerVerifier {
    /// rustls' chain and validity verifier over the cluster CA.
    pub(crate) inner: Arc<dyn ClientCertVerifier>,
    /// Serials refused whatever their chain says.
    pub(crate) revocations: Revocations,
}

impl ClientCertVerifier for PeerVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        self.inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let cert = parse_cert(end_entity)
            .map_err(|_| Error::InvalidCertificate(CertificateError::BadEncoding))?;
        let serial = Serial::from_bytes(cert.raw_serial())
            .map_err(|_| Error::InvalidCertificate(CertificateError::BadEncoding))?;
        if self.revocations.contains(&serial) {
            tracing::debug!(%serial, "refused a revoked client certificate");
            return Err(Error::InvalidCertificate(CertificateError::Revoked));
        }
        if let Err(e) = Identity::from_x509(&cert) {
            tracing::debug!(%serial, error = %e, "refused a client certificate without identity");
            return Err(Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ));
        }
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
