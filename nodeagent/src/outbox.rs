//! The agent's persisted, bounded outbox of sequence-numbered reports.
//!
//! **Contract.** Every report gets the next sequence number (gapless,
//! starting at one). [`record`] hands it to the sender at once and answers
//! its caller once it is on disk, so the disk write and the trip to the
//! supervisor overlap (a NIC report reaches Raft one flush sooner) while a
//! caller that acts on a report's durability (the job runner forgets an
//! exited rank) still waits for it. An agent restart resends exactly what
//! the supervisor has not acknowledged: on start-up the outbox is
//! reconciled with the supervisor's last applied sequence
//! ([`Outbox::resync`]). A crash after a report was sent but before it was
//! on disk leaves the supervisor ahead of the disk (so does a lost data
//! directory). The first resync after opening then moves every report
//! staged since the open (none of them sent yet: the reporter sends only
//! after a resync) to the numbers after the supervisor's, in order, so a
//! sequence number is never used for two reports and nothing staged before
//! the first registration is taken for applied. A report staged but
//! neither sent nor on disk at a crash is lost as if the crash had come
//! before it: its caller had not been answered, and a restarted agent
//! reports its NICs' and ranks' state afresh.
//!
//! **Bound.** At most `capacity` reports wait for acknowledgement. When full,
//! further reports are *coalesced*: only the newest report per subject (a
//! NIC, a connection) is kept (in a side table bounded by the number of NICs
//! and connections, also persisted), with a count of the NIC transitions it
//! stands for; it gets its sequence number when room frees up, so sequences
//! never have gaps. A `QpReset` supersedes connection reports held back
//! before it.
//!
//! **Orders.** The same database keeps the outcome of every order the agent
//! executed ([`OrderLog`], bounded), so a repeated order id is answered
//! from the record instead of being carried out again.
//!
//! **Ranks.** Rank exits and checkpoints ([`crate::jobs`]) are reports like
//! the others; the variants are appended to [`Report`], so an outbox written
//! by an older agent still reads (format 2).

use durable_sled::DurableDb;
use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use proto::agent::{Order, OrderOutcome};

use crate::store_format::{self, FormatError};

/// The reports: the border types, stored as they are sent.
pub use proto::agent::{
    ConnStallReport, NicReport, QpReport, RankCheckpointReport, RankExitReport, ReflexReport,
    Report,
};

const QP_KEY_PREFIX: &str = "qp/";

/// What a newer report of the same key supersedes when coalescing.
fn coalesce_key(report: &Report) -> String {
    match report {
        Report::Nic(r) => format!("nic/{}", r.nic),
        Report::Qp(q) => format!("{QP_KEY_PREFIX}{}/{}/{}", q.job, q.rank, q.conn_id),
        Report::QpReset { .. } => "qp-reset".into(),
        Report::Reflex(r) => format!("reflex/{}", r.nic),
        Report::RankExited(r) => format!("rank-exit/{}/{}/{}", r.job, r.incarnation, r.rank),
        // A newer step of the same rank supersedes an older one.
        Report::RankCheckpoint(r) => {
            format!("rank-ckpt/{}/{}/{}", r.job, r.incarnation, r.rank)
        }
        // One stall per connection and incarnation is enough.
        Report::ConnStalled(r) => format!(
            "conn-stall/{}/{}/{}/{}",
            r.job, r.incarnation, r.rank, r.conn_id
        ),
    }
}

/// A report with its sequence number.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sequenced {
    pub seq: u64,
    pub report: Report,
}

/// The first on-disk format (NIC reports only), read once to migrate.
#[derive(Deserialize)]
struct SequencedV1 {
    seq: u64,
    report: NicReport,
}

/// Outbox failures (disk).
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// The database at `path` could not be opened, read or written.
    #[error("outbox storage at {path}: {source}")]
    Sled {
        /// The database directory.
        path: String,
        /// What sled said.
        #[source]
        source: sled::Error,
    },
    /// A record (or the outbox's own format stamp) does not decode, or
    /// names a format newer than this agent reads.
    #[error("outbox record is corrupt: {0}")]
    Corrupt(String),
    /// A tree's format version is unknown (see [`crate::store_format`]).
    #[error(transparent)]
    Format(#[from] FormatError),
}

