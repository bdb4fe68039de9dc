//! Kernel constants of HTB and u32 (linux/pkt_sched.h) and the small
//! helpers that build and read `TcMessage` headers, shared by encoding and
//! parsing.

use netlink_packet_core::Nla;
use netlink_packet_route::tc::{TcAttribute, TcHandle, TcMessage, TcOption};

/// MTU iproute2 assumes for the default burst.
pub(crate) const BURST_MTU: u64 = 1600;
pub(crate) const HTB_VERSION: u32 = 3;
pub(crate) const HTB_RATE2QUANTUM: u32 = 10;
pub(crate) const TC_LINKLAYER_ETHERNET: u8 = 1;
pub(crate) const HTB_KIND: &str = "htb";
pub(crate) const U32_KIND: &str = "u32";
pub(crate) const ETH_P_IP: u16 = 0x0800;
/// Root hash table of a u32 classifier: `800:`.
pub(crate) const U32_ROOT_HT: u32 = 0x800 << 20;

pub(crate) const TCA_HTB_PARMS: u16 = 1;
pub(crate) const TCA_HTB_INIT: u16 = 2;
pub(crate) const TCA_HTB_RATE64: u16 = 6;
pub(crate) const TCA_HTB_CEIL64: u16 = 7;

/// Size of `struct tc_htb_glob`.
pub const TC_HTB_GLOB_LEN: usize = 20;
/// Size of `struct tc_htb_opt`.
pub const TC_HTB_OPT_LEN: usize = 44;
pub(crate) const TC_RATESPEC_LEN: usize = 12;

/// The native-endian u32 at `at` (the caller checked the length).
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_ne_bytes(w)
}

/// The raw nested bytes of a message's `TCA_OPTIONS` (for kinds
/// netlink-packet-route does not know, it holds one `Other` with them).
pub(crate) fn raw_options(msg: &TcMessage) -> Option<Vec<u8>> {
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

pub(crate) fn kind_of(msg: &TcMessage) -> Option<&str> {
    msg.attributes.iter().find_map(|a| match a {
        TcAttribute::Kind(k) => Some(k.as_str()),
        _ => None,
    })
}
/// The handle of u32 node `node` in the root hash table `800:`.
pub(crate) fn u32_handle(node: u32) -> u32 {
    U32_ROOT_HT | (node & 0xfff)
}

pub(crate) fn handle_of(major: u16, minor: u16) -> TcHandle {
    TcHandle { major, minor }
}

pub(crate) fn tc_msg(ifindex: u32, handle: TcHandle, parent: TcHandle, info: u32) -> TcMessage {
    let mut m = TcMessage::with_index(ifindex as i32);
    m.header.handle = handle;
    m.header.parent = parent;
    m.header.info = info;
    m
}

pub(crate) fn filter_info(prio: u16, protocol: u16) -> u32 {
    (u32::from(prio) << 16) | u32::from(protocol.to_be())
}
