//! Host liveness on the leader: Ready → Suspect → Down from missed
//! heartbeats and probe evidence (defaults: heartbeats every 250 ms,
//! Suspect after 750 ms of silence, Down after 1.2 s; 3 s for a host this
//! leader has no probe evidence of at all, whose heartbeats alone decide).
//!
//! Suspect follows management-network silence alone (no heartbeat). Down
//! needs two silences: no heartbeat *and* no probe evidence (no peer
//! received this host's probes, see [`crate::leader::clock`]) for the Down period,
//! so a management-network partition alone never kills a host's jobs.
//! Probe evidence arrives with every peer's heartbeat (how long ago the
//! peer last received each host's probes) and with its per-second probe
//! summary; it is dated by when the probes arrived, not by when the
//! report did, so the one-second summary period does not delay a Down.
//!
//! Heartbeats and probe evidence live only in the leader's memory. A new
//! leader has seen none, and agents need a moment to find it: it declares
//! no host Suspect or Down for an election grace (3 s) after taking over,
//! and counts every host's silence from the moment it became leader. A
//! registration counts as a heartbeat (the agent service records it before
//! committing), so a host that registers on a long-standing leader is
//! silent from its registration, not from the election. A leader whose own
//! loop stalled (a tick over 300 ms late: CPU starvation, a paused
//! process) holds its judgement for 500 ms, so heartbeats queued during the
//! stall are read before anyone is found silent. Changes are committed
//! through Raft (`SetLiveness`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::leader::clock::ClockService;
use crate::model::{ClusterState, Command, Liveness};
use crate::node::Supervisor;

/// Leader memory: when each host last sent a heartbeat (not replicated).
pub type Heartbeats = std::sync::Mutex<HashMap<String, Instant>>;

/// Liveness thresholds.
#[derive(Debug, Clone, Copy)]
pub struct LivenessConfig {
    pub suspect_after: Duration,
    pub down_after: Duration,
    /// Down for a host this leader has no probe evidence of at all (its
    /// probes off, or no probe peers): heartbeat silence alone decides, so
    /// it must last longer.
    pub down_after_unprobed: Duration,
    /// A new leader judges no host Suspect or Down before this.
    pub election_grace: Duration,
}

impl Default for LivenessConfig {
    fn default() -> Self {
        Self {
            suspect_after: Duration::from_millis(750),
            down_after: Duration::from_millis(1200),
            down_after_unprobed: Duration::from_secs(3),
            election_grace: Duration::from_secs(3),
        }
    }
}

/// A liveness tick this late (after its period) means the leader itself
/// stalled.
const STALLED_TICK: Duration = Duration::from_millis(300);
/// How long a stalled leader holds its judgement after the stall.
const STALL_HOLD: Duration = Duration::from_millis(500);

