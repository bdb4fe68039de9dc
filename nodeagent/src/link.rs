//! `LinkTracker`: NIC health from netlink link messages.
//!
//! A multicast netlink connection (`RTNLGRP_LINK`) delivers every link
//! change; the tracker starts from a dump so it knows each NIC's state
//! before the first change. A NIC is *up* when it is admin up and its
//! operational state is up, so both an admin-down NIC and a carrier loss at
//! the far end (the fabric-side cable) count as down.
//!
//! The kernel's carrier up/down counters are compared with what was seen:
//! if a flap was shorter than the time it took to handle the previous
//! message (or a message was lost to a full socket buffer), the missing
//! down/up pairs are synthesised, so every flap is counted.
//!
//! Per-NIC state (with the [`FlapDamper`]): down and not suppressed → Down;
//! down and suppressed → Flapping; up and suppressed → Recovering; up and
//! reusable → Up. A NIC back up after being down is also Recovering for
//! its hold time ([`NicTracker::with_hold`], `[reroute] failback_hold_ms`):
//! its connections and detour routes fail back only once it has stayed up
//! that long. [`NicTracker::tick`] moves Recovering to Up once the damper
//! and the hold allow it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use netlink_packet_core::NetlinkPayload;
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage, State};
use netlink_packet_route::RouteNetlinkMessage;
use tokio::sync::mpsc;

use crate::damper::{DampingConfig, FlapDamper};

/// NIC health as the agent classifies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum NicHealth {
    Up,
    Down,
    Flapping,
    Recovering,
    /// Up, but losing or holding back packets by the probe mesh's evidence (a gray link).
    Degraded,
}

impl From<NicHealth> for proto::agent::NicHealth {
    fn from(h: NicHealth) -> Self {
        match h {
            NicHealth::Up => proto::agent::NicHealth::Up,
            NicHealth::Down => proto::agent::NicHealth::Down,
            NicHealth::Flapping => proto::agent::NicHealth::Flapping,
            NicHealth::Recovering => proto::agent::NicHealth::Recovering,
            NicHealth::Degraded => proto::agent::NicHealth::Degraded,
        }
    }
}

impl NicHealth {
    /// Whether traffic may use the NIC.
    pub fn usable(self) -> bool {
        self == NicHealth::Up
    }
}

/// One netlink observation of a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkSample {
    pub name: String,
    pub index: u32,
    pub admin_up: bool,
    pub oper_up: bool,
    pub carrier_changes: u32,
    pub carrier_up_count: u32,
    pub carrier_down_count: u32,
}

impl LinkSample {
    /// Extracts a sample from a link message (None without a name).
    pub fn from_message(m: &LinkMessage) -> Option<LinkSample> {
        let mut s = LinkSample {
            name: String::new(),
            index: m.header.index,
            admin_up: m.header.flags.contains(LinkFlags::Up),
            oper_up: false,
            carrier_changes: 0,
            carrier_up_count: 0,
            carrier_down_count: 0,
        };
        // Drivers that do not track the operational state (`lo`, some
        // virtual devices) report `unknown`: the carrier flag decides then
        // (RFC 2863; what `ip link` shows as LOWER_UP).
        let lower_up = m.header.flags.contains(LinkFlags::LowerUp);
        for a in &m.attributes {
            match a {
                LinkAttribute::IfName(n) => s.name = n.clone(),
                LinkAttribute::OperState(st) => {
                    s.oper_up = *st == State::Up || (*st == State::Unknown && lower_up)
                }
                LinkAttribute::CarrierChanges(c) => s.carrier_changes = *c,
                LinkAttribute::CarrierUpCount(c) => s.carrier_up_count = *c,
                LinkAttribute::CarrierDownCount(c) => s.carrier_down_count = *c,
                _ => {}
            }
        }
        (!s.name.is_empty()).then_some(s)
    }

    /// Up = admin up and operationally up.
    pub fn is_up(&self) -> bool {
        self.admin_up && self.oper_up
    }
}

