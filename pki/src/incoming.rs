//! The accept side of a railguard gRPC port: [`incoming`] turns a TCP
//! listener into a stream of verified mutual-TLS connections for tonic's
//! `serve_with_incoming`, each carrying the peer's [`PeerInfo`] (its
//! identity and serial from the verified certificate) into every request's
//! extensions; [`require`] and [`require_role`] read it back in handlers.
//!
//! Handshakes run in their own tasks, at most
//! [`IncomingLimits::max_pending_handshakes`] at once (beyond that the
//! listener is not polled and the kernel backlog holds new connections),
//! at most [`IncomingLimits::max_pending_per_source`] of them from one
//! address (one machine opening silent connections would otherwise hold
//! every slot and keep everyone else waiting; its further connections
//! wait their turn, [`MAX_WAITING`] in all, each at most a handshake
//! timeout), and each within [`IncomingLimits::handshake_timeout`]. A
//! failed or slow handshake is logged and dropped; it never ends the
//! stream. Open connections are counted per identity and in all
//! ([`IncomingLimits::max_conns_per_identity`],
//! [`IncomingLimits::max_connections`]); a connection over a limit is
//! closed after its handshake.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Sleep;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tonic::transport::server::Connected;

use crate::identity::{Identity, Role};
use crate::issue::describe;
use crate::serial::Serial;
use crate::server::ServerTls;

/// Who is at the other end of a connection, from its verified certificate.
/// Every request on the connection carries it as an extension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    /// The identity the peer's certificate names.
    pub identity: Identity,
    /// The peer certificate's serial.
    pub serial: Serial,
    /// When the peer certificate expires.
    pub not_after: SystemTime,
    /// The peer's socket address.
    pub remote_addr: SocketAddr,
}

/// Bounds on the accept side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IncomingLimits {
    /// How long a TLS handshake may take before the connection is dropped.
    pub handshake_timeout: Duration,
    /// How many handshakes may be in progress at once.
    pub max_pending_handshakes: usize,
    /// How many of them may come from one IP address.
    pub max_pending_per_source: usize,
    /// How long to pause accepting after `accept` fails (e.g. out of file
    /// descriptors), so a persistent failure does not spin.
    pub accept_error_pause: Duration,
    /// Open connections one identity (one certificate holder) may hold;
    /// beyond it its new connections are closed after the handshake, so
    /// no holder can take every descriptor from the others.
    pub max_conns_per_identity: usize,
    /// Open connections in all, supervisors not counted (Raft must always
    /// get through); beyond it agents' and admins' new connections are
    /// closed after the handshake.
    pub max_connections: usize,
}

impl Default for IncomingLimits {
    fn default() -> Self {
        IncomingLimits {
            handshake_timeout: HANDSHAKE_TIMEOUT,
            max_pending_handshakes: 64,
            max_pending_per_source: 8,
            accept_error_pause: Duration::from_millis(100),
            max_conns_per_identity: 256,
            max_connections: 4096,
        }
    }
}

/// Open connections per identity, shared by the accept stream and the
/// [`ConnSlot`] each connection holds.
#[derive(Default)]
struct Census {
    per_identity: std::collections::HashMap<Identity, usize>,
    /// Connections of non-supervisors.
    others: usize,
}

/// A connection's place in the [`Census`], given back when it closes.
struct ConnSlot {
    census: Arc<Mutex<Census>>,
    identity: Identity,
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        let mut c = self.census.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = c.per_identity.get_mut(&self.identity) {
            *n -= 1;
            if *n == 0 {
                c.per_identity.remove(&self.identity);
            }
        }
        if !self.identity.is_server() {
            c.others = c.others.saturating_sub(1);
        }
    }
}

