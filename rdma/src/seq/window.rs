//! The sending half of a resilient connection: the bounded window of
//! messages sent but not yet acknowledged, the unsent cursor and the replay
//! rule of a migration (see the [module overview](super)).

use std::collections::VecDeque;

use bytes::Bytes;

/// A sequencing rule was broken by the peer (or by a confused caller). Every
/// variant means the peer's state is inconsistent with ours: the connection
/// cannot continue exactly-once and should fail loudly.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SeqError {
    /// An ack claims delivery of messages that were never sent.
    #[error("ack through {ack} but only {highest_sent} messages were sent")]
    AckBeyondSent { ack: u64, highest_sent: u64 },
    /// On resume the receiver claims delivery of messages never sent.
    #[error("peer claims delivery through {claimed} but only {highest_sent} messages were sent")]
    ReceiverAhead { claimed: u64, highest_sent: u64 },
}

/// [`SendWindow::push`] refused a message: accepting it would exceed a bound
/// of the window. This is backpressure: wait for acks and retry (unless
/// [`WindowFull::never_fits`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "send window full: a {len}-byte message does not fit \
     ({in_flight_msgs}/{max_msgs} messages, {in_flight_bytes}/{max_bytes} bytes in flight)"
)]
pub struct WindowFull {
    /// Size of the refused message.
    pub len: usize,
    pub in_flight_msgs: usize,
    pub in_flight_bytes: usize,
    pub max_msgs: usize,
    pub max_bytes: usize,
}

impl WindowFull {
    /// The message is larger than the whole window: waiting will not help.
    pub fn never_fits(&self) -> bool {
        self.len > self.max_bytes
    }
}

/// The sending half: the bounded window of messages sent but not yet
/// acknowledged, and the replay cursor.
///
/// Holds messages `acked_through()+1 ..= highest_sent()`. The *unsent cursor*
/// splits them: those before it have been written to the current path, the
/// rest wait for [`unsent`](Self::unsent). [`resume`](Self::resume) moves the
/// cursor back to the first message the peer lacks.
///
/// Memory is bounded by `max_msgs` entries and `max_bytes` payload bytes.
#[derive(Debug)]
pub struct SendWindow {
    max_msgs: usize,
    max_bytes: usize,
    /// Payloads of `acked + 1 ..= acked + msgs.len()`.
    msgs: VecDeque<Bytes>,
    /// Sum of the payload lengths in `msgs`.
    bytes: usize,
    /// Highest sequence number the peer confirmed delivered.
    acked: u64,
    /// Next sequence number to write to the current path; in
    /// `acked + 1 ..= highest_sent() + 1`.
    cursor: u64,
}

impl SendWindow {
    /// A window holding at most `max_msgs` messages and `max_bytes` payload
    /// bytes unacknowledged.
    ///
    /// # Panics
    ///
    /// If `max_msgs` is 0 (no message could ever be sent).
    pub fn new(max_msgs: usize, max_bytes: usize) -> Self {
        assert!(max_msgs > 0, "a send window must hold at least one message");
        Self {
            max_msgs,
            max_bytes,
            msgs: VecDeque::with_capacity(max_msgs.min(1024)),
            bytes: 0,
            acked: 0,
            cursor: 1,
        }
    }

    /// Whether a message of `len` bytes would be accepted by `push` now.
    pub fn has_room(&self, len: usize) -> bool {
        self.msgs.len() < self.max_msgs && len <= self.max_bytes - self.bytes
    }

    /// Takes a message into the window and returns its sequence number
    /// (consecutive from 1). It is kept until acknowledged and becomes
    /// [`unsent`](Self::unsent). Refused, unchanged, if a bound would be
    /// exceeded.
    pub fn push(&mut self, msg: Bytes) -> Result<u64, WindowFull> {
        if !self.has_room(msg.len()) {
            return Err(WindowFull {
                len: msg.len(),
                in_flight_msgs: self.msgs.len(),
                in_flight_bytes: self.bytes,
                max_msgs: self.max_msgs,
                max_bytes: self.max_bytes,
            });
        }
        self.bytes += msg.len();
        self.msgs.push_back(msg);
        Ok(self.highest_sent())
    }

