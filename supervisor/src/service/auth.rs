//! Who is calling and what they may do. With mutual TLS every identity
//! comes from the caller's verified certificate ([`pki::PeerInfo`], put on
//! the request by the accept stream), never from a request field:
//! - Raft RPCs, forwarded admin calls and election control: a supervisor
//!   certificate of a current member (voter or learner). A node that has
//!   no membership yet (started with `--join`) accepts any supervisor of
//!   the cluster CA, or it could never be added.
//! - Agent RPCs: an agent certificate, speaking only for its own host.
//! - Admin calls: an admin certificate whose role covers the request
//!   ([`role_needed`]): `viewer` reads, `operator` runs the day-to-day
//!   operations, `admin` changes membership, playbooks, revocations and
//!   submits jobs.
//!
//! Streams (an agent's orders and reports, `events --follow`) are
//! [`guarded`]: they end with `PermissionDenied` the moment the caller's
//! certificate is revoked or expires, not only at the next connection.
//!
//! A refusal is `PermissionDenied` naming who, what and the role needed;
//! for an admin the refusal is also recorded in the admin history (on the
//! leader). On an `--insecure` cluster nothing is checked: the caller is
//! unknown and every call is allowed, as the warning at start says.

use pki::{Identity, PeerInfo, Role};
use tonic::{Request, Status};

use crate::api::{AdminRequest, ApiError, ErrorKind};
use crate::model::{AdminOp, JobOp};
use crate::node::Supervisor;

/// The caller of one request.
pub enum Caller<'a> {
    /// Verified by its certificate.
    Peer(&'a PeerInfo),
    /// The cluster runs without TLS: nobody is known.
    Insecure,
}

/// The caller of `req` on `sup`: its certificate's identity with mTLS (a
/// request without one is `Unauthenticated`, which the accept stream
/// should make impossible), nobody on an insecure cluster.
pub fn caller<'a, T>(sup: &Supervisor, req: &'a Request<T>) -> Result<Caller<'a>, Status> {
    if sup.config.tls.is_mtls() {
        let peer = pki::require(req)?;
        // A certificate revoked since the connection was made is refused
        // from its next call on.
        if sup.revocations.contains(&peer.serial) {
            tracing::warn!(who = %peer.identity, serial = %peer.serial, "call on a revoked certificate refused");
            return Err(refusal(format!(
                "certificate {} of {} is revoked",
                peer.serial, peer.identity
            )));
        }
        Ok(Caller::Peer(peer))
    } else {
        Ok(Caller::Insecure)
    }
}

/// The certificate of the caller of `req`, to guard a stream it opens
/// (none on an insecure cluster).
pub fn peer_of<T>(sup: &Supervisor, req: &Request<T>) -> Option<PeerInfo> {
    if sup.config.tls.is_mtls() {
        pki::require(req).ok().cloned()
    } else {
        None
    }
}

/// `stream` as a server stream that ends with `PermissionDenied` as soon
/// as `peer`'s certificate is revoked or expires (a handshake checks both
/// only once; these streams may stay open for days). Unguarded on an
/// insecure cluster.
pub fn guarded<T, S>(sup: &Supervisor, peer: Option<PeerInfo>, stream: S) -> pki::GuardedStream<T>
where
    T: Send + 'static,
    S: futures::Stream<Item = Result<T, Status>> + Send + 'static,
{
    match peer {
        Some(p) => pki::until_revoked(stream, sup.revocations.clone(), p),
        None => Box::pin(stream),
    }
}

/// A refusal: `PermissionDenied`, marked as the supervisor's own definite
/// answer (clients do not retry it).
fn refusal(message: String) -> Status {
    Status::from(ApiError::new(ErrorKind::PermissionDenied, message))
}

fn denied(who: &Identity, what: &str, need: &str) -> Status {
    refusal(format!("{who} may not {what}: it takes {need}"))
}

