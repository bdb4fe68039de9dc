//! Request bodies: the psched clock (bursts in ticks), `tc_htb_opt` and
//! `tc_htb_glob` bytes, u32 selectors, the filter plan, and the qdisc, class
//! and filter messages.

use netlink_packet_core::DefaultNla;
use netlink_packet_route::tc::{
    TcAttribute, TcFilterU32Option, TcHandle, TcMessage, TcOption, TcU32Key, TcU32Selector,
    TcU32SelectorFlags,
};

use crate::model::{FlowMatch, Shape, DEFAULT_MINOR, FILTER_PRIO, QDISC_MAJOR};
use crate::wire::TC_HTB_GLOB_LEN;
use crate::wire::TC_HTB_OPT_LEN;
use crate::wire::{
    filter_info, handle_of, tc_msg, u32_handle, BURST_MTU, ETH_P_IP, HTB_KIND, HTB_RATE2QUANTUM,
    HTB_VERSION, TCA_HTB_CEIL64, TCA_HTB_INIT, TCA_HTB_PARMS, TCA_HTB_RATE64,
    TC_LINKLAYER_ETHERNET, TC_RATESPEC_LEN, U32_KIND,
};

/// The kernel's packet-scheduler clock, from `/proc/net/psched` (four hex
/// words: ns per µs, ns per tick, 10^6, clock resolution in Hz).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PschedClock {
    t2us: u64,
    us2t: u64,
    clock_res: u64,
    pub(crate) hz: u64,
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

/// `struct tc_ratespec` for an Ethernet link, no overhead (a rate above
/// `u32::MAX` bytes/s is carried as `u32::MAX`: the caller adds the 64-bit
/// attribute).
pub fn ratespec(rate_bytes: u64) -> [u8; TC_RATESPEC_LEN] {
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

pub(crate) fn key(off: i32, mask: u32, val: u32) -> TcU32Key {
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

/// The u32 nodes [`apply`](crate::apply()) installs for `shapes`: (node number, class
/// minor, match), node numbers from 1 in evaluation order.
pub fn filter_plan(shapes: &[Shape]) -> Vec<(u32, u16, FlowMatch)> {
    shapes
        .iter()
        .flat_map(|s| s.matches.iter().map(move |m| (s.class_minor, *m)))
        .enumerate()
        .map(|(i, (minor, m))| (i as u32 + 1, minor, m))
        .collect()
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
