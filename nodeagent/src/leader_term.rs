//! The newest Raft term this agent has heard from a leader: the agent's
//! half of the order fence (every order carries its leader's term).

/// The newest Raft term this agent has heard from a leader. An order from
/// an older term comes from a leader that was deposed and does not know it
/// yet (paused, partitioned): it is refused, so nothing a newer leader
/// cancelled or superseded is done on a stale leader's word. Kept in the
/// data directory (`leader_term`, synced whenever it rises), so a restarted
/// agent does not take a stale leader's orders before it hears the new
/// one; a rise also ends an order stream to the older leader.
#[derive(Debug)]
pub struct LeaderTerm {
    newest: tokio::sync::watch::Sender<u64>,
    path: Option<std::path::PathBuf>,
}

impl Default for LeaderTerm {
    fn default() -> Self {
        Self {
            newest: tokio::sync::watch::Sender::new(0),
            path: None,
        }
    }
}

impl LeaderTerm {
    /// The term stored at `path` (none yet: 0). An unreadable file is
    /// reported and read as 0 (the next heartbeat reply sets it again).
    pub fn load(path: std::path::PathBuf) -> Self {
        let read = match std::fs::read_to_string(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(e.to_string()),
            Ok(s) => s.trim().parse::<u64>().map_err(|e| e.to_string()),
        };
        let term = read.unwrap_or_else(|error| {
            tracing::warn!(file = %path.display(), %error, "stored leader term unreadable; starting from 0");
            0
        });
        Self {
            newest: tokio::sync::watch::Sender::new(term),
            path: Some(path),
        }
    }

    /// Records `term` (0: none given). Whether an order of `term` may run:
    /// not when a newer term has been heard.
    pub fn admit(&self, term: u64) -> bool {
        if term == 0 {
            return true;
        }
        let mut admitted = false;
        let raised = self.newest.send_if_modified(|t| {
            admitted = term >= *t;
            let higher = term > *t;
            if higher {
                *t = term;
            }
            higher
        });
        if raised {
            self.store(term);
        }
        admitted
    }

    pub fn get(&self) -> u64 {
        *self.newest.borrow()
    }

    /// Notified whenever the newest term rises.
    pub fn watch(&self) -> tokio::sync::watch::Receiver<u64> {
        self.newest.subscribe()
    }

    fn store(&self, term: u64) {
        let Some(path) = &self.path else {
            return;
        };
        let tmp = path.with_extension("tmp");
        let written = std::fs::File::create(&tmp).and_then(|mut f| {
            use std::io::Write;
            writeln!(f, "{term}")?;
            f.sync_all()
        });
        if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
            tracing::warn!(file = %path.display(), error = %e, "cannot store the leader term");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn older_terms_are_refused_and_the_newest_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leader_term");
        let t = LeaderTerm::load(path.clone());
        assert!(t.admit(0), "queries carry no term");
        assert!(t.admit(7));
        assert!(t.admit(7));
        assert!(!t.admit(5), "a deposed leader's");
        assert!(t.admit(0));
        assert_eq!(t.get(), 7);
        // A restarted agent still refuses the deposed leader.
        let t = LeaderTerm::load(path.clone());
        assert_eq!(t.get(), 7);
        assert!(!t.admit(6));
        assert!(t.admit(9));
        assert_eq!(LeaderTerm::load(path.clone()).get(), 9);
        // An unreadable file is 0, not a refusal of every order.
        std::fs::write(&path, "garbage").unwrap();
        assert_eq!(LeaderTerm::load(path).get(), 0);
    }

    #[tokio::test]
    async fn a_rise_wakes_whoever_watches() {
        let t = LeaderTerm::default();
        let mut w = t.watch();
        t.admit(3);
        w.changed().await.unwrap();
        assert_eq!(*w.borrow_and_update(), 3);
        t.admit(2);
        assert!(!w.has_changed().unwrap(), "not a rise");
    }
}
