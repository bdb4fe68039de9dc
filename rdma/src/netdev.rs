//! The soft backend's device side: each NIC (netdev) is a "device" with one
//! port, and its link state is the port state.
//!
//! A port is [`PortState::Active`] when the NIC is admin up (`IFF_UP`), has
//! carrier (`IFF_LOWER_UP`) and is operationally up (`IFF_RUNNING`, which
//! the kernel sets for operstate UP or UNKNOWN); otherwise it is
//! [`PortState::Down`]. So both an admin-down NIC and a carrier loss at the
//! far end count as down.
//!
//! [`NetdevBackend::devices`] asks the kernel synchronously (one
//! `RTM_GETLINK` per NIC on a plain netlink socket). [`NetdevBackend::events`]
//! subscribes to `RTNLGRP_LINK` (rtnetlink multicast), takes a baseline of
//! every NIC, and then reports `PortActive`/`PortError` only when a NIC's
//! state changes. Netlink sockets belong to the network namespace of the
//! thread that creates them, so both work inside whatever namespace the
//! calling thread is in, whichever thread later drives the stream.
//!
//! Nothing is lost silently: a message older than the baseline (by the
//! kernel's carrier-change counter) is ignored, a carrier drop the kernel
//! counted but no message showed is reported as one `PortError` +
//! `PortActive` pair, and after a netlink overrun the NICs are re-queried.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use futures::StreamExt;
use netlink_packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_REQUEST};
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use netlink_packet_route::RouteNetlinkMessage;
use tokio::sync::mpsc;

use crate::model::{
    AsyncEvent, AsyncEventKind, Backend, Device, EventStream, LinkLayer, Port, PortState, RdmaError,
};

/// The port number of a soft device's only port.
pub const SOFT_PORT: u8 = 1;
/// Events buffered between the netlink watcher and the stream's consumer.
pub const EVENT_QUEUE: usize = 256;
/// How long a synchronous netlink query waits for the kernel's answer.
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest interface name the kernel accepts (IFNAMSIZ - 1).
const MAX_IFNAME: usize = 15;

/// The soft backend's devices: the given NICs.
#[derive(Debug, Clone)]
pub struct NetdevBackend {
    nics: Vec<String>,
}

impl NetdevBackend {
    /// A backend over these NICs (duplicates are ignored; order is kept).
    pub fn new(nics: Vec<String>) -> Self {
        let mut seen = std::collections::BTreeSet::new();
        let nics = nics
            .into_iter()
            .filter(|n| seen.insert(n.clone()))
            .collect();
        NetdevBackend { nics }
    }

    /// The NICs this backend watches.
    pub fn nics(&self) -> &[String] {
        &self.nics
    }

    /// Queries every NIC now; `NoSuchNic` for the first one missing.
    fn query_all(&self, q: &mut RtnlQuery) -> Result<Vec<(String, LinkMessage)>, RdmaError> {
        self.nics
            .iter()
            .map(|nic| match q.get_link(nic) {
                Ok(Some(m)) => Ok((nic.clone(), m)),
                Ok(None) => Err(RdmaError::NoSuchNic(nic.clone())),
                Err(e) => Err(RdmaError::Os {
                    op: "RTM_GETLINK",
                    device: nic.clone(),
                    source: e,
                }),
            })
            .collect()
    }
}

