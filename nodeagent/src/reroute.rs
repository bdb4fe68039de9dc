//! The host's detour routes: `dst/32 via via dev dev` in the main table,
//! each tagged with railguard's route protocol ([`RTPROT_RAILGUARD`], shown
//! by `ip route` as `proto 91`) so the agent finds exactly its own and
//! never touches another's.
//!
//! The supervisor's `Reroute` order carries the whole desired set (see the
//! supervisor's `model::reroute`): the agent removes its routes that are
//! not in it and installs (replaces) the ones that are, so the same order
//! twice changes nothing and a newer set supersedes an older one. A detour
//! route carries `rto_min` ([`DETOUR_RTO_MIN_MS`]): a connection moved onto
//! it retransmits within milliseconds once the new path works.
//!
//! **The reflex.** The order also carries standby sets: per NIC of this
//! host, the routes of the host's own part should that NIC go down (its
//! peers' addresses on the NIC's rail via their backup-rail addresses).
//! When netlink reports the NIC down the agent adds them at once
//! ([`Rerouter::reflex_down`]), without waiting for the leader, and holds
//! them: every later order's set is installed together with the held
//! standby routes of NICs still down. A held NIC that is up again is let go
//! at the next order (the leader's set then says whether its detours stay,
//! which is the failback held for the hold time).
//!
//! The agent flushes its routes when it starts (whatever a crashed run
//! left; the registration that follows makes the supervisor send the set
//! again) and when it stops cleanly, so nothing stays in the kernel.
//!
//! **Neighbour entries.** A detour only helps once TCP retransmits, and
//! TCP does not retransmit a segment whose first copy is still held by the
//! host (`TCPSpuriousRtxHostQueues`): a segment sent towards an address
//! whose ARP entry was being resolved when the cable went sits in that
//! entry's queue until resolution fails, about 3 s later (found by the
//! PyTorch scenario: steps stalled for 3 s in some runs, 0.2 s in others).
//! So installing a detour for an address deletes the address's neighbour
//! entries on every other NIC, which frees what they hold.
//!
//! **Fabric routes.** The data NICs' connected routes (the kernel's own,
//! `proto kernel scope link`) get `rto_min` too (`[reroute]
//! fabric_rto_min_ms`, [`Rerouter::tune_fabric`]): the retransmission timer
//! of a connection stalled by a pulled cable is armed from the route it
//! was on, so without it the connection waits out the kernel's 200 ms
//! minimum (and its doubling) before trying the detour. The kernel drops
//! the metric when it recreates the route (a NIC set down and up), so the
//! agent applies it again every second; at a clean stop it takes it off.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use futures::TryStreamExt;
use netlink_packet_route::link::LinkAttribute;
use netlink_packet_route::neighbour::{NeighbourAddress, NeighbourAttribute};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteMetric, RouteProtocol,
    RouteScope, RouteType,
};
use proto::agent::{RouteVia, Standby};
use rtnetlink::{Handle, RouteMessageBuilder};

/// The route protocol number railguard's detour routes carry.
pub const RTPROT_RAILGUARD: u8 = 91;

/// `rto_min` of a detour route, in ms (the kernel default is 200).
pub const DETOUR_RTO_MIN_MS: u32 = 10;

/// `RTAX_RTO_MIN`: the kernel uses a route's `rto_min` only when it is
/// locked (`RTAX_LOCK` has this bit), as `ip route ... rto_min` does.
const RTAX_RTO_MIN: u32 = 13;

/// The metrics that give a route `rto_min` `ms`.
fn rto_min_metrics(ms: u32) -> RouteAttribute {
    RouteAttribute::Metrics(vec![
        RouteMetric::Lock(1 << RTAX_RTO_MIN),
        RouteMetric::RtoMin(ms),
    ])
}

/// Why routes could not be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum RerouteError {
    #[error("netlink: {0}")]
    Netlink(#[from] rtnetlink::Error),
    #[error("{failed} of {wanted} detour routes not installed: {first}")]
    Partial {
        failed: usize,
        wanted: usize,
        first: String,
    },
}

/// What one [`Rerouter::apply`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    pub installed: usize,
    pub removed: usize,
    pub kept: usize,
}

