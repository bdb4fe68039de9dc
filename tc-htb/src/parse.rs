//! Reading back what the kernel holds: HTB option bytes, u32 selectors,
//! and the qdisc/class/filter dumps of one interface ([`list`]).

use std::net::Ipv4Addr;

use netlink_packet_core::NlasIterator;
use netlink_packet_route::tc::{
    TcAttribute, TcFilterU32Option, TcHandle, TcMessage, TcOption, TcU32Selector,
};
use netlink_packet_route::RouteNetlinkMessage;

use crate::error::ShapeError;
use crate::model::{
    FlowMatch, Installed, InstalledClass, InstalledFilter, InstalledQdisc, L4Port, QDISC_MAJOR,
};
use crate::netlink::dump;
use crate::stats::stats_of;
use crate::wire::{
    handle_of, kind_of, raw_options, tc_msg, u32_at, HTB_KIND, TCA_HTB_CEIL64, TCA_HTB_INIT,
    TCA_HTB_PARMS, TCA_HTB_RATE64, TC_HTB_GLOB_LEN, TC_HTB_OPT_LEN, U32_KIND,
};

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

/// The match a selector written by [`u32_selector`](crate::u32_selector) encodes (also the
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

pub(crate) fn parse_class(msg: &TcMessage) -> Result<Option<InstalledClass>, String> {
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

pub(crate) fn parse_filter(msg: &TcMessage) -> Option<InstalledFilter> {
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

/// Every filter under our qdisc's parent (`1:`) on `ifindex`, raw.
pub(crate) async fn dump_filters(
    handle: &rtnetlink::Handle,
    ifindex: u32,
) -> Result<Vec<TcMessage>, ShapeError> {
    dump(
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
    .await
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
    let filters = dump_filters(handle, ifindex).await?;
    // Without our qdisc, parent 1: may resolve to nothing; keep only
    // filters whose qdisc is ours.
    if out.qdisc.is_some() || !out.classes.is_empty() {
        out.filters = filters.iter().filter_map(parse_filter).collect();
        out.filters.sort_by_key(|f| (f.prio, f.handle));
    }
    Ok(out)
}
