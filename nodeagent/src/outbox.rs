//! The agent's persisted, bounded outbox of sequence-numbered reports.
//!
//! **Contract.** Every report gets the next sequence number (gapless,
//! starting at one) and is flushed to disk before it may be sent, so an agent restart
//! resends exactly what the supervisor has not acknowledged. On start-up the
//! outbox is reconciled with the supervisor's last applied sequence
//! ([`Outbox::resync`]).
//!
//! **Bound.** At most `capacity` reports wait for acknowledgement. When full,
//! further reports are *coalesced*: only the newest report per NIC is kept
//! (in a side table bounded by the number of NICs, also persisted), with a
//! count of the transitions it stands for; it gets its sequence number when
//! room frees up, so sequences never have gaps.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::link::NicHealth;

/// One report about a NIC.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NicReport {
    pub nic: String,
    pub health: NicHealth,
    /// The link itself is up (independent of damping).
    pub link_up: bool,
    pub carrier_changes: u64,
    pub flaps: u32,
    pub penalty: f64,
    pub at_unix_ns: u64,
    /// Transitions folded into this report because the outbox was full.
    pub coalesced: u32,
}

/// A report with its sequence number.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sequenced {
    pub seq: u64,
    pub report: NicReport,
}

/// Outbox failures (disk).
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    #[error("outbox storage at {path}: {source}")]
    Sled {
        path: String,
        #[source]
        source: sled::Error,
    },
    #[error("outbox record is corrupt: {0}")]
    Corrupt(String),
}

const KEY_NEXT: &[u8] = b"next_seq";
const KEY_OVERFLOW: &[u8] = b"overflow";

/// The outbox.
pub struct Outbox {
    db: sled::Db,
    queue: sled::Tree,
    meta: sled::Tree,
    path: String,
    capacity: usize,
    next_seq: u64,
    overflow: BTreeMap<String, NicReport>,
}

impl Outbox {
    /// Opens (or creates) the outbox in `dir`.
    pub fn open(dir: &Path, capacity: usize) -> Result<Outbox, OutboxError> {
        let path = dir.display().to_string();
        let e = |source| OutboxError::Sled {
            path: path.clone(),
            source,
        };
        let db = sled::Config::new().path(dir).open().map_err(e)?;
        let queue = db.open_tree("queue").map_err(e)?;
        let meta = db.open_tree("meta").map_err(e)?;
        let next_seq = match meta.get(KEY_NEXT).map_err(e)? {
            Some(b) => bincode::deserialize(&b).map_err(|x| OutboxError::Corrupt(x.to_string()))?,
            None => 1,
        };
        let overflow = match meta.get(KEY_OVERFLOW).map_err(e)? {
            Some(b) => bincode::deserialize(&b).map_err(|x| OutboxError::Corrupt(x.to_string()))?,
            None => BTreeMap::new(),
        };
        Ok(Outbox {
            db,
            queue,
            meta,
            path,
            capacity: capacity.max(1),
            next_seq,
            overflow,
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

    fn enqueue(&mut self, report: NicReport) -> Result<u64, OutboxError> {
        let seq = self.next_seq;
        let bytes = bincode::serialize(&Sequenced { seq, report })
            .map_err(|x| OutboxError::Corrupt(x.to_string()))?;
        self.queue
            .insert(seq.to_be_bytes(), bytes)
            .map_err(self.err())?;
        self.next_seq += 1;
        self.meta
            .insert(KEY_NEXT, bincode::serialize(&self.next_seq).expect("u64"))
            .map_err(self.err())?;
        Ok(seq)
    }

    fn save_overflow(&self) -> Result<(), OutboxError> {
        let b =
            bincode::serialize(&self.overflow).map_err(|x| OutboxError::Corrupt(x.to_string()))?;
        self.meta.insert(KEY_OVERFLOW, b).map_err(self.err())?;
        Ok(())
    }

    /// Adds a report and makes it durable. Returns its sequence number, or
    /// None if it was coalesced (outbox full).
    pub async fn push(&mut self, report: NicReport) -> Result<Option<u64>, OutboxError> {
        let seq = if self.queue.len() < self.capacity && self.overflow.is_empty() {
            Some(self.enqueue(report)?)
        } else {
            let folded = match self.overflow.remove(&report.nic) {
                Some(old) => old.coalesced + 1,
                None => 0,
            };
            tracing::warn!(nic = %report.nic, coalesced = folded, "outbox full: keeping only the newest report for this NIC");
            let mut r = report;
            r.coalesced += folded;
            self.overflow.insert(r.nic.clone(), r);
            self.save_overflow()?;
            None
        };
        self.db.flush_async().await.map_err(self.err())?;
        Ok(seq)
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
            let Some(nic) = self.overflow.keys().next().cloned() else {
                break;
            };
            let r = self.overflow.remove(&nic).expect("present");
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
        if self.next_seq <= last_applied {
            tracing::warn!(
                next_seq = self.next_seq,
                last_applied,
                "outbox behind the supervisor (lost local state?); skipping ahead"
            );
            self.next_seq = last_applied + 1;
            self.meta
                .insert(KEY_NEXT, bincode::serialize(&self.next_seq).expect("u64"))
                .map_err(self.err())?;
        }
        self.ack(last_applied).await
    }

    /// The sequence the next report will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        }
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
        let r0 = p.iter().find(|s| s.report.nic == "rail0").unwrap();
        assert_eq!(
            r0.report.health,
            NicHealth::Down,
            "the newest state (7: down)"
        );
        assert_eq!(r0.report.coalesced, 4, "stands for 5 transitions");
        assert_eq!(r0.report.carrier_changes, 7);
        assert_eq!(o.coalesced_pending(), 0);
    }
}