/// A change of a NIC, reported to the supervisor and to local transports.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkTransition {
    pub nic: String,
    /// The link itself is up (independent of damping).
    pub link_up: bool,
    /// Down only because probes stopped crossing it (netdev and port up).
    pub probes_lost: bool,
    pub health: NicHealth,
    pub carrier_changes: u64,
    pub flaps: u32,
    pub penalty: f64,
    /// When the agent saw it (monotonic) and wall-clock ns for the record.
    pub observed_at: Instant,
    pub observed_unix_ns: u64,
    /// Inferred from the kernel's counters rather than seen directly.
    pub synthesized: bool,
}

/// Wall-clock nanoseconds since the Unix epoch.
pub fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The tracking state of one NIC.
#[derive(Debug, Clone)]
pub struct NicTracker {
    pub name: String,
    damper: FlapDamper,
    link_up: Option<bool>,
    /// RDMA port state (true when no RDMA device backs this NIC).
    port_active: bool,
    /// Probe evidence (true until the probe mesh finds the NIC silent).
    probes_alive: bool,
    /// The probe mesh finds the NIC losing packets (a gray link).
    lossy: bool,
    /// The probe mesh finds the NIC holding packets back unevenly (a gray
    /// link that delays).
    delayed: bool,
    /// The last netdev sample's up state, kept to combine with port events.
    netdev_up: Option<bool>,
    /// Since when the netdev is up (None: down or not seen yet).
    up_since: Option<Instant>,
    down_count: u32,
    carrier_changes: u64,
    health: Option<NicHealth>,
    /// How long a NIC back up stays Recovering before it is Up.
    hold: std::time::Duration,
    /// When the link last came back up after being down.
    back_at: Option<Instant>,
}

impl NicTracker {
    pub fn new(name: &str, damping: DampingConfig) -> Self {
        Self {
            name: name.into(),
            damper: FlapDamper::new(damping),
            link_up: None,
            port_active: true,
            probes_alive: true,
            lossy: false,
            delayed: false,
            netdev_up: None,
            up_since: None,
            down_count: 0,
            carrier_changes: 0,
            health: None,
            hold: std::time::Duration::ZERO,
            back_at: None,
        }
    }

    /// A NIC back up after being down stays Recovering for `hold`.
    pub fn with_hold(mut self, hold: std::time::Duration) -> Self {
        self.hold = hold;
        self
    }

    /// Current classification (None before the first sample).
    pub fn health(&self) -> Option<NicHealth> {
        self.health
    }

    fn classify(&mut self, link_up: bool, now: Instant) -> NicHealth {
        let held = self
            .back_at
            .is_some_and(|t| now.saturating_duration_since(t) < self.hold);
        match (link_up, self.damper.is_suppressed(now)) {
            (false, false) => NicHealth::Down,
            (false, true) => NicHealth::Flapping,
            (true, true) => NicHealth::Recovering,
            (true, false) if held => NicHealth::Recovering,
            (true, false) if self.lossy || self.delayed => NicHealth::Degraded,
            (true, false) => NicHealth::Up,
        }
    }

    fn transition(&mut self, link_up: bool, now: Instant, synthesized: bool) -> LinkTransition {
        if self.link_up == Some(true) && !link_up {
            self.damper.record_flap(now);
        }
        if self.link_up == Some(false) && link_up {
            self.back_at = Some(now);
        }
        self.link_up = Some(link_up);
        let health = self.classify(link_up, now);
        self.health = Some(health);
        self.report(link_up, health, now, synthesized)
    }

    fn report(
        &self,
        link_up: bool,
        health: NicHealth,
        now: Instant,
        synthesized: bool,
    ) -> LinkTransition {
        LinkTransition {
            nic: self.name.clone(),
            link_up,
            probes_lost: !link_up
                && self.netdev_up == Some(true)
                && self.port_active
                && !self.probes_alive,
            health,
            carrier_changes: self.carrier_changes,
            flaps: self.damper.flaps(),
            penalty: self.damper.penalty(now),
            observed_at: now,
            observed_unix_ns: unix_ns(),
            synthesized,
        }
    }

