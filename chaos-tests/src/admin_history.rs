//! Scenarios over the admin API under supervisor crashes: `leader-kill`
//! (SIGKILL the current leader every round, restart it later) and
//! `cluster-crash` (SIGKILL every supervisor at once, restart them all).
//!
//! Clients issue concurrent cordon/uncordon/drain/undrain/label writes, NIC
//! failovers and failbacks, playbook applies and deletes, job submits and
//! cancels, and linearizable reads against random supervisors (followers forward to the
//! leader). Every operation is recorded with call and return times; at the
//! end the checkers decide:
//! - [`check_durability`]: every acknowledged label write is present in the
//!   final state (invariant "acknowledged admin operations survive");
//! - [`crate::linearizability`]: the whole history, per host, per
//!   playbook and per job name, is linearizable; so is the membership's,
//!   when a spare supervisor is added and removed meanwhile ([`Spare`]:
//!   `leader-kill`, `cluster-crash` and `pause-leader` have one).
//!
//! Files: `record` (the histories and how an operation is recorded),
//! `members` (the membership writer and reads).

mod members;
mod record;

pub use members::Spare;
pub use record::{JOBS, PLAYBOOKS};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use supervisor::api::{AdminReply, AdminRequest, ErrorKind};
use supervisor::client::AdminClient;
use supervisor::model::{AdminOp, Host};

use crate::linearizability::host::NICS;
use crate::linearizability::job::{JobModel, JobOp as LinJobOp, JobResult};
use crate::linearizability::member::{MemberModel, MemberOp, MemberResult};
use crate::linearizability::playbook::{PbOp, PbResult, PlaybookModel};
use crate::linearizability::{
    check_with, HostModel, HostOp, HostResult, HostView, Limits, Operation, Verdict, MAX_FRONTIER,
};
use record::{common_outcome, ns_since, object_op, Caller, Outcome, Recorder};
use testbed::cluster::SupervisorCluster;

/// Step budget of the linearizability search, per host.
pub const CHECK_BUDGET: u64 = 50_000_000;
/// Bounds of the linearizability check of one host's history.
pub const CHECK_LIMITS: Limits = Limits {
    max_steps: CHECK_BUDGET,
    max_frontier: MAX_FRONTIER,
};
/// Most operations one client issues in a run (bounds the history).
pub const MAX_OPS_PER_CLIENT: usize = 20_000;

/// What a run should do.
#[derive(Debug, Clone)]
pub struct HistoryRun {
    pub rounds: usize,
    pub hosts: usize,
    pub clients: usize,
    /// Kill every supervisor at once each round instead of the leader only.
    pub whole_cluster: bool,
    /// Load time before each kill.
    pub load_per_round: Duration,
    pub seed: u64,
    /// Pause the leader (SIGSTOP) this long and resume it (SIGCONT)
    /// instead of killing it: it wakes up believing it leads.
    pub pause: Option<Duration>,
}

/// The figures a run reports (last line of output).
#[derive(Debug, Clone, Serialize)]
pub struct HistoryReport {
    pub ok: bool,
    pub scenario: String,
    pub rounds: usize,
    pub kills: usize,
    pub acked_ops: usize,
    pub refused_ops: usize,
    pub unknown_ops: usize,
    pub reads: usize,
    pub lost_ops: usize,
    pub linearizable: bool,
    pub linearizability: String,
    /// Time the linearizability checks took, all hosts.
    pub check_ms: u64,
    pub unexpected_errors: usize,
    pub max_unavailable_ms: u64,
    /// Acknowledged additions and removals of the spare supervisor.
    pub member_changes: usize,
}

