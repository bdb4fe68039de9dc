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
//! [`apply()`] reconciles the interface towards that picture (idempotent: a
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
//! `TCA_OPTIONS` into a single [`TcOption::Other`](netlink_packet_route::tc::TcOption::Other) holding the raw nested
//! bytes, and emits whatever [`DefaultNla`](netlink_packet_core::DefaultNla)s we put into
//! [`TcAttribute::Options`](netlink_packet_route::tc::TcAttribute::Options) as the nested attributes. So the HTB payloads are
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
//!
//! # Layout
//! - `model`: the shape set asked for ([`Shape`], [`FlowMatch`]) and what a
//!   dump reports ([`Installed`], [`ClassStats`]), with the limits.
//! - `error`: [`ShapeError`].
//! - `validate`: [`validate`], the checks run before anything is sent.
//! - `encode`: the psched clock, HTB option bytes, u32 selectors and the
//!   qdisc/class/filter request bodies.
//! - `wire`: kernel constants and small message helpers shared by encoding
//!   and parsing.
//! - `netlink`: one acknowledged request, one bounded dump.
//! - `parse`: dump parsing ([`list`]).
//! - `stats`: class counters ([`class_stats`]).
//! - `apply`: [`apply()`] and [`clear`], the reconciliation.

mod apply;
mod encode;
mod error;
mod model;
mod netlink;
mod parse;
mod stats;
mod validate;
mod wire;

pub use apply::{apply, clear};
pub use encode::{
    class_message, encode_glob, filter_message, filter_plan, qdisc_message, ratespec, u32_selector,
    HtbClassParams, PschedClock,
};
pub use error::ShapeError;
pub use model::{
    ClassStats, FlowMatch, Installed, InstalledClass, InstalledFilter, InstalledQdisc, L4Port,
    Shape, DEFAULT_MINOR, FILTER_PRIO, MAX_MATCHES_PER_CLASS, MAX_RATE_BPS, MAX_SHAPES,
    MIN_RATE_BPS, QDISC_MAJOR, REQUEST_TIMEOUT, ROOT_MINOR,
};
pub use parse::{
    flow_from_selector, list, parse_class_options, parse_qdisc_options, ParsedHtbClass,
};
pub use stats::class_stats;
pub use validate::validate;
pub use wire::{TC_HTB_GLOB_LEN, TC_HTB_OPT_LEN};

#[cfg(test)]
mod tests;
