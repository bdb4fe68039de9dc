//! `Admin`: every CLI operation. Writes and linearizable reads run on the
//! leader; a follower forwards the call there (one hop). `Status` describes
//! the answering node's own view and is never forwarded; `ClusterMembers`
//! is the leader's view unless `--stale`. `Clock` and `Paths` read the
//! leader's memory ([`crate::leader`]), so they always go to the leader.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::Stream;
use proto::v1::admin_server::Admin;
use proto::v1::{Blob, FollowRequest};
use tonic::{Request, Response, Status};

use crate::api::{
    AdminCall, AdminReply, AdminRequest, ApiError, ErrorKind, NicView, QpView, StatusView,
};
use crate::leader::services::Leader;
use crate::model::{AdminOp, ClusterEvent, CmdOk, Command, IntentStatus};
use crate::node::Supervisor;
use crate::service::auth::{admin_identity, check_role, guarded, peer_of};
use crate::service::quota::WriteQuota;
use crate::service::transfer::transfer_leader;

/// The `Admin` gRPC service.
pub struct AdminService {
    /// The leader's memory and, through it, this node.
    pub leader: Arc<Leader>,
    /// Writes per identity.
    pub quota: WriteQuota,
}

/// Most events returned by one `events` call.
pub const MAX_EVENTS_PER_CALL: u32 = 5_000;
/// Most connection placements returned by one `qp list` call.
pub const MAX_QPS_PER_CALL: usize = 10_000;