/// Raft traffic and peer control: only current members' certificates.
/// Returns the member the certificate names (none on an insecure cluster).
pub fn require_member<T>(
    sup: &Supervisor,
    req: &Request<T>,
    what: &str,
) -> Result<Option<u64>, Status> {
    let peer = match caller(sup, req)? {
        Caller::Insecure => return Ok(None),
        Caller::Peer(p) => p,
    };
    let member = match peer.identity {
        Identity::Supervisor { member } => member,
        ref other => {
            tracing::warn!(who = %other, what, "refused a peer RPC from a non-supervisor");
            return Err(denied(other, what, "a supervisor certificate"));
        }
    };
    let m = sup.raft.metrics().borrow().membership_config.clone();
    let mut nodes = m.membership().nodes().map(|(id, _)| *id).peekable();
    if nodes.peek().is_none() || m.membership().nodes().any(|(id, _)| *id == member) {
        return Ok(Some(member));
    }
    tracing::warn!(
        member,
        what,
        "refused a peer RPC from a supervisor that is not a member"
    );
    Err(denied(
        &peer.identity,
        what,
        "a current member of this cluster",
    ))
}

/// Agent RPCs: an agent certificate for `host` itself.
pub fn require_agent<T>(sup: &Supervisor, req: &Request<T>, host: &str) -> Result<(), Status> {
    let peer = match caller(sup, req)? {
        Caller::Insecure => return Ok(()),
        Caller::Peer(p) => p,
    };
    match &peer.identity {
        Identity::Agent { host: h } if h == host => Ok(()),
        other => {
            tracing::warn!(who = %other, host, "refused an agent RPC for another host");
            let what = format!("speak for host {host}");
            Err(denied(
                other,
                &what,
                &format!("the agent certificate of {host}"),
            ))
        }
    }
}

/// The role an admin request takes.
pub fn role_needed(r: &AdminRequest) -> Role {
    match r {
        AdminRequest::ClusterInit
        | AdminRequest::AddMember { .. }
        | AdminRequest::RemoveMember { .. }
        | AdminRequest::TransferLeader { .. } => Role::Admin,
        AdminRequest::Write { op } => match op {
            AdminOp::Job(JobOp::Submit { .. })
            | AdminOp::PlaybookApply { .. }
            | AdminOp::PlaybookDelete { .. }
            | AdminOp::Refused { .. }
            | AdminOp::Revoke { .. }
            | AdminOp::MemberAdded { .. }
            | AdminOp::MemberRemoved { .. }
            | AdminOp::RemoveHost { .. } => Role::Admin,
            AdminOp::Cordon { .. }
            | AdminOp::Uncordon { .. }
            | AdminOp::Drain { .. }
            | AdminOp::Undrain { .. }
            | AdminOp::SetLabels { .. }
            | AdminOp::NicFailover { .. }
            | AdminOp::NicFailback { .. }
            | AdminOp::Job(_)
            | AdminOp::ShapeClear { .. } => Role::Operator,
        },
        _ => Role::Viewer,
    }
}

/// A one-line name of a request for refusals ("write Drain", "cluster
/// AddMember").
pub fn request_name(r: &AdminRequest) -> String {
    match r {
        AdminRequest::Write { op } => op.summary(),
        other => {
            let d = format!("{other:?}");
            d.split([' ', '{', '('])
                .next()
                .unwrap_or_default()
                .to_owned()
        }
    }
}

/// Who an admin call acts as: the certificate's user and role. With
/// `--insecure`, the name the client gave and every role.
pub fn admin_identity<T>(
    sup: &Supervisor,
    req: &Request<T>,
    claimed: &str,
) -> Result<(String, Role), Status> {
    match caller(sup, req)? {
        Caller::Insecure => Ok((claimed.to_owned(), Role::Admin)),
        Caller::Peer(p) => match &p.identity {
            Identity::Admin { user, role } => Ok((user.clone(), *role)),
            other => Err(denied(other, "make admin calls", "an admin certificate")),
        },
    }
}

/// A refused admin call: what it asked and the role it takes.
pub struct RoleRefusal {
    /// The request, named for people ([`request_name`]).
    pub what: String,
    /// The role it takes.
    pub need: Role,
    /// The `PermissionDenied` to answer with.
    pub status: Status,
}

/// Checks `role` against what `request` takes (the caller records a
/// refusal in the history: `service::admin`).
pub fn check_role(actor: &str, role: Role, request: &AdminRequest) -> Result<(), RoleRefusal> {
    let need = role_needed(request);
    if role >= need {
        return Ok(());
    }
    let what = request_name(request);
    tracing::warn!(actor, role = %role, need = %need, request = %what, "admin call refused");
    let status = refusal(format!(
        "{actor} (role {role}) may not {what}: it takes role {need}"
    ));
    Err(RoleRefusal { what, need, status })
}
