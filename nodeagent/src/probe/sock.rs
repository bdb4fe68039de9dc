//! A UDP socket on one data NIC with kernel timestamps (`SO_TIMESTAMPING`).
//!
//! * Bound to the NIC's address and to the device itself
//!   (`SO_BINDTODEVICE`), so probes leave and arrive through that NIC only.
//! * Receive timestamps arrive with each datagram (`SCM_TIMESTAMPING`).
//! * Transmit timestamps come back on the socket's error queue with the
//!   sent frame (link, IP and UDP headers, then the probe): the probe is the
//!   frame's last [`PACKET_LEN`] bytes, which identifies the timestamp
//!   without tracking the kernel's `OPT_ID` counter (robust to failed
//!   sends). This needs `net.core.tstamp_allow_data = 1` (the default) or
//!   CAP_NET_RAW.
//! * Software mode uses the kernel's software stamps (taken by the driver at
//!   transmit, by the stack at receive; both `CLOCK_REALTIME`). Hardware
//!   mode switches the NIC's timestamping on (`SIOCSHWTSTAMP`) and uses the
//!   raw NIC-clock stamps; a NIC without it is a clear error at start.
//! * Batching: one `sendmmsg` sends a tick's pairs on this NIC (the two
//!   probes of a pair back to back, a gap of a few µs) and `recvmmsg`
//!   drains up to [`BATCH`] datagrams or stamps per call, which keeps the
//!   mesh's CPU cost to a handful of syscalls per tick.
//!
//! This is the only `unsafe` in the probe mesh (with [`thread_cpu_ns`], the
//! calling thread's CPU clock for the CPU governor); each block states why
//! it is sound.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::wire::PACKET_LEN;

/// `SO_TIMESTAMPING` (`SO_TIMESTAMPING_OLD`: 64-bit `timespec` on 64-bit
/// targets).
const SO_TIMESTAMPING: libc::c_int = 37;
/// Datagrams or stamps handled per `recvmmsg` call.
pub const BATCH: usize = 32;
/// Datagrams sent per `sendmmsg` call.
pub const MAX_SEND_BATCH: usize = 128;
/// Receive buffer per datagram: a probe plus room to notice oversize ones.
const BUF: usize = 256;
/// Control buffer per datagram (timestamps plus the error-queue cmsg).
const CBUF: usize = 256;
/// Receive buffer asked for (bytes; the kernel doubles it for overhead).
/// Received probes and the error queue's transmit-stamp clones share it,
/// and the kernel drops a stamp that does not fit: with the default
/// 208 KiB, a probe thread stalled for ~100 ms could lose a probe's first
/// stamp, and a later hop's would take its place. This is room for several
/// hundred ms at the default rate. Set with `SO_RCVBUFFORCE` (root), else
/// `SO_RCVBUF` (capped by `net.core.rmem_max`).
pub const RCVBUF_BYTES: libc::c_int = 1 << 20;

/// Which timestamps the socket uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TsMode {
    /// Kernel software stamps (any NIC).
    Software,
    /// The NIC's hardware clock (NICs with PTP hardware timestamping).
    Hardware,
}

impl std::str::FromStr for TsMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "software" => Ok(TsMode::Software),
            "hardware" => Ok(TsMode::Hardware),
            _ => Err(format!(
                "timestamp mode {s:?}: want \"software\" or \"hardware\""
            )),
        }
    }
}

/// Errors opening a probe socket.
#[derive(Debug, thiserror::Error)]
pub enum SockError {
    /// A socket call (`op`) failed on a NIC.
    #[error("probe socket on {nic} ({addr}): {op}: {source}")]
    Io {
        nic: String,
        addr: SocketAddrV4,
        op: &'static str,
        #[source]
        source: io::Error,
    },
    /// The NIC name does not fit an interface name.
    #[error("NIC name {0:?} is too long for an interface name")]
    BadName(String),
    /// Hardware timestamps were asked for and the NIC has none.
    #[error("NIC {nic} does not offer hardware timestamps ({source}); use software timestamps")]
    NoHardwareTimestamps {
        nic: String,
        #[source]
        source: io::Error,
    },
}

/// A datagram that arrived.
#[derive(Debug, Clone)]
pub struct Received {
    pub from: SocketAddrV4,
    pub len: usize,
    pub data: [u8; PACKET_LEN],
    /// Kernel receive timestamp (ns), if the kernel gave one.
    pub ts_ns: Option<i64>,
}