const KEY_NEXT: &[u8] = b"next_seq";
const KEY_OVERFLOW: &[u8] = b"overflow";
const KEY_FORMAT: &[u8] = b"format";
/// On-disk format: 1 (implicit) held NIC reports only; 2 holds [`Report`]s.
const FORMAT: u32 = 2;

fn corrupt(e: impl std::fmt::Display) -> OutboxError {
    OutboxError::Corrupt(e.to_string())
}

/// The outbox.
pub struct Outbox {
    db: DurableDb,
    queue: sled::Tree,
    meta: sled::Tree,
    path: String,
    capacity: usize,
    next_seq: u64,
    overflow: BTreeMap<String, Report>,
    /// The next sequence when the outbox was opened, until the first
    /// resync: reports from it on were staged since and not yet sent.
    unsynced_from: Option<u64>,
}

impl Outbox {
    /// Opens (or creates) the outbox in `dir`.
    pub fn open(dir: &Path, capacity: usize) -> Result<Outbox, OutboxError> {
        let path = dir.display().to_string();
        let e = |source| OutboxError::Sled {
            path: path.clone(),
            source,
        };
        let db = DurableDb::open_path(dir).map_err(e)?;
        let queue = db.open_tree("queue").map_err(e)?;
        let meta = db.open_tree("meta").map_err(e)?;
        let next_seq = match meta.get(KEY_NEXT).map_err(e)? {
            Some(b) => bincode::deserialize(&b).map_err(|x| OutboxError::Corrupt(x.to_string()))?,
            None => 1,
        };
        let format: u32 = match meta.get(KEY_FORMAT).map_err(e)? {
            Some(b) => bincode::deserialize(&b).map_err(corrupt)?,
            None => 1,
        };
        if format > FORMAT {
            return Err(OutboxError::Corrupt(format!(
                "outbox {path}: tree `queue` has format {format}, newer than this agent understands ({FORMAT})"
            )));
        }
        let overflow = match meta.get(KEY_OVERFLOW).map_err(e)? {
            Some(b) if format == 1 => {
                let old: BTreeMap<String, NicReport> = bincode::deserialize(&b).map_err(corrupt)?;
                old.into_values()
                    .map(|r| {
                        let r = Report::Nic(r);
                        (coalesce_key(&r), r)
                    })
                    .collect()
            }
            Some(b) => bincode::deserialize(&b).map_err(corrupt)?,
            None => BTreeMap::new(),
        };
        if format == 1 {
            // Rewrite the queue in the current format, in one batch.
            let mut batch = sled::Batch::default();
            for kv in queue.iter() {
                let (k, v) = kv.map_err(e)?;
                let old: SequencedV1 = bincode::deserialize(&v).map_err(corrupt)?;
                let new = Sequenced {
                    seq: old.seq,
                    report: Report::Nic(old.report),
                };
                batch.insert(k, bincode::serialize(&new).map_err(corrupt)?);
            }
            queue.apply_batch(batch).map_err(e)?;
            meta.insert(
                KEY_OVERFLOW,
                bincode::serialize(&overflow).map_err(corrupt)?,
            )
            .map_err(e)?;
            meta.insert(KEY_FORMAT, bincode::serialize(&FORMAT).map_err(corrupt)?)
                .map_err(e)?;
            db.flush().map_err(e)?;
        }
        Ok(Outbox {
            db,
            queue,
            meta,
            path,
            capacity: capacity.max(1),
            next_seq,
            overflow,
            unsynced_from: Some(next_seq),
        })
    }

