//! When a TCP stream's data arrived, by the kernel's receive timestamps,
//! and (on the sender's side) when its sender was idle.
//!
//! A packet socket (`AF_PACKET`, cooked, every interface) opened inside a
//! namespace sees each IPv4 packet the namespace receives; the kernel
//! stamps it on arrival (`SO_TIMESTAMPNS`, `CLOCK_REALTIME`), so the times
//! do not depend on when this process gets to read them: a reader that is
//! descheduled for 50 ms on a busy machine finds the packets queued with
//! their true times (the receive buffer holds seconds of the stream). Only
//! the packets carrying payload to the stream's destination port count.
//!
//! What is kept is bounded whatever the run's length: payload bytes per
//! [`BIN`], and every silence longer than [`MIN_GAP`] between two data
//! packets (at most [`MAX_GAPS`]).
//!
//! In the sender's namespace [`Capturer::start_sender`] watches the same
//! stream's data leave and its acknowledgements come back, and keeps the
//! stretches in which everything sent was acknowledged and nothing new
//! left ([`SenderIdle`]): a silence at the receiver that falls in one is
//! the sending program's pause (it wrote nothing: asleep, or not
//! scheduled), not a path that lost its packets.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

/// Width of a throughput bin.
pub const BIN: Duration = Duration::from_millis(10);
/// Silences at least this long are recorded.
pub const MIN_GAP: Duration = Duration::from_millis(1);
/// Most silences recorded (later ones are counted, not kept).
pub const MAX_GAPS: usize = 1 << 20;
/// Most bins (over 11 hours at 10 ms).
pub const MAX_BINS: usize = 4 << 20;

/// What a capture saw (times in ns since the Unix epoch).
#[derive(Debug, Clone, Default)]
pub struct Capture {
    /// Time of the first data packet (the start of bin 0).
    pub first_ns: u64,
    /// Time of the last data packet.
    pub last_ns: u64,
    /// Payload bytes per [`BIN`] from `first_ns`.
    pub bins: Vec<u64>,
    /// Silences longer than [`MIN_GAP`]: (last packet before, first after).
    pub gaps: Vec<(u64, u64)>,
    /// Per silence: what ended it (the interface it arrived on and
    /// whether it was a retransmission, sequence below one seen before)
    /// and the interface of the packet before.
    pub gap_edges: Vec<GapEdge>,
    /// Silences that did not fit in `gaps`.
    pub gaps_dropped: u64,
    pub packets: u64,
}

impl Capture {
    /// The longest time without data in `[from, to]` (ns since the
    /// epoch), and when it began: silences clipped to the window, and the
    /// silence from the last data packet to `to` if the stream was silent
    /// at the window's end.
    pub fn longest_gap(&self, from: u64, to: u64) -> (Duration, u64) {
        let (g, at, _) = self.longest_gap_edge(from, to);
        (g, at)
    }

    /// [`Self::longest_gap`] and the packets around it (None: the window's
    /// silent end, or no silence).
    pub fn longest_gap_edge(&self, from: u64, to: u64) -> (Duration, u64, Option<GapEdge>) {
        let mut best = (0u64, from, None);
        for (s, e, edge) in self.silences(from, to) {
            if e - s > best.0 {
                best = (e - s, s, edge);
            }
        }
        (Duration::from_nanos(best.0), best.1, best.2)
    }

    /// Every silence in `[from, to]`, clipped to it: (start, end, the
    /// packets around it; None for the silent end of the window).
    pub fn silences(&self, from: u64, to: u64) -> Vec<(u64, u64, Option<GapEdge>)> {
        let mut out: Vec<_> = self
            .gaps
            .iter()
            .enumerate()
            .filter(|(_, &(a, b))| b > from && a < to)
            .map(|(i, &(a, b))| (a.max(from), b.min(to), self.gap_edges.get(i).copied()))
            .collect();
        if self.last_ns < to {
            out.push((self.last_ns.max(from), to, None));
        }
        out
    }

    /// Payload bytes received in `[from, to)` (whole bins) and the time
    /// they cover.
    pub fn bytes_between(&self, from: u64, to: u64) -> (u64, Duration) {
        let bin = BIN.as_nanos() as u64;
        let idx = |t: u64| (t.saturating_sub(self.first_ns) / bin) as usize;
        let (a, b) = (idx(from), idx(to).min(self.bins.len()));
        if a >= b {
            return (0, Duration::ZERO);
        }
        let bytes = self.bins[a..b].iter().sum();
        (bytes, Duration::from_nanos((b - a) as u64 * bin))
    }
}