/// A transmit timestamp and the tail of the frame it belongs to.
#[derive(Debug, Clone)]
pub struct TxStamp {
    pub frame_len: usize,
    pub tail: [u8; PACKET_LEN],
    pub ts_ns: i64,
}

/// The probe socket of one NIC.
#[derive(Debug)]
pub struct TsSocket {
    fd: OwnedFd,
    mode: TsMode,
}

fn ifname(nic: &str) -> Result<[libc::c_char; libc::IFNAMSIZ], SockError> {
    let b = nic.as_bytes();
    if b.is_empty() || b.len() >= libc::IFNAMSIZ || b.contains(&0) {
        return Err(SockError::BadName(nic.into()));
    }
    let mut out = [0 as libc::c_char; libc::IFNAMSIZ];
    for (o, c) in out.iter_mut().zip(b) {
        *o = *c as libc::c_char;
    }
    Ok(out)
}

fn sockaddr(a: SocketAddrV4) -> libc::sockaddr_in {
    // SAFETY: sockaddr_in is plain old data; all-zero is a valid value.
    let mut sa: libc::sockaddr_in = unsafe { zeroed() };
    sa.sin_family = libc::AF_INET as libc::sa_family_t;
    sa.sin_port = a.port().to_be();
    sa.sin_addr.s_addr = u32::from(*a.ip()).to_be();
    sa
}