/// Runs one admin call on this node, forwarding to the leader if needed.
pub async fn handle(leader: &Arc<Leader>, call: AdminCall) -> Result<AdminReply, ApiError> {
    let sup = &leader.node;
    let local_only = matches!(
        call.request,
        AdminRequest::Status | AdminRequest::ClusterInit
    );
    let needs_leader =
        !local_only && (call.request.is_write() || call.request.is_leader_memory() || !call.stale);
    if needs_leader && !sup.is_leader() {
        if call.forwarded {
            return Err(ApiError::unavailable(
                "forwarded to a supervisor that is no longer the leader; retry",
            ));
        }
        return forward(sup, call).await;
    }
    let linear = needs_leader && !call.request.is_write();
    // Kept to hand an `add-member` cut short by a leadership change to the
    // new leader (below).
    let add_again = matches!(call.request, AdminRequest::AddMember { .. }).then(|| call.clone());
    macro_rules! read {
        ($f:expr) => {
            if linear {
                sup.read_linearizable($f).await?
            } else {
                sup.read($f)
            }
        };
    }
    match call.request {
        AdminRequest::Status => Ok(AdminReply::Status(status(sup))),
        AdminRequest::ClusterMembers => {
            // Not from memory alone: a leader cut off from the others
            // still believes it leads and would name itself (`status`
            // takes this read as proof that the cluster can serve).
            if linear {
                sup.linearizable_barrier("cluster members").await?;
            }
            Ok(AdminReply::Members {
                members: sup.members(),
            })
        }
        AdminRequest::ClusterInit => {
            sup.initialize().await?;
            Ok(AdminReply::Committed {
                log_index: 0,
                detail: format!(
                    "cluster initialized with members {:?}",
                    std::iter::once(sup.id)
                        .chain(sup.config.peers.keys().copied())
                        .collect::<Vec<_>>()
                ),
            })
        }
        AdminRequest::AddMember { id, addr } => {
            // Leadership moved while it was being added (a removed member
            // that campaigned alone comes back with a higher term and
            // deposes the leader that adds it; `add_member` says so with
            // `Unknown`): the next leader finishes the add, once — this
            // node if it leads again, else the new leader by a forward
            // (not for a call already forwarded). The same id and address
            // is idempotent. Once the first attempt's outcome is unknown,
            // a failed second attempt leaves it unknown (the first may
            // have changed the membership: "refused" would be wrong).
            let mut first: Option<ApiError> = None;
            let still_unknown = |first: &ApiError, e: ApiError| {
                ApiError::new(
                    ErrorKind::Unknown,
                    format!("{}; finishing it failed too: {}", first.message, e.message),
                )
            };
            let idx = loop {
                match sup.add_member(id, addr.clone()).await {
                    Ok(i) => break i,
                    Err(e) if first.is_some() => {
                        return Err(still_unknown(first.as_ref().expect("checked"), e))
                    }
                    Err(e) if e.kind == ErrorKind::Unknown => match next_leader(sup).await {
                        Some(l) if l == sup.id => first = Some(e),
                        Some(_) => {
                            return match add_again.filter(|c| !c.forwarded) {
                                Some(c) => {
                                    tracing::info!(error = %e.message, "add-member cut short by a leadership change; the new leader finishes it");
                                    forward(sup, c)
                                        .await
                                        .map_err(|again| still_unknown(&e, again))
                                }
                                None => Err(e),
                            };
                        }
                        None => return Err(e),
                    },
                    Err(e) => return Err(e),
                }
            };
            record_membership(
                sup,
                &call.actor,
                AdminOp::MemberAdded {
                    id,
                    addr: addr.clone(),
                },
            )
            .await;
            Ok(AdminReply::Committed {
                log_index: idx,
                detail: format!("supervisor {id} at {addr} added as a voter"),
            })
        }
        AdminRequest::RemoveMember { id } => {
            let idx = sup.remove_member(id).await?;
            record_membership(sup, &call.actor, AdminOp::MemberRemoved { id }).await;
            Ok(AdminReply::Committed {
                log_index: idx,
                detail: format!("supervisor {id} removed"),
            })
        }
        AdminRequest::TransferLeader { id } => transfer_leader(sup, id).await,
        AdminRequest::NodeList => Ok(AdminReply::Hosts {
            hosts: read!(|st| st.hosts.values().cloned().collect()),
        }),
        AdminRequest::NodeShow { host } => {
            let found = read!(|st| st.hosts.get(&host).cloned().map(|h| {
                let jobs = st.jobs_on(&host).map(|j| j.name.clone()).collect();
                (h, jobs)
            }));
            let (host_v, jobs) = found.ok_or_else(|| {
                ApiError::new(ErrorKind::NotFound, format!("host {host:?} not found"))
            })?;
            Ok(AdminReply::Host { host: host_v, jobs })
        }
        AdminRequest::Incidents { open_only } => Ok(AdminReply::Incidents {
            incidents: read!(|st| st
                .incidents
                .values()
                .filter(|i| !open_only || i.closed_ms.is_none())
                .cloned()
                .collect()),
        }),
        AdminRequest::NicList { state } => Ok(AdminReply::Nics {
            nics: read!(|st| st
                .hosts
                .values()
                .flat_map(|h| h.nics.values().map(move |n| NicView {
                    host: h.name.clone(),
                    nic: n.clone(),
                }))
                .filter(|v| state.is_none_or(|s| v.nic.state == s))
                .collect()),
        }),
        AdminRequest::Events {
            since,
            limit,
            newest,
        } => {
            let limit = limit.clamp(1, MAX_EVENTS_PER_CALL) as usize;
            let (events, omitted) = read!(|st| events_since(&st.events, since, limit, newest));
            Ok(AdminReply::Events { events, omitted })
        }
        AdminRequest::AdminHistory { limit } => {
            let limit = limit.clamp(1, MAX_EVENTS_PER_CALL) as usize;
            Ok(AdminReply::History {
                records: read!(|st| st
                    .admin_history
                    .iter()
                    .rev()
                    .take(limit)
                    .rev()
                    .cloned()
                    .collect()),
            })
        }
        AdminRequest::QpList { host, job } => {
            let (qps, truncated) = read!(|st| -> Result<_, ApiError> {
                if let Some(h) = &host {
                    if !st.hosts.contains_key(h) {
                        return Err(ApiError::new(
                            ErrorKind::NotFound,
                            format!("host {h:?} not found"),
                        ));
                    }
                }
                let mut all = st
                    .qps
                    .iter()
                    .filter(|(h, _)| host.as_ref().is_none_or(|x| x == *h))
                    .flat_map(|(h, t)| {
                        t.values()
                            .filter(|q| job.as_ref().is_none_or(|j| *j == q.job))
                            .map(move |q| QpView {
                                host: h.clone(),
                                qp: q.clone(),
                            })
                    });
                let qps: Vec<QpView> = all.by_ref().take(MAX_QPS_PER_CALL).collect();
                Ok((qps, all.next().is_some()))
            })?;
            Ok(AdminReply::Qps { qps, truncated })
        }
        AdminRequest::Intents { open_only, limit } => {
            let limit = limit.clamp(1, MAX_EVENTS_PER_CALL) as usize;
            Ok(AdminReply::Intents {
                intents: read!(|st| {
                    let mut v: Vec<_> = st
                        .intents
                        .values()
                        .rev()
                        .filter(|i| !open_only || i.status == IntentStatus::Open)
                        .take(limit)
                        .cloned()
                        .collect();
                    v.reverse();
                    v
                }),
            })
        }
        AdminRequest::IntentShow { id } => {
            let intent = read!(|st| st.intents.get(&id).cloned()).ok_or_else(|| {
                ApiError::new(
                    ErrorKind::NotFound,
                    format!("intent {id} not found (unknown, or closed long ago)"),
                )
            })?;
            Ok(AdminReply::Intent { intent })
        }
        AdminRequest::Clock => {
            Ok(AdminReply::Clock(sup.read(|st| {
                leader.clocks.clock_view(st, sup.id, Instant::now())
            })))
        }
        AdminRequest::Paths { host, top } => Ok(AdminReply::Paths(sup.read(|st| {
            leader
                .clocks
                .paths_view(st, sup.id, host.as_deref(), top, Instant::now())
        })?)),
        AdminRequest::Queueing {
            host,
            contended_only,
            top,
        } => {
            if top == Some(0) {
                return Err(ApiError::invalid("--top must be at least 1"));
            }
            if let Some(h) = &host {
                if !sup.read(|st| st.hosts.contains_key(h)) {
                    return Err(ApiError::new(
                        ErrorKind::NotFound,
                        format!("host {h:?} not found"),
                    ));
                }
            }
            let cfg = leader.contention.config();
            let mut paths = leader.contention.paths(contended_only, Instant::now());
            if let Some(h) = &host {
                paths.retain(|p| &p.path.src == h || &p.path.dst == h);
            }
            let total = paths.len();
            paths.truncate(top.map_or(crate::leader::clock::MAX_PATHS_PER_CALL, |t| t as usize));
            Ok(AdminReply::Queueing(crate::api::QueueingView {
                answered_by: sup.id,
                topology: sup.config.topology.is_some(),
                enter_us: cfg.enter_us,
                exit_us: cfg.exit_us,
                total,
                paths,
            }))
        }
        AdminRequest::Links => Ok(AdminReply::Links(crate::api::LinksView {
            answered_by: sup.id,
            topology: sup
                .config
                .topology_path
                .as_ref()
                .map(|p| p.display().to_string()),
            links: sup
                .config
                .topology
                .as_ref()
                .map(|t| t.links())
                .unwrap_or_default(),
            scores: leader.contention.scores(),
            incidents: sup.read(|st| {
                st.open_incidents()
                    .filter(|i| i.link.is_some())
                    .cloned()
                    .collect()
            }),
        })),
        AdminRequest::ShapeList { host } => {
            let rows = read!(|st| {
                if let Some(h) = &host {
                    if !st.hosts.contains_key(h) {
                        return Err(ApiError::new(
                            ErrorKind::NotFound,
                            format!("host {h:?} not found"),
                        ));
                    }
                }
                let mut keys: std::collections::BTreeSet<(String, String)> = Default::default();
                for (h, m) in &st.shapes {
                    keys.extend(m.keys().map(|n| (h.clone(), n.clone())));
                }
                for (h, m) in &st.applied_shapes {
                    keys.extend(m.keys().map(|n| (h.clone(), n.clone())));
                }
                Ok(keys
                    .into_iter()
                    .filter(|(h, _)| host.as_ref().is_none_or(|f| f == h))
                    .map(|(h, n)| crate::api::ShapeRow {
                        desired: st.shapes.get(&h).and_then(|m| m.get(&n)).cloned(),
                        applied_version: st.applied_shapes.get(&h).and_then(|m| m.get(&n)).copied(),
                        host: h,
                        nic: n,
                    })
                    .collect::<Vec<_>>())
            })?;
            Ok(AdminReply::Shapes { shapes: rows })
        }
        AdminRequest::JobList => Ok(AdminReply::Jobs {
            jobs: read!(|st| st.jobs.values().cloned().collect()),
        }),
        AdminRequest::JobShow { job } => {
            let now = crate::node::now_ms();
            let j = read!(|st| st.jobs.get(&job).map(|j| {
                let waiting = crate::model::jobs::waiting_reason(st, j, now);
                (j.clone(), waiting)
            }));
            let (job, waiting) = j.ok_or_else(|| {
                ApiError::new(ErrorKind::NotFound, format!("job {job:?} not found"))
            })?;
            Ok(AdminReply::Job {
                job: Box::new(job),
                waiting,
            })
        }
        AdminRequest::JobLogs {
            job,
            rank,
            max_bytes,
            from,
        } => {
            let host = sup.read(|st| {
                let j = st.jobs.get(&job).ok_or_else(|| {
                    ApiError::new(ErrorKind::NotFound, format!("job {job:?} not found"))
                })?;
                let hosts = if j.placement.is_empty() {
                    &j.previous_placement
                } else {
                    &j.placement
                };
                hosts.get(rank as usize).cloned().ok_or_else(|| {
                    ApiError::invalid(format!(
                        "job {job:?} has ranks 0..{}; it never ran rank {rank}",
                        j.spec.ranks
                    ))
                })
            })?;
            let r = leader
                .orders
                .tail_log(
                    &host,
                    &job,
                    rank,
                    max_bytes,
                    from.map(|p| (p.incarnation, p.offset)),
                    Duration::from_secs(5),
                )
                .await?;
            if !r.ok {
                return Err(ApiError::new(
                    ErrorKind::NotFound,
                    format!("no log of job {job:?} rank {rank} on {host}: {}", r.text),
                ));
            }
            Ok(AdminReply::JobLogs {
                host,
                incarnation: r.incarnation,
                text: r.text,
                end_offset: r.end_offset,
                newest_incarnation: r.newest_incarnation,
            })
        }
        AdminRequest::PlaybookList => {
            let (playbooks, version) = read!(|st| {
                let v = st
                    .playbooks
                    .values()
                    .map(|sp| {
                        let p = sp.parsed();
                        crate::api::PlaybookView {
                            name: sp.name.clone(),
                            version: sp.version,
                            priority: p.as_ref().map_or(0, |p| p.priority),
                            incidents: p
                                .as_ref()
                                .and_then(|p| p.trigger.as_ref())
                                .map(|t| t.incidents.iter().map(|k| k.to_string()).collect())
                                .unwrap_or_default(),
                            steps: p.as_ref().map_or(0, |p| p.steps.len()),
                            on_failure: p.as_ref().and_then(|p| p.on_failure.clone()),
                            applied_ms: sp.applied_ms,
                            applied_by: sp.applied_by.clone(),
                            description: p.map(|p| p.description.clone()).unwrap_or_default(),
                        }
                    })
                    .collect::<Vec<_>>();
                (v, st.playbook_version)
            });
            Ok(AdminReply::Playbooks { playbooks, version })
        }
        AdminRequest::PlaybookRuns { open_only } => {
            let (runs, truncated) = read!(|st: &crate::model::ClusterState| {
                let all: Vec<&crate::model::runs::PlaybookRun> = st.runs_list(open_only).collect();
                let skip = all.len().saturating_sub(crate::api::MAX_RUNS_REPLY);
                let runs: Vec<crate::model::runs::RunView> = all[skip..]
                    .iter()
                    .map(|r| crate::model::runs::RunView::of(st, r))
                    .collect();
                (runs, skip > 0)
            });
            Ok(AdminReply::PlaybookRuns { runs, truncated })
        }
        AdminRequest::PlaybookShow { name } => {
            let p = read!(|st| st.playbooks.get(&name).cloned());
            let playbook = p.ok_or_else(|| {
                ApiError::new(ErrorKind::NotFound, format!("playbook {name:?} not found"))
            })?;
            Ok(AdminReply::Playbook { playbook })
        }
        AdminRequest::PlaybookPlan { file, incident } => {
            if file.text.len() > crate::model::playbook_store::MAX_PLAYBOOK_BYTES {
                return Err(ApiError::invalid("playbook file too large"));
            }
            let pb = playbooks::parse(&file.file, &file.text)
                .map_err(|e| ApiError::invalid(e.to_string()))?;
            let now = crate::node::now_ms();
            let r = read!(|st: &crate::model::ClusterState| {
                let inc = st.plan_incident(&incident).map_err(ApiError::from)?;
                let set: Vec<playbooks::Playbook> =
                    st.playbook_set().into_iter().cloned().collect();
                Ok::<_, ApiError>((st.playbook_view(now), inc, set))
            });
            let (view, inc, set) = r?;
            let plan = playbooks::plan(&pb, &inc, &view);
            let matched_now = playbooks::matching(&set, &inc).map(|p| p.name.clone());
            Ok(AdminReply::PlaybookPlan {
                plan: Box::new(plan),
                matched_now,
            })
        }
        AdminRequest::Write { op } => {
            let detail = op.summary();
            let actor = call.actor.clone();
            let request = call.request_id.clone();
            let opened = match sup.propose(Command::Admin { actor, op, request }).await? {
                CmdOk::IntentOpened { id } => Some(id),
                CmdOk::Done => None,
                other => {
                    tracing::warn!(reply = ?other, "unexpected reply to an admin write");
                    None
                }
            };
            let idx = sup.read(|st| st.last_log_index);
            Ok(match opened {
                Some(id) => AdminReply::IntentOpened {
                    id,
                    log_index: idx,
                    detail,
                },
                None => AdminReply::Committed {
                    log_index: idx,
                    detail,
                },
            })
        }
    }
}

