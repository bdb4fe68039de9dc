//! The ring's transport: one [`ResilientConnection`] per ring edge over the
//! host's data NICs (`rdma::soft` endpoints).
//!
//! Edge `k` carries rank `k`'s messages to rank `k + 1 (mod world)`; its
//! id is `incarnation << 32 | k`, so ranks of two incarnations never
//! talk. Its home rail is `k mod rails`, the same on both ends, and the
//! other rails follow in order as backups (none with `--fragile`).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use rdma::resilient::{
    ConnConfig, ConnControl, ConnError, Failback, Rail, ResilientConnection, Side,
};
use rdma::soft::{Endpoint, LocalNic};

use super::allreduce::{RingLink, HEADER};
use super::config::Config;

/// One connection as the job contract sees it.
#[derive(Clone)]
pub struct ConnInfo {
    pub id: u64,
    /// Local NIC index of each rail, in the connection's rail order.
    pub rail_nics: Vec<usize>,
    /// Home rail (index into the host's rails = NIC index).
    pub home: usize,
    pub peer_rank: u32,
    pub peer_host: String,
    pub control: ConnControl,
}

impl ConnInfo {
    /// NIC index of the connection's current path, if it has one.
    pub fn current_nic(&self) -> Option<usize> {
        let rail = self.control.watch_stats().borrow().rail;
        rail.and_then(|r| self.rail_nics.get(r).copied())
    }
}

/// A rank's endpoint and its two ring connections.
pub struct RingNet {
    pub endpoint: Arc<Endpoint>,
    /// To the successor (this rank sends).
    pub out: ResilientConnection,
    /// From the predecessor (this rank receives).
    pub inc: ResilientConnection,
    /// `[out, inc]`.
    pub conns: Vec<ConnInfo>,
}

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The rank's data endpoint could not listen on its NICs.
    #[error("data endpoint on port {port}: {source}")]
    Bind {
        port: u16,
        #[source]
        source: rdma::soft::SoftError,
    },
    /// A resilient connection to a ring neighbour could not be opened.
    #[error("connection {id}: {source}")]
    Open {
        id: u64,
        #[source]
        source: ConnError,
    },
}

/// Connection id of edge `k`.
pub fn conn_id(incarnation: u64, edge: u32) -> u64 {
    (incarnation << 32) | u64::from(edge)
}

/// Largest message of a step (a header and the largest chunk).
pub fn max_message(values: usize, world: usize) -> usize {
    // Chunks are cut at floor(c·n/world): none is longer than ceil(n/world).
    HEADER + 4 * values.div_ceil(world)
}

impl RingNet {
    /// Binds the endpoint and opens both connections (returns at once;
    /// paths come up in the background). `values` is the all-reduce length.
    pub async fn open(cfg: &Config, values: usize) -> Result<Self, NetError> {
        let world = cfg.world as usize;
        assert!(world >= 2, "a ring of one has no connections");
        let nics: Vec<LocalNic> = cfg
            .nics
            .iter()
            .map(|n| LocalNic {
                name: n.name.clone(),
                addr: n.addr,
            })
            .collect();
        let endpoint = Endpoint::bind(nics, cfg.port)
            .await
            .map_err(|source| NetError::Bind {
                port: cfg.port,
                source,
            })?;
        let endpoint = Arc::new(endpoint);
        // The reflex: this host's link events move connections off a dead NIC.
        let backend =
            rdma::netdev::NetdevBackend::new(cfg.nics.iter().map(|n| n.name.clone()).collect());
        if let Err(e) = endpoint.follow_links(&backend) {
            tracing::warn!(error = %e, "no link events; connections move on transport errors only");
        }
        let rank = cfg.rank as usize;
        let succ = (rank + 1) % world;
        let pred = (rank + world - 1) % world;
        let max_msg = max_message(values, world);
        let open = |edge: usize, peer: usize, side: Side| -> Result<_, NetError> {
            let nrails = cfg.nics.len();
            let home = edge % nrails;
            let take = if cfg.fragile { 1 } else { nrails };
            let rail_nics: Vec<usize> = (0..take).map(|j| (home + j) % nrails).collect();
            let rails = rail_nics
                .iter()
                .map(|&i| Rail {
                    nic: i,
                    remote: SocketAddr::new(cfg.peers[peer].addrs[i], cfg.port),
                })
                .collect();
            let id = conn_id(cfg.incarnation, edge as u32);
            let mut c = ConnConfig::new(id, side, rails);
            c.stall_timeout = cfg.stall_timeout;
            c.connect_timeout = cfg.connect_timeout;
            c.max_message = max_msg;
            c.window_bytes = (4 * max_msg).max(1 << 20);
            if cfg.fragile {
                c.failback = Failback::Never;
            }
            let conn = ResilientConnection::open(endpoint.clone(), c)
                .map_err(|source| NetError::Open { id, source })?;
            let info = ConnInfo {
                id,
                rail_nics,
                home,
                peer_rank: peer as u32,
                peer_host: cfg.peers[peer].host.clone(),
                control: conn.control(),
            };
            Ok((conn, info))
        };
        let (out, out_info) = open(rank, succ, Side::A)?;
        let (inc, inc_info) = open(pred, pred, Side::B)?;
        tracing::info!(
            rank,
            out = out_info.id,
            inc = inc_info.id,
            fragile = cfg.fragile,
            max_message = max_msg,
            "ring connections opened"
        );
        Ok(Self {
            endpoint,
            out,
            inc,
            conns: vec![out_info, inc_info],
        })
    }

    /// The all-reduce's view of the ring.
    pub fn link(&mut self) -> Link<'_> {
        Link {
            out: &self.out,
            out_control: &self.conns[0].control,
            inc: &mut self.inc,
        }
    }
}

/// Sends to the successor, receives from the predecessor.
pub struct Link<'a> {
    out: &'a ResilientConnection,
    out_control: &'a ConnControl,
    inc: &'a mut ResilientConnection,
}

impl RingLink for Link<'_> {
    async fn send(&mut self, msg: Bytes) -> Result<(), ConnError> {
        self.out.send(msg).await
    }

    /// Also ends when the connection to the successor fails meanwhile
    /// (the predecessor may be waiting for us through it, so nothing
    /// would arrive).
    async fn recv(&mut self) -> Result<Bytes, ConnError> {
        tokio::select! {
            m = self.inc.recv() => m,
            e = self.out_control.closed() => Err(e),
        }
    }
}