    /// Since when netlink has the NIC up (None while it is down).
    pub fn up_since(&self) -> Option<Instant> {
        self.up_since
    }

    /// Feeds one sample; returns the transitions it implies, in order.
    pub fn observe(&mut self, s: &LinkSample, now: Instant) -> Vec<LinkTransition> {
        let prev_netdev = self.netdev_up.replace(s.is_up());
        // A carrier drop the kernel counted between two up samples: an
        // outage netlink showed only as a count (down and up again between
        // two messages). The NIC came back: a new up period as well.
        let unseen_outage = s.is_up()
            && prev_netdev == Some(true)
            && self.link_up.is_some()
            && s.carrier_down_count != self.down_count;
        if !s.is_up() {
            self.up_since = None;
        } else if prev_netdev != Some(true) || unseen_outage {
            self.up_since = Some(now);
            if prev_netdev == Some(false) || unseen_outage {
                // The probe mesh's verdict is from before the outage: the
                // NIC is judged afresh from now (`NetdevEpochs`).
                self.probes_alive = true;
                self.lossy = false;
                self.delayed = false;
            }
        }
        let other_evidence_up = self.port_active && self.probes_alive;
        let up = s.is_up() && other_evidence_up;
        let mut out = Vec::new();
        self.carrier_changes = s.carrier_changes as u64;
        let Some(prev) = self.link_up else {
            self.down_count = s.carrier_down_count;
            out.push(self.transition(up, now, false));
            return out;
        };
        // Carrier drops the kernel counted that we did not see as a down.
        let drops = s.carrier_down_count.wrapping_sub(self.down_count);
        self.down_count = s.carrier_down_count;
        let seen_drop = u32::from(prev_netdev == Some(true) && !s.is_up());
        // While the port or the probes hold the NIC down, carrier cycles
        // change nothing the cluster could have used.
        let missed = if other_evidence_up {
            drops.saturating_sub(seen_drop).min(1_000)
        } else {
            0
        };
        // Each missed drop is a full cycle away from `prev` and back.
        for _ in 0..missed {
            out.push(self.transition(!prev, now, true));
            out.push(self.transition(prev, now, true));
        }
        if prev != up {
            out.push(self.transition(up, now, false));
        }
        out
    }

    /// Feeds evidence other than netlink (an RDMA port event or the probe
    /// mesh's verdict); the NIC is up only when its netdev, its port and
    /// its probes all are. Loss and delay evidence leave the link up and
    /// make an up NIC Degraded (Up again once neither holds).
    pub fn observe_port(
        &mut self,
        source: Evidence,
        active: bool,
        now: Instant,
    ) -> Option<LinkTransition> {
        match source {
            Evidence::RdmaPort => self.port_active = active,
            Evidence::Probes => self.probes_alive = active,
            Evidence::Loss => {
                self.lossy = !active;
                return self.tick(now);
            }
            Evidence::Delay => {
                self.delayed = !active;
                return self.tick(now);
            }
        }
        let netdev_up = self.netdev_up?;
        let up = netdev_up && self.port_active && self.probes_alive;
        (self.link_up != Some(up)).then(|| self.transition(up, now, false))
    }

    /// Feeds a [`PortEvent`]: as [`Self::observe_port`], except that probe
    /// evidence judged in another up period than the NIC's current one (a
    /// verdict from before a bounce, queued while the tracker was busy) is
    /// dropped: the NIC is judged afresh after each bounce.
    pub fn observe_event(&mut self, e: &PortEvent, now: Instant) -> Option<LinkTransition> {
        if let Period::UpSince(judged) = e.period {
            if judged != self.up_since {
                tracing::debug!(nic = %self.name, source = ?e.source, active = e.active, "evidence from an earlier up period dropped");
                return None;
            }
        }
        self.observe_port(e.source, e.active, now)
    }