impl Backend for NetdevBackend {
    fn name(&self) -> &'static str {
        "netdev"
    }

    fn devices(&self) -> Result<Vec<Device>, RdmaError> {
        let mut q = RtnlQuery::open().map_err(|e| RdmaError::Netlink(e.to_string()))?;
        Ok(self
            .query_all(&mut q)?
            .into_iter()
            .map(|(nic, m)| device_from(&nic, &m))
            .collect())
    }

    fn events(&self) -> Result<EventStream, RdmaError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(RdmaError::NoRuntime("netdev events"));
        }
        if self.nics.is_empty() {
            return Ok(futures::stream::pending().boxed());
        }
        // Subscribe first, then take the baseline, so no change falls
        // between the two. Both sockets are created here, on the caller's
        // thread, hence in the caller's network namespace.
        let (conn, _handle, messages) =
            rtnetlink::new_multicast_connection(&[rtnetlink::MulticastGroup::Link])
                .map_err(|e| RdmaError::Netlink(format!("subscribe to link changes: {e}")))?;
        let mut query = RtnlQuery::open().map_err(|e| RdmaError::Netlink(e.to_string()))?;
        let mut tracker = PortTracker::default();
        for (nic, m) in self.query_all(&mut query)? {
            let sample = LinkSample::from_message(&m);
            tracker.observe(&nic, &sample);
        }
        let (tx, mut rx) = mpsc::channel(EVENT_QUEUE);
        let nics = self.nics.clone();
        tokio::spawn(async move {
            let result = watch(conn, messages, query, tracker, &nics, &tx).await;
            match result {
                Ok(()) => {
                    tracing::debug!(nics = ?nics, "netdev event stream closed by its consumer")
                }
                Err(error) => tracing::error!(nics = ?nics, %error, "netdev event watcher stopped"),
            }
        });
        tracing::info!(nics = ?self.nics, "watching netdev link changes");
        Ok(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed())
    }
}

type Messages = futures::channel::mpsc::UnboundedReceiver<(
    NetlinkMessage<RouteNetlinkMessage>,
    rtnetlink::sys::SocketAddr,
)>;

/// Runs until the consumer drops the stream (`Ok`) or netlink fails.
async fn watch(
    conn: rtnetlink::proto::Connection<RouteNetlinkMessage>,
    mut messages: Messages,
    mut query: RtnlQuery,
    mut tracker: PortTracker,
    nics: &[String],
    tx: &mpsc::Sender<AsyncEvent>,
) -> Result<(), RdmaError> {
    let mut conn = std::pin::pin!(conn);
    loop {
        let msg = tokio::select! {
            _ = tx.closed() => return Ok(()),
            _ = &mut conn => return Err(RdmaError::Netlink("multicast connection closed".into())),
            m = messages.next() => m,
        };
        let Some((msg, _)) = msg else {
            return Err(RdmaError::Netlink("multicast stream ended".into()));
        };
        let mut out = Vec::new();
        match msg.payload {
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(m)) => {
                let s = LinkSample::from_message(&m);
                if let Some(nic) = name_of(&m).filter(|n| nics.iter().any(|x| x == n)) {
                    out.extend(
                        tracker
                            .observe(&nic, &s)
                            .into_iter()
                            .map(|k| (nic.clone(), k)),
                    );
                }
            }
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(m)) => {
                if let Some(nic) = name_of(&m).filter(|n| nics.iter().any(|x| x == n)) {
                    tracing::warn!(nic = %nic, "watched NIC was deleted");
                    out.extend(tracker.gone(&nic).map(|k| (nic.clone(), k)));
                }
            }
            NetlinkPayload::Overrun(_) => {
                // Messages were dropped: ask the kernel for the current
                // state (a short blocking round trip on our own socket).
                tracing::warn!("netlink overrun; re-querying the NICs");
                for nic in nics {
                    match query.get_link(nic) {
                        Ok(Some(m)) => {
                            let s = LinkSample::from_message(&m);
                            out.extend(
                                tracker
                                    .resync(nic, &s)
                                    .into_iter()
                                    .map(|k| (nic.clone(), k)),
                            );
                        }
                        Ok(None) => out.extend(tracker.gone(nic).map(|k| (nic.clone(), k))),
                        Err(e) => {
                            return Err(RdmaError::Os {
                                op: "RTM_GETLINK",
                                device: nic.clone(),
                                source: e,
                            })
                        }
                    }
                }
            }
            _ => {}
        }
        for (device, kind) in out {
            tracing::info!(device = %device, kind = ?kind, "netdev port event");
            if tx.send(AsyncEvent { device, kind }).await.is_err() {
                return Ok(());
            }
        }
    }
}

fn name_of(m: &LinkMessage) -> Option<String> {
    m.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(n) => Some(n.clone()),
        _ => None,
    })
}

/// What a link message says about a NIC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LinkSample {
    pub active: bool,
    pub carrier_changes: Option<u32>,
    pub carrier_down_count: Option<u32>,
}

