//! Membership in the admin history: one writer adds a spare supervisor to
//! the Raft membership and removes it again while the other clients read
//! `cluster members`; [`crate::linearizability::member::MemberModel`]
//! checks the history.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use supervisor::api::{AdminReply, AdminRequest, ErrorKind};
use supervisor::client::AdminClient;

use super::record::{common_outcome, object_op, Caller, Outcome, Recorder};
use crate::linearizability::member::{MemberOp, MemberResult};

/// A supervisor that runs (started with `--join`) but is not a member
/// when the load starts: the membership writer adds and removes it.
pub struct Spare {
    pub id: u64,
    pub addr: String,
    /// The writer's own client. Its timeout should exceed the
    /// supervisor's 6 s catch-up wait, so a slow add is answered, not
    /// timed out.
    pub client: AdminClient,
}

/// Most membership changes in a run (bounds the history).
const MAX_CHANGES: usize = 2_000;

/// One membership operation of `c` on supervisor `id` (at `addr`).
pub(super) async fn member_op(c: &Caller<'_>, id: u64, addr: &str, input: MemberOp) {
    let rec = c.rec;
    let request = match input {
        MemberOp::Add => AdminRequest::AddMember {
            id,
            addr: addr.to_string(),
        },
        MemberOp::Remove => AdminRequest::RemoveMember { id },
        MemberOp::Read => AdminRequest::ClusterMembers,
    };
    let what = format!("{input:?} of supervisor {id}");
    object_op(c, &rec.member_ops, input, request, |res| match res {
        Ok(AdminReply::Members { members }) => Outcome::Record(Some(MemberResult::Read(
            members.iter().any(|m| m.id == id && m.voter),
        ))),
        Ok(AdminReply::Committed { .. }) if input != MemberOp::Read => {
            Outcome::Record(Some(MemberResult::Ok))
        }
        // Not a member (remove), or a learner that did not catch up and
        // was taken back (add): nothing changed.
        Err(e) if e.kind == ErrorKind::NotFound && input == MemberOp::Remove => {
            Outcome::Record(Some(MemberResult::Refused))
        }
        Err(e) if e.kind == ErrorKind::FailedPrecondition && input == MemberOp::Add => {
            Outcome::Record(Some(MemberResult::Refused))
        }
        // openraft refused the change before writing it (another change
        // still in progress): not applied.
        Err(e) if e.kind == ErrorKind::FailedPrecondition && input == MemberOp::Remove => {
            Outcome::Skip
        }
        other => common_outcome(rec, other, input == MemberOp::Read, &what),
    })
    .await;
}

/// The membership writer: every 0.4–1.5 s it adds the spare, removes it,
/// or reads the membership (mostly the change that flips it; sometimes
/// the same change again, which must be idempotent or refused).
pub(super) async fn writer(
    spare: Spare,
    client_id: usize,
    rec: Arc<Recorder>,
    stop: Arc<AtomicBool>,
    start: Instant,
    seed: u64,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x6d65_6d62);
    let caller = Caller {
        id: client_id,
        client: &spare.client,
        rec: &rec,
        start,
    };
    let mut voter = false;
    for _ in 0..MAX_CHANGES {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(400..1500))).await;
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let flip = rng.gen_range(0..10) < 8;
        let input = match (voter, flip, rng.gen_range(0..10)) {
            (_, _, 0) => MemberOp::Read,
            (false, true, _) | (true, false, _) => MemberOp::Add,
            (true, true, _) | (false, false, _) => MemberOp::Remove,
        };
        member_op(&caller, spare.id, &spare.addr, input).await;
        // What the writer believes now (an unknown outcome: a read tells).
        let last = rec
            .member_ops
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|o| o.client == client_id)
            .cloned();
        if let Some(o) = last {
            voter = match (o.input, o.output) {
                (MemberOp::Add, Some(MemberResult::Ok)) => true,
                (MemberOp::Remove, Some(_)) => false,
                (MemberOp::Read, Some(MemberResult::Read(v))) => v,
                (_, _) => voter,
            };
        }
    }
}