/// The packets around a silence.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GapEdge {
    pub ifindex_before: i32,
    pub ifindex_after: i32,
    pub retransmit_after: bool,
}

/// When a TCP sender was idle: every byte it had sent was acknowledged and
/// it sent nothing new (the program was not writing). Seen from the
/// sender's namespace; times in ns since the
/// Unix epoch. A silence at the receiver that is such an idle stretch is
/// the sender's, not the path's.
#[derive(Debug, Clone, Default)]
pub struct SenderIdle {
    /// Idle stretches at least [`MIN_GAP`] long: (the acknowledgement that
    /// left nothing in flight, the next data packet sent).
    pub idle: Vec<(u64, u64)>,
    /// Stretches that did not fit in `idle`.
    pub dropped: u64,
}

impl SenderIdle {
    /// How much of `[from, to]` the sender was idle.
    pub fn idle_within(&self, from: u64, to: u64) -> Duration {
        let ns = self
            .idle
            .iter()
            .filter(|(a, b)| *b > from && *a < to)
            .map(|(a, b)| b.min(&to) - a.max(&from))
            .sum();
        Duration::from_nanos(ns)
    }
}

/// A running capture; [`Capturer::finish`] stops it and returns what it saw.
pub struct Capturer<T = Capture> {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<anyhow::Result<T>>,
}

impl Capturer<Capture> {
    /// Starts capturing, inside `ns`, the payload of TCP packets received
    /// for destination port `port`.
    pub fn start(ns: &testbed::netns::Netns, port: u16) -> anyhow::Result<Capturer> {
        Capturer::spawn(ns, libc::ETH_P_IP, move |fd, stop| {
            read_loop(fd, port, stop)
        })
    }
}

impl Capturer<SenderIdle> {
    /// Starts watching, inside the sender's namespace `ns`, a TCP stream to
    /// port `port`: the data it sends and the acknowledgements it gets.
    pub fn start_sender(
        ns: &testbed::netns::Netns,
        port: u16,
    ) -> anyhow::Result<Capturer<SenderIdle>> {
        // Only a socket for every protocol sees what the namespace sends.
        Capturer::spawn(ns, libc::ETH_P_ALL, move |fd, stop| {
            sender_loop(fd, port, stop)
        })
    }
}

impl<T: Send + 'static> Capturer<T> {
    pub(crate) fn spawn(
        ns: &testbed::netns::Netns,
        protocol: i32,
        run: impl FnOnce(OwnedFd, &AtomicBool) -> anyhow::Result<T> + Send + 'static,
    ) -> anyhow::Result<Capturer<T>> {
        let fd = ns.run(move || open_socket(protocol))??;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || run(fd, &s));
        Ok(Capturer { stop, thread })
    }

    /// Stops the capture (within its 100 ms read timeout).
    pub fn finish(self) -> anyhow::Result<T> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("the capture thread panicked"))?
    }
}

/// A cooked packet socket for `protocol` (an ethertype, or `ETH_P_ALL`:
/// only such a socket also sees outgoing packets) on every interface, with
/// kernel receive timestamps, a large receive buffer and a 100 ms read
/// timeout.
fn open_socket(protocol: i32) -> anyhow::Result<OwnedFd> {
    let proto = (protocol as u16).to_be() as i32;
    // SAFETY: plain socket call; the result is checked before use.
    let raw = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            proto,
        )
    };
    if raw < 0 {
        return Err(std::io::Error::last_os_error()).context("packet socket (needs root)");
    }
    // SAFETY: `raw` is a new descriptor owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let set = |level, name, value: &[u8]| -> anyhow::Result<()> {
        // SAFETY: `value` outlives the call and its length is passed.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                level,
                name,
                value.as_ptr().cast(),
                value.len() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(std::io::Error::last_os_error()).context("setsockopt on the packet socket");
        }
        Ok(())
    };
    set(libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, &1i32.to_ne_bytes())?;
    // Seconds of the stream at the bench's rates, whatever the scheduler does.
    set(
        libc::SOL_SOCKET,
        libc::SO_RCVBUFFORCE,
        &(64i32 << 20).to_ne_bytes(),
    )?;
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 100_000,
    };
    // SAFETY: a timeval's bytes, read by the kernel for its length.
    let tv_bytes = unsafe {
        std::slice::from_raw_parts(
            (&tv as *const libc::timeval).cast::<u8>(),
            std::mem::size_of::<libc::timeval>(),
        )
    };
    set(libc::SOL_SOCKET, libc::SO_RCVTIMEO, tv_bytes)?;
    Ok(fd)
}

