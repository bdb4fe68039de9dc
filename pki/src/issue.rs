//! Making certificates with rcgen: the cluster CA (`init_ca`), a
//! certificate for an [`Identity`] signed by it (`issue`), and reading one
//! back for people (`show`). Every file is written new with mode 0600; an
//! existing file is never overwritten, and a failed call writes nothing.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use serde::Serialize;
use x509_parser::extensions::GeneralName;

use crate::error::PkiError;
use crate::files::{read_cert, read_small, refuse_existing, write_new_private};
use crate::identity::{parse_cert, Identity, ORGANIZATION};
use crate::serial::Serial;

/// The DNS name every supervisor certificate carries, whatever address it
/// is dialled at; clients verify supervisors against this name (like
/// Nomad's `server.global.nomad`).
pub const SERVER_NAME: &str = "supervisor.railguard";
/// The CA certificate's file name in a CA directory.
pub const CA_CERT_FILE: &str = "ca.pem";
/// The CA private key's file name in a CA directory.
pub const CA_KEY_FILE: &str = "ca.key";
/// The CA certificate's common name.
pub const CA_COMMON_NAME: &str = "railguard cluster CA";
/// The longest validity `init_ca` and `issue` accept, in days (100 years).
pub const MAX_VALIDITY_DAYS: u32 = 36_500;
/// How far before "now" a new certificate starts being valid, so a peer
/// whose clock is a little behind accepts it at once.
pub const BACKDATE: Duration = Duration::from_secs(300);

/// When a certificate is valid: `not_before..=not_after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    /// First instant of validity.
    pub not_before: SystemTime,
    /// Last instant of validity.
    pub not_after: SystemTime,
}

impl Validity {
    /// From [`BACKDATE`] before now to `days` days after now; `days` must
    /// be 1..=[`MAX_VALIDITY_DAYS`].
    pub fn days(days: u32) -> Result<Validity, PkiError> {
        if days == 0 || days > MAX_VALIDITY_DAYS {
            return Err(PkiError::InvalidValidity(format!(
                "{days} days is not within 1..={MAX_VALIDITY_DAYS}"
            )));
        }
        let now = SystemTime::now();
        Ok(Validity {
            not_before: now - BACKDATE,
            not_after: now + Duration::from_secs(u64::from(days) * 86_400),
        })
    }

    fn check(&self) -> Result<(), PkiError> {
        if self.not_after <= self.not_before {
            return Err(PkiError::InvalidValidity(
                "not_after must be later than not_before".into(),
            ));
        }
        Ok(())
    }
}

/// What `init_ca` or `issue` wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Issued {
    /// The certificate file (PEM).
    pub cert_path: PathBuf,
    /// The private key file (PEM, PKCS#8, mode 0600).
    pub key_path: PathBuf,
    /// The new certificate's serial.
    pub serial: Serial,
    /// First instant of validity.
    pub not_before: SystemTime,
    /// Last instant of validity.
    pub not_after: SystemTime,
}

impl Issued {
    fn new(cert_path: PathBuf, key_path: PathBuf, serial: Serial, validity: &Validity) -> Issued {
        Issued {
            cert_path,
            key_path,
            serial,
            not_before: validity.not_before,
            not_after: validity.not_after,
        }
    }
}

/// A certificate described for people (`railguard pki show`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CertInfo {
    /// The holder; `None` only for a CA certificate.
    pub identity: Option<Identity>,
    /// Whether this is a CA certificate.
    pub is_ca: bool,
    /// The serial (lowercase hex).
    pub serial: Serial,
    /// First instant of validity.
    pub not_before: SystemTime,
    /// Last instant of validity.
    pub not_after: SystemTime,
    /// The subject, RFC 4514 style.
    pub subject: String,
    /// The issuer, RFC 4514 style.
    pub issuer: String,
    /// Subject alternative names: DNS names and IP addresses as written.
    pub sans: Vec<String>,
}

/// A random positive 128-bit serial with a non-zero first byte (so it is
/// always 32 hex digits).
fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] = (bytes[0] & 0x7f) | 0x40;
    SerialNumber::from_slice(&bytes)
}

