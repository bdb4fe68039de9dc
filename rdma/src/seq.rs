//! Sequencing and replay core of the resilient connection (sans-IO).
//!
//! A resilient connection is one logical, exactly-once, in-order message
//! channel carried by a succession of *paths* (reliable in-order byte
//! streams, one at a time). A path can die at any moment; frames in flight on
//! it may or may not have arrived. This module holds everything that decides
//! *what* goes on a path and *what* the application sees, and nothing that
//! does I/O, so it is driven and tested deterministically:
//!
//! * [`SendWindow`]: the bounded window of messages sent but not yet
//!   acknowledged, with a cursor separating what has been written to the
//!   current path from what still waits, and the replay rule of a migration.
//! * [`Receiver`]: in-order delivery with duplicate suppression, plus the
//!   pacing of cumulative acknowledgements.
//! * [`Frame`]: the wire format (length-prefixed, versioned, zero-copy
//!   decode).
//!
//! # Sequence numbers
//!
//! Messages are numbered 1, 2, 3, ... per direction. Everything is
//! cumulative: "delivered through `n`" means messages `1..=n` were handed to
//! the application, in order, once. `0` means nothing yet.
//!
//! # How the I/O layer drives it
//!
//! On every new path (each side, including the first path):
//!
//! 1. Compose the `Hello` from the receiver's count. The old path may go
//!    on delivering (and acknowledging) until the new one is adopted, as a
//!    make-before-break failback does: the hello's count is then stale, a
//!    lower bound like every ack, and the peer resumes from the larger of
//!    the two (see [`SendWindow::resume`]). Replays below the receiver's
//!    true count are dropped as duplicates.
//! 2. Send `Frame::Hello { conn_id, epoch, delivered_through:
//!    receiver.hello_through() }` as the first frame.
//! 3. The first frame read must be the peer's `Hello`; call
//!    [`SendWindow::resume`] with its `delivered_through`. This frees what
//!    the peer has, and rewinds the unsent cursor so that everything else is
//!    written again. Write no `Data` on the path before this.
//! 4. Then, until the path dies:
//!    * while [`SendWindow::unsent`] returns `(seq, payload)` and the path
//!      can take it: write it ([`encode_data_header`] then the payload, or
//!      [`Frame::encode`]) and call [`SendWindow::mark_sent`]`(seq)`;
//!    * on `Data`: [`Receiver::on_frame`]; on [`Verdict::Deliver`] hand the
//!      payload to the application; drop a [`Verdict::Duplicate`] (a replay
//!      after a migration); after either, send `Ack` if
//!      [`Receiver::should_ack`] says so. Treat [`Verdict::Gap`] as a fatal
//!      protocol error (impossible on an in-order path);
//!    * on `Ack`: [`SendWindow::ack`] (an error is a protocol violation);
//!    * when the input goes idle and on a timer: send `Ack` if
//!      [`Receiver::flush_ack`] says so. This is what guarantees the peer's
//!      window never stalls, whatever the ack thresholds and window bounds.
//!      If an ack the receiver asked for cannot be written (writer full),
//!      call [`Receiver::ack_dropped`] so the next flush repeats it.
//!    * `Ping { nonce }` is answered by `Pong { nonce }`.
//!
//! New messages from the application go into [`SendWindow::push`]; a
//! [`WindowFull`] is backpressure: wait for acks, then retry.
//!
//! # Why this is exactly-once
//!
//! The sender frees message `n` only when the receiver has said it delivered
//! `n` (an ack, or a `Hello`), and the receiver delivers only `delivered + 1`.
//! After a migration the sender replays everything after the receiver's
//! count, so nothing is lost; the receiver drops what it already has, so
//! nothing is duplicated; both paths are in order, so nothing is reordered.
//!
//! # Wire format (version 1)
//!
//! All integers big-endian. Every frame is
//!
//! ```text
//! +----------------+---------+------+------------------+
//! | len: u32       | ver: u8 | kind | body             |
//! +----------------+---------+------+------------------+
//!   len = 2 + body length (bytes after the len field)
//! ```
//!
//! | kind | frame   | body                                              |
//! |------|---------|---------------------------------------------------|
//! | 1    | `Hello` | conn_id u64, epoch u32, delivered_through u64     |
//! | 2    | `Data`  | seq u64, payload (the rest, `<= max_payload`)     |
//! | 3    | `Ack`   | delivered_through u64                             |
//! | 4    | `Ping`  | nonce u64                                         |
//! | 5    | `Pong`  | nonce u64                                         |
//!
//! Control frames have an exact length; anything else, an unknown version or
//! kind, or a frame longer than the receiver's limit is a [`FrameError`]
//! (detected from the header alone, before the body is buffered). After an
//! error the stream is unusable: drop the path.

