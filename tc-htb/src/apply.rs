//! Reconciling an interface towards a shape set ([`apply`]) and removing
//! the shaping ([`clear`]).

use std::collections::BTreeMap;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::tc::{TcAttribute, TcHandle};
use netlink_packet_route::RouteNetlinkMessage;
use tracing::{debug, info, warn};

use crate::encode::{
    class_message, filter_message, filter_plan, qdisc_message, HtbClassParams, PschedClock,
};
use crate::error::ShapeError;
use crate::model::{
    FlowMatch, Installed, InstalledClass, InstalledFilter, Shape, DEFAULT_MINOR, FILTER_PRIO,
    QDISC_MAJOR, ROOT_MINOR,
};
use crate::netlink::send_ack;
use crate::parse::{dump_filters, list};
use crate::validate::validate;
use crate::wire::{filter_info, handle_of, tc_msg, u32_handle, ETH_P_IP, U32_KIND};

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
    Ok(!dump_filters(handle, ifindex).await?.is_empty())
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