/// Takes a slot for a new connection of `identity`, or says why not.
fn admit(
    census: &Arc<Mutex<Census>>,
    identity: &Identity,
    limits: &IncomingLimits,
) -> Result<ConnSlot, String> {
    let mut c = census.lock().unwrap_or_else(|e| e.into_inner());
    let mine = c.per_identity.get(identity).copied().unwrap_or(0);
    if mine >= limits.max_conns_per_identity {
        return Err(format!(
            "{identity} already holds {mine} connections (at most {})",
            limits.max_conns_per_identity
        ));
    }
    if !identity.is_server() {
        if c.others >= limits.max_connections {
            return Err(format!(
                "{} connections are open (at most {})",
                c.others, limits.max_connections
            ));
        }
        c.others += 1;
    }
    *c.per_identity.entry(identity.clone()).or_insert(0) += 1;
    Ok(ConnSlot {
        census: census.clone(),
        identity: identity.clone(),
    })
}

/// Accepted connections waiting for their address's turn to handshake;
/// beyond this many a new one is closed.
pub const MAX_WAITING: usize = 1024;

/// Of those, from one address: so one address cannot fill the queue and
/// leave another's burst nowhere to wait.
pub const MAX_WAITING_PER_SOURCE: usize = 64;

/// The unit one limit counts: an IPv4 address, or an IPv6 /64 (one host
/// commonly holds a whole /64).
fn source_of(addr: SocketAddr) -> std::net::IpAddr {
    match addr.ip() {
        std::net::IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !((1u128 << 64) - 1);
            std::net::IpAddr::V6(prefix.into())
        }
        v4 => v4,
    }
}

/// Handshakes in progress per source address.
type SourceCounts = Arc<Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>;

/// A handshake's place in its source's count, given back when it ends.
struct SourceSlot {
    counts: SourceCounts,
    ip: std::net::IpAddr,
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = c.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                c.remove(&self.ip);
            }
        }
    }
}

/// Takes a handshake slot for a connection from `ip`, unless it already
/// has `max` in progress.
fn source_slot(counts: &SourceCounts, ip: std::net::IpAddr, max: usize) -> Option<SourceSlot> {
    let mut c = counts.lock().unwrap_or_else(|e| e.into_inner());
    let n = c.entry(ip).or_insert(0);
    if *n >= max {
        return None;
    }
    *n += 1;
    Some(SourceSlot {
        counts: counts.clone(),
        ip,
    })
}

/// The default handshake timeout, for servers and clients.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// A verified mutual-TLS connection; tonic reads [`PeerInfo`] from it
/// through [`Connected`].
pub struct PeerStream {
    inner: TlsStream<TcpStream>,
    info: PeerInfo,
    /// Given back to the census when the connection closes.
    _slot: Option<ConnSlot>,
}

impl PeerStream {
    /// The peer of this connection.
    pub fn peer(&self) -> &PeerInfo {
        &self.info
    }
}

impl std::fmt::Debug for PeerStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerStream")
            .field("peer", &self.info)
            .finish_non_exhaustive()
    }
}

impl Connected for PeerStream {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.info.clone()
    }
}

impl AsyncRead for PeerStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for PeerStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// The stream returned by [`incoming`]. Never yields an error and ends
/// only when dropped; dropping it aborts handshakes in progress and closes
/// the listener.
pub struct Incoming {
    listener: TcpListener,
    tls: ServerTls,
    limits: IncomingLimits,
    pending: JoinSet<Option<PeerStream>>,
    pause: Option<Pin<Box<Sleep>>>,
    census: Arc<Mutex<Census>>,
    sources: SourceCounts,
    /// Connections whose address had its handshakes' worth in progress,
    /// oldest first, with when they were accepted.
    waiting: std::collections::VecDeque<(TcpStream, SocketAddr, tokio::time::Instant)>,
    /// Connections closed for a limit (logged on powers of two).
    turned_away: u64,
}

/// Serves mutual TLS on `listener` with `tls`'s current configuration
/// (read per handshake, so a reload applies to the next one) and default
/// [`IncomingLimits`]. Must be called within a tokio runtime. Use with
/// `tonic::transport::Server::builder().add_service(..)
/// .serve_with_incoming(pki::incoming(listener, tls))`.
pub fn incoming(listener: TcpListener, tls: ServerTls) -> Incoming {
    incoming_with_limits(listener, tls, IncomingLimits::default())
}