/// What each host's liveness should be now. Pure, for tests.
///
/// `heartbeats`: when each host last sent a heartbeat; `probe_evidence`:
/// when a peer last reported receiving its probes. Both count from
/// `leader_since` at the earliest (older evidence is none: the grace rule).
pub fn judge(
    st: &ClusterState,
    heartbeats: &HashMap<String, Instant>,
    probe_evidence: &HashMap<String, Instant>,
    leader_since: Instant,
    now: Instant,
    cfg: LivenessConfig,
) -> Vec<(String, Liveness)> {
    let silence = |m: &HashMap<String, Instant>, host: &str| {
        let last = m
            .get(host)
            .copied()
            .unwrap_or(leader_since)
            .max(leader_since);
        now.saturating_duration_since(last)
    };
    let settled = now.saturating_duration_since(leader_since) >= cfg.election_grace;
    st.hosts
        .values()
        .filter_map(|h| {
            let silent = silence(heartbeats, &h.name);
            let unheard = silence(probe_evidence, &h.name);
            let probed = probe_evidence
                .get(&h.name)
                .is_some_and(|t| *t >= leader_since);
            let down_after = if probed {
                cfg.down_after
            } else {
                cfg.down_after_unprobed
            };
            let want = if !settled && silent >= cfg.suspect_after {
                // Too soon after the election to judge a silence.
                h.liveness
            } else if silent >= down_after && unheard >= down_after {
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

/// The liveness loop's period.
const TICK: Duration = Duration::from_millis(100);

/// Runs on every supervisor; acts while it leads.
pub async fn run(
    sup: Arc<Supervisor>,
    heartbeats: Arc<Heartbeats>,
    clocks: Arc<ClockService>,
    cfg: LivenessConfig,
) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut leader_since: Option<(u64, Instant)> = None;
    // When the previous pass ended: a tick that comes more than a period
    // plus STALLED_TICK after it found this process stalled (time spent in
    // the pass itself, committing changes, does not count).
    let mut pass_end = Instant::now();
    let mut hold_until: Option<Instant> = None;
    loop {
        tick.tick().await;
        let now = Instant::now();
        let late = now.saturating_duration_since(pass_end).saturating_sub(TICK);
        if late >= STALLED_TICK {
            tracing::warn!(
                late_ms = late.as_millis() as u64,
                "liveness: this supervisor stalled; holding judgement"
            );
            hold_until = Some(now + STALL_HOLD);
        }
        if hold_until.is_none_or(|t| now >= t) {
            pass(&sup, &heartbeats, &clocks, cfg, &mut leader_since).await;
        }
        pass_end = Instant::now();
    }
}

/// One pass of the loop: judges every host and commits the changes, while
/// this supervisor leads.
async fn pass(
    sup: &Supervisor,
    heartbeats: &Heartbeats,
    clocks: &ClockService,
    cfg: LivenessConfig,
    leader_since: &mut Option<(u64, Instant)>,
) {
    if !sup.leads() {
        *leader_since = None;
        return;
    }
    let term = sup.raft.metrics().borrow().current_term;
    let since = match *leader_since {
        Some((t, at)) if t == term => at,
        _ => {
            let now = Instant::now();
            *leader_since = Some((term, now));
            tracing::info!(
                term,
                grace_ms = cfg.election_grace.as_millis() as u64,
                "leader: liveness grace period starts"
            );
            now
        }
    };
    let hb = heartbeats.lock().expect("heartbeats").clone();
    let evidence = clocks.probe_evidence();
    let changes = sup.read(|st| judge(st, &hb, &evidence, since, Instant::now(), cfg));
    for (host, liveness) in changes {
        tracing::info!(host = %host, liveness = ?liveness, "host liveness changes");
        if let Err(e) = sup.propose(Command::SetLiveness { host, liveness }).await {
            tracing::warn!(error = %e, "cannot commit liveness");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::testkit::apply_for_test;
    use crate::model::NicSpec;

    fn state(hosts: &[&str]) -> ClusterState {
        let mut st = ClusterState::default();
        for (i, h) in hosts.iter().enumerate() {
            let cmd = Command::RegisterHost {
                host: h.to_string(),
                nics: vec![NicSpec::named("rail0").on_rail(0)],
                labels: Default::default(),
            };
            apply_for_test(&mut st, i as u64 + 1, 1, vec![cmd]);
        }
        st
    }

    fn at(t0: Instant, s: f64) -> Instant {
        t0 + Duration::from_secs_f64(s)
    }

    /// A leader that took over long before `t0` (past its grace).
    fn settled(t0: Instant) -> Instant {
        t0.checked_sub(Duration::from_secs(10))
            .expect("Instant can go back 10 s (the machine has been up longer)")
    }

    #[test]
    fn silent_host_goes_suspect_then_down() {
        let st = state(&["h0", "h1"]);
        let t0 = Instant::now();
        let since = settled(t0);
        let cfg = LivenessConfig::default();
        // h1's probes were last heard when its heartbeats stopped.
        let heard = HashMap::from([("h1".to_string(), t0)]);
        let hb = HashMap::from([("h0".to_string(), at(t0, 2.0)), ("h1".to_string(), t0)]);
        assert!(judge(&st, &hb, &heard, since, at(t0, 0.7), cfg).is_empty());
        assert_eq!(
            judge(&st, &hb, &heard, since, at(t0, 0.75), cfg),
            vec![("h1".into(), Liveness::Suspect)]
        );
        assert_eq!(
            judge(&st, &hb, &heard, since, at(t0, 1.19), cfg),
            vec![("h1".into(), Liveness::Suspect)]
        );
        assert_eq!(
            judge(&st, &hb, &heard, since, at(t0, 1.2), cfg),
            vec![("h1".into(), Liveness::Down)]
        );
    }

    #[test]
    fn a_host_without_probe_evidence_is_down_after_the_longer_silence() {
        // Probes off (or no probe peers): heartbeats alone decide, so one
        // slow heartbeat reply must not be enough.
        let st = state(&["h0"]);
        let t0 = Instant::now();
        let since = settled(t0);
        let cfg = LivenessConfig::default();
        let none = HashMap::new();
        let hb = HashMap::from([("h0".to_string(), t0)]);
        assert_eq!(
            judge(&st, &hb, &none, since, at(t0, 1.2), cfg),
            vec![("h0".into(), Liveness::Suspect)]
        );
        assert_eq!(
            judge(&st, &hb, &none, since, at(t0, 2.99), cfg),
            vec![("h0".into(), Liveness::Suspect)]
        );
        assert_eq!(
            judge(&st, &hb, &none, since, at(t0, 3.0), cfg),
            vec![("h0".into(), Liveness::Down)]
        );
    }

    #[test]
    fn a_host_heard_by_its_peers_stays_suspect_until_they_stop_hearing_it() {
        let mut st = state(&["h0"]);
        let t0 = Instant::now();
        let since = settled(t0);
        let cfg = LivenessConfig::default();
        // Management silence from t0; peers' heartbeats keep saying they
        // received its probes (every 250 ms, each up to 200 ms old) until
        // t = 10 s.
        let hb = HashMap::from([("h0".to_string(), t0)]);
        for q in 4..=40 {
            let s = f64::from(q) * 0.25;
            let evidence = HashMap::from([("h0".to_string(), at(t0, s - 0.2))]);
            let now = at(t0, s + 0.2);
            let want = judge(&st, &hb, &evidence, since, now, cfg);
            if q == 4 {
                assert_eq!(want, vec![("h0".into(), Liveness::Suspect)]);
                st.hosts.get_mut("h0").unwrap().liveness = Liveness::Suspect;
            } else {
                assert!(want.is_empty(), "t={s}: never Down while heard: {want:?}");
            }
        }
        // Peers stop hearing it at t = 9.8 s: Down once both silences reach
        // the threshold.
        let evidence = HashMap::from([("h0".to_string(), at(t0, 9.8))]);
        assert!(judge(&st, &hb, &evidence, since, at(t0, 10.99), cfg).is_empty());
        assert_eq!(
            judge(&st, &hb, &evidence, since, at(t0, 11.0), cfg),
            vec![("h0".into(), Liveness::Down)]
        );
    }

    #[test]
    fn probe_evidence_alone_keeps_a_suspect_host_from_ready() {
        // Evidence without heartbeats never makes a host Ready again.
        let mut st = state(&["h0"]);
        st.hosts.get_mut("h0").unwrap().liveness = Liveness::Suspect;
        let t0 = Instant::now();
        let evidence = HashMap::from([("h0".to_string(), at(t0, 5.0))]);
        let hb = HashMap::from([("h0".to_string(), t0)]);
        assert!(judge(
            &st,
            &hb,
            &evidence,
            t0,
            at(t0, 5.0),
            LivenessConfig::default()
        )
        .is_empty());
    }

    #[test]
    fn new_leader_waits_a_grace_period() {
        let st = state(&["h0"]);
        let t0 = Instant::now();
        let cfg = LivenessConfig::default();
        // The old leader saw heartbeats and probe evidence long ago; this
        // leader has seen neither, and agents are still looking for it.
        let hb = HashMap::from([("h0".to_string(), t0)]);
        let evidence = HashMap::from([("h0".to_string(), t0)]);
        let became_leader = t0 + Duration::from_secs(60);
        let after = |ms| became_leader + Duration::from_millis(ms);
        for ms in [800, 1400, 2999] {
            assert!(
                judge(&st, &hb, &evidence, became_leader, after(ms), cfg).is_empty(),
                "{ms} ms after the election"
            );
        }
        assert_eq!(
            judge(&st, &hb, &evidence, became_leader, after(3000), cfg),
            vec![("h0".into(), Liveness::Down)]
        );
        // Evidence this leader received pushes Down out from there.
        let fresh = HashMap::from([("h0".to_string(), after(2000))]);
        assert_eq!(
            judge(&st, &hb, &fresh, became_leader, after(3000), cfg),
            vec![("h0".into(), Liveness::Suspect)]
        );
        assert_eq!(
            judge(&st, &hb, &fresh, became_leader, after(3200), cfg),
            vec![("h0".into(), Liveness::Down)]
        );
    }

    #[test]
    fn heartbeat_brings_a_down_host_back() {
        let mut st = state(&["h0"]);
        st.hosts.get_mut("h0").unwrap().liveness = Liveness::Down;
        let t0 = Instant::now();
        let cfg = LivenessConfig::default();
        let none = HashMap::new();
        let hb = HashMap::from([("h0".to_string(), t0 + Duration::from_secs(10))]);
        assert_eq!(
            judge(&st, &hb, &none, t0, t0 + Duration::from_secs(10), cfg),
            vec![("h0".into(), Liveness::Ready)]
        );
        // No fresh heartbeat: a Down host stays Down (no flip to Suspect),
        // even if its probes are heard again (a leader past its grace).
        let evidence = HashMap::from([("h0".to_string(), t0 + Duration::from_secs(2))]);
        assert!(judge(
            &st,
            &HashMap::new(),
            &evidence,
            settled(t0),
            t0 + Duration::from_secs(2),
            cfg
        )
        .is_empty());
    }
}