/// One playbook operation.
async fn playbook_op(c: &Caller<'_>, pi: usize, input: PbOp) {
    let rec = c.rec;
    let name = PLAYBOOKS[pi].to_string();
    let request = match &input {
        PbOp::Apply(v) => AdminRequest::Write {
            op: AdminOp::PlaybookApply {
                files: vec![supervisor::model::playbook_store::PlaybookFile {
                    file: format!("{name}.toml"),
                    text: crate::linearizability::playbook::text(&name, *v),
                }],
            },
        },
        PbOp::Delete => AdminRequest::Write {
            op: AdminOp::PlaybookDelete { name: name.clone() },
        },
        PbOp::Read => AdminRequest::PlaybookShow { name: name.clone() },
    };
    let what = format!("{input:?} on playbook {name}");
    let is_read = input == PbOp::Read;
    let is_delete = input == PbOp::Delete;
    object_op(c, &rec.pb_ops[pi], input, request, |res| match res {
        Ok(AdminReply::Playbook { playbook }) => Outcome::Record(Some(PbResult::Read(
            crate::linearizability::playbook::value_of(&playbook.source),
        ))),
        Ok(AdminReply::Committed { .. }) => Outcome::Record(Some(PbResult::Ok)),
        Err(e) if e.kind == ErrorKind::NotFound && is_read => {
            Outcome::Record(Some(PbResult::Read(None)))
        }
        Err(e) if e.kind == ErrorKind::NotFound && is_delete => {
            Outcome::Record(Some(PbResult::Refused))
        }
        other => common_outcome(rec, other, is_read, &what),
    })
    .await;
}

/// One job operation.
async fn job_op(c: &Caller<'_>, ji: usize, input: LinJobOp) {
    let rec = c.rec;
    use crate::linearizability::job;
    let name = JOBS[ji].to_string();
    let request = match &input {
        LinJobOp::Submit(v) => AdminRequest::Write {
            op: AdminOp::Job(supervisor::model::JobOp::Submit {
                spec: job::spec(&name, *v),
            }),
        },
        LinJobOp::Cancel => AdminRequest::Write {
            op: AdminOp::Job(supervisor::model::JobOp::Cancel { job: name.clone() }),
        },
        LinJobOp::Read => AdminRequest::JobShow { job: name.clone() },
    };
    let what = format!("{input:?} on job {name}");
    let is_read = input == LinJobOp::Read;
    object_op(c, &rec.job_ops[ji], input, request, |res| match res {
        Ok(AdminReply::Job { job, .. }) => {
            Outcome::Record(Some(JobResult::Read(job::observe(&job))))
        }
        Ok(AdminReply::Committed { .. }) => Outcome::Record(Some(JobResult::Ok)),
        Err(e) if e.kind == ErrorKind::NotFound && is_read => {
            Outcome::Record(Some(JobResult::Read(None)))
        }
        Err(e)
            if matches!(e.kind, ErrorKind::NotFound | ErrorKind::FailedPrecondition)
                && !is_read =>
        {
            Outcome::Record(Some(JobResult::Refused))
        }
        other => common_outcome(rec, other, is_read, &what),
    })
    .await;
}

/// Projects a host onto what the model observes.
pub fn view(h: &Host) -> HostView {
    HostView {
        cordoned: h.cordoned,
        draining: h.drain.is_some(),
        labels: h
            .labels
            .iter()
            .filter(|(k, _)| k.starts_with('c'))
            .filter_map(|(k, v)| v.parse().ok().map(|v| (k.clone(), v)))
            .collect(),
        held: h
            .nics
            .values()
            .filter(|n| n.held_out.is_some())
            .map(|n| n.name.clone())
            .collect(),
    }
}