    /// Cumulative acknowledgement: the peer delivered `1..=delivered_through`.
    /// Frees those messages and returns how many were freed. An old ack
    /// (at or below [`acked_through`](Self::acked_through)) frees nothing. An
    /// ack beyond [`highest_sent`](Self::highest_sent) is a protocol error
    /// and changes nothing.
    pub fn ack(&mut self, delivered_through: u64) -> Result<usize, SeqError> {
        let highest_sent = self.highest_sent();
        if delivered_through > highest_sent {
            return Err(SeqError::AckBeyondSent {
                ack: delivered_through,
                highest_sent,
            });
        }
        if delivered_through <= self.acked {
            return Ok(0);
        }
        let n = (delivered_through - self.acked) as usize;
        for m in self.msgs.drain(..n) {
            self.bytes -= m.len();
        }
        self.acked = delivered_through;
        // Delivered messages need no writing, whatever the cursor said.
        self.cursor = self.cursor.max(delivered_through + 1);
        Ok(n)
    }

    /// Starts over on a new path, given the `delivered_through` of the peer's
    /// `Hello`: acknowledges through it and rewinds the unsent cursor to the
    /// next message the peer may lack, so [`unsent`](Self::unsent) yields
    /// every such message, in order (see [`iter_unsent`](Self::iter_unsent)).
    ///
    /// The claim and every ack are lower bounds of what the peer delivered,
    /// taken at different times: a claim below what was already
    /// acknowledged is a hello composed before the peer's last acks (a
    /// make-before-break move), so the window resumes after the acked
    /// messages, which it has freed. (A peer that truly lost messages it
    /// acknowledged sees a gap on the new path and fails loudly.)
    ///
    /// Returns the number of *replays*: messages written to an earlier path
    /// that will be written again.
    ///
    /// Errors (state unchanged): [`SeqError::ReceiverAhead`] if the peer
    /// claims more than was sent.
    pub fn resume(&mut self, receiver_delivered_through: u64) -> Result<usize, SeqError> {
        let claimed = receiver_delivered_through;
        let highest_sent = self.highest_sent();
        if claimed > highest_sent {
            return Err(SeqError::ReceiverAhead {
                claimed,
                highest_sent,
            });
        }
        self.ack(claimed.max(self.acked))
            .expect("resume validated the ack against highest_sent");
        let replays = (self.cursor - 1 - self.acked) as usize;
        self.cursor = self.acked + 1;
        Ok(replays)
    }

    /// The next message to write to the current path, if any: always the
    /// lowest unacknowledged message not yet written since the last
    /// [`resume`](Self::resume).
    pub fn unsent(&self) -> Option<(u64, &Bytes)> {
        self.msgs.get(self.unsent_index()).map(|m| (self.cursor, m))
    }