    /// Re-evaluates damping without a link change (Recovering → Up,
    /// Flapping → Down once the penalty has decayed).
    pub fn tick(&mut self, now: Instant) -> Option<LinkTransition> {
        let link_up = self.link_up?;
        let health = self.classify(link_up, now);
        if Some(health) == self.health {
            return None;
        }
        self.health = Some(health);
        Some(self.report(link_up, health, now, false))
    }
}

/// An RDMA port event for the netdev it is bound to: the seam through which
/// the `rdma` crate's async event stream (port active/error, device fatal)
/// feeds the same tracker as netlink. A port that is not active makes its
/// NIC down even while netlink says the netdev is up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortEvent {
    pub netdev: String,
    pub active: bool,
    pub source: Evidence,
    pub period: Period,
}

/// Which up period of its NIC a [`PortEvent`] speaks of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    /// Whatever it is now (an RDMA port's own state).
    Current,
    /// The one that began at this instant: netlink's up time the probe
    /// mesh judged under ([`NetdevEpochs`]); None, while the NIC was down.
    /// A verdict reached before a bounce and taken after it is stale.
    UpSince(Option<Instant>),
}

/// Where a [`PortEvent`] comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evidence {
    /// The RDMA device's port state (async events).
    RdmaPort,
    /// The probe mesh: probes stopped (or resumed) arriving on the NIC.
    Probes,
    /// The probe mesh: the NIC loses a share of its probes (`active`
    /// false) or no longer does. The link stays up; the NIC is Degraded.
    Loss,
    /// The probe mesh: the NIC delays its probes unevenly (`active`
    /// false) or no longer does. The link stays up; the NIC is Degraded.
    Delay,
}

/// Errors starting the tracker.
#[derive(Debug, thiserror::Error)]
pub enum TrackerError {
    /// The netlink socket could not be opened or read.
    #[error("netlink: {0}")]
    Netlink(String),
    /// A configured NIC is not in this network namespace.
    #[error("NIC {0:?} does not exist in this network namespace")]
    NoSuchNic(String),
}

/// Watches the given NICs and sends every transition on `tx` (bounded; the
/// tracker waits when the consumer is slow, and the kernel counters make
/// sure no flap is lost meanwhile).
pub struct LinkTracker {
    nics: BTreeMap<String, NicTracker>,
    ports: Option<mpsc::Receiver<PortEvent>>,
    epochs: Option<Arc<NetdevEpochs>>,
}

/// What netlink says of each NIC, shared with the probe thread: up since
/// when, or down. The probe mesh judges a NIC only by its silence since it
/// came up, so a repaired NIC is not condemned for the outage before the
/// peers' probes could reach it.
#[derive(Debug, Default)]
pub struct NetdevEpochs(std::sync::Mutex<BTreeMap<String, Option<Instant>>>);

impl NetdevEpochs {
    /// Records `nic` as up since `up_since`, or down (`None`).
    pub fn set(&self, nic: &str, up_since: Option<Instant>) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(nic.to_owned(), up_since);
    }

    /// Every NIC recorded, with its state.
    pub fn snapshot(&self) -> Vec<(String, Option<Instant>)> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }
}

impl LinkTracker {
    /// `hold`: how long a NIC back up stays Recovering before it is Up.
    pub fn new(nics: &[String], damping: DampingConfig, hold: std::time::Duration) -> Self {
        Self {
            nics: nics
                .iter()
                .map(|n| (n.clone(), NicTracker::new(n, damping).with_hold(hold)))
                .collect(),
            ports: None,
            epochs: None,
        }
    }

    /// Also publishes each NIC's netdev state to `epochs` (for the probe
    /// mesh).
    pub fn with_netdev_epochs(mut self, epochs: Arc<NetdevEpochs>) -> Self {
        self.epochs = Some(epochs);
        self
    }

    /// Also consumes RDMA port events (from the `rdma` crate's stream).
    pub fn with_port_events(mut self, rx: mpsc::Receiver<PortEvent>) -> Self {
        self.ports = Some(rx);
        self
    }

