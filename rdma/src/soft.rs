//! The `soft` backend's transport: a queue pair is a TCP connection pinned
//! to one NIC (bound to the NIC's address and, with `SO_BINDTODEVICE`, to the
//! device itself, so the kernel never routes it over another rail). TCP
//! gives the reliable, in-order byte stream; the frames of [`crate::seq`]
//! add RC's message boundaries, sequence numbers and acknowledgements.
//!
//! An [`Endpoint`] is one process's presence on its NICs: a listener per NIC
//! (same port on each) that reads the first frame of every incoming path (a
//! `Hello` naming the connection) and hands the path to that connection.
//! Paths for connections not created yet are held briefly (bounded), so the
//! two ends of a connection may start in any order.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch};

use crate::model::{AsyncEventKind, Backend};
use crate::seq::{Decoded, Frame};

/// How long an incoming path may take to say which connection it is for.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(2);
/// Most incoming paths held for connections that do not exist yet.
pub const MAX_PENDING_PATHS: usize = 256;
/// How long such a path is held.
pub const PENDING_TTL: Duration = Duration::from_secs(5);
/// Most paths queued for one connection.
const PATH_QUEUE: usize = 8;

/// Transport failures.
#[derive(Debug, thiserror::Error)]
pub enum SoftError {
    /// A socket operation on a NIC failed (binding, connecting, listening).
    #[error("NIC {nic}: {source}")]
    Nic {
        /// The NIC's interface name.
        nic: String,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },
    /// An endpoint was asked for with no NIC.
    #[error("no NIC given")]
    NoNics,
    /// A NIC name is not a valid Linux interface name.
    #[error("NIC name {0:?} is not a valid interface name")]
    BadNicName(String),
    /// A connection id is registered twice on one endpoint.
    #[error("connection {0} is already open on this endpoint")]
    DuplicateConnection(u64),
}

/// One local NIC: its interface name and the address the endpoint uses.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LocalNic {
    pub name: String,
    pub addr: IpAddr,
}

/// A path that arrived on a listener and introduced itself.
#[derive(Debug)]
pub struct IncomingPath {
    /// Index of the local NIC it arrived on.
    pub nic: usize,
    pub hello: Frame,
    pub stream: TcpStream,
    /// Bytes read after the hello (the start of the next frames).
    pub rest: BytesMut,
    pub arrived: Instant,
}

/// Link state of the endpoint's NICs, as a connection sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NicStatus {
    pub up: bool,
    /// Times the NIC went down (a quick down-up that a reader of the latest
    /// state missed still shows here).
    pub downs: u64,
    /// An admin took the NIC out of service for connections (`railguard
    /// nic failover`): connections leave it and use it only when no NIC in
    /// service is up, until it is released.
    pub held: bool,
}

impl NicStatus {
    /// Up and in service: a NIC a connection should be on.
    pub fn in_service(&self) -> bool {
        self.up && !self.held
    }
}

struct Routes {
    conns: HashMap<u64, mpsc::Sender<IncomingPath>>,
    pending: HashMap<u64, Vec<IncomingPath>>,
}

/// One process's listeners on its NICs and the routing of incoming paths.
pub struct Endpoint {
    nics: Vec<LocalNic>,
    port: u16,
    routes: Arc<Mutex<Routes>>,
    links: watch::Sender<Vec<NicStatus>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Netlink handle in the endpoint's namespace (neighbour repair).
    rtnl: Option<rtnetlink::Handle>,
}

fn valid_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() < libc::IFNAMSIZ
        && !name.contains(['/', '\0'])
        && !name.chars().any(char::is_whitespace)
}

fn nic_err(nic: &str) -> impl FnOnce(std::io::Error) -> SoftError + '_ {
    move |source| SoftError::Nic {
        nic: nic.to_owned(),
        source,
    }
}

fn socket_for(nic: &LocalNic) -> Result<TcpSocket, SoftError> {
    let sock = match nic.addr {
        IpAddr::V4(_) => TcpSocket::new_v4(),
        IpAddr::V6(_) => TcpSocket::new_v6(),
    }
    .map_err(nic_err(&nic.name))?;
    sock.bind_device(Some(nic.name.as_bytes()))
        .map_err(nic_err(&nic.name))?;
    Ok(sock)
}

