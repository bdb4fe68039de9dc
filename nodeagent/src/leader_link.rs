//! The agent's link to the leader: one shared channel per supervisor
//! address, the hint of which supervisor leads, and the heartbeat loop.
//!
//! Each heartbeat also carries the probe evidence this host holds about its
//! peers (how long ago it last received each one's probes), so the leader
//! learns that a host went silent on the data network within a heartbeat,
//! not a probe summary (once a second) later.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proto::v1::agent_client::AgentClient;
use proto::v1::HeartbeatRequest;
use tonic::transport::Channel;

use crate::config::AgentConfig;
use crate::control::Control;
use crate::leader_term::LeaderTerm;
use crate::probe::HeardBoard;

/// Heartbeat period (DESIGN.md default).
pub const HEARTBEAT: Duration = Duration::from_millis(250);

/// A supervisor address that is not `host:port`.
#[derive(Debug, thiserror::Error)]
#[error("bad supervisor address {0:?}")]
pub struct BadAddress(pub String);

/// At most this many supervisor addresses keep a channel (the configured
/// ones plus leaders named in answers); beyond it the cache starts over.
const MAX_CHANNELS: usize = 16;

/// Shared view of which supervisor leads, and one channel per supervisor
/// address: every call and stream to a supervisor shares one HTTP/2
/// connection (a connection per heartbeat left hundreds in TIME_WAIT),
/// dialled again after the agent's certificate is reloaded.
#[derive(Default)]
pub(crate) struct LeaderHint {
    leader: std::sync::Mutex<Option<String>>,
    /// Address → (client certificate generation, channel).
    channels: std::sync::Mutex<HashMap<String, (u64, Channel)>>,
}

impl LeaderHint {
    pub(crate) fn get(&self) -> Option<String> {
        self.leader.lock().expect("hint").clone()
    }
    pub(crate) fn set(&self, v: Option<String>) {
        *self.leader.lock().expect("hint") = v;
    }
    /// A client of the supervisor at `addr` over its shared channel, with
    /// this agent's certificate (or plain text on an `--insecure`
    /// cluster). The channel connects lazily, reconnects by itself, and
    /// sends HTTP/2 keep-alives so a dead peer is noticed.
    pub(crate) fn client(
        &self,
        cfg: &AgentConfig,
        addr: &str,
    ) -> Result<AgentClient<Channel>, BadAddress> {
        let generation = cfg.tls.generation();
        let mut channels = self.channels.lock().expect("channels");
        if let Some((g, c)) = channels.get(addr) {
            if *g == generation {
                return Ok(AgentClient::new(c.clone()));
            }
        }
        let ch = cfg
            .tls
            .endpoint(addr)
            .map_err(|_| BadAddress(addr.into()))?
            .connect_timeout(Duration::from_millis(500))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5))
            .connect_lazy();
        if channels.len() >= MAX_CHANNELS && !channels.contains_key(addr) {
            channels.clear();
        }
        channels.insert(addr.to_owned(), (generation, ch.clone()));
        Ok(AgentClient::new(ch))
    }
    /// Where to call next: the hinted leader, else the next supervisor in
    /// turn (`rotate` is the caller's cursor).
    pub(crate) fn target(&self, supervisors: &[String], rotate: &mut usize) -> String {
        self.get().unwrap_or_else(|| {
            *rotate = rotate.wrapping_add(1);
            supervisors[*rotate % supervisors.len()].clone()
        })
    }
    pub(crate) fn learn(&self, s: &tonic::Status) {
        if let Some(l) = s.metadata().get("rg-leader").and_then(|v| v.to_str().ok()) {
            self.set(Some(l.to_owned()));
        } else {
            self.set(None);
        }
    }
}

/// Heartbeats the leader every [`HEARTBEAT`]; each reply also carries the
/// host's NICs held out of service, which the control plane keeps (when
/// not older than what it has) and passes on to the jobs.
pub(crate) async fn heartbeat_loop(
    cfg: Arc<AgentConfig>,
    hint: Arc<LeaderHint>,
    control: Arc<Control>,
    term: Arc<LeaderTerm>,
    heard: Arc<HeardBoard>,
) {
    let mut tick = tokio::time::interval(HEARTBEAT);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rotate = 0usize;
    loop {
        tick.tick().await;
        let addr = hint.target(&cfg.supervisors, &mut rotate);
        let Ok(mut c) = hint.client(&cfg, &addr) else {
            continue;
        };
        let req = HeartbeatRequest {
            host: cfg.host.clone(),
            sent_unix_ms: crate::link::unix_ns() / 1_000_000,
            heard: heard.ages(Instant::now()),
        };
        match tokio::time::timeout(HEARTBEAT * 2, c.heartbeat(req)).await {
            Ok(Ok(reply)) => {
                let r = reply.into_inner();
                if term.admit(r.term) {
                    hint.set(Some(addr));
                    control.set_held_out(r.held_version, r.held_out);
                } else {
                    tracing::debug!(addr = %addr, term = r.term, "heartbeat answered by a deposed leader");
                }
            }
            Ok(Err(s)) => {
                tracing::debug!(addr = %addr, status = %s.message(), "heartbeat refused");
                hint.learn(&s);
            }
            Err(_) => hint.set(None),
        }
    }
}