/// The TCP payload length, sequence number and source port of an IPv4
/// packet's first bytes when it goes to `port`; None for anything else.
pub fn tcp_payload_to(pkt: &[u8], wire_len: usize, port: u16) -> Option<(usize, u32, u16)> {
    let (_, tcp) = tcp_header(pkt)?;
    if u16::from_be_bytes([tcp[2], tcp[3]]) != port {
        return None;
    }
    let (_, payload) = tcp_payload(pkt, wire_len)?;
    let seq = u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]);
    let from = u16::from_be_bytes([tcp[0], tcp[1]]);
    Some((payload, seq, from))
}

/// The IP header length and the TCP payload length of an IPv4 TCP packet
/// (`wire_len`: its whole length); None for anything else.
pub(crate) fn tcp_payload(pkt: &[u8], wire_len: usize) -> Option<(usize, usize)> {
    let (ihl, tcp) = tcp_header(pkt)?;
    let total = usize::from(u16::from_be_bytes([pkt[2], pkt[3]])).min(wire_len);
    // A GSO packet's IP length may be 0: the wire length tells.
    let total = if total == 0 { wire_len } else { total };
    let doff = usize::from(tcp[12] >> 4) * 4;
    Some((ihl, total.saturating_sub(ihl + doff)))
}

/// An IPv4 TCP packet's IP header length and the first 14 bytes of its
/// TCP header (ports, sequence, ACK, offset, flags); None for anything else.
fn tcp_header(pkt: &[u8]) -> Option<(usize, &[u8])> {
    if pkt.len() < 20 || pkt[0] >> 4 != 4 || pkt[9] != libc::IPPROTO_TCP as u8 {
        return None;
    }
    let ihl = usize::from(pkt[0] & 0x0f) * 4;
    Some((ihl, pkt.get(ihl..ihl + 14)?))
}

/// The ACK number and destination port of an IPv4 TCP packet from source
/// port `port` with the ACK flag; None for anything else.
pub fn tcp_ack_from(pkt: &[u8], port: u16) -> Option<(u32, u16)> {
    let (_, tcp) = tcp_header(pkt)?;
    (u16::from_be_bytes([tcp[0], tcp[1]]) == port && tcp[13] & 0x10 != 0).then(|| {
        (
            u32::from_be_bytes([tcp[8], tcp[9], tcp[10], tcp[11]]),
            u16::from_be_bytes([tcp[2], tcp[3]]),
        )
    })
}

/// The stream measured: of the connections to the port (iperf3 has a
/// control connection beside its data), the one whose client port first
/// carries a segment of [`DataFlow::MIN_PAYLOAD`] bytes or more.
#[derive(Debug, Default)]
struct DataFlow(Option<u16>);

impl DataFlow {
    /// Larger than any control message iperf3 sends.
    const MIN_PAYLOAD: usize = 2048;

    /// Whether a data segment from client port `from` belongs to the stream.
    fn data(&mut self, from: u16, payload: usize) -> bool {
        if self.0.is_none() && payload >= Self::MIN_PAYLOAD {
            self.0 = Some(from);
        }
        self.0 == Some(from)
    }
}

/// Whether sequence `a` is after `b` (wrapping).
fn seq_after(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// One packet read from the packet socket: its first bytes are in the
/// reader's buffer.
pub(crate) struct Packet {
    pub(crate) outgoing: bool,
    pub(crate) ifindex: i32,
    pub(crate) wire_len: usize,
    /// The kernel's timestamp (ns since the epoch).
    pub(crate) at: u64,
}

/// Reads the next packet into `buf`; None when the read timed out, or the
/// packet is not IPv4 or carries no timestamp.
pub(crate) fn recv_packet(fd: &OwnedFd, buf: &mut [u8; 128]) -> anyhow::Result<Option<Packet>> {
    let mut ctl = [0u64; 16];
    let mut from: libc::sockaddr_ll = {
        // SAFETY: sockaddr_ll is plain data; all-zero is valid.
        unsafe { std::mem::zeroed() }
    };
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&mut from as *mut libc::sockaddr_ll).cast();
    msg.msg_namelen = std::mem::size_of::<libc::sockaddr_ll>() as u32;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctl.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&ctl);
    // SAFETY: every pointer in `msg` points at live buffers of the
    // lengths given.
    let n = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, libc::MSG_TRUNC) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return match e.kind() {
            std::io::ErrorKind::WouldBlock
            | std::io::ErrorKind::TimedOut
            | std::io::ErrorKind::Interrupted => Ok(None),
            _ => Err(e).context("reading the packet socket"),
        };
    }
    if from.sll_protocol != (libc::ETH_P_IP as u16).to_be() {
        return Ok(None);
    }
    Ok(timestamp(&msg).map(|at| Packet {
        outgoing: from.sll_pkttype == libc::PACKET_OUTGOING,
        ifindex: from.sll_ifindex,
        wire_len: n as usize,
        at,
    }))
}