/// Deletes stuck neighbour (ARP/ND) entries.
///
/// Traffic that leaves a NIC while it has no carrier (say, the FIN of a
/// path being abandoned) leaves the peer's neighbour entry INCOMPLETE with
/// its solicitation lost; the kernel re-solicits only after a second, and
/// queues new packets (the next path's SYN) behind it. Deleting the entry
/// makes the next packet solicit at once. Only INCOMPLETE and FAILED
/// entries are deleted: a resolved entry is left alone, and so is a static
/// (PERMANENT or NOARP) one, which a fabric with fixed neighbour tables
/// could not get back.
#[derive(Clone)]
pub struct NeighbourRepair(rtnetlink::Handle);

fn family_of(ip: IpAddr) -> netlink_packet_route::AddressFamily {
    match ip {
        IpAddr::V4(_) => netlink_packet_route::AddressFamily::Inet,
        IpAddr::V6(_) => netlink_packet_route::AddressFamily::Inet6,
    }
}

fn ifindex(nic: &str) -> Option<u32> {
    let name = std::ffi::CString::new(nic).ok()?;
    // SAFETY: if_nametoindex reads a NUL-terminated string we own.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    (index != 0).then_some(index)
}

impl NeighbourRepair {
    /// Best effort: forgets `ip` on NIC `nic` if its entry is stuck
    /// (INCOMPLETE or FAILED); the look-up and the delete are bounded to
    /// 100 ms each.
    pub async fn forget(&self, nic: &str, ip: IpAddr) {
        use futures::TryStreamExt;
        use netlink_packet_route::neighbour::{
            NeighbourAddress, NeighbourAttribute, NeighbourState,
        };
        let Some(index) = ifindex(nic) else {
            return;
        };
        let want = NeighbourAddress::from(ip);
        let look = async {
            let mut dump = self
                .0
                .neighbours()
                .get()
                .set_address_family(family_of(ip))
                .execute();
            while let Ok(Some(m)) = dump.try_next().await {
                let is_it = m.header.ifindex == index
                    && m.attributes
                        .iter()
                        .any(|a| matches!(a, NeighbourAttribute::Destination(d) if *d == want));
                if is_it {
                    return Some(m.header.state);
                }
            }
            None
        };
        match tokio::time::timeout(Duration::from_millis(100), look).await {
            Ok(Some(NeighbourState::Incomplete | NeighbourState::Failed)) => {}
            Ok(state) => {
                tracing::trace!(nic, %ip, ?state, "neighbour entry not stuck; kept");
                return;
            }
            Err(_) => {
                tracing::debug!(nic, %ip, "neighbour look-up timed out");
                return;
            }
        }
        self.delete(index, ip).await;
    }

    async fn delete(&self, index: u32, ip: IpAddr) {
        use netlink_packet_route::neighbour::{NeighbourAttribute, NeighbourMessage};
        let mut msg = NeighbourMessage::default();
        msg.header.family = family_of(ip);
        msg.header.ifindex = index;
        msg.attributes
            .push(NeighbourAttribute::Destination(ip.into()));
        let req = self.0.neighbours().del(msg).execute();
        match tokio::time::timeout(Duration::from_millis(100), req).await {
            Ok(Ok(())) => tracing::debug!(ifindex = index, %ip, "stuck neighbour entry forgotten"),
            Ok(Err(e)) => {
                tracing::trace!(ifindex = index, %ip, error = %e, "no neighbour entry to forget")
            }
            Err(_) => tracing::debug!(ifindex = index, %ip, "neighbour delete timed out"),
        }
    }
}

/// Opens a path from `nic` to `remote`, bounded by `timeout`.
pub async fn dial(
    nic: &LocalNic,
    remote: SocketAddr,
    timeout: Duration,
) -> Result<TcpStream, SoftError> {
    let sock = socket_for(nic)?;
    sock.bind(SocketAddr::new(nic.addr, 0))
        .map_err(nic_err(&nic.name))?;
    let stream = tokio::time::timeout(timeout, sock.connect(remote))
        .await
        .map_err(|_| SoftError::Nic {
            nic: nic.name.clone(),
            source: std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("connect to {remote} timed out after {timeout:?}"),
            ),
        })?
        .map_err(nic_err(&nic.name))?;
    stream.set_nodelay(true).map_err(nic_err(&nic.name))?;
    Ok(stream)
}

