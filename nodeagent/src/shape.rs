//! HTB rate shaping on one network interface, entirely through rtnetlink
//! (no `tc` binary): DESIGN.md flow 4, "contention → reshaping".
//!
//! # What is installed
//!
//! ```text
//! qdisc  1:        htb, default class 1:fffe           (root of the interface)
//! class  1:1       rate = ceil = link                  (link = max(default, every shape's ceil))
//! class  1:<minor> rate/ceil of one Shape               (parent 1:1), one per shape
//! class  1:fffe    rate = ceil = default_rate_bps       (parent 1:1), everything unmatched
//! filter parent 1: prio 10 protocol ip u32, handle 800::<n> → flowid 1:<minor of its shape>
//! ```
//!
//! Each shape carries 1..=[`MAX_MATCHES_PER_CLASS`] flow matches, one u32
//! node each. Nodes are numbered 1, 2, … over the shapes in the order given
//! and, within a shape, over its matches in order; the kernel keeps a hash
//! bucket's nodes sorted by node number and stops at the first terminal
//! hit, so **the first listed match wins**: a job's specific class listed
//! before a catch-all class (a bare destination) takes the job's flows.
//!
//! [`apply`] reconciles the interface towards that picture (idempotent: a
//! second apply of the same set sends no change for filters and leaves the
//! same dump; a different set changes classes in place, rewrites the
//! filters whose match moved, and deletes what is no longer wanted).
//! [`list`] dumps the qdisc, classes and filters back and parses them;
//! [`clear`] deletes the root qdisc, which takes every class and filter with
//! it.
//!
//! # Wire layouts (linux/pkt_sched.h, host byte order unless noted)
//!
//! netlink-packet-route 0.34 has no HTB types: for kind `htb` it parses
//! `TCA_OPTIONS` into a single [`TcOption::Other`] holding the raw nested
//! bytes, and emits whatever [`DefaultNla`]s we put into
//! [`TcAttribute::Options`] as the nested attributes. So the HTB payloads are
//! built and parsed here, byte by byte:
//!
//! - qdisc, `TCA_OPTIONS { TCA_HTB_INIT (2) }` with `struct tc_htb_glob`
//!   (20 bytes): `u32 version` (= 3, the kernel refuses anything else),
//!   `u32 rate2quantum` (10), `u32 defcls` (minor of the default class),
//!   `u32 debug` (0), `u32 direct_pkts` (output only, 0).
//! - class, `TCA_OPTIONS { TCA_HTB_PARMS (1), [TCA_HTB_RATE64 (6)],
//!   [TCA_HTB_CEIL64 (7)] }` with `struct tc_htb_opt` (44 bytes):
//!   `tc_ratespec rate` (12), `tc_ratespec ceil` (12), `u32 buffer`,
//!   `u32 cbuffer`, `u32 quantum`, `u32 level`, `u32 prio`. A `tc_ratespec`
//!   is `u8 cell_log, u8 linklayer, u16 overhead, i16 cell_align, u16 mpu,
//!   u32 rate` (bytes/s). When a rate in bytes/s does not fit a u32 (above
//!   ~34.36 Gbit/s) the ratespec carries `u32::MAX` and the true value goes
//!   in the u64 attribute (the kernel takes the larger of the two, and dumps
//!   the 64-bit attribute only when the rate is ≥ 2^32 bytes/s).
//!   `linklayer` is `TC_LINKLAYER_ETHERNET` (1): the kernel then computes
//!   transmit times itself and needs no rate table (`TCA_HTB_RTAB`/`CTAB`,
//!   which only linklayer-unaware old tools send).
//! - filter, kind `u32` (typed in netlink-packet-route): `TCA_U32_CLASSID`
//!   and `TCA_U32_SEL` = `struct tc_u32_sel` (16 bytes) + `nkeys` ×
//!   `struct tc_u32_key` (16 bytes: `__be32 mask, __be32 val, int off,
//!   int offmask`). The filter message's `tcm_info` is `prio << 16 |
//!   htons(ETH_P_IP)`.
//!
//! # Buffer (burst) in ticks
//!
//! `buffer`/`cbuffer` are the time the class may send at full speed, in
//! psched ticks (the kernel turns them into ns with `<< 6`). We compute them
//! exactly like iproute2's `tc class add … htb` does with no `burst`:
//! burst = rate / hz + mtu (1600 bytes), ticks = burst / rate × 10^6 ×
//! tick_in_usec, with `hz` and `tick_in_usec` from `/proc/net/psched` (on a
//! high-resolution kernel hz = 10^9 and one tick = 64 ns, so the burst is
//! ~1600 bytes and e.g. 50 Mbit/s gives 4000 ticks). The result is floored
//! and saturated to a u32 (it cannot overflow for rates ≥
//! [`MIN_RATE_BPS`]). At very high rates the buffer rounds to a few ticks;
//! the kernel accepts that (it is what `tc` sends) and still paces at the
//! rate, just with a small burst.
//!
//! # Why `u32` and not `flower`
//!
//! The kernels railguard runs on (and this CI's) may lack `cls_flower`
//! (`CONFIG_NET_CLS_FLOWER` is off here) while `cls_u32` is nearly always
//! built in, and netlink-packet-route types u32's selector. The price: the
//! L4 port keys assume a 20-byte IPv4 header (no options), like `tc`'s
//! `match ip dport`/`sport` (the word at offset 20: source port in the high
//! half, destination port in the low half), and the kernel never changes the selector of an
//! existing u32 node (it silently keeps the old keys), so a filter whose
//! match changes is deleted and created again.

use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv4Addr;
use std::time::Duration;

use futures::StreamExt;
use netlink_packet_core::{
    DefaultNla, NetlinkMessage, NetlinkPayload, Nla, NlasIterator, NLM_F_ACK, NLM_F_CREATE,
    NLM_F_DUMP, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST,
};
use netlink_packet_route::tc::{
    TcAttribute, TcFilterU32Option, TcHandle, TcMessage, TcOption, TcStats2, TcU32Key,
    TcU32Selector, TcU32SelectorFlags,
};
use netlink_packet_route::RouteNetlinkMessage;
use tracing::{debug, info, warn};

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
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Messages accepted from one dump (bounded memory).
const MAX_DUMP_MESSAGES: usize = 16_384;

/// MTU iproute2 assumes for the default burst.
const BURST_MTU: u64 = 1600;
const HTB_VERSION: u32 = 3;
const HTB_RATE2QUANTUM: u32 = 10;
const TC_LINKLAYER_ETHERNET: u8 = 1;
const HTB_KIND: &str = "htb";
const U32_KIND: &str = "u32";
const ETH_P_IP: u16 = 0x0800;
/// Root hash table of a u32 classifier: `800:`.
const U32_ROOT_HT: u32 = 0x800 << 20;

const TCA_HTB_PARMS: u16 = 1;
const TCA_HTB_INIT: u16 = 2;
const TCA_HTB_RATE64: u16 = 6;
const TCA_HTB_CEIL64: u16 = 7;

/// Size of `struct tc_htb_glob`.
pub const TC_HTB_GLOB_LEN: usize = 20;
/// Size of `struct tc_htb_opt`.
pub const TC_HTB_OPT_LEN: usize = 44;
const TC_RATESPEC_LEN: usize = 12;

/// An L4 port (the protocol is matched too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum L4Port {
    Tcp(u16),
    Udp(u16),
}