/// The sender's side: idle from an acknowledgement that covers everything
/// sent until the next data packet.
fn sender_loop(fd: OwnedFd, port: u16, stop: &AtomicBool) -> anyhow::Result<SenderIdle> {
    let mut out = SenderIdle::default();
    let min_gap = MIN_GAP.as_nanos() as u64;
    let mut buf = [0u8; 128];
    // The end of the highest sequence sent, the highest acknowledged.
    let (mut nxt, mut una): (Option<u32>, Option<u32>) = (None, None);
    let mut idle_since: Option<u64> = None;
    let mut flow = DataFlow::default();
    while !stop.load(Ordering::Relaxed) {
        let Some(p) = recv_packet(&fd, &mut buf)? else {
            continue;
        };
        let pkt = &buf[..p.wire_len.min(buf.len())];
        if p.outgoing {
            let Some((payload, seq, from)) = tcp_payload_to(pkt, p.wire_len, port) else {
                continue;
            };
            if payload == 0 || !flow.data(from, payload) {
                continue;
            }
            let end = seq.wrapping_add(payload as u32);
            if nxt.is_none_or(|h| seq_after(end, h)) {
                nxt = Some(end);
            }
            if let Some(s) = idle_since.take() {
                if p.at.saturating_sub(s) >= min_gap {
                    if out.idle.len() < MAX_GAPS {
                        out.idle.push((s, p.at));
                    } else {
                        out.dropped += 1;
                    }
                }
            }
        } else if let Some((ack, to)) = tcp_ack_from(pkt, port) {
            if flow.0 != Some(to) {
                continue;
            }
            if una.is_none_or(|u| seq_after(ack, u)) {
                una = Some(ack);
            }
            let all_acked = matches!((nxt, una), (Some(n), Some(u)) if !seq_after(n, u));
            if all_acked && idle_since.is_none() {
                idle_since = Some(p.at);
            }
        }
    }
    Ok(out)
}

fn read_loop(fd: OwnedFd, port: u16, stop: &AtomicBool) -> anyhow::Result<Capture> {
    let mut cap = Capture::default();
    let bin = BIN.as_nanos() as u64;
    let min_gap = MIN_GAP.as_nanos() as u64;
    let mut buf = [0u8; 128];
    // The end of the highest sequence seen (wrapping), and the interface
    // of the last data packet.
    let mut high: Option<u32> = None;
    let mut last_if = 0i32;
    let mut flow = DataFlow::default();
    while !stop.load(Ordering::Relaxed) {
        let Some(p) = recv_packet(&fd, &mut buf)? else {
            continue;
        };
        if p.outgoing {
            continue;
        }
        let wire_len = p.wire_len;
        let got = wire_len.min(buf.len());
        let Some((payload, seq, from)) = tcp_payload_to(&buf[..got], wire_len, port) else {
            continue;
        };
        if payload == 0 || !flow.data(from, payload) {
            continue;
        }
        let t = p.at;
        if cap.packets == 0 {
            cap.first_ns = t;
            cap.last_ns = t;
        }
        cap.packets += 1;
        let end = seq.wrapping_add(payload as u32);
        let retransmit = high.is_some_and(|h| !seq_after(end, h));
        if high.is_none_or(|h| seq_after(end, h)) {
            high = Some(end);
        }
        if t > cap.last_ns {
            if t - cap.last_ns >= min_gap {
                if cap.gaps.len() < MAX_GAPS {
                    cap.gaps.push((cap.last_ns, t));
                    cap.gap_edges.push(GapEdge {
                        ifindex_before: last_if,
                        ifindex_after: p.ifindex,
                        retransmit_after: retransmit,
                    });
                } else {
                    cap.gaps_dropped += 1;
                }
            }
            cap.last_ns = t;
        }
        last_if = p.ifindex;
        let i = (t.saturating_sub(cap.first_ns) / bin) as usize;
        if i < MAX_BINS {
            if cap.bins.len() <= i {
                cap.bins.resize(i + 1, 0);
            }
            cap.bins[i] += payload as u64;
        }
    }
    Ok(cap)
}

