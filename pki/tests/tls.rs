//! Mutual TLS over real loopback sockets: a tonic server (proto's `Admin`
//! service, answering with the peer it sees) behind `pki::incoming`, and
//! clients with good, missing, foreign, expired and revoked certificates;
//! reloads; hostile and slow handshakes that must not stop the server.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use pki::{Identity, IncomingLimits, Revocations, Role, Serial, ServerTls, ServerTlsFiles};
use proto::v1::admin_client::AdminClient;
use proto::v1::admin_server::{Admin, AdminServer};
use proto::v1::{Blob, FollowRequest};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::{Certificate, ClientTlsConfig, Server};
use tonic::{Request, Response, Status};

const DAYS: u32 = 30;
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Answers `Call` with "<identity>|<serial>" of the verified peer.
struct WhoAmI;

#[tonic::async_trait]
impl Admin for WhoAmI {
    async fn call(&self, request: Request<Blob>) -> Result<Response<Blob>, Status> {
        let peer = pki::require(&request)?;
        let body = format!("{}|{}", peer.identity, peer.serial).into_bytes();
        Ok(Response::new(Blob { body }))
    }

    type FollowStream = futures::stream::Empty<Result<Blob, Status>>;

    async fn follow(
        &self,
        _request: Request<FollowRequest>,
    ) -> Result<Response<Self::FollowStream>, Status> {
        Err(Status::unimplemented("test service"))
    }
}

/// A CA with a served supervisor certificate, in a temporary directory.
struct Cluster {
    dir: tempfile::TempDir,
    tls: ServerTls,
    addr: SocketAddr,
}

impl Cluster {
    fn ca(&self) -> PathBuf {
        self.dir.path().join("ca")
    }

    fn ca_pem(&self) -> PathBuf {
        self.ca().join(pki::CA_CERT_FILE)
    }

    /// Issues a client certificate into a fresh sub-directory.
    fn client(&self, identity: &Identity, out: &str) -> (PathBuf, PathBuf, Serial) {
        let out = self.dir.path().join(out);
        let issued = pki::issue(&self.ca(), identity, &[], DAYS, &out).unwrap();
        (issued.cert_path, issued.key_path, issued.serial)
    }

    /// Calls with a new agent certificate for host `name` valid from
    /// `not_before` to `not_after`, and returns the refusal.
    async fn call_valid(
        &self,
        not_before: SystemTime,
        not_after: SystemTime,
        name: &str,
    ) -> String {
        let validity = pki::Validity {
            not_before,
            not_after,
        };
        let id = Identity::agent(name).unwrap();
        let out = self.dir.path().join(name);
        let issued = pki::issue_with_validity(&self.ca(), &id, &[], validity, &out).unwrap();
        self.call_as(&issued.cert_path, &issued.key_path)
            .await
            .unwrap_err()
    }

    /// Calls `Call` with a client certificate; the answer's body.
    async fn call_as(&self, cert: &Path, key: &Path) -> Result<String, String> {
        let tls = pki::client_tls(&self.ca_pem(), cert, key).map_err(|e| e.to_string())?;
        call(self.addr, tls).await
    }
}

async fn call(addr: SocketAddr, tls: ClientTlsConfig) -> Result<String, String> {
    let endpoint = pki::https_endpoint(&addr.to_string(), tls).map_err(|e| e.to_string())?;
    call_on(endpoint).await
}

/// Calls `Call` once over a new connection to `endpoint`; the answer's body.
async fn call_on(endpoint: tonic::transport::Endpoint) -> Result<String, String> {
    let endpoint = endpoint.connect_timeout(CALL_TIMEOUT).timeout(CALL_TIMEOUT);
    let attempt = async {
        let channel = endpoint.connect().await.map_err(|e| format!("{e:?}"))?;
        let reply = AdminClient::new(channel)
            .call(Blob { body: vec![] })
            .await
            .map_err(|e| format!("{e:?}"))?;
        String::from_utf8(reply.into_inner().body).map_err(|e| e.to_string())
    };
    tokio::time::timeout(CALL_TIMEOUT * 2, attempt)
        .await
        .map_err(|_| "timed out".to_string())?
}

