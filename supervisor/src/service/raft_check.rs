//! Raft RPCs are checked here before openraft sees them. openraft trusts
//! its peers: a vote with term 2^64−1 makes its next election overflow,
//! and since votes are persisted the node would fail again at every
//! restart. So every term and log index that arrives from the wire must lie
//! below a bound no real cluster reaches ([`MAX_WIRE_TERM`] elections,
//! [`MAX_WIRE_INDEX`] entries), log ids must be consistent with the vote
//! that carries them, and the vote must be the sender's own: the leader or
//! candidate it names is the member its certificate names. A request that
//! fails is refused whole (`InvalidArgument`, or `PermissionDenied` for a
//! vote in another member's name) and nothing of it is stored. Answers
//! from peers are bounded the same way before openraft adopts their votes
//! (`append_answer`, `vote_answer`, `snapshot_answer`).

use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{LogId, Vote};

use crate::model::{NodeId, TypeConfig};

/// The largest term accepted from a peer: 2^48 elections, far beyond any
/// cluster's life (one election a millisecond for 8,900 years), far below
/// where `term + 1` overflows.
pub const MAX_WIRE_TERM: u64 = 1 << 48;

/// The largest log index accepted from a peer.
pub const MAX_WIRE_INDEX: u64 = 1 << 62;

/// The largest snapshot accepted from a peer (bytes): a chunk's offset
/// plus its length must stay below it. openraft writes each chunk at its
/// offset into a buffer in memory, so a chunk at offset 2^63 would ask for
/// that much; a snapshot of the model's bounded state is far smaller.
pub const MAX_WIRE_SNAPSHOT_BYTES: u64 = 1 << 30;

/// Why a Raft RPC was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RaftWireError {
    /// A term, index or log id no real peer sends.
    #[error("malformed Raft request: {0}")]
    Malformed(String),
    /// The vote names a member other than the sender's certificate.
    #[error(
        "a Raft vote in the name of member {named} sent with the certificate of member {sender}"
    )]
    Impersonation { named: NodeId, sender: NodeId },
}

fn check_vote(vote: &Vote<NodeId>, sender: Option<NodeId>) -> Result<(), RaftWireError> {
    let term = vote.leader_id.term;
    if term > MAX_WIRE_TERM {
        return Err(RaftWireError::Malformed(format!(
            "term {term} is above {MAX_WIRE_TERM}"
        )));
    }
    match sender {
        Some(s) if s != vote.leader_id.node_id => Err(RaftWireError::Impersonation {
            named: vote.leader_id.node_id,
            sender: s,
        }),
        _ => Ok(()),
    }
}

/// A log id within the bounds and not from a term after `vote`'s.
fn check_log_id(what: &str, id: &LogId<NodeId>, vote: &Vote<NodeId>) -> Result<(), RaftWireError> {
    let (term, index) = (id.leader_id.term, id.index);
    if index > MAX_WIRE_INDEX {
        return Err(RaftWireError::Malformed(format!(
            "{what}: index {index} is above {MAX_WIRE_INDEX}"
        )));
    }
    if term > vote.leader_id.term {
        return Err(RaftWireError::Malformed(format!(
            "{what}: term {term} is after the sender's term {}",
            vote.leader_id.term
        )));
    }
    Ok(())
}

/// Checks an AppendEntries request from `sender` (the certificate's
/// member; `None` on an insecure cluster): bounded vote, log ids within
/// the vote's term, entries consecutive after `prev_log_id` with terms
/// that never go down.
pub fn append(
    req: &AppendEntriesRequest<TypeConfig>,
    sender: Option<NodeId>,
) -> Result<(), RaftWireError> {
    check_vote(&req.vote, sender)?;
    if let Some(p) = &req.prev_log_id {
        check_log_id("prev_log_id", p, &req.vote)?;
    }
    if let Some(c) = &req.leader_commit {
        check_log_id("leader_commit", c, &req.vote)?;
    }
    let mut prev = req.prev_log_id;
    for e in &req.entries {
        check_log_id("entry", &e.log_id, &req.vote)?;
        if let Some(p) = prev {
            if e.log_id.index != p.index + 1 || e.log_id.leader_id < p.leader_id {
                return Err(RaftWireError::Malformed(format!(
                    "entry {} does not follow {}",
                    e.log_id, p
                )));
            }
        }
        prev = Some(e.log_id);
    }
    Ok(())
}