/// Installs and removes the host's detour routes over one netlink handle.
/// Calls are serialised (an order, a reflex and a flush never interleave).
pub struct Rerouter {
    handle: Handle,
    one: tokio::sync::Mutex<Local>,
}

/// What the last order said, and the reflexes held since.
#[derive(Debug, Default)]
struct Local {
    /// The last order's set.
    ordered: Vec<RouteVia>,
    /// The last order's standby sets, by NIC.
    standby: BTreeMap<String, Vec<RouteVia>>,
    /// NICs whose standby routes are installed: `true` while still down.
    held: BTreeMap<String, bool>,
}

impl Local {
    /// The set to install: the order's, then the held standby routes for
    /// destinations it does not route (sorted, one per destination).
    fn wanted(&self) -> Vec<RouteVia> {
        let mut out = self.ordered.clone();
        for nic in self.held.keys() {
            for r in self.standby.get(nic).into_iter().flatten() {
                if !out.iter().any(|o| o.dst == r.dst) {
                    out.push(r.clone());
                }
            }
        }
        out.sort();
        out
    }
}

/// One of our routes as found in the kernel.
struct Found {
    msg: RouteMessage,
    dst: Option<Ipv4Addr>,
    via: Option<Ipv4Addr>,
    oif: Option<u32>,
}

impl Rerouter {
    pub fn new(handle: Handle) -> Self {
        Self {
            handle,
            one: tokio::sync::Mutex::new(Local::default()),
        }
    }

    /// Our routes now in the kernel (IPv4, main table, our protocol).
    async fn ours(&self) -> Result<Vec<Found>, rtnetlink::Error> {
        let mut out = Vec::new();
        let req = RouteMessageBuilder::<Ipv4Addr>::new().build();
        let mut routes = self.handle.route().get(req).execute();
        while let Some(m) = routes.try_next().await? {
            if m.header.protocol != RouteProtocol::Other(RTPROT_RAILGUARD) {
                continue;
            }
            let mut f = Found {
                dst: None,
                via: None,
                oif: None,
                msg: m.clone(),
            };
            if m.header.destination_prefix_length == 32 {
                for a in &m.attributes {
                    match a {
                        RouteAttribute::Destination(RouteAddress::Inet(ip)) => f.dst = Some(*ip),
                        RouteAttribute::Gateway(RouteAddress::Inet(ip)) => f.via = Some(*ip),
                        RouteAttribute::Oif(i) => f.oif = Some(*i),
                        _ => {}
                    }
                }
            }
            out.push(f);
        }
        Ok(out)
    }

    async fn link_indexes(&self) -> Result<BTreeMap<String, u32>, rtnetlink::Error> {
        let mut out = BTreeMap::new();
        let mut links = self.handle.link().get().execute();
        while let Some(m) = links.try_next().await? {
            for a in &m.attributes {
                if let LinkAttribute::IfName(n) = a {
                    out.insert(n.clone(), m.header.index);
                }
            }
        }
        Ok(out)
    }

    /// The routes installed now, as the supervisor names them (routes of
    /// ours that name no device this host has are left out).
    pub async fn current(&self) -> Result<Vec<RouteVia>, RerouteError> {
        let names: BTreeMap<u32, String> = self
            .link_indexes()
            .await?
            .into_iter()
            .map(|(n, i)| (i, n))
            .collect();
        let mut out: Vec<RouteVia> = self
            .ours()
            .await?
            .into_iter()
            .filter_map(|f| {
                Some(RouteVia {
                    dst: f.dst?,
                    via: f.via?,
                    dev: names.get(&f.oif?)?.clone(),
                })
            })
            .collect();
        out.sort();
        Ok(out)
    }

    /// Makes our routes exactly `want`. Every route that can be installed
    /// is; an error names how many could not (a device this host lacks, a
    /// next hop the kernel refuses).
    pub async fn apply(&self, want: &[RouteVia]) -> Result<Applied, RerouteError> {
        let _one = self.one.lock().await;
        self.apply_locked(want).await
    }

