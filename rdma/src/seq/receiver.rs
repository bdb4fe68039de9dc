//! The receiving half of a resilient connection: in-order, exactly-once
//! delivery with duplicate suppression, and the pacing of cumulative
//! acknowledgements (see the [module overview](super)).

/// What to do with an arriving `Data` frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The next message: hand it to the application (already counted).
    Deliver,
    /// Already delivered (a replay after a migration): drop it.
    Duplicate,
    /// A message after a missing one. Impossible on an in-order path: a
    /// protocol error. Nothing was counted.
    Gap { expected: u64 },
}

/// The receiving half: in-order, exactly-once delivery and ack pacing.
///
/// Acks are cumulative and cheap to skip: [`should_ack`](Self::should_ack)
/// asks for one every `ack_every_msgs` messages or `ack_every_bytes` payload
/// bytes delivered, whichever comes first; [`flush_ack`](Self::flush_ack)
/// asks for one whenever anything is unacknowledged, for when the input goes
/// idle. Keep the thresholds well below the peer's window bounds (say half)
/// so the peer rarely waits; the idle flush guarantees it never waits
/// forever.
#[derive(Debug, Clone)]
pub struct Receiver {
    delivered: u64,
    /// Highest count reported to the peer (ack or hello).
    reported: u64,
    unreported_msgs: usize,
    unreported_bytes: usize,
    ack_every_msgs: usize,
    ack_every_bytes: usize,
}

impl Receiver {
    /// A receiver that has delivered nothing. A threshold of 0 counts as 1
    /// (ack after every message).
    pub fn new(ack_every_msgs: usize, ack_every_bytes: usize) -> Self {
        Self {
            delivered: 0,
            reported: 0,
            unreported_msgs: 0,
            unreported_bytes: 0,
            ack_every_msgs: ack_every_msgs.max(1),
            ack_every_bytes: ack_every_bytes.max(1),
        }
    }

    /// Highest sequence number delivered to the application (0: none).
    pub fn delivered_through(&self) -> u64 {
        self.delivered
    }

    /// Judges `Data { seq }` carrying `len` payload bytes: delivers (and
    /// counts) only `delivered_through() + 1`. Call
    /// [`should_ack`](Self::should_ack) after every `Deliver` or `Duplicate`:
    /// duplicates count toward acks too, since they show the peer lacks one.
    pub fn on_frame(&mut self, seq: u64, len: usize) -> Verdict {
        let expected = self.delivered.saturating_add(1);
        if seq == expected {
            self.delivered = seq;
            self.unreported_msgs += 1;
            self.unreported_bytes = self.unreported_bytes.saturating_add(len);
            Verdict::Deliver
        } else if seq <= self.delivered {
            // The peer resent what we have, so it does not know we have it
            // (a hello understated our count): our last report does not
            // cover `seq`, and the duplicate counts toward the next ack.
            // Otherwise a window full of delivered messages could wait for
            // an ack that never comes.
            self.reported = self.reported.min(seq.saturating_sub(1));
            self.unreported_msgs += 1;
            self.unreported_bytes = self.unreported_bytes.saturating_add(len);
            Verdict::Duplicate
        } else {
            Verdict::Gap { expected }
        }
    }

    /// `Some(n)`: send `Ack { delivered_through: n }` now, because a
    /// threshold was reached since the last ack. Counts the ack as sent.
    pub fn should_ack(&mut self) -> Option<u64> {
        if self.unreported_msgs >= self.ack_every_msgs
            || self.unreported_bytes >= self.ack_every_bytes
        {
            Some(self.report())
        } else {
            None
        }
    }

    /// `Some(n)`: send `Ack { delivered_through: n }`, because something was
    /// delivered since the last ack (for when the input goes idle, and for
    /// timers). Counts the ack as sent.
    pub fn flush_ack(&mut self) -> Option<u64> {
        if self.delivered > self.reported {
            Some(self.report())
        } else {
            None
        }
    }

    /// The `delivered_through` to put in the `Hello` of a new path. The
    /// hello acknowledges as much as an ack, so the pacing restarts.
    pub fn hello_through(&mut self) -> u64 {
        self.report()
    }

    /// The ack last returned by [`should_ack`](Self::should_ack) or
    /// [`flush_ack`](Self::flush_ack) was not written (say, the path's
    /// writer was full): the next `flush_ack` asks for one again. Without
    /// this a dropped ack could leave the peer's window full forever.
    pub fn ack_dropped(&mut self) {
        // Acks are cumulative, so any lower bound of what the peer knows is
        // safe here; 0 is one.
        self.reported = 0;
    }

    /// Messages delivered since the last ack or hello.
    pub fn unacked_msgs(&self) -> usize {
        self.unreported_msgs
    }

    /// Records that the peer is told `delivered_through()`; returns it.
    fn report(&mut self) -> u64 {
        self.reported = self.delivered;
        self.unreported_msgs = 0;
        self.unreported_bytes = 0;
        self.delivered
    }
}

