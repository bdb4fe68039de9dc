//! The vocabulary of HTB shaping: what is asked for (a [`Shape`] of
//! [`FlowMatch`]es), what a dump reports ([`Installed`]), the class counters
//! ([`ClassStats`]) and the limits every shape set is checked against.

use std::fmt;
use std::net::Ipv4Addr;
use std::time::Duration;

/// Major number of the root HTB qdisc (`1:`).
pub const QDISC_MAJOR: u16 = 1;
/// Minor of the root class `1:1`, parent of every other class.
pub const ROOT_MINOR: u16 = 1;
/// Minor of the default class (`1:fffe`): traffic no filter matches.
pub const DEFAULT_MINOR: u16 = 0xfffe;
/// Priority (`pref`) of the u32 filters.
pub const FILTER_PRIO: u16 = 10;
/// At most this many shapes on one interface.
pub const MAX_SHAPES: usize = 64;
/// At most this many flow matches (u32 nodes) per shape.
pub const MAX_MATCHES_PER_CLASS: usize = 16;
/// Highest rate or ceiling accepted: 10 Tbit/s.
pub const MAX_RATE_BPS: u64 = 10_000_000_000_000;
/// Lowest rate or ceiling accepted: 8 kbit/s (1000 bytes/s; HTB's byte
/// granularity and u32 buffer in ticks need a floor).
pub const MIN_RATE_BPS: u64 = 8_000;

/// Each netlink request (and each dump) must finish within this.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// An L4 port (the protocol is matched too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum L4Port {
    Tcp(u16),
    Udp(u16),
}

impl L4Port {
    pub(crate) fn proto(self) -> u8 {
        match self {
            L4Port::Tcp(_) => 6,
            L4Port::Udp(_) => 17,
        }
    }
    pub(crate) fn port(self) -> u16 {
        match self {
            L4Port::Tcp(p) | L4Port::Udp(p) => p,
        }
    }
}

/// Some flows: IPv4 destination, optionally an L4 destination port and an
/// L4 source port (so a TCP connection can be matched whichever side
/// listened). When both ports are given they must name the same protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowMatch {
    pub dst: Ipv4Addr,
    pub dst_port: Option<L4Port>,
    pub src_port: Option<L4Port>,
}

impl FlowMatch {
    /// All packets to `dst`.
    pub fn to_addr(dst: Ipv4Addr) -> FlowMatch {
        FlowMatch {
            dst,
            dst_port: None,
            src_port: None,
        }
    }

    /// The protocol the ports name (`None`: no port, or two protocols).
    pub(crate) fn proto(&self) -> Option<u8> {
        match (self.src_port, self.dst_port) {
            (None, None) => None,
            (Some(p), None) | (None, Some(p)) => Some(p.proto()),
            (Some(s), Some(d)) => (s.proto() == d.proto()).then_some(s.proto()),
        }
    }
}

impl fmt::Display for FlowMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "dst {}", self.dst)?;
        let name = |p: L4Port| match p {
            L4Port::Tcp(_) => "tcp",
            L4Port::Udp(_) => "udp",
        };
        match (self.src_port, self.dst_port) {
            (None, None) => Ok(()),
            (Some(s), None) => write!(f, " {} sport {}", name(s), s.port()),
            (None, Some(d)) => write!(f, " {} dport {}", name(d), d.port()),
            (Some(s), Some(d)) if s.proto() == d.proto() => {
                write!(f, " {} sport {} dport {}", name(s), s.port(), d.port())
            }
            (Some(s), Some(d)) => write!(
                f,
                " {} sport {} {} dport {}",
                name(s),
                s.port(),
                name(d),
                d.port()
            ),
        }
    }
}

/// One shaped class: flows matching any of `matches` go to class
/// `1:<class_minor>`, guaranteed `rate_bps`, borrowing up to `ceil_bps`.
/// Rates are in bits/s and are rounded down to whole bytes/s on the wire.
/// `matches` holds 1..=[`MAX_MATCHES_PER_CLASS`] entries, tried in order
/// (after every match of the shapes listed before this one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    pub class_minor: u16,
    pub rate_bps: u64,
    pub ceil_bps: u64,
    pub matches: Vec<FlowMatch>,
}

/// A class's counters as the kernel reports them (`TCA_STATS2` basic and
/// queue, else the old `TCA_STATS`). Counters start at zero when the class
/// is created and are not reset when it is changed in place.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// Bytes the class sent.
    pub bytes: u64,
    /// Packets the class sent.
    pub packets: u64,
    /// Packets dropped in the class.
    pub drops: u32,
    /// Times the class was over its rate (packets delayed).
    pub overlimits: u32,
}

/// The root HTB qdisc as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstalledQdisc {
    pub major: u16,
    /// `defcls` of `tc_htb_glob`.
    pub default_minor: u16,
}

/// One HTB class as the kernel reports it (rates in bits/s, from the
/// 64-bit attributes when present).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstalledClass {
    pub minor: u16,
    /// Minor of the parent class; `None` for a top-level class.
    pub parent_minor: Option<u16>,
    pub rate_bps: u64,
    pub ceil_bps: u64,
    pub buffer_ticks: u32,
    pub cbuffer_ticks: u32,
    pub quantum: u32,
    pub level: u32,
    pub prio: u32,
    /// Bytes and packets the class has sent (`TCA_STATS2` basic).
    pub sent_bytes: u64,
    pub sent_packets: u32,
    /// All of the class's counters.
    pub stats: ClassStats,
}

/// One filter node under `1:`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstalledFilter {
    pub kind: String,
    pub prio: u16,
    /// Ethernet protocol (host order), e.g. 0x0800.
    pub protocol: u16,
    /// The filter's handle (for u32: `htid:hash:node`).
    pub handle: u32,
    /// `flowid` minor, when it steers to a class of `1:`.
    pub class_minor: Option<u16>,
    /// The match, when the selector is one this module writes.
    pub flow: Option<FlowMatch>,
}

/// Everything of ours on one interface.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Installed {
    /// The root qdisc if it is HTB with handle `1:`.
    pub qdisc: Option<InstalledQdisc>,
    /// Classes of `1:`, by minor.
    pub classes: Vec<InstalledClass>,
    /// Filter nodes that classify (u32 hash tables and the bare classifier
    /// entries are left out), by handle.
    pub filters: Vec<InstalledFilter>,
}

impl Installed {
    /// No HTB qdisc, class or filter.
    pub fn is_empty(&self) -> bool {
        self.qdisc.is_none() && self.classes.is_empty() && self.filters.is_empty()
    }

    /// The class `1:<minor>`.
    pub fn class(&self, minor: u16) -> Option<&InstalledClass> {
        self.classes.iter().find(|c| c.minor == minor)
    }
}
