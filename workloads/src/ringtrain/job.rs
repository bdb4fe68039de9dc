//! The job side of the contract with the local agent: registration of the
//! ring's connections, their moves, and the agent's orders.
//!
//! Migrate and pace orders are carried out here at once. Checkpoint orders
//! go to the training loop through [`Orders`]: the loop raises the
//! "checkpoint" (and "halt") flag in the next step's all-reduce, every rank
//! learns the OR of the flags at that same step, and each writes its file
//! after it. A rank whose own order arrives after a checkpoint that another
//! rank's order triggered answers it with that checkpoint's step (it is
//! "claimed"), so all ranks answer one order with the same step.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdma::contract::{ConnUp, ContractClient, Hello, OrderKind, OrderStream};

use super::config::Config;
use super::net::ConnInfo;

/// A checkpoint another rank asked for stays claimable this long (the
/// supervisor fails an order unanswered for 30 s).
pub const CLAIM_WINDOW: Duration = Duration::from_secs(30);
/// Most unclaimed checkpoints remembered.
const MAX_UNCLAIMED: usize = 16;
/// Most checkpoint orders waiting for a step.
const MAX_PENDING: usize = 64;

/// Exit code after a stop order or SIGTERM.
pub const EXIT_STOPPED: i32 = 143;

/// A checkpoint order waiting for its step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub order_id: u64,
    /// Checkpoint at this step (`None`: the next one every rank reaches).
    pub step: Option<u64>,
    pub halt: bool,
}

impl Pending {
    /// Whether the checkpoint that completes step `completed` answers it.
    pub fn due(&self, completed: u64) -> bool {
        self.step.is_none_or(|n| n <= completed)
    }
}

#[derive(Debug, Default)]
struct Unclaimed {
    step: u64,
    halt: bool,
    at: Option<Instant>,
}

/// What the training loop and the order handler share.
#[derive(Debug, Default)]
pub struct OrderState {
    pub pending: Vec<Pending>,
    unclaimed: VecDeque<Unclaimed>,
    /// Steps completed.
    pub completed: u64,
    /// Set once a halting checkpoint is written.
    pub halted_at: Option<u64>,
    /// Set once every step is done.
    pub finished: bool,
}

/// What to do with a new checkpoint order.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Answer at once.
    Answer { ok: bool, detail: String },
    /// Answer at once: the checkpoint at this step is the order's.
    Checkpointed(u64),
    /// Queued for the training loop.
    Queued,
}

impl OrderState {
    /// Takes a checkpoint order (pure bookkeeping, no I/O).
    pub fn checkpoint_order(
        &mut self,
        p: Pending,
        total_steps: u64,
        have_dir: bool,
        now: Instant,
    ) -> Decision {
        let answer = |ok, detail: String| Decision::Answer { ok, detail };
        if !have_dir {
            return answer(false, "no checkpoint directory configured".into());
        }
        if let Some(n) = self.halted_at {
            return Decision::Checkpointed(n);
        }
        if self.finished {
            return answer(
                false,
                format!("the job finished all {total_steps} steps; no checkpoint"),
            );
        }
        if let Some(n) = p.step.filter(|n| *n > total_steps) {
            return answer(
                false,
                format!("step {n} is past the job's last step {total_steps}"),
            );
        }
        self.unclaimed
            .retain(|u| u.at.is_some_and(|t| now.duration_since(t) < CLAIM_WINDOW));
        if let Some(i) = self
            .unclaimed
            .iter()
            .position(|u| (u.halt || !p.halt) && p.step.is_none_or(|n| n == u.step))
        {
            let u = self.unclaimed.remove(i).expect("index from position");
            return Decision::Checkpointed(u.step);
        }
        if self.pending.len() >= MAX_PENDING {
            return answer(false, "too many checkpoint orders waiting".into());
        }
        self.pending.push(p);
        Decision::Queued
    }

