//! Issuing on disk: the CA and certificates are written new with mode
//! 0600, never over existing files, nothing on error; `show` reads back
//! what was issued.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use pki::{Identity, PkiError, Role};

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

fn entries(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

#[test]
fn init_ca_writes_private_files_once() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    let issued = pki::init_ca(&ca, 3650).unwrap();
    assert_eq!(mode(&issued.cert_path), 0o600);
    assert_eq!(mode(&issued.key_path), 0o600);
    let before = std::fs::read(&issued.key_path).unwrap();
    match pki::init_ca(&ca, 3650) {
        Err(PkiError::CaExists { path }) => assert!(path.starts_with(&ca)),
        other => panic!("expected CaExists, got {other:?}"),
    }
    assert_eq!(std::fs::read(&issued.key_path).unwrap(), before);
    // Half a CA is still a CA: refuse, and do not complete it.
    std::fs::remove_file(&issued.cert_path).unwrap();
    assert!(matches!(
        pki::init_ca(&ca, 3650),
        Err(PkiError::CaExists { .. })
    ));
    assert!(!issued.cert_path.exists());

    let info = pki::show(&ca.join(pki::CA_CERT_FILE));
    assert!(info.is_err(), "the removed CA cannot be shown");
    assert!(matches!(
        pki::init_ca(&dir.path().join("x"), 0),
        Err(PkiError::InvalidValidity(_))
    ));
    assert_eq!(entries(&dir.path().join("x")), 0);
}

#[test]
fn issue_writes_what_show_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    let ca_issued = pki::init_ca(&ca, 365).unwrap();
    let out = dir.path().join("out");
    let id = Identity::supervisor(7);
    let sans = vec!["10.0.0.7".to_string(), "sup7.example".into(), "::1".into()];
    let issued = pki::issue(&ca, &id, &sans, 90, &out).unwrap();
    assert_eq!(issued.cert_path, out.join("supervisor-7.pem"));
    assert_eq!(issued.key_path, out.join("supervisor-7.key"));
    assert_eq!(mode(&issued.cert_path), 0o600);
    assert_eq!(mode(&issued.key_path), 0o600);

    let info = pki::show(&issued.cert_path).unwrap();
    assert_eq!(info.identity, Some(id.clone()));
    assert!(!info.is_ca);
    assert_eq!(info.serial, issued.serial);
    assert_eq!(info.serial.to_string().len(), 32);
    assert_eq!(
        info.sans,
        vec![pki::SERVER_NAME, "10.0.0.7", "sup7.example", "::1"]
    );
    assert!(info.issuer.contains(pki::CA_COMMON_NAME), "{}", info.issuer);
    let days_left = info
        .not_after
        .duration_since(SystemTime::now())
        .unwrap()
        .as_secs()
        / 86_400;
    assert!((88..=90).contains(&days_left), "{days_left}");
    // DER times have whole seconds.
    let secs = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
    assert_eq!(secs(info.not_after), secs(issued.not_after));
    assert!(info.not_before < SystemTime::now());

    let ca_info = pki::show(&ca_issued.cert_path).unwrap();
    assert!(ca_info.is_ca);
    assert_eq!(ca_info.identity, None);
    assert_eq!(ca_info.serial, ca_issued.serial);

    // Agents and admins get no server name.
    let agent = pki::issue(&ca, &Identity::agent("h1").unwrap(), &[], 1, &out).unwrap();
    assert!(pki::show(&agent.cert_path).unwrap().sans.is_empty());
    // Serials are random.
    assert_ne!(agent.serial, issued.serial);
}

#[test]
fn issue_refuses_and_writes_nothing_on_error() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    let out = dir.path().join("out");
    let admin = Identity::admin("alice", Role::Admin).unwrap();

    // No CA yet.
    let err = pki::issue(&ca, &admin, &[], 30, &out).unwrap_err();
    assert!(matches!(err, PkiError::NoCa { .. }), "{err}");
    assert!(err.to_string().contains("pki init"), "{err}");
    assert_eq!(entries(&out), 0);

    pki::init_ca(&ca, 365).unwrap();
    // A bad SAN.
    for bad in ["not a name", "-bad-.example", "", "a..b"] {
        assert!(matches!(
            pki::issue(&ca, &admin, &[bad.into()], 30, &out),
            Err(PkiError::InvalidSan(_))
        ));
    }
    assert_eq!(entries(&out), 0);
    // A hostile name built by hand, past the checking constructors.
    let hostile = Identity::Agent {
        host: "h1\nCN=evil".into(),
    };
    assert!(matches!(
        pki::issue(&ca, &hostile, &[], 30, &out),
        Err(PkiError::InvalidName { .. })
    ));
    // Bad validity.
    assert!(pki::issue(&ca, &admin, &[], 0, &out).is_err());
    assert!(pki::issue(&ca, &admin, &[], pki::MAX_VALIDITY_DAYS + 1, &out).is_err());
    let now = SystemTime::now();
    let backwards = pki::Validity {
        not_before: now,
        not_after: now - Duration::from_secs(1),
    };
    assert!(pki::issue_with_validity(&ca, &admin, &[], backwards, &out).is_err());
    assert_eq!(entries(&out), 0);

    let first = pki::issue(&ca, &admin, &[], 30, &out).unwrap();
    let pem = std::fs::read(&first.cert_path).unwrap();
    match pki::issue(&ca, &admin, &[], 30, &out) {
        Err(PkiError::FileExists { path }) => assert_eq!(path, first.cert_path),
        other => panic!("expected FileExists, got {other:?}"),
    }
    assert_eq!(std::fs::read(&first.cert_path).unwrap(), pem);
    // Only the key left over from something else: still refused, kept.
    std::fs::remove_file(&first.cert_path).unwrap();
    assert!(matches!(
        pki::issue(&ca, &admin, &[], 30, &out),
        Err(PkiError::FileExists { .. })
    ));
    assert!(!first.cert_path.exists());
}

#[test]
fn a_certificate_may_not_outlive_its_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    pki::init_ca(&ca, 10).unwrap();
    let out = dir.path().join("out");
    let err = pki::issue(&ca, &Identity::supervisor(1), &[], 11, &out).unwrap_err();
    assert!(err.to_string().contains("outlive the CA"), "{err}");
    assert_eq!(entries(&out), 0);
    pki::issue(&ca, &Identity::supervisor(1), &[], 9, &out).unwrap();
}

#[test]
fn a_mismatched_ca_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let b = dir.path().join("b");
    pki::init_ca(&a, 365).unwrap();
    pki::init_ca(&b, 365).unwrap();
    std::fs::remove_file(a.join(pki::CA_KEY_FILE)).unwrap();
    std::fs::copy(b.join(pki::CA_KEY_FILE), a.join(pki::CA_KEY_FILE)).unwrap();
    let out = dir.path().join("out");
    let err = pki::issue(&a, &Identity::supervisor(1), &[], 30, &out).unwrap_err();
    assert!(err.to_string().contains("does not match"), "{err}");
    assert_eq!(entries(&out), 0);
}

#[test]
fn show_refuses_what_is_not_a_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("x.pem");
    std::fs::write(&f, "hello").unwrap();
    assert!(matches!(pki::show(&f), Err(PkiError::Pem { .. })));
    assert!(matches!(
        pki::show(&dir.path().join("missing.pem")),
        Err(PkiError::Io { .. })
    ));
    let ca = dir.path().join("ca");
    let issued = pki::init_ca(&ca, 365).unwrap();
    // A key file is not a certificate.
    assert!(matches!(
        pki::show(&issued.key_path),
        Err(PkiError::Pem { .. })
    ));
}