    /// Every message waiting to be written to the current path, in order.
    pub fn iter_unsent(&self) -> impl ExactSizeIterator<Item = (u64, &Bytes)> + '_ {
        let first = self.cursor;
        self.msgs
            .range(self.unsent_index()..)
            .enumerate()
            .map(move |(i, m)| (first + i as u64, m))
    }

    /// Whether [`unsent`](Self::unsent) has something.
    pub fn has_unsent(&self) -> bool {
        self.unsent_index() < self.msgs.len()
    }

    /// Number of messages waiting to be written to the current path.
    pub fn unsent_msgs(&self) -> usize {
        self.msgs.len() - self.unsent_index()
    }

    /// Records that every message through `seq` has been written to the
    /// current path (normally `seq` is what [`unsent`](Self::unsent) just
    /// returned). Returns how many messages moved past the cursor; 0 if
    /// `seq` was already written or acknowledged.
    ///
    /// # Panics
    ///
    /// If `seq` is beyond [`highest_sent`](Self::highest_sent): the caller
    /// claims to have written a message that does not exist.
    pub fn mark_sent(&mut self, seq: u64) -> usize {
        assert!(
            seq <= self.highest_sent(),
            "mark_sent({seq}) beyond the highest message {}",
            self.highest_sent()
        );
        if seq < self.cursor {
            return 0;
        }
        let n = (seq + 1 - self.cursor) as usize;
        self.cursor = seq + 1;
        n
    }

    /// Highest sequence number written to the current path since the last
    /// [`resume`](Self::resume) (or acknowledged, whichever is higher).
    pub fn written_through(&self) -> u64 {
        self.cursor - 1
    }

    /// Messages held (sent by the application, not yet acknowledged).
    pub fn in_flight_msgs(&self) -> usize {
        self.msgs.len()
    }

    /// Payload bytes held.
    pub fn in_flight_bytes(&self) -> usize {
        self.bytes
    }

    /// Highest sequence number assigned by [`push`](Self::push) (0: none).
    pub fn highest_sent(&self) -> u64 {
        self.acked + self.msgs.len() as u64
    }

    /// Same as [`highest_sent`](Self::highest_sent): the number of messages
    /// the application pushed so far.
    pub fn highest_pushed(&self) -> u64 {
        self.highest_sent()
    }

    /// Highest sequence number the peer confirmed delivered (0: none).
    pub fn acked_through(&self) -> u64 {
        self.acked
    }

    /// Whether every pushed message has been acknowledged.
    pub fn is_empty(&self) -> bool {
        self.msgs.is_empty()
    }

    /// The message bound.
    pub fn max_msgs(&self) -> usize {
        self.max_msgs
    }

    /// The payload byte bound.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    fn unsent_index(&self) -> usize {
        (self.cursor - self.acked - 1) as usize
    }
}

#[cfg(test)]
mod tests {
    use crate::seq::window::*;

    fn msg(n: usize) -> Bytes {
        Bytes::from(vec![0xAB; n])
    }

    fn window_with(n: u64, max_msgs: usize, max_bytes: usize) -> SendWindow {
        let mut w = SendWindow::new(max_msgs, max_bytes);
        for i in 1..=n {
            assert_eq!(w.push(Bytes::from(i.to_be_bytes().to_vec())), Ok(i));
        }
        w
    }

    fn drain_unsent(w: &mut SendWindow) -> Vec<u64> {
        let mut out = Vec::new();
        while let Some((seq, _)) = w.unsent() {
            out.push(seq);
            assert_eq!(w.mark_sent(seq), 1);
        }
        out
    }

    #[test]
    fn push_numbers_from_one_and_keeps_messages() {
        let mut w = SendWindow::new(10, 1000);
        assert_eq!(w.highest_sent(), 0);
        assert_eq!(w.acked_through(), 0);
        assert!(w.is_empty());
        assert_eq!(w.push(msg(3)), Ok(1));
        assert_eq!(w.push(msg(0)), Ok(2));
        assert_eq!(w.push(msg(5)), Ok(3));
        assert_eq!(w.highest_sent(), 3);
        assert_eq!(w.highest_pushed(), 3);
        assert_eq!(w.in_flight_msgs(), 3);
        assert_eq!(w.in_flight_bytes(), 8);
        let lens: Vec<_> = w.iter_unsent().map(|(s, b)| (s, b.len())).collect();
        assert_eq!(lens, vec![(1, 3), (2, 0), (3, 5)]);
    }

    #[test]
    fn window_full_by_count() {
        let mut w = SendWindow::new(2, 1000);
        w.push(msg(1)).unwrap();
        w.push(msg(1)).unwrap();
        assert!(!w.has_room(0));
        let e = w.push(msg(0)).unwrap_err();
        assert_eq!(e.in_flight_msgs, 2);
        assert_eq!(e.max_msgs, 2);
        assert!(!e.never_fits());
        assert_eq!(w.highest_sent(), 2, "a refused push changes nothing");
        assert_eq!(w.in_flight_bytes(), 2);
        w.ack(1).unwrap();
        assert_eq!(w.push(msg(0)), Ok(3));
    }

