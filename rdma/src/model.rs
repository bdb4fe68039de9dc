//! The backend-neutral RDMA model: devices, their ports, async events, and
//! the [`Backend`] trait the `verbs` (libibverbs) and `netdev` (soft, plain
//! NICs) backends implement.
//!
//! A backend answers two questions: which devices and ports exist right now
//! ([`Backend::devices`]), and what changes from now on
//! ([`Backend::events`]). To miss nothing, subscribe first and enumerate
//! second: every change after the enumeration is then on the stream (an
//! event may repeat what the enumeration already showed; consumers treat
//! port events as idempotent state updates).

use std::pin::Pin;

use futures::Stream;
use serde::{Deserialize, Serialize};

/// An RDMA device (an HCA, or for the soft backend a NIC).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    /// Device name (`mlx5_0` for verbs, the netdev name for the soft backend).
    pub name: String,
    /// Node GUID in host byte order, when the device has one.
    pub node_guid: Option<u64>,
    /// The device's ports, by ascending port number.
    pub ports: Vec<Port>,
}

/// One port of a [`Device`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Port {
    /// Port number, 1-based as in libibverbs.
    pub num: u8,
    pub state: PortState,
    pub link_layer: LinkLayer,
    /// GID at index 0, when it could be read.
    pub gid: Option<[u8; 16]>,
    /// The network device bound to this port (RoCE, soft backend), if known.
    pub netdev: Option<String>,
}

impl Port {
    /// Whether the port can carry traffic.
    pub fn is_active(&self) -> bool {
        matches!(self.state, PortState::Active | PortState::ActiveDefer)
    }
}

/// Logical port state (`enum ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PortState {
    Down,
    Init,
    Armed,
    Active,
    ActiveDefer,
    /// A raw value this model does not know (including `IBV_PORT_NOP`).
    Unknown(u32),
}

/// Link layer of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LinkLayer {
    InfiniBand,
    Ethernet,
    /// A raw `IBV_LINK_LAYER_*` value this model does not know.
    Unknown(u8),
}

/// An asynchronous event of a device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AsyncEvent {
    /// The device's name, as in [`Device::name`].
    pub device: String,
    pub kind: AsyncEventKind,
}

/// What happened (a subset of `enum ibv_event_type`; the rest is `Other`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AsyncEventKind {
    /// The port became active (can carry traffic).
    PortActive {
        port: u8,
    },
    /// The port left the active state (link down, cable pulled).
    PortError {
        port: u8,
    },
    /// The device is unusable; every resource on it is lost.
    DeviceFatal,
    /// A queue pair went to the error state.
    QpFatal {
        qp_num: u32,
    },
    /// A queue pair's peer reported an invalid request.
    QpRequestError {
        qp_num: u32,
    },
    /// A queue pair's peer reported an access violation.
    QpAccessError {
        qp_num: u32,
    },
    /// A completion queue overran or failed.
    CqError,
    LidChange {
        port: u8,
    },
    GidChange {
        port: u8,
    },
    /// Any other raw event code (`IBV_EVENT_*`), kept for the record.
    Other {
        code: u32,
    },
}

impl AsyncEventKind {
    /// The port this event is about, if it is a port event.
    pub fn port(&self) -> Option<u8> {
        match *self {
            AsyncEventKind::PortActive { port }
            | AsyncEventKind::PortError { port }
            | AsyncEventKind::LidChange { port }
            | AsyncEventKind::GidChange { port } => Some(port),
            _ => None,
        }
    }
}

/// Errors of the RDMA backends.
#[derive(Debug, thiserror::Error)]
pub enum RdmaError {
    /// libibverbs lists no device (or the kernel has no RDMA support).
    #[error(
        "no RDMA devices found (libibverbs lists none); the soft backend runs over plain NICs"
    )]
    NoDevices,
    /// Devices exist, but not the one asked for.
    #[error("RDMA device {0:?} not found")]
    NoSuchDevice(String),
    /// A NIC the soft backend was given does not exist.
    #[error("NIC {0:?} does not exist in this network namespace")]
    NoSuchNic(String),
    /// A system or verbs call failed.
    #[error("{op} on {device}: {source}")]
    Os {
        op: &'static str,
        device: String,
        #[source]
        source: std::io::Error,
    },
    /// A netlink request failed or returned something unusable.
    #[error("netlink: {0}")]
    Netlink(String),
    /// An async entry point was called outside a tokio runtime.
    #[error("{0} must be called from within a tokio runtime")]
    NoRuntime(&'static str),
    /// A caller-supplied argument is out of range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl RdmaError {
    /// An [`RdmaError::Os`] from `errno`.
    pub fn last_os(op: &'static str, device: impl Into<String>) -> Self {
        RdmaError::Os {
            op,
            device: device.into(),
            source: std::io::Error::last_os_error(),
        }
    }
}

/// A stream of async events; it ends when the backend can no longer watch.
pub type EventStream = Pin<Box<dyn Stream<Item = AsyncEvent> + Send>>;

/// An RDMA backend: enumerates devices and streams their events.
pub trait Backend: Send + Sync {
    /// Short name for logs and metrics (`"verbs"`, `"netdev"`).
    fn name(&self) -> &'static str;
    /// The devices and ports as they are now.
    fn devices(&self) -> Result<Vec<Device>, RdmaError>;
    /// Subscribes to the devices' events. Must be called within a tokio
    /// runtime; the subscription is in place when this returns.
    fn events(&self) -> Result<EventStream, RdmaError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_devices_message_is_clear() {
        assert_eq!(
            RdmaError::NoDevices.to_string(),
            "no RDMA devices found (libibverbs lists none); the soft backend runs over plain NICs"
        );
    }

    #[test]
    fn port_activity_and_event_ports() {
        let mut p = Port {
            num: 1,
            state: PortState::Unknown(0),
            link_layer: LinkLayer::Ethernet,
            gid: None,
            netdev: Some("rail0".into()),
        };
        assert!(!p.is_active());
        p.state = PortState::ActiveDefer;
        assert!(p.is_active());
        assert_eq!(AsyncEventKind::PortError { port: 2 }.port(), Some(2));
        assert_eq!(AsyncEventKind::DeviceFatal.port(), None);
    }
}