    fn err(&self) -> impl Fn(sled::Error) -> OutboxError + '_ {
        move |source| OutboxError::Sled {
            path: self.path.clone(),
            source,
        }
    }

    /// Reports waiting for acknowledgement.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty() && self.overflow.is_empty()
    }

    /// Reports held back by coalescing.
    pub fn coalesced_pending(&self) -> usize {
        self.overflow.len()
    }

    fn enqueue(&mut self, report: Report) -> Result<u64, OutboxError> {
        let seq = self.next_seq;
        let bytes = bincode::serialize(&Sequenced { seq, report })
            .map_err(|x| OutboxError::Corrupt(x.to_string()))?;
        self.queue
            .insert(seq.to_be_bytes(), bytes)
            .map_err(self.err())?;
        self.next_seq += 1;
        self.save_next_seq()?;
        Ok(seq)
    }

    fn save_next_seq(&self) -> Result<(), OutboxError> {
        self.meta
            .insert(KEY_NEXT, bincode::serialize(&self.next_seq).expect("u64"))
            .map_err(self.err())?;
        Ok(())
    }

    fn save_overflow(&self) -> Result<(), OutboxError> {
        let b =
            bincode::serialize(&self.overflow).map_err(|x| OutboxError::Corrupt(x.to_string()))?;
        self.meta.insert(KEY_OVERFLOW, b).map_err(self.err())?;
        Ok(())
    }

    /// Adds a report and makes it durable. Returns its sequence number, or
    /// None if it was coalesced (outbox full).
    pub async fn push(&mut self, report: impl Into<Report>) -> Result<Option<u64>, OutboxError> {
        let seq = self.add(report.into())?;
        self.db.flush_async().await.map_err(self.err())?;
        Ok(seq)
    }

    /// Adds several reports in order and makes them durable with one flush.
    pub async fn push_all(&mut self, reports: Vec<Report>) -> Result<(), OutboxError> {
        if reports.is_empty() {
            return Ok(());
        }
        self.stage(reports)?;
        self.db.flush_async().await.map_err(self.err())?;
        Ok(())
    }

    /// Adds reports in order, visible to [`Outbox::pending_after`] at once
    /// but not yet durable: [`record`] flushes them.
    fn stage(&mut self, reports: Vec<Report>) -> Result<Vec<Option<u64>>, OutboxError> {
        reports.into_iter().map(|r| self.add(r)).collect()
    }

    fn add(&mut self, report: Report) -> Result<Option<u64>, OutboxError> {
        if self.queue.len() < self.capacity && self.overflow.is_empty() {
            return Ok(Some(self.enqueue(report)?));
        }
        let key = coalesce_key(&report);
        let mut r = report;
        match (self.overflow.remove(&key), &mut r) {
            (Some(Report::Nic(old)), Report::Nic(new)) => {
                new.coalesced += old.coalesced + 1;
                tracing::warn!(nic = %new.nic, coalesced = new.coalesced, "outbox full: keeping only the newest report for this NIC");
            }
            (_, Report::QpReset { .. }) => {
                // Placements from before the reset are superseded by it.
                self.overflow.retain(|k, _| !k.starts_with(QP_KEY_PREFIX));
                tracing::warn!(
                    "outbox full: connection reports held back before the reset are dropped"
                );
            }
            (_, _) => {
                tracing::warn!(key = %key, "outbox full: keeping only the newest report of this subject");
            }
        }
        self.overflow.insert(key, r);
        self.save_overflow()?;
        Ok(None)
    }

    /// Reports with sequence > `after`, in order.
    pub fn pending_after(&self, after: u64) -> Result<Vec<Sequenced>, OutboxError> {
        let mut out = Vec::new();
        for kv in self.queue.range((after + 1).to_be_bytes()..) {
            let (_, v) = kv.map_err(self.err())?;
            out.push(bincode::deserialize(&v).map_err(|x| OutboxError::Corrupt(x.to_string()))?);
        }
        Ok(out)
    }

    /// Drops everything acknowledged (seq <= `through`), then moves
    /// coalesced reports into the freed room.
    pub async fn ack(&mut self, through: u64) -> Result<(), OutboxError> {
        let mut batch = sled::Batch::default();
        for k in self.queue.range(..=through.to_be_bytes()).keys() {
            batch.remove(k.map_err(self.err())?);
        }
        self.queue.apply_batch(batch).map_err(self.err())?;
        let mut moved = false;
        while self.queue.len() < self.capacity {
            // Key order puts NIC reports first and a reset before the
            // connection reports that follow it.
            let Some((_, r)) = self.overflow.pop_first() else {
                break;
            };
            self.enqueue(r)?;
            moved = true;
        }
        if moved {
            self.save_overflow()?;
            self.db.flush_async().await.map_err(self.err())?;
        }
        Ok(())
    }

    /// Reconciles with the supervisor's last applied sequence for this host
    /// (from registration): drops what it already has, and never reuses a
    /// sequence number it has applied (even if local state was lost).
    pub async fn resync(&mut self, last_applied: u64) -> Result<(), OutboxError> {
        let mut changed = false;
        if let Some(from) = self.unsynced_from.take() {
            if last_applied >= from {
                // The supervisor applied reports this disk never recorded
                // (sent just before a crash, or the local state was lost):
                // what was staged since the open was never sent.
                self.renumber(from, last_applied + 1)?;
                changed = true;
            }
        }
        if self.next_seq <= last_applied {
            tracing::warn!(
                next_seq = self.next_seq,
                last_applied,
                "outbox behind the supervisor; skipping ahead"
            );
            self.next_seq = last_applied + 1;
            self.save_next_seq()?;
            changed = true;
        }
        if changed {
            self.db.flush_async().await.map_err(self.err())?;
        }
        self.ack(last_applied).await
    }

    /// Gives the queued reports numbered `from` and up the numbers from
    /// `to` on, in order.
    fn renumber(&mut self, from: u64, to: u64) -> Result<(), OutboxError> {
        let staged = self.pending_after(from.saturating_sub(1))?;
        let mut batch = sled::Batch::default();
        for s in &staged {
            batch.remove(&s.seq.to_be_bytes());
        }
        let (n, mut next) = (staged.len(), to);
        for s in staged {
            let bytes = bincode::serialize(&Sequenced {
                seq: next,
                report: s.report,
            })
            .map_err(corrupt)?;
            batch.insert(&next.to_be_bytes(), bytes);
            next += 1;
        }
        self.queue.apply_batch(batch).map_err(self.err())?;
        tracing::warn!(
            reports = n,
            from,
            to,
            "the supervisor applied reports this outbox never recorded: the ones staged since start renumbered after them"
        );
        self.next_seq = next;
        self.save_next_seq()?;
        Ok(())
    }

    /// The sequence the next report will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The database and its path, for other durable agent state (the job
    /// launcher's trees).
    pub fn database(&self) -> (DurableDb, String) {
        (self.db.clone(), self.path.clone())
    }

    /// The record of executed orders, in the same database.
    pub fn order_log(&self, capacity: usize) -> Result<OrderLog, OutboxError> {
        OrderLog::open(&self.db, &self.path, capacity)
    }
}