impl Endpoint {
    /// Listens on `port` of every NIC (0: one ephemeral port chosen on the
    /// first NIC and reused on the others).
    pub async fn bind(nics: Vec<LocalNic>, port: u16) -> Result<Self, SoftError> {
        if nics.is_empty() {
            return Err(SoftError::NoNics);
        }
        for n in &nics {
            if !valid_ifname(&n.name) {
                return Err(SoftError::BadNicName(n.name.clone()));
            }
        }
        let mut listeners = Vec::new();
        let mut port = port;
        for nic in &nics {
            let sock = socket_for(nic)?;
            sock.set_reuseaddr(true).map_err(nic_err(&nic.name))?;
            sock.bind(SocketAddr::new(nic.addr, port))
                .map_err(nic_err(&nic.name))?;
            let l = sock.listen(128).map_err(nic_err(&nic.name))?;
            if port == 0 {
                port = l.local_addr().map_err(nic_err(&nic.name))?.port();
            }
            listeners.push(l);
        }
        let routes = Arc::new(Mutex::new(Routes {
            conns: HashMap::new(),
            pending: HashMap::new(),
        }));
        let status = nics
            .iter()
            .map(|_| NicStatus {
                up: true,
                downs: 0,
                held: false,
            })
            .collect();
        let (links, _) = watch::channel(status);
        let mut tasks: Vec<tokio::task::JoinHandle<()>> = Vec::new();
        let rtnl = match rtnetlink::new_connection() {
            Ok((conn, handle, _)) => {
                tasks.push(tokio::spawn(conn));
                Some(handle)
            }
            Err(e) => {
                tracing::warn!(error = %e, "no netlink socket; neighbour repair disabled");
                None
            }
        };
        tasks.extend(
            listeners.into_iter().enumerate().map(|(i, l)| {
                tokio::spawn(accept_loop(i, nics[i].name.clone(), l, routes.clone()))
            }),
        );
        Ok(Self {
            nics,
            port,
            routes,
            links,
            tasks,
            rtnl,
        })
    }

    /// A repairer of neighbour entries in the endpoint's namespace.
    pub fn neighbours(&self) -> Option<NeighbourRepair> {
        self.rtnl.clone().map(NeighbourRepair)
    }

    /// The listening port (the same on every NIC).
    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn nics(&self) -> &[LocalNic] {
        &self.nics
    }

    /// Index of the NIC called `name`.
    pub fn nic_index(&self, name: &str) -> Option<usize> {
        self.nics.iter().position(|n| n.name == name)
    }

    /// Records a link change of NIC `nic` (from the backend's event stream or
    /// an agent order); every connection sees it at once.
    pub fn set_link(&self, nic: usize, up: bool) {
        self.links.send_modify(|v| {
            if let Some(s) = v.get_mut(nic) {
                if s.up && !up {
                    s.downs += 1;
                }
                s.up = up;
            }
        });
    }

    /// Takes NIC `nic` out of service for connections (`held`) or returns
    /// it; every connection sees it at once. Whether that changed it.
    pub fn set_held(&self, nic: usize, held: bool) -> bool {
        self.links.send_if_modified(|v| match v.get_mut(nic) {
            Some(s) if s.held != held => {
                s.held = held;
                true
            }
            _ => false,
        })
    }