    /// Subscribes, dumps, then runs until `tx` closes. Ticks damping every
    /// 100 ms.
    pub async fn run(mut self, tx: mpsc::Sender<LinkTransition>) -> Result<(), TrackerError> {
        let (conn, handle, mut messages) =
            rtnetlink::new_multicast_connection(&[rtnetlink::MulticastGroup::Link])
                .map_err(|e| TrackerError::Netlink(e.to_string()))?;
        tokio::spawn(conn);
        // Dump after subscribing, so no change falls between the two.
        let mut dump = handle.link().get().execute();
        let mut seen = std::collections::BTreeSet::new();
        while let Some(m) = dump.next().await {
            let m = m.map_err(|e| TrackerError::Netlink(e.to_string()))?;
            if let Some(s) = LinkSample::from_message(&m) {
                seen.insert(s.name.clone());
                if !self.send(&s, &tx).await {
                    return Ok(());
                }
            }
        }
        if let Some(missing) = self.nics.keys().find(|n| !seen.contains(*n)) {
            return Err(TrackerError::NoSuchNic(missing.clone()));
        }
        tracing::info!(nics = self.nics.len(), "link tracker started");
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
        let mut ports = self.ports.take();
        loop {
            tokio::select! {
                Some(p) = async { match ports.as_mut() { Some(r) => r.recv().await, None => std::future::pending().await } } => {
                    let now = Instant::now();
                    if let Some(t) = self.nics.get_mut(&p.netdev).and_then(|n| n.observe_event(&p, now)) {
                        if tx.send(t).await.is_err() {
                            return Ok(());
                        }
                    }
                }
                msg = messages.next() => {
                    let Some((msg, _)) = msg else {
                        return Err(TrackerError::Netlink("multicast connection closed".into()));
                    };
                    if let NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(m)) = msg.payload {
                        if let Some(s) = LinkSample::from_message(&m) {
                            if !self.send(&s, &tx).await {
                                return Ok(());
                            }
                        }
                    }
                }
                _ = tick.tick() => {
                    let now = Instant::now();
                    for t in self.nics.values_mut().filter_map(|n| n.tick(now)).collect::<Vec<_>>() {
                        if tx.send(t).await.is_err() {
                            return Ok(());
                        }
                    }
                }
            }
        }
    }

    async fn send(&mut self, s: &LinkSample, tx: &mpsc::Sender<LinkTransition>) -> bool {
        let Some(n) = self.nics.get_mut(&s.name) else {
            return true;
        };
        let now = Instant::now();
        let transitions = n.observe(s, now);
        if let Some(e) = &self.epochs {
            e.set(&s.name, n.up_since());
        }
        for t in transitions {
            tracing::debug!(nic = %t.nic, link_up = t.link_up, health = ?t.health, synthesized = t.synthesized, "link transition");
            if tx.send(t).await.is_err() {
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn sample(admin: bool, oper: bool, downs: u32) -> LinkSample {
        LinkSample {
            name: "rail0".into(),
            index: 2,
            admin_up: admin,
            oper_up: oper,
            carrier_changes: downs * 2,
            carrier_up_count: downs,
            carrier_down_count: downs,
        }
    }

    /// A rail0 tracker that saw its NIC up at the instant returned.
    fn up_nic() -> (NicTracker, Instant) {
        let t0 = Instant::now();
        let mut n = NicTracker::new("rail0", DampingConfig::default());
        n.observe(&sample(true, true, 0), t0);
        assert_eq!(n.up_since(), Some(t0));
        (n, t0)
    }

    /// rail0 loses probes: a verdict judged in `period`.
    fn lossy_in(period: Period) -> PortEvent {
        PortEvent {
            netdev: "rail0".into(),
            active: false,
            source: Evidence::Loss,
            period,
        }
    }

    #[test]
    fn admin_down_and_carrier_loss_are_both_down() {
        let t0 = Instant::now();
        let mut n = NicTracker::new("rail0", DampingConfig::default());
        assert_eq!(
            n.observe(&sample(true, true, 0), t0)[0].health,
            NicHealth::Up
        );
        let t = n.observe(&sample(true, false, 1), t0 + Duration::from_secs(1));
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].health, NicHealth::Down, "carrier loss, admin up");
        assert_eq!(
            n.observe(&sample(true, true, 1), t0 + Duration::from_secs(2))[0].health,
            NicHealth::Up
        );
        let t = n.observe(&sample(false, false, 2), t0 + Duration::from_secs(3));
        assert_eq!(t[0].health, NicHealth::Down, "admin down");
    }

    #[test]
    fn a_nic_back_up_is_recovering_for_its_hold_time() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // Damping out of the way: only the hold is tested here.
        let damping = DampingConfig {
            suppress: 1e9,
            ..DampingConfig::default()
        };
        let mut n = NicTracker::new("rail0", damping).with_hold(ms(500));
        // Up at start: no hold (it was never down).
        assert_eq!(
            n.observe(&sample(true, true, 0), t0)[0].health,
            NicHealth::Up
        );
        n.observe(&sample(true, false, 1), t0 + ms(100));
        let back = n.observe(&sample(true, true, 1), t0 + ms(200));
        assert_eq!(back[0].health, NicHealth::Recovering);
        assert!(back[0].link_up, "the link itself is up");
        assert_eq!(n.tick(t0 + ms(600)), None, "still held");
        let up = n.tick(t0 + ms(700)).expect("held 500 ms");
        assert_eq!(up.health, NicHealth::Up);
        // Down again within the hold: Down at once, and a new hold after.
        n.observe(&sample(true, false, 2), t0 + ms(800));
        n.observe(&sample(true, true, 2), t0 + ms(900));
        n.observe(&sample(true, false, 3), t0 + ms(1000));
        assert_eq!(n.health(), Some(NicHealth::Down));
        n.observe(&sample(true, true, 3), t0 + ms(1100));
        assert_eq!(n.tick(t0 + ms(1500)), None);
        assert_eq!(n.tick(t0 + ms(1600)).map(|t| t.health), Some(NicHealth::Up));
    }

    #[test]
    fn missed_flaps_are_synthesised_from_counters() {
        let t0 = Instant::now();
        let mut n = NicTracker::new("rail0", DampingConfig::default());
        n.observe(&sample(true, true, 5), t0);
        // Two full down/up cycles happened between messages.
        let t = n.observe(&sample(true, true, 7), t0 + Duration::from_secs(60));
        let ups: Vec<bool> = t.iter().map(|x| x.link_up).collect();
        assert_eq!(ups, vec![false, true, false, true]);
        assert!(t.iter().all(|x| x.synthesized));
        // A seen down plus one missed cycle before it.
        let t = n.observe(&sample(true, false, 9), t0 + Duration::from_secs(120));
        let ups: Vec<bool> = t.iter().map(|x| x.link_up).collect();
        assert_eq!(ups, vec![false, true, false]);
        assert_eq!(t.iter().filter(|x| x.synthesized).count(), 2);
    }

    #[test]
    fn a_dead_rdma_port_takes_the_nic_down_while_netlink_says_up() {
        let t0 = Instant::now();
        let mut n = NicTracker::new("rail0", DampingConfig::default());
        n.observe(&sample(true, true, 0), t0);
        let t = n
            .observe_port(Evidence::RdmaPort, false, t0 + Duration::from_secs(1))
            .expect("transition");
        assert!(!t.link_up);
        assert_eq!(t.health, NicHealth::Down);
        assert!(
            n.observe(&sample(true, true, 0), t0 + Duration::from_secs(2))
                .is_empty(),
            "netdev up, port still down"
        );
        let t = n
            .observe_port(Evidence::RdmaPort, true, t0 + Duration::from_secs(3))
            .expect("transition");
        assert!(t.link_up);
        assert_eq!(
            n.observe_port(Evidence::RdmaPort, true, t0 + Duration::from_secs(4)),
            None
        );
    }

    #[test]
    fn loss_evidence_makes_an_up_nic_degraded_without_a_flap_and_a_bounce_forgets_it() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut n = NicTracker::new("rail0", DampingConfig::default());
        n.observe(&sample(true, true, 0), t0);
        let t = n
            .observe_port(Evidence::Loss, false, t0 + s(1))
            .expect("transition");
        assert!(t.link_up && !t.probes_lost, "{t:?}");
        assert_eq!(t.health, NicHealth::Degraded);
        assert!(!t.health.usable());
        assert_eq!(n.damper.flaps(), 0, "a lossy link is no flap");
        let t = n
            .observe_port(Evidence::Loss, true, t0 + s(2))
            .expect("transition");
        assert_eq!(t.health, NicHealth::Up);
        // Lossy, then the netdev bounces: the verdict is from before.
        n.observe_port(Evidence::Loss, false, t0 + s(3));
        n.observe(&sample(true, false, 1), t0 + s(4));
        let up = n.observe(&sample(true, true, 1), t0 + s(5));
        assert_ne!(
            up.last().map(|t| t.health),
            Some(NicHealth::Degraded),
            "{up:?}"
        );
        // A verdict reached before the bounce, arriving after it: dropped.
        assert!(n
            .observe_event(&lossy_in(Period::UpSince(Some(t0))), t0 + s(6))
            .is_none());
        assert!(n
            .observe_event(&lossy_in(Period::UpSince(None)), t0 + s(6))
            .is_none());
        assert!(!n.lossy, "the stale verdict changed nothing");
        // One judged in the current up period counts.
        let t = n
            .observe_event(&lossy_in(Period::UpSince(Some(t0 + s(5)))), t0 + s(7))
            .expect("transition");
        assert_eq!(t.health, NicHealth::Degraded);
    }

    /// An outage seen only through the carrier counter starts a new up
    /// period like a seen one: the verdicts from before it are forgotten
    /// and dropped when they arrive late.
    #[test]
    fn an_outage_seen_only_in_the_counters_starts_a_new_up_period() {
        let (mut n, t0) = up_nic();
        let s = Duration::from_secs;
        n.observe_port(Evidence::Loss, false, t0 + s(1))
            .expect("Degraded");
        // The same counters again: no new period.
        n.observe(&sample(true, true, 0), t0 + s(2));
        assert_eq!(n.up_since(), Some(t0));
        assert!(n.lossy);
        // One carrier drop counted, never seen as a down sample.
        let t = n.observe(&sample(true, true, 1), t0 + s(3));
        assert!(t.iter().any(|t| t.synthesized), "{t:?}");
        assert_eq!(n.up_since(), Some(t0 + s(3)));
        assert!(!n.lossy, "the verdict from before is forgotten");
        let stale = lossy_in(Period::UpSince(Some(t0)));
        assert!(n.observe_event(&stale, t0 + s(4)).is_none());
        assert!(!n.lossy);
    }

    #[test]
    fn delay_evidence_degrades_too_and_the_nic_is_up_only_once_neither_holds() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut n = NicTracker::new("rail0", DampingConfig::default());
        n.observe(&sample(true, true, 0), t0);
        let t = n
            .observe_port(Evidence::Delay, false, t0 + s(1))
            .expect("transition");
        assert!(t.link_up && t.health == NicHealth::Degraded, "{t:?}");
        assert_eq!(n.damper.flaps(), 0, "a delaying link is no flap");
        // Loss too, then the delays end: still Degraded (losing).
        assert!(n.observe_port(Evidence::Loss, false, t0 + s(2)).is_none());
        assert!(n.observe_port(Evidence::Delay, true, t0 + s(3)).is_none());
        assert_eq!(n.health(), Some(NicHealth::Degraded));
        let t = n
            .observe_port(Evidence::Loss, true, t0 + s(4))
            .expect("transition");
        assert_eq!(t.health, NicHealth::Up);
        // Delaying, then the netdev bounces: the verdict is from before.
        n.observe_port(Evidence::Delay, false, t0 + s(5));
        n.observe(&sample(true, false, 1), t0 + s(6));
        let up = n.observe(&sample(true, true, 1), t0 + s(7));
        assert_ne!(
            up.last().map(|t| t.health),
            Some(NicHealth::Degraded),
            "{up:?}"
        );
    }

    #[test]
    fn silent_probes_take_the_nic_down_and_say_why() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut n = NicTracker::new("rail1", DampingConfig::default());
        n.observe(&sample(true, true, 0), t0);
        let t = n
            .observe_port(Evidence::Probes, false, t0 + s(1))
            .expect("transition");
        assert!(!t.link_up && t.probes_lost, "{t:?}");
        assert_eq!(n.damper.flaps(), 1, "a dead path is a flap like any other");
        // A real carrier loss meanwhile is not blamed on the probes.
        let down = n.observe(&sample(true, false, 1), t0 + s(2));
        assert!(down.is_empty(), "already down");
        let t = n.observe_port(Evidence::Probes, true, t0 + s(3));
        assert_eq!(t, None, "probes back but the carrier is still down");
        let up = n.observe(&sample(true, true, 1), t0 + s(4));
        assert_eq!(up.len(), 1);
        assert!(up[0].link_up && !up[0].probes_lost);
    }

    #[test]
    fn operstate_unknown_is_up_with_a_carrier() {
        let msg = |state: State, lower_up: bool| {
            let mut m = LinkMessage::default();
            m.header.flags = LinkFlags::Up;
            if lower_up {
                m.header.flags |= LinkFlags::LowerUp;
            }
            m.attributes = vec![
                LinkAttribute::IfName("lo".into()),
                LinkAttribute::OperState(state),
            ];
            LinkSample::from_message(&m).unwrap()
        };
        assert!(
            msg(State::Unknown, true).is_up(),
            "lo, as the kernel reports it"
        );
        assert!(!msg(State::Unknown, false).is_up(), "no carrier");
        assert!(msg(State::Up, true).is_up());
        assert!(!msg(State::Down, true).is_up());
        assert!(!msg(State::LowerLayerDown, false).is_up());
    }

    #[test]
    fn a_probe_verdict_from_before_an_outage_is_forgotten_when_the_nic_comes_back() {
        let (mut n, t0) = up_nic();
        let s = Duration::from_secs;
        // The probes find it silent, then netlink sees it go down.
        assert!(n.observe_port(Evidence::Probes, false, t0 + s(1)).is_some());
        assert!(n.observe(&sample(true, false, 1), t0 + s(2)).is_empty());
        assert_eq!(n.up_since(), None);
        // Back up: up at once (the mesh judges it afresh from now), not
        // held down by the verdict from before the outage.
        let up = n.observe(&sample(true, true, 1), t0 + s(3));
        assert_eq!(up.len(), 1);
        assert!(up[0].link_up, "{up:?}");
        assert_eq!(n.up_since(), Some(t0 + s(3)));
    }

    #[test]
    fn storm_goes_flapping_then_recovering_then_up() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut n = NicTracker::new("rail0", DampingConfig::default());
        n.observe(&sample(true, true, 0), t0);
        let mut healths = Vec::new();
        for i in 0..4u32 {
            let at = t0 + ms(100 * (2 * i as u64 + 1));
            healths.push(n.observe(&sample(true, false, i + 1), at)[0].health);
            healths.push(n.observe(&sample(true, true, i + 1), at + ms(50))[0].health);
        }
        assert_eq!(
            healths,
            vec![
                NicHealth::Down,
                NicHealth::Up,
                NicHealth::Down,
                NicHealth::Up,
                NicHealth::Flapping,
                NicHealth::Recovering,
                NicHealth::Flapping,
                NicHealth::Recovering,
            ]
        );
        assert_eq!(
            n.tick(t0 + Duration::from_secs(5)),
            None,
            "still suppressed"
        );
        let t = n.tick(t0 + Duration::from_secs(60)).expect("decayed");
        assert_eq!(t.health, NicHealth::Up);
        assert!(t.link_up);
        assert_eq!(n.tick(t0 + Duration::from_secs(61)), None);
    }
}