async fn client_loop(
    id: usize,
    client: AdminClient,
    hosts: Arc<Vec<String>>,
    rec: Arc<Recorder>,
    stop: Arc<AtomicBool>,
    start: Instant,
    seed: u64,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (id as u64).wrapping_mul(0x9e37_79b9));
    let key = format!("c{id}");
    let mut next_value = 0u64;
    let caller = Caller {
        id,
        client: &client,
        rec: &rec,
        start,
    };
    for _ in 0..MAX_OPS_PER_CLIENT {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let hi = rng.gen_range(0..hosts.len());
        let host = hosts[hi].clone();
        let roll = rng.gen_range(0..100);
        if let (Some(spare), 89..=90) = (rec.spare, roll) {
            // Reads only: the address is not used.
            members::member_op(&caller, spare, "", MemberOp::Read).await;
            continue;
        }
        if (81..=88).contains(&roll) {
            // Jobs: every submit carries a value of its own.
            let ji = rng.gen_range(0..JOBS.len());
            let input = match rng.gen_range(0..3) {
                0 => {
                    next_value += 1;
                    LinJobOp::Submit((id as u64) << 32 | next_value)
                }
                1 => LinJobOp::Cancel,
                _ => LinJobOp::Read,
            };
            job_op(&caller, ji, input).await;
            continue;
        }
        if (71..=80).contains(&roll) {
            // Playbooks: every apply writes a value of its own.
            let pi = rng.gen_range(0..PLAYBOOKS.len());
            let input = match rng.gen_range(0..4) {
                0 | 1 => {
                    next_value += 1;
                    PbOp::Apply((id as u64) << 32 | next_value)
                }
                2 => PbOp::Delete,
                _ => PbOp::Read,
            };
            playbook_op(&caller, pi, input).await;
            continue;
        }
        let nic = NICS[rng.gen_range(0..NICS.len())].to_string();
        let input = match roll {
            0..=11 => HostOp::Cordon,
            12..=23 => HostOp::Uncordon,
            24..=30 => HostOp::Drain,
            31..=37 => HostOp::Undrain,
            38..=43 if rec.failovers => HostOp::Failover(nic),
            44..=49 if rec.failovers => HostOp::Failback(nic),
            38..=70 => {
                next_value += 1;
                HostOp::SetLabel(key.clone(), next_value)
            }
            _ => HostOp::Read,
        };
        let request = match &input {
            HostOp::Cordon => AdminRequest::Write {
                op: AdminOp::Cordon { host: host.clone() },
            },
            HostOp::Uncordon => AdminRequest::Write {
                op: AdminOp::Uncordon { host: host.clone() },
            },
            HostOp::Drain => AdminRequest::Write {
                op: AdminOp::Drain {
                    host: host.clone(),
                    reason: format!("chaos client {id}"),
                    deadline_ms: None,
                },
            },
            HostOp::Undrain => AdminRequest::Write {
                op: AdminOp::Undrain { host: host.clone() },
            },
            HostOp::SetLabel(k, v) => AdminRequest::Write {
                op: AdminOp::SetLabels {
                    host: host.clone(),
                    set: BTreeMap::from([(k.clone(), v.to_string())]),
                    remove: vec![],
                },
            },
            HostOp::Failover(nic) => AdminRequest::Write {
                op: AdminOp::NicFailover {
                    host: host.clone(),
                    nic: nic.clone(),
                    to: None,
                },
            },
            HostOp::Failback(nic) => AdminRequest::Write {
                op: AdminOp::NicFailback {
                    host: host.clone(),
                    nic: nic.clone(),
                },
            },
            HostOp::Read => AdminRequest::NodeShow { host: host.clone() },
        };
        let call = ns_since(start);
        let res = client.call(request, false).await;
        let ret = ns_since(start);
        let (output, ret) = match res {
            Ok(AdminReply::Host { host, .. }) => (Some(HostResult::Read(view(&host))), Some(ret)),
            // A failover or failback answers with the intent it opened.
            Ok(AdminReply::Committed { .. } | AdminReply::IntentOpened { .. }) => {
                (Some(HostResult::Ok), Some(ret))
            }
            Ok(other) => {
                rec.unexpected
                    .lock()
                    .unwrap()
                    .push(format!("unexpected reply {other:?}"));
                continue;
            }
            Err(e)
                if e.kind == ErrorKind::FailedPrecondition
                    && matches!(input, HostOp::Uncordon | HostOp::Failover(_)) =>
            {
                (Some(HostResult::Refused), Some(ret))
            }
            // Definitely not applied (or a read that saw nothing): not part of the history.
            Err(e) if e.kind == ErrorKind::Unavailable || input == HostOp::Read => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            Err(e) if matches!(e.kind, ErrorKind::Unknown | ErrorKind::Internal) => {
                let key: String = e.message.chars().take(90).collect();
                *rec.unknown_causes.lock().unwrap().entry(key).or_insert(0) += 1;
                (None, None)
            }
            Err(e) => {
                rec.unexpected
                    .lock()
                    .unwrap()
                    .push(format!("{input:?} on {host}: {e}"));
                continue;
            }
        };
        if output.is_some() {
            rec.successes
                .lock()
                .unwrap()
                .push(ret.unwrap_or(0) / 1_000_000);
        }
        if let (HostOp::SetLabel(k, v), Some(HostResult::Ok)) = (&input, &output) {
            rec.acked_labels.lock().unwrap().push((hi, k.clone(), *v));
        }
        rec.ops[hi].lock().unwrap().push(Operation {
            client: id,
            input,
            call,
            ret,
            output,
        });
    }
}

/// Acknowledged label writes missing from the final state. Each client
/// writes increasing values to its own key, so an acknowledged value `v` is
/// present iff the final value of that key is at least `v`.
pub fn check_durability(acked: &[(usize, String, u64)], finals: &[HostView]) -> usize {
    acked
        .iter()
        .filter(|(h, k, v)| finals[*h].labels.get(k).is_none_or(|f| f < v))
        .count()
}