/// Adds `reports` to `outbox` in order, wakes the sender (`fresh`) so they
/// leave at once, and returns (their sequence numbers, None where one was
/// coalesced) once they are on disk. The lock is not held during the flush,
/// so the sender reads them meanwhile; see the module's contract.
pub async fn record(
    outbox: &tokio::sync::Mutex<Outbox>,
    reports: Vec<Report>,
    fresh: &tokio::sync::Notify,
) -> Result<Vec<Option<u64>>, OutboxError> {
    if reports.is_empty() {
        return Ok(Vec::new());
    }
    let (seqs, pending) = stage_and_wake(outbox, reports, fresh).await?;
    pending.flush().await?;
    Ok(seqs)
}

/// [`record`]'s first half: the reports staged, the sender woken, and the
/// flush that makes them durable still to do.
async fn stage_and_wake(
    outbox: &tokio::sync::Mutex<Outbox>,
    reports: Vec<Report>,
    fresh: &tokio::sync::Notify,
) -> Result<(Vec<Option<u64>>, PendingFlush), OutboxError> {
    let (seqs, pending) = {
        let mut o = outbox.lock().await;
        let seqs = o.stage(reports)?;
        (
            seqs,
            PendingFlush {
                db: o.db.clone(),
                path: o.path.clone(),
            },
        )
    };
    fresh.notify_one();
    Ok((seqs, pending))
}

/// Staged reports not yet known durable.
struct PendingFlush {
    db: DurableDb,
    path: String,
}

impl PendingFlush {
    async fn flush(self) -> Result<(), OutboxError> {
        let path = self.path;
        self.db
            .flush_async()
            .await
            .map_err(|source| OutboxError::Sled { path, source })?;
        Ok(())
    }
}

/// The order a stored outcome belongs to: typed, or (a record written
/// before the order log was typed, format 1) the order's description.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RecordedOrder {
    /// The order itself (format 2).
    Typed(Order),
    /// [`Order::describe`] of the order (migrated from format 1).
    Described(String),
}

impl RecordedOrder {
    /// Whether `order` is the order recorded (a repeated id must carry the
    /// same order).
    pub fn is(&self, order: &Order) -> bool {
        match self {
            RecordedOrder::Typed(o) => o == order,
            RecordedOrder::Described(d) => *d == order.describe(),
        }
    }

