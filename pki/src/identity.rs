//! Who holds a certificate: [`Identity`] (a supervisor, an agent or an
//! admin with a [`Role`]), its fixed encoding in the certificate's subject,
//! and the strict parser that reads it back.
//!
//! The encoding (documented in the crate header too): subject
//! `O=railguard`, `OU=<kind>`, `CN=<name>`, each exactly once and nothing
//! else, where `<kind>` is `supervisor`, `agent` or `admin-<role>`
//! (`admin-viewer`, `admin-operator`, `admin-admin`) and `<name>` is the
//! member id in canonical decimal, the host name or the user name (a
//! UTF8String). A CA certificate never parses as an identity.

use std::fmt;
use std::str::FromStr;

use rcgen::{DistinguishedName, DnType};
use serde::{Deserialize, Serialize};
use x509_parser::oid_registry::{
    OID_X509_COMMON_NAME, OID_X509_ORGANIZATIONAL_UNIT, OID_X509_ORGANIZATION_NAME,
};
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::error::PkiError;

/// The value of `O` in every railguard certificate subject.
pub const ORGANIZATION: &str = "railguard";

/// The longest host or user name, in bytes: the same bound as the model's
/// `supervisor::model::limits::MAX_NAME_LEN` (kept by value so this crate
/// does not depend on the supervisor).
pub const MAX_NAME_LEN: usize = 253;

/// What an admin may do, ordered: `Viewer < Operator < Admin`. Spelled in
/// lowercase (`viewer`, `operator`, `admin`) by `Display` and `FromStr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads only.
    Viewer,
    /// Reads, and operates nodes, NICs, jobs and playbooks.
    Operator,
    /// Everything, cluster membership included.
    Admin,
}

impl Role {
    /// Every role, lowest first.
    pub const ALL: [Role; 3] = [Role::Viewer, Role::Operator, Role::Admin];

    /// The lowercase name (`viewer`, `operator`, `admin`).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = PkiError;

    /// Exactly `viewer`, `operator` or `admin` (lowercase, no spaces).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| PkiError::InvalidName {
                what: "role",
                reason: format!("{s:?} is not one of viewer, operator, admin"),
            })
    }
}

/// Who holds a certificate. A server takes it from the verified peer
/// certificate ([`Identity::from_cert_der`], strict), never from a request
/// field. Build one to issue with the checking constructors; `issue`
/// checks it again ([`Identity::check`]) in case it was built by hand.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Identity {
    /// A supervisor, by its Raft member id.
    Supervisor {
        /// The Raft member id.
        member: u64,
    },
    /// A node agent, by its host name.
    Agent {
        /// The host name it registers under.
        host: String,
    },
    /// A person or tool using the admin API.
    Admin {
        /// The user name recorded with its writes.
        user: String,
        /// What it may do.
        role: Role,
    },
}

/// Checks a host or user name with the model's rules: 1 to
/// [`MAX_NAME_LEN`] bytes, no whitespace or control characters.
pub fn check_name(what: &'static str, s: &str) -> Result<(), PkiError> {
    let reason = if s.is_empty() {
        "must not be empty".to_string()
    } else if s.len() > MAX_NAME_LEN {
        format!("is longer than {MAX_NAME_LEN} bytes")
    } else if s.chars().any(|c| c.is_control() || c.is_whitespace()) {
        format!("{s:?} contains whitespace or control characters")
    } else {
        return Ok(());
    };
    Err(PkiError::InvalidName { what, reason })
}

/// A member id in canonical decimal: digits only, no sign, no leading zero.
fn parse_member(s: &str) -> Result<u64, PkiError> {
    let canonical =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    match s.parse::<u64>() {
        Ok(m) if canonical => Ok(m),
        _ => Err(PkiError::InvalidName {
            what: "member id",
            reason: format!("{s:?} is not a decimal u64 without sign or leading zeros"),
        }),
    }
}

impl Identity {
    /// A supervisor identity (every u64 is a valid member id).
    pub fn supervisor(member: u64) -> Identity {
        Identity::Supervisor { member }
    }

    /// An agent identity; fails if `host` breaks the naming rules.
    pub fn agent(host: impl Into<String>) -> Result<Identity, PkiError> {
        let host = host.into();
        check_name("host name", &host)?;
        Ok(Identity::Agent { host })
    }

    /// An admin identity; fails if `user` breaks the naming rules.
    pub fn admin(user: impl Into<String>, role: Role) -> Result<Identity, PkiError> {
        let user = user.into();
        check_name("user name", &user)?;
        Ok(Identity::Admin { user, role })
    }

    /// Checks the name against the naming rules (what the constructors
    /// do), for an identity built from its public variants.
    pub fn check(&self) -> Result<(), PkiError> {
        match self {
            Identity::Supervisor { .. } => Ok(()),
            Identity::Agent { host } => check_name("host name", host),
            Identity::Admin { user, .. } => check_name("user name", user),
        }
    }

