//! A test client for the supervisor's agent API (register, heartbeat,
//! sequenced event stream). It stands in for the node agent until that
//! exists, speaking exactly the wire protocol the agent will use.

use std::time::Duration;

use anyhow::{bail, Context};
use proto::v1::agent_client::AgentClient;
use proto::v1::{agent_event, AgentEvent, EventAck, Nic, NicStateChange, RegisterHost};
use tokio::sync::mpsc;
use tonic::transport::Channel;

/// A client for one supervisor's agent API, dialled with `tls` (the
/// agent certificate of the host it will speak for).
pub fn agent_client(addr: &str, tls: &pki::ClientTls) -> anyhow::Result<AgentClient<Channel>> {
    let ch = supervisor::network::channel(addr, tls).context("agent channel")?;
    Ok(AgentClient::new(ch))
}

/// The two rails of a testbed host, each the other's backup.
pub fn testbed_nics() -> Vec<Nic> {
    vec![
        Nic {
            name: "rail0".into(),
            rail: Some(0),
            backup: "rail1".into(),
            rdma_device: String::new(),
            ..Default::default()
        },
        Nic {
            name: "rail1".into(),
            rail: Some(1),
            backup: "rail0".into(),
            rdma_device: String::new(),
            ..Default::default()
        },
    ]
}

/// Registers `host` with two rails through whichever address leads.
pub async fn register_host(
    addrs: &[String],
    host: &str,
    tls: &pki::ClientTls,
) -> anyhow::Result<u64> {
    let mut last = None;
    for _ in 0..50 {
        for a in addrs {
            let mut c = agent_client(a, tls)?;
            let req = RegisterHost {
                host: host.into(),
                nics: testbed_nics(),
                labels: Default::default(),
                agent_version: "agentsim".into(),
            };
            match tokio::time::timeout(Duration::from_secs(3), c.register(req)).await {
                Ok(Ok(r)) => return Ok(r.into_inner().last_applied_seq),
                Ok(Err(s)) => last = Some(format!("{a}: {}", s.message())),
                Err(_) => last = Some(format!("{a}: timed out")),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("cannot register {host}: {}", last.unwrap_or_default())
}

/// A NIC-state event with sequence `seq`.
pub fn nic_event(host: &str, seq: u64, nic: &str, up: bool) -> AgentEvent {
    use proto::v1::NicState;
    AgentEvent {
        host: host.into(),
        seq,
        at_unix_ns: 0,
        kind: Some(agent_event::Kind::NicState(NicStateChange {
            nic: nic.into(),
            state: if up {
                NicState::Up as i32
            } else {
                NicState::Down as i32
            },
            carrier_changes: seq,
            flaps: 0,
            damping_penalty: 0.0,
            coalesced: 0,
            link_up: up,
            ..Default::default()
        })),
    }
}

/// An open `Report` stream: send events, read cumulative acks.
pub struct EventStream {
    pub tx: mpsc::Sender<AgentEvent>,
    pub acks: tonic::Streaming<EventAck>,
}

/// Opens a report stream to the supervisor at `addr`, as `tls`'s agent.
pub async fn open_stream(addr: &str, tls: &pki::ClientTls) -> anyhow::Result<EventStream> {
    let mut c = agent_client(addr, tls)?;
    let (tx, rx) = mpsc::channel(1024);
    let acks = c
        .report(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .with_context(|| format!("open report stream to {addr}"))?
        .into_inner();
    Ok(EventStream { tx, acks })
}