    /// The flags this rank raises for the step that completes `completed`.
    pub fn local_flags(&self, completed: u64) -> u32 {
        use super::allreduce::{FLAG_CHECKPOINT, FLAG_HALT};
        let mut f = 0;
        for p in self.pending.iter().filter(|p| p.due(completed)) {
            f |= FLAG_CHECKPOINT;
            if p.halt {
                f |= FLAG_HALT;
            }
        }
        f
    }

    /// A checkpoint at `step` was written because the ranks' flags asked
    /// for it: returns the orders it answers. If this rank had none, the
    /// checkpoint waits to be claimed by its order (on its way).
    pub fn checkpoint_written(
        &mut self,
        step: u64,
        halt: bool,
        raised_here: bool,
        now: Instant,
    ) -> Vec<Pending> {
        let (done, keep): (Vec<_>, Vec<_>) = self
            .pending
            .drain(..)
            .partition(|p| p.due(step) && (halt || !p.halt));
        self.pending = keep;
        if !raised_here && done.is_empty() {
            if self.unclaimed.len() >= MAX_UNCLAIMED {
                self.unclaimed.pop_front();
            }
            self.unclaimed.push_back(Unclaimed {
                step,
                halt,
                at: Some(now),
            });
        }
        done
    }
}

/// The shared order state.
pub type Orders = Arc<Mutex<OrderState>>;

pub fn lock(o: &Orders) -> std::sync::MutexGuard<'_, OrderState> {
    o.lock().unwrap_or_else(|e| e.into_inner())
}

/// Says hello and registers every connection on its home NIC.
pub async fn connect(
    cfg: &Config,
    socket: &std::path::Path,
    conns: &[ConnInfo],
) -> anyhow::Result<(ContractClient, OrderStream)> {
    use anyhow::Context;
    let (client, orders) = ContractClient::connect(
        socket,
        Hello {
            job: cfg.job.clone(),
            rank: cfg.rank,
            pid: std::process::id(),
        },
    )
    .await
    .with_context(|| format!("job contract with the agent at {}", socket.display()))?;
    for c in conns {
        let nic = c.current_nic().unwrap_or(c.home);
        client
            .conn_up(ConnUp {
                job: cfg.job.clone(),
                rank: cfg.rank,
                conn_id: c.id,
                nic: cfg.nics[nic].name.clone(),
                peer_host: c.peer_host.clone(),
                peer_rank: c.peer_rank,
                rail: c.home as u32,
            })
            .await
            .with_context(|| format!("registering connection {}", c.id))?;
    }
    Ok((client, orders))
}

/// Reports `conn_closed` for every connection (bounded), says why on
/// stdout and exits with [`EXIT_STOPPED`].
pub async fn exit_stopped(
    client: Option<&ContractClient>,
    conns: &[ConnInfo],
    orders: &Orders,
    reason: &str,
) -> ! {
    let step = lock(orders).completed;
    println!("stopped step={step} reason={reason}");
    tracing::info!(step, reason, "stopping");
    if let Some(client) = client {
        for c in conns {
            let _ =
                tokio::time::timeout(Duration::from_millis(500), client.conn_closed(c.id)).await;
        }
    }
    std::process::exit(EXIT_STOPPED)
}

/// How long a connection is without a path before the agent hears of it:
/// long enough for a failover to another rail (tens of ms), short enough
/// that railguard moves the job within about a second.
const STALL_REPORT_AFTER: Duration = Duration::from_millis(500);

