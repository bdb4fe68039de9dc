//! Orders to agents: the leader's side of `Agent.Orders`.
//!
//! An order is an open `Failover`/`Failback` intent; its id is the intent
//! id. Each agent keeps an `Orders` stream open to the leader; the
//! reconciler hands the open orders to the [`OrderHub`] every tick, and the
//! hub sends each to the host's streams — at once on a new stream, and again
//! every [`RESEND_EVERY`] while the intent stays open (the agent executes an
//! id at most once and answers a repeat with the outcome it stored). The
//! agent answers with `Agent.OrderDone`, which commits the outcome. A new
//! leader starts with an empty hub and resends every open intent when the
//! agents reconnect, so leader changes lose nothing and repeat nothing.
//!
//! The hub is leader memory only (like heartbeats); losing it loses nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use proto::agent::Order;
use proto::v1::{AgentOrder, RankPeer, StartRank};
use tokio::sync::mpsc;
use tonic::Status;

use crate::model::{Action, ClusterState};

/// How often an unanswered order is sent again on the same stream.
pub const RESEND_EVERY: Duration = Duration::from_secs(3);
/// Orders queued per stream (a stream that falls behind gets them on the
/// next resend).
pub const STREAM_QUEUE: usize = 64;
/// Query ids have this bit set (intent ids never do): the border's own
/// constant, which agents test too.
pub use proto::agent::QUERY_BIT;
/// Queries awaiting an answer at once.
pub const MAX_QUERIES: usize = 256;
/// Streams kept per host (the newest win; an agent has one).
pub const MAX_STREAMS_PER_HOST: usize = 4;

type Tx = mpsc::Sender<Result<AgentOrder, Status>>;

struct Subscriber {
    id: u64,
    tx: Tx,
    /// When each open order was last sent on this stream.
    sent: HashMap<u64, Instant>,
}

/// The leader's open `Orders` streams by host.
#[derive(Default)]
pub struct OrderHub {
    streams: Mutex<HashMap<String, Vec<Subscriber>>>,
    next_id: AtomicU64,
    /// Queries awaiting their answer, by query id (top bit set).
    queries: Mutex<HashMap<u64, tokio::sync::oneshot::Sender<proto::v1::LogTailResult>>>,
}

/// The order an intent's action asks of its host, if it is an order:
/// (host, order), in the border's type. Job orders read the job (command,
/// peers' addresses) from the state; `None` for a job that is gone (the
/// reconciler cancels its intents).
pub fn order_of(st: &ClusterState, action: &Action) -> Option<(String, Order)> {
    order_in(st, &std::cell::OnceCell::new(), action)
}

/// [`order_of`] with the detour view computed at most once for many orders.
fn order_in<'a>(
    st: &'a ClusterState,
    detours: &std::cell::OnceCell<crate::model::reroute::Detours<'a>>,
    action: &Action,
) -> Option<(String, Order)> {
    let order = match action {
        Action::Failover {
            nic, to, version, ..
        } => Order::HoldOut {
            nic: nic.clone(),
            to: to.clone(),
            version: *version,
        },
        Action::Failback { nic, version, .. } => Order::Release {
            nic: nic.clone(),
            version: *version,
        },
        Action::StartRank {
            job,
            incarnation,
            rank,
            ..
        } => {
            let j = st.jobs.get(job)?;
            let peers = j
                .placement
                .iter()
                .map(|h| RankPeer {
                    host: h.clone(),
                    addrs: rail_addrs(st, h),
                })
                .collect();
            Order::StartRank(StartRank {
                job: job.clone(),
                incarnation: *incarnation,
                rank: *rank,
                peers,
                argv: j.spec.command.clone(),
                env: j.spec.env.clone().into_iter().collect(),
                checkpoint_dir: j.spec.checkpoint_dir.clone(),
                checkpoint_every: j.spec.checkpoint_every,
                resume_step: j.resume_step,
                port: u32::from(j.port),
                user: j.spec.user.clone().unwrap_or_default(),
            })
        }
        Action::StopJob {
            job, incarnation, ..
        } => Order::StopJob {
            job: job.clone(),
            incarnation: *incarnation,
        },
        Action::CheckpointJob {
            job,
            incarnation,
            halt,
            ..
        } => Order::CheckpointJob {
            job: job.clone(),
            incarnation: *incarnation,
            halt: *halt,
        },
        Action::PlaybookStep { op, .. } => match op {
            crate::model::runs::StepOp::Failover { nic, to } => Order::Failover {
                nic: nic.clone(),
                to: to.clone(),
            },
            crate::model::runs::StepOp::Failback { nic } => Order::Failback { nic: nic.clone() },
            _ => return None,
        },
        Action::ShapeNic { host, nic, version } => {
            let want = st.shapes.get(host)?.get(nic)?;
            if want.version != *version {
                return None;
            }
            Order::ShapeNic(shape_order(nic, want))
        }
        Action::ClearShape { nic, .. } => Order::ClearShape { nic: nic.clone() },
        Action::Reroute { host, digest } => {
            let view = detours.get_or_init(|| crate::model::reroute::Detours::new(st));
            if view.digest(host) != *digest {
                return None;
            }
            Order::Reroute {
                routes: view.desired(host),
                standby: crate::model::reroute::standby(st, host),
            }
        }
        Action::CompleteDrain { .. } => return None,
    };
    Some((action.host().to_owned(), order))
}