fn base_params(validity: &Validity) -> Result<CertificateParams, PkiError> {
    validity.check()?;
    let mut params = CertificateParams::default();
    params.not_before = validity.not_before.into();
    params.not_after = validity.not_after.into();
    params.serial_number = Some(random_serial());
    params.use_authority_key_identifier_extension = true;
    Ok(params)
}

/// Creates the cluster CA in `dir` (created if missing): `ca.pem` and
/// `ca.key`, both mode 0600, a self-signed ECDSA P-256 CA that may sign
/// leaf certificates only (path length 0). Refuses with `CaExists` if
/// either file exists; writes nothing on any error.
pub fn init_ca(dir: &Path, validity_days: u32) -> Result<Issued, PkiError> {
    let validity = Validity::days(validity_days)?;
    let cert_path = dir.join(CA_CERT_FILE);
    let key_path = dir.join(CA_KEY_FILE);
    if let Err(PkiError::FileExists { path }) = refuse_existing(&[&cert_path, &key_path]) {
        return Err(PkiError::CaExists { path });
    }
    let mut params = base_params(&validity)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, ORGANIZATION);
    dn.push(DnType::CommonName, CA_COMMON_NAME);
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    let serial = serial_of(cert.der())?;
    std::fs::create_dir_all(dir).map_err(|e| PkiError::io(dir, e))?;
    write_new_private(&[
        (&key_path, key.serialize_pem().as_bytes()),
        (&cert_path, cert.pem().as_bytes()),
    ])
    .map_err(|e| match e {
        PkiError::FileExists { path } => PkiError::CaExists { path },
        e => e,
    })?;
    tracing::info!(ca = %cert_path.display(), %serial, "created the cluster CA");
    Ok(Issued::new(cert_path, key_path, serial, &validity))
}

/// Loads the CA of `ca_dir` for signing, checking its key matches it;
/// also returns when the CA expires.
fn load_ca(ca_dir: &Path) -> Result<(Issuer<'static, KeyPair>, SystemTime), PkiError> {
    let cert_path = ca_dir.join(CA_CERT_FILE);
    let key_path = ca_dir.join(CA_KEY_FILE);
    if !cert_path.exists() || !key_path.exists() {
        return Err(PkiError::NoCa { dir: ca_dir.into() });
    }
    let ca_der = read_cert(&cert_path)?;
    let key_pem = String::from_utf8(read_small(&key_path)?).map_err(|_| PkiError::Pem {
        path: key_path.clone(),
        what: "not PEM text".into(),
    })?;
    let key = KeyPair::from_pem(&key_pem).map_err(|e| PkiError::Pem {
        path: key_path.clone(),
        what: format!("no usable CA key: {e}"),
    })?;
    let ca = parse_cert(&ca_der)?;
    if !ca
        .basic_constraints()
        .ok()
        .flatten()
        .is_some_and(|b| b.value.ca)
    {
        return Err(PkiError::Pem {
            path: cert_path,
            what: "not a CA certificate".into(),
        });
    }
    if ca.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
        return Err(PkiError::Pem {
            path: key_path,
            what: format!("key does not match {}", cert_path.display()),
        });
    }
    let not_after = unix_to_system(ca.validity().not_after.timestamp());
    Ok((Issuer::from_ca_cert_der(&ca_der, key)?, not_after))
}

/// One subject alternative name: an IP address or a DNS name.
fn parse_san(s: &str) -> Result<SanType, PkiError> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    rustls::pki_types::DnsName::try_from(s).map_err(|_| PkiError::InvalidSan(s.into()))?;
    let ia5 = s.try_into().map_err(|_| PkiError::InvalidSan(s.into()))?;
    Ok(SanType::DnsName(ia5))
}

/// Issues a certificate for `identity` signed by the CA in `ca_dir`, valid
/// for `validity_days` from now, into `out_dir` (created if missing) as
/// `<stem>.pem` and `<stem>.key` (stem from [`Identity::file_stem`]), both
/// mode 0600. A supervisor's certificate may serve and carries
/// [`SERVER_NAME`] plus `sans`; agents and admins get client certificates.
/// Refuses to overwrite; writes nothing on any error.
pub fn issue(
    ca_dir: &Path,
    identity: &Identity,
    sans: &[String],
    validity_days: u32,
    out_dir: &Path,
) -> Result<Issued, PkiError> {
    issue_with_validity(
        ca_dir,
        identity,
        sans,
        Validity::days(validity_days)?,
        out_dir,
    )
}