    /// [`Rerouter::apply`] with the lock held.
    async fn apply_locked(&self, want: &[RouteVia]) -> Result<Applied, RerouteError> {
        let index = self.link_indexes().await?;
        let wanted: Vec<(Ipv4Addr, Ipv4Addr, Option<u32>, &str)> = want
            .iter()
            .map(|r| (r.dst, r.via, index.get(&r.dev).copied(), r.dev.as_str()))
            .collect();
        let mut removed = 0;
        let mut kept = 0;
        let mut have = Vec::new();
        for f in self.ours().await? {
            let same = wanted.iter().any(|(d, v, o, _)| {
                Some(*d) == f.dst && Some(*v) == f.via && *o == f.oif && o.is_some()
            });
            if same {
                kept += 1;
                have.push((f.dst, f.via, f.oif));
            } else {
                self.handle.route().del(f.msg).execute().await?;
                removed += 1;
            }
        }
        let mut installed = 0;
        let mut failed = Vec::new();
        for (dst, via, oif, dev) in &wanted {
            let Some(oif) = oif else {
                failed.push(format!("{dst} via {via}: no NIC {dev} on this host"));
                continue;
            };
            if have.contains(&(Some(*dst), Some(*via), Some(*oif))) {
                continue;
            }
            let mut msg = RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(*dst, 32)
                .gateway(*via)
                .output_interface(*oif)
                .protocol(RouteProtocol::Other(RTPROT_RAILGUARD))
                .build();
            msg.attributes.push(rto_min_metrics(DETOUR_RTO_MIN_MS));
            match self.handle.route().add(msg).replace().execute().await {
                Ok(()) => installed += 1,
                Err(e) => failed.push(format!("{dst} via {via} dev {dev}: {e}")),
            }
        }
        let detoured: Vec<(Ipv4Addr, u32)> = wanted
            .iter()
            .filter_map(|(dst, _, oif, _)| Some((*dst, (*oif)?)))
            .collect();
        if !detoured.is_empty() {
            let released = self.release_neighbours(&detoured).await?;
            if released > 0 {
                tracing::info!(released, "neighbour entries of detoured addresses deleted");
            }
        }
        tracing::info!(
            installed,
            removed,
            kept,
            failed = failed.len(),
            "detour routes applied"
        );
        if let Some(first) = failed.first() {
            return Err(RerouteError::Partial {
                failed: failed.len(),
                wanted: want.len(),
                first: first.clone(),
            });
        }
        Ok(Applied {
            installed,
            removed,
            kept,
        })
    }