/// Events after `since`: the first `limit` (or the last, `newest`), in
/// order, and how many more matched.
fn events_since(
    log: &std::collections::VecDeque<ClusterEvent>,
    since: u64,
    limit: usize,
    newest: bool,
) -> (Vec<ClusterEvent>, u64) {
    let matching = log.iter().filter(|e| e.seq > since);
    let n = matching.clone().count();
    let skip = if newest { n.saturating_sub(limit) } else { 0 };
    let events: Vec<ClusterEvent> = matching.skip(skip).take(limit).cloned().collect();
    let omitted = (n - events.len()) as u64;
    (events, omitted)
}

fn status(sup: &Supervisor) -> StatusView {
    let m = sup.raft.metrics().borrow().clone();
    let members = sup.members();
    // Commit index: on the leader, the highest index a majority of voters
    // has; elsewhere the applied index is the best local knowledge.
    let applied = m.last_applied.as_ref().map(|l| l.index).unwrap_or(0);
    let commit = if m.state == openraft::ServerState::Leader {
        let mut matched: Vec<u64> = members
            .iter()
            .filter(|v| v.voter)
            .map(|v| v.matched.unwrap_or(0))
            .collect();
        matched.sort_unstable_by(|a, b| b.cmp(a));
        matched.get(matched.len() / 2).copied().unwrap_or(applied)
    } else {
        applied
    };
    let (hosts_by_status, open_incidents, open_intents) = sup.read(|st| {
        let mut by = BTreeMap::new();
        for h in st.hosts.values() {
            *by.entry(h.status().to_string()).or_insert(0usize) += 1;
        }
        let inc = st.open_incidents().cloned().collect();
        let intents = st.open_intents().cloned().collect();
        (by, inc, intents)
    });
    StatusView {
        answered_by: sup.id,
        leader: m.current_leader,
        term: m.current_term,
        commit_index: commit,
        applied_index: applied,
        snapshot_index: m.snapshot.as_ref().map(|l| l.index),
        purged_index: m.purged.as_ref().map(|l| l.index),
        members,
        hosts_by_status,
        open_incidents,
        open_intents,
    }
}