use std::collections::VecDeque;

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Largest payload of a `Data` frame this codec ever accepts (64 MiB).
/// Connections configure their own limit up to this.
pub const MAX_PAYLOAD: usize = 64 << 20;

/// Payload limit to pass to [`Frame::decode`] while waiting for the `Hello`
/// that opens a path: nothing but a control frame is expected, so an
/// unauthenticated peer cannot make us buffer more than a control frame.
pub const HELLO_MAX_PAYLOAD: usize = 0;

/// The wire version this module writes and accepts.
pub const WIRE_VERSION: u8 = 1;

/// Bytes of a `Data` frame before its payload (see [`encode_data_header`]).
pub const DATA_HEADER_LEN: usize = LEN_FIELD + PREAMBLE + 8;

/// Size of the length prefix.
const LEN_FIELD: usize = 4;
/// Version and kind bytes, counted by the length prefix.
const PREAMBLE: usize = 2;

const KIND_HELLO: u8 = 1;
const KIND_DATA: u8 = 2;
const KIND_ACK: u8 = 3;
const KIND_PING: u8 = 4;
const KIND_PONG: u8 = 5;

/// Length-field values of the fixed-size frames.
const HELLO_LEN: usize = PREAMBLE + 8 + 4 + 8;
const U64_FRAME_LEN: usize = PREAMBLE + 8;
const DATA_MIN_LEN: usize = PREAMBLE + 8;

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

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

/// The byte stream does not hold a valid frame. The stream cannot be
/// resynchronised: drop the path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The length prefix is too small to hold even the version and kind.
    #[error("frame length {len} is shorter than the {PREAMBLE}-byte preamble")]
    TooShort { len: usize },
    /// The length prefix exceeds the largest frame the receiver accepts.
    #[error("frame length {len} exceeds the limit of {max} bytes")]
    Oversized { len: usize, max: usize },
    /// A `Data` payload exceeds the receiver's payload limit.
    #[error("data payload of {len} bytes exceeds the limit of {max} bytes")]
    PayloadTooLarge { len: usize, max: usize },
    /// The frame is of a wire version this side does not speak.
    #[error("unsupported wire version {version} (this side speaks {WIRE_VERSION})")]
    UnsupportedVersion { version: u8 },
    /// The frame kind byte is not one of the known kinds.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// A known kind with a length it cannot have.
    #[error("{kind} frame with invalid length {len}")]
    BadLength { kind: &'static str, len: usize },
}

// ---------------------------------------------------------------------------
// SendWindow
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Receiver
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Frames
// ---------------------------------------------------------------------------

/// A frame on a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// First frame of each side on a new path: which connection, which
    /// migration epoch, and how far this side delivered.
    Hello {
        conn_id: u64,
        epoch: u32,
        delivered_through: u64,
    },
    /// One application message.
    Data { seq: u64, payload: Bytes },
    /// Cumulative acknowledgement.
    Ack { delivered_through: u64 },
    /// Liveness probe; answered by `Pong` with the same nonce.
    Ping { nonce: u64 },
    /// Answer to `Ping`.
    Pong { nonce: u64 },
}