impl LinkSample {
    fn from_message(m: &LinkMessage) -> Self {
        let f = m.header.flags;
        let mut s = LinkSample {
            active: f.contains(LinkFlags::Up)
                && f.contains(LinkFlags::LowerUp)
                && f.contains(LinkFlags::Running),
            carrier_changes: None,
            carrier_down_count: None,
        };
        for a in &m.attributes {
            match a {
                LinkAttribute::CarrierChanges(c) => s.carrier_changes = Some(*c),
                LinkAttribute::CarrierDownCount(c) => s.carrier_down_count = Some(*c),
                _ => {}
            }
        }
        s
    }
}

/// Per-NIC last known state; turns samples into deduplicated port events.
#[derive(Debug, Default)]
pub(crate) struct PortTracker {
    nics: BTreeMap<String, NicState>,
}

#[derive(Debug, Clone, Copy)]
struct NicState {
    active: bool,
    carrier_changes: Option<u32>,
    carrier_down_count: Option<u32>,
}

fn port_event(active: bool) -> AsyncEventKind {
    if active {
        AsyncEventKind::PortActive { port: SOFT_PORT }
    } else {
        AsyncEventKind::PortError { port: SOFT_PORT }
    }
}

impl PortTracker {
    /// Feeds a multicast sample; the first sample of a NIC is its baseline.
    pub(crate) fn observe(&mut self, nic: &str, s: &LinkSample) -> Vec<AsyncEventKind> {
        self.apply(nic, s, true)
    }

    /// Feeds a freshly queried sample (after an overrun): never stale.
    pub(crate) fn resync(&mut self, nic: &str, s: &LinkSample) -> Vec<AsyncEventKind> {
        self.apply(nic, s, false)
    }

    fn apply(&mut self, nic: &str, s: &LinkSample, may_be_stale: bool) -> Vec<AsyncEventKind> {
        let Some(prev) = self.nics.get(nic).copied() else {
            self.nics.insert(
                nic.to_string(),
                NicState {
                    active: s.active,
                    carrier_changes: s.carrier_changes,
                    carrier_down_count: s.carrier_down_count,
                },
            );
            return Vec::new();
        };
        // A message queued before the baseline was taken: history.
        if let (true, Some(old), Some(new)) =
            (may_be_stale, prev.carrier_changes, s.carrier_changes)
        {
            if new < old {
                tracing::trace!(
                    nic,
                    old,
                    new,
                    "ignoring a link message older than the state"
                );
                return Vec::new();
            }
        }
        let mut out = Vec::new();
        // Carrier drops the kernel counted but no message showed.
        let drops = match (prev.carrier_down_count, s.carrier_down_count) {
            (Some(old), Some(new)) if new > old => new - old,
            _ => 0,
        };
        let seen = u32::from(prev.active && !s.active);
        if drops > seen {
            tracing::warn!(
                nic,
                missed = drops - seen,
                "carrier flaps missed; reporting one"
            );
            // One cycle away from the previous state and back.
            out.push(port_event(!prev.active));
            out.push(port_event(prev.active));
        }
        if prev.active != s.active {
            out.push(port_event(s.active));
        }
        let st = NicState {
            active: s.active,
            carrier_changes: s.carrier_changes.or(prev.carrier_changes),
            carrier_down_count: s.carrier_down_count.or(prev.carrier_down_count),
        };
        self.nics.insert(nic.to_string(), st);
        out
    }

    /// The NIC disappeared: a `PortError` if it was active.
    pub(crate) fn gone(&mut self, nic: &str) -> Option<AsyncEventKind> {
        let st = self.nics.get_mut(nic)?;
        let was_active = std::mem::replace(&mut st.active, false);
        // A NIC created again under this name restarts its counters.
        st.carrier_changes = None;
        st.carrier_down_count = None;
        was_active.then(|| port_event(false))
    }
}

