//! A NIC's health and the report an agent sends about it.

use serde::{Deserialize, Serialize};

use crate::v1;

use super::error::BorderError;

/// A NIC's health as the agent's link tracker sees it (after damping).
/// The variant order is the on-disk order (bincode): append only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NicHealth {
    /// Usable.
    Up,
    /// Link down (or probes lost).
    Down,
    /// Suppressed by flap damping.
    Flapping,
    /// Up again, waiting for the damping penalty to decay.
    Recovering,
    /// Up, but the probe mesh sees it lose packets (a gray link): out of
    /// service for connections until the loss ends.
    Degraded,
}

impl NicHealth {
    /// The protobuf enum value.
    pub fn to_wire(self) -> v1::NicState {
        match self {
            NicHealth::Up => v1::NicState::Up,
            NicHealth::Down => v1::NicState::Down,
            NicHealth::Flapping => v1::NicState::Flapping,
            NicHealth::Recovering => v1::NicState::Recovering,
            NicHealth::Degraded => v1::NicState::Degraded,
        }
    }

    /// From the protobuf enum value; `None` for unspecified or unknown.
    pub fn from_wire(state: i32) -> Option<NicHealth> {
        match v1::NicState::try_from(state).ok()? {
            v1::NicState::Up => Some(NicHealth::Up),
            v1::NicState::Down => Some(NicHealth::Down),
            v1::NicState::Flapping => Some(NicHealth::Flapping),
            v1::NicState::Recovering => Some(NicHealth::Recovering),
            v1::NicState::Degraded => Some(NicHealth::Degraded),
            v1::NicState::Unspecified => None,
        }
    }
}

/// One report about a NIC (a `NicStateChange` event).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NicReport {
    /// The NIC's name.
    pub nic: String,
    /// Its health after damping.
    pub health: NicHealth,
    /// The link itself is up (independent of damping).
    pub link_up: bool,
    /// The kernel's carrier up+down counter.
    pub carrier_changes: u64,
    /// Flaps counted by the damper.
    pub flaps: u32,
    /// The damping penalty.
    pub penalty: f64,
    /// When the agent observed it (ns since the Unix epoch).
    pub at_unix_ns: u64,
    /// Transitions folded into this report because the outbox was full.
    pub coalesced: u32,
    /// Down because probes stopped crossing it while the link said up.
    pub probes_lost: bool,
}

impl NicReport {
    /// The wire form (the event's time travels in `AgentEvent`).
    pub fn to_wire(&self) -> v1::NicStateChange {
        v1::NicStateChange {
            nic: self.nic.clone(),
            state: self.health.to_wire() as i32,
            carrier_changes: self.carrier_changes,
            flaps: self.flaps,
            damping_penalty: self.penalty,
            coalesced: self.coalesced,
            link_up: self.link_up,
            probes_lost: self.probes_lost,
        }
    }

    /// From the wire, with the event's time.
    pub fn from_wire(m: &v1::NicStateChange, at_unix_ns: u64) -> Result<NicReport, BorderError> {
        let health = NicHealth::from_wire(m.state).ok_or_else(|| BorderError::BadNicState {
            nic: m.nic.clone(),
            state: m.state,
        })?;
        if !m.damping_penalty.is_finite() || m.damping_penalty < 0.0 {
            return Err(BorderError::BadPenalty {
                nic: m.nic.clone(),
                penalty: m.damping_penalty,
            });
        }
        Ok(NicReport {
            nic: m.nic.clone(),
            health,
            link_up: m.link_up,
            carrier_changes: m.carrier_changes,
            flaps: m.flaps,
            penalty: m.damping_penalty,
            at_unix_ns,
            coalesced: m.coalesced,
            probes_lost: m.probes_lost,
        })
    }
}