    /// Follows the set of NICs an admin holds out of service (from the
    /// agent, [`crate::contract::ContractClient::held_out`]) for as long
    /// as the endpoint is used: a NIC named in the set is held, every other
    /// is in service.
    pub fn follow_held(self: &Arc<Self>, mut held: watch::Receiver<BTreeSet<String>>) {
        let ep = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let names = held.borrow_and_update().clone();
                let Some(ep) = ep.upgrade() else { return };
                for (i, nic) in ep.nics.iter().enumerate() {
                    let h = names.contains(&nic.name);
                    if ep.set_held(i, h) {
                        tracing::info!(nic = %nic.name, held = h, "NIC service changed");
                    }
                }
                drop(ep);
                if held.changed().await.is_err() {
                    return;
                }
            }
        });
    }

    /// Follows the link state of the NICs.
    pub fn links(&self) -> watch::Receiver<Vec<NicStatus>> {
        self.links.subscribe()
    }

    /// Feeds the endpoint's link state from a backend: the current state of
    /// each NIC's device (matched by device name or port netdev), then every
    /// port event, in a task that lives as long as the endpoint is used.
    /// This is the reflex path: a link-down reaches every connection
    /// without any round trip.
    pub fn follow_links(
        self: &Arc<Self>,
        backend: &dyn Backend,
    ) -> Result<(), crate::model::RdmaError> {
        let events = backend.events()?;
        for dev in backend.devices()? {
            for port in &dev.ports {
                let name = port.netdev.as_deref().unwrap_or(&dev.name);
                if let Some(i) = self.nic_index(name) {
                    self.set_link(i, port.is_active());
                }
            }
        }
        let ep = Arc::downgrade(self);
        tokio::spawn(async move {
            use futures::StreamExt;
            let mut events = events;
            while let Some(ev) = events.next().await {
                let Some(ep) = ep.upgrade() else { return };
                let up = match ev.kind {
                    AsyncEventKind::PortActive { .. } => true,
                    AsyncEventKind::PortError { .. } | AsyncEventKind::DeviceFatal => false,
                    _ => continue,
                };
                if let Some(i) = ep.nic_index(&ev.device) {
                    tracing::debug!(nic = %ev.device, up, "link event");
                    ep.set_link(i, up);
                }
            }
        });
        Ok(())
    }

    /// Registers connection `conn_id`: incoming paths naming it arrive on the
    /// returned channel (including any that arrived before).
    pub fn register(&self, conn_id: u64) -> Result<mpsc::Receiver<IncomingPath>, SoftError> {
        let (tx, rx) = mpsc::channel(PATH_QUEUE);
        let mut r = self.routes.lock().expect("routes poisoned");
        if r.conns.get(&conn_id).is_some_and(|t| !t.is_closed()) {
            return Err(SoftError::DuplicateConnection(conn_id));
        }
        for p in r.pending.remove(&conn_id).unwrap_or_default() {
            if p.arrived.elapsed() < PENDING_TTL {
                let _ = tx.try_send(p);
            }
        }
        r.conns.insert(conn_id, tx);
        Ok(rx)
    }

    /// Forgets connection `conn_id` (its incoming paths are refused).
    pub fn unregister(&self, conn_id: u64) {
        self.routes
            .lock()
            .expect("routes poisoned")
            .conns
            .remove(&conn_id);
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn accept_loop(nic: usize, name: String, l: TcpListener, routes: Arc<Mutex<Routes>>) {
    loop {
        let (stream, peer) = match l.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(nic = %name, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let routes = routes.clone();
        let name = name.clone();
        tokio::spawn(async move {
            let _ = stream.set_nodelay(true);
            match tokio::time::timeout(HELLO_TIMEOUT, read_hello(stream)).await {
                Ok(Ok((hello, stream, rest))) => route(
                    &routes,
                    IncomingPath {
                        nic,
                        hello,
                        stream,
                        rest,
                        arrived: Instant::now(),
                    },
                ),
                Ok(Err(e)) => {
                    tracing::debug!(nic = %name, %peer, error = %e, "incoming path refused")
                }
                Err(_) => tracing::debug!(nic = %name, %peer, "incoming path sent no hello"),
            }
        });
    }
}

/// Reads frames until the first complete one, which must be a `Hello`.
pub async fn read_hello(mut stream: TcpStream) -> std::io::Result<(Frame, TcpStream, BytesMut)> {
    let mut buf = BytesMut::with_capacity(256);
    loop {
        match Frame::decode(&mut buf, crate::seq::HELLO_MAX_PAYLOAD) {
            Ok(Decoded::Frame(f @ Frame::Hello { .. })) => return Ok((f, stream, buf)),
            Ok(Decoded::Frame(other)) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("expected a hello, got {}", other.kind()),
                ))
            }
            Ok(Decoded::Incomplete) => {}
            Err(e) => return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
        }
        if buf.len() > 1024 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "hello too long",
            ));
        }
        if stream.read_buf(&mut buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
}

fn route(routes: &Mutex<Routes>, p: IncomingPath) {
    let Frame::Hello { conn_id, .. } = p.hello else {
        return;
    };
    let mut r = routes.lock().expect("routes poisoned");
    if let Some(tx) = r.conns.get(&conn_id) {
        if tx.try_send(p).is_err() {
            tracing::warn!(
                conn_id,
                "connection not taking paths; incoming path dropped"
            );
        }
        return;
    }
    // Not registered (yet): hold it, bounded, dropping expired ones first.
    r.pending.retain(|_, v| {
        v.retain(|p| p.arrived.elapsed() < PENDING_TTL);
        !v.is_empty()
    });
    let held: usize = r.pending.values().map(Vec::len).sum();
    if held >= MAX_PENDING_PATHS {
        tracing::warn!(conn_id, "too many paths for unknown connections; dropped");
        return;
    }
    r.pending.entry(conn_id).or_default().push(p);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_names_are_checked() {
        assert!(valid_ifname("eth0"));
        assert!(valid_ifname("rg12345-h0r1"));
        assert!(!valid_ifname(""));
        assert!(!valid_ifname("a/b"));
        assert!(!valid_ifname("a b"));
        assert!(!valid_ifname("sixteen-chars-xx"));
    }
}