/// The wire form of a desired NIC shape.
fn shape_order(nic: &str, want: &crate::model::shaping::NicShape) -> proto::v1::ShapeNic {
    proto::v1::ShapeNic {
        nic: nic.to_owned(),
        classes: want
            .classes
            .iter()
            .map(|c| proto::v1::ShapeClass {
                minor: u32::from(c.minor),
                rate_bps: c.rate_bps,
                ceil_bps: c.ceil_bps,
                flows: c
                    .flows
                    .iter()
                    .map(|f| proto::v1::FlowMatch {
                        dst: f.dst.to_string(),
                        protocol: u32::from(f.protocol),
                        dst_port: u32::from(f.dst_port),
                        src_port: u32::from(f.src_port),
                    })
                    .collect(),
                label: c.label.clone(),
                job: c.job.clone().unwrap_or_default(),
            })
            .collect(),
        default_rate_bps: want.default_rate_bps,
        hold_queueing_us: want.hold_queueing_us.unwrap_or(0),
        pace: want
            .pace
            .iter()
            .map(|(job, rate)| proto::v1::PaceJob {
                job: job.clone(),
                rate_bps: *rate,
            })
            .collect(),
    }
}

/// A host's data NIC addresses in rail order (NICs without a rail or an
/// address are not data NICs).
pub fn rail_addrs(st: &ClusterState, host: &str) -> Vec<String> {
    let Some(h) = st.hosts.get(host) else {
        return Vec::new();
    };
    let mut nics: Vec<(u32, &str)> = h
        .nics
        .values()
        .filter_map(|n| Some((n.rail?, n.addr.as_deref()?)))
        .collect();
    nics.sort();
    nics.into_iter().map(|(_, a)| a.to_owned()).collect()
}

/// Every open order in the state: (host, order), oldest first.
pub fn open_orders(st: &ClusterState) -> Vec<(String, AgentOrder)> {
    let detours = std::cell::OnceCell::new();
    st.open_intents()
        .filter_map(|i| order_in(st, &detours, &i.action).map(|(host, o)| (host, o.to_wire(i.id))))
        .collect()
}