/// A CA, supervisor 1's certificate, and a server on 127.0.0.1.
async fn start(limits: IncomingLimits) -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    pki::init_ca(&ca, 365).unwrap();
    let srv = dir.path().join("srv");
    let issued = pki::issue(
        &ca,
        &Identity::supervisor(1),
        &["127.0.0.1".into()],
        DAYS,
        &srv,
    )
    .unwrap();
    let tls = ServerTls::load(
        ServerTlsFiles {
            ca: ca.join(pki::CA_CERT_FILE),
            cert: issued.cert_path,
            key: issued.key_path,
        },
        Revocations::new(),
    )
    .unwrap();
    assert_eq!(tls.serial(), issued.serial);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = pki::incoming_with_limits(listener, tls.clone(), limits);
    tokio::spawn(
        Server::builder()
            .add_service(AdminServer::new(WhoAmI))
            .serve_with_incoming(incoming),
    );
    Cluster { dir, tls, addr }
}

#[tokio::test]
async fn valid_certificates_reach_the_handler_with_their_identity() {
    let c = start(IncomingLimits::default()).await;
    for (id, out) in [
        (Identity::admin("alice", Role::Operator).unwrap(), "alice"),
        (Identity::agent("gpu-7").unwrap(), "gpu7"),
        (Identity::supervisor(2), "sup2"),
    ] {
        let (cert, key, serial) = c.client(&id, out);
        let seen = c.call_as(&cert, &key).await.unwrap();
        assert_eq!(seen, format!("{id}|{serial}"));
    }
}