/// Serves the agent: reports moves, carries out orders. Never returns
/// while the contract is up (a stop order exits the process).
pub async fn serve(
    cfg: Arc<Config>,
    client: ContractClient,
    mut stream: OrderStream,
    conns: Vec<ConnInfo>,
    orders: Orders,
) {
    let mut watches: Vec<_> = conns.iter().map(|c| c.control.watch_stats()).collect();
    let mut reported: Vec<usize> = conns
        .iter()
        .map(|c| c.current_nic().unwrap_or(c.home))
        .collect();
    // Whether each connection's current stall (no path) was reported.
    let mut stall_told = vec![false; conns.len()];
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            o = stream.next() => {
                let Some(o) = o else {
                    tracing::warn!("the contract client stopped; orders are no longer served");
                    return;
                };
                tracing::info!(order_id = o.order_id, kind = ?o.kind, "order");
                let (ok, detail) = match o.kind {
                    OrderKind::Migrate { conn_ids, to_nic } => migrate(&cfg, &conns, &conn_ids, to_nic.as_deref()).await,
                    OrderKind::Pace { conn_id, bytes_per_s } => match conns.iter().find(|c| c.id == conn_id) {
                        Some(c) => match c.control.set_rate(bytes_per_s).await {
                            Ok(()) => (true, "paced".to_string()),
                            Err(e) => (false, e.to_string()),
                        },
                        None => (false, format!("{conn_id}: unknown connection")),
                    },
                    OrderKind::Checkpoint { step, halt } => {
                        let p = Pending { order_id: o.order_id, step, halt };
                        let d = lock(&orders).checkpoint_order(p, cfg.steps, cfg.checkpoint_dir.is_some(), Instant::now());
                        match d {
                            Decision::Answer { ok, detail } => (ok, detail),
                            Decision::Checkpointed(n) => {
                                if let Err(e) = client.checkpoint_done(o.order_id, n).await {
                                    tracing::warn!(order_id = o.order_id, error = %e, "order answer not delivered");
                                }
                                continue;
                            }
                            Decision::Queued => continue,
                        }
                    }
                    OrderKind::Stop => {
                        let step = lock(&orders).completed;
                        let _ = client.order_done(o.order_id, true, &format!("stopping at step={step}")).await;
                        exit_stopped(Some(&client), &conns, &orders, "order").await;
                    }
                };
                if let Err(e) = client.order_done(o.order_id, ok, &detail).await {
                    tracing::warn!(order_id = o.order_id, error = %e, "order answer not delivered");
                }
            }
            _ = tick.tick() => {
                for (i, w) in watches.iter_mut().enumerate() {
                    let (rail, stalled_since) = {
                        let s = w.borrow_and_update();
                        (s.rail, s.stalled_since)
                    };
                    // No path for a while: tell the agent once per stall,
                    // so railguard moves the job before our own timeout.
                    // The fragile baseline stands for a job without
                    // railguard's help: it waits for its own timeout.
                    match stalled_since {
                        Some(at) if !cfg.fragile && !stall_told[i] && at.elapsed() >= STALL_REPORT_AFTER => {
                            stall_told[i] = true;
                            tracing::warn!(conn_id = conns[i].id, "connection stalled: no path to its peer");
                            if let Err(e) = client.conn_stalled(conns[i].id).await {
                                tracing::warn!(conn_id = conns[i].id, error = %e, "conn_stalled not delivered");
                            }
                        }
                        None => stall_told[i] = false,
                        Some(_) => {}
                    }
                    let Some(nic) = rail.and_then(|r| conns[i].rail_nics.get(r).copied()) else { continue };
                    if nic != reported[i] {
                        let name = &cfg.nics[nic].name;
                        match client.conn_moved(conns[i].id, name).await {
                            Ok(_) => {
                                tracing::info!(conn_id = conns[i].id, nic = %name, "connection moved");
                                reported[i] = nic;
                            }
                            Err(e) => tracing::warn!(conn_id = conns[i].id, error = %e, "conn_moved not delivered"),
                        }
                    }
                }
            }
        }
    }
}