impl OrderHub {
    /// Hands a query's answer to whoever waits for it (unknown ids, late
    /// answers included, are dropped).
    pub fn answer_query(&self, r: proto::v1::LogTailResult) {
        let waiter = self
            .queries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&r.order_id);
        match waiter {
            Some(tx) => {
                let _ = tx.send(r);
            }
            None => {
                tracing::debug!(order_id = r.order_id, host = %r.host, "answer to an unknown or expired query")
            }
        }
    }

    /// Asks `host`'s agent for the end of a rank's log (a query: not an
    /// intent, nothing is stored). Fails at once when the agent has no
    /// order stream to this leader, or after `within`.
    pub async fn tail_log(
        &self,
        host: &str,
        job: &str,
        rank: u32,
        max_bytes: u32,
        from: Option<(u64, u64)>,
        within: Duration,
    ) -> Result<proto::v1::LogTailResult, crate::api::ApiError> {
        use crate::api::{ApiError, ErrorKind};
        let id = QUERY_BIT | (self.next_id.fetch_add(1, Ordering::Relaxed) & !QUERY_BIT);
        let (tx, rx) = tokio::sync::oneshot::channel();
        {
            let mut q = self.queries.lock().unwrap_or_else(|e| e.into_inner());
            if q.len() >= MAX_QUERIES {
                return Err(ApiError::new(
                    ErrorKind::Unavailable,
                    "too many log queries in flight; retry",
                ));
            }
            q.insert(id, tx);
        }
        let order = Order::TailLog {
            job: job.to_owned(),
            rank,
            max_bytes,
            from,
        }
        .to_wire(id);
        let sent = {
            let mut streams = self.lock();
            streams
                .get_mut(host)
                .into_iter()
                .flatten()
                .filter(|s| !s.tx.is_closed())
                .any(|s| s.tx.try_send(Ok(order.clone())).is_ok())
        };
        let forget = || {
            self.queries
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
        };
        if !sent {
            forget();
            return Err(ApiError::new(
                ErrorKind::Unavailable,
                format!("the agent of {host} is not connected to the leader"),
            ));
        }
        match tokio::time::timeout(within, rx).await {
            Ok(Ok(r)) => Ok(r),
            _ => {
                forget();
                Err(ApiError::new(
                    ErrorKind::Unavailable,
                    format!("the agent of {host} did not answer within {within:?}"),
                ))
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Subscriber>>> {
        self.streams.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new stream for `host`'s agent. The oldest stream of the host is
    /// closed when it has too many.
    pub fn subscribe(&self, host: &str) -> mpsc::Receiver<Result<AgentOrder, Status>> {
        let (tx, rx) = mpsc::channel(STREAM_QUEUE);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut streams = self.lock();
        let subs = streams.entry(host.to_owned()).or_default();
        subs.retain(|s| !s.tx.is_closed());
        if subs.len() >= MAX_STREAMS_PER_HOST {
            subs.remove(0);
        }
        subs.push(Subscriber {
            id,
            tx,
            sent: HashMap::new(),
        });
        tracing::debug!(host = %host, stream = id, "agent subscribed to orders");
        rx
    }

    /// Sends every order `read` returns that a stream of its host has not
    /// had (or not for [`RESEND_EVERY`]); returns how many were sent. The
    /// orders are read while the streams are locked, so callers (the
    /// reconciler, every agent stream whose NIC report commits) send from
    /// states in the order they read them: a caller holding an older state
    /// could otherwise send an order a newer one had seen closed, after
    /// that newer one's orders.
    pub fn dispatch(
        &self,
        read: impl FnOnce() -> Vec<(String, AgentOrder)>,
        now: Instant,
    ) -> usize {
        let mut streams = self.lock();
        let open = read();
        let mut sent = 0;
        streams.retain(|_, subs| {
            subs.retain(|s| !s.tx.is_closed());
            !subs.is_empty()
        });
        for subs in streams.values_mut() {
            for s in subs.iter_mut() {
                // Forget orders that are no longer open.
                s.sent
                    .retain(|id, _| open.iter().any(|(_, o)| o.order_id == *id));
            }
        }
        for (host, order) in &open {
            let Some(subs) = streams.get_mut(host) else {
                continue;
            };
            for s in subs.iter_mut() {
                let due = s
                    .sent
                    .get(&order.order_id)
                    .is_none_or(|t| now.duration_since(*t) >= RESEND_EVERY);
                if due && s.tx.try_send(Ok(order.clone())).is_ok() {
                    tracing::info!(host = %host, order = order.order_id, stream = s.id, "order sent to agent");
                    s.sent.insert(order.order_id, now);
                    sent += 1;
                }
            }
        }
        sent
    }

    /// Ends every stream (this node stopped leading; agents reconnect to
    /// the new leader).
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// Open streams of `host`.
    pub fn streams_of(&self, host: &str) -> usize {
        self.lock()
            .get(host)
            .map_or(0, |v| v.iter().filter(|s| !s.tx.is_closed()).count())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failover(id: u64, host: &str) -> (String, AgentOrder) {
        let (host, order) = order_of(
            &ClusterState::default(),
            &Action::Failover {
                host: host.into(),
                nic: "rail0".into(),
                to: "rail1".into(),
                version: 7,
            },
        )
        .unwrap();
        (host, order.to_wire(id))
    }

    #[tokio::test]
    async fn orders_go_to_their_host_once_then_again_after_the_resend_period() {
        let hub = OrderHub::default();
        let mut h0 = hub.subscribe("h0");
        let mut h1 = hub.subscribe("h1");
        let t0 = Instant::now();
        let open = vec![failover(7, "h0")];
        assert_eq!(hub.dispatch(|| open.clone(), t0), 1);
        assert_eq!(h0.recv().await.unwrap().unwrap().order_id, 7);
        assert!(h1.try_recv().is_err(), "another host's order");
        assert_eq!(
            hub.dispatch(|| open.clone(), t0 + Duration::from_secs(1)),
            0
        );
        assert!(h0.try_recv().is_err(), "not again before the resend period");
        assert_eq!(hub.dispatch(|| open.clone(), t0 + RESEND_EVERY), 1);
        assert_eq!(h0.recv().await.unwrap().unwrap().order_id, 7);
        // A new stream (agent reconnected) gets the open order at once.
        let mut h0b = hub.subscribe("h0");
        drop(h0);
        assert_eq!(hub.dispatch(|| open.clone(), t0 + RESEND_EVERY), 1);
        assert_eq!(h0b.recv().await.unwrap().unwrap().order_id, 7);
        assert_eq!(hub.streams_of("h0"), 1, "the closed stream is gone");
        // Closed intents are not sent; drains are not orders.
        assert!(order_of(
            &ClusterState::default(),
            &Action::CompleteDrain { host: "h0".into() }
        )
        .is_none());
        assert_eq!(hub.dispatch(Vec::new, t0 + RESEND_EVERY * 3), 0);
        hub.clear();
        assert!(h0b.recv().await.is_none(), "clear ends the streams");
    }
}
