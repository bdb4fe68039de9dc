//! Detour routes: established TCP connections of unmodified programs
//! (gloo, NCCL's socket transport, MPI, iperf3) carry on when a NIC goes
//! down, because its address stays reachable through the host's backup
//! NIC.
//!
//! While host A's NIC `X` is not usable (down, damped or recovering) and
//! its backup `Y` is up, every other host routes `X`'s address via `Y`'s
//! address, through its own NIC on `Y`'s rail; and A routes every other
//! host's address on `X`'s rail via that host's address on `Y`'s rail,
//! through `Y`. A packet keeps its addresses, so the connection's 4-tuple
//! is unchanged; only the path moves to the other rail. (Hosts answer for
//! any of their addresses on any NIC, Linux's default.)
//!
//! The **desired** set of a host is a pure function of the state
//! ([`desired`]); the reconciler orders each agent to make its detour
//! routes exactly that set (`Reroute`, the whole set, so an order is
//! idempotent and a newer one supersedes an older) and records the digest
//! each confirmed ([`RerouteRecord`]). The entry that applies a NIC's
//! change opens the orders it calls for itself
//! ([`ClusterState::open_reroute_orders`], once per entry), so the peers' part commits with
//! the report, one Raft round after the link went, not two; the reconciler
//! opens whatever else the state calls for (a registration, a host Down).
//!
//! **Standby sets: the failed host's part as a reflex.** With the set, an
//! order carries, per NIC of the host, the routes of the host's own part
//! should that NIC go down ([`standby`]). The agent installs them the
//! moment netlink reports the NIC down, before any round trip; the
//! leader's next order (computed with the NIC down) holds the same routes,
//! so it confirms them. Standby sets depend only on the static topology
//! (hosts, NICs, rails, addresses, backups), not on NIC states: a detour
//! through a peer NIC that happens to be down is corrected by that next
//! order. So they change only when a host registers with a different
//! topology, and an order's digest covers them through a digest of that
//! topology ([`Detours`]), which keeps the reconciler's tick linear in the
//! number of NICs. A new leader computes the same sets
//! and sends what is not confirmed. When the NIC is back up (its hold time
//! passed, not damped) it drops out of the sets: the routes go, which is
//! the failback. A registering agent has removed whatever it installed
//! before (it flushes its routes at start), so registration forgets the
//! confirmed digest. A set an agent refuses is retried at most
//! [`MAX_REROUTE_FAILURES`] times.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use proto::agent::{RouteVia, Standby, MAX_REROUTES, MAX_STANDBY_NICS, MAX_STANDBY_ROUTES};

use crate::model::hosts::{Host, Liveness, Nic, NicState};
use crate::model::intents::{Action, Outcome};
use crate::model::state::ClusterState;

pub(crate) mod record;

pub use record::{RerouteRecord, MAX_REROUTE_FAILURES};

/// Whether a NIC's traffic needs a detour: it was reported and is not
/// usable (a Degraded NIC is up but loses packets).
fn detoured(n: &Nic) -> bool {
    matches!(
        n.state,
        NicState::Down | NicState::Flapping | NicState::Recovering | NicState::Degraded
    )
}

fn addr(n: &Nic) -> Option<Ipv4Addr> {
    n.addr.as_deref()?.parse().ok()
}

/// A NIC's address on `rail` of `h`, whatever its state.
fn addr_on_rail(h: &Host, rail: u32) -> Option<Ipv4Addr> {
    h.nics
        .values()
        .filter(|n| n.rail == Some(rail))
        .find_map(addr)
}

/// A detoured NIC's backup, if it is up with an address and a rail.
fn usable_backup<'a>(h: &'a Host, x: &Nic) -> Option<(&'a Nic, Ipv4Addr, u32)> {
    let y = h.nics.get(x.backup.as_deref()?)?;
    (y.state == NicState::Up).then_some(())?;
    Some((y, addr(y)?, y.rail?))
}

/// `x`'s rail and its backup's NIC and rail, whatever their states.
fn rails_of<'a>(h: &'a Host, x: &Nic) -> Option<(u32, &'a Nic, u32)> {
    let y = h.nics.get(x.backup.as_deref()?)?;
    Some((x.rail?, y, y.rail?))
}

/// The detour routes `host` should have now, sorted, one per destination.
pub fn desired(st: &ClusterState, host: &str) -> Vec<RouteVia> {
    Detours::new(st).desired(host)
}

/// The standby sets of `host`: per NIC with a backup, the routes of the
/// host's own part should that NIC go down (its peers' addresses on the
/// NIC's rail via their addresses on the backup's rail, through the
/// backup), whatever the NICs' states now. Sorted by NIC; NICs with no
/// route left out; bounded by the order's limits.
pub fn standby(st: &ClusterState, host: &str) -> Vec<Standby> {
    let Some(me) = st.hosts.get(host) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut total = 0;
    for x in me.nics.values() {
        let Some((x_rail, y, y_rail)) = rails_of(me, x) else {
            continue;
        };
        if x_rail == y_rail {
            continue;
        }
        let mut routes: Vec<RouteVia> = st
            .hosts
            .values()
            .filter(|b| b.name != host)
            .filter_map(|b| {
                Some(RouteVia {
                    dst: addr_on_rail(b, x_rail)?,
                    via: addr_on_rail(b, y_rail)?,
                    dev: y.name.clone(),
                })
            })
            .collect();
        routes.sort();
        routes.dedup_by(|a, b| a.dst == b.dst);
        routes.truncate(MAX_REROUTES);
        if routes.is_empty()
            || out.len() == MAX_STANDBY_NICS
            || total + routes.len() > MAX_STANDBY_ROUTES
        {
            continue;
        }
        total += routes.len();
        out.push(Standby {
            nic: x.name.clone(),
            routes,
        });
    }
    out
}

