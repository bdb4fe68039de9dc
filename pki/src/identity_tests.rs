//! Unit tests of the identity encoding: round trips, and hostile subjects
//! refused.

use super::*;
use rcgen::{BasicConstraints, CertificateParams, DnValue, IsCa, KeyPair};

/// A self-signed certificate with the given subject attributes.
fn cert_with(attrs: &[(DnType, &str)], ca: bool) -> Vec<u8> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    for (t, v) in attrs {
        dn.push(t.clone(), DnValue::Utf8String((*v).to_string()));
    }
    params.distinguished_name = dn;
    if ca {
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    }
    let key = KeyPair::generate().unwrap();
    params.self_signed(&key).unwrap().der().to_vec()
}

fn subject(ou: &str, cn: &str) -> Vec<u8> {
    cert_with(
        &[
            (DnType::OrganizationName, "railguard"),
            (DnType::OrganizationalUnitName, ou),
            (DnType::CommonName, cn),
        ],
        false,
    )
}

fn round_trip(id: &Identity) -> Identity {
    let mut params = CertificateParams::default();
    params.distinguished_name = id.distinguished_name();
    let key = KeyPair::generate().unwrap();
    let der = params.self_signed(&key).unwrap().der().to_vec();
    Identity::from_cert_der(&der).unwrap()
}

#[test]
fn every_kind_round_trips() {
    for id in [
        Identity::supervisor(0),
        Identity::supervisor(u64::MAX),
        Identity::agent("gpu-node-17.rack3").unwrap(),
        Identity::agent("hôte-ünïcode").unwrap(),
        Identity::admin("alice", Role::Viewer).unwrap(),
        Identity::admin("bob@example", Role::Operator).unwrap(),
        Identity::admin("root", Role::Admin).unwrap(),
        Identity::agent("x".repeat(MAX_NAME_LEN)).unwrap(),
    ] {
        assert_eq!(round_trip(&id), id);
    }
}

#[test]
fn display_and_labels() {
    assert_eq!(Identity::supervisor(3).to_string(), "supervisor:3");
    assert_eq!(Identity::agent("h1").unwrap().to_string(), "agent:h1");
    let a = Identity::admin("al", Role::Operator).unwrap();
    assert_eq!(a.to_string(), "admin-operator:al");
    assert_eq!(a.admin_role(), Some(Role::Operator));
    assert_eq!(Identity::supervisor(1).admin_role(), None);
    assert!(Identity::supervisor(1).is_server());
    assert!(!a.is_server());
}

#[test]
fn roles_are_ordered_and_parse_strictly() {
    assert!(Role::Viewer < Role::Operator && Role::Operator < Role::Admin);
    for r in Role::ALL {
        assert_eq!(r.to_string().parse::<Role>().unwrap(), r);
    }
    for bad in ["", "Admin", " admin", "admin ", "root", "viewer\n"] {
        assert!(bad.parse::<Role>().is_err(), "{bad:?}");
    }
}

#[test]
fn hostile_names_are_refused_by_constructors() {
    for bad in [
        "",
        "a b",
        "a\tb",
        "a\nb",
        "nul\0byte",
        "del\u{7f}",
        "nbsp\u{a0}x",
        "line\u{2028}sep",
    ] {
        assert!(Identity::agent(bad).is_err(), "{bad:?}");
        assert!(Identity::admin(bad, Role::Viewer).is_err(), "{bad:?}");
    }
    assert!(Identity::agent("x".repeat(MAX_NAME_LEN + 1)).is_err());
}

#[test]
fn hostile_subjects_are_refused() {
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty CN", subject("agent", "")),
        ("space in host", subject("agent", "h 1")),
        ("newline in user", subject("admin-admin", "al\nice")),
        ("control in host", subject("agent", "h\u{1b}[31m")),
        ("long host", subject("agent", &"h".repeat(MAX_NAME_LEN + 1))),
        ("unknown OU", subject("operator", "h1")),
        ("unknown role", subject("admin-root", "alice")),
        ("role case", subject("admin-Admin", "alice")),
        ("bare admin", subject("admin", "alice")),
        ("member leading zero", subject("supervisor", "007")),
        ("member sign", subject("supervisor", "+7")),
        ("member negative", subject("supervisor", "-1")),
        (
            "member overflow",
            subject("supervisor", "18446744073709551616"),
        ),
        ("member not a number", subject("supervisor", "one")),
        ("member spaces", subject("supervisor", " 1")),
        (
            "wrong O",
            cert_with(
                &[
                    (DnType::OrganizationName, "evilcorp"),
                    (DnType::OrganizationalUnitName, "agent"),
                    (DnType::CommonName, "h1"),
                ],
                false,
            ),
        ),
        (
            "no O",
            cert_with(
                &[
                    (DnType::OrganizationalUnitName, "agent"),
                    (DnType::CommonName, "h1"),
                ],
                false,
            ),
        ),
        (
            "no CN",
            cert_with(
                &[
                    (DnType::OrganizationName, "railguard"),
                    (DnType::OrganizationalUnitName, "agent"),
                ],
                false,
            ),
        ),
        (
            "extra attribute",
            cert_with(
                &[
                    (DnType::OrganizationName, "railguard"),
                    (DnType::OrganizationalUnitName, "agent"),
                    (DnType::CommonName, "h1"),
                    (DnType::CountryName, "US"),
                ],
                false,
            ),
        ),
        (
            "CA certificate",
            cert_with(
                &[
                    (DnType::OrganizationName, "railguard"),
                    (DnType::OrganizationalUnitName, "agent"),
                    (DnType::CommonName, "h1"),
                ],
                true,
            ),
        ),
    ];
    for (what, der) in cases {
        match Identity::from_cert_der(&der) {
            Err(PkiError::BadIdentity(_)) => {}
            other => panic!("{what}: expected BadIdentity, got {other:?}"),
        }
    }
}

#[test]
fn duplicate_attributes_are_refused() {
    // rcgen's DistinguishedName keeps one value per type, so build the
    // duplicate by hand: two CNs in separate RDNs.
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "railguard");
    dn.push(DnType::OrganizationalUnitName, "agent");
    dn.push(DnType::CommonName, "h1");
    dn.push(DnType::CustomDnType(vec![2, 5, 4, 3]), "h2");
    params.distinguished_name = dn;
    let key = KeyPair::generate().unwrap();
    let der = params.self_signed(&key).unwrap().der().to_vec();
    assert!(matches!(
        Identity::from_cert_der(&der),
        Err(PkiError::BadIdentity(_))
    ));
}

#[test]
fn garbage_is_not_a_certificate() {
    assert!(matches!(
        Identity::from_cert_der(b"not a certificate"),
        Err(PkiError::X509(_))
    ));
    let mut der = subject("agent", "h1");
    assert!(Identity::from_cert_der(&der).is_ok());
    der.push(0);
    assert!(matches!(
        Identity::from_cert_der(&der),
        Err(PkiError::X509(_))
    ));
    assert!(Identity::from_cert_der(&der[..der.len() / 2]).is_err());
}

#[test]
fn file_stems_cannot_escape_the_directory() {
    let id = Identity::agent("../../etc/passwd").unwrap();
    assert_eq!(id.file_stem(), "agent-.._.._etc_passwd");
    assert_eq!(Identity::supervisor(4).file_stem(), "supervisor-4");
    assert_eq!(
        Identity::admin("ünï", Role::Admin).unwrap().file_stem(),
        "admin-_n_"
    );
}
