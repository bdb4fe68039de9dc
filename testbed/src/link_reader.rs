//! The kernel's link messages, read on a thread of their own.
//!
//! `bench detect` needs to know when the kernel published a link change in
//! a host's namespace, apart from when the agent there handled it. This is
//! the fastest reader we have: one OS thread blocked in `recv` on a netlink
//! socket subscribed to `RTNLGRP_LINK`, woken by the kernel directly, which
//! stamps each message the moment `recv` returns and hands the message and
//! its stamp on over a bounded channel.
//!
//! (The agent read its link messages this way for a day: its tracker,
//! woken from this thread instead of by rtnetlink's connection task on its
//! own runtime, handled changes no sooner, so it went back; see
//! docs/benchmarks.md.)
//!
//! The thread dumps every link once at the start (after subscribing, so no
//! change falls between the two) and ends the dump with
//! [`Watched::DumpDone`]. If the socket's buffer overran (`ENOBUFS`: the
//! consumer fell behind and messages were dropped), it dumps again, so a
//! consumer that compares the kernel's carrier counters misses no flap.
//!
//! When the channel is full the thread waits, the socket fills, and the
//! overrun path above takes over. The thread ends when the consumer drops
//! its receiver (noticed within [`RECV_TIMEOUT`]) or on a socket error it
//! cannot recover from, which closes the channel.

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use netlink_packet_core::{
    NetlinkBuffer, NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_route::link::LinkMessage;
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket};
use tokio::sync::mpsc;

/// What the watch thread hands the tracker.
#[derive(Debug)]
pub enum Watched {
    /// A link message, and when the thread read it.
    Link(Box<LinkMessage>, Instant),
    /// The end of a dump (after the first, every link has been sent once;
    /// later ones follow an overrun).
    DumpDone,
}

/// `RTNLGRP_LINK`.
const RTNLGRP_LINK: u32 = 1;
/// How long a `recv` waits before the thread checks that the tracker is
/// still there.
pub const RECV_TIMEOUT: Duration = Duration::from_millis(500);
/// The socket's receive buffer: room for a few thousand link messages
/// while the tracker is busy (the kernel caps it at `rmem_max`).
const RCVBUF_BYTES: usize = 1 << 20;
/// One `recv`: a dump's datagrams are at most a page or two each.
const DATAGRAM_BYTES: usize = 64 * 1024;

/// Starts the watch thread; samples arrive on the returned channel (at
/// most `capacity` waiting).
pub fn start(capacity: usize) -> std::io::Result<mpsc::Receiver<Watched>> {
    let socket = open()?;
    let (tx, rx) = mpsc::channel(capacity.max(1));
    std::thread::Builder::new()
        .name("link-watch".into())
        .spawn(move || {
            if let Err(e) = Watch::new(socket, tx).run() {
                tracing::error!(error = %e, "link watch ended");
            }
        })?;
    Ok(rx)
}