/// FNV-1a from `h` over the routes.
fn fnv_routes(mut h: u64, routes: &[RouteVia]) -> u64 {
    for r in routes {
        for b in r
            .dst
            .octets()
            .iter()
            .chain(&r.via.octets())
            .chain(r.dev.as_bytes())
            .chain(&[0])
        {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

fn fnv_bytes(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes.iter().chain(&[0]) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The digest of `host`'s `Reroute` order now (see [`Detours::digest`]).
pub fn order_digest(st: &ClusterState, host: &str) -> u64 {
    Detours::new(st).digest(host)
}

/// The detour view of one state, computed once and asked per host: the
/// detoured NICs of live hosts, every live host's addressed NICs (parsed
/// once, not once per pair of hosts), and a digest of the static topology
/// the standby sets derive from.
pub struct Detours<'a> {
    st: &'a ClusterState,
    /// Detoured NICs of hosts not Down whose backup is up: their peers
    /// reach `dst` via `via` on `rail`.
    detoured: Vec<Detour<'a>>,
    /// Hosts not Down, each with its NICs that have a rail and an
    /// address, in name order.
    live: Vec<(&'a str, Vec<RailNic<'a>>)>,
    /// Every host's name and, per NIC: name, rail, address, backup.
    topology: u64,
    /// Per ordered pair of distinct rails: how many hosts have an address
    /// on both.
    pairs: BTreeMap<(u32, u32), usize>,
}

/// A detoured NIC's address, reached through its backup's.
struct Detour<'a> {
    host: &'a str,
    dst: Ipv4Addr,
    via: Ipv4Addr,
    rail: u32,
}

/// A NIC with a rail and an address.
struct RailNic<'a> {
    name: &'a str,
    rail: u32,
    addr: Ipv4Addr,
    up: bool,
}

impl RailNic<'_> {
    /// The first NIC on `rail` with an address (of the up ones only when
    /// `up`): [`addr_on_rail`], and its up-only form, over parsed NICs.
    fn find<'n, 'a>(nics: &'n [RailNic<'a>], rail: u32, up: bool) -> Option<&'n RailNic<'a>> {
        nics.iter().find(|n| n.rail == rail && (n.up || !up))
    }
}

