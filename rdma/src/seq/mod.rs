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

mod frame;
mod receiver;
mod window;

pub use frame::{
    encode_data_header, Decoded, Frame, FrameError, DATA_HEADER_LEN, HELLO_MAX_PAYLOAD,
    MAX_PAYLOAD, WIRE_VERSION,
};
pub use receiver::{Receiver, Verdict};
pub use window::{SendWindow, SeqError, WindowFull};