/// Longest stretch (ms) without any successful operation, between the first
/// and the last success.
pub fn max_gap_ms(successes: Vec<u64>) -> u64 {
    longest_gap(successes).1
}

/// The longest time between two successes: (when it began, its length),
/// in ms since the start.
pub fn longest_gap(mut successes: Vec<u64>) -> (u64, u64) {
    successes.sort_unstable();
    successes
        .windows(2)
        .map(|w| (w[0], w[1] - w[0]))
        .max_by_key(|g| g.1)
        .unwrap_or((0, 0))
}

/// Concurrent admin clients that write and read hosts (cordon, uncordon,
/// drain, undrain, labels, linearizable reads), every operation recorded
/// with its call and return times for the checkers.
pub struct HistoryLoad {
    rec: Arc<Recorder>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    start: Instant,
    hosts: Arc<Vec<String>>,
}

/// What the checkers found in a recorded history.
#[derive(Debug, Clone, Serialize)]
pub struct HistoryVerdict {
    pub acked_ops: usize,
    pub refused_ops: usize,
    pub unknown_ops: usize,
    pub reads: usize,
    /// Acknowledged label writes missing from the final state.
    pub lost_ops: usize,
    pub linearizable: bool,
    pub linearizability: String,
    pub check_ms: u64,
    pub unexpected: Vec<String>,
    /// Longest time no operation succeeded, and when it began (ms since
    /// the load started).
    pub max_unavailable_ms: u64,
    pub max_unavailable_at_ms: u64,
    /// Acknowledged membership changes (additions and removals of a
    /// spare supervisor; 0 without one).
    pub member_changes: usize,
    /// Why outcomes were unknown (message prefix → count).
    pub unknown_causes: BTreeMap<String, usize>,
    /// The history of each host that failed the check, one operation per
    /// line (for diagnosis).
    #[serde(skip)]
    pub failed_histories: Vec<(String, String)>,
    /// When each successful operation returned (ms since the load
    /// started), sorted: scenarios measure their own windows in it.
    #[serde(skip)]
    pub successes: Vec<u64>,
}

/// The cluster's leader within 20 s; when there is none, the run directory
/// (the members' logs) is kept for diagnosis before the error returns.
async fn leader_or_keep(cluster: &mut SupervisorCluster) -> anyhow::Result<u64> {
    let r = cluster.wait_leader(Duration::from_secs(20)).await;
    if r.is_err() {
        cluster.keep();
    }
    r
}

impl HistoryVerdict {
    /// Every check passed.
    pub fn ok(&self) -> bool {
        self.linearizable && self.lost_ops == 0 && self.unexpected.is_empty() && self.acked_ops > 0
    }

    /// Writes the history of every host that failed the check into `dir`
    /// (`history-<host>.txt`, one operation per line), for diagnosis.
    pub fn keep_failed(&self, dir: &std::path::Path, scenario: &str) {
        for (host, text) in &self.failed_histories {
            let path = dir.join(format!("history-{host}.txt"));
            if std::fs::write(&path, text).is_ok() {
                eprintln!("[{scenario}] history written to {}", path.display());
            }
        }
    }
}

impl HistoryLoad {
    /// Starts one task per client on the current runtime, each on its own
    /// label key, over `hosts`.
    pub fn start(clients: Vec<AdminClient>, hosts: Vec<String>, seed: u64) -> Self {
        Self::start_mix(clients, hosts, seed, true, None)
    }

