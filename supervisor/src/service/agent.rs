//! `Agent`: host registration, heartbeats and the sequenced event stream.
//!
//! Only the leader serves agents; a follower answers `Unavailable` with the
//! leader's address in the `rg-leader` metadata so the agent can reconnect.
//!
//! **Event stream contract.** Events carry per-agent sequence numbers from 1
//! without gaps. The supervisor batches whatever has arrived into one
//! command, proposes it, and acks cumulatively (`acked_through`) only after
//! the entry is committed and applied. Applying skips sequences already
//! applied, so resending after a reconnect is safe: every event takes effect
//! exactly once. A gap is refused with the last applied sequence; the agent
//! resends from there.
//!
//! **Orders.** `Orders` streams the host's open orders (see
//! [`crate::leader::orders`]); `OrderDone` commits the agent's answer and replies
//! once it is applied (answering twice is harmless).
//!
//! **Probe mesh.** `GetProbePlan` is served by any supervisor from its local
//! (possibly stale) model: the host's id and neighbours in the probe graph
//! with their data NICs. `SendProbeSummary` is leader only and never
//! touches Raft: [`crate::leader::clock::ClockService::ingest`] validates it and
//! keeps it in leader memory.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use futures::{FutureExt, Stream, StreamExt};
use proto::agent::Report;
use proto::v1::agent_server::Agent;
use proto::v1::{
    AgentEvent as PbEvent, AgentOrder, EventAck, HeartbeatReply, HeartbeatRequest, OrderResult,
    OrderResultReply, OrdersRequest, RegisterHost, RegisterReply,
};
use tonic::{Request, Response, Status, Streaming};

use crate::api::{ApiError, ErrorKind};
use crate::leader::services::Leader;
use crate::model::{AgentEvent, ClusterState, CmdOk, Command, NicSpec};
use crate::node::Supervisor;
use crate::service::auth::{caller, guarded, peer_of, require_agent, Caller};

/// Most events folded into one command from one stream.
pub const MAX_EVENTS_PER_COMMAND: usize = 512;
/// Commands of one stream proposed but not yet acked.
pub const MAX_PENDING_PER_STREAM: usize = 32;

/// The `Agent` gRPC service.
pub struct AgentService {
    /// This node.
    pub sup: Arc<Supervisor>,
    /// The leader's memory: heartbeats, order streams, probe summaries.
    pub leader: Arc<Leader>,
}

impl AgentService {
    fn require_leader(&self) -> Result<(), Status> {
        if self.sup.is_leader() {
            return Ok(());
        }
        let mut s = Status::from(ApiError::unavailable(match self.sup.leader_addr() {
            Some(a) => format!("not the leader; the leader is at {a}"),
            None => "not the leader; no leader is elected right now".into(),
        }));
        if let Some(a) = self.sup.leader_addr() {
            if let Ok(v) = a.parse() {
                s.metadata_mut().insert("rg-leader", v);
            }
        }
        Err(s)
    }
}

/// Converts a wire event (the border type checks what protobuf cannot;
/// this checks that it is about `host` and numbered).
fn convert(e: &PbEvent, host: &str) -> Result<AgentEvent, ApiError> {
    if e.host != host {
        return Err(ApiError::invalid(format!(
            "event for host {:?} on the stream of host {host:?}",
            e.host
        )));
    }
    if e.seq == 0 {
        return Err(ApiError::invalid("event sequence numbers start at 1"));
    }
    let report = Report::from_wire(e).map_err(|err| ApiError::invalid(err.to_string()))?;
    Ok(AgentEvent { seq: e.seq, report })
}