impl<'a> Detours<'a> {
    /// One pass over the hosts.
    pub fn new(st: &'a ClusterState) -> Detours<'a> {
        let mut detours = Vec::new();
        let mut live = Vec::new();
        let mut topology = FNV_OFFSET;
        let mut pairs = BTreeMap::new();
        for h in st.hosts.values() {
            topology = fnv_bytes(topology, h.name.as_bytes());
            let alive = h.liveness != Liveness::Down;
            let mut nics = Vec::new();
            for n in h.nics.values() {
                for part in [
                    n.name.as_bytes(),
                    &n.rail.map_or([0xff; 4], u32::to_be_bytes),
                    n.addr.as_deref().unwrap_or("").as_bytes(),
                    n.backup.as_deref().unwrap_or("").as_bytes(),
                ] {
                    topology = fnv_bytes(topology, part);
                }
                if !alive {
                    continue;
                }
                if let (Some(rail), Some(a)) = (n.rail, addr(n)) {
                    nics.push(RailNic {
                        name: &n.name,
                        rail,
                        addr: a,
                        up: n.state == NicState::Up,
                    });
                }
                if detoured(n) {
                    if let (Some(dst), Some((_, via, rail))) = (addr(n), usable_backup(h, n)) {
                        detours.push(Detour {
                            host: &h.name,
                            dst,
                            via,
                            rail,
                        });
                    }
                }
            }
            if alive {
                live.push((h.name.as_str(), nics));
            }
            for (a, b) in rail_pairs(h) {
                *pairs.entry((a, b)).or_insert(0) += 1;
            }
        }
        Detours {
            st,
            detoured: detours,
            live,
            topology,
            pairs,
        }
    }

    /// The detour routes `host` should have now, sorted, one per
    /// destination.
    pub fn desired(&self, host: &str) -> Vec<RouteVia> {
        let Some(me) = self.st.hosts.get(host) else {
            return Vec::new();
        };
        let mine: Vec<RailNic> = me
            .nics
            .values()
            .filter_map(|n| {
                Some(RailNic {
                    name: &n.name,
                    rail: n.rail?,
                    addr: addr(n)?,
                    up: n.state == NicState::Up,
                })
            })
            .collect();
        let mut out = Vec::new();
        // Another host's NIC is down: reach its address via its backup.
        for d in self.detoured.iter().filter(|d| d.host != host) {
            if let Some(dev) = RailNic::find(&mine, d.rail, true) {
                out.push(RouteVia {
                    dst: d.dst,
                    via: d.via,
                    dev: dev.name.to_owned(),
                });
            }
        }
        // One of this host's NICs is down: reach the others' addresses on
        // its rail via their addresses on the backup's rail.
        for x in me.nics.values().filter(|n| detoured(n)) {
            let (Some(x_rail), Some((y, _, y_rail))) = (x.rail, usable_backup(me, x)) else {
                continue;
            };
            for (_, nics) in self.live.iter().filter(|(name, _)| *name != host) {
                if let (Some(dst), Some(via)) = (
                    RailNic::find(nics, x_rail, false),
                    RailNic::find(nics, y_rail, true),
                ) {
                    out.push(RouteVia {
                        dst: dst.addr,
                        via: via.addr,
                        dev: y.name.clone(),
                    });
                }
            }
        }
        out.sort();
        out.dedup_by(|a, b| a.dst == b.dst);
        out
    }

    /// Whether [`standby`] of `host` has a route: a NIC of it with a
    /// backup, and another host with addresses on both their rails.
    fn has_standby(&self, host: &str) -> bool {
        let Some(me) = self.st.hosts.get(host) else {
            return false;
        };
        let mine = rail_pairs(me);
        me.nics.values().any(|x| {
            let Some((a, _, b)) = rails_of(me, x) else {
                return false;
            };
            if a == b {
                return false;
            }
            let here = usize::from(mine.contains(&(a, b)));
            self.pairs.get(&(a, b)).copied().unwrap_or(0) > here
        })
    }

    /// The digest of `host`'s order: 0 when it has no routes and no standby
    /// set, else a digest of its set and (through the topology) of its
    /// standby sets (never 0).
    pub fn digest(&self, host: &str) -> u64 {
        let routes = self.desired(host);
        if routes.is_empty() && !self.has_standby(host) {
            return 0;
        }
        let h = fnv_bytes(self.topology, host.as_bytes());
        fnv_routes(h, &routes).max(1)
    }
}

/// The ordered pairs of distinct rails `h` has addresses on.
fn rail_pairs(h: &Host) -> Vec<(u32, u32)> {
    let mut rails: Vec<u32> = h
        .nics
        .values()
        .filter(|n| addr(n).is_some())
        .filter_map(|n| n.rail)
        .collect();
    rails.sort_unstable();
    rails.dedup();
    let mut out = Vec::new();
    for a in &rails {
        for b in rails.iter().filter(|b| *b != a) {
            out.push((*a, *b));
        }
    }
    out
}

/// Orders the reconciler wants now: every live host whose desired set is
/// not the one its agent confirmed (and has not failed too often).
pub fn wanted_reroute_actions(st: &ClusterState) -> Vec<Action> {
    let view = Detours::new(st);
    st.hosts
        .values()
        .filter(|h| h.liveness != Liveness::Down)
        .filter_map(|h| {
            let want = view.digest(&h.name);
            let rec = st.reroutes.get(&h.name).cloned().unwrap_or_default();
            let given_up = rec.failed == want && rec.failures >= MAX_REROUTE_FAILURES;
            (rec.applied != want && !given_up).then(|| Action::Reroute {
                host: h.name.clone(),
                digest: want,
            })
        })
        .collect()
}

/// Whether an open reroute order is obsolete (`Some(why)` cancels it).
pub fn reroute_order_obsolete(st: &ClusterState, action: &Action) -> Option<String> {
    match action {
        Action::Reroute { host, digest: d } => {
            (order_digest(st, host) != *d).then(|| "the desired detour routes changed".to_string())
        }
        _ => None,
    }
}

impl ClusterState {
    /// Opens the reroute orders the state calls for now (an open one for
    /// the same set is kept). The entry that changes a NIC's state calls it
    /// once, after its last command, so the orders commit with the change
    /// itself instead of a reconciler round later: the leader sends them as
    /// soon as the entry is applied.
    pub(crate) fn open_reroute_orders(&mut self, at_ms: u64) {
        for action in wanted_reroute_actions(self) {
            self.open_intent(at_ms, &action);
        }
    }

    /// A closed reroute order's effect.
    pub(crate) fn reroute_order_closed(&mut self, action: &Action, outcome: &Outcome) {
        let Action::Reroute { host, digest } = action else {
            return;
        };
        let rec = self.reroutes.entry(host.clone()).or_default();
        match outcome {
            Outcome::Done => {
                rec.applied = *digest;
                if rec.failed == *digest {
                    rec.failures = 0;
                }
            }
            Outcome::Failed { .. } => {
                if rec.failed == *digest {
                    rec.failures = rec.failures.saturating_add(1);
                } else {
                    rec.failed = *digest;
                    rec.failures = 1;
                }
            }
            Outcome::Cancelled { .. } => {}
        }
        if *rec == RerouteRecord::default() {
            self.reroutes.remove(host);
        }
    }
}
