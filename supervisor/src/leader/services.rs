//! [`Leader`]: the leader-memory services of one supervisor, bundled with
//! its Raft node. Built once per process (the daemon); the gRPC services
//! read and feed them, and [`Leader::spawn_loops`] starts the loops that
//! act while the node leads.

use std::sync::Arc;

use crate::leader::clock::ClockService;
use crate::leader::contention::ContentionService;
use crate::leader::liveness::{Heartbeats, LivenessConfig};
use crate::leader::orders::OrderHub;
use crate::leader::webhooks::{WebhookSender, WebhookTls};
use crate::node::Supervisor;

/// The leader's memory (never replicated; emptied when leadership is lost)
/// and the node it acts through.
pub struct Leader {
    /// The Raft node: reads, proposals, leadership.
    pub node: Arc<Supervisor>,
    /// When each host last sent a heartbeat.
    pub heartbeats: Arc<Heartbeats>,
    /// Agents' open `Orders` streams.
    pub orders: Arc<OrderHub>,
    /// Probe summaries, the clock solution, probe evidence.
    pub clocks: Arc<ClockService>,
    /// Webhook POSTs in flight.
    pub webhooks: Arc<WebhookSender>,
    /// Per-path queueing and link scores.
    pub contention: Arc<ContentionService>,
    /// Wakes the reconciler before its next tick: a committed NIC change
    /// calls for detours and failovers now, not up to a tick later.
    pub nudge: Arc<tokio::sync::Notify>,
}

impl Leader {
    /// Empty leader memory over `node`.
    pub fn new(node: Arc<Supervisor>) -> Arc<Self> {
        let webhook_tls = WebhookTls::from_config(node.config.webhook_ca.as_deref());
        Arc::new(Self {
            node,
            heartbeats: Default::default(),
            orders: Default::default(),
            clocks: Default::default(),
            webhooks: Arc::new(WebhookSender::new(webhook_tls)),
            contention: Default::default(),
            nudge: Default::default(),
        })
    }

    /// Starts the leader loops (reconciler, clock, contention, liveness);
    /// they run until the process exits and act only while the node leads.
    pub fn spawn_loops(&self) {
        tokio::spawn(crate::leader::reconciler::run(
            self.node.clone(),
            self.orders.clone(),
            self.webhooks.clone(),
            self.nudge.clone(),
        ));
        tokio::spawn(crate::leader::clock::run(
            self.node.clone(),
            self.clocks.clone(),
        ));
        tokio::spawn(crate::leader::contention::run(
            self.node.clone(),
            self.contention.clone(),
            self.clocks.clone(),
        ));
        tokio::spawn(crate::leader::liveness::run(
            self.node.clone(),
            self.heartbeats.clone(),
            self.clocks.clone(),
            LivenessConfig::default(),
        ));
    }
}