#[cfg(test)]
mod tests {
    use crate::seq::receiver::*;

    #[test]
    fn receiver_delivers_in_order_only() {
        let mut r = Receiver::new(100, 1 << 20);
        assert_eq!(r.delivered_through(), 0);
        assert_eq!(r.on_frame(2, 1), Verdict::Gap { expected: 1 });
        assert_eq!(r.delivered_through(), 0, "a gap delivers nothing");
        assert_eq!(r.on_frame(1, 1), Verdict::Deliver);
        assert_eq!(r.on_frame(2, 1), Verdict::Deliver);
        assert_eq!(r.delivered_through(), 2);
        assert_eq!(r.on_frame(4, 1), Verdict::Gap { expected: 3 });
        assert_eq!(r.on_frame(u64::MAX, 1), Verdict::Gap { expected: 3 });
    }

    #[test]
    fn receiver_suppresses_duplicates() {
        let mut r = Receiver::new(100, 1 << 20);
        for s in 1..=3 {
            assert_eq!(r.on_frame(s, 1), Verdict::Deliver);
        }
        // A replay after migration resends 2..=4.
        assert_eq!(r.on_frame(2, 1), Verdict::Duplicate);
        assert_eq!(r.on_frame(3, 1), Verdict::Duplicate);
        assert_eq!(r.on_frame(4, 1), Verdict::Deliver);
        assert_eq!(r.on_frame(0, 1), Verdict::Duplicate);
        assert_eq!(r.delivered_through(), 4);
    }

    #[test]
    fn duplicates_rearm_acks() {
        let mut r = Receiver::new(3, usize::MAX);
        for s in 1..=4 {
            r.on_frame(s, 1);
        }
        assert_eq!(r.hello_through(), 4);
        // The peer replays 3 and 4 anyway (it missed our report): they count
        // toward the next ack, and an idle flush repeats our count.
        assert_eq!(r.on_frame(3, 1), Verdict::Duplicate);
        assert_eq!(r.unacked_msgs(), 1);
        assert_eq!(r.should_ack(), None);
        assert_eq!(r.flush_ack(), Some(4));
        assert_eq!(r.flush_ack(), None);
        for _ in 0..3 {
            assert_eq!(r.on_frame(4, 1), Verdict::Duplicate);
        }
        assert_eq!(r.should_ack(), Some(4), "threshold reached by duplicates");
    }

    #[test]
    fn acks_every_n_messages() {
        let mut r = Receiver::new(3, usize::MAX);
        let mut acks = Vec::new();
        for s in 1..=10 {
            assert_eq!(r.on_frame(s, 1), Verdict::Deliver);
            if let Some(a) = r.should_ack() {
                acks.push(a);
            }
        }
        assert_eq!(acks, vec![3, 6, 9]);
        assert_eq!(r.flush_ack(), Some(10));
        assert_eq!(r.flush_ack(), None, "nothing new");
        assert_eq!(r.should_ack(), None);
    }

    #[test]
    fn acks_every_n_bytes() {
        let mut r = Receiver::new(usize::MAX, 100);
        r.on_frame(1, 60);
        assert_eq!(r.should_ack(), None);
        r.on_frame(2, 39);
        assert_eq!(r.should_ack(), None);
        r.on_frame(3, 1);
        assert_eq!(r.should_ack(), Some(3));
        r.on_frame(4, 1000);
        assert_eq!(r.should_ack(), Some(4), "one big message is enough");
        assert_eq!(r.should_ack(), None);
    }

    #[test]
    fn zero_thresholds_ack_every_message() {
        let mut r = Receiver::new(0, 0);
        r.on_frame(1, 0);
        assert_eq!(r.should_ack(), Some(1));
        assert_eq!(r.should_ack(), None);
    }

    #[test]
    fn hello_counts_as_an_ack() {
        let mut r = Receiver::new(2, usize::MAX);
        r.on_frame(1, 1);
        assert_eq!(r.hello_through(), 1);
        assert_eq!(r.flush_ack(), None);
        r.on_frame(2, 1);
        assert_eq!(r.should_ack(), None, "pacing restarted at the hello");
        r.on_frame(3, 1);
        assert_eq!(r.should_ack(), Some(3));
        assert_eq!(Receiver::new(1, 1).hello_through(), 0);
    }

    #[test]
    fn dropped_ack_is_asked_again() {
        let mut r = Receiver::new(1, usize::MAX);
        r.on_frame(1, 1);
        assert_eq!(r.should_ack(), Some(1));
        assert_eq!(r.flush_ack(), None);
        r.ack_dropped();
        assert_eq!(r.flush_ack(), Some(1));
        assert_eq!(r.flush_ack(), None);
        // Nothing delivered yet: nothing to ask for.
        let mut fresh = Receiver::new(1, 1);
        fresh.ack_dropped();
        assert_eq!(fresh.flush_ack(), None);
    }
}
