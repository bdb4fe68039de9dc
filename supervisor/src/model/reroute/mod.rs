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
//! each confirmed ([`RerouteRecord`]). A new leader computes the same sets
//! and sends what is not confirmed. When the NIC is back up (its hold time
//! passed, not damped) it drops out of the sets: the routes go, which is
//! the failback. A registering agent has removed whatever it installed
//! before (it flushes its routes at start), so registration forgets the
//! confirmed digest. A set an agent refuses is retried at most
//! [`MAX_REROUTE_FAILURES`] times.

use std::net::Ipv4Addr;

use proto::agent::RouteVia;

use crate::model::hosts::{Host, Liveness, Nic, NicState};
use crate::model::intents::{Action, Outcome};
use crate::model::state::ClusterState;

pub(crate) mod record;

pub use record::{RerouteRecord, MAX_REROUTE_FAILURES};

/// Whether a NIC's traffic needs a detour: it was reported and is not
/// usable.
fn detoured(n: &Nic) -> bool {
    matches!(
        n.state,
        NicState::Down | NicState::Flapping | NicState::Recovering
    )
}

fn addr(n: &Nic) -> Option<Ipv4Addr> {
    n.addr.as_deref()?.parse().ok()
}

/// An up NIC of `h` on rail `rail`, with an address.
fn up_on_rail(h: &Host, rail: u32) -> Option<(&Nic, Ipv4Addr)> {
    h.nics
        .values()
        .filter(|n| n.rail == Some(rail) && n.state == NicState::Up)
        .find_map(|n| Some((n, addr(n)?)))
}

/// A detoured NIC's backup, if it is up with an address and a rail.
fn usable_backup<'a>(h: &'a Host, x: &Nic) -> Option<(&'a Nic, Ipv4Addr, u32)> {
    let y = h.nics.get(x.backup.as_deref()?)?;
    (y.state == NicState::Up).then_some(())?;
    Some((y, addr(y)?, y.rail?))
}

/// The detour routes `host` should have now, sorted, one per destination.
pub fn desired(st: &ClusterState, host: &str) -> Vec<RouteVia> {
    let Some(me) = st.hosts.get(host) else {
        return Vec::new();
    };
    let others = || {
        st.hosts
            .values()
            .filter(move |h| h.name != host && h.liveness != Liveness::Down)
    };
    let mut out = Vec::new();
    // Another host's NIC is down: reach its address via its backup.
    for a in others() {
        for x in a.nics.values().filter(|n| detoured(n)) {
            let (Some(dst), Some((_, via, rail))) = (addr(x), usable_backup(a, x)) else {
                continue;
            };
            if let Some((dev, _)) = up_on_rail(me, rail) {
                out.push(RouteVia {
                    dst,
                    via,
                    dev: dev.name.clone(),
                });
            }
        }
    }
    // One of this host's NICs is down: reach the others' addresses on its
    // rail via their addresses on the backup's rail.
    for x in me.nics.values().filter(|n| detoured(n)) {
        let (Some(x_rail), Some((y, _, y_rail))) = (x.rail, usable_backup(me, x)) else {
            continue;
        };
        for b in others() {
            let dst = b
                .nics
                .values()
                .filter(|n| n.rail == Some(x_rail))
                .find_map(addr);
            if let (Some(dst), Some((_, via))) = (dst, up_on_rail(b, y_rail)) {
                out.push(RouteVia {
                    dst,
                    via,
                    dev: y.name.clone(),
                });
            }
        }
    }
    out.sort();
    out.dedup_by(|a, b| a.dst == b.dst);
    out
}

/// A set's digest: 0 for no routes, else FNV-1a of the sorted routes (never
/// 0).
pub fn digest(routes: &[RouteVia]) -> u64 {
    if routes.is_empty() {
        return 0;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
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
    h.max(1)
}

/// Orders the reconciler wants now: every live host whose desired set is
/// not the one its agent confirmed (and has not failed too often).
pub fn wanted_reroute_actions(st: &ClusterState) -> Vec<Action> {
    // The common case, cheaply: no NIC detoured, no agent holding routes.
    let any_detoured = st.hosts.values().any(|h| h.nics.values().any(detoured));
    if !any_detoured && st.reroutes.values().all(|r| r.applied == 0) {
        return Vec::new();
    }
    st.hosts
        .values()
        .filter(|h| h.liveness != Liveness::Down)
        .filter_map(|h| {
            let want = digest(&desired(st, &h.name));
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
        Action::Reroute { host, digest: d } => (digest(&desired(st, host)) != *d)
            .then(|| "the desired detour routes changed".to_string()),
        _ => None,
    }
}

impl ClusterState {
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
