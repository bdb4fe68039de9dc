//! RDMA port events into the link tracker: a port error or port active of
//! the RDMA device a NIC is configured with (`--nic NAME:RAIL:BACKUP:RDMA`)
//! becomes a [`PortEvent`] for that NIC, so a dead port beyond what netlink
//! shows (the HCA's own view of the link) reaches the same tracker, reflex
//! and report stream as a carrier loss.
//!
//! The source is any `rdma` [`Backend`]; the agent uses the `verbs` backend
//! when built with the `verbs` feature. A machine without RDMA devices gets
//! a clear [`RdmaError::NoDevices`] and the agent runs on netlink alone.

use std::collections::HashMap;

use futures::StreamExt;
use rdma::model::{AsyncEvent, AsyncEventKind, Backend, RdmaError};
use tokio::sync::mpsc;

use crate::link::PortEvent;

/// Most port events waiting for the tracker; beyond it the feed waits.
const QUEUE: usize = 256;

/// Which NIC (netdev) each `(device, port)` stands for: port 1 of the
/// configured device (one port per NIC, as dual-port HCAs are exposed as
/// one device per port by current drivers).
#[derive(Debug, Clone, Default)]
pub struct PortMap {
    by_device: HashMap<String, String>,
}

impl PortMap {
    /// `nics`: (netdev name, RDMA device name) for every NIC that has one.
    pub fn new<'a>(nics: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        Self {
            by_device: nics
                .into_iter()
                .map(|(nic, dev)| (dev.to_string(), nic.to_string()))
                .collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.by_device.is_empty()
    }

    /// The tracker's event for `e`, if it is a port state change of a
    /// configured device (other events, such as QP errors, belong to the
    /// transport that owns the QP).
    pub fn translate(&self, e: &AsyncEvent) -> Option<PortEvent> {
        let nic = self.by_device.get(&e.device)?;
        let active = match e.kind {
            AsyncEventKind::PortActive { port: 1 } => true,
            AsyncEventKind::PortError { port: 1 } | AsyncEventKind::DeviceFatal => false,
            _ => return None,
        };
        Some(PortEvent {
            netdev: nic.clone(),
            active,
            source: crate::link::Evidence::RdmaPort,
            period: crate::link::Period::Current,
        })
    }
}

/// Subscribes to `backend`'s events and forwards the port changes of the
/// mapped devices, in order, until the tracker goes away. The initial
/// state of each port is sent first (a port already down at start counts).
pub fn feed(backend: &dyn Backend, map: PortMap) -> Result<mpsc::Receiver<PortEvent>, RdmaError> {
    let mut events = backend.events()?;
    let (tx, rx) = mpsc::channel(QUEUE);
    let mut initial = Vec::new();
    for dev in backend.devices()? {
        if let Some(port) = dev.ports.first() {
            let kind = if port.is_active() {
                AsyncEventKind::PortActive { port: 1 }
            } else {
                AsyncEventKind::PortError { port: 1 }
            };
            initial.extend(map.translate(&AsyncEvent {
                device: dev.name.clone(),
                kind,
            }));
        }
    }
    tokio::spawn(async move {
        for p in initial {
            if tx.send(p).await.is_err() {
                return;
            }
        }
        while let Some(e) = events.next().await {
            if let Some(p) = map.translate(&e) {
                tracing::info!(device = %e.device, nic = %p.netdev, active = p.active, "RDMA port event");
                if tx.send(p).await.is_err() {
                    return;
                }
            }
        }
        tracing::warn!("RDMA event stream ended");
    });
    Ok(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(device: &str, kind: AsyncEventKind) -> AsyncEvent {
        AsyncEvent {
            device: device.into(),
            kind,
        }
    }

    #[test]
    fn port_changes_of_configured_devices_map_to_their_nic() {
        let m = PortMap::new([("rail0", "mlx5_0"), ("rail1", "mlx5_1")]);
        let down = m.translate(&ev("mlx5_1", AsyncEventKind::PortError { port: 1 }));
        assert_eq!(
            down,
            Some(PortEvent {
                netdev: "rail1".into(),
                active: false,
                source: crate::link::Evidence::RdmaPort,
                period: crate::link::Period::Current,
            })
        );
        let up = m.translate(&ev("mlx5_0", AsyncEventKind::PortActive { port: 1 }));
        assert_eq!(
            up.map(|p| (p.netdev, p.active)),
            Some(("rail0".into(), true))
        );
        // A fatal device error takes its NIC down.
        let fatal = m.translate(&ev("mlx5_0", AsyncEventKind::DeviceFatal));
        assert_eq!(fatal.map(|p| p.active), Some(false));
    }

    #[test]
    fn other_devices_ports_and_events_are_ignored() {
        let m = PortMap::new([("rail0", "mlx5_0")]);
        assert!(m
            .translate(&ev("mlx5_9", AsyncEventKind::PortError { port: 1 }))
            .is_none());
        assert!(m
            .translate(&ev("mlx5_0", AsyncEventKind::PortError { port: 2 }))
            .is_none());
        assert!(m
            .translate(&ev("mlx5_0", AsyncEventKind::QpFatal { qp_num: 7 }))
            .is_none());
        assert!(PortMap::new([]).is_empty());
    }

    /// On this machine (no RDMA devices) the verbs backend says so clearly.
    #[cfg(feature = "verbs")]
    #[tokio::test]
    async fn verbs_without_devices_is_a_clear_error() {
        let backend = rdma::verbs::VerbsBackend::new();
        if backend.devices().is_ok_and(|d| !d.is_empty()) {
            return; // a machine with RDMA hardware: nothing to check here
        }
        let r = feed(&backend, PortMap::new([("rail0", "mlx5_0")]));
        assert!(matches!(r, Err(RdmaError::NoDevices)), "{:?}", r.err());
    }
}