/// Checks a Vote request from `sender`.
pub fn vote(req: &VoteRequest<NodeId>, sender: Option<NodeId>) -> Result<(), RaftWireError> {
    check_vote(&req.vote, sender)?;
    if let Some(l) = &req.last_log_id {
        check_log_id("last_log_id", l, &req.vote)?;
    }
    Ok(())
}

/// Checks an InstallSnapshot request from `sender`.
pub fn snapshot(
    req: &InstallSnapshotRequest<TypeConfig>,
    sender: Option<NodeId>,
) -> Result<(), RaftWireError> {
    check_vote(&req.vote, sender)?;
    if let Some(l) = &req.meta.last_log_id {
        check_log_id("snapshot last_log_id", l, &req.vote)?;
    }
    if let Some(l) = req.meta.last_membership.log_id() {
        check_log_id("snapshot membership log id", l, &req.vote)?;
    }
    let end = req.offset.checked_add(req.data.len() as u64);
    if end.is_none_or(|end| end > MAX_WIRE_SNAPSHOT_BYTES) {
        return Err(RaftWireError::Malformed(format!(
            "snapshot chunk of {} bytes at offset {} ends past {MAX_WIRE_SNAPSHOT_BYTES}",
            req.data.len(),
            req.offset
        )));
    }
    Ok(())
}

/// A term or log id in a peer's answer within the bounds (an answer's
/// vote may be ahead of ours, but never beyond what a real cluster
/// reaches: openraft adopts and persists it).
fn check_bounds(
    vote: Option<&Vote<NodeId>>,
    id: Option<&LogId<NodeId>>,
) -> Result<(), RaftWireError> {
    if let Some(v) = vote {
        if v.leader_id.term > MAX_WIRE_TERM {
            return Err(RaftWireError::Malformed(format!(
                "answer with term {} above {MAX_WIRE_TERM}",
                v.leader_id.term
            )));
        }
    }
    if let Some(l) = id {
        if l.leader_id.term > MAX_WIRE_TERM || l.index > MAX_WIRE_INDEX {
            return Err(RaftWireError::Malformed(format!("answer with log id {l}")));
        }
    }
    Ok(())
}

/// Checks a peer's answer to AppendEntries before openraft sees it.
pub fn append_answer(r: &AppendEntriesResponse<NodeId>) -> Result<(), RaftWireError> {
    match r {
        AppendEntriesResponse::HigherVote(v) => check_bounds(Some(v), None),
        AppendEntriesResponse::PartialSuccess(l) => check_bounds(None, l.as_ref()),
        AppendEntriesResponse::Success | AppendEntriesResponse::Conflict => Ok(()),
    }
}

/// Checks a peer's answer to Vote.
pub fn vote_answer(r: &VoteResponse<NodeId>) -> Result<(), RaftWireError> {
    check_bounds(Some(&r.vote), r.last_log_id.as_ref())
}