    /// Deletes the neighbour entries of each detoured address on every NIC
    /// but its detour's (freeing the packets they queue); returns how many.
    async fn release_neighbours(
        &self,
        detoured: &[(Ipv4Addr, u32)],
    ) -> Result<usize, RerouteError> {
        let mut stale = Vec::new();
        let mut neighbours = self.handle.neighbours().get().execute();
        while let Some(m) = neighbours.try_next().await? {
            let dst = m.attributes.iter().find_map(|a| match a {
                NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => Some(*ip),
                _ => None,
            });
            let held = dst.is_some_and(|d| {
                detoured
                    .iter()
                    .any(|(x, oif)| *x == d && *oif != m.header.ifindex)
            });
            if held {
                stale.push(m);
            }
        }
        let mut n = 0;
        for m in stale {
            // Gone meanwhile is as good as deleted.
            if self.handle.neighbours().del(m).execute().await.is_ok() {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Removes every route of ours and forgets the orders' sets and held
    /// reflexes; returns how many routes went.
    pub async fn flush(&self) -> Result<usize, RerouteError> {
        let mut local = self.one.lock().await;
        *local = Local::default();
        let mut n = 0;
        for f in self.ours().await? {
            self.handle.route().del(f.msg).execute().await?;
            n += 1;
        }
        if n > 0 {
            tracing::info!(removed = n, "detour routes flushed");
        }
        Ok(n)
    }

    /// Gives the connected routes of `nics` (IPv4, main table, the
    /// kernel's) `rto_min` `ms`, or takes it off (`ms` 0). Returns how many
    /// routes changed; routes already right are left alone.
    pub async fn tune_fabric(&self, nics: &[String], ms: u32) -> Result<usize, RerouteError> {
        let _one = self.one.lock().await;
        let index = self.link_indexes().await?;
        let oifs: Vec<u32> = nics.iter().filter_map(|n| index.get(n).copied()).collect();
        let req = RouteMessageBuilder::<Ipv4Addr>::new().build();
        let mut routes = self.handle.route().get(req).execute();
        let mut change = Vec::new();
        while let Some(m) = routes.try_next().await? {
            let connected = m.header.protocol == RouteProtocol::Kernel
                && m.header.scope == RouteScope::Link
                && m.header.kind == RouteType::Unicast
                && m.header.table == RouteHeader::RT_TABLE_MAIN;
            let oif = m.attributes.iter().find_map(|a| match a {
                RouteAttribute::Oif(i) => Some(*i),
                _ => None,
            });
            if !connected || !oif.is_some_and(|o| oifs.contains(&o)) {
                continue;
            }
            let metrics: Vec<&RouteMetric> = m
                .attributes
                .iter()
                .filter_map(|a| match a {
                    RouteAttribute::Metrics(ms) => Some(ms.iter()),
                    _ => None,
                })
                .flatten()
                .collect();
            let value = metrics.iter().find_map(|x| match x {
                RouteMetric::RtoMin(v) => Some(*v),
                _ => None,
            });
            let locked = metrics
                .iter()
                .any(|x| matches!(x, RouteMetric::Lock(l) if l & (1 << RTAX_RTO_MIN) != 0));
            let right = if ms == 0 {
                value.is_none()
            } else {
                locked && value == Some(ms)
            };
            if !right {
                change.push(m);
            }
        }
        let mut n = 0;
        for m in change {
            let mut msg = RouteMessage::default();
            msg.header = m.header.clone();
            msg.attributes = m
                .attributes
                .into_iter()
                .filter(|a| {
                    matches!(
                        a,
                        RouteAttribute::Destination(_)
                            | RouteAttribute::PrefSource(_)
                            | RouteAttribute::Oif(_)
                            | RouteAttribute::Table(_)
                            | RouteAttribute::Priority(_)
                    )
                })
                .collect();
            if ms > 0 {
                msg.attributes.push(rto_min_metrics(ms));
            }
            self.handle.route().add(msg).replace().execute().await?;
            n += 1;
        }
        if n > 0 {
            tracing::info!(routes = n, rto_min_ms = ms, "fabric routes tuned");
        }
        Ok(n)
    }

    /// Executes a `Reroute` order: its set becomes the one installed
    /// (with the held standby routes of NICs still down; held NICs that
    /// are up again are let go), its standby sets the ones the reflex
    /// uses. Returns (ok, detail).
    pub async fn execute(&self, routes: &[RouteVia], standby: &[Standby]) -> (bool, String) {
        let mut local = self.one.lock().await;
        local.ordered = routes.to_vec();
        local.standby = standby
            .iter()
            .map(|s| (s.nic.clone(), s.routes.clone()))
            .collect();
        local.held.retain(|_, down| *down);
        let want = local.wanted();
        match self.apply_locked(&want).await {
            Ok(a) => (
                true,
                format!(
                    "{} detour routes ({} held by the reflex): {} installed, {} removed, {} kept; standby for {} NIC(s)",
                    want.len(),
                    want.len() - routes.len(),
                    a.installed,
                    a.removed,
                    a.kept,
                    standby.len()
                ),
            ),
            Err(e) => (false, e.to_string()),
        }
    }

    /// The reflex: `nic` went down, so its standby routes go in now and
    /// are held while it stays down. `None` when there is nothing to do (no
    /// standby set for it, or already held).
    pub async fn reflex_down(&self, nic: &str) -> Option<Result<Applied, RerouteError>> {
        let mut local = self.one.lock().await;
        if !local.standby.contains_key(nic) {
            return None;
        }
        if local.held.insert(nic.to_owned(), true) == Some(true) {
            return None;
        }
        let want = local.wanted();
        Some(self.apply_locked(&want).await)
    }

    /// `nic` is up again: its held routes stay until the next order says
    /// whether they still belong (the failback waits for the hold time).
    pub async fn link_up(&self, nic: &str) {
        if let Some(down) = self.one.lock().await.held.get_mut(nic) {
            *down = false;
        }
    }
}