/// [`issue`] with an explicit validity (which may lie in the past: tests
/// use it to make expired certificates).
pub fn issue_with_validity(
    ca_dir: &Path,
    identity: &Identity,
    sans: &[String],
    validity: Validity,
    out_dir: &Path,
) -> Result<Issued, PkiError> {
    identity.check()?;
    let mut names: Vec<String> = Vec::new();
    if identity.is_server() {
        names.push(SERVER_NAME.into());
    }
    for s in sans {
        if !names.contains(s) {
            names.push(s.clone());
        }
    }
    let san_types = names
        .iter()
        .map(|s| parse_san(s))
        .collect::<Result<Vec<_>, _>>()?;
    let stem = identity.file_stem();
    let cert_path = out_dir.join(format!("{stem}.pem"));
    let key_path = out_dir.join(format!("{stem}.key"));
    refuse_existing(&[&cert_path, &key_path])?;
    let (issuer, ca_not_after) = load_ca(ca_dir)?;
    if validity.not_after > ca_not_after {
        return Err(PkiError::InvalidValidity(format!(
            "the certificate would outlive the CA, which expires at {}",
            humantime::format_rfc3339_seconds(ca_not_after)
        )));
    }

    let mut params = base_params(&validity)?;
    params.distinguished_name = identity.distinguished_name();
    params.subject_alt_names = san_types;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = if identity.is_server() {
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ]
    } else {
        vec![ExtendedKeyUsagePurpose::ClientAuth]
    };
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    let serial = serial_of(cert.der())?;
    std::fs::create_dir_all(out_dir).map_err(|e| PkiError::io(out_dir, e))?;
    write_new_private(&[
        (&key_path, key.serialize_pem().as_bytes()),
        (&cert_path, cert.pem().as_bytes()),
    ])?;
    tracing::info!(%identity, %serial, cert = %cert_path.display(), "issued a certificate");
    Ok(Issued::new(cert_path, key_path, serial, &validity))
}

/// The serial of a DER certificate.
pub fn serial_of(der: &[u8]) -> Result<Serial, PkiError> {
    Serial::from_bytes(parse_cert(der)?.raw_serial())
}

pub(crate) fn unix_to_system(secs: i64) -> SystemTime {
    if secs >= 0 {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs.unsigned_abs())
    } else {
        SystemTime::UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
    }
}

/// Describes the first certificate of a PEM file; fails if it is not a CA
/// and names no valid identity.
pub fn show(file: &Path) -> Result<CertInfo, PkiError> {
    let der = read_cert(file)?;
    describe(&der)
}

/// Describes a DER certificate (see [`show`]).
pub fn describe(der: &[u8]) -> Result<CertInfo, PkiError> {
    let cert = parse_cert(der)?;
    let is_ca = cert
        .basic_constraints()
        .map_err(|e| PkiError::X509(e.to_string()))?
        .is_some_and(|b| b.value.ca);
    let identity = if is_ca {
        None
    } else {
        Some(Identity::from_x509(&cert)?)
    };
    let mut sans = Vec::new();
    if let Some(ext) = cert
        .subject_alternative_name()
        .map_err(|e| PkiError::X509(e.to_string()))?
    {
        for name in &ext.value.general_names {
            sans.push(match name {
                GeneralName::DNSName(d) => d.to_string(),
                GeneralName::IPAddress(b) => match b.len() {
                    4 => IpAddr::from(<[u8; 4]>::try_from(*b).unwrap_or_default()).to_string(),
                    16 => IpAddr::from(<[u8; 16]>::try_from(*b).unwrap_or_default()).to_string(),
                    _ => format!("IP?{b:02x?}"),
                },
                other => other.to_string(),
            });
        }
    }
    let validity = cert.validity();
    Ok(CertInfo {
        identity,
        is_ca,
        serial: Serial::from_bytes(cert.raw_serial())?,
        not_before: unix_to_system(validity.not_before.timestamp()),
        not_after: unix_to_system(validity.not_after.timestamp()),
        subject: cert.subject().to_string(),
        issuer: cert.issuer().to_string(),
        sans,
    })
}