    /// Like [`Self::start`]; without `failovers` the clients write labels
    /// instead of failing NICs over and back (each failover of a simulated
    /// host's NIC opens detour-route intents for every host, which would
    /// crowd a scenario's own intents out of the log it checks). With a
    /// `spare`, one more client adds it to the membership and removes it
    /// again, and the others read the membership too.
    pub fn start_mix(
        clients: Vec<AdminClient>,
        hosts: Vec<String>,
        seed: u64,
        failovers: bool,
        spare: Option<Spare>,
    ) -> Self {
        let rec = Arc::new(Recorder {
            ops: hosts.iter().map(|_| Mutex::new(Vec::new())).collect(),
            failovers,
            spare: spare.as_ref().map(|s| s.id),
            ..Default::default()
        });
        let stop = Arc::new(AtomicBool::new(false));
        let start = Instant::now();
        let hosts = Arc::new(hosts);
        let writer_id = clients.len();
        let mut tasks: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(id, client)| {
                tokio::spawn(client_loop(
                    id,
                    client,
                    hosts.clone(),
                    rec.clone(),
                    stop.clone(),
                    start,
                    seed,
                ))
            })
            .collect();
        if let Some(spare) = spare {
            tasks.push(tokio::spawn(members::writer(
                spare,
                writer_id,
                rec.clone(),
                stop.clone(),
                start,
                seed,
            )));
        }
        Self {
            rec,
            stop,
            tasks,
            start,
            hosts,
        }
    }

    /// Since when the load runs.
    pub fn started(&self) -> Instant {
        self.start
    }

    /// Stops the clients, reads every host once more through `reader`
    /// (retried, part of the history), and runs the checkers.
    pub async fn finish(
        self,
        reader: &AdminClient,
        scenario: &str,
    ) -> anyhow::Result<HistoryVerdict> {
        let HistoryLoad {
            rec,
            stop,
            tasks,
            start,
            hosts,
        } = self;
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            let _ = t.await;
        }
        let mut finals = Vec::new();
        for (hi, h) in hosts.iter().enumerate() {
            let request = AdminRequest::NodeShow { host: h.clone() };
            let read = final_read(
                reader,
                start,
                &rec.ops[hi],
                HostOp::Read,
                request,
                |r| match r {
                    Ok(AdminReply::Host { host, .. }) => Some(HostResult::Read(view(host))),
                    _ => None,
                },
            )
            .await?;
            let HostResult::Read(v) = read else {
                unreachable!("the parse above gives reads only")
            };
            finals.push(v);
        }
        // A final show of every playbook and job too, part of their
        // histories.
        for (pi, name) in PLAYBOOKS.iter().enumerate() {
            let request = AdminRequest::PlaybookShow {
                name: name.to_string(),
            };
            final_read(
                reader,
                start,
                &rec.pb_ops[pi],
                PbOp::Read,
                request,
                |r| match r {
                    Ok(AdminReply::Playbook { playbook }) => Some(PbResult::Read(
                        crate::linearizability::playbook::value_of(&playbook.source),
                    )),
                    Err(e) if e.kind == ErrorKind::NotFound => Some(PbResult::Read(None)),
                    _ => None,
                },
            )
            .await?;
        }
        for (ji, name) in JOBS.iter().enumerate() {
            let request = AdminRequest::JobShow {
                job: name.to_string(),
            };
            final_read(
                reader,
                start,
                &rec.job_ops[ji],
                LinJobOp::Read,
                request,
                |r| match r {
                    Ok(AdminReply::Job { job, .. }) => {
                        Some(JobResult::Read(crate::linearizability::job::observe(job)))
                    }
                    Err(e) if e.kind == ErrorKind::NotFound => Some(JobResult::Read(None)),
                    _ => None,
                },
            )
            .await?;
        }
        if let Some(spare) = rec.spare {
            final_read(
                reader,
                start,
                &rec.member_ops,
                MemberOp::Read,
                AdminRequest::ClusterMembers,
                |r| match r {
                    Ok(AdminReply::Members { members }) => Some(MemberResult::Read(
                        members.iter().any(|m| m.id == spare && m.voter),
                    )),
                    _ => None,
                },
            )
            .await?;
        }
        let acked_labels = rec.acked_labels.lock().unwrap().clone();
        let lost_ops = check_durability(&acked_labels, &finals);
        let (mut acked, mut refused, mut unknown, mut reads) = (0, 0, 0, 0);
        let mut verdicts = Vec::new();
        let mut failed_histories = Vec::new();
        eprintln!("[{scenario}] checking linearizability");
        let check_start = Instant::now();
        let mut objects = Vec::new();
        for (ops, h) in rec.ops.iter().zip(hosts.iter()) {
            objects.push(check_object(
                &HostModel,
                ops,
                &format!("host {h}"),
                scenario,
            ));
        }
        for (ops, p) in rec.pb_ops.iter().zip(PLAYBOOKS) {
            objects.push(check_object(
                &PlaybookModel,
                ops,
                &format!("playbook {p}"),
                scenario,
            ));
        }
        for (ops, j) in rec.job_ops.iter().zip(JOBS) {
            objects.push(check_object(&JobModel, ops, &format!("job {j}"), scenario));
        }
        if rec.spare.is_some() {
            objects.push(check_object(
                &MemberModel,
                &rec.member_ops,
                "membership",
                scenario,
            ));
        }
        for (counts, verdict, failed) in objects {
            acked += counts[0];
            refused += counts[1];
            unknown += counts[2];
            reads += counts[3];
            failed_histories.extend(failed);
            verdicts.push(verdict);
        }
        let linearizable = verdicts.iter().all(|v| *v == Verdict::Linearizable);
        let undecided = verdicts.contains(&Verdict::Undecided);
        let mut successes = rec.successes.lock().unwrap().clone();
        successes.sort_unstable();
        let (gap_at, max_unavailable_ms) = longest_gap(successes.clone());
        // On the wall clock too, to line it up with a scenario's faults.
        let gap_wall = std::time::SystemTime::now()
            - start
                .elapsed()
                .saturating_sub(Duration::from_millis(gap_at));
        eprintln!(
            "[{scenario}] longest time without a successful operation: {max_unavailable_ms} ms \
             from {:.1} s ({})",
            gap_at as f64 / 1e3,
            humantime::format_rfc3339_millis(gap_wall)
        );
        let unexpected = rec.unexpected.lock().unwrap().clone();
        let unknown_causes = rec.unknown_causes.lock().unwrap().clone();
        let member_changes = rec
            .member_ops
            .lock()
            .unwrap()
            .iter()
            .filter(|o| o.input != MemberOp::Read && o.output == Some(MemberResult::Ok))
            .count();
        Ok(HistoryVerdict {
            member_changes,
            acked_ops: acked,
            refused_ops: refused,
            unknown_ops: unknown,
            reads,
            lost_ops,
            linearizable,
            linearizability: if linearizable {
                "linearizable".into()
            } else if undecided {
                "undecided (search budget exhausted)".into()
            } else {
                "violation".into()
            },
            check_ms: check_start.elapsed().as_millis() as u64,
            unexpected,
            max_unavailable_ms,
            max_unavailable_at_ms: gap_at,
            unknown_causes,
            failed_histories,
            successes,
        })
    }
}