/// Result of [`Frame::decode`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// A complete frame, removed from the buffer.
    Frame(Frame),
    /// The buffer holds no complete frame yet (and is unchanged): read more.
    Incomplete,
}

/// Writes the header of a `Data` frame whose `len`-byte payload the caller
/// writes right after it (so a payload is never copied into the frame).
/// Together they equal `Frame::Data { seq, payload }.encode(..)`.
///
/// # Panics
///
/// If `len > MAX_PAYLOAD` (no receiver would accept it; the sender must
/// bound its messages).
pub fn encode_data_header(seq: u64, len: usize, dst: &mut BytesMut) {
    assert!(
        len <= MAX_PAYLOAD,
        "data payload of {len} bytes exceeds MAX_PAYLOAD ({MAX_PAYLOAD})"
    );
    dst.reserve(DATA_HEADER_LEN);
    put_preamble(dst, DATA_MIN_LEN + len, KIND_DATA);
    dst.put_u64(seq);
}

fn put_preamble(dst: &mut BytesMut, len: usize, kind: u8) {
    // Callers bound `len` by MAX_PAYLOAD plus a small header, far below 4 GiB.
    dst.put_u32(len as u32);
    dst.put_u8(WIRE_VERSION);
    dst.put_u8(kind);
}

fn put_u64_frame(dst: &mut BytesMut, kind: u8, v: u64) {
    dst.reserve(LEN_FIELD + U64_FRAME_LEN);
    put_preamble(dst, U64_FRAME_LEN, kind);
    dst.put_u64(v);
}

/// Largest length-field value accepted with payload limit `max_payload`.
fn max_frame_len(max_payload: usize) -> usize {
    HELLO_LEN.max(DATA_MIN_LEN + max_payload)
}

fn kind_name(kind: u8) -> &'static str {
    match kind {
        KIND_HELLO => "hello",
        KIND_DATA => "data",
        KIND_ACK => "ack",
        KIND_PING => "ping",
        KIND_PONG => "pong",
        _ => "unknown",
    }
}