#[tokio::test]
async fn a_client_without_certificate_is_refused() {
    let c = start(IncomingLimits::default()).await;
    let ca = std::fs::read(c.ca_pem()).unwrap();
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name(pki::SERVER_NAME);
    let err = call(c.addr, tls).await.unwrap_err();
    assert!(err.contains("CertificateRequired"), "{err}");
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_refused() {
    let c = start(IncomingLimits::default()).await;
    let other = c.dir.path().join("other-ca");
    pki::init_ca(&other, 365).unwrap();
    let id = Identity::admin("mallory", Role::Admin).unwrap();
    let issued = pki::issue(&other, &id, &[], DAYS, &c.dir.path().join("mallory")).unwrap();
    // The client trusts the real CA, so only the server's check stands
    // between mallory and the handler.
    let err = c
        .call_as(&issued.cert_path, &issued.key_path)
        .await
        .unwrap_err();
    // Same CA subject, other key: webpki finds the real CA by name and the
    // signature does not verify.
    assert!(
        ["DecryptError", "UnknownCA", "BadSignature"]
            .iter()
            .any(|a| err.contains(a)),
        "{err}"
    );

    // And a client that trusts only the other CA refuses the real server.
    let (cert, key, _) = c.client(&Identity::agent("h1").unwrap(), "h1");
    let tls = pki::client_tls(&other.join(pki::CA_CERT_FILE), &cert, &key).unwrap();
    let err = call(c.addr, tls).await.unwrap_err();
    assert!(err.contains("InvalidCertificate"), "{err}");
}

#[tokio::test]
async fn an_expired_certificate_is_refused() {
    let c = start(IncomingLimits::default()).await;
    let day = Duration::from_secs(86_400);
    let now = SystemTime::now();
    let err = c.call_valid(now - 10 * day, now - day, "old").await;
    assert!(err.contains("CertificateExpired"), "{err}");
    // Not yet valid either (TLS has one alert for both).
    let err = c.call_valid(now + day, now + 10 * day, "early").await;
    assert!(err.contains("CertificateExpired"), "{err}");
}

#[tokio::test]
async fn a_revoked_serial_is_refused_from_the_next_handshake() {
    let c = start(IncomingLimits::default()).await;
    let (cert, key, serial) = c.client(&Identity::admin("bob", Role::Viewer).unwrap(), "bob");
    let (cert2, key2, _) = c.client(&Identity::admin("carol", Role::Viewer).unwrap(), "carol");
    assert!(c.call_as(&cert, &key).await.is_ok());
    assert!(c.tls.revocations().revoke(serial.clone()));
    let err = c.call_as(&cert, &key).await.unwrap_err();
    assert!(err.contains("CertificateRevoked"), "{err}");
    // Others are unaffected.
    assert!(c.call_as(&cert2, &key2).await.is_ok());
    // Taking it off the list lets it in again.
    assert!(c.tls.revocations().unrevoke(&serial));
    assert!(c.call_as(&cert, &key).await.is_ok());
}

/// The serial of the certificate a server presents, seen by a raw rustls
/// client.
async fn served_serial(c: &Cluster, cert: &Path, key: &Path) -> Result<Serial, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(c.ca_pem()).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(
            vec![CertificateDer::from_pem_file(cert).unwrap()],
            PrivateKeyDer::from_pem_file(key).unwrap(),
        )
        .unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(c.addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from(pki::SERVER_NAME).unwrap();
    let tls = tokio::time::timeout(CALL_TIMEOUT, connector.connect(name, tcp))
        .await
        .map_err(|_| "timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let der = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    pki::serial_of(&der).map_err(|e| e.to_string())
}

#[tokio::test]
async fn reload_serves_the_new_certificate_and_a_bad_reload_keeps_the_old() {
    let c = start(IncomingLimits::default()).await;
    let (cert, key, _) = c.client(&Identity::admin("op", Role::Admin).unwrap(), "op");
    let first = c.tls.serial();
    assert_eq!(served_serial(&c, &cert, &key).await.unwrap(), first);

    // Re-issue supervisor 1 elsewhere and move the files into place.
    let next = pki::issue(
        &c.ca(),
        &Identity::supervisor(1),
        &[],
        DAYS,
        &c.dir.path().join("next"),
    )
    .unwrap();
    let files = c.tls.files().clone();
    std::fs::rename(&next.cert_path, &files.cert).unwrap();
    std::fs::rename(&next.key_path, &files.key).unwrap();
    assert_eq!(c.tls.reload().unwrap(), next.serial);
    assert_eq!(served_serial(&c, &cert, &key).await.unwrap(), next.serial);
    assert!(c.call_as(&cert, &key).await.is_ok());

    // A broken certificate file: the reload fails, the server keeps going.
    std::fs::write(&files.cert, b"not a certificate").unwrap();
    assert!(c.tls.reload().is_err());
    assert_eq!(c.tls.serial(), next.serial);
    assert_eq!(served_serial(&c, &cert, &key).await.unwrap(), next.serial);
    // An agent's certificate may not serve.
    let agent = pki::issue(
        &c.ca(),
        &Identity::agent("h9").unwrap(),
        &[],
        DAYS,
        &c.dir.path().join("h9"),
    )
    .unwrap();
    std::fs::copy(&agent.cert_path, &files.cert).unwrap();
    std::fs::copy(&agent.key_path, &files.key).unwrap();
    assert!(matches!(
        c.tls.reload(),
        Err(pki::PkiError::ServerCert { .. })
    ));
    assert_eq!(served_serial(&c, &cert, &key).await.unwrap(), next.serial);

    // SIGHUP reloads too.
    let third = pki::issue(
        &c.ca(),
        &Identity::supervisor(1),
        &[],
        DAYS,
        &c.dir.path().join("third"),
    )
    .unwrap();
    std::fs::rename(&third.cert_path, &files.cert).unwrap();
    std::fs::rename(&third.key_path, &files.key).unwrap();
    // ... and the client side of the same process.
    let (acert, akey, aserial) = c.client(&Identity::agent("gpu-1").unwrap(), "gpu1");
    let client = client_of(&c, &acert, &akey);
    let renewed = c.client(&Identity::agent("gpu-1").unwrap(), "gpu1-renewed");
    std::fs::rename(&renewed.0, &acert).unwrap();
    std::fs::rename(&renewed.1, &akey).unwrap();
    let reloader = pki::reload_on_sighup(Some(c.tls.clone()), client.clone()).unwrap();
    let status = std::process::Command::new("kill")
        .args(["-HUP", &std::process::id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = tokio::time::Instant::now() + CALL_TIMEOUT;
    while c.tls.serial() != third.serial && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(served_serial(&c, &cert, &key).await.unwrap(), third.serial);
    while client.generation() == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seen = call_with(&c, &client).await.unwrap();
    let gpu1 = Identity::agent("gpu-1").unwrap();
    assert_eq!(seen, format!("{gpu1}|{}", renewed.2));
    assert_ne!(renewed.2, aserial);
    reloader.abort();
}

/// A reloadable client presenting `cert`.
fn client_of(c: &Cluster, cert: &Path, key: &Path) -> pki::ClientTls {
    pki::ClientTls::from_mode(&pki::TlsMode::Mtls(ServerTlsFiles {
        ca: c.ca_pem(),
        cert: cert.into(),
        key: key.into(),
    }))
    .unwrap()
}

/// Calls `Call` through `client`'s current configuration.
async fn call_with(c: &Cluster, client: &pki::ClientTls) -> Result<String, String> {
    call_on(
        client
            .endpoint(&c.addr.to_string())
            .map_err(|e| e.to_string())?,
    )
    .await
}

#[tokio::test]
async fn a_client_reload_presents_the_new_certificate_and_keeps_its_identity() {
    let c = start(IncomingLimits::default()).await;
    let alice = Identity::admin("alice", Role::Operator).unwrap();
    let (cert, key, first) = c.client(&alice, "alice");
    let client = client_of(&c, &cert, &key);
    assert_eq!(client.identity(), Some(alice.clone()));
    // Revoked: refused at the handshake until a new certificate is loaded.
    c.tls.revocations().revoke(first.clone());
    assert!(call_with(&c, &client).await.is_err());
    // A file that holds another identity is refused; the old one stays.
    let (mallory, mkey, _) = c.client(&Identity::admin("mallory", Role::Admin).unwrap(), "m");
    std::fs::copy(&mallory, &cert).unwrap();
    std::fs::copy(&mkey, &key).unwrap();
    let e = client.reload().unwrap_err();
    assert!(e.to_string().contains("keeps the identity"), "{e}");
    assert_eq!(client.generation(), 0);
    assert_eq!(client.identity(), Some(alice.clone()));
    // Garbage is refused too.
    std::fs::write(&cert, "not a certificate").unwrap();
    assert!(client.reload().is_err());
    assert_eq!(client.generation(), 0);
    // So is a new certificate beside the old key (half a copy), and a
    // certificate of another CA.
    let (half, _, _) = c.client(&alice, "alice-half");
    std::fs::copy(&half, &cert).unwrap();
    std::fs::copy(&mkey, &key).unwrap();
    let e = client.reload().unwrap_err();
    assert!(e.to_string().contains("does not belong"), "{e}");
    let other = tempfile::tempdir().unwrap();
    let foreign = pki::LabPki::open(other.path())
        .unwrap()
        .files(&alice)
        .unwrap();
    std::fs::copy(&foreign.cert, &cert).unwrap();
    std::fs::copy(&foreign.key, &key).unwrap();
    let e = client.reload().unwrap_err();
    assert!(e.to_string().contains("not valid under"), "{e}");
    assert_eq!(client.generation(), 0);
    // The renewed certificate of the same user is taken.
    let (ncert, nkey, next) = c.client(&alice, "alice-renewed");
    std::fs::rename(&ncert, &cert).unwrap();
    std::fs::rename(&nkey, &key).unwrap();
    client.reload().unwrap();
    assert_eq!(client.generation(), 1);
    let seen = call_with(&c, &client).await.unwrap();
    assert_eq!(seen, format!("{alice}|{next}"));
}

#[tokio::test]
async fn hostile_and_slow_handshakes_do_not_stop_the_server() {
    let limits = IncomingLimits {
        handshake_timeout: Duration::from_millis(300),
        max_pending_handshakes: 1,
        ..IncomingLimits::default()
    };
    let c = start(limits).await;
    let (cert, key, _) = c.client(&Identity::agent("h1").unwrap(), "h1");

    // Garbage instead of a ClientHello.
    let mut junk = TcpStream::connect(c.addr).await.unwrap();
    junk.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    drop(junk);
    // A connection that never speaks holds the only handshake slot until
    // the timeout frees it; the good client gets through after that.
    let silent = TcpStream::connect(c.addr).await.unwrap();
    let started = std::time::Instant::now();
    assert_eq!(
        c.call_as(&cert, &key).await.unwrap().split('|').next(),
        Some("agent:h1")
    );
    assert!(started.elapsed() < CALL_TIMEOUT);
    drop(silent);
    // Many refused handshakes in a row change nothing.
    for _ in 0..5 {
        let ca = std::fs::read(c.ca_pem()).unwrap();
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .domain_name(pki::SERVER_NAME);
        let err = call(c.addr, tls).await.unwrap_err();
        assert!(err.contains("CertificateRequired"), "{err}");
    }
    assert!(c.call_as(&cert, &key).await.is_ok());
}

/// A silent connection from 127.0.0.2 (one machine's address), bound
/// there and sent nothing.
async fn silent_from_second_address(addr: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    socket.connect(addr).await.unwrap()
}

/// One machine opening connections that never speak can hold at most a
/// few handshake slots: a client from elsewhere is served while those wait
/// for their timeout (before, 64 silent connections held every slot for
/// 5 s at a time). A burst of real clients from one address waits its
/// turn rather than being turned away.
#[tokio::test]
async fn silent_connections_from_one_address_do_not_hold_every_handshake_slot() {
    let limits = IncomingLimits {
        handshake_timeout: Duration::from_secs(30),
        max_pending_handshakes: 4,
        max_pending_per_source: 2,
        ..IncomingLimits::default()
    };
    let c = start(limits).await;
    let (cert, key, _) = c.client(&Identity::agent("h1").unwrap(), "h1");
    let mut silent = Vec::new();
    for _ in 0..20 {
        silent.push(silent_from_second_address(c.addr).await);
    }
    let started = std::time::Instant::now();
    assert_eq!(
        c.call_as(&cert, &key).await.unwrap().split('|').next(),
        Some("agent:h1")
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    drop(silent);
    // Ten at once from 127.0.0.1, two handshakes at a time: all served.
    let c = std::sync::Arc::new(c);
    let burst: Vec<_> = (0..10)
        .map(|_| {
            let (c, cert, key) = (c.clone(), cert.clone(), key.clone());
            tokio::spawn(async move { c.call_as(&cert, &key).await })
        })
        .collect();
    for b in burst {
        assert!(b.await.unwrap().is_ok());
    }
}

#[test]
fn require_without_a_peer_is_unauthenticated() {
    let req = Request::new(());
    assert_eq!(
        pki::require(&req).unwrap_err().code(),
        tonic::Code::Unauthenticated
    );
    assert_eq!(
        pki::require_role(&req, Role::Viewer).unwrap_err().code(),
        tonic::Code::Unauthenticated
    );
}

#[test]
fn require_role_checks_the_order_of_roles() {
    let peer = |identity: Identity| {
        let mut req = Request::new(());
        req.extensions_mut().insert(pki::PeerInfo {
            identity,
            serial: "01".parse().unwrap(),
            not_after: SystemTime::now(),
            remote_addr: "127.0.0.1:1".parse().unwrap(),
        });
        req
    };
    let op = peer(Identity::admin("op", Role::Operator).unwrap());
    assert_eq!(
        pki::require_role(&op, Role::Viewer).unwrap(),
        ("op", Role::Operator)
    );
    assert!(pki::require_role(&op, Role::Operator).is_ok());
    assert_eq!(
        pki::require_role(&op, Role::Admin).unwrap_err().code(),
        tonic::Code::PermissionDenied
    );
    let agent = peer(Identity::agent("h1").unwrap());
    assert_eq!(
        pki::require_role(&agent, Role::Viewer).unwrap_err().code(),
        tonic::Code::PermissionDenied
    );
}

#[tokio::test]
async fn a_ca_signed_certificate_without_identity_is_refused() {
    let c = start(IncomingLimits::default()).await;
    let ca_pem = std::fs::read_to_string(c.ca_pem()).unwrap();
    let ca_key = std::fs::read_to_string(c.ca().join(pki::CA_KEY_FILE)).unwrap();
    let issuer =
        rcgen::Issuer::from_ca_cert_pem(&ca_pem, rcgen::KeyPair::from_pem(&ca_key).unwrap())
            .unwrap();
    let mut params = rcgen::CertificateParams::default();
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::OrganizationName, "railguard");
    dn.push(rcgen::DnType::OrganizationalUnitName, "agent");
    dn.push(rcgen::DnType::CommonName, "bad host");
    params.distinguished_name = dn;
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    let cert_path = c.dir.path().join("bad.pem");
    let key_path = c.dir.path().join("bad.key");
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    // client_tls itself refuses it...
    assert!(matches!(
        pki::client_tls(&c.ca_pem(), &cert_path, &key_path),
        Err(pki::PkiError::BadIdentity(_))
    ));
    // ...and so does the server, for a client that does not check.
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .identity(tonic::transport::Identity::from_pem(
            cert.pem(),
            key.serialize_pem(),
        ))
        .domain_name(pki::SERVER_NAME);
    let err = call(c.addr, tls).await.unwrap_err();
    assert!(err.contains("AccessDenied"), "{err}");
}

#[test]
fn load_refuses_unusable_server_files() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    pki::init_ca(&a, 365).unwrap();
    pki::init_ca(&b, 365).unwrap();
    let issue =
        |id: Identity, to: &str| pki::issue(&a, &id, &[], DAYS, &dir.path().join(to)).unwrap();
    let s1 = issue(Identity::supervisor(1), "s1");
    let s2 = issue(Identity::supervisor(2), "s2");
    let agent = issue(Identity::agent("h1").unwrap(), "h1");
    let load = |ca: &Path, cert: &Path, key: &Path| {
        ServerTls::load(
            ServerTlsFiles {
                ca: ca.join(pki::CA_CERT_FILE),
                cert: cert.into(),
                key: key.into(),
            },
            Revocations::new(),
        )
    };
    assert!(load(&a, &s1.cert_path, &s1.key_path).is_ok());
    // Signed by another CA than the one trusted.
    assert!(matches!(
        load(&b, &s1.cert_path, &s1.key_path),
        Err(pki::PkiError::ServerCert { .. })
    ));
    // Not a supervisor.
    assert!(matches!(
        load(&a, &agent.cert_path, &agent.key_path),
        Err(pki::PkiError::ServerCert { .. })
    ));
    // Another certificate's key.
    assert!(load(&a, &s1.cert_path, &s2.key_path).is_err());
    // Missing files.
    assert!(matches!(
        load(&a, &dir.path().join("none.pem"), &s1.key_path),
        Err(pki::PkiError::Io { .. })
    ));
}

#[tokio::test]
async fn one_identity_holds_a_bounded_number_of_connections() {
    let c = start(IncomingLimits {
        max_conns_per_identity: 2,
        ..IncomingLimits::default()
    })
    .await;
    let alice = Identity::admin("alice", Role::Operator).unwrap();
    let (cert, key, _) = c.client(&alice, "alice");
    let tls = pki::client_tls(&c.ca_pem(), &cert, &key).unwrap();
    let open = || async {
        let ch = pki::https_endpoint(&c.addr.to_string(), tls.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = AdminClient::new(ch);
        let r = client.call(Blob { body: vec![] }).await;
        (client, r.is_ok())
    };
    let (held1, ok1) = open().await;
    let (_held2, ok2) = open().await;
    assert!(ok1 && ok2, "two connections are allowed");
    let (_third, ok3) = open().await;
    assert!(!ok3, "a third connection of the same identity is closed");
    // Another identity is not affected.
    let (bcert, bkey, _) = c.client(&Identity::agent("gpu-2").unwrap(), "gpu2");
    assert!(c.call_as(&bcert, &bkey).await.is_ok());
    // A closed connection gives its place back.
    drop(held1);
    let deadline = tokio::time::Instant::now() + CALL_TIMEOUT;
    loop {
        if open().await.1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "place not given back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
