//! What the admin-history clients record: the histories of every object
//! ([`Recorder`]), and the one way an operation is called and put in its
//! history ([`object_op`]).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use supervisor::api::{AdminReply, AdminRequest, ErrorKind};
use supervisor::client::AdminClient;

use crate::linearizability::job::{JobOp as LinJobOp, JobResult};
use crate::linearizability::member::{MemberOp, MemberResult};
use crate::linearizability::playbook::{PbOp, PbResult};
use crate::linearizability::{HostOp, HostResult, Operation};

/// The job names the clients submit, cancel and show (never placed).
pub const JOBS: [&str; 2] = ["lin-job0", "lin-job1"];

/// The playbooks the clients apply, delete and show (never triggered:
/// they have no trigger).
pub const PLAYBOOKS: [&str; 2] = ["lin-pb0", "lin-pb1"];

pub(super) type Op = Operation<HostOp, HostResult>;

#[derive(Default)]
pub(super) struct Recorder {
    /// Per host index: its history.
    pub(super) ops: Vec<Mutex<Vec<Op>>>,
    /// Completion times (ms since start) of successful operations.
    pub(super) successes: Mutex<Vec<u64>>,
    pub(super) unexpected: Mutex<Vec<String>>,
    /// (host, client key, value) of every acknowledged label write.
    pub(super) acked_labels: Mutex<Vec<(usize, String, u64)>>,
    /// Why outcomes were unknown (message prefix -> count), for diagnosis.
    pub(super) unknown_causes: Mutex<BTreeMap<String, usize>>,
    /// Per playbook of [`PLAYBOOKS`]: its history.
    pub(super) pb_ops: [Mutex<Vec<Operation<PbOp, PbResult>>>; PLAYBOOKS.len()],
    /// Per job name of [`JOBS`]: its history.
    pub(super) job_ops: [Mutex<Vec<Operation<LinJobOp, JobResult>>>; JOBS.len()],
    /// Whether clients fail NICs over and back (else those rolls write
    /// labels).
    pub(super) failovers: bool,
    /// The spare supervisor's membership history (empty without one).
    pub(super) member_ops: Mutex<Vec<Operation<MemberOp, MemberResult>>>,
    /// The spare's id, when the clients read the membership too.
    pub(super) spare: Option<u64>,
}

/// What a reply means for an object's history.
pub(super) enum Outcome<O> {
    /// Part of the history: the output (`None`: unknown, it may have
    /// taken effect).
    Record(Option<O>),
    /// Definitely not applied (or a read that saw nothing): left out.
    Skip,
}

/// The shared part of a playbook or job reply: unknown outcomes, skips,
/// unexpected replies (recorded).
pub(super) fn common_outcome<O>(
    rec: &Recorder,
    res: Result<AdminReply, supervisor::api::ApiError>,
    is_read: bool,
    what: &str,
) -> Outcome<O> {
    match res {
        Ok(other) => {
            rec.unexpected
                .lock()
                .unwrap()
                .push(format!("unexpected reply {other:?}"));
            Outcome::Skip
        }
        Err(e) if e.kind == ErrorKind::Unavailable || is_read => Outcome::Skip,
        Err(e) if matches!(e.kind, ErrorKind::Unknown | ErrorKind::Internal) => {
            let key: String = e.message.chars().take(90).collect();
            *rec.unknown_causes.lock().unwrap().entry(key).or_insert(0) += 1;
            Outcome::Record(None)
        }
        Err(e) => {
            rec.unexpected.lock().unwrap().push(format!("{what}: {e}"));
            Outcome::Skip
        }
    }
}

/// A client making a call: who, through what, recorded where.
pub(super) struct Caller<'a> {
    pub(super) id: usize,
    pub(super) client: &'a AdminClient,
    pub(super) rec: &'a Recorder,
    pub(super) start: Instant,
}

/// Calls `request` for the caller and records the operation in `ops` as
/// `outcome` reads the reply.
pub(super) async fn object_op<I, O>(
    c: &Caller<'_>,
    ops: &Mutex<Vec<Operation<I, O>>>,
    input: I,
    request: AdminRequest,
    outcome: impl FnOnce(Result<AdminReply, supervisor::api::ApiError>) -> Outcome<O>,
) {
    let call = ns_since(c.start);
    let res = c.client.call(request, false).await;
    let ret = ns_since(c.start);
    let output = match outcome(res) {
        Outcome::Record(o) => o,
        Outcome::Skip => {
            tokio::time::sleep(Duration::from_millis(20)).await;
            return;
        }
    };
    if output.is_some() {
        c.rec.successes.lock().unwrap().push(ret / 1_000_000);
    }
    ops.lock().unwrap().push(Operation {
        client: c.id,
        input,
        call,
        ret: output.as_ref().map(|_| ret),
        output,
    });
}

pub(super) fn ns_since(start: Instant) -> u64 {
    start.elapsed().as_nanos() as u64
}