/// Checks a peer's answer to InstallSnapshot.
pub fn snapshot_answer(r: &InstallSnapshotResponse<NodeId>) -> Result<(), RaftWireError> {
    check_bounds(Some(&r.vote), None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, Entry, EntryPayload};

    fn v(term: u64, node: NodeId) -> Vote<NodeId> {
        Vote::new_committed(term, node)
    }

    fn lid(term: u64, index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    fn entry(term: u64, index: u64) -> Entry<TypeConfig> {
        Entry {
            log_id: lid(term, index),
            payload: EntryPayload::Blank,
        }
    }

    fn append_req(
        vote: Vote<NodeId>,
        prev: Option<LogId<NodeId>>,
        entries: Vec<Entry<TypeConfig>>,
    ) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote,
            prev_log_id: prev,
            entries,
            leader_commit: prev,
        }
    }

    #[test]
    fn ordinary_requests_pass() {
        let r = append_req(v(5, 1), Some(lid(4, 10)), vec![entry(4, 11), entry(5, 12)]);
        assert_eq!(append(&r, Some(1)), Ok(()));
        assert_eq!(
            append(&append_req(v(1, 1), None, vec![entry(1, 0)]), None),
            Ok(())
        );
        let vr = VoteRequest::new(v(7, 2), Some(lid(6, 100)));
        assert_eq!(vote(&vr, Some(2)), Ok(()));
    }

    #[test]
    fn hostile_terms_indexes_and_orders_are_refused() {
        let huge = VoteRequest::new(v(u64::MAX, 1), None);
        assert!(matches!(
            vote(&huge, Some(1)),
            Err(RaftWireError::Malformed(_))
        ));
        let edge = VoteRequest::new(v(MAX_WIRE_TERM + 1, 1), None);
        assert!(vote(&edge, None).is_err());
        let ok_edge = VoteRequest::new(v(MAX_WIRE_TERM, 1), None);
        assert!(vote(&ok_edge, None).is_ok());
        let future_log = VoteRequest::new(v(3, 1), Some(lid(4, 1)));
        assert!(vote(&future_log, None).is_err());
        let big_index = append_req(v(3, 1), Some(lid(3, u64::MAX)), vec![]);
        assert!(append(&big_index, None).is_err());
        let gap = append_req(v(3, 1), Some(lid(3, 10)), vec![entry(3, 12)]);
        assert!(append(&gap, None).is_err());
        let back = append_req(v(3, 1), Some(lid(3, 10)), vec![entry(2, 11)]);
        assert!(append(&back, None).is_err());
        let ahead = append_req(v(3, 1), None, vec![entry(9, 0)]);
        assert!(append(&ahead, None).is_err());
    }

    #[test]
    fn snapshot_chunks_past_the_size_bound_are_refused() {
        let chunk = |offset: u64, len: usize| InstallSnapshotRequest::<TypeConfig> {
            vote: v(3, 1),
            meta: Default::default(),
            offset,
            data: vec![0; len],
            done: false,
        };
        assert_eq!(snapshot(&chunk(0, 1024), Some(1)), Ok(()));
        assert_eq!(
            snapshot(&chunk(MAX_WIRE_SNAPSHOT_BYTES - 1024, 1024), Some(1)),
            Ok(())
        );
        for (offset, len) in [
            (MAX_WIRE_SNAPSHOT_BYTES - 1023, 1024),
            (1 << 63, 0),
            (u64::MAX, 1),
        ] {
            let e = snapshot(&chunk(offset, len), Some(1)).unwrap_err();
            assert!(e.to_string().contains("ends past"), "{offset}: {e}");
        }
    }

    #[test]
    fn hostile_answers_are_refused() {
        let huge = VoteResponse {
            vote: v(u64::MAX, 2),
            vote_granted: false,
            last_log_id: None,
        };
        assert!(vote_answer(&huge).is_err());
        assert!(append_answer(&AppendEntriesResponse::HigherVote(v(u64::MAX, 2))).is_err());
        assert!(
            append_answer(&AppendEntriesResponse::PartialSuccess(Some(lid(
                1,
                u64::MAX
            ))))
            .is_err()
        );
        assert!(snapshot_answer(&InstallSnapshotResponse {
            vote: v(u64::MAX, 2)
        })
        .is_err());
        let fine = VoteResponse {
            vote: v(9, 2),
            vote_granted: true,
            last_log_id: Some(lid(8, 100)),
        };
        assert!(vote_answer(&fine).is_ok());
        assert!(append_answer(&AppendEntriesResponse::HigherVote(v(9, 2))).is_ok());
        assert!(append_answer(&AppendEntriesResponse::Success).is_ok());
    }

    #[test]
    fn a_vote_in_another_members_name_is_impersonation() {
        let r = VoteRequest::new(v(3, 2), None);
        assert_eq!(
            vote(&r, Some(1)),
            Err(RaftWireError::Impersonation {
                named: 2,
                sender: 1
            })
        );
        assert!(append(&append_req(v(3, 2), None, vec![]), Some(1)).is_err());
    }
}