/// The soft device of a NIC.
fn device_from(nic: &str, m: &LinkMessage) -> Device {
    let mac = m.attributes.iter().find_map(|a| match a {
        LinkAttribute::Address(a) => <[u8; 6]>::try_from(a.as_slice()).ok(),
        _ => None,
    });
    let eui = mac.filter(|m| m.iter().any(|b| *b != 0)).map(eui64);
    let active = LinkSample::from_message(m).active;
    Device {
        name: nic.to_string(),
        node_guid: eui.map(u64::from_be_bytes),
        ports: vec![Port {
            num: SOFT_PORT,
            state: if active {
                PortState::Active
            } else {
                PortState::Down
            },
            link_layer: LinkLayer::Ethernet,
            gid: eui.map(|e| {
                let mut gid = [0u8; 16];
                gid[0] = 0xfe;
                gid[1] = 0x80;
                gid[8..].copy_from_slice(&e);
                gid
            }),
            netdev: Some(nic.to_string()),
        }],
    }
}

/// Modified EUI-64 of a MAC, as RoCE derives a port's GUID and link-local
/// GID 0 from it.
fn eui64(mac: [u8; 6]) -> [u8; 8] {
    [
        mac[0] ^ 0x02,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ]
}

/// A plain, blocking rtnetlink socket for request/response queries.
struct RtnlQuery {
    fd: OwnedFd,
    seq: u32,
}