/// A [`HistoryLoad`] run from a testbed node's namespace (its sockets live
/// there, so it reaches the supervisors over the management network as an
/// admin's machine would): its own thread and runtime, on simulated hosts
/// `c0`–`c3` it registers first (so drains and cordons disturb nothing
/// real).
pub struct NsHistory {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: std::thread::JoinHandle<std::io::Result<anyhow::Result<HistoryVerdict>>>,
}

/// Simulated hosts the namespace load writes and reads.
const NS_HOSTS: usize = 4;

impl NsHistory {
    /// Starts `clients` admin clients in `node`'s namespace of `c`.
    pub fn start(
        c: &testbed::netcluster::NetCluster,
        node: testbed::Node,
        clients: usize,
        seed: u64,
    ) -> anyhow::Result<NsHistory> {
        let addrs = c.sup_addrs();
        let admin = pki::ClientTls::from_mode(&pki::TlsMode::Mtls(c.admin_files()?))?;
        // Each client its own certificate, as independent operators are
        // (write quotas are per identity).
        let own: Vec<pki::ClientTls> = (0..clients)
            .map(|id| {
                let files = c.pki.admin(&format!("chaos-{id}"), pki::Role::Admin)?;
                Ok(pki::ClientTls::from_mode(&pki::TlsMode::Mtls(files))?)
            })
            .collect::<anyhow::Result<_>>()?;
        let hosts: Vec<String> = (0..NS_HOSTS).map(|i| format!("c{i}")).collect();
        let agents = hosts
            .iter()
            .map(|h| {
                Ok(pki::ClientTls::from_mode(&pki::TlsMode::Mtls(
                    c.pki.agent(h)?,
                ))?)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = c.tb.ns(node).spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("a runtime for the admin clients")?;
            rt.block_on(async move {
                for (h, tls) in hosts.iter().zip(&agents) {
                    testbed::agentsim::register_host(&addrs, h, tls).await?;
                }
                let clients = own
                    .iter()
                    .enumerate()
                    .map(|(id, tls)| {
                        let mut a = addrs.clone();
                        let n = a.len().max(1);
                        a.rotate_left(id % n);
                        Ok(AdminClient::new(
                            &a,
                            &format!("chaos-{id}"),
                            Duration::from_secs(3),
                            tls,
                        )?
                        .with_retry_window(Duration::from_secs(10)))
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?;
                // The playbook checker reads the intent log: no failovers.
                let load = HistoryLoad::start_mix(clients, hosts, seed, false, None);
                let _ = stopped.await;
                let reader =
                    AdminClient::new(&addrs, "chaos-final", Duration::from_secs(5), &admin)?;
                load.finish(&reader, "admin history").await
            })
        })?;
        Ok(NsHistory {
            stop: Some(stop),
            thread,
        })
    }

    /// Stops the clients and checks the history (blocks until the final
    /// reads are done: call it once the cluster is whole again).
    pub fn finish(mut self) -> anyhow::Result<HistoryVerdict> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("the admin clients' thread panicked"))??
    }
}

