//! Class counters: parsed from a class message, and dumped for every class
//! of `1:` on an interface.

use std::collections::BTreeMap;

use netlink_packet_route::tc::{TcAttribute, TcMessage, TcStats2};
use netlink_packet_route::RouteNetlinkMessage;

use crate::error::ShapeError;
use crate::model::{ClassStats, QDISC_MAJOR};
use crate::netlink::dump;
use crate::wire::{kind_of, HTB_KIND};

/// A class message's counters: `TCA_STATS2` basic and queue when the
/// kernel sent them, else the compatibility `TCA_STATS`.
pub(crate) fn stats_of(msg: &TcMessage) -> ClassStats {
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