    /// For logs.
    pub fn describe(&self) -> String {
        match self {
            RecordedOrder::Typed(o) => o.describe(),
            RecordedOrder::Described(d) => d.clone(),
        }
    }
}

/// The outcome of an order the agent executed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredOrder {
    /// What the order was (a repeat must be the same order).
    pub order: RecordedOrder,
    /// How it ended, as it was answered.
    pub outcome: OrderOutcome,
    /// When it was recorded (ms since the Unix epoch).
    pub at_unix_ms: u64,
}

/// A format-1 order log record (before the order log was typed).
#[derive(Deserialize)]
struct StoredOrderV1 {
    order: String,
    ok: bool,
    detail: String,
    at_unix_ms: u64,
}

/// The order log's tree.
pub const ORDER_TREE: &str = "orders";
/// The order log's format: 1 held descriptions and (ok, detail); 2 holds
/// [`StoredOrder`].
pub const ORDER_LOG_FORMAT: u32 = 2;

/// Executed orders by id (durable, the `capacity` highest ids kept).
#[derive(Clone)]
pub struct OrderLog {
    db: DurableDb,
    tree: sled::Tree,
    path: String,
    capacity: usize,
}

impl OrderLog {
    /// Opens the tree, checking its format and migrating format 1.
    fn open(db: &DurableDb, path: &str, capacity: usize) -> Result<OrderLog, OutboxError> {
        let e = |source| OutboxError::Sled {
            path: path.to_owned(),
            source,
        };
        let tree = db.open_tree(ORDER_TREE).map_err(e)?;
        let format = store_format::open(db, path, &tree, ORDER_LOG_FORMAT, &[1, ORDER_LOG_FORMAT])?;
        if format == 1 {
            let mut batch = sled::Batch::default();
            for kv in tree.iter() {
                let (k, v) = kv.map_err(e)?;
                let old: StoredOrderV1 = bincode::deserialize(&v)
                    .map_err(|x| corrupt(format!("order log {path}: format 1 record: {x}")))?;
                let new = StoredOrder {
                    order: RecordedOrder::Described(old.order),
                    outcome: if old.ok {
                        OrderOutcome::Done { detail: old.detail }
                    } else {
                        OrderOutcome::Failed { error: old.detail }
                    },
                    at_unix_ms: old.at_unix_ms,
                };
                batch.insert(k, bincode::serialize(&new).map_err(corrupt)?);
            }
            tree.apply_batch(batch).map_err(e)?;
            store_format::stamp(db, path, &tree, ORDER_LOG_FORMAT)?;
            db.flush().map_err(e)?;
            tracing::info!(records = tree.len(), "order log migrated to format 2");
        }
        Ok(OrderLog {
            db: db.clone(),
            tree,
            path: path.to_owned(),
            capacity: capacity.max(1),
        })
    }