/// `host`'s probe plan: its id, the plan version, and its neighbours in the
/// probe graph with their data NICs (those with a rail and an address).
pub fn probe_plan(st: &ClusterState, host: &str) -> Result<proto::v1::ProbePlan, ApiError> {
    let h = st.hosts.get(host).ok_or_else(|| {
        ApiError::new(
            ErrorKind::NotFound,
            format!("host {host:?} is not registered; register first"),
        )
    })?;
    let peers = st
        .probe_graph
        .neighbours(h.id)
        .filter_map(|id| st.host_ids.get(&id).and_then(|n| st.hosts.get(n)))
        .map(|p| {
            let mut nics: Vec<proto::v1::ProbeNic> = p
                .nics
                .values()
                .filter_map(|n| match (n.rail, &n.addr) {
                    (Some(rail), Some(addr)) => Some(proto::v1::ProbeNic {
                        rail,
                        nic: n.name.clone(),
                        addr: addr.clone(),
                    }),
                    _ => None,
                })
                .collect();
            nics.sort_by(|a, b| (a.rail, &a.nic).cmp(&(b.rail, &b.nic)));
            proto::v1::ProbePeer {
                host: p.name.clone(),
                host_id: p.id,
                nics,
            }
        })
        .collect();
    Ok(proto::v1::ProbePlan {
        host_id: h.id,
        version: st.probe_plan_version,
        peers,
    })
}

/// The probe evidence a heartbeat from `from` carries, as instants: the
/// first [`proto::v1::PeerHeard`] entries up to the agent's cap, naming
/// registered hosts other than the sender, heard within the last minute.
fn heard_at(
    st: &ClusterState,
    from: &str,
    heard: Vec<proto::v1::PeerHeard>,
    now: Instant,
) -> Vec<(String, Instant)> {
    const MAX_AGE_MS: u32 = 60_000;
    heard
        .into_iter()
        .take(proto::MAX_PEERS_HEARD)
        .filter(|p| p.age_ms <= MAX_AGE_MS && p.host != from && st.hosts.contains_key(&p.host))
        .filter_map(|p| {
            let at = now.checked_sub(std::time::Duration::from_millis(u64::from(p.age_ms)))?;
            Some((p.host, at))
        })
        .collect()
}

#[tonic::async_trait]
impl Agent for AgentService {
    async fn register(
        &self,
        req: Request<RegisterHost>,
    ) -> Result<Response<RegisterReply>, Status> {
        require_agent(&self.sup, &req, &req.get_ref().host)?;
        self.require_leader()?;
        let r = req.into_inner();
        let nics = r
            .nics
            .iter()
            .map(|n| NicSpec {
                name: n.name.clone(),
                rail: n.rail,
                backup: (!n.backup.is_empty()).then(|| n.backup.clone()),
                rdma_device: (!n.rdma_device.is_empty()).then(|| n.rdma_device.clone()),
                addr: (!n.addr.is_empty()).then(|| n.addr.clone()),
            })
            .collect();
        let cmd = Command::RegisterHost {
            host: r.host.clone(),
            nics,
            labels: r.labels.into_iter().collect(),
        };
        // Registering is the agent's first sign of life: its silence counts
        // from now, not from this leader's election (or a host registered
        // on a leader that has led for longer than the Down period would be
        // declared Down before its first heartbeat). Recorded before the
        // commit, so the liveness loop never sees the host without it.
        self.leader
            .heartbeats
            .lock()
            .expect("heartbeats")
            .insert(r.host.clone(), Instant::now());
        match self.sup.propose(cmd).await.map_err(Status::from)? {
            CmdOk::Registered { last_applied_seq } => {
                tracing::info!(host = %r.host, last_applied_seq, "host registered");
                Ok(Response::new(RegisterReply {
                    last_applied_seq,
                    leader_id: self.sup.id,
                }))
            }
            other => Err(Status::internal(format!("unexpected reply {other:?}"))),
        }
    }