impl RtnlQuery {
    fn open() -> io::Result<Self> {
        // SAFETY: socket(2) with constant arguments; no memory is passed.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let tv = libc::timeval {
            tv_sec: QUERY_TIMEOUT.as_secs() as libc::time_t,
            tv_usec: 0,
        };
        // SAFETY: `tv` is a valid timeval and its exact size is passed.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                std::ptr::addr_of!(tv).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(RtnlQuery { fd, seq: 0 })
    }

    /// The link called `name`, or None if there is none.
    fn get_link(&mut self, name: &str) -> io::Result<Option<LinkMessage>> {
        if name.is_empty() || name.len() > MAX_IFNAME {
            return Ok(None);
        }
        self.seq = self.seq.wrapping_add(1);
        let mut lm = LinkMessage::default();
        lm.attributes.push(LinkAttribute::IfName(name.to_string()));
        let mut req = NetlinkMessage::from(RouteNetlinkMessage::GetLink(lm));
        req.header.flags = NLM_F_REQUEST;
        req.header.sequence_number = self.seq;
        req.finalize();
        let mut buf = vec![0u8; req.buffer_len()];
        req.serialize(&mut buf);
        // SAFETY: `buf` is valid for `buf.len()` bytes; an unconnected
        // netlink socket sends to the kernel.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), buf.as_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n as usize != buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "short netlink send",
            ));
        }
        loop {
            let reply = self.recv()?;
            let mut off = 0;
            while off < reply.len() {
                let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&reply[off..])
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                let len = msg.header.length as usize;
                if len == 0 {
                    break;
                }
                off += (len + 3) & !3;
                if msg.header.sequence_number != self.seq {
                    continue;
                }
                match msg.payload {
                    NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(m)) => {
                        return Ok(Some(m))
                    }
                    NetlinkPayload::Error(e) if e.code.is_some() => {
                        let err = e.to_io();
                        return match err.raw_os_error() {
                            Some(libc::ENODEV) => Ok(None),
                            _ => Err(err),
                        };
                    }
                    NetlinkPayload::Error(_) | NetlinkPayload::Done(_) => return Ok(None),
                    _ => {}
                }
            }
        }
    }

    /// One datagram, whatever its size.
    fn recv(&self) -> io::Result<Vec<u8>> {
        let fd = self.fd.as_raw_fd();
        // SAFETY: a zero-length peek writes nothing; MSG_TRUNC makes it
        // return the datagram's full length.
        let len = unsafe {
            libc::recv(
                fd,
                std::ptr::null_mut(),
                0,
                libc::MSG_PEEK | libc::MSG_TRUNC,
            )
        };
        if len < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = vec![0u8; len as usize];
        // SAFETY: `buf` is valid for `buf.len()` bytes.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        buf.truncate(n as usize);
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(active: bool, changes: u32, downs: u32) -> LinkSample {
        LinkSample {
            active,
            carrier_changes: Some(changes),
            carrier_down_count: Some(downs),
        }
    }

    const ERR: AsyncEventKind = AsyncEventKind::PortError { port: SOFT_PORT };
    const ACT: AsyncEventKind = AsyncEventKind::PortActive { port: SOFT_PORT };

    #[test]
    fn only_changes_are_reported() {
        let mut t = PortTracker::default();
        assert!(t.observe("rail0", &s(true, 1, 0)).is_empty(), "baseline");
        assert!(t.observe("rail0", &s(true, 1, 0)).is_empty(), "same state");
        assert_eq!(t.observe("rail0", &s(false, 2, 1)), vec![ERR]);
        assert!(t.observe("rail0", &s(false, 2, 1)).is_empty(), "dedup");
        assert_eq!(t.observe("rail0", &s(true, 3, 1)), vec![ACT]);
        // Admin down without a carrier change.
        assert_eq!(t.observe("rail0", &s(false, 3, 1)), vec![ERR]);
        assert!(
            t.observe("rail1", &s(false, 0, 0)).is_empty(),
            "other NIC's baseline"
        );
    }

    #[test]
    fn messages_older_than_the_baseline_are_ignored() {
        let mut t = PortTracker::default();
        t.observe("rail0", &s(true, 4, 2));
        // Queued before the baseline dump: a down that was already undone.
        assert!(t.observe("rail0", &s(false, 3, 2)).is_empty());
        assert_eq!(t.observe("rail0", &s(false, 5, 3)), vec![ERR]);
    }

    #[test]
    fn missed_flaps_are_reported_once() {
        let mut t = PortTracker::default();
        t.observe("rail0", &s(true, 0, 0));
        // Three down/up cycles without a message in between.
        assert_eq!(t.observe("rail0", &s(true, 6, 3)), vec![ERR, ACT]);
        // A seen drop plus a missed cycle before it.
        assert_eq!(t.observe("rail0", &s(false, 9, 5)), vec![ERR, ACT, ERR]);
        // Down, and a missed up/down cycle while down.
        assert_eq!(t.observe("rail0", &s(false, 11, 6)), vec![ACT, ERR]);
    }

    #[test]
    fn resync_and_deletion() {
        let mut t = PortTracker::default();
        t.observe("rail0", &s(true, 4, 2));
        assert_eq!(t.resync("rail0", &s(false, 5, 3)), vec![ERR]);
        assert_eq!(t.resync("rail0", &s(true, 6, 3)), vec![ACT]);
        assert_eq!(t.gone("rail0"), Some(ERR));
        assert_eq!(t.gone("rail0"), None);
        assert_eq!(t.gone("unknown"), None);
        // Recreated with fresh counters: not mistaken for stale.
        assert_eq!(t.observe("rail0", &s(true, 1, 0)), vec![ACT]);
    }

    #[test]
    fn soft_device_ids_follow_roce() {
        assert_eq!(
            eui64([0x02, 0x42, 0xac, 0x11, 0x00, 0x02]),
            [0x00, 0x42, 0xac, 0xff, 0xfe, 0x11, 0x00, 0x02]
        );
        let mut m = LinkMessage::default();
        m.header.flags = LinkFlags::Up | LinkFlags::LowerUp | LinkFlags::Running;
        m.attributes.push(LinkAttribute::IfName("rail0".into()));
        m.attributes.push(LinkAttribute::Address(vec![
            0x02, 0x42, 0xac, 0x11, 0x00, 0x02,
        ]));
        let d = device_from("rail0", &m);
        assert_eq!(d.node_guid, Some(0x0042_acff_fe11_0002));
        let p = &d.ports[0];
        assert_eq!(p.state, PortState::Active);
        assert_eq!(p.link_layer, LinkLayer::Ethernet);
        assert_eq!(p.netdev.as_deref(), Some("rail0"));
        let gid = p.gid.expect("gid");
        assert_eq!(&gid[..2], &[0xfe, 0x80]);
        assert_eq!(&gid[8..], &[0x00, 0x42, 0xac, 0xff, 0xfe, 0x11, 0x00, 0x02]);
        // Carrier without operational up (linkwatch not done yet): down.
        m.header.flags = LinkFlags::Up | LinkFlags::LowerUp;
        assert_eq!(device_from("rail0", &m).ports[0].state, PortState::Down);
    }
}
