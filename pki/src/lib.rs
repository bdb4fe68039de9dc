//! railguard's cluster PKI: who holds a certificate ([`Identity`]), making
//! certificates (a cluster CA and certificates signed by it, with rcgen),
//! and mutual TLS 1.3 for the tonic servers and clients (rustls with the
//! ring provider; no OpenSSL).
//!
//! # Identity encoding
//! A railguard certificate names its holder in its subject, and only
//! there: `O=railguard`, `OU=<kind>`, `CN=<name>`, each exactly once, no
//! other attribute.
//!
//! | holder     | `OU`                                           | `CN`                          |
//! |------------|------------------------------------------------|-------------------------------|
//! | supervisor | `supervisor`                                   | Raft member id, decimal u64   |
//! | agent      | `agent`                                        | host name                     |
//! | admin      | `admin-viewer`, `admin-operator`, `admin-admin` | user name                     |
//!
//! Host and user names follow the model's naming rules (1 to 253 bytes, no
//! whitespace or control characters); member ids are canonical decimal (no
//! sign, no leading zero). Parsing is strict: anything else, or a CA
//! certificate, is `PkiError::BadIdentity`. Supervisor certificates also
//! carry the DNS name [`SERVER_NAME`] (`supervisor.railguard`), which every
//! client verifies, plus any DNS names and IPs given at issue; they may
//! serve and be clients (Raft peers), agents' and admins' only be clients.
//! Every certificate has a random 128-bit serial ([`Serial`], lowercase
//! hex), the key of revocation.
//!
//! # Trust
//! A server accepts a connection only after TLS 1.3 with a client
//! certificate that chains to the cluster CA, is within its validity
//! period, is not in [`Revocations`] and names an identity; session
//! resumption is off, so every connection is verified in full. The
//! identity a handler sees ([`PeerInfo`], via [`require`]) comes from that
//! certificate only.
//!
//! # Layout
//! - `identity`: [`Identity`], [`Role`], the encoding and its parser.
//! - `serial`: [`Serial`]. `revocations`: [`Revocations`].
//! - `issue`: [`init_ca`], [`issue()`], [`show`] and their file formats.
//! - `files`: PEM reading, exclusive 0600 writing.
//! - `verifier`: the client-certificate verifier (WebPKI + revocations).
//! - `server`: [`ServerTls`] (load, `reload`).
//! - `reload`: [`reload_on_sighup`] (server and client certificates).
//! - `guard`: [`until_revoked`], the end of a stream whose peer's
//!   certificate is revoked or expires while it is open.
//! - `incoming`: [`incoming`] (the accept stream for tonic), [`PeerInfo`],
//!   [`require`], [`require_role`].
//! - `client`: [`client_tls`], [`https_endpoint`], [`ClientTls`]
//!   (reloadable), [`ca_bundle`] (trust anchors for servers outside the
//!   cluster: webhook receivers).
//! - `lab`: [`LabPki`], a CA and certificates on demand (demo, tests).
//! - `mode`: [`TlsArgs`] → [`TlsMode`]: the operator's files or `--insecure`.
//! - `error`: [`PkiError`].

mod client;
mod error;
mod files;
mod guard;
mod identity;
mod incoming;
mod issue;
mod lab;
mod mode;
mod reload;
mod revocations;
mod serial;
mod server;
mod verifier;

pub use client::{
    ca_bundle, check_supervisor_addr, check_supervisor_addrs, client_tls, https_endpoint,
    ClientShared, ClientTls,
};
pub use error::PkiError;
pub use guard::{end_status, lost_right, until_revoked, GuardedStream, StreamEnd};
pub use identity::{check_name, Identity, Role, MAX_NAME_LEN, ORGANIZATION};
pub use incoming::{
    incoming, incoming_with_limits, require, require_role, Incoming, IncomingLimits, PeerInfo,
    PeerStream, HANDSHAKE_TIMEOUT,
};
pub use issue::{
    describe, init_ca, issue, issue_with_validity, serial_of, show, CertInfo, Issued, Validity,
    BACKDATE, CA_CERT_FILE, CA_COMMON_NAME, CA_KEY_FILE, MAX_VALIDITY_DAYS, SERVER_NAME,
};
pub use lab::LabPki;
#[cfg(feature = "clap")]
pub use mode::TlsFlags;
pub use mode::{TlsArgs, TlsMode};
pub use reload::reload_on_sighup;
pub use revocations::Revocations;
pub use serial::Serial;
pub use server::{ServerTls, ServerTlsFiles};