fn open() -> std::io::Result<Socket> {
    let mut s = Socket::new(NETLINK_ROUTE)?;
    s.bind_auto()?;
    s.add_membership(RTNLGRP_LINK)?;
    s.set_rx_buf_sz(RCVBUF_BYTES)?;
    let tv = libc::timeval {
        tv_sec: RECV_TIMEOUT.as_secs() as libc::time_t,
        tv_usec: RECV_TIMEOUT.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: a valid timeval for the length given, on a socket we own.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(s)
}

struct Watch {
    socket: Socket,
    tx: mpsc::Sender<Watched>,
    /// The sequence number of the dump in progress, if any.
    dumping: Option<u32>,
    /// An overrun while a dump was in progress: dump again after it.
    resync: bool,
    next_seq: u32,
}

impl Watch {
    fn new(socket: Socket, tx: mpsc::Sender<Watched>) -> Self {
        Self {
            socket,
            tx,
            dumping: None,
            resync: false,
            next_seq: 1,
        }
    }

    fn run(mut self) -> std::io::Result<()> {
        self.request_dump()?;
        let mut buf: Vec<u8> = Vec::with_capacity(DATAGRAM_BYTES);
        loop {
            buf.clear();
            match self.socket.recv(&mut buf, 0) {
                Ok(_) => {
                    let at = Instant::now();
                    if !self.handle_datagram(&buf, at)? {
                        return Ok(());
                    }
                }
                Err(e) => match e.raw_os_error() {
                    Some(libc::EAGAIN) | Some(libc::EINTR) => {
                        if self.tx.is_closed() {
                            return Ok(());
                        }
                    }
                    Some(libc::ENOBUFS) => {
                        tracing::warn!("link watch: the socket overran; dumping every link again");
                        self.overrun()?;
                    }
                    _ => return Err(e),
                },
            }
        }
    }

    /// Sends a dump request unless one is in progress (then it is asked
    /// for again once that one ends).
    fn overrun(&mut self) -> std::io::Result<()> {
        if self.dumping.is_some() {
            self.resync = true;
            Ok(())
        } else {
            self.request_dump()
        }
    }

    fn request_dump(&mut self) -> std::io::Result<()> {
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        header.sequence_number = seq;
        let mut msg = NetlinkMessage::new(
            header,
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::GetLink(LinkMessage::default())),
        );
        msg.finalize();
        let mut bytes = vec![0u8; msg.buffer_len()];
        msg.serialize(&mut bytes);
        self.socket.send(&bytes, 0)?;
        self.dumping = Some(seq);
        Ok(())
    }

    /// Hands on every link message of one datagram; false once the tracker
    /// is gone.
    fn handle_datagram(&mut self, mut bytes: &[u8], at: Instant) -> std::io::Result<bool> {
        while !bytes.is_empty() {
            let Ok(nb) = NetlinkBuffer::new_checked(bytes) else {
                tracing::warn!(
                    len = bytes.len(),
                    "link watch: a truncated netlink message; rest of the datagram skipped"
                );
                return Ok(true);
            };
            let len = nb.length() as usize;
            let aligned = (len + 3) & !3;
            let one = &bytes[..len];
            bytes = bytes.get(aligned..).unwrap_or_default();
            let msg = match NetlinkMessage::<RouteNetlinkMessage>::deserialize(one) {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "link watch: a netlink message it cannot decode; skipped");
                    continue;
                }
            };
            let seq = msg.header.sequence_number;
            let handed = match msg.payload {
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(m)) => {
                    self.tx.blocking_send(Watched::Link(Box::new(m), at))
                }
                NetlinkPayload::Done(_) if self.dumping == Some(seq) => {
                    self.dumping = None;
                    if std::mem::take(&mut self.resync) {
                        self.request_dump()?;
                    }
                    self.tx.blocking_send(Watched::DumpDone)
                }
                NetlinkPayload::Error(e) if self.dumping == Some(seq) => {
                    return Err(std::io::Error::other(format!("link dump: {e}")));
                }
                NetlinkPayload::Overrun(_) => {
                    self.overrun()?;
                    Ok(())
                }
                _ => Ok(()),
            };
            if handed.is_err() {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The watch thread in this process's namespace: its first dump lists
    /// `lo`, ends with DumpDone, and every sample is stamped no earlier
    /// than the start.
    #[tokio::test]
    async fn the_first_dump_lists_every_link_and_ends() {
        let t0 = Instant::now();
        let mut rx = start(64).expect("netlink route sockets need no privilege");
        let mut names = Vec::new();
        loop {
            match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
                Ok(Some(Watched::Link(m, at))) => {
                    assert!(at >= t0);
                    names.extend(m.attributes.iter().filter_map(|a| match a {
                        netlink_packet_route::link::LinkAttribute::IfName(n) => Some(n.clone()),
                        _ => None,
                    }));
                }
                Ok(Some(Watched::DumpDone)) => break,
                other => panic!("dump did not end: {other:?}"),
            }
        }
        assert!(names.iter().any(|n| n == "lo"), "{names:?}");
    }

    /// A header that claims more bytes than the datagram holds ends the
    /// datagram's handling; nothing is decoded from the short bytes.
    #[test]
    fn a_datagram_split_mid_message_is_skipped_not_misread() {
        let (tx, mut rx) = mpsc::channel(4);
        let socket = open().expect("socket");
        let mut w = Watch::new(socket, tx);
        // A header that claims 64 bytes in a 20-byte datagram.
        let mut bytes = vec![0u8; 20];
        bytes[..4].copy_from_slice(&64u32.to_ne_bytes());
        assert!(w.handle_datagram(&bytes, Instant::now()).expect("no error"));
        assert!(rx.try_recv().is_err(), "nothing handed on");
    }

    fn done(seq: u32) -> Vec<u8> {
        let mut header = NetlinkHeader::default();
        header.sequence_number = seq;
        let mut m = NetlinkMessage::<RouteNetlinkMessage>::new(
            header,
            NetlinkPayload::Done(netlink_packet_core::DoneMessage::default()),
        );
        m.finalize();
        let mut b = vec![0u8; m.buffer_len()];
        m.serialize(&mut b);
        b
    }

    /// An overrun during a dump asks for another once that one ends; the
    /// end of a dump that is not ours is ignored.
    #[test]
    fn an_overrun_during_a_dump_dumps_again_after_it() {
        let (tx, mut rx) = mpsc::channel(4);
        let mut w = Watch::new(open().expect("socket"), tx);
        w.request_dump().expect("dump");
        let first = w.dumping.expect("dumping");
        w.overrun().expect("overrun");
        assert!(w.resync && w.dumping == Some(first));
        assert!(w
            .handle_datagram(&done(first + 7), Instant::now())
            .expect("ok"));
        assert!(rx.try_recv().is_err(), "another dump's end is not ours");
        assert!(w.handle_datagram(&done(first), Instant::now()).expect("ok"));
        assert!(matches!(rx.try_recv(), Ok(Watched::DumpDone)));
        let second = w.dumping.expect("a second dump");
        assert_ne!(second, first);
        assert!(!w.resync);
    }
}