fn setsockopt<T>(fd: RawFd, level: libc::c_int, name: libc::c_int, v: &T) -> io::Result<()> {
    // SAFETY: `v` points to a live value of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            v as *const T as *const libc::c_void,
            size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The first `SCM_TIMESTAMPING` stamp in a message's control data: index 0
/// (software) or 2 (raw hardware).
///
/// # Safety
/// `msg` must describe a control buffer filled by the kernel (`msg_control`
/// valid for `msg_controllen` bytes).
unsafe fn timestamp(msg: &libc::msghdr, mode: TsMode) -> Option<i64> {
    let mut c = libc::CMSG_FIRSTHDR(msg);
    while !c.is_null() {
        let h = &*c;
        if h.cmsg_level == libc::SOL_SOCKET
            && h.cmsg_type == SO_TIMESTAMPING
            && h.cmsg_len as usize
                >= libc::CMSG_LEN(3 * size_of::<libc::timespec>() as u32) as usize
        {
            let ts = libc::CMSG_DATA(c) as *const libc::timespec;
            let i = match mode {
                TsMode::Software => 0,
                TsMode::Hardware => 2,
            };
            let t = std::ptr::read_unaligned(ts.add(i));
            if t.tv_sec == 0 && t.tv_nsec == 0 {
                return None;
            }
            return Some(
                t.tv_sec
                    .saturating_mul(1_000_000_000)
                    .saturating_add(t.tv_nsec),
            );
        }
        c = libc::CMSG_NXTHDR(msg, c);
    }
    None
}

/// Buffers for one `recvmmsg` call (heap, reused).
pub struct RecvBufs {
    data: Vec<[u8; BUF]>,
    ctrl: Vec<[u64; CBUF / 8]>,
    addrs: Vec<libc::sockaddr_in>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers inside refer only to this struct's own vectors
// and are rebuilt before every use.
unsafe impl Send for RecvBufs {}

impl Default for RecvBufs {
    fn default() -> Self {
        // SAFETY: these C structs are plain old data; zero is valid.
        let (addr, iov, hdr) = unsafe { (zeroed(), zeroed(), zeroed()) };
        Self {
            data: vec![[0; BUF]; BATCH],
            ctrl: vec![[0; CBUF / 8]; BATCH],
            addrs: vec![addr; BATCH],
            iovs: vec![iov; BATCH],
            hdrs: vec![hdr; BATCH],
        }
    }
}

impl RecvBufs {
    fn prepare(&mut self) {
        for i in 0..BATCH {
            self.iovs[i] = libc::iovec {
                iov_base: self.data[i].as_mut_ptr() as *mut libc::c_void,
                iov_len: BUF,
            };
            let h = &mut self.hdrs[i];
            h.msg_len = 0;
            h.msg_hdr.msg_name = &mut self.addrs[i] as *mut _ as *mut libc::c_void;
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
            h.msg_hdr.msg_iov = &mut self.iovs[i];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = self.ctrl[i].as_mut_ptr() as *mut libc::c_void;
            h.msg_hdr.msg_controllen = CBUF as _;
            h.msg_hdr.msg_flags = 0;
        }
    }
}

impl TsSocket {
    /// Opens the probe socket of `nic` on `addr:port`.
    pub fn open(nic: &str, addr: Ipv4Addr, port: u16, mode: TsMode) -> Result<Self, SockError> {
        let local = SocketAddrV4::new(addr, port);
        let err = |op: &'static str| {
            let source = io::Error::last_os_error();
            SockError::Io {
                nic: nic.into(),
                addr: local,
                op,
                source,
            }
        };
        let name = ifname(nic)?;
        // SAFETY: plain socket(2) call; the fd is owned right below.
        let raw = unsafe {
            libc::socket(
                libc::AF_INET,
                libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if raw < 0 {
            return Err(err("socket"));
        }
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let io_err = |op: &'static str, source: io::Error| SockError::Io {
            nic: nic.into(),
            addr: local,
            op,
            source,
        };
        // SAFETY: the name buffer is valid for IFNAMSIZ bytes.
        let rc = unsafe {
            libc::setsockopt(
                raw,
                libc::SOL_SOCKET,
                libc::SO_BINDTODEVICE,
                name.as_ptr() as *const libc::c_void,
                libc::IFNAMSIZ as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(err("SO_BINDTODEVICE"));
        }
        let flags = match mode {
            TsMode::Software => {
                libc::SOF_TIMESTAMPING_TX_SOFTWARE
                    | libc::SOF_TIMESTAMPING_RX_SOFTWARE
                    | libc::SOF_TIMESTAMPING_SOFTWARE
            }
            TsMode::Hardware => {
                enable_hw_timestamps(raw, nic, name)?;
                libc::SOF_TIMESTAMPING_TX_HARDWARE
                    | libc::SOF_TIMESTAMPING_RX_HARDWARE
                    | libc::SOF_TIMESTAMPING_RAW_HARDWARE
            }
        } as libc::c_int;
        setsockopt(raw, libc::SOL_SOCKET, SO_TIMESTAMPING, &flags)
            .map_err(|e| io_err("SO_TIMESTAMPING", e))?;
        if let Err(e) = setsockopt(raw, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &RCVBUF_BYTES) {
            tracing::debug!(nic, error = %e, "SO_RCVBUFFORCE refused; SO_RCVBUF instead");
            setsockopt(raw, libc::SOL_SOCKET, libc::SO_RCVBUF, &RCVBUF_BYTES)
                .map_err(|e| io_err("SO_RCVBUF", e))?;
        }
        // Don't fragment, and don't learn path MTUs: a probe is 128 bytes.
        // (A DF datagram of an unconnected socket also skips the IP id
        // generator, a shared atomic per packet.)
        setsockopt(
            raw,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            &libc::IP_PMTUDISC_PROBE,
        )
        .map_err(|e| io_err("IP_MTU_DISCOVER", e))?;
        let sa = sockaddr(local);
        // SAFETY: `sa` is a valid sockaddr_in of the size passed.
        let rc = unsafe {
            libc::bind(
                raw,
                &sa as *const _ as *const libc::sockaddr,
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(err("bind"));
        }
        Ok(Self { fd, mode })
    }

    /// Sends `msgs` (each to its own address, in order) in one `sendmmsg`
    /// call; returns how many left (fewer when the socket buffer fills).
    /// At most [`MAX_SEND_BATCH`] are taken.
    pub fn send_batch(&self, msgs: &[(SocketAddrV4, &[u8; PACKET_LEN])]) -> io::Result<usize> {
        let n = msgs.len().min(MAX_SEND_BATCH);
        if n == 0 {
            return Ok(0);
        }
        let mut addrs: Vec<libc::sockaddr_in> =
            msgs[..n].iter().map(|(a, _)| sockaddr(*a)).collect();
        let mut iovs: Vec<libc::iovec> = msgs[..n]
            .iter()
            .map(|(_, b)| libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: PACKET_LEN,
            })
            .collect();
        // SAFETY: plain old data, zero-initialised then filled below.
        let mut hdrs: Vec<libc::mmsghdr> = (0..n).map(|_| unsafe { zeroed() }).collect();
        for ((h, a), v) in hdrs.iter_mut().zip(addrs.iter_mut()).zip(iovs.iter_mut()) {
            h.msg_hdr.msg_name = a as *mut _ as *mut libc::c_void;
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
            h.msg_hdr.msg_iov = v;
            h.msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: every pointer in `hdrs` refers to the vectors above,
        // alive for the call; the kernel only reads the payloads.
        let sent =
            unsafe { libc::sendmmsg(self.fd.as_raw_fd(), hdrs.as_mut_ptr(), n as libc::c_uint, 0) };
        if sent < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                return Ok(0);
            }
            return Err(e);
        }
        Ok(sent as usize)
    }

    fn recv(&self, bufs: &mut RecvBufs, flags: libc::c_int) -> io::Result<usize> {
        bufs.prepare();
        // SAFETY: `prepare` pointed every header at buffers owned by `bufs`,
        // which outlive the call; lengths match the buffers.
        let n = unsafe {
            libc::recvmmsg(
                self.fd.as_raw_fd(),
                bufs.hdrs.as_mut_ptr(),
                BATCH as libc::c_uint,
                flags | libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                return Ok(0);
            }
            return Err(e);
        }
        Ok(n as usize)
    }

    /// Reads up to [`BATCH`] waiting datagrams into `out`; returns how many
    /// were read (0: none waiting).
    pub fn recv_batch(&self, bufs: &mut RecvBufs, out: &mut Vec<Received>) -> io::Result<usize> {
        let n = self.recv(bufs, 0)?;
        for i in 0..n {
            let h = &bufs.hdrs[i];
            let len = h.msg_len as usize;
            let mut data = [0u8; PACKET_LEN];
            let k = len.min(PACKET_LEN);
            data[..k].copy_from_slice(&bufs.data[i][..k]);
            // SAFETY: the kernel filled this header's control buffer.
            let ts_ns = unsafe { timestamp(&h.msg_hdr, self.mode) };
            let a = &bufs.addrs[i];
            out.push(Received {
                from: SocketAddrV4::new(
                    Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                    u16::from_be(a.sin_port),
                ),
                len,
                data,
                ts_ns,
            });
        }
        Ok(n)
    }

    /// Reads up to [`BATCH`] transmit timestamps from the error queue.
    pub fn recv_tx_stamps(&self, bufs: &mut RecvBufs, out: &mut Vec<TxStamp>) -> io::Result<usize> {
        let n = self.recv(bufs, libc::MSG_ERRQUEUE)?;
        for i in 0..n {
            let h = &bufs.hdrs[i];
            let len = (h.msg_len as usize).min(BUF);
            // SAFETY: the kernel filled this header's control buffer.
            let Some(ts_ns) = (unsafe { timestamp(&h.msg_hdr, self.mode) }) else {
                continue;
            };
            let mut tail = [0u8; PACKET_LEN];
            if len >= PACKET_LEN {
                tail.copy_from_slice(&bufs.data[i][len - PACKET_LEN..len]);
            }
            out.push(TxStamp {
                frame_len: len,
                tail,
                ts_ns,
            });
        }
        Ok(n)
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Turns on the NIC's hardware timestamping (all received packets, every
/// transmitted one).
fn enable_hw_timestamps(
    fd: RawFd,
    nic: &str,
    name: [libc::c_char; libc::IFNAMSIZ],
) -> Result<(), SockError> {
    let mut cfg = libc::hwtstamp_config {
        flags: 0,
        tx_type: libc::HWTSTAMP_TX_ON as libc::c_int,
        rx_filter: libc::HWTSTAMP_FILTER_ALL as libc::c_int,
    };
    // SAFETY: ifreq is plain old data; zero is valid.
    let mut req: libc::ifreq = unsafe { zeroed() };
    req.ifr_name = name;
    req.ifr_ifru.ifru_data = &mut cfg as *mut _ as *mut libc::c_char;
    // SAFETY: `req` names the interface and points at `cfg`, both alive
    // for the call.
    let rc = unsafe { libc::ioctl(fd, libc::SIOCSHWTSTAMP as _, &mut req) };
    if rc != 0 {
        return Err(SockError::NoHardwareTimestamps {
            nic: nic.into(),
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// CPU time the calling thread has used (ns, `CLOCK_THREAD_CPUTIME_ID`:
/// user and system, including the kernel work done in its context).
pub fn thread_cpu_ns() -> io::Result<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests;
