//! Host liveness on the leader: Ready → Suspect → Down from missed
//! heartbeats (DESIGN.md defaults: suspect after 1.5 s, Down after 3 s).
//!
//! Heartbeats live only in the leader's memory. A new leader has seen none,
//! so it counts every host's silence from the moment it became leader: the
//! first Down it can declare is one full Down period after taking over (the
//! grace period), never a wave of false Downs right after an election.
//! Changes are committed through Raft (`SetLiveness`). Probe evidence joins
//! this decision with the probe-mesh issue.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::model::{ClusterState, Command, Liveness};
use crate::node::Supervisor;

/// Liveness thresholds.
#[derive(Debug, Clone, Copy)]
pub struct LivenessConfig {
    pub suspect_after: Duration,
    pub down_after: Duration,
}

impl Default for LivenessConfig {
    fn default() -> Self {
        Self {
            suspect_after: Duration::from_millis(1500),
            down_after: Duration::from_secs(3),
        }
    }
}

/// What each host's liveness should be now. Pure, for tests.
pub fn judge(
    st: &ClusterState,
    heartbeats: &HashMap<String, Instant>,
    leader_since: Instant,
    now: Instant,
    cfg: LivenessConfig,
) -> Vec<(String, Liveness)> {
    st.hosts
        .values()
        .filter_map(|h| {
            let last = heartbeats
                .get(&h.name)
                .copied()
                .unwrap_or(leader_since)
                .max(leader_since);
            let silent = now.saturating_duration_since(last);
            let want = if silent >= cfg.down_after {
                Liveness::Down
            } else if silent >= cfg.suspect_after {
                // Never move a Down host back to Suspect without a heartbeat.
                if h.liveness == Liveness::Down {
                    Liveness::Down
                } else {
                    Liveness::Suspect
                }
            } else if heartbeats.get(&h.name).is_some_and(|t| *t >= leader_since) {
                Liveness::Ready
            } else {
                // No fresh evidence either way: keep what is committed.
                h.liveness
            };
            (want != h.liveness).then(|| (h.name.clone(), want))
        })
        .collect()
}

/// Runs on every supervisor; acts while it leads.
pub async fn run(sup: Arc<Supervisor>, cfg: LivenessConfig) {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut leader_since: Option<(u64, Instant)> = None;
    loop {
        tick.tick().await;
        if !sup.is_leader() {
            leader_since = None;
            continue;
        }
        let term = sup.raft.metrics().borrow().current_term;
        let since = match leader_since {
            Some((t, at)) if t == term => at,
            _ => {
                let now = Instant::now();
                leader_since = Some((term, now));
                tracing::info!(
                    term,
                    grace_ms = cfg.down_after.as_millis() as u64,
                    "leader: liveness grace period starts"
                );
                now
            }
        };
        let hb = sup.heartbeats.lock().expect("heartbeats").clone();
        let changes = sup.read(|st| judge(st, &hb, since, Instant::now(), cfg));
        for (host, liveness) in changes {
            tracing::info!(host = %host, liveness = ?liveness, "host liveness changes");
            if let Err(e) = sup.propose(Command::SetLiveness { host, liveness }).await {
                tracing::warn!(error = %e, "cannot commit liveness");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{NicSpec, Proposal};
    use openraft::{CommittedLeaderId, LogId};

    fn state(hosts: &[&str]) -> ClusterState {
        let mut st = ClusterState::default();
        for (i, h) in hosts.iter().enumerate() {
            let cmd = Command::RegisterHost {
                host: h.to_string(),
                nics: vec![NicSpec {
                    name: "rail0".into(),
                    rail: Some(0),
                    backup: None,
                    rdma_device: None,
                }],
                labels: Default::default(),
            };
            st.apply_proposal(
                &LogId::new(CommittedLeaderId::new(1, 1), i as u64 + 1),
                &Proposal {
                    at_ms: 1,
                    cmds: vec![cmd],
                },
            );
        }
        st
    }

    #[test]
    fn silent_host_goes_suspect_then_down() {
        let st = state(&["h0", "h1"]);
        let t0 = Instant::now();
        let cfg = LivenessConfig::default();
        let mut hb = HashMap::new();
        hb.insert("h0".to_string(), t0 + Duration::from_secs(2));
        let at = |s: f64| t0 + Duration::from_secs_f64(s);
        assert!(judge(&st, &hb, t0, at(1.0), cfg).is_empty());
        assert_eq!(
            judge(&st, &hb, t0, at(1.6), cfg),
            vec![("h1".into(), Liveness::Suspect)]
        );
        assert_eq!(
            judge(&st, &hb, t0, at(3.1), cfg),
            vec![("h1".into(), Liveness::Down)]
        );
    }

    #[test]
    fn new_leader_waits_a_grace_period() {
        let st = state(&["h0"]);
        let t0 = Instant::now();
        let cfg = LivenessConfig::default();
        // The old leader saw heartbeats long ago; this leader has seen none.
        let hb = HashMap::from([("h0".to_string(), t0)]);
        let became_leader = t0 + Duration::from_secs(60);
        assert!(judge(
            &st,
            &hb,
            became_leader,
            became_leader + Duration::from_millis(1400),
            cfg
        )
        .is_empty());
        assert_eq!(
            judge(
                &st,
                &hb,
                became_leader,
                became_leader + Duration::from_millis(2900),
                cfg
            ),
            vec![("h0".into(), Liveness::Suspect)]
        );
        assert_eq!(
            judge(
                &st,
                &hb,
                became_leader,
                became_leader + Duration::from_secs(3),
                cfg
            ),
            vec![("h0".into(), Liveness::Down)]
        );
    }

    #[test]
    fn heartbeat_brings_a_down_host_back() {
        let mut st = state(&["h0"]);
        st.hosts.get_mut("h0").unwrap().liveness = Liveness::Down;
        let t0 = Instant::now();
        let hb = HashMap::from([("h0".to_string(), t0 + Duration::from_secs(10))]);
        assert_eq!(
            judge(
                &st,
                &hb,
                t0,
                t0 + Duration::from_secs(10),
                LivenessConfig::default()
            ),
            vec![("h0".into(), Liveness::Ready)]
        );
        // No fresh heartbeat: a Down host stays Down (no flip to Suspect).
        assert!(judge(
            &st,
            &HashMap::new(),
            t0,
            t0 + Duration::from_secs(2),
            LivenessConfig::default()
        )
        .is_empty());
    }
}