    /// The admin's role, or `None` for a supervisor or an agent.
    pub fn admin_role(&self) -> Option<Role> {
        match self {
            Identity::Admin { role, .. } => Some(*role),
            _ => None,
        }
    }

    /// Whether certificates of this identity may serve (only supervisors
    /// run gRPC servers; their certificates carry both server and client
    /// authentication).
    pub fn is_server(&self) -> bool {
        matches!(self, Identity::Supervisor { .. })
    }

    /// The subject's `OU`: `supervisor`, `agent` or `admin-<role>`.
    pub fn kind_label(&self) -> String {
        match self {
            Identity::Supervisor { .. } => "supervisor".into(),
            Identity::Agent { .. } => "agent".into(),
            Identity::Admin { role, .. } => format!("admin-{role}"),
        }
    }

    /// The subject's `CN`: the member id, host name or user name.
    pub fn name(&self) -> String {
        match self {
            Identity::Supervisor { member } => member.to_string(),
            Identity::Agent { host } => host.clone(),
            Identity::Admin { user, .. } => user.clone(),
        }
    }

    /// A file name stem for this identity's certificate and key:
    /// `<kind>-<name>` with every byte outside `[A-Za-z0-9._-]` replaced by
    /// `_`, so a hostile name can never leave the output directory.
    pub fn file_stem(&self) -> String {
        let kind = match self {
            Identity::Supervisor { .. } => "supervisor",
            Identity::Agent { .. } => "agent",
            Identity::Admin { .. } => "admin",
        };
        let name: String = self
            .name()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        format!("{kind}-{name}")
    }

    /// The certificate subject that encodes this identity.
    pub(crate) fn distinguished_name(&self) -> DistinguishedName {
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, ORGANIZATION);
        dn.push(DnType::OrganizationalUnitName, self.kind_label());
        dn.push(DnType::CommonName, self.name());
        dn
    }

    /// Reads the identity from a DER certificate's subject, strictly: one
    /// `O=railguard`, one `OU`, one `CN`, no other attribute, a known kind,
    /// a name obeying the rules, not a CA. This parses only; it does not
    /// verify the signature or validity (the TLS verifier does).
    pub fn from_cert_der(der: &[u8]) -> Result<Identity, PkiError> {
        let cert = parse_cert(der)?;
        Identity::from_x509(&cert)
    }

    pub(crate) fn from_x509(cert: &X509Certificate<'_>) -> Result<Identity, PkiError> {
        let bad = |m: String| PkiError::BadIdentity(m);
        if let Ok(Some(bc)) = cert.basic_constraints() {
            if bc.value.ca {
                return Err(bad("a CA certificate names no identity".into()));
            }
        } else if cert.basic_constraints().is_err() {
            return Err(bad("malformed basic constraints".into()));
        }
        let (mut o, mut ou, mut cn) = (None, None, None);
        for attr in cert.subject().iter_attributes() {
            let oid = attr.attr_type();
            let slot = if *oid == OID_X509_ORGANIZATION_NAME {
                &mut o
            } else if *oid == OID_X509_ORGANIZATIONAL_UNIT {
                &mut ou
            } else if *oid == OID_X509_COMMON_NAME {
                &mut cn
            } else {
                return Err(bad(format!("unexpected subject attribute {oid}")));
            };
            let value = attr
                .as_str()
                .map_err(|e| bad(format!("subject attribute {oid} is not a string: {e}")))?;
            if slot.replace(value).is_some() {
                return Err(bad(format!("subject attribute {oid} appears twice")));
            }
        }
        match o {
            Some(ORGANIZATION) => {}
            Some(other) => return Err(bad(format!("O is {other:?}, not {ORGANIZATION:?}"))),
            None => return Err(bad("subject has no O".into())),
        }
        let ou = ou.ok_or_else(|| bad("subject has no OU".into()))?;
        let cn = cn.ok_or_else(|| bad("subject has no CN".into()))?;
        let wrap = |e: PkiError| bad(e.to_string());
        match ou {
            "supervisor" => parse_member(cn).map(Identity::supervisor).map_err(wrap),
            "agent" => Identity::agent(cn).map_err(wrap),
            _ => match ou.strip_prefix("admin-") {
                Some(role) => {
                    let role = role.parse::<Role>().map_err(wrap)?;
                    Identity::admin(cn, role).map_err(wrap)
                }
                None => Err(bad(format!("unknown OU {ou:?}"))),
            },
        }
    }
}

/// Parses one DER certificate, refusing trailing bytes.
pub(crate) fn parse_cert(der: &[u8]) -> Result<X509Certificate<'_>, PkiError> {
    match X509Certificate::from_der(der) {
        Ok(([], cert)) => Ok(cert),
        Ok(_) => Err(PkiError::X509(
            "trailing bytes after the certificate".into(),
        )),
        Err(e) => Err(PkiError::X509(e.to_string())),
    }
}

impl fmt::Display for Identity {
    /// `supervisor:<member>`, `agent:<host>`, `admin-<role>:<user>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind_label(), self.name())
    }
}

#[cfg(test)]
#[path = "identity_tests.rs"]
mod tests;