    async fn heartbeat(
        &self,
        req: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatReply>, Status> {
        require_agent(&self.sup, &req, &req.get_ref().host)?;
        self.require_leader()?;
        let now = Instant::now();
        let HeartbeatRequest { host, heard, .. } = req.into_inner();
        let Some((held_out, held_version, heard)) = self.sup.read(|st| {
            let h = st.hosts.get(&host)?;
            Some((
                h.held_out_nics(),
                h.held_version,
                heard_at(st, &host, heard, now),
            ))
        }) else {
            return Err(Status::from(ApiError::new(
                crate::api::ErrorKind::NotFound,
                format!("host {host:?} is not registered; register first"),
            )));
        };
        self.leader
            .heartbeats
            .lock()
            .expect("heartbeat map poisoned")
            .insert(host, now);
        self.leader.clocks.heard(heard);
        Ok(Response::new(HeartbeatReply {
            leader_id: self.sup.id,
            held_out,
            held_version,
            term: self.sup.leading_term().unwrap_or(0),
        }))
    }

    type OrdersStream = Pin<Box<dyn Stream<Item = Result<AgentOrder, Status>> + Send>>;

    async fn orders(
        &self,
        req: Request<OrdersRequest>,
    ) -> Result<Response<Self::OrdersStream>, Status> {
        require_agent(&self.sup, &req, &req.get_ref().host)?;
        self.require_leader()?;
        let peer = peer_of(&self.sup, &req);
        let host = req.into_inner().host;
        if !self.sup.read(|st| st.hosts.contains_key(&host)) {
            return Err(Status::from(ApiError::new(
                crate::api::ErrorKind::NotFound,
                format!("host {host:?} is not registered; register first"),
            )));
        }
        let rx = self.leader.orders.subscribe(&host);
        // The open orders go out on the next reconciler tick.
        Ok(Response::new(guarded(
            &self.sup,
            peer,
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn order_done(
        &self,
        req: Request<OrderResult>,
    ) -> Result<Response<OrderResultReply>, Status> {
        require_agent(&self.sup, &req, &req.get_ref().host)?;
        self.require_leader()?;
        let r = req.into_inner();
        let outcome = proto::agent::OrderOutcome::try_from(&r)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        tracing::info!(host = %r.host, order = r.order_id, ok = r.ok, step = ?outcome.step(), detail = %r.detail, "order answered");
        let cmd = Command::OrderDone {
            host: r.host,
            id: r.order_id,
            outcome,
        };
        self.sup.propose(cmd).await.map_err(Status::from)?;
        Ok(Response::new(OrderResultReply {}))
    }

    async fn log_tail(
        &self,
        req: Request<proto::v1::LogTailResult>,
    ) -> Result<Response<OrderResultReply>, Status> {
        require_agent(&self.sup, &req, &req.get_ref().host)?;
        self.require_leader()?;
        let r = req.into_inner();
        self.leader.orders.answer_query(r);
        Ok(Response::new(OrderResultReply {}))
    }

    type ReportStream = Pin<Box<dyn Stream<Item = Result<EventAck, Status>> + Send>>;

    async fn report(
        &self,
        req: Request<Streaming<PbEvent>>,
    ) -> Result<Response<Self::ReportStream>, Status> {
        self.require_leader()?;
        // The host this stream may speak for: its certificate's (checked
        // against the first event's host below), any on an insecure cluster.
        let allowed = match caller(&self.sup, &req)? {
            Caller::Insecure => None,
            Caller::Peer(p) => match &p.identity {
                pki::Identity::Agent { host } => Some(host.clone()),
                other => {
                    return Err(Status::permission_denied(format!(
                        "{other} may not report agent events: it takes an agent certificate"
                    )))
                }
            },
        };
        let peer = peer_of(&self.sup, &req);
        let mut inbound = req.into_inner();
        let sup = self.sup.clone();
        // The reader takes no event once the certificate is revoked (the
        // ack stream ends with the refusal; a batch that arrives after is
        // dropped by the check before each proposal).
        let revoked_serial = peer.as_ref().map(|p| p.serial.clone());
        let host_slot = Arc::new(std::sync::Mutex::new(String::new()));
        let (ack_tx, ack_rx) = tokio::sync::mpsc::channel::<Result<EventAck, Status>>(16);
        // Per proposal: its answer, and whether it carries a NIC report
        // (once it is committed, the detour orders its entry opened go out
        // at once and the reconciler is nudged).
        let (pending_tx, mut pending_rx) = tokio::sync::mpsc::channel::<(
            tokio::sync::oneshot::Receiver<Result<CmdOk, ApiError>>,
            bool,
        )>(MAX_PENDING_PER_STREAM);
        let nudge = self.leader.nudge.clone();
        let orders = self.leader.orders.clone();

        // Acks, in proposal order. A refused batch (e.g. a sequence gap)
        // ends the stream with a final ack naming the last applied sequence,
        // so the agent knows where to resume.
        let acks = ack_tx.clone();
        let host_for_acks = host_slot.clone();
        let sup_for_acks = sup.clone();
        tokio::spawn(async move {
            while let Some((rx, nic_report)) = pending_rx.recv().await {
                let (msg, stop) = match rx.await {
                    Ok(Ok(CmdOk::Acked { through })) => {
                        if nic_report {
                            crate::leader::reconciler::send_open_orders(&sup_for_acks, &orders);
                            nudge.notify_one();
                        }
                        (
                            Ok(EventAck {
                                acked_through: through,
                                error: String::new(),
                            }),
                            false,
                        )
                    }
                    Ok(Ok(other)) => (
                        Err(Status::internal(format!("unexpected reply {other:?}"))),
                        true,
                    ),
                    Ok(Err(e)) if e.is_definite() => {
                        let host = host_for_acks.lock().expect("host slot").clone();
                        let last = sup_for_acks
                            .read(|st| st.hosts.get(&host).map(|h| h.last_event_seq).unwrap_or(0));
                        (
                            Ok(EventAck {
                                acked_through: last,
                                error: e.message,
                            }),
                            true,
                        )
                    }
                    Ok(Err(e)) => (Err(Status::from(e)), true),
                    Err(_) => (Err(Status::unavailable("supervisor stopping")), true),
                };
                if acks.send(msg).await.is_err() || stop {
                    return;
                }
            }
        });

        // Reader: fold whatever has arrived into one command per round.
        tokio::spawn(async move {
            let mut host: Option<String> = None;
            loop {
                let first = match inbound.next().await {
                    None => return,
                    Some(Err(s)) => {
                        // A message tonic could not take (too large,
                        // undecodable): the agent must see the error, not
                        // a clean end of stream.
                        tracing::warn!(status = %s, "agent stream ended with an error");
                        drop(pending_tx);
                        let _ = ack_tx.send(Err(s)).await;
                        return;
                    }
                    Some(Ok(e)) => e,
                };
                if let Some(a) = allowed.as_deref().filter(|a| *a != first.host) {
                    tracing::warn!(cert_host = a, host = %first.host, "refused events for another host");
                    let _ = ack_tx
                        .send(Err(Status::permission_denied(format!(
                            "agent:{a} may not speak for host {}: it takes the agent certificate of {}",
                            first.host, first.host
                        ))))
                        .await;
                    return;
                }
                let h = host
                    .get_or_insert_with(|| {
                        *host_slot.lock().expect("host slot") = first.host.clone();
                        first.host.clone()
                    })
                    .clone();
                let mut batch = Vec::with_capacity(8);
                let mut next = Some(first);
                while let Some(e) = next.take() {
                    match convert(&e, &h) {
                        Ok(ev) => batch.push(ev),
                        Err(err) => {
                            let _ = ack_tx.send(Err(Status::from(err))).await;
                            return;
                        }
                    }
                    if batch.len() >= MAX_EVENTS_PER_COMMAND {
                        break;
                    }
                    if let Some(Some(Ok(e))) = inbound.next().now_or_never() {
                        next = Some(e);
                    }
                }
                let nic_report = batch
                    .iter()
                    .any(|e| matches!(e.report, proto::agent::Report::Nic(_)));
                let cmd = Command::AgentEvents {
                    host: h.clone(),
                    events: batch,
                };
                // A command the state refuses (unknown host or NIC) ends the
                // stream with a final ack naming the last applied sequence.
                let valid = sup.read(|st| {
                    st.validate(&cmd)
                        .map_err(|e| (e, st.hosts.get(&h).map(|x| x.last_event_seq).unwrap_or(0)))
                });
                if let Err((e, last)) = valid {
                    // Let earlier batches' acks go out first.
                    drop(pending_tx);
                    let _ = ack_tx
                        .send(Ok(EventAck {
                            acked_through: last,
                            error: e.to_string(),
                        }))
                        .await;
                    return;
                }
                if revoked_serial
                    .as_ref()
                    .is_some_and(|s| sup.revocations.contains(s))
                {
                    tracing::warn!(host = %h, "events on a revoked certificate dropped");
                    return;
                }
                if !sup.is_leader() {
                    let _ = ack_tx
                        .send(Err(Status::from(ApiError::unavailable(
                            "leadership moved; reconnect to the new leader",
                        ))))
                        .await;
                    return;
                }
                match sup.enqueue(cmd).await {
                    Ok(rx) => {
                        if pending_tx.send((rx, nic_report)).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        let _ = ack_tx.send(Err(Status::from(e))).await;
                        return;
                    }
                }
            }
        });
        Ok(Response::new(guarded(
            &self.sup,
            peer,
            tokio_stream::wrappers::ReceiverStream::new(ack_rx),
        )))
    }

    async fn get_probe_plan(
        &self,
        req: Request<proto::v1::ProbePlanRequest>,
    ) -> Result<Response<proto::v1::ProbePlan>, Status> {
        require_agent(&self.sup, &req, &req.get_ref().host)?;
        let host = req.into_inner().host;
        let plan = self
            .sup
            .read(|st| probe_plan(st, &host))
            .map_err(Status::from)?;
        tracing::debug!(host = %host, version = plan.version, peers = plan.peers.len(), "probe plan served");
        Ok(Response::new(plan))
    }

    async fn send_probe_summary(
        &self,
        req: Request<proto::v1::ProbeSummary>,
    ) -> Result<Response<proto::v1::ProbeSummaryReply>, Status> {
        require_agent(&self.sup, &req, &req.get_ref().host)?;
        self.require_leader()?;
        let s = req.into_inner();
        let now = Instant::now();
        match self.sup.read(|st| self.leader.clocks.ingest(st, &s, now)) {
            Ok(got) => {
                tracing::debug!(
                    host = %s.host,
                    clocks = got.clocks,
                    paths = got.paths,
                    ignored = got.ignored,
                    plan_version = s.plan_version,
                    "probe summary"
                );
                Ok(Response::new(proto::v1::ProbeSummaryReply {}))
            }
            Err(e) => {
                tracing::debug!(host = %crate::leader::clock::short(&s.host), error = %e, "probe summary refused");
                Err(Status::from(ApiError::from(e)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::command::Proposal;
    use crate::model::testkit::register_two_rails_for_test;
    use openraft::{CommittedLeaderId, LogId};
    use proto::v1::PeerHeard;
    use std::time::Duration;

    #[test]
    fn heartbeat_evidence_names_registered_peers_dated_by_their_age() {
        let mut st = ClusterState::default();
        let p = Proposal {
            at_ms: 1,
            cmds: vec![
                register_two_rails_for_test(0, "h0"),
                register_two_rails_for_test(1, "h1"),
            ],
        };
        st.apply_proposal(&LogId::new(CommittedLeaderId::new(1, 1), 1), &p);
        let now = Instant::now() + Duration::from_secs(120);
        let heard = |host: &str, age_ms| PeerHeard {
            host: host.into(),
            age_ms,
        };
        let got = heard_at(
            &st,
            "h0",
            vec![
                heard("h1", 40),
                heard("h0", 0),        // the sender itself
                heard("stranger", 0),  // not registered
                heard("h1", 60_001),   // too old to mean anything
                heard("h1", u32::MAX), // hostile
            ],
            now,
        );
        assert_eq!(
            got,
            vec![("h1".to_string(), now - Duration::from_millis(40))]
        );
        // Only the first entries up to the cap are read.
        let flood: Vec<PeerHeard> = (0..10_000)
            .map(|_| heard("stranger", 0))
            .chain([heard("h1", 0)])
            .collect();
        assert!(heard_at(&st, "h0", flood, now).is_empty());
    }
}