    #[test]
    fn window_full_by_bytes() {
        let mut w = SendWindow::new(100, 10);
        w.push(msg(6)).unwrap();
        assert!(w.has_room(4));
        assert!(!w.has_room(5));
        let e = w.push(msg(5)).unwrap_err();
        assert_eq!((e.len, e.in_flight_bytes, e.max_bytes), (5, 6, 10));
        assert!(!e.never_fits());
        assert!(e.to_string().contains("5-byte message"), "{e}");
        assert_eq!(w.push(msg(4)), Ok(2), "exactly full is allowed");
        assert_eq!(w.in_flight_bytes(), 10);
        assert!(w.push(msg(1)).is_err());
        assert_eq!(w.push(msg(0)), Ok(3), "empty messages only count");
    }

    #[test]
    fn message_larger_than_window_never_fits() {
        let mut w = SendWindow::new(4, 10);
        let e = w.push(msg(11)).unwrap_err();
        assert!(e.never_fits());
    }

    #[test]
    #[should_panic(expected = "at least one message")]
    fn zero_message_window_is_rejected() {
        let _ = SendWindow::new(0, 10);
    }

    #[test]
    fn ack_frees_cumulatively() {
        let mut w = window_with(5, 10, 1000);
        assert_eq!(w.ack(2), Ok(2));
        assert_eq!(w.acked_through(), 2);
        assert_eq!(w.in_flight_msgs(), 3);
        assert_eq!(w.in_flight_bytes(), 24);
        assert_eq!(w.ack(5), Ok(3));
        assert!(w.is_empty());
        assert_eq!(w.in_flight_bytes(), 0);
        assert_eq!(w.highest_sent(), 5);
        assert_eq!(w.push(msg(1)), Ok(6));
    }

    #[test]
    fn stale_ack_frees_nothing() {
        let mut w = window_with(5, 10, 1000);
        assert_eq!(w.ack(3), Ok(3));
        assert_eq!(w.ack(3), Ok(0));
        assert_eq!(w.ack(1), Ok(0));
        assert_eq!(w.ack(0), Ok(0));
        assert_eq!(w.acked_through(), 3);
        assert_eq!(w.in_flight_msgs(), 2);
    }

    #[test]
    fn ack_beyond_sent_is_an_error() {
        let mut w = window_with(3, 10, 1000);
        assert_eq!(
            w.ack(4),
            Err(SeqError::AckBeyondSent {
                ack: 4,
                highest_sent: 3
            })
        );
        assert_eq!(w.acked_through(), 0, "nothing changed");
        assert_eq!(w.in_flight_msgs(), 3);
        let mut empty = SendWindow::new(1, 1);
        assert!(empty.ack(1).is_err());
        assert_eq!(empty.ack(0), Ok(0));
    }

    #[test]
    fn cursor_tracks_what_was_written() {
        let mut w = window_with(4, 10, 1000);
        assert_eq!(w.written_through(), 0);
        assert_eq!(w.unsent_msgs(), 4);
        let (seq, m) = w.unsent().unwrap();
        assert_eq!((seq, &m[..]), (1, &1u64.to_be_bytes()[..]));
        assert_eq!(w.mark_sent(1), 1);
        assert_eq!(w.unsent().unwrap().0, 2);
        assert_eq!(w.mark_sent(3), 2, "mark_sent is cumulative");
        assert_eq!(w.mark_sent(2), 0, "already written");
        assert_eq!(w.written_through(), 3);
        assert_eq!(drain_unsent(&mut w), vec![4]);
        assert!(!w.has_unsent());
        assert!(w.unsent().is_none());
        assert_eq!(w.iter_unsent().len(), 0);
        w.push(msg(1)).unwrap();
        assert_eq!(w.unsent().unwrap().0, 5, "new pushes become unsent");
    }

