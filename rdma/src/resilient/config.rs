//! A connection's settings: its rails, side, window and timing bounds, and
//! failback policy, with their validation.

use std::net::SocketAddr;
use std::time::Duration;

use crate::damper::DampingConfig;
use crate::soft::Endpoint;

use super::error::ConnError;

/// One rail of a connection: the local NIC (index into the endpoint's NICs)
/// and the peer's listening address on the same rail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rail {
    pub nic: usize,
    pub remote: SocketAddr,
}

/// Which end of the connection this is (decides simultaneous dials).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

/// When to move back to the primary rail.
#[derive(Debug, Clone, PartialEq)]
pub enum Failback {
    /// Stay where the last migration left the connection.
    Never,
    /// Move back once the primary NIC is up, not suppressed by its damper and
    /// has been up for `hold`.
    WhenReusable {
        damping: DampingConfig,
        hold: Duration,
    },
}

/// Settings of one connection.
#[derive(Debug, Clone)]
pub struct ConnConfig {
    /// Identifies the connection on both ends (same value on both).
    pub conn_id: u64,
    pub side: Side,
    /// Rails in order of preference; `rails[0]` is the primary.
    pub rails: Vec<Rail>,
    /// Largest message accepted by `send`.
    pub max_message: usize,
    /// Bounds of the unacknowledged-send window.
    pub window_msgs: usize,
    pub window_bytes: usize,
    /// Messages delivered but not yet taken by `recv`.
    pub recv_queue: usize,
    /// Without any path for this long, the connection fails.
    pub stall_timeout: Duration,
    /// Limit of one connect attempt and of the hello exchange.
    pub connect_timeout: Duration,
    pub ping_interval: Duration,
    /// A path silent for this long is dead.
    pub dead_after: Duration,
    pub failback: Failback,
}

impl ConnConfig {
    /// Defaults for everything but identity and rails.
    pub fn new(conn_id: u64, side: Side, rails: Vec<Rail>) -> Self {
        Self {
            conn_id,
            side,
            rails,
            max_message: 64 << 20,
            window_msgs: 4096,
            window_bytes: 256 << 20,
            recv_queue: 256,
            stall_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_millis(250),
            ping_interval: Duration::from_millis(50),
            dead_after: Duration::from_millis(500),
            failback: Failback::WhenReusable {
                damping: DampingConfig::default(),
                hold: Duration::from_secs(1),
            },
        }
    }

    /// Checks the settings against `endpoint`'s NICs and the codec's limits.
    pub(super) fn validate(&self, endpoint: &Endpoint) -> Result<(), ConnError> {
        let bad = |m: String| Err(ConnError::Config(m));
        if self.rails.is_empty() {
            return bad("a connection needs at least one rail".into());
        }
        for r in &self.rails {
            if r.nic >= endpoint.nics().len() {
                return bad(format!(
                    "rail uses NIC #{} the endpoint does not have",
                    r.nic
                ));
            }
        }
        if self.max_message == 0 || self.max_message > crate::seq::MAX_PAYLOAD {
            return bad(format!(
                "max_message must be 1..={} bytes",
                crate::seq::MAX_PAYLOAD
            ));
        }
        if self.window_bytes < self.max_message || self.window_msgs == 0 {
            return bad("the window must hold at least one largest message".into());
        }
        if self.recv_queue == 0 {
            return bad("recv_queue must be positive".into());
        }
        if self.ping_interval.is_zero() || self.dead_after <= self.ping_interval {
            return bad("dead_after must be longer than a positive ping_interval".into());
        }
        if let Failback::WhenReusable { damping, .. } = &self.failback {
            damping
                .validate()
                .map_err(|e| ConnError::Config(e.to_string()))?;
        }
        Ok(())
    }
}