impl Frame {
    /// Short name of the frame kind, for logs and errors.
    pub fn kind(&self) -> &'static str {
        kind_name(self.kind_byte())
    }

    fn kind_byte(&self) -> u8 {
        match self {
            Frame::Hello { .. } => KIND_HELLO,
            Frame::Data { .. } => KIND_DATA,
            Frame::Ack { .. } => KIND_ACK,
            Frame::Ping { .. } => KIND_PING,
            Frame::Pong { .. } => KIND_PONG,
        }
    }

    /// Bytes [`encode`](Self::encode) appends.
    pub fn encoded_len(&self) -> usize {
        LEN_FIELD
            + match self {
                Frame::Hello { .. } => HELLO_LEN,
                Frame::Data { payload, .. } => DATA_MIN_LEN + payload.len(),
                Frame::Ack { .. } | Frame::Ping { .. } | Frame::Pong { .. } => U64_FRAME_LEN,
            }
    }

    /// Appends the frame to `dst`. (`Data` copies its payload; use
    /// [`encode_data_header`] to write the payload separately.)
    ///
    /// # Panics
    ///
    /// If a `Data` payload exceeds [`MAX_PAYLOAD`].
    pub fn encode(&self, dst: &mut BytesMut) {
        match self {
            Frame::Hello {
                conn_id,
                epoch,
                delivered_through,
            } => {
                dst.reserve(LEN_FIELD + HELLO_LEN);
                put_preamble(dst, HELLO_LEN, KIND_HELLO);
                dst.put_u64(*conn_id);
                dst.put_u32(*epoch);
                dst.put_u64(*delivered_through);
            }
            Frame::Data { seq, payload } => {
                encode_data_header(*seq, payload.len(), dst);
                dst.extend_from_slice(payload);
            }
            Frame::Ack { delivered_through } => put_u64_frame(dst, KIND_ACK, *delivered_through),
            Frame::Ping { nonce } => put_u64_frame(dst, KIND_PING, *nonce),
            Frame::Pong { nonce } => put_u64_frame(dst, KIND_PONG, *nonce),
        }
    }

    /// Decodes the first frame of `src`, accepting `Data` payloads up to
    /// `max_payload` bytes (capped at [`MAX_PAYLOAD`]).
    ///
    /// On success the frame's bytes are removed from `src`; a `Data` payload
    /// is a zero-copy slice of them. [`Decoded::Incomplete`] leaves `src`
    /// unchanged. Errors are reported as soon as the header shows them
    /// (an oversized length is rejected without waiting for the body), and
    /// also leave `src` unchanged; the stream is then unusable.
    pub fn decode(src: &mut BytesMut, max_payload: usize) -> Result<Decoded, FrameError> {
        let max_payload = max_payload.min(MAX_PAYLOAD);
        if src.len() < LEN_FIELD {
            return Ok(Decoded::Incomplete);
        }
        let len = u32::from_be_bytes([src[0], src[1], src[2], src[3]]) as usize;
        if len < PREAMBLE {
            return Err(FrameError::TooShort { len });
        }
        let max = max_frame_len(max_payload);
        if len > max {
            return Err(FrameError::Oversized { len, max });
        }
        let Some(&version) = src.get(LEN_FIELD) else {
            return Ok(Decoded::Incomplete);
        };
        if version != WIRE_VERSION {
            return Err(FrameError::UnsupportedVersion { version });
        }
        let Some(&kind) = src.get(LEN_FIELD + 1) else {
            return Ok(Decoded::Incomplete);
        };
        let len_ok = match kind {
            KIND_HELLO => len == HELLO_LEN,
            KIND_ACK | KIND_PING | KIND_PONG => len == U64_FRAME_LEN,
            KIND_DATA => {
                if len < DATA_MIN_LEN {
                    false
                } else if len - DATA_MIN_LEN > max_payload {
                    return Err(FrameError::PayloadTooLarge {
                        len: len - DATA_MIN_LEN,
                        max: max_payload,
                    });
                } else {
                    true
                }
            }
            other => return Err(FrameError::UnknownKind(other)),
        };
        if !len_ok {
            return Err(FrameError::BadLength {
                kind: kind_name(kind),
                len,
            });
        }
        if src.len() < LEN_FIELD + len {
            return Ok(Decoded::Incomplete);
        }
        let mut f = src.split_to(LEN_FIELD + len);
        f.advance(LEN_FIELD + PREAMBLE);
        let frame = match kind {
            KIND_HELLO => Frame::Hello {
                conn_id: f.get_u64(),
                epoch: f.get_u32(),
                delivered_through: f.get_u64(),
            },
            KIND_DATA => {
                let seq = f.get_u64();
                Frame::Data {
                    seq,
                    payload: f.freeze(),
                }
            }
            KIND_ACK => Frame::Ack {
                delivered_through: f.get_u64(),
            },
            KIND_PING => Frame::Ping { nonce: f.get_u64() },
            KIND_PONG => Frame::Pong { nonce: f.get_u64() },
            _ => unreachable!("kind validated above"),
        };
        Ok(Decoded::Frame(frame))
    }
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;

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

    // --- SendWindow -------------------------------------------------------

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

    // --- Receiver ---------------------------------------------------------

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

    // --- Frames -----------------------------------------------------------

    fn samples() -> Vec<Frame> {
        vec![
            Frame::Hello {
                conn_id: 0xDEAD_BEEF_0000_0001,
                epoch: 7,
                delivered_through: 42,
            },
            Frame::Data {
                seq: 1,
                payload: Bytes::from_static(b"hello world"),
            },
            Frame::Data {
                seq: u64::MAX,
                payload: Bytes::new(),
            },
            Frame::Ack {
                delivered_through: 9,
            },
            Frame::Ping { nonce: 1 },
            Frame::Pong { nonce: u64::MAX },
        ]
    }

    fn encode(f: &Frame) -> BytesMut {
        let mut b = BytesMut::new();
        f.encode(&mut b);
        b
    }

    #[test]
    fn codec_round_trips() {
        for f in samples() {
            let mut b = encode(&f);
            assert_eq!(b.len(), f.encoded_len(), "{f:?}");
            assert_eq!(Frame::decode(&mut b, 1024), Ok(Decoded::Frame(f.clone())));
            assert!(b.is_empty());
        }
    }

    #[test]
    fn codec_layout_is_stable() {
        let b = encode(&Frame::Ack {
            delivered_through: 0x0102,
        });
        assert_eq!(&b[..], &[0, 0, 0, 10, 1, 3, 0, 0, 0, 0, 0, 0, 1, 2]);
        let h = encode(&Frame::Hello {
            conn_id: 1,
            epoch: 2,
            delivered_through: 3,
        });
        assert_eq!(h.len(), 26);
        assert_eq!(&h[..6], &[0, 0, 0, 22, 1, 1]);
        let d = encode(&Frame::Data {
            seq: 5,
            payload: Bytes::from_static(b"xy"),
        });
        assert_eq!(
            &d[..],
            &[0, 0, 0, 12, 1, 2, 0, 0, 0, 0, 0, 0, 0, 5, b'x', b'y']
        );
    }

    #[test]
    fn data_header_plus_payload_equals_encode() {
        let payload = Bytes::from_static(b"zero copy");
        let mut a = BytesMut::new();
        encode_data_header(77, payload.len(), &mut a);
        assert_eq!(a.len(), DATA_HEADER_LEN);
        a.extend_from_slice(&payload);
        assert_eq!(a, encode(&Frame::Data { seq: 77, payload }));
    }

    #[test]
    fn decode_is_zero_copy() {
        let mut b = encode(&Frame::Data {
            seq: 3,
            payload: Bytes::from(vec![7u8; 1000]),
        });
        let base = b.as_ptr() as usize;
        let Ok(Decoded::Frame(Frame::Data { payload, .. })) = Frame::decode(&mut b, 1000) else {
            panic!("expected data");
        };
        assert_eq!(payload.as_ptr() as usize, base + DATA_HEADER_LEN);
    }

    #[test]
    fn decode_several_frames_from_one_buffer() {
        let mut b = BytesMut::new();
        for f in samples() {
            f.encode(&mut b);
        }
        let mut got = Vec::new();
        while let Decoded::Frame(f) = Frame::decode(&mut b, 1024).unwrap() {
            got.push(f);
        }
        assert_eq!(got, samples());
        assert!(b.is_empty());
    }

    #[test]
    fn truncated_input_is_incomplete_and_untouched() {
        for f in samples() {
            let full = encode(&f);
            for cut in 0..full.len() {
                let mut b = BytesMut::from(&full[..cut]);
                assert_eq!(
                    Frame::decode(&mut b, 1024),
                    Ok(Decoded::Incomplete),
                    "{f:?} cut at {cut}"
                );
                assert_eq!(&b[..], &full[..cut]);
            }
        }
    }

    #[test]
    fn oversized_length_rejected_from_header_alone() {
        // A 4-byte header announcing 1 GiB: rejected before any body.
        let mut b = BytesMut::from(&(1u32 << 30).to_be_bytes()[..]);
        assert_eq!(
            Frame::decode(&mut b, 1000),
            Err(FrameError::Oversized {
                len: 1 << 30,
                max: DATA_MIN_LEN + 1000
            })
        );
        assert_eq!(b.len(), 4, "unchanged");
        // Beyond the absolute maximum even if the caller allows more.
        let mut b = BytesMut::from(&u32::MAX.to_be_bytes()[..]);
        assert!(matches!(
            Frame::decode(&mut b, usize::MAX),
            Err(FrameError::Oversized { .. })
        ));
    }

    #[test]
    fn payload_over_limit_rejected() {
        let mut b = BytesMut::new();
        encode_data_header(1, 101, &mut b);
        assert_eq!(
            Frame::decode(&mut b.clone(), 100),
            Err(FrameError::Oversized {
                len: DATA_MIN_LEN + 101,
                max: DATA_MIN_LEN + 100
            })
        );
        // While waiting for a hello even a small data frame is too big: the
        // limit is the largest control frame, and a payload beyond 0 bytes.
        assert_eq!(
            Frame::decode(&mut b.clone(), HELLO_MAX_PAYLOAD),
            Err(FrameError::Oversized {
                len: DATA_MIN_LEN + 101,
                max: HELLO_LEN
            })
        );
        let mut small = BytesMut::new();
        encode_data_header(1, 5, &mut small);
        assert_eq!(
            Frame::decode(&mut small, HELLO_MAX_PAYLOAD),
            Err(FrameError::PayloadTooLarge { len: 5, max: 0 })
        );
        // A hello still decodes under the hello limit.
        let hello = Frame::Hello {
            conn_id: 1,
            epoch: 1,
            delivered_through: 0,
        };
        assert_eq!(
            Frame::decode(&mut encode(&hello), HELLO_MAX_PAYLOAD),
            Ok(Decoded::Frame(hello))
        );
    }

    #[test]
    fn max_payload_accepted_at_limit() {
        let payload = Bytes::from(vec![1u8; 4096]);
        let f = Frame::Data { seq: 1, payload };
        assert_eq!(
            Frame::decode(&mut encode(&f), 4096),
            Ok(Decoded::Frame(f.clone()))
        );
        assert!(Frame::decode(&mut encode(&f), 4095).is_err());
    }

    #[test]
    #[should_panic(expected = "exceeds MAX_PAYLOAD")]
    fn encoding_beyond_max_payload_panics() {
        encode_data_header(1, MAX_PAYLOAD + 1, &mut BytesMut::new());
    }

    #[test]
    fn unknown_kind_rejected() {
        for kind in [0u8, 6, 0xFF] {
            let mut b = BytesMut::from(&[0, 0, 0, 10, WIRE_VERSION, kind][..]);
            assert_eq!(
                Frame::decode(&mut b, 100),
                Err(FrameError::UnknownKind(kind))
            );
        }
    }

    #[test]
    fn unknown_version_rejected() {
        let mut b = encode(&Frame::Ping { nonce: 1 });
        b[4] = 2;
        assert_eq!(
            Frame::decode(&mut b, 100),
            Err(FrameError::UnsupportedVersion { version: 2 })
        );
        // Detected from the first five bytes.
        let mut b = BytesMut::from(&[0, 0, 0, 10, 0][..]);
        assert_eq!(
            Frame::decode(&mut b, 100),
            Err(FrameError::UnsupportedVersion { version: 0 })
        );
    }

    #[test]
    fn bad_lengths_rejected() {
        let cases: [(u32, u8, &str); 5] = [
            (21, KIND_HELLO, "hello"),
            (23, KIND_HELLO, "hello"),
            (11, KIND_ACK, "ack"),
            (2, KIND_PING, "ping"),
            (9, KIND_DATA, "data"),
        ];
        for (len, kind, name) in cases {
            let mut b = BytesMut::new();
            b.put_u32(len);
            b.put_u8(WIRE_VERSION);
            b.put_u8(kind);
            assert_eq!(
                Frame::decode(&mut b, 100),
                Err(FrameError::BadLength {
                    kind: name,
                    len: len as usize
                })
            );
        }
        for len in [0u32, 1] {
            let mut b = BytesMut::from(&len.to_be_bytes()[..]);
            assert_eq!(
                Frame::decode(&mut b, 100),
                Err(FrameError::TooShort { len: len as usize })
            );
        }
    }

    #[test]
    fn kind_names() {
        let names: Vec<_> = samples().iter().map(Frame::kind).collect();
        assert_eq!(names, ["hello", "data", "data", "ack", "ping", "pong"]);
    }
}