/// Checks `role` against what `request` takes. A refusal is recorded in the
/// admin history: proposed here when this node leads, forwarded to the
/// leader otherwise (best effort, bounded by the call timeouts; the refusal
/// is returned either way).
async fn authorize(
    leader: &Arc<Leader>,
    actor: &str,
    role: pki::Role,
    request: &AdminRequest,
) -> Result<(), Status> {
    let Err(r) = check_role(actor, role, request) else {
        return Ok(());
    };
    let record = AdminCall {
        actor: actor.to_owned(),
        stale: false,
        forwarded: false,
        request_id: None,
        request: AdminRequest::Write {
            op: AdminOp::Refused {
                request: r.what.chars().take(200).collect(),
                needed: r.need.to_string(),
            },
        },
    };
    if let Err(e) = handle(leader, record).await {
        tracing::warn!(error = %e, "could not record the refusal");
    }
    Err(r.status)
}

/// Records a membership change Raft has made in the admin history (best
/// effort: the change stands if the record cannot be committed, which is
/// logged).
async fn record_membership(sup: &Arc<Supervisor>, actor: &str, op: AdminOp) {
    let cmd = Command::Admin {
        actor: actor.to_owned(),
        op,
        request: None,
    };
    if let Err(e) = sup.propose(cmd).await {
        tracing::warn!(error = %e, "membership change made but not recorded in the history");
    }
}

