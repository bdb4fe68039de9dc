//! [`Replica`]: what this member's state machine holds — the replicated
//! [`ClusterState`] and, beside it, what only this member saw: when each
//! event was applied here (its wall clock, Unix ns). Snapshots carry the
//! model alone; the apply times are this process's and start empty after
//! a restart or a snapshot install.
//!
//! On the member that led when an event was committed, its apply time is
//! when it was committed and applied: `bench detect` reads it (through
//! `events --follow` served by the leader, checking that it led
//! throughout) instead of the moment the event reached a client. A
//! follower's times are its own applies; entries replayed at start-up get
//! the start-up time. This is the one place the state machine reads a
//! clock, and what it reads never enters the replicated model.

use std::collections::VecDeque;

use openraft::LogId;

use crate::model::command::{NodeId, Proposal, TypeConfig};
use crate::model::limits::MAX_EVENT_LOG;
use crate::model::result::CmdResult;
use crate::model::state::{ClusterState, MODEL_FORMAT_VERSION};

/// The replicated model and this member's apply times.
#[derive(Debug, Default)]
pub struct Replica {
    pub state: ClusterState,
    /// Per applied entry that logged events: its first and last event
    /// sequence and when it was applied. Oldest first, at most
    /// [`MAX_EVENT_LOG`] entries (the model keeps no more events).
    applied: VecDeque<(u64, u64, u64)>,
}

impl Replica {
    /// When the event `seq` was applied on this member, if it was applied
    /// since this process started (and is still among the newest).
    pub fn applied_unix_ns(&self, seq: u64) -> Option<u64> {
        let i = self.applied.partition_point(|(_, last, _)| *last < seq);
        self.applied
            .get(i)
            .filter(|(first, _, _)| *first <= seq)
            .map(|(_, _, ns)| *ns)
    }
}

/// This machine's wall clock, Unix ns.
pub fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

impl raft_store::StateModel<TypeConfig> for Replica {
    const FORMAT_VERSION: u8 = MODEL_FORMAT_VERSION;

    fn apply(&mut self, log_id: &LogId<NodeId>, data: &Proposal) -> Vec<CmdResult> {
        let before = self.state.next_event_seq;
        let results = self.state.apply_proposal(log_id, data);
        let after = self.state.next_event_seq;
        if after > before {
            self.applied.push_back((before + 1, after, unix_ns()));
            while self.applied.len() > MAX_EVENT_LOG {
                self.applied.pop_front();
            }
        }
        results
    }

    fn non_app_response(&mut self, log_id: &LogId<NodeId>) -> Vec<CmdResult> {
        <ClusterState as raft_store::StateModel<TypeConfig>>::non_app_response(
            &mut self.state,
            log_id,
        )
    }

    fn encode(&self) -> Result<Vec<u8>, String> {
        <ClusterState as raft_store::StateModel<TypeConfig>>::encode(&self.state)
    }

    fn decode(bytes: &[u8]) -> Result<Self, String> {
        Ok(Replica {
            state: <ClusterState as raft_store::StateModel<TypeConfig>>::decode(bytes)?,
            applied: VecDeque::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft_store::StateModel;

    #[test]
    fn apply_times_name_the_events_of_each_entry_and_only_those() {
        let r = Replica {
            applied: VecDeque::from([(3, 5, 100), (6, 6, 200), (9, 12, 300)]),
            ..Default::default()
        };
        assert_eq!(r.applied_unix_ns(2), None);
        assert_eq!(r.applied_unix_ns(3), Some(100));
        assert_eq!(r.applied_unix_ns(5), Some(100));
        assert_eq!(r.applied_unix_ns(6), Some(200));
        assert_eq!(
            r.applied_unix_ns(7),
            None,
            "logged before this process saw it"
        );
        assert_eq!(r.applied_unix_ns(12), Some(300));
        assert_eq!(r.applied_unix_ns(13), None);
    }

    #[test]
    fn applying_an_entry_that_logs_events_records_when() {
        let mut r = Replica::default();
        let cmd = crate::model::testkit::register_two_rails_for_test(0, "h0");
        let p = Proposal {
            cmds: vec![cmd],
            at_ms: 1,
        };
        let log_id = LogId::new(openraft::CommittedLeaderId::new(1, 1), 1);
        let t0 = unix_ns();
        let res = r.apply(&log_id, &p);
        assert!(res[0].is_ok(), "{res:?}");
        let last = r.state.next_event_seq;
        assert!(last > 0);
        let at = r.applied_unix_ns(last).expect("an apply time");
        assert!(at >= t0 && at <= unix_ns());
        // A snapshot carries the model, not the times.
        let back = Replica::decode(&r.encode().unwrap()).unwrap();
        assert_eq!(back.state, r.state);
        assert_eq!(back.applied_unix_ns(last), None);
    }
}
