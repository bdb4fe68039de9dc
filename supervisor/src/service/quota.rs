//! Per-identity write quotas on the admin API.
//!
//! Every admin write is a Raft entry and an admin-history record; the
//! model keeps the newest 10,000 of those (the audit archive on disk keeps
//! them all). Without a quota one certificate writing thousands of times a
//! second takes the cluster's whole write capacity from everyone else and
//! rolls the model's history over in seconds. Each identity (the
//! certificate's user, never a request field) gets a token bucket: `rate`
//! writes per second, up to `2 × rate` at once. A write over it is refused
//! before anything is proposed, with how long to wait.
//!
//! The quota is counted by the supervisor the client called (a follower
//! forwards the write, already counted, to the leader), so a client that
//! spreads its writes over every supervisor gets at most one quota per
//! supervisor. Reads are not counted.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Default writes per second per identity.
pub const DEFAULT_WRITE_RATE: u32 = 500;
/// Highest rate accepted (above it the quota would never bind).
pub const MAX_WRITE_RATE: u32 = 1_000_000;
/// Identities tracked at once; buckets that are full again are forgotten
/// first (they hold nothing a fresh bucket would not).
pub const MAX_IDENTITIES: usize = 4_096;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// The buckets of one supervisor.
#[derive(Debug)]
pub struct WriteQuota {
    /// Writes per second (0: no quota).
    rate: u32,
    buckets: Mutex<HashMap<String, Bucket>>,
}

/// A write over its identity's quota.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("write quota of {who}: at most {rate} writes/s ({burst} at once); retry in {retry_ms} ms")]
pub struct OverQuota {
    pub who: String,
    pub rate: u32,
    pub burst: u32,
    /// Until one write's worth is back.
    pub retry_ms: u64,
}

impl WriteQuota {
    /// `rate` writes per second per identity; 0 turns the quota off.
    pub fn new(rate: u32) -> WriteQuota {
        WriteQuota {
            rate: rate.min(MAX_WRITE_RATE),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    fn burst(&self) -> f64 {
        2.0 * f64::from(self.rate)
    }

    /// Takes one write for `who` at `now`, or says how long to wait.
    pub fn take(&self, who: &str, now: Instant) -> Result<(), OverQuota> {
        if self.rate == 0 {
            return Ok(());
        }
        let rate = f64::from(self.rate);
        let burst = self.burst();
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let refill = |b: &Bucket| {
            (b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * rate).min(burst)
        };
        if !buckets.contains_key(who) && buckets.len() >= MAX_IDENTITIES {
            buckets.retain(|_, b| refill(b) < burst);
            if buckets.len() >= MAX_IDENTITIES {
                // Every tracked identity is busy: the one idle longest goes.
                if let Some(oldest) = buckets
                    .iter()
                    .min_by_key(|(_, b)| b.at)
                    .map(|(k, _)| k.clone())
                {
                    buckets.remove(&oldest);
                }
            }
        }
        let b = buckets.entry(who.to_string()).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        b.tokens = refill(b);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            return Ok(());
        }
        let wait = Duration::from_secs_f64((1.0 - b.tokens) / rate);
        Err(OverQuota {
            who: who.to_string(),
            rate: self.rate,
            burst: burst as u32,
            retry_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1),
        })
    }

    /// Identities tracked now.
    pub fn tracked(&self) -> usize {
        self.buckets.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate_and_identities_apart() {
        let q = WriteQuota::new(10);
        let t0 = Instant::now();
        // Twice the rate at once, then refused with the wait for one.
        for _ in 0..20 {
            q.take("alice", t0).unwrap();
        }
        let e = q.take("alice", t0).unwrap_err();
        assert_eq!((e.rate, e.burst, e.retry_ms), (10, 20, 100));
        assert!(e.to_string().contains("alice"), "{e}");
        // Another identity is not held back.
        q.take("bob", t0).unwrap();
        // 100 ms later one write's worth is back, and only one.
        let t1 = t0 + Duration::from_millis(100);
        q.take("alice", t1).unwrap();
        assert!(q.take("alice", t1).is_err());
        // Over a long stretch, the rate: 10 s at 100 tries/s lets ~100 by.
        let mut ok = 0;
        for i in 1..=1_000 {
            let at = t1 + Duration::from_millis(10 * i);
            ok += usize::from(q.take("alice", at).is_ok());
        }
        assert!((99..=101).contains(&ok), "{ok}");
    }

    #[test]
    fn zero_is_no_quota() {
        let q = WriteQuota::new(0);
        let t0 = Instant::now();
        for _ in 0..100_000 {
            q.take("x", t0).unwrap();
        }
        assert_eq!(q.tracked(), 0);
    }

    #[test]
    fn the_identities_tracked_are_bounded() {
        let q = WriteQuota::new(1);
        let t0 = Instant::now();
        for i in 0..MAX_IDENTITIES + 100 {
            q.take(&format!("id{i}"), t0).unwrap();
        }
        assert!(q.tracked() <= MAX_IDENTITIES);
        // Full buckets are the first to go: after a quiet while, a flood
        // of new names still leaves room.
        let later = t0 + Duration::from_secs(10);
        for i in 0..10 {
            q.take(&format!("new{i}"), later).unwrap();
        }
        assert!(q.tracked() <= MAX_IDENTITIES);
    }
}