/// [`incoming`] with explicit limits (a `max_pending_handshakes` or
/// `max_pending_per_source` of 0 is taken as 1).
pub fn incoming_with_limits(
    listener: TcpListener,
    tls: ServerTls,
    limits: IncomingLimits,
) -> Incoming {
    Incoming {
        listener,
        tls,
        limits: IncomingLimits {
            max_pending_handshakes: limits.max_pending_handshakes.max(1),
            max_pending_per_source: limits.max_pending_per_source.max(1),
            ..limits
        },
        pending: JoinSet::new(),
        pause: None,
        census: Arc::default(),
        sources: Arc::default(),
        waiting: std::collections::VecDeque::new(),
        turned_away: 0,
    }
}

impl Incoming {
    /// The address the listener is bound to.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Starts the handshake of a connection whose address has room, or
    /// gives the connection back.
    fn try_start(&mut self, tcp: TcpStream, addr: SocketAddr) -> Option<TcpStream> {
        let max = self.limits.max_pending_per_source;
        let Some(slot) = source_slot(&self.sources, source_of(addr), max) else {
            return Some(tcp);
        };
        let acceptor = TlsAcceptor::from(self.tls.config());
        let timeout = self.limits.handshake_timeout;
        self.pending.spawn(async move {
            let _slot = slot;
            handshake(tcp, addr, acceptor, timeout).await
        });
        None
    }

    /// Starts what waits and may start now (in order; each source's
    /// oldest first), and closes what waited a handshake timeout.
    fn start_waiting(&mut self) {
        let now = tokio::time::Instant::now();
        for _ in 0..self.waiting.len() {
            if self.pending.len() >= self.limits.max_pending_handshakes {
                return;
            }
            let Some((tcp, addr, since)) = self.waiting.pop_front() else {
                return;
            };
            if now.duration_since(since) >= self.limits.handshake_timeout {
                self.turn_away(addr, "it waited a handshake timeout for its address's turn");
                continue;
            }
            if let Some(tcp) = self.try_start(tcp, addr) {
                self.waiting.push_back((tcp, addr, since));
            }
        }
    }

    /// Counts (and now and then logs) a connection closed for a limit.
    fn turn_away(&mut self, peer: SocketAddr, reason: &str) {
        self.turned_away += 1;
        if self.turned_away.is_power_of_two() {
            tracing::warn!(%peer, reason, turned_away = self.turned_away, "connection closed: over a limit");
        }
    }
}

/// Runs one handshake; `None` (logged) if it fails, times out or the
/// certificate names no identity.
async fn handshake(
    tcp: TcpStream,
    remote_addr: SocketAddr,
    acceptor: TlsAcceptor,
    timeout: Duration,
) -> Option<PeerStream> {
    let _ = tcp.set_nodelay(true);
    let stream = match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::warn!(peer = %remote_addr, error = %e, "TLS handshake refused");
            return None;
        }
        Err(_) => {
            tracing::warn!(peer = %remote_addr, timeout_ms = timeout.as_millis() as u64, "TLS handshake timed out");
            return None;
        }
    };
    let leaf = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first());
    let Some(leaf) = leaf else {
        tracing::warn!(peer = %remote_addr, "TLS peer sent no certificate");
        return None;
    };
    let info = match describe(leaf) {
        Ok(info) => info,
        Err(e) => {
            tracing::warn!(peer = %remote_addr, error = %e, "TLS peer certificate unreadable");
            return None;
        }
    };
    let Some(identity) = info.identity else {
        tracing::warn!(peer = %remote_addr, "TLS peer presented a CA certificate");
        return None;
    };
    tracing::debug!(peer = %remote_addr, %identity, serial = %info.serial, "TLS peer accepted");
    Some(PeerStream {
        inner: stream,
        info: PeerInfo {
            identity,
            serial: info.serial,
            not_after: info.not_after,
            remote_addr,
        },
        _slot: None,
    })
}