impl L4Port {
    fn proto(self) -> u8 {
        match self {
            L4Port::Tcp(_) => 6,
            L4Port::Udp(_) => 17,
        }
    }
    fn port(self) -> u16 {
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
    fn proto(&self) -> Option<u8> {
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

/// Errors of this module. Validation errors name the bad value; nothing is
/// sent to the kernel when validation fails.
#[derive(Debug, thiserror::Error)]
pub enum ShapeError {
    #[error("{what} {bps} bit/s is out of range ({MIN_RATE_BPS}..={MAX_RATE_BPS} bit/s)")]
    RateOutOfRange { what: String, bps: u64 },
    #[error("class 1:{minor:x}: ceil {ceil_bps} bit/s is below its rate {rate_bps} bit/s")]
    CeilBelowRate {
        minor: u16,
        rate_bps: u64,
        ceil_bps: u64,
    },
    #[error("class minor {minor} (1:{minor:x}) is reserved (0, 1 and {DEFAULT_MINOR} are taken)")]
    ReservedMinor { minor: u16 },
    #[error("class minor {minor} (1:{minor:x}) is used by more than one shape")]
    DuplicateMinor { minor: u16 },
    #[error("match `{flow}` is used more than once")]
    DuplicateMatch { flow: FlowMatch },
    #[error("class 1:{minor:x} has no flow match (it needs 1..={MAX_MATCHES_PER_CLASS})")]
    NoMatches { minor: u16 },
    #[error("class 1:{minor:x} has {count} flow matches, at most {MAX_MATCHES_PER_CLASS}")]
    TooManyMatches { minor: u16, count: usize },
    #[error("class 1:{minor:x}: match `{flow}` gives its source and destination ports different protocols")]
    MixedProtocols { minor: u16, flow: FlowMatch },
    #[error("{count} shapes, at most {MAX_SHAPES} per interface")]
    TooManyShapes { count: usize },
    #[error("{op} on ifindex {ifindex}: kernel said: {source}")]
    Kernel {
        op: String,
        ifindex: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("{op} on ifindex {ifindex}: no answer within {REQUEST_TIMEOUT:?}")]
    Timeout { op: String, ifindex: u32 },
    #[error("{op} on ifindex {ifindex}: {detail}")]
    Protocol {
        op: String,
        ifindex: u32,
        detail: String,
    },
}

impl ShapeError {
    /// The kernel's errno, for a [`ShapeError::Kernel`].
    pub fn errno(&self) -> Option<i32> {
        match self {
            ShapeError::Kernel { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
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

// ---------------------------------------------------------------- validation

fn check_rate(what: impl FnOnce() -> String, bps: u64) -> Result<(), ShapeError> {
    if (MIN_RATE_BPS..=MAX_RATE_BPS).contains(&bps) {
        Ok(())
    } else {
        Err(ShapeError::RateOutOfRange { what: what(), bps })
    }
}

/// Checks a shape set; [`apply`] calls it before sending anything: at most
/// [`MAX_SHAPES`] shapes with distinct, unreserved minors, rates in range
/// and ceil ≥ rate, 1..=[`MAX_MATCHES_PER_CLASS`] matches per shape, no
/// match used twice (in any shape), ports of one match on one protocol.
pub fn validate(shapes: &[Shape], default_rate_bps: u64) -> Result<(), ShapeError> {
    if shapes.len() > MAX_SHAPES {
        return Err(ShapeError::TooManyShapes {
            count: shapes.len(),
        });
    }
    check_rate(|| "default rate".into(), default_rate_bps)?;
    let mut minors = std::collections::BTreeSet::new();
    let mut flows = std::collections::BTreeSet::new();
    for s in shapes {
        let m = s.class_minor;
        if m == 0 || m == ROOT_MINOR || m == DEFAULT_MINOR {
            return Err(ShapeError::ReservedMinor { minor: m });
        }
        if !minors.insert(m) {
            return Err(ShapeError::DuplicateMinor { minor: m });
        }
        check_rate(|| format!("class 1:{m:x} rate"), s.rate_bps)?;
        check_rate(|| format!("class 1:{m:x} ceil"), s.ceil_bps)?;
        if s.ceil_bps < s.rate_bps {
            return Err(ShapeError::CeilBelowRate {
                minor: m,
                rate_bps: s.rate_bps,
                ceil_bps: s.ceil_bps,
            });
        }
        if s.matches.is_empty() {
            return Err(ShapeError::NoMatches { minor: m });
        }
        if s.matches.len() > MAX_MATCHES_PER_CLASS {
            return Err(ShapeError::TooManyMatches {
                minor: m,
                count: s.matches.len(),
            });
        }
        for f in &s.matches {
            if f.src_port.is_some() && f.dst_port.is_some() && f.proto().is_none() {
                return Err(ShapeError::MixedProtocols { minor: m, flow: *f });
            }
            if !flows.insert(*f) {
                return Err(ShapeError::DuplicateMatch { flow: *f });
            }
        }
    }
    Ok(())
}

// ------------------------------------------------------------ psched clock

/// The kernel's packet-scheduler clock, from `/proc/net/psched` (four hex
/// words: ns per µs, ns per tick, 10^6, clock resolution in Hz).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PschedClock {
    t2us: u64,
    us2t: u64,
    clock_res: u64,
    hz: u64,
}

impl Default for PschedClock {
    /// What every high-resolution-timer kernel since 2.6.3x reports:
    /// `000003e8 00000040 000f4240 3b9aca00`.
    fn default() -> Self {
        PschedClock {
            t2us: 1000,
            us2t: 64,
            clock_res: 1_000_000,
            hz: 1_000_000_000,
        }
    }
}

impl PschedClock {
    /// Parses the file's text the way iproute2's `tc_core_init` and
    /// `get_hz` do (including its compatibility hack for a third word of
    /// 10^9).
    pub fn parse(text: &str) -> Option<PschedClock> {
        let w: Vec<u64> = text
            .split_whitespace()
            .take(4)
            .map(|s| u64::from_str_radix(s, 16))
            .collect::<Result<_, _>>()
            .ok()?;
        if w.len() < 3 || w[0] == 0 || w[1] == 0 || w[2] == 0 {
            return None;
        }
        let (mut t2us, us2t, clock_res) = (w[0], w[1], w[2]);
        if clock_res == 1_000_000_000 {
            t2us = us2t;
        }
        let hz = match w.get(3) {
            Some(&d) if clock_res == 1_000_000 && d > 0 => d,
            _ => 1000,
        };
        Some(PschedClock {
            t2us,
            us2t,
            clock_res,
            hz,
        })
    }

    /// This machine's clock (or the default if the file is unreadable).
    pub fn read() -> PschedClock {
        std::fs::read_to_string("/proc/net/psched")
            .ok()
            .and_then(|t| PschedClock::parse(&t))
            .unwrap_or_default()
    }

    /// iproute2's default burst for a rate: rate / hz + mtu, in bytes.
    pub fn default_burst(&self, rate_bytes: u64) -> u64 {
        rate_bytes / self.hz + BURST_MTU
    }

    /// Ticks to send `size` bytes at `rate_bytes` bytes/s (`tc_calc_xmittime`:
    /// 10^6 × size / rate µs × tick_in_usec, tick_in_usec = t2us / us2t ×
    /// clock_res / 10^6), floored, saturated to u32.
    pub fn xmit_ticks(&self, rate_bytes: u64, size: u64) -> u32 {
        let num = size as u128 * self.t2us as u128 * self.clock_res as u128;
        let den = (rate_bytes.max(1) as u128) * self.us2t as u128;
        u32::try_from(num / den).unwrap_or(u32::MAX)
    }
}

// ------------------------------------------------------------- HTB encoding

/// The parameters of one HTB class, in the kernel's units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HtbClassParams {
    pub rate_bytes: u64,
    pub ceil_bytes: u64,
    pub buffer_ticks: u32,
    pub cbuffer_ticks: u32,
    pub quantum: u32,
    pub prio: u32,
}

impl HtbClassParams {
    /// Parameters for rate/ceil in bits/s: default bursts (see the module
    /// doc), quantum = rate / r2q clamped to 1000..=200000 bytes (what the
    /// kernel would pick itself, minus its warning in the log).
    pub fn new(clock: &PschedClock, rate_bps: u64, ceil_bps: u64) -> HtbClassParams {
        let rate_bytes = rate_bps / 8;
        let ceil_bytes = ceil_bps / 8;
        HtbClassParams {
            rate_bytes,
            ceil_bytes,
            buffer_ticks: clock.xmit_ticks(rate_bytes, clock.default_burst(rate_bytes)),
            cbuffer_ticks: clock.xmit_ticks(ceil_bytes, clock.default_burst(ceil_bytes)),
            quantum: (rate_bytes / u64::from(HTB_RATE2QUANTUM)).clamp(1000, 200_000) as u32,
            prio: 0,
        }
    }

    /// `struct tc_htb_opt`, 44 bytes: the ratespecs carry `u32::MAX` when
    /// the rate needs the 64-bit attribute.
    pub fn encode_opt(&self) -> [u8; TC_HTB_OPT_LEN] {
        let mut b = [0u8; TC_HTB_OPT_LEN];
        b[0..12].copy_from_slice(&ratespec(self.rate_bytes));
        b[12..24].copy_from_slice(&ratespec(self.ceil_bytes));
        b[24..28].copy_from_slice(&self.buffer_ticks.to_ne_bytes());
        b[28..32].copy_from_slice(&self.cbuffer_ticks.to_ne_bytes());
        b[32..36].copy_from_slice(&self.quantum.to_ne_bytes());
        // level (36..40) is output only: 0.
        b[40..44].copy_from_slice(&self.prio.to_ne_bytes());
        b
    }

    /// The nested attributes of a class's `TCA_OPTIONS`.
    pub fn options(&self) -> Vec<TcOption> {
        let mut v = vec![TcOption::Other(DefaultNla::new(
            TCA_HTB_PARMS,
            self.encode_opt().to_vec(),
        ))];
        if self.rate_bytes > u64::from(u32::MAX) {
            v.push(TcOption::Other(DefaultNla::new(
                TCA_HTB_RATE64,
                self.rate_bytes.to_ne_bytes().to_vec(),
            )));
        }
        if self.ceil_bytes > u64::from(u32::MAX) {
            v.push(TcOption::Other(DefaultNla::new(
                TCA_HTB_CEIL64,
                self.ceil_bytes.to_ne_bytes().to_vec(),
            )));
        }
        v
    }
}

/// `struct tc_ratespec` for an Ethernet link, no overhead.
fn ratespec(rate_bytes: u64) -> [u8; TC_RATESPEC_LEN] {
    let mut b = [0u8; TC_RATESPEC_LEN];
    b[0] = 0; // cell_log: unused with a linklayer
    b[1] = TC_LINKLAYER_ETHERNET;
    // overhead (2..4) = 0
    // cell_align = -1, as tc sends it; mpu (6..8) = 0.
    b[4..6].copy_from_slice(&(-1i16).to_ne_bytes());
    let r = u32::try_from(rate_bytes).unwrap_or(u32::MAX);
    b[8..12].copy_from_slice(&r.to_ne_bytes());
    b
}

/// `struct tc_htb_glob`, 20 bytes.
pub fn encode_glob(default_minor: u16) -> [u8; TC_HTB_GLOB_LEN] {
    let mut b = [0u8; TC_HTB_GLOB_LEN];
    b[0..4].copy_from_slice(&HTB_VERSION.to_ne_bytes());
    b[4..8].copy_from_slice(&HTB_RATE2QUANTUM.to_ne_bytes());
    b[8..12].copy_from_slice(&u32::from(default_minor).to_ne_bytes());
    b
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_ne_bytes(w)
}

/// A class's options as the kernel dumps them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParsedHtbClass {
    pub rate_bytes: u64,
    pub ceil_bytes: u64,
    pub buffer_ticks: u32,
    pub cbuffer_ticks: u32,
    pub quantum: u32,
    pub level: u32,
    pub prio: u32,
}

/// Parses the nested attributes inside an HTB class's `TCA_OPTIONS`
/// (`TCA_HTB_PARMS`, and `TCA_HTB_RATE64`/`CEIL64` which win over the
/// 32-bit ratespec fields).
pub fn parse_class_options(nested: &[u8]) -> Result<ParsedHtbClass, String> {
    let mut opt: Option<ParsedHtbClass> = None;
    let (mut rate64, mut ceil64) = (None, None);
    for nla in NlasIterator::new(nested) {
        let nla = nla.map_err(|e| format!("bad HTB attribute: {e}"))?;
        let v = nla.value();
        match nla.kind() {
            TCA_HTB_PARMS => {
                if v.len() < TC_HTB_OPT_LEN {
                    return Err(format!(
                        "TCA_HTB_PARMS is {} bytes, want {TC_HTB_OPT_LEN}",
                        v.len()
                    ));
                }
                opt = Some(ParsedHtbClass {
                    rate_bytes: u64::from(u32_at(v, 8)),
                    ceil_bytes: u64::from(u32_at(v, 20)),
                    buffer_ticks: u32_at(v, 24),
                    cbuffer_ticks: u32_at(v, 28),
                    quantum: u32_at(v, 32),
                    level: u32_at(v, 36),
                    prio: u32_at(v, 40),
                });
            }
            TCA_HTB_RATE64 | TCA_HTB_CEIL64 => {
                let w: [u8; 8] = v
                    .get(..8)
                    .and_then(|s| s.try_into().ok())
                    .ok_or_else(|| format!("64-bit HTB rate is {} bytes", v.len()))?;
                let x = u64::from_ne_bytes(w);
                if nla.kind() == TCA_HTB_RATE64 {
                    rate64 = Some(x);
                } else {
                    ceil64 = Some(x);
                }
            }
            _ => {}
        }
    }
    let mut o = opt.ok_or("no TCA_HTB_PARMS")?;
    if let Some(r) = rate64 {
        o.rate_bytes = r;
    }
    if let Some(c) = ceil64 {
        o.ceil_bytes = c;
    }
    Ok(o)
}

/// Parses `tc_htb_glob` inside a qdisc's `TCA_OPTIONS`; returns `defcls`.
pub fn parse_qdisc_options(nested: &[u8]) -> Result<u32, String> {
    for nla in NlasIterator::new(nested) {
        let nla = nla.map_err(|e| format!("bad HTB attribute: {e}"))?;
        if nla.kind() == TCA_HTB_INIT {
            let v = nla.value();
            if v.len() < TC_HTB_GLOB_LEN {
                return Err(format!("TCA_HTB_INIT is {} bytes", v.len()));
            }
            return Ok(u32_at(v, 8));
        }
    }
    Err("no TCA_HTB_INIT".into())
}

/// The raw nested bytes of a message's `TCA_OPTIONS` (for kinds
/// netlink-packet-route does not know, it holds one `Other` with them).
fn raw_options(msg: &TcMessage) -> Option<Vec<u8>> {
    msg.attributes.iter().find_map(|a| match a {
        TcAttribute::Options(opts) => match opts.as_slice() {
            [TcOption::Other(nla)] => {
                let mut v = vec![0u8; nla.value_len()];
                nla.emit_value(&mut v);
                Some(v)
            }
            _ => None,
        },
        _ => None,
    })
}

fn kind_of(msg: &TcMessage) -> Option<&str> {
    msg.attributes.iter().find_map(|a| match a {
        TcAttribute::Kind(k) => Some(k.as_str()),
        _ => None,
    })
}

// ------------------------------------------------------------- u32 encoding

fn key(off: i32, mask: u32, val: u32) -> TcU32Key {
    let mut k = TcU32Key::default();
    k.off = off;
    k.mask = mask;
    k.val = val & mask;
    k
}

/// The u32 selector of a match: IPv4 dst (offset 16), and with a port the
/// protocol byte (offset 9, in the word at 8), the src port (high half of
/// the word at 20, assuming a 20-byte IP header) and the dst port (its low
/// half), one key each. Terminal: a hit classifies. A match is validated
/// first (ports on one protocol).
pub fn u32_selector(m: &FlowMatch) -> TcU32Selector {
    let mut keys = vec![key(16, u32::MAX, u32::from(m.dst))];
    if let Some(proto) = m.proto() {
        keys.push(key(8, 0x00ff_0000, u32::from(proto) << 16));
    }
    if let Some(p) = m.src_port {
        keys.push(key(20, 0xffff_0000, u32::from(p.port()) << 16));
    }
    if let Some(p) = m.dst_port {
        keys.push(key(20, 0x0000_ffff, u32::from(p.port())));
    }
    let mut sel = TcU32Selector::default();
    sel.flags = TcU32SelectorFlags::Terminal;
    sel.nkeys = keys.len() as u8;
    sel.keys = keys;
    sel
}

/// The match a selector written by [`u32_selector`] encodes (also the
/// form `tc` writes, with both ports merged into one key at offset 20);
/// `None` for any other selector.
pub fn flow_from_selector(sel: &TcU32Selector) -> Option<FlowMatch> {
    let (mut dst, mut proto, mut sport, mut dport) = (None, None, None, None);
    for k in &sel.keys {
        if k.offmask != 0 {
            return None;
        }
        match (k.off, k.mask) {
            (16, u32::MAX) => dst = Some(Ipv4Addr::from(k.val)),
            (8, 0x00ff_0000) => proto = Some((k.val >> 16) as u8),
            (20, 0xffff_0000) => sport = Some((k.val >> 16) as u16),
            (20, 0x0000_ffff) => dport = Some(k.val as u16),
            (20, u32::MAX) => {
                sport = Some((k.val >> 16) as u16);
                dport = Some(k.val as u16);
            }
            _ => return None,
        }
    }
    let port = |p: Option<u16>| -> Option<Option<L4Port>> {
        match (proto, p) {
            (_, None) => Some(None),
            (Some(6), Some(p)) => Some(Some(L4Port::Tcp(p))),
            (Some(17), Some(p)) => Some(Some(L4Port::Udp(p))),
            _ => None,
        }
    };
    let (src_port, dst_port) = (port(sport)?, port(dport)?);
    if proto.is_some() && src_port.is_none() && dst_port.is_none() {
        return None; // a protocol-only match is not one of ours
    }
    Some(FlowMatch {
        dst: dst?,
        dst_port,
        src_port,
    })
}

/// The u32 nodes [`apply`] installs for `shapes`: (node number, class
/// minor, match), node numbers from 1 in evaluation order.
pub fn filter_plan(shapes: &[Shape]) -> Vec<(u32, u16, FlowMatch)> {
    shapes
        .iter()
        .flat_map(|s| s.matches.iter().map(move |m| (s.class_minor, *m)))
        .enumerate()
        .map(|(i, (minor, m))| (i as u32 + 1, minor, m))
        .collect()
}

fn u32_handle(node: u32) -> u32 {
    U32_ROOT_HT | (node & 0xfff)
}

// ----------------------------------------------------------------- messages

fn handle_of(major: u16, minor: u16) -> TcHandle {
    TcHandle { major, minor }
}

fn tc_msg(ifindex: u32, handle: TcHandle, parent: TcHandle, info: u32) -> TcMessage {
    let mut m = TcMessage::with_index(ifindex as i32);
    m.header.handle = handle;
    m.header.parent = parent;
    m.header.info = info;
    m
}

fn filter_info(prio: u16, protocol: u16) -> u32 {
    (u32::from(prio) << 16) | u32::from(protocol.to_be())
}

/// `RTM_NEWQDISC` body: root HTB `1:` with the default class.
pub fn qdisc_message(ifindex: u32) -> TcMessage {
    let mut m = tc_msg(ifindex, handle_of(QDISC_MAJOR, 0), TcHandle::ROOT, 0);
    m.attributes.push(TcAttribute::Kind(HTB_KIND.into()));
    m.attributes.push(TcAttribute::Options(vec![TcOption::Other(
        DefaultNla::new(TCA_HTB_INIT, encode_glob(DEFAULT_MINOR).to_vec()),
    )]));
    m
}

/// `RTM_NEWTCLASS` body for `1:<minor>` under `1:<parent_minor>` (0: top).
pub fn class_message(ifindex: u32, minor: u16, parent_minor: u16, p: &HtbClassParams) -> TcMessage {
    let mut m = tc_msg(
        ifindex,
        handle_of(QDISC_MAJOR, minor),
        handle_of(QDISC_MAJOR, parent_minor),
        0,
    );
    m.attributes.push(TcAttribute::Kind(HTB_KIND.into()));
    m.attributes.push(TcAttribute::Options(p.options()));
    m
}

/// `RTM_NEWTFILTER` body: u32 node `800::<node>` steering `flow` to
/// `1:<minor>`.
pub fn filter_message(ifindex: u32, node: u32, minor: u16, flow: &FlowMatch) -> TcMessage {
    let mut m = tc_msg(
        ifindex,
        TcHandle::from(u32_handle(node)),
        handle_of(QDISC_MAJOR, 0),
        filter_info(FILTER_PRIO, ETH_P_IP),
    );
    m.attributes.push(TcAttribute::Kind(U32_KIND.into()));
    m.attributes.push(TcAttribute::Options(vec![
        TcOption::U32(TcFilterU32Option::ClassId(handle_of(QDISC_MAJOR, minor))),
        TcOption::U32(TcFilterU32Option::Selector(u32_selector(flow))),
    ]));
    m
}

// ------------------------------------------------------------------ netlink

async fn send_ack(
    handle: &rtnetlink::Handle,
    ifindex: u32,
    op: String,
    body: RouteNetlinkMessage,
    flags: u16,
) -> Result<(), ShapeError> {
    let mut req = NetlinkMessage::from(body);
    req.header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
    let mut h = handle.clone();
    let mut resp = h.request(req).map_err(|e| ShapeError::Protocol {
        op: op.clone(),
        ifindex,
        detail: e.to_string(),
    })?;
    let wait = async {
        while let Some(msg) = resp.next().await {
            if let NetlinkPayload::Error(e) = msg.payload {
                if e.code.is_some() {
                    return Err(e.to_io());
                }
            }
        }
        Ok(())
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, wait).await {
        Err(_) => Err(ShapeError::Timeout { op, ifindex }),
        Ok(Err(source)) => Err(ShapeError::Kernel {
            op,
            ifindex,
            source,
        }),
        Ok(Ok(())) => {
            debug!(ifindex, %op, "tc request acknowledged");
            Ok(())
        }
    }
}

async fn dump(
    handle: &rtnetlink::Handle,
    ifindex: u32,
    op: &str,
    body: RouteNetlinkMessage,
) -> Result<Vec<TcMessage>, ShapeError> {
    let mut req = NetlinkMessage::from(body);
    req.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    let mut h = handle.clone();
    let proto = |detail: String| ShapeError::Protocol {
        op: op.to_string(),
        ifindex,
        detail,
    };
    let mut resp = h.request(req).map_err(|e| proto(e.to_string()))?;
    let collect = async {
        let mut out = Vec::new();
        while let Some(msg) = resp.next().await {
            match msg.payload {
                NetlinkPayload::InnerMessage(
                    RouteNetlinkMessage::NewQueueDiscipline(m)
                    | RouteNetlinkMessage::NewTrafficClass(m)
                    | RouteNetlinkMessage::NewTrafficFilter(m),
                ) => {
                    if m.header.index == ifindex as i32 {
                        out.push(m);
                    }
                    if out.len() > MAX_DUMP_MESSAGES {
                        return Err(Err(format!("more than {MAX_DUMP_MESSAGES} messages")));
                    }
                }
                NetlinkPayload::Error(e) if e.code.is_some() => return Err(Ok(e.to_io())),
                _ => {}
            }
        }
        Ok(out)
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, collect).await {
        Err(_) => Err(ShapeError::Timeout {
            op: op.to_string(),
            ifindex,
        }),
        Ok(Err(Ok(source))) => Err(ShapeError::Kernel {
            op: op.to_string(),
            ifindex,
            source,
        }),
        Ok(Err(Err(detail))) => Err(proto(detail)),
        Ok(Ok(v)) => Ok(v),
    }
}

fn parse_class(msg: &TcMessage) -> Result<Option<InstalledClass>, String> {
    if msg.header.handle.major != QDISC_MAJOR || kind_of(msg) != Some(HTB_KIND) {
        return Ok(None);
    }
    let nested = raw_options(msg).ok_or("HTB class without options")?;
    let p = parse_class_options(&nested)?;
    let parent = msg.header.parent;
    let parent_minor =
        (parent != TcHandle::ROOT && parent.major == QDISC_MAJOR && parent.minor != 0)
            .then_some(parent.minor);
    let stats = stats_of(msg);
    Ok(Some(InstalledClass {
        minor: msg.header.handle.minor,
        parent_minor,
        rate_bps: p.rate_bytes.saturating_mul(8),
        ceil_bps: p.ceil_bytes.saturating_mul(8),
        buffer_ticks: p.buffer_ticks,
        cbuffer_ticks: p.cbuffer_ticks,
        quantum: p.quantum,
        level: p.level,
        prio: p.prio,
        sent_bytes: stats.bytes,
        sent_packets: u32::try_from(stats.packets).unwrap_or(u32::MAX),
        stats,
    }))
}

/// A class message's counters: `TCA_STATS2` basic and queue when the
/// kernel sent them, else the compatibility `TCA_STATS`.
fn stats_of(msg: &TcMessage) -> ClassStats {
    let mut out = ClassStats::default();
    let mut have2 = false;
    let mut compat = None;
    for a in &msg.attributes {
        match a {
            TcAttribute::Stats2(s) => {
                for s in s {
                    match s {
                        TcStats2::Basic(b) => {
                            have2 = true;
                            out.bytes = b.bytes;
                            out.packets = u64::from(b.packets);
                        }
                        TcStats2::Queue(q) => {
                            have2 = true;
                            out.drops = q.drops;
                            out.overlimits = q.overlimits;
                        }
                        _ => {}
                    }
                }
            }
            TcAttribute::Stats(s) => compat = Some(*s),
            _ => {}
        }
    }
    if let (false, Some(s)) = (have2, compat) {
        out = ClassStats {
            bytes: s.bytes,
            packets: u64::from(s.packets),
            drops: s.drops,
            overlimits: s.overlimits,
        };
    }
    out
}

fn parse_filter(msg: &TcMessage) -> Option<InstalledFilter> {
    let kind = kind_of(msg)?.to_string();
    let handle = u32::from(msg.header.handle);
    let prio = (msg.header.info >> 16) as u16;
    let protocol = u16::from_be(msg.header.info as u16);
    if handle == 0 {
        return None; // the classifier instance itself
    }
    let mut f = InstalledFilter {
        kind,
        prio,
        protocol,
        handle,
        class_minor: None,
        flow: None,
    };
    if f.kind == U32_KIND {
        if handle & 0xfff == 0 {
            return None; // a u32 hash table, not a node
        }
        for a in &msg.attributes {
            if let TcAttribute::Options(opts) = a {
                for o in opts {
                    match o {
                        TcOption::U32(TcFilterU32Option::ClassId(c)) if c.major == QDISC_MAJOR => {
                            f.class_minor = Some(c.minor)
                        }
                        TcOption::U32(TcFilterU32Option::Selector(s)) => {
                            f.flow = flow_from_selector(s)
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    Some(f)
}

/// Dumps what the kernel holds on `ifindex`: the root HTB qdisc `1:` (if
/// that is the root), the classes of `1:` and the filters attached to `1:`,
/// with the HTB class options parsed (64-bit rates included).
pub async fn list(handle: &rtnetlink::Handle, ifindex: u32) -> Result<Installed, ShapeError> {
    let idx = ifindex as i32;
    let qdiscs = dump(
        handle,
        ifindex,
        "dump qdiscs",
        RouteNetlinkMessage::GetQueueDiscipline(TcMessage::with_index(idx)),
    )
    .await?;
    let mut out = Installed::default();
    for q in &qdiscs {
        if q.header.parent == TcHandle::ROOT
            && q.header.handle == handle_of(QDISC_MAJOR, 0)
            && kind_of(q) == Some(HTB_KIND)
        {
            let defcls = raw_options(q)
                .ok_or_else(|| "HTB qdisc without options".to_string())
                .and_then(|n| parse_qdisc_options(&n))
                .map_err(|detail| ShapeError::Protocol {
                    op: "parse qdisc".into(),
                    ifindex,
                    detail,
                })?;
            out.qdisc = Some(InstalledQdisc {
                major: QDISC_MAJOR,
                default_minor: defcls as u16,
            });
        }
    }
    let classes = dump(
        handle,
        ifindex,
        "dump classes",
        RouteNetlinkMessage::GetTrafficClass(TcMessage::with_index(idx)),
    )
    .await?;
    for c in &classes {
        match parse_class(c) {
            Ok(Some(ic)) => out.classes.push(ic),
            Ok(None) => {}
            Err(detail) => {
                return Err(ShapeError::Protocol {
                    op: format!("parse class {}", c.header.handle),
                    ifindex,
                    detail,
                })
            }
        }
    }
    out.classes.sort_by_key(|c| c.minor);
    // A filter dump for a parent that does not exist is empty, not an error.
    let filters = dump(
        handle,
        ifindex,
        "dump filters",
        RouteNetlinkMessage::GetTrafficFilter(tc_msg(
            ifindex,
            TcHandle::UNSPEC,
            handle_of(QDISC_MAJOR, 0),
            0,
        )),
    )
    .await?;
    // Without our qdisc, parent 1: may resolve to nothing; keep only
    // filters whose qdisc is ours.
    if out.qdisc.is_some() || !out.classes.is_empty() {
        out.filters = filters.iter().filter_map(parse_filter).collect();
        out.filters.sort_by_key(|f| (f.prio, f.handle));
    }
    Ok(out)
}

/// The counters of every HTB class of `1:` on `ifindex` (root and default
/// classes included), by minor, from one class dump. Empty when there is
/// no shaping.
pub async fn class_stats(
    handle: &rtnetlink::Handle,
    ifindex: u32,
) -> Result<BTreeMap<u16, ClassStats>, ShapeError> {
    let classes = dump(
        handle,
        ifindex,
        "dump classes",
        RouteNetlinkMessage::GetTrafficClass(TcMessage::with_index(ifindex as i32)),
    )
    .await?;
    Ok(classes
        .iter()
        .filter(|c| c.header.handle.major == QDISC_MAJOR && kind_of(c) == Some(HTB_KIND))
        .map(|c| (c.header.handle.minor, stats_of(c)))
        .collect())
}

/// Installs `shapes` on `ifindex` (see the module doc for the layout):
/// validates first (bad input sends nothing), then reconciles. Applying the
/// same set twice leaves the same state; a different set replaces it.
pub async fn apply(
    handle: &rtnetlink::Handle,
    ifindex: u32,
    shapes: &[Shape],
    default_rate_bps: u64,
) -> Result<(), ShapeError> {
    if let Err(e) = validate(shapes, default_rate_bps) {
        warn!(ifindex, error = %e, "shape set refused; nothing changed");
        return Err(e);
    }
    let clock = PschedClock::read();
    let link_bps = shapes
        .iter()
        .map(|s| s.ceil_bps)
        .chain(std::iter::once(default_rate_bps))
        .max()
        .unwrap_or(default_rate_bps);
    info!(
        ifindex,
        shapes = shapes.len(),
        default_rate_bps,
        link_bps,
        "applying HTB shaping"
    );

    let before = list(handle, ifindex).await?;

    // 1. The root qdisc: keep ours, else replace whatever is the root.
    let ours = before
        .qdisc
        .as_ref()
        .is_some_and(|q| q.default_minor == DEFAULT_MINOR);
    let mut before = before;
    if !ours {
        if before.qdisc.is_some() {
            // HTB cannot change its global options in place: delete first.
            delete_root(handle, ifindex).await?;
        }
        send_ack(
            handle,
            ifindex,
            "create root htb qdisc 1:".into(),
            RouteNetlinkMessage::NewQueueDiscipline(qdisc_message(ifindex)),
            NLM_F_CREATE | NLM_F_REPLACE,
        )
        .await?;
        info!(ifindex, "root HTB qdisc 1: installed");
        before = Installed::default();
    }

    // 2. Classes, created or changed in place (NLM_F_CREATE without EXCL).
    let mut wanted: Vec<(u16, u16, HtbClassParams)> = vec![
        (
            ROOT_MINOR,
            0,
            HtbClassParams::new(&clock, link_bps, link_bps),
        ),
        (
            DEFAULT_MINOR,
            ROOT_MINOR,
            HtbClassParams::new(&clock, default_rate_bps, default_rate_bps),
        ),
    ];
    wanted.extend(shapes.iter().map(|s| {
        (
            s.class_minor,
            ROOT_MINOR,
            HtbClassParams::new(&clock, s.rate_bps, s.ceil_bps),
        )
    }));
    for (minor, parent, p) in &wanted {
        let same = before.class(*minor).is_some_and(|c| {
            c.parent_minor == (*parent != 0).then_some(*parent)
                && c.rate_bps == p.rate_bytes * 8
                && c.ceil_bps == p.ceil_bytes * 8
                && c.buffer_ticks == p.buffer_ticks
                && c.cbuffer_ticks == p.cbuffer_ticks
                && c.quantum == p.quantum
        });
        if same {
            continue;
        }
        send_ack(
            handle,
            ifindex,
            format!("set class 1:{minor:x}"),
            RouteNetlinkMessage::NewTrafficClass(class_message(ifindex, *minor, *parent, p)),
            NLM_F_CREATE,
        )
        .await?;
        debug!(
            ifindex,
            minor,
            parent,
            rate_bytes = p.rate_bytes,
            ceil_bytes = p.ceil_bytes,
            buffer_ticks = p.buffer_ticks,
            "class set"
        );
    }

    // 3. Filters: node n steers the n-th match (over the shapes in order,
    // then each shape's matches in order). u32 never changes the keys of an
    // existing node, so a node whose match differs is deleted and re-made.
    let wanted_nodes: BTreeMap<u32, (u16, FlowMatch)> = filter_plan(shapes)
        .into_iter()
        .map(|(node, minor, flow)| (u32_handle(node), (minor, flow)))
        .collect();
    for f in &before.filters {
        let keep = f.kind == U32_KIND
            && f.prio == FILTER_PRIO
            && f.protocol == ETH_P_IP
            && wanted_nodes.contains_key(&f.handle);
        if !keep {
            delete_filter(handle, ifindex, f).await?;
        }
    }
    for (h, (minor, flow)) in &wanted_nodes {
        let existing = before.filters.iter().find(|f| {
            f.kind == U32_KIND && f.prio == FILTER_PRIO && f.protocol == ETH_P_IP && f.handle == *h
        });
        if let Some(f) = existing {
            if f.flow == Some(*flow) && f.class_minor == Some(*minor) {
                continue;
            }
            delete_filter(handle, ifindex, f).await?;
        }
        send_ack(
            handle,
            ifindex,
            format!("add u32 filter {h:x} for {flow}"),
            RouteNetlinkMessage::NewTrafficFilter(filter_message(ifindex, h & 0xfff, *minor, flow)),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .await?;
        debug!(ifindex, filter = format!("{h:x}"), flow = %flow, minor, "filter set");
    }
    if wanted_nodes.is_empty() {
        // No node left: drop the (empty) classifier instance too.
        let any_tp = filters_present(handle, ifindex).await?;
        if any_tp {
            let m = tc_msg(
                ifindex,
                TcHandle::UNSPEC,
                handle_of(QDISC_MAJOR, 0),
                filter_info(FILTER_PRIO, ETH_P_IP),
            );
            match send_ack(
                handle,
                ifindex,
                "delete empty u32 classifier".into(),
                RouteNetlinkMessage::DelTrafficFilter(m),
                0,
            )
            .await
            {
                Err(e) if e.errno() == Some(libc::ENOENT) => {}
                r => r?,
            }
        }
    }

    // 4. Classes nobody wants any more (no filter points at them now).
    let keep: std::collections::BTreeSet<u16> = wanted.iter().map(|w| w.0).collect();
    let mut stale: Vec<&InstalledClass> = before
        .classes
        .iter()
        .filter(|c| !keep.contains(&c.minor))
        .collect();
    // Leaves first.
    stale.sort_by_key(|c| c.level);
    for c in stale {
        send_ack(
            handle,
            ifindex,
            format!("delete class 1:{:x}", c.minor),
            RouteNetlinkMessage::DelTrafficClass(tc_msg(
                ifindex,
                handle_of(QDISC_MAJOR, c.minor),
                TcHandle::UNSPEC,
                0,
            )),
            0,
        )
        .await?;
        debug!(ifindex, minor = c.minor, "stale class deleted");
    }
    info!(ifindex, shapes = shapes.len(), "HTB shaping applied");
    Ok(())
}

async fn filters_present(handle: &rtnetlink::Handle, ifindex: u32) -> Result<bool, ShapeError> {
    let f = dump(
        handle,
        ifindex,
        "dump filters",
        RouteNetlinkMessage::GetTrafficFilter(tc_msg(
            ifindex,
            TcHandle::UNSPEC,
            handle_of(QDISC_MAJOR, 0),
            0,
        )),
    )
    .await?;
    Ok(!f.is_empty())
}

async fn delete_filter(
    handle: &rtnetlink::Handle,
    ifindex: u32,
    f: &InstalledFilter,
) -> Result<(), ShapeError> {
    let mut m = tc_msg(
        ifindex,
        TcHandle::from(f.handle),
        handle_of(QDISC_MAJOR, 0),
        filter_info(f.prio, f.protocol),
    );
    m.attributes.push(TcAttribute::Kind(f.kind.clone()));
    match send_ack(
        handle,
        ifindex,
        format!("delete filter {:x} prio {}", f.handle, f.prio),
        RouteNetlinkMessage::DelTrafficFilter(m),
        0,
    )
    .await
    {
        Err(e) if e.errno() == Some(libc::ENOENT) => Ok(()),
        r => r,
    }
}

async fn delete_root(handle: &rtnetlink::Handle, ifindex: u32) -> Result<bool, ShapeError> {
    let m = tc_msg(ifindex, handle_of(QDISC_MAJOR, 0), TcHandle::ROOT, 0);
    match send_ack(
        handle,
        ifindex,
        "delete root qdisc 1:".into(),
        RouteNetlinkMessage::DelQueueDiscipline(m),
        0,
    )
    .await
    {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.errno(), Some(libc::ENOENT)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Removes the shaping: deletes the root HTB qdisc `1:` (its classes and
/// filters go with it). `Ok(false)` if there was none. A root qdisc that is
/// not our HTB `1:` is left alone.
pub async fn clear(handle: &rtnetlink::Handle, ifindex: u32) -> Result<bool, ShapeError> {
    let now = list(handle, ifindex).await?;
    if now.qdisc.is_none() {
        if !now.classes.is_empty() {
            warn!(
                ifindex,
                classes = now.classes.len(),
                "classes of 1: without our root qdisc; left alone"
            );
        }
        return Ok(false);
    }
    let removed = delete_root(handle, ifindex).await?;
    info!(ifindex, removed, "HTB shaping cleared");
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::{Emitable, Parseable};

    fn flow(dst: [u8; 4], dport: Option<L4Port>, sport: Option<L4Port>) -> FlowMatch {
        FlowMatch {
            dst: Ipv4Addr::from(dst),
            dst_port: dport,
            src_port: sport,
        }
    }

    fn shape(minor: u16, rate: u64, ceil: u64, dst: [u8; 4], port: Option<L4Port>) -> Shape {
        Shape {
            class_minor: minor,
            rate_bps: rate,
            ceil_bps: ceil,
            matches: vec![flow(dst, port, None)],
        }
    }

    /// Emits a filter message and parses it back as a dump would.
    fn filter_round_trip(f: &TcMessage) -> InstalledFilter {
        let mut buf = vec![0u8; f.buffer_len()];
        f.emit(&mut buf);
        parse_filter(&TcMessage::parse(&buf).unwrap()).unwrap()
    }

    #[test]
    fn psched_parsing_matches_iproute2() {
        let c = PschedClock::parse("000003e8 00000040 000f4240 3b9aca00\n").unwrap();
        assert_eq!(c, PschedClock::default());
        // 50 Mbit/s = 6.25e6 B/s: burst 1600 B = 256 µs = 4000 ticks of 64 ns.
        assert_eq!(c.default_burst(6_250_000), 1600);
        assert_eq!(c.xmit_ticks(6_250_000, 1600), 4000);
        // Old low-resolution kernels: hz from the fallback.
        let old = PschedClock::parse("000003e8 00000400 000f4240 00000064").unwrap();
        assert_eq!(old.hz, 100);
        assert!(PschedClock::parse("garbage").is_none());
        assert!(PschedClock::parse("0 0 0 0").is_none());
        // Saturates instead of wrapping.
        assert_eq!(c.xmit_ticks(1, u64::MAX / 1_000_000), u32::MAX);
    }

    #[test]
    fn tc_htb_opt_bytes_for_a_32_bit_rate() {
        let c = PschedClock::default();
        let p = HtbClassParams::new(&c, 400_000_000, 800_000_000);
        assert_eq!(p.rate_bytes, 50_000_000);
        let b = p.encode_opt();
        assert_eq!(b.len(), 44);
        // rate ratespec: cell_log 0, linklayer ethernet, overhead 0, cell_align -1, mpu 0.
        assert_eq!(&b[0..8], &[0, 1, 0, 0, 0xff, 0xff, 0, 0]);
        assert_eq!(u32_at(&b, 8), 50_000_000);
        assert_eq!(b[13], 1);
        assert_eq!(u32_at(&b, 20), 100_000_000);
        // burst 1600 B at 50e6 B/s = 32 µs = 500 ticks; at 100e6: 250.
        assert_eq!(u32_at(&b, 24), 500);
        assert_eq!(u32_at(&b, 28), 250);
        assert_eq!(u32_at(&b, 32), 200_000); // quantum clamped
        assert_eq!(u32_at(&b, 36), 0);
        assert_eq!(u32_at(&b, 40), 0);
        let opts = p.options();
        assert_eq!(opts.len(), 1, "no 64-bit attributes below 2^32 B/s");
        assert_eq!(opts[0].kind(), TCA_HTB_PARMS);
    }

    #[test]
    fn a_rate_above_u32_bytes_uses_the_64_bit_attributes() {
        let c = PschedClock::default();
        // 40 Gbit/s = 5e9 B/s > u32::MAX; ceil 80 Gbit/s.
        let p = HtbClassParams::new(&c, 40_000_000_000, 80_000_000_000);
        let b = p.encode_opt();
        assert_eq!(u32_at(&b, 8), u32::MAX);
        assert_eq!(u32_at(&b, 20), u32::MAX);
        let opts = p.options();
        assert_eq!(opts.len(), 3);
        let mut raw = vec![0u8; opts.as_slice().buffer_len()];
        opts.as_slice().emit(&mut raw);
        // PARMS nla: 4-byte header + 44.
        assert_eq!(u16::from_ne_bytes([raw[0], raw[1]]), 48);
        assert_eq!(u16::from_ne_bytes([raw[2], raw[3]]), TCA_HTB_PARMS);
        // RATE64: header (len 12, type 6) then the u64.
        assert_eq!(&raw[48..52], &[12, 0, 6, 0]);
        assert_eq!(&raw[52..60], &5_000_000_000u64.to_ne_bytes());
        assert_eq!(&raw[60..64], &[12, 0, 7, 0]);
        assert_eq!(&raw[64..72], &10_000_000_000u64.to_ne_bytes());
        // And it parses back to the 64-bit values.
        let parsed = parse_class_options(&raw).unwrap();
        assert_eq!(parsed.rate_bytes, 5_000_000_000);
        assert_eq!(parsed.ceil_bytes, 10_000_000_000);
        assert_eq!(parsed.buffer_ticks, p.buffer_ticks);
        // 1605 B at 5e9 B/s = 0.321 µs = 5 ticks.
        assert_eq!(parsed.buffer_ticks, 5);
    }

    #[test]
    fn glob_bytes() {
        let g = encode_glob(DEFAULT_MINOR);
        assert_eq!(u32_at(&g, 0), 3);
        assert_eq!(u32_at(&g, 4), 10);
        assert_eq!(u32_at(&g, 8), 0xfffe);
        assert_eq!(&g[12..], &[0; 8]);
        let m = qdisc_message(7);
        let mut buf = vec![0u8; m.buffer_len()];
        m.emit(&mut buf);
        let back = TcMessage::parse(&buf).unwrap();
        assert_eq!(back.header.handle, handle_of(1, 0));
        assert_eq!(back.header.parent, TcHandle::ROOT);
        let n = raw_options(&back).unwrap();
        assert_eq!(parse_qdisc_options(&n).unwrap(), 0xfffe);
    }

    #[test]
    fn a_dumped_class_parses() {
        // A class message as the kernel dumps it: kind, options (PARMS +
        // RATE64), stats2 basic.
        let c = PschedClock::default();
        let p = HtbClassParams::new(&c, 40_000_000_000, 40_000_000_000);
        let m = class_message(3, 0x20, ROOT_MINOR, &p);
        let mut buf = vec![0u8; m.buffer_len()];
        m.emit(&mut buf);
        let back = TcMessage::parse(&buf).unwrap();
        let ic = parse_class(&back).unwrap().unwrap();
        assert_eq!(ic.minor, 0x20);
        assert_eq!(ic.parent_minor, Some(1));
        assert_eq!(ic.rate_bps, 40_000_000_000);
        assert_eq!(ic.ceil_bps, 40_000_000_000);
        assert_eq!(ic.quantum, 200_000);
        // A top-level class reports parent ffff:ffff.
        let mut top = back.clone();
        top.header.parent = TcHandle::ROOT;
        assert_eq!(parse_class(&top).unwrap().unwrap().parent_minor, None);
        // Truncated PARMS is an error, not a panic.
        assert!(parse_class_options(&[8, 0, 1, 0, 0, 0, 0, 0]).is_err());
        assert!(parse_class_options(&[]).is_err());
    }

    #[test]
    fn u32_selector_round_trips() {
        let m = flow([10, 201, 0, 2], Some(L4Port::Tcp(5201)), None);
        let sel = u32_selector(&m);
        assert_eq!(sel.nkeys, 3);
        assert_eq!(sel.keys[0].off, 16);
        assert_eq!(sel.keys[0].val, 0x0ac9_0002);
        assert_eq!(sel.keys[1].val, 6 << 16);
        assert_eq!(sel.keys[2].val, 5201);
        assert_eq!(flow_from_selector(&sel), Some(m));
        let f = filter_message(9, 1, 0x10, &m);
        assert_eq!(u32::from(f.header.handle), 0x8000_0001);
        assert_eq!(f.header.info >> 16, u32::from(FILTER_PRIO));
        let mut buf = vec![0u8; f.buffer_len()];
        f.emit(&mut buf);
        // Key 0 on the wire: mask and value in network order.
        let needle = [0xff, 0xff, 0xff, 0xff, 10, 201, 0, 2, 16, 0, 0, 0];
        assert!(buf.windows(needle.len()).any(|w| w == needle));
        let back = TcMessage::parse(&buf).unwrap();
        let pf = parse_filter(&back).unwrap();
        assert_eq!(pf.flow, Some(m));
        assert_eq!(pf.class_minor, Some(0x10));
        assert_eq!(pf.protocol, ETH_P_IP);
        let plain = FlowMatch::to_addr(Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(flow_from_selector(&u32_selector(&plain)), Some(plain));
    }

    #[test]
    fn a_source_port_is_the_high_half_of_the_word_at_20() {
        let m = flow([10, 201, 0, 2], None, Some(L4Port::Tcp(40000)));
        let sel = u32_selector(&m);
        assert_eq!(sel.nkeys, 3);
        assert_eq!((sel.keys[1].off, sel.keys[1].mask), (8, 0x00ff_0000));
        assert_eq!(sel.keys[1].val, 6 << 16);
        assert_eq!((sel.keys[2].off, sel.keys[2].mask), (20, 0xffff_0000));
        assert_eq!(sel.keys[2].val, 40000 << 16);
        assert_eq!(flow_from_selector(&sel), Some(m));
        let f = filter_message(9, 4, 0x11, &m);
        let mut buf = vec![0u8; f.buffer_len()];
        f.emit(&mut buf);
        // The key on the wire: mask ffff0000, value 40000 << 16 (network
        // order), offset 20.
        let p = 40000u16.to_be_bytes();
        let needle = [0xff, 0xff, 0, 0, p[0], p[1], 0, 0, 20, 0, 0, 0];
        assert!(buf.windows(needle.len()).any(|w| w == needle));
        let pf = filter_round_trip(&f);
        assert_eq!((pf.flow, pf.class_minor), (Some(m), Some(0x11)));
        assert_eq!(pf.handle, 0x8000_0004);

        // Both ports: one protocol key, two port keys.
        let both = flow(
            [10, 0, 0, 1],
            Some(L4Port::Udp(4791)),
            Some(L4Port::Udp(5000)),
        );
        let sel = u32_selector(&both);
        assert_eq!(sel.nkeys, 4);
        assert_eq!(sel.keys[1].val, 17 << 16);
        assert_eq!(
            filter_round_trip(&filter_message(1, 1, 2, &both)).flow,
            Some(both)
        );
        assert_eq!(both.to_string(), "dst 10.0.0.1 udp sport 5000 dport 4791");
        // tc's merged form (one key, mask ffffffff) parses as well.
        let mut merged = u32_selector(&both);
        merged.keys.truncate(2);
        merged.keys.push(key(20, u32::MAX, (5000 << 16) | 4791));
        merged.nkeys = 3;
        assert_eq!(flow_from_selector(&merged), Some(both));
        // Selectors that are not ours: no flow.
        let mut proto_only = u32_selector(&both);
        proto_only.keys.truncate(2);
        proto_only.nkeys = 2;
        assert_eq!(flow_from_selector(&proto_only), None);
        let mut odd = u32_selector(&plain_of(&both));
        odd.keys.push(key(12, u32::MAX, 1));
        assert_eq!(flow_from_selector(&odd), None);
    }

    fn plain_of(f: &FlowMatch) -> FlowMatch {
        FlowMatch::to_addr(f.dst)
    }

    #[test]
    fn a_multi_match_class_gets_one_node_per_match_in_order() {
        let job_a = Shape {
            class_minor: 0x10,
            rate_bps: 120_000_000,
            ceil_bps: 120_000_000,
            matches: vec![
                flow([10, 0, 0, 2], Some(L4Port::Tcp(7000)), None),
                flow([10, 0, 0, 2], None, Some(L4Port::Tcp(7000))),
                flow([10, 0, 0, 3], Some(L4Port::Tcp(7000)), None),
            ],
        };
        let other = Shape {
            class_minor: 0x20,
            rate_bps: 120_000_000,
            ceil_bps: 120_000_000,
            matches: vec![
                FlowMatch::to_addr(Ipv4Addr::new(10, 0, 0, 2)),
                FlowMatch::to_addr(Ipv4Addr::new(10, 0, 0, 3)),
            ],
        };
        let set = [job_a.clone(), other.clone()];
        assert!(validate(&set, 1_000_000_000).is_ok());
        let plan = filter_plan(&set);
        let want: Vec<(u32, u16, FlowMatch)> = vec![
            (1, 0x10, job_a.matches[0]),
            (2, 0x10, job_a.matches[1]),
            (3, 0x10, job_a.matches[2]),
            (4, 0x20, other.matches[0]),
            (5, 0x20, other.matches[1]),
        ];
        assert_eq!(plan, want);
        // Each node's message parses back to its class and match, with a
        // handle that orders it (800::n).
        for (node, minor, m) in plan {
            let pf = filter_round_trip(&filter_message(3, node, minor, &m));
            assert_eq!(pf.handle, U32_ROOT_HT | node);
            assert_eq!((pf.class_minor, pf.flow), (Some(minor), Some(m)));
        }
    }

    #[test]
    fn class_counters_come_from_stats2_or_the_old_stats() {
        let c = PschedClock::default();
        let p = HtbClassParams::new(&c, 8_000_000, 8_000_000);
        let mut m = class_message(3, 0x10, ROOT_MINOR, &p);
        let mut basic = netlink_packet_route::tc::TcStatsBasic::default();
        basic.bytes = 123_456;
        basic.packets = 78;
        let mut queue = netlink_packet_route::tc::TcStatsQueue::default();
        queue.drops = 3;
        queue.overlimits = 9;
        m.attributes.push(TcAttribute::Stats2(vec![
            TcStats2::Basic(basic),
            TcStats2::Queue(queue),
        ]));
        let mut buf = vec![0u8; m.buffer_len()];
        m.emit(&mut buf);
        let back = TcMessage::parse(&buf).unwrap();
        let want = ClassStats {
            bytes: 123_456,
            packets: 78,
            drops: 3,
            overlimits: 9,
        };
        assert_eq!(stats_of(&back), want);
        let ic = parse_class(&back).unwrap().unwrap();
        assert_eq!(
            (ic.stats, ic.sent_bytes, ic.sent_packets),
            (want, 123_456, 78)
        );
        // Only TCA_STATS (old kernels).
        let mut old = class_message(3, 0x10, ROOT_MINOR, &p);
        let mut st = netlink_packet_route::tc::TcStats::default();
        st.bytes = 5;
        st.packets = 1;
        st.drops = 2;
        st.overlimits = 4;
        old.attributes.push(TcAttribute::Stats(st));
        let mut buf = vec![0u8; old.buffer_len()];
        old.emit(&mut buf);
        let back = TcMessage::parse(&buf).unwrap();
        assert_eq!(
            stats_of(&back),
            ClassStats {
                bytes: 5,
                packets: 1,
                drops: 2,
                overlimits: 4
            }
        );
        // None at all: zeros.
        assert_eq!(
            stats_of(&class_message(3, 0x10, ROOT_MINOR, &p)),
            ClassStats::default()
        );
    }

    #[test]
    fn match_lists_are_validated() {
        let mut s = shape(0x10, 8_000, 8_000, [10, 0, 0, 1], None);
        s.matches.clear();
        let e = validate(std::slice::from_ref(&s), 1_000_000).unwrap_err();
        assert!(matches!(e, ShapeError::NoMatches { minor: 0x10 }), "{e}");
        assert!(
            e.to_string().contains("class 1:10 has no flow match"),
            "{e}"
        );
        s.matches = (0..17u16)
            .map(|i| flow([10, 0, 0, 1], Some(L4Port::Tcp(i)), None))
            .collect();
        let e = validate(std::slice::from_ref(&s), 1_000_000).unwrap_err();
        assert!(e.to_string().contains("17 flow matches, at most 16"), "{e}");
        s.matches.truncate(16);
        assert!(validate(std::slice::from_ref(&s), 1_000_000).is_ok());
        // Ports of one match on two protocols.
        s.matches = vec![flow(
            [10, 0, 0, 1],
            Some(L4Port::Tcp(1)),
            Some(L4Port::Udp(2)),
        )];
        let e = validate(std::slice::from_ref(&s), 1_000_000).unwrap_err();
        assert!(
            matches!(e, ShapeError::MixedProtocols { minor: 0x10, .. }),
            "{e}"
        );
        assert!(
            e.to_string()
                .contains("dst 10.0.0.1 udp sport 2 tcp dport 1"),
            "{e}"
        );
        // The same match twice within one class.
        let m = flow([10, 0, 0, 1], None, Some(L4Port::Tcp(9)));
        s.matches = vec![m, m];
        let e = validate(std::slice::from_ref(&s), 1_000_000).unwrap_err();
        assert!(
            e.to_string()
                .contains("dst 10.0.0.1 tcp sport 9` is used more than once"),
            "{e}"
        );
        // A src-port match and a dst-port match on the same number differ.
        s.matches = vec![m, flow([10, 0, 0, 1], Some(L4Port::Tcp(9)), None)];
        assert!(validate(std::slice::from_ref(&s), 1_000_000).is_ok());
    }

    #[test]
    fn validation_names_the_bad_value() {
        let ok = shape(0x10, 400_000_000, 800_000_000, [10, 0, 0, 1], None);
        assert!(validate(std::slice::from_ref(&ok), 1_000_000_000).is_ok());
        let e = validate(std::slice::from_ref(&ok), 0).unwrap_err();
        assert!(e.to_string().contains("default rate 0 bit/s"), "{e}");
        let e = validate(&[shape(0x10, 0, 8_000, [10, 0, 0, 1], None)], 1_000_000).unwrap_err();
        assert!(e.to_string().contains("class 1:10 rate 0 bit/s"), "{e}");
        let e = validate(
            &[shape(0x10, 8_000, 20_000_000_000_000, [10, 0, 0, 1], None)],
            1_000_000,
        )
        .unwrap_err();
        assert!(e.to_string().contains("ceil 20000000000000"), "{e}");
        let e = validate(&[shape(0x10, 9_000, 8_000, [10, 0, 0, 1], None)], 1_000_000).unwrap_err();
        assert!(
            matches!(e, ShapeError::CeilBelowRate { minor: 0x10, .. }),
            "{e}"
        );
        for m in [0, 1, DEFAULT_MINOR] {
            let e =
                validate(&[shape(m, 8_000, 8_000, [10, 0, 0, 1], None)], 1_000_000).unwrap_err();
            assert!(
                matches!(e, ShapeError::ReservedMinor { minor } if minor == m),
                "{e}"
            );
        }
        let e = validate(
            &[
                shape(5, 8_000, 8_000, [10, 0, 0, 1], None),
                shape(5, 8_000, 8_000, [10, 0, 0, 2], None),
            ],
            1_000_000,
        )
        .unwrap_err();
        assert!(e.to_string().contains("minor 5"), "{e}");
        let e = validate(
            &[
                shape(5, 8_000, 8_000, [10, 0, 0, 1], Some(L4Port::Tcp(1))),
                shape(6, 8_000, 8_000, [10, 0, 0, 1], Some(L4Port::Tcp(1))),
            ],
            1_000_000,
        )
        .unwrap_err();
        assert!(e.to_string().contains("dst 10.0.0.1 tcp dport 1"), "{e}");
        let many: Vec<Shape> = (0..65u16)
            .map(|i| shape(i + 2, 8_000, 8_000, [10, 0, 0, i as u8], None))
            .collect();
        let e = validate(&many, 1_000_000).unwrap_err();
        assert!(e.to_string().contains("65 shapes"), "{e}");
        assert!(validate(&many[..64], 1_000_000).is_ok());
    }
}