/// The leader once one is elected and confirmed here (this node when it
/// leads a confirmed term), 5 s at most.
async fn next_leader(sup: &Arc<Supervisor>) -> Option<u64> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while tokio::time::Instant::now() < deadline {
        match sup.leader() {
            Some(l) if l == sup.id && sup.leads() => return Some(l),
            Some(l) if l != sup.id => return Some(l),
            _ => {}
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    None
}

/// Sends the call to the leader and returns its answer.
async fn forward(sup: &Arc<Supervisor>, mut call: AdminCall) -> Result<AdminReply, ApiError> {
    let leader = sup.leader_addr().ok_or_else(|| {
        ApiError::unavailable("no leader is elected right now; retry in a moment")
    })?;
    let is_write = call.request.is_write();
    call.forwarded = true;
    let body = serde_json::to_vec(&call).map_err(|e| ApiError::internal(e.to_string()))?;
    let mut client = sup.peer(&leader)?;
    // A leader that stops answering (paused, cut off) is replaced by an
    // election; the forward then ends at once instead of at the caller's
    // timeout, so the caller's retry reaches the new leader.
    let forwarded_to = sup.leader();
    let moved = async {
        let mut m = sup.raft.metrics();
        loop {
            if m.borrow_and_update().current_leader != forwarded_to {
                return;
            }
            if m.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    };
    let answer = tokio::select! {
        r = client.forward(Blob { body }) => r,
        () = moved => {
            let what = format!("leadership moved from {leader} while forwarding");
            return Err(if is_write {
                ApiError::unknown(format!("{what}; the write's outcome is unknown"))
            } else {
                ApiError::unavailable(what)
            });
        }
    };
    match answer {
        Ok(r) => serde_json::from_slice::<Result<AdminReply, ApiError>>(&r.get_ref().body)
            .map_err(|e| ApiError::internal(format!("bad reply from leader: {e}")))?,
        // The leader's own definite answer: nothing was written. A refusal
        // of this supervisor (its certificate revoked, or no longer a
        // member) is about this supervisor, not the caller's request:
        // unavailable here, so clients try another supervisor, and the
        // message says why.
        Err(s) if s.metadata().get(crate::api::ERROR_KIND_HEADER).is_some() => {
            let e = ApiError::from(s);
            let kind = match e.kind {
                ErrorKind::PermissionDenied => ErrorKind::Unavailable,
                other => other,
            };
            Err(ApiError::new(
                kind,
                format!(
                    "the leader at {leader} refused this supervisor's forward: {}",
                    e.message
                ),
            ))
        }
        Err(s) if crate::network::never_sent(&s) => Err(ApiError::unavailable(format!(
            "leader at {leader} unreachable: {}",
            s.message()
        ))),
        Err(s) if is_write => Err(ApiError::unknown(format!(
            "lost contact with the leader at {leader} while forwarding ({}); the write's outcome is unknown",
            s.message()
        ))),
        Err(s) => Err(ApiError::unavailable(format!(
            "leader at {leader} unreachable: {}",
            s.message()
        ))),
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn call(&self, req: Request<Blob>) -> Result<Response<Blob>, Status> {
        let mut call: AdminCall = serde_json::from_slice(&req.get_ref().body)
            .map_err(|e| Status::from(ApiError::invalid(format!("malformed admin call: {e}"))))?;
        let sup = &self.leader.node;
        // The actor is the certificate's user, whatever the call says.
        let (actor, role) = admin_identity(sup, &req, &call.actor)?;
        call.actor = actor;
        call.forwarded = false;
        if let AdminRequest::Write { op } = &call.request {
            if op.is_record_only() {
                return Err(Status::from(ApiError::invalid(format!(
                    "{} is recorded by the supervisors themselves; no client may write it",
                    op.summary()
                ))));
            }
        }
        authorize(&self.leader, &call.actor, role, &call.request).await?;
        if call.request.is_write() {
            self.quota
                .take(&call.actor, Instant::now())
                .map_err(|e| {
                    tracing::debug!(actor = %call.actor, retry_ms = e.retry_ms, "admin write over quota");
                    Status::from(ApiError::new(ErrorKind::ResourceExhausted, e.to_string()))
                })?;
        }
        tracing::debug!(actor = %call.actor, request = ?call.request, "admin call");
        let reply = handle(&self.leader, call).await.map_err(Status::from)?;
        let body = serde_json::to_vec(&reply).map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(Blob { body }))
    }

    type FollowStream = Pin<Box<dyn Stream<Item = Result<Blob, Status>> + Send>>;

    async fn follow(
        &self,
        req: Request<FollowRequest>,
    ) -> Result<Response<Self::FollowStream>, Status> {
        let sup = &self.leader.node;
        let (actor, role) = admin_identity(sup, &req, "")?;
        authorize(
            &self.leader,
            &actor,
            role,
            &AdminRequest::Events {
                since: 0,
                limit: 0,
                newest: false,
            },
        )
        .await?;
        let mut since = req.get_ref().since;
        let peer = peer_of(sup, &req);
        let sup = self.leader.node.clone();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Blob, Status>>(256);
        tokio::spawn(async move {
            let mut applied = sup.raft.metrics();
            loop {
                let batch: Vec<crate::api::FollowedEvent> = sup.read_replica(|r| {
                    let (batch, _) = events_since(&r.state.events, since, 256, false);
                    batch
                        .into_iter()
                        .map(|e| crate::api::FollowedEvent {
                            applied_unix_ns: r.applied_unix_ns(e.seq),
                            record: e,
                        })
                        .collect()
                });
                for followed in batch {
                    since = followed.record.seq;
                    let body = match serde_json::to_vec(&followed) {
                        Ok(b) => b,
                        Err(_) => continue,
                    };
                    if tx.send(Ok(Blob { body })).await.is_err() {
                        return; // client went away
                    }
                }
                // Wait for the next apply (or a periodic re-check).
                tokio::select! {
                    r = applied.changed() => if r.is_err() { return },
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    _ = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(guarded(
            &self.leader.node,
            peer,
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}