impl Stream for Incoming {
    type Item = io::Result<PeerStream>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(pause) = this.pause.as_mut() {
                if pause.as_mut().poll(cx).is_ready() {
                    this.pause = None;
                }
            }
            this.start_waiting();
            while this.pause.is_none() && this.pending.len() < this.limits.max_pending_handshakes {
                match this.listener.poll_accept(cx) {
                    Poll::Ready(Ok((tcp, addr))) => {
                        if let Some(tcp) = this.try_start(tcp, addr) {
                            let source = source_of(addr);
                            let same = this
                                .waiting
                                .iter()
                                .filter(|(_, a, _)| source_of(*a) == source)
                                .count();
                            if this.waiting.len() < MAX_WAITING && same < MAX_WAITING_PER_SOURCE {
                                let now = tokio::time::Instant::now();
                                this.waiting.push_back((tcp, addr, now));
                            } else {
                                // Dropped: the connection closes.
                                this.turn_away(addr, "too many connections wait for a handshake");
                            }
                        }
                    }
                    Poll::Ready(Err(e)) => {
                        tracing::warn!(error = %e, pause_ms = this.limits.accept_error_pause.as_millis() as u64, "accept failed; pausing");
                        let mut pause =
                            Box::pin(tokio::time::sleep(this.limits.accept_error_pause));
                        // Registers the waker; a zero pause is over at once.
                        if pause.as_mut().poll(cx).is_pending() {
                            this.pause = Some(pause);
                        }
                    }
                    Poll::Pending => break,
                }
            }
            match this.pending.poll_join_next(cx) {
                Poll::Ready(Some(Ok(Some(mut stream)))) => {
                    match admit(&this.census, &stream.info.identity, &this.limits) {
                        Ok(slot) => {
                            stream._slot = Some(slot);
                            return Poll::Ready(Some(Ok(stream)));
                        }
                        Err(why) => {
                            // Dropped: the connection closes.
                            tracing::debug!(identity = %stream.info.identity, "over a connection limit");
                            this.turn_away(stream.info.remote_addr, &why);
                            continue;
                        }
                    }
                }
                Poll::Ready(Some(Ok(None))) => continue,
                Poll::Ready(Some(Err(e))) => {
                    tracing::warn!(error = %e, "TLS handshake task failed");
                    continue;
                }
                Poll::Ready(None) | Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// The peer of a request served through [`incoming`], or
/// `Unauthenticated` if there is none (the server is not behind
/// [`incoming`]).
#[allow(clippy::result_large_err)]
pub fn require<T>(request: &tonic::Request<T>) -> Result<&PeerInfo, tonic::Status> {
    request
        .extensions()
        .get::<PeerInfo>()
        .ok_or_else(|| tonic::Status::unauthenticated("no verified client certificate"))
}

/// The admin user of a request and its role, if the peer is an admin with
/// at least `min`: `Unauthenticated` without a peer, `PermissionDenied` for
/// a supervisor, an agent, or an admin below `min`.
#[allow(clippy::result_large_err)]
pub fn require_role<T>(
    request: &tonic::Request<T>,
    min: Role,
) -> Result<(&str, Role), tonic::Status> {
    let peer = require(request)?;
    match &peer.identity {
        Identity::Admin { user, role } if *role >= min => Ok((user.as_str(), *role)),
        Identity::Admin { user, role } => Err(tonic::Status::permission_denied(format!(
            "{user} is {role}; this needs {min}"
        ))),
        other => Err(tonic::Status::permission_denied(format!(
            "{other} is not an admin"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_source_is_its_64_and_an_ipv4_source_its_address() {
        let a: SocketAddr = "[2001:db8:1:2:aaaa::1]:5000".parse().unwrap();
        let b: SocketAddr = "[2001:db8:1:2:bbbb::9]:6000".parse().unwrap();
        let c: SocketAddr = "[2001:db8:1:3::1]:5000".parse().unwrap();
        assert_eq!(source_of(a), source_of(b));
        assert_ne!(source_of(a), source_of(c));
        let v4: SocketAddr = "10.0.0.7:1".parse().unwrap();
        assert_eq!(source_of(v4), v4.ip());
        assert_ne!(source_of("10.0.0.8:1".parse().unwrap()), v4.ip());
    }
}