/// Carries out a migrate order: `(ok, detail)`.
async fn migrate(
    cfg: &Config,
    conns: &[ConnInfo],
    ids: &[u64],
    to_nic: Option<&str>,
) -> (bool, String) {
    let to = match to_nic {
        Some(name) => match cfg.nics.iter().position(|n| n.name == name) {
            Some(i) => Some(i),
            None => return (false, format!("this host has no data NIC {name}")),
        },
        None => None,
    };
    let mut failed = Vec::new();
    for id in ids {
        let Some(c) = conns.iter().find(|c| c.id == *id) else {
            failed.push(format!("{id}: unknown connection"));
            continue;
        };
        let rail = match to {
            Some(nic) => match c.rail_nics.iter().position(|n| *n == nic) {
                Some(r) => Some(r),
                None => {
                    failed.push(format!("{id}: no rail on {}", cfg.nics[nic].name));
                    continue;
                }
            },
            None if c.rail_nics.len() < 2 => {
                failed.push(format!("{id}: no backup rail"));
                continue;
            }
            None => None,
        };
        if let Err(e) = c.control.migrate(rail).await {
            failed.push(format!("{id}: {e}"));
        }
    }
    if failed.is_empty() {
        (true, "moving".into())
    } else {
        (false, failed.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use crate::ringtrain::allreduce::{FLAG_CHECKPOINT, FLAG_HALT};
    use crate::ringtrain::job::*;

    fn p(id: u64, step: Option<u64>, halt: bool) -> Pending {
        Pending {
            order_id: id,
            step,
            halt,
        }
    }

    #[test]
    fn an_order_is_due_at_its_step_or_the_next_one() {
        let mut s = OrderState::default();
        let now = Instant::now();
        assert_eq!(
            s.checkpoint_order(p(1, Some(10), false), 100, true, now),
            Decision::Queued
        );
        assert_eq!(s.local_flags(9), 0);
        assert_eq!(s.local_flags(10), FLAG_CHECKPOINT);
        assert_eq!(
            s.checkpoint_order(p(2, None, true), 100, true, now),
            Decision::Queued
        );
        assert_eq!(s.local_flags(3), FLAG_CHECKPOINT | FLAG_HALT);
        // A checkpoint at 3 without halt answers neither (1 is for 10, 2 halts).
        assert!(s.checkpoint_written(3, false, true, now).is_empty());
        let done = s.checkpoint_written(10, true, true, now);
        assert_eq!(done.len(), 2);
        assert!(s.pending.is_empty());
    }

    #[test]
    fn a_late_order_claims_the_checkpoint_a_peer_triggered() {
        let mut s = OrderState::default();
        let now = Instant::now();
        // A peer's flag made us write at 7; we had no order.
        assert!(s.checkpoint_written(7, false, false, now).is_empty());
        // Our copy of the order arrives: answered with 7, once.
        assert_eq!(
            s.checkpoint_order(p(5, None, false), 100, true, now),
            Decision::Checkpointed(7)
        );
        assert_eq!(
            s.checkpoint_order(p(6, None, false), 100, true, now),
            Decision::Queued
        );
        // A halting order does not claim a checkpoint that did not halt.
        let mut s = OrderState::default();
        s.checkpoint_written(7, false, false, now);
        assert_eq!(
            s.checkpoint_order(p(5, None, true), 100, true, now),
            Decision::Queued
        );
        // Stale unclaimed checkpoints are forgotten.
        let mut s = OrderState::default();
        s.checkpoint_written(7, false, false, now);
        let later = now + CLAIM_WINDOW + Duration::from_secs(1);
        assert_eq!(
            s.checkpoint_order(p(5, None, false), 100, true, later),
            Decision::Queued
        );
    }

    #[test]
    fn halted_finished_and_invalid_orders_are_answered_at_once() {
        let now = Instant::now();
        let mut s = OrderState {
            halted_at: Some(12),
            ..Default::default()
        };
        assert_eq!(
            s.checkpoint_order(p(1, None, true), 100, true, now),
            Decision::Checkpointed(12)
        );
        let mut s = OrderState::default();
        assert!(matches!(
            s.checkpoint_order(p(1, Some(101), false), 100, true, now),
            Decision::Answer { ok: false, .. }
        ));
        assert!(matches!(
            s.checkpoint_order(p(1, None, false), 100, false, now),
            Decision::Answer { ok: false, .. }
        ));
        s.finished = true;
        assert!(matches!(
            s.checkpoint_order(p(1, None, false), 100, true, now),
            Decision::Answer { ok: false, .. }
        ));
    }
}