    #[test]
    fn ack_moves_cursor_past_delivered_messages() {
        let mut w = window_with(4, 10, 1000);
        w.mark_sent(1);
        // Peer acknowledges more than we wrote on this path: it got them on
        // an earlier one. They need no writing.
        w.ack(3).unwrap();
        assert_eq!(w.unsent().unwrap().0, 4);
        assert_eq!(w.written_through(), 3);
    }

    #[test]
    #[should_panic(expected = "beyond the highest message")]
    fn mark_sent_beyond_pushed_panics() {
        let mut w = window_with(2, 10, 1000);
        w.mark_sent(3);
    }

    #[test]
    fn resume_acks_and_rewinds() {
        let mut w = window_with(6, 10, 1000);
        assert_eq!(drain_unsent(&mut w), vec![1, 2, 3, 4, 5, 6]);
        w.ack(1).unwrap();
        // Path dies; the peer says it delivered through 3.
        assert_eq!(w.resume(3), Ok(3), "4, 5, 6 are written again");
        assert_eq!(w.acked_through(), 3);
        let replay: Vec<_> = w.iter_unsent().map(|(s, b)| (s, b.clone())).collect();
        assert_eq!(
            replay,
            (4..=6u64)
                .map(|s| (s, Bytes::from(s.to_be_bytes().to_vec())))
                .collect::<Vec<_>>()
        );
        assert_eq!(drain_unsent(&mut w), vec![4, 5, 6]);
    }

    #[test]
    fn resume_counts_only_real_replays() {
        let mut w = window_with(6, 10, 1000);
        w.mark_sent(2);
        // 3..=6 were never written: they are pending, not replays.
        assert_eq!(w.resume(1), Ok(1));
        assert_eq!(drain_unsent(&mut w), vec![2, 3, 4, 5, 6]);
        // Resume at the same point twice (a migration that made no progress).
        assert_eq!(w.resume(1), Ok(5));
        assert_eq!(w.resume(1), Ok(0));
        assert_eq!(w.resume(6), Ok(0));
        assert!(w.is_empty());
        assert!(!w.has_unsent());
    }

    #[test]
    fn resume_on_fresh_window() {
        let mut w = SendWindow::new(4, 100);
        assert_eq!(w.resume(0), Ok(0));
        assert!(w.unsent().is_none());
        assert!(matches!(
            w.resume(1),
            Err(SeqError::ReceiverAhead {
                claimed: 1,
                highest_sent: 0
            })
        ));
    }

    #[test]
    fn resume_rejects_receiver_ahead() {
        let mut w = window_with(3, 10, 1000);
        drain_unsent(&mut w);
        assert_eq!(
            w.resume(4),
            Err(SeqError::ReceiverAhead {
                claimed: 4,
                highest_sent: 3
            })
        );
        assert_eq!(w.acked_through(), 0, "state unchanged");
        assert_eq!(w.written_through(), 3, "cursor unchanged");
    }

    #[test]
    fn resume_below_the_acked_count_resumes_after_it() {
        let mut w = window_with(5, 10, 1000);
        drain_unsent(&mut w);
        w.ack(4).unwrap();
        // A stale hello (composed before the ack through 4 was sent): the
        // acked messages are freed and stay so; only 5 is replayed.
        assert_eq!(w.resume(2), Ok(1));
        assert_eq!(w.acked_through(), 4);
        assert_eq!(w.unsent().map(|(s, _)| s), Some(5));
        // Exactly at the acked point is the same.
        drain_unsent(&mut w);
        assert_eq!(w.resume(4), Ok(1));
    }

    #[test]
    fn window_memory_is_bounded_by_max_msgs() {
        let mut w = SendWindow::new(8, usize::MAX);
        for round in 0..1000u64 {
            while w.push(msg(1)).is_ok() {}
            assert_eq!(w.in_flight_msgs(), 8);
            w.ack(w.highest_sent()).unwrap();
            assert_eq!(w.highest_sent(), (round + 1) * 8);
        }
        assert!(w.msgs.capacity() <= 16);
    }
}