    fn err(&self) -> impl Fn(sled::Error) -> OutboxError + '_ {
        move |source| OutboxError::Sled {
            path: self.path.clone(),
            source,
        }
    }

    /// The stored outcome of order `id`, if it was executed.
    pub fn get(&self, id: u64) -> Result<Option<StoredOrder>, OutboxError> {
        match self.tree.get(id.to_be_bytes()).map_err(self.err())? {
            Some(b) => Ok(Some(bincode::deserialize(&b).map_err(|x| {
                corrupt(format!("order log {}: order {id}: {x}", self.path))
            })?)),
            None => Ok(None),
        }
    }

    /// Stores an outcome durably; forgets the lowest ids beyond capacity.
    pub async fn record(&self, id: u64, o: &StoredOrder) -> Result<(), OutboxError> {
        let b = bincode::serialize(o).map_err(corrupt)?;
        self.tree.insert(id.to_be_bytes(), b).map_err(self.err())?;
        while self.tree.len() > self.capacity {
            if self.tree.pop_min().map_err(self.err())?.is_none() {
                break;
            }
        }
        self.db.flush_async().await.map_err(self.err())?;
        Ok(())
    }

    /// Orders remembered.
    pub fn len(&self) -> usize {
        self.tree.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tree.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::agent::NicHealth;

    fn rep(nic: &str, h: NicHealth, n: u64) -> NicReport {
        NicReport {
            nic: nic.into(),
            health: h,
            link_up: h == NicHealth::Up,
            carrier_changes: n,
            flaps: 0,
            penalty: 0.0,
            at_unix_ns: n,
            coalesced: 0,
            probes_lost: false,
        }
    }

    /// `record` wakes the sender before its flush, and the sender can read
    /// the reports then (the lock is free): the disk write overlaps the
    /// send. It answers with the sequence numbers once flushed.
    #[tokio::test]
    async fn record_wakes_the_sender_before_the_flush() {
        let dir = tempfile::tempdir().unwrap();
        let fresh = tokio::sync::Notify::new();
        let o = tokio::sync::Mutex::new(Outbox::open(dir.path(), 100).unwrap());
        let reports = vec![
            Report::Nic(rep("rail0", NicHealth::Down, 1)),
            Report::Nic(rep("rail1", NicHealth::Up, 2)),
        ];
        let (seqs, pending) = stage_and_wake(&o, reports, &fresh).await.unwrap();
        assert_eq!(seqs, vec![Some(1), Some(2)]);
        // Not flushed yet: the sender is woken and reads both.
        tokio::time::timeout(std::time::Duration::from_secs(5), fresh.notified())
            .await
            .expect("the sender was woken before the flush");
        let seen = o.try_lock().expect("lock free").pending_after(0).unwrap();
        assert_eq!(seen.iter().map(|s| s.seq).collect::<Vec<_>>(), vec![1, 2]);
        pending.flush().await.unwrap();
        let more = vec![Report::Nic(rep("rail0", NicHealth::Up, 3))];
        assert_eq!(record(&o, more, &fresh).await.unwrap(), vec![Some(3)]);
        assert!(record(&o, Vec::new(), &fresh).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn survives_restart_and_resends_only_unacked() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut o = Outbox::open(dir.path(), 100).unwrap();
            for i in 1..=5 {
                assert_eq!(
                    o.push(rep("rail0", NicHealth::Down, i)).await.unwrap(),
                    Some(i)
                );
            }
            o.ack(2).await.unwrap();
        }
        let mut o = Outbox::open(dir.path(), 100).unwrap();
        let p = o.pending_after(0).unwrap();
        assert_eq!(p.iter().map(|s| s.seq).collect::<Vec<_>>(), vec![3, 4, 5]);
        assert_eq!(
            o.push(rep("rail0", NicHealth::Up, 6)).await.unwrap(),
            Some(6)
        );
        // The supervisor already applied through 4 (acks were lost).
        o.resync(4).await.unwrap();
        assert_eq!(
            o.pending_after(0)
                .unwrap()
                .iter()
                .map(|s| s.seq)
                .collect::<Vec<_>>(),
            vec![5, 6]
        );
        // Lost local state must not reuse applied sequences.
        o.resync(10).await.unwrap();
        assert_eq!(o.next_seq(), 11);
        assert!(o.pending_after(0).unwrap().is_empty());
    }

    /// A crash after reports 5 and 6 were sent but before they were on
    /// disk: the restarted agent stages a reset (5 again, locally) before it
    /// registers and hears the supervisor applied 6. The reset is moved to
    /// 7, not taken for applied; a later resync renumbers nothing.
    #[tokio::test]
    async fn the_first_resync_renumbers_what_was_staged_since_the_open() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut o = Outbox::open(dir.path(), 100).unwrap();
            for i in 1..=4 {
                o.push(rep("rail0", NicHealth::Down, i)).await.unwrap();
            }
            o.ack(4).await.unwrap();
        }
        let mut o = Outbox::open(dir.path(), 100).unwrap();
        assert_eq!(o.next_seq(), 5);
        o.push(Report::QpReset { at_unix_ns: 9 }).await.unwrap();
        o.push(rep("rail1", NicHealth::Up, 10)).await.unwrap();
        o.resync(6).await.unwrap();
        let p = o.pending_after(6).unwrap();
        assert_eq!(p.iter().map(|s| s.seq).collect::<Vec<_>>(), vec![7, 8]);
        assert_eq!(p[0].report, Report::QpReset { at_unix_ns: 9 });
        assert_eq!(o.pending_after(0).unwrap().len(), 2, "nothing else left");
        assert_eq!(o.next_seq(), 9);
        // Sent and applied in this life: a re-registration drops, never
        // renumbers.
        o.push(rep("rail1", NicHealth::Down, 11)).await.unwrap();
        o.resync(8).await.unwrap();
        let p = o.pending_after(0).unwrap();
        assert_eq!(p.iter().map(|s| s.seq).collect::<Vec<_>>(), vec![9]);
        drop(o);
        let o = Outbox::open(dir.path(), 100).unwrap();
        assert_eq!(o.next_seq(), 10, "the renumbering is on disk");
    }

    #[tokio::test]
    async fn full_outbox_coalesces_per_nic_without_gaps() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = Outbox::open(dir.path(), 2).unwrap();
        assert_eq!(
            o.push(rep("rail0", NicHealth::Down, 1)).await.unwrap(),
            Some(1)
        );
        assert_eq!(
            o.push(rep("rail0", NicHealth::Up, 2)).await.unwrap(),
            Some(2)
        );
        for i in 3..=7 {
            assert_eq!(
                o.push(rep(
                    "rail0",
                    if i % 2 == 1 {
                        NicHealth::Down
                    } else {
                        NicHealth::Up
                    },
                    i
                ))
                .await
                .unwrap(),
                None
            );
        }
        assert_eq!(
            o.push(rep("rail1", NicHealth::Down, 8)).await.unwrap(),
            None
        );
        assert_eq!(o.coalesced_pending(), 2, "one per NIC");
        o.ack(2).await.unwrap();
        let p = o.pending_after(2).unwrap();
        assert_eq!(
            p.iter().map(|s| s.seq).collect::<Vec<_>>(),
            vec![3, 4],
            "gapless"
        );
        let r0 = p
            .iter()
            .find_map(|s| match &s.report {
                Report::Nic(r) if r.nic == "rail0" => Some(r),
                _ => None,
            })
            .unwrap();
        assert_eq!(r0.health, NicHealth::Down, "the newest state (7: down)");
        assert_eq!(r0.coalesced, 4, "stands for 5 transitions");
        assert_eq!(r0.carrier_changes, 7);
        assert_eq!(o.coalesced_pending(), 0);
    }

    fn qp(conn_id: u64, nic: &str) -> Report {
        Report::Qp(QpReport {
            job: "j".into(),
            rank: 0,
            conn_id,
            nic: nic.into(),
            peer_host: "h1".into(),
            peer_rank: 1,
            rail: 0,
            moved: nic != "rail0",
            closed: false,
            at_unix_ns: 0,
        })
    }

    #[tokio::test]
    async fn full_outbox_keeps_the_newest_placement_and_a_reset_drops_older_ones() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = Outbox::open(dir.path(), 1).unwrap();
        assert_eq!(o.push(qp(1, "rail0")).await.unwrap(), Some(1));
        o.push_all(vec![qp(2, "rail0"), qp(2, "rail1"), qp(3, "rail0")])
            .await
            .unwrap();
        assert_eq!(o.coalesced_pending(), 2, "one per connection");
        o.push(Report::QpReset { at_unix_ns: 5 }).await.unwrap();
        o.push(qp(4, "rail1")).await.unwrap();
        assert_eq!(o.coalesced_pending(), 2, "the reset and what followed it");
        let mut got = Vec::new();
        for seq in 1..=3 {
            let p = o.pending_after(seq - 1).unwrap();
            got.push(p[0].report.clone());
            o.ack(seq).await.unwrap();
        }
        assert_eq!(
            got,
            vec![
                qp(1, "rail0"),
                Report::QpReset { at_unix_ns: 5 },
                qp(4, "rail1")
            ]
        );
        assert!(o.is_empty());
    }

    #[tokio::test]
    async fn a_format_1_outbox_is_migrated() {
        #[derive(Serialize)]
        struct V1 {
            seq: u64,
            report: NicReport,
        }
        let dir = tempfile::tempdir().unwrap();
        {
            let db = sled::Config::new().path(dir.path()).open().unwrap();
            let q = db.open_tree("queue").unwrap();
            let meta = db.open_tree("meta").unwrap();
            for seq in [3u64, 4] {
                let v = V1 {
                    seq,
                    report: rep("rail0", NicHealth::Down, seq),
                };
                q.insert(seq.to_be_bytes(), bincode::serialize(&v).unwrap())
                    .unwrap();
            }
            meta.insert(KEY_NEXT, bincode::serialize(&5u64).unwrap())
                .unwrap();
            let overflow = BTreeMap::from([("rail1".to_string(), rep("rail1", NicHealth::Up, 9))]);
            meta.insert(KEY_OVERFLOW, bincode::serialize(&overflow).unwrap())
                .unwrap();
            db.flush().unwrap();
        }
        let mut o = Outbox::open(dir.path(), 2).unwrap();
        let p = o.pending_after(0).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].report, Report::Nic(rep("rail0", NicHealth::Down, 3)));
        assert_eq!(o.next_seq(), 5);
        o.ack(4).await.unwrap();
        let p = o.pending_after(4).unwrap();
        assert_eq!(p[0].seq, 5);
        assert_eq!(p[0].report, Report::Nic(rep("rail1", NicHealth::Up, 9)));
        drop(o);
        // Opening again reads the new format.
        let o = Outbox::open(dir.path(), 2).unwrap();
        assert_eq!(o.pending_after(0).unwrap().len(), 1);
    }

    #[tokio::test]
    async fn order_log_is_durable_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let stored = |d: &str| StoredOrder {
            order: RecordedOrder::Typed(Order::Failover {
                nic: "rail0".into(),
                to: "rail1".into(),
            }),
            outcome: OrderOutcome::Done { detail: d.into() },
            at_unix_ms: 1,
        };
        {
            let o = Outbox::open(dir.path(), 10).unwrap();
            let log = o.order_log(3).unwrap();
            for id in 1..=5 {
                log.record(id, &stored(&format!("#{id}"))).await.unwrap();
            }
            assert_eq!(log.len(), 3);
        }
        let o = Outbox::open(dir.path(), 10).unwrap();
        let log = o.order_log(3).unwrap();
        assert_eq!(log.get(5).unwrap(), Some(stored("#5")));
        assert_eq!(log.get(2).unwrap(), None, "the lowest ids are forgotten");
    }

    #[tokio::test]
    async fn an_outbox_of_an_unknown_format_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = sled::Config::new().path(dir.path()).open().unwrap();
            let meta = db.open_tree("meta").unwrap();
            meta.insert(KEY_FORMAT, bincode::serialize(&(FORMAT + 1)).unwrap())
                .unwrap();
            db.flush().unwrap();
        }
        let e = Outbox::open(dir.path(), 10).err().unwrap().to_string();
        assert!(
            e.contains("queue") && e.contains(&dir.path().display().to_string()),
            "{e}"
        );
    }

    #[tokio::test]
    async fn the_order_log_refuses_an_unknown_format_and_migrates_format_1() {
        #[derive(Serialize)]
        struct V1 {
            order: String,
            ok: bool,
            detail: String,
            at_unix_ms: u64,
        }
        let dir = tempfile::tempdir().unwrap();
        {
            let db = sled::Config::new().path(dir.path()).open().unwrap();
            let t = db.open_tree(ORDER_TREE).unwrap();
            let v = V1 {
                order: "failover rail0 -> rail1".into(),
                ok: false,
                detail: "no such NIC".into(),
                at_unix_ms: 3,
            };
            t.insert(7u64.to_be_bytes(), bincode::serialize(&v).unwrap())
                .unwrap();
            db.flush().unwrap();
        }
        {
            let o = Outbox::open(dir.path(), 10).unwrap();
            let log = o.order_log(10).unwrap();
            let s = log.get(7).unwrap().unwrap();
            let order = Order::Failover {
                nic: "rail0".into(),
                to: "rail1".into(),
            };
            assert!(
                s.order.is(&order),
                "a migrated record matches by description"
            );
            assert!(!s.order.is(&Order::Failback {
                nic: "rail0".into()
            }));
            assert_eq!(
                s.outcome,
                OrderOutcome::Failed {
                    error: "no such NIC".into()
                }
            );
            let (db, path) = o.database();
            let t = db.open_tree(ORDER_TREE).unwrap();
            crate::store_format::stamp(&db, &path, &t, ORDER_LOG_FORMAT + 1).unwrap();
            db.flush().unwrap();
        }
        let o = Outbox::open(dir.path(), 10).unwrap();
        let e = o.order_log(10).err().unwrap().to_string();
        assert!(e.contains("`orders`") && e.contains("3"), "{e}");
    }
}