/// Reads an object once more through `reader` (retried, bounded), as the
/// last operation of its history, and returns what it read; `parse` says
/// what the reply read (`None`: try again).
async fn final_read<I, O: Clone>(
    reader: &AdminClient,
    start: Instant,
    ops: &Mutex<Vec<Operation<I, O>>>,
    input: I,
    request: AdminRequest,
    parse: impl Fn(&Result<AdminReply, supervisor::api::ApiError>) -> Option<O>,
) -> anyhow::Result<O> {
    let mut last = String::new();
    for _ in 0..50 {
        let call = ns_since(start);
        let reply = reader.call(request.clone(), false).await;
        if let Some(out) = parse(&reply) {
            ops.lock().unwrap().push(Operation {
                client: usize::MAX,
                input,
                call,
                ret: Some(ns_since(start)),
                output: Some(out.clone()),
            });
            return Ok(out);
        }
        last = match reply {
            Ok(r) => format!("unexpected reply {r:?}"),
            Err(e) => e.to_string(),
        };
        tracing::debug!(error = %last, "final read retry");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("the final read {request:?} failed 50 times; the last: {last}")
}

/// Checks one object's history against `model`: the counts of acknowledged,
/// refused, unknown and read operations, the verdict, and the history when
/// it failed (named `name`, for diagnosis).
fn check_object<M: crate::linearizability::Model>(
    model: &M,
    ops: &Mutex<Vec<Operation<M::Input, M::Output>>>,
    name: &str,
    scenario: &str,
) -> ([usize; 4], Verdict, Option<(String, String)>) {
    let ops = ops.lock().unwrap();
    let mut counts = [0; 4];
    for o in ops.iter() {
        let class = match &o.output {
            _ if model.is_read(&o.input) => 3,
            Some(out) if model.is_refused(out) => 1,
            Some(_) => 0,
            None => 2,
        };
        counts[class] += 1;
    }
    let t = Instant::now();
    let r = check_with(model, &ops, CHECK_LIMITS);
    eprintln!(
        "[{scenario}] {name}: {:?} in {} ms: {} ops, {} segments (largest {}), \
         {} steps, frontier up to {}, {} unknown-outcome ops left out",
        r.verdict,
        t.elapsed().as_millis(),
        ops.len(),
        r.segments,
        r.largest_segment,
        r.steps,
        r.max_frontier,
        r.dropped
    );
    let failed = (r.verdict != Verdict::Linearizable).then(|| {
        let text: String = ops.iter().map(|o| format!("{o:?}\n")).collect();
        (name.replace(' ', "-"), text)
    });
    (counts, r.verdict, failed)
}

/// Runs the scenario and returns its report.
pub async fn run(cfg: HistoryRun) -> anyhow::Result<HistoryReport> {
    let scenario = match (cfg.whole_cluster, cfg.pause) {
        (true, _) => "cluster-crash",
        (false, Some(_)) => "pause-leader",
        (false, None) => "leader-kill",
    };
    eprintln!("[{scenario}] starting 3 supervisors");
    let mut cluster = SupervisorCluster::start(3)?;
    cluster.init().await.context("initialise the cluster")?;
    let hosts: Vec<String> = (0..cfg.hosts).map(|i| format!("h{i}")).collect();
    for h in &hosts {
        testbed::agentsim::register_host(&cluster.addrs(), h, &cluster.agent_tls(h)?).await?;
    }
    eprintln!(
        "[{scenario}] registered {} hosts; {} clients start",
        hosts.len(),
        cfg.clients
    );
    let clients = (0..cfg.clients)
        .map(|id| {
            Ok(cluster
                .client(&format!("chaos-{id}"), id, Duration::from_secs(3))?
                .with_retry_window(Duration::from_secs(10)))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    // The membership writer's client knows the three founders; its
    // timeout outlasts an add's 6 s catch-up wait (membership calls are
    // sent once, never retried by the client).
    let members_client = cluster.client("chaos-members", 0, Duration::from_secs(15))?;
    let spare_id = cluster.spawn_joiner()?;
    let spare = Spare {
        id: spare_id,
        addr: cluster.nodes[(spare_id - 1) as usize].addr.clone(),
        client: members_client,
    };
    eprintln!(
        "[{scenario}] supervisor {spare_id} is the spare the membership writer adds and removes"
    );
    let load = HistoryLoad::start_mix(clients, hosts, cfg.seed, true, Some(spare));
    let all: Vec<u64> = (1..=spare_id).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(cfg.seed);
    let mut kills = 0;
    for round in 1..=cfg.rounds {
        tokio::time::sleep(cfg.load_per_round).await;
        if cfg.whole_cluster {
            for &id in &all {
                cluster.kill(id);
                kills += 1;
            }
            eprintln!("[{scenario}] round {round}: SIGKILLed all supervisors");
            tokio::time::sleep(Duration::from_millis(rng.gen_range(200..800))).await;
            for &id in &all {
                cluster.restart(id)?;
            }
        } else if let Some(pause) = cfg.pause {
            let leader = leader_or_keep(&mut cluster).await?;
            anyhow::ensure!(
                cluster.signal(leader, libc::SIGSTOP),
                "leader {leader} is gone"
            );
            kills += 1;
            eprintln!(
                "[{scenario}] round {round}: SIGSTOPped leader {leader} for {pause:?} at {:.1} s",
                load.started().elapsed().as_secs_f64()
            );
            tokio::time::sleep(pause).await;
            cluster.signal(leader, libc::SIGCONT);
        } else {
            let leader = leader_or_keep(&mut cluster).await?;
            cluster.kill(leader);
            kills += 1;
            eprintln!("[{scenario}] round {round}: SIGKILLed leader {leader}");
            tokio::time::sleep(Duration::from_millis(rng.gen_range(500..1500))).await;
            cluster.restart(leader)?;
        }
        leader_or_keep(&mut cluster).await?;
    }
    tokio::time::sleep(cfg.load_per_round).await;
    // Final linearizable reads of every host, part of the history.
    leader_or_keep(&mut cluster).await?;
    let reader = cluster.client("chaos-final", 0, Duration::from_secs(5))?;
    let v = load.finish(&reader, scenario).await?;
    for (cause, n) in &v.unknown_causes {
        eprintln!("[{scenario}] {n} outcomes unknown: {cause}");
    }
    v.keep_failed(&cluster.run_dir, scenario);
    for u in v.unexpected.iter().take(5) {
        eprintln!("[{scenario}] unexpected: {u}");
    }
    let ok = v.ok();
    if !ok {
        let dir = cluster.keep();
        eprintln!(
            "[{scenario}] FAILED; supervisor logs kept in {}",
            dir.display()
        );
    }
    Ok(HistoryReport {
        ok,
        scenario: scenario.into(),
        rounds: cfg.rounds,
        kills,
        acked_ops: v.acked_ops,
        refused_ops: v.refused_ops,
        unknown_ops: v.unknown_ops,
        reads: v.reads,
        lost_ops: v.lost_ops,
        linearizable: v.linearizable,
        linearizability: v.linearizability,
        check_ms: v.check_ms,
        unexpected_errors: v.unexpected.len(),
        max_unavailable_ms: v.max_unavailable_ms,
        member_changes: v.member_changes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durability_checker_counts_missing_acked_writes() {
        let mut v = HostView::default();
        v.labels.insert("c0".into(), 3);
        let acked = vec![
            (0, "c0".into(), 2),
            (0, "c0".into(), 3),
            (0, "c1".into(), 1),
        ];
        assert_eq!(check_durability(&acked, &[v.clone()]), 1, "c1=1 is missing");
        let acked = vec![(0, "c0".into(), 4)];
        assert_eq!(check_durability(&acked, &[v]), 1, "final 3 < acked 4");
    }

    #[test]
    fn gap_is_longest_silence() {
        assert_eq!(max_gap_ms(vec![10, 0, 500, 520]), 490);
        assert_eq!(max_gap_ms(vec![]), 0);
    }
}