/// The `SCM_TIMESTAMPNS` of a received message (ns since the epoch).
fn timestamp(msg: &libc::msghdr) -> Option<u64> {
    // SAFETY: the CMSG macros walk the control buffer the kernel filled,
    // within msg_controllen.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::timespec>());
                return Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ipv4_tcp(dport: u16, payload: u16) -> Vec<u8> {
        let mut p = vec![0u8; 40];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(40 + payload).to_be_bytes());
        p[9] = 6;
        p[22..24].copy_from_slice(&dport.to_be_bytes());
        p[32] = 5 << 4;
        p
    }

    #[test]
    fn payload_is_counted_only_for_the_port_and_tcp() {
        assert_eq!(
            tcp_payload_to(&ipv4_tcp(5201, 1448), 1488, 5201),
            Some((1448, 0, 0))
        );
        assert_eq!(
            tcp_payload_to(&ipv4_tcp(5201, 0), 40, 5201),
            Some((0, 0, 0))
        );
        assert_eq!(tcp_payload_to(&ipv4_tcp(22, 100), 140, 5201), None);
        let mut udp = ipv4_tcp(5201, 100);
        udp[9] = 17;
        assert_eq!(tcp_payload_to(&udp, 140, 5201), None);
        assert_eq!(tcp_payload_to(&[0x45; 10], 10, 5201), None);
        // A GSO packet: IP length 0, the wire length tells.
        let mut gso = ipv4_tcp(5201, 0);
        gso[2..4].copy_from_slice(&0u16.to_be_bytes());
        assert_eq!(
            tcp_payload_to(&gso, 40 + 60_000, 5201),
            Some((60_000, 0, 0))
        );
    }

    #[test]
    fn acks_are_read_only_from_the_port_with_the_ack_flag() {
        let mut p = ipv4_tcp(80, 0);
        p[20..22].copy_from_slice(&5201u16.to_be_bytes());
        p[28..32].copy_from_slice(&0xdead_beefu32.to_be_bytes());
        assert_eq!(tcp_ack_from(&p, 5201), None, "no ACK flag");
        p[33] = 0x10;
        assert_eq!(tcp_ack_from(&p, 5201), Some((0xdead_beef, 80)));
        assert_eq!(tcp_ack_from(&p, 5202), None, "another port");
        p[9] = 17;
        assert_eq!(tcp_ack_from(&p, 5201), None, "not TCP");
        assert!(seq_after(5, u32::MAX - 5), "wraps");
        assert!(!seq_after(7, 7));
    }

    #[test]
    fn the_data_flow_is_the_first_with_a_large_segment() {
        let mut f = DataFlow::default();
        assert!(!f.data(40_000, 37), "a control message locks nothing");
        assert!(f.data(40_001, 65_160));
        assert!(!f.data(40_000, 65_160), "another connection");
        assert!(f.data(40_001, 10), "small segments of the stream count");
    }

    #[test]
    fn sender_idle_is_summed_within_the_window() {
        let ms = 1_000_000u64;
        let s = SenderIdle {
            idle: vec![(10 * ms, 20 * ms), (30 * ms, 70 * ms)],
            dropped: 0,
        };
        assert_eq!(s.idle_within(0, 100 * ms), Duration::from_millis(50));
        assert_eq!(s.idle_within(15 * ms, 40 * ms), Duration::from_millis(15));
        assert_eq!(s.idle_within(20 * ms, 30 * ms), Duration::ZERO);
    }

    #[test]
    fn the_longest_gap_is_clipped_to_the_window_and_counts_a_silent_end() {
        let ms = 1_000_000u64;
        let cap = Capture {
            first_ns: 0,
            last_ns: 500 * ms,
            bins: vec![1000; 50],
            gaps: vec![(100 * ms, 130 * ms), (200 * ms, 280 * ms)],
            gap_edges: vec![GapEdge::default(); 2],
            gaps_dropped: 0,
            packets: 10,
        };
        assert_eq!(
            cap.longest_gap(0, 500 * ms),
            (Duration::from_millis(80), 200 * ms)
        );
        // Clipped: only 30 ms of the 80 ms silence is inside.
        assert_eq!(
            cap.longest_gap(250 * ms, 400 * ms).0,
            Duration::from_millis(30)
        );
        // The stream silent from 500 ms to the window's end at 600 ms.
        assert_eq!(
            cap.longest_gap(450 * ms, 600 * ms),
            (Duration::from_millis(100), 500 * ms)
        );
        assert_eq!(
            cap.bytes_between(0, 100 * ms),
            (10_000, Duration::from_millis(100))
        );
    }
}
