//! Property tests of `rdma::seq`: a simulated pair of endpoints exchanging
//! messages in both directions over a path that dies at random moments, a
//! model-based test of the send window, and codec properties.

use bytes::{BufMut, Bytes, BytesMut};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdma::seq::{
    encode_data_header, Decoded, Frame, FrameError, Receiver, SendWindow, Verdict, WindowFull,
    MAX_PAYLOAD, WIRE_VERSION,
};

// ---------------------------------------------------------------------------
// Simulated endpoints
// ---------------------------------------------------------------------------

const CONN_ID: u64 = 0x5EC0_0000_0000_0042;
/// Largest payload the simulated application sends (and the decode limit).
const SIM_MAX_PAYLOAD: usize = 40;

#[derive(Debug, Clone, Copy)]
struct SimConfig {
    max_msgs: usize,
    max_bytes: usize,
    ack_every_msgs: usize,
    ack_every_bytes: usize,
}

#[derive(Debug, Clone)]
enum Op {
    /// The application of `side` sends a `len`-byte message (refused when
    /// the window is full: backpressure).
    Send { side: usize, len: usize },
    /// The I/O of `side` writes up to `frames` unsent messages to the path.
    Pump { side: usize, frames: usize },
    /// The path carries up to `bytes` of what `from` wrote (possibly a
    /// partial frame) to the other side, which processes it. With
    /// `writer_full`, acks generated meanwhile cannot be written (dropped, and
    /// the receiver is told).
    Deliver {
        from: usize,
        bytes: usize,
        writer_full: bool,
    },
    /// The input of `side` went idle (or its timer fired): flush acks.
    Idle { side: usize },
    /// `side` pings the peer.
    Ping { side: usize },
    /// The path dies: everything in flight in both directions (and partial
    /// frames in read buffers) is lost. A new path opens and each side sends
    /// its hello first. Migrating again before the hellos arrive models a
    /// reconnect that fails mid-handshake.
    ///
    /// `understate[i]` picks the count side `i`'s hello reports: anything
    /// from 0 up to its true count, even below what it already acknowledged,
    /// as if it composed the hello long before the old path stopped
    /// delivering (a make-before-break move). (0 picks the true count.) The
    /// peer then replays messages that did arrive: duplicates.
    Migrate { understate: [u64; 2] },
}

#[derive(Debug, Default, Clone, Copy)]
struct Coverage {
    delivered: u64,
    duplicates: u64,
    replays: u64,
    window_full: u64,
    acks_freed: u64,
    migrations: u64,
    partial_reads: u64,
}

struct Side {
    win: SendWindow,
    rx: Receiver,
    /// Every message the application pushed; `sent[i]` has sequence `i + 1`.
    sent: Vec<Bytes>,
    /// Every message delivered to the application, in delivery order.
    got: Vec<Bytes>,
    /// Bytes read from the current path, not yet decoded.
    inbuf: BytesMut,
    /// The peer's hello on the current path was processed (window resumed).
    resumed: bool,
    next_nonce: u64,
    ping_outstanding: Option<u64>,
}

struct Sim {
    cfg: SimConfig,
    sides: [Side; 2],
    /// `wire[i]`: bytes written by side `i` on the current path, not yet read
    /// by the other side.
    wire: [BytesMut; 2],
    epoch: u32,
    cov: Coverage,
}

/// Distinct, recognisable content per (side, seq).
fn payload(side: usize, seq: u64, len: usize) -> Bytes {
    let tag = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (side as u64) << 63;
    Bytes::from(
        (0..len)
            .map(|k| (tag >> (8 * (k % 8))) as u8 ^ (k / 8) as u8)
            .collect::<Vec<u8>>(),
    )
}

impl Sim {
    fn new(cfg: SimConfig) -> Self {
        let side = || Side {
            win: SendWindow::new(cfg.max_msgs, cfg.max_bytes),
            rx: Receiver::new(cfg.ack_every_msgs, cfg.ack_every_bytes),
            sent: Vec::new(),
            got: Vec::new(),
            inbuf: BytesMut::new(),
            resumed: false,
            next_nonce: 1,
            ping_outstanding: None,
        };
        let mut sim = Sim {
            cfg,
            sides: [side(), side()],
            wire: [BytesMut::new(), BytesMut::new()],
            epoch: 0,
            cov: Coverage::default(),
        };
        sim.open_path([0, 0]);
        sim
    }

    /// Kills the current path (if any) and opens the next one.
    fn open_path(&mut self, understate: [u64; 2]) {
        self.epoch += 1;
        for (i, under) in understate.into_iter().enumerate() {
            self.wire[i].clear();
            let s = &mut self.sides[i];
            s.inbuf.clear();
            s.resumed = false;
            s.ping_outstanding = None;
            let truth = s.rx.hello_through();
            let reported = truth - under % (truth + 1);
            Frame::Hello {
                conn_id: CONN_ID,
                epoch: self.epoch,
                delivered_through: reported,
            }
            .encode(&mut self.wire[i]);
        }
    }

    /// Side `side` writes an ack (unless its writer is full).
    fn send_ack(&mut self, side: usize, through: u64, writer_full: bool) {
        let s = &mut self.sides[side];
        assert_eq!(through, s.rx.delivered_through(), "acks report everything");
        if writer_full {
            s.rx.ack_dropped();
        } else {
            Frame::Ack {
                delivered_through: through,
            }
            .encode(&mut self.wire[side]);
        }
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Send { side, len } => self.send(side, len),
            Op::Pump { side, frames } => self.pump(side, frames),
            Op::Deliver {
                from,
                bytes,
                writer_full,
            } => self.deliver(from, bytes, writer_full),
            Op::Idle { side } => self.idle(side),
            Op::Ping { side } => {
                let s = &mut self.sides[side];
                if s.ping_outstanding.is_none() {
                    let nonce = s.next_nonce;
                    s.next_nonce += 1;
                    s.ping_outstanding = Some(nonce);
                    Frame::Ping { nonce }.encode(&mut self.wire[side]);
                }
            }
            Op::Migrate { understate } => {
                self.cov.migrations += 1;
                self.open_path(understate);
            }
        }
        self.check();
    }

    fn send(&mut self, side: usize, len: usize) {
        let s = &mut self.sides[side];
        let fits = s.win.in_flight_msgs() < self.cfg.max_msgs
            && s.win.in_flight_bytes() + len <= self.cfg.max_bytes;
        let seq = s.sent.len() as u64 + 1;
        let msg = payload(side, seq, len);
        assert_eq!(s.win.has_room(len), fits);
        match s.win.push(msg.clone()) {
            Ok(got) => {
                assert!(fits, "push accepted beyond the bounds");
                assert_eq!(got, seq, "sequence numbers are consecutive from 1");
                s.sent.push(msg);
            }
            Err(e) => {
                assert!(!fits, "push refused with room: {e}");
                assert_eq!(
                    e,
                    WindowFull {
                        len,
                        in_flight_msgs: s.win.in_flight_msgs(),
                        in_flight_bytes: s.win.in_flight_bytes(),
                        max_msgs: self.cfg.max_msgs,
                        max_bytes: self.cfg.max_bytes,
                    }
                );
                self.cov.window_full += 1;
            }
        }
    }

    fn pump(&mut self, side: usize, frames: usize) {
        let s = &mut self.sides[side];
        if !s.resumed {
            // No data before the peer's hello told us where to resume.
            return;
        }
        for _ in 0..frames {
            let Some((seq, msg)) = s.win.unsent() else {
                break;
            };
            assert_eq!(seq, s.win.written_through() + 1);
            assert_eq!(
                msg,
                &s.sent[seq as usize - 1],
                "window holds what was pushed"
            );
            let wire = &mut self.wire[side];
            if seq % 2 == 0 {
                encode_data_header(seq, msg.len(), wire);
                wire.extend_from_slice(msg);
            } else {
                Frame::Data {
                    seq,
                    payload: msg.clone(),
                }
                .encode(wire);
            }
            assert_eq!(s.win.mark_sent(seq), 1);
        }
    }

    fn deliver(&mut self, from: usize, bytes: usize, writer_full: bool) {
        let to = 1 - from;
        let n = bytes.min(self.wire[from].len());
        let chunk = self.wire[from].split_to(n);
        self.sides[to].inbuf.extend_from_slice(&chunk);
        loop {
            match Frame::decode(&mut self.sides[to].inbuf, SIM_MAX_PAYLOAD) {
                Ok(Decoded::Frame(f)) => self.on_frame(to, f, writer_full),
                Ok(Decoded::Incomplete) => break,
                Err(e) => panic!("valid stream failed to decode: {e}"),
            }
        }
        if !self.sides[to].inbuf.is_empty() {
            self.cov.partial_reads += 1;
        }
    }

    /// `to` processes frame `f` sent by the other side.
    fn on_frame(&mut self, to: usize, f: Frame, writer_full: bool) {
        let (me, peer) = {
            let [a, b] = &mut self.sides;
            if to == 0 {
                (a, &*b)
            } else {
                (b, &*a)
            }
        };
        match f {
            Frame::Hello {
                conn_id,
                epoch,
                delivered_through,
            } => {
                assert_eq!(conn_id, CONN_ID);
                assert_eq!(epoch, self.epoch, "hello from a dead path");
                assert!(!me.resumed, "second hello on a path");
                let before = me.win.written_through().max(me.win.acked_through());
                let acked_before = me.win.acked_through();
                let replays = me
                    .win
                    .resume(delivered_through)
                    .unwrap_or_else(|e| panic!("resume failed in a correct run: {e}"));
                let from = delivered_through.max(acked_before);
                assert_eq!(me.win.acked_through(), from);
                assert_eq!(
                    replays as u64,
                    before.saturating_sub(from),
                    "replays are the written messages after the peer's known count"
                );
                self.cov.replays += replays as u64;
                me.resumed = true;
            }
            Frame::Data { seq, payload } => {
                assert!(me.resumed, "data before the peer's hello");
                assert!(
                    seq >= 1 && seq as usize <= peer.sent.len(),
                    "unknown seq {seq}"
                );
                assert_eq!(
                    payload,
                    peer.sent[seq as usize - 1],
                    "payload of {seq} corrupted"
                );
                let delivered = me.rx.delivered_through();
                match me.rx.on_frame(seq, payload.len()) {
                    Verdict::Deliver => {
                        assert_eq!(seq, delivered + 1);
                        me.got.push(payload);
                        self.cov.delivered += 1;
                    }
                    Verdict::Duplicate => {
                        assert!(seq <= delivered);
                        self.cov.duplicates += 1;
                    }
                    Verdict::Gap { expected } => {
                        panic!("gap on an in-order path: got {seq}, expected {expected}")
                    }
                }
                if let Some(through) = me.rx.should_ack() {
                    self.send_ack(to, through, writer_full);
                }
            }
            Frame::Ack { delivered_through } => {
                let freed = me
                    .win
                    .ack(delivered_through)
                    .unwrap_or_else(|e| panic!("ack failed in a correct run: {e}"));
                self.cov.acks_freed += freed as u64;
            }
            Frame::Ping { nonce } => Frame::Pong { nonce }.encode(&mut self.wire[to]),
            Frame::Pong { nonce } => {
                assert_eq!(me.ping_outstanding.take(), Some(nonce));
            }
        }
    }

    fn idle(&mut self, side: usize) {
        if let Some(through) = self.sides[side].rx.flush_ack() {
            self.send_ack(side, through, false);
        }
    }

    /// Invariants that hold after every step.
    fn check(&self) {
        for i in 0..2 {
            let me = &self.sides[i];
            let peer = &self.sides[1 - i];
            let w = &me.win;
            // Bounded.
            assert!(w.in_flight_msgs() <= self.cfg.max_msgs);
            assert!(w.in_flight_bytes() <= self.cfg.max_bytes);
            // The window is exactly the unacknowledged suffix of what was sent.
            assert_eq!(w.highest_sent(), me.sent.len() as u64);
            let acked = w.acked_through() as usize;
            assert_eq!(w.in_flight_msgs(), me.sent.len() - acked);
            let bytes: usize = me.sent[acked..].iter().map(Bytes::len).sum();
            assert_eq!(w.in_flight_bytes(), bytes);
            assert!(w.written_through() >= w.acked_through());
            assert!(w.written_through() <= w.highest_sent());
            assert_eq!(
                w.unsent_msgs() as u64,
                w.highest_sent() - w.written_through()
            );
            // Never freed before delivered.
            assert!(w.acked_through() <= peer.rx.delivered_through());
            // Delivered exactly a prefix of what was sent (each delivery was
            // compared with `sent[seq - 1]` and seq == delivered + 1).
            assert_eq!(peer.got.len() as u64, peer.rx.delivered_through());
            assert!(peer.got.len() <= me.sent.len());
        }
    }

    fn wires_empty(&self) -> bool {
        self.wire.iter().all(BytesMut::is_empty)
    }

    fn drained(&self) -> bool {
        self.wires_empty()
            && self
                .sides
                .iter()
                .all(|s| s.resumed && s.win.is_empty() && !s.win.has_unsent())
    }

    /// No more sends and no more failures: everything must arrive and both
    /// windows drain. Returns the rounds it took.
    fn quiesce(&mut self) -> usize {
        for round in 1..=8 {
            for side in 0..2 {
                self.apply(&Op::Pump {
                    side,
                    frames: usize::MAX,
                });
            }
            for from in 0..2 {
                self.apply(&Op::Deliver {
                    from,
                    bytes: usize::MAX,
                    writer_full: false,
                });
            }
            if self.wires_empty() {
                for side in 0..2 {
                    self.apply(&Op::Idle { side });
                }
            }
            if self.drained() {
                return round;
            }
        }
        panic!("did not drain: the windows stalled");
    }

    fn assert_exactly_once(&self) {
        for i in 0..2 {
            let peer = &self.sides[1 - i];
            assert_eq!(peer.got.len(), self.sides[i].sent.len(), "lost messages");
            assert!(peer.got == self.sides[i].sent, "delivered != sent");
            assert_eq!(self.sides[i].win.in_flight_msgs(), 0);
            assert_eq!(self.sides[i].win.in_flight_bytes(), 0);
        }
    }
}

fn sim_config() -> impl Strategy<Value = SimConfig> {
    (1usize..8, 0usize..160, 1usize..10, 1usize..200).prop_map(
        |(max_msgs, extra, ack_every_msgs, ack_every_bytes)| SimConfig {
            max_msgs,
            // Usually holds a largest message; sometimes not (never_fits).
            max_bytes: SIM_MAX_PAYLOAD / 2 + extra,
            ack_every_msgs,
            ack_every_bytes,
        },
    )
}

fn op() -> impl Strategy<Value = Op> {
    let side = 0usize..2;
    prop_oneof![
        8 => (side.clone(), 0..=SIM_MAX_PAYLOAD).prop_map(|(side, len)| Op::Send { side, len }),
        5 => (side.clone(), 1usize..6).prop_map(|(side, frames)| Op::Pump { side, frames }),
        8 => (side.clone(), 0usize..200, prop::bool::weighted(0.2)).prop_map(
            |(from, bytes, writer_full)| Op::Deliver { from, bytes, writer_full }
        ),
        2 => side.clone().prop_map(|side| Op::Idle { side }),
        1 => side.prop_map(|side| Op::Ping { side }),
        1 => (prop_oneof![Just(0u64), any::<u64>()], prop_oneof![Just(0u64), any::<u64>()])
            .prop_map(|(a, b)| Op::Migrate { understate: [a, b] }),
    ]
}

fn random_op(rng: &mut StdRng) -> Op {
    let side = rng.gen_range(0..2);
    match rng.gen_range(0..25) {
        0..=7 => Op::Send {
            side,
            len: rng.gen_range(0..=SIM_MAX_PAYLOAD),
        },
        8..=12 => Op::Pump {
            side,
            frames: rng.gen_range(1..6),
        },
        13..=20 => Op::Deliver {
            from: side,
            bytes: rng.gen_range(0..200),
            writer_full: rng.gen_bool(0.2),
        },
        21..=22 => Op::Idle { side },
        23 => Op::Ping { side },
        _ => Op::Migrate {
            understate: [0, 1].map(|_| if rng.gen_bool(0.5) { 0 } else { rng.gen() }),
        },
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// Exactly-once, in-order delivery in both directions across random
    /// sends, partial deliveries, lost acks and migrations; bounded windows;
    /// and after a quiet phase everything arrives and the windows drain.
    #[test]
    fn exactly_once_across_migrations(
        cfg in sim_config(),
        ops in prop::collection::vec(op(), 0..300),
        final_migration in any::<bool>(),
    ) {
        let mut sim = Sim::new(cfg);
        for op in &ops {
            sim.apply(op);
        }
        if final_migration {
            sim.apply(&Op::Migrate { understate: [0, 0] });
        }
        sim.quiesce();
        sim.assert_exactly_once();
    }
}

/// The generator really exercises the interesting cases: replays,
/// duplicates, backpressure, lost acks, partial frames. (Deterministic.)
#[test]
fn simulation_covers_the_hard_cases() {
    let mut rng = StdRng::seed_from_u64(7);
    let mut total = Coverage::default();
    for _ in 0..200 {
        let cfg = SimConfig {
            max_msgs: rng.gen_range(1..8),
            max_bytes: SIM_MAX_PAYLOAD + rng.gen_range(0..100),
            ack_every_msgs: rng.gen_range(1..10),
            ack_every_bytes: rng.gen_range(1..200),
        };
        let mut sim = Sim::new(cfg);
        for _ in 0..300 {
            let op = random_op(&mut rng);
            sim.apply(&op);
        }
        sim.quiesce();
        sim.assert_exactly_once();
        let c = sim.cov;
        total.delivered += c.delivered;
        total.duplicates += c.duplicates;
        total.replays += c.replays;
        total.window_full += c.window_full;
        total.acks_freed += c.acks_freed;
        total.migrations += c.migrations;
        total.partial_reads += c.partial_reads;
    }
    assert!(total.delivered > 5_000, "{total:?}");
    assert!(total.duplicates > 100, "{total:?}");
    assert!(total.replays > 100, "{total:?}");
    assert!(total.window_full > 100, "{total:?}");
    assert!(total.migrations > 500, "{total:?}");
    assert!(total.partial_reads > 1000, "{total:?}");
}

/// Small windows with ack thresholds far above them still never stall,
/// because the idle flush acks whatever the thresholds have not.
#[test]
fn idle_flush_prevents_stalls_with_high_thresholds() {
    let mut sim = Sim::new(SimConfig {
        max_msgs: 2,
        max_bytes: 1000,
        ack_every_msgs: 1000,
        ack_every_bytes: 1 << 20,
    });
    for round in 0..50 {
        for _ in 0..3 {
            sim.apply(&Op::Send { side: 0, len: 5 });
        }
        let rounds = sim.quiesce();
        assert!(rounds <= 3, "round {round} took {rounds}");
    }
    sim.assert_exactly_once();
    assert_eq!(sim.sides[0].sent.len(), 100);
}

// ---------------------------------------------------------------------------
// SendWindow against a reference model
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum WinOp {
    Push(usize),
    /// Ack / resume at `acked + k - 2` (so some are stale, some too far).
    Ack(u64),
    Resume(u64),
    /// Write up to this many unsent messages.
    Write(usize),
}

/// Straightforward model: a vector of every message ever pushed.
#[derive(Default)]
struct Model {
    lens: Vec<usize>,
    acked: u64,
    written: u64,
}

impl Model {
    fn in_flight(&self) -> (usize, usize) {
        let rest = &self.lens[self.acked as usize..];
        (rest.len(), rest.iter().sum())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn send_window_matches_model(
        max_msgs in 1usize..6,
        max_bytes in 0usize..40,
        ops in prop::collection::vec(prop_oneof![
            3 => (0usize..20).prop_map(WinOp::Push),
            2 => (0u64..8).prop_map(WinOp::Ack),
            1 => (0u64..8).prop_map(WinOp::Resume),
            2 => (0usize..4).prop_map(WinOp::Write),
        ], 0..120),
    ) {
        let mut w = SendWindow::new(max_msgs, max_bytes);
        let mut m = Model::default();
        for op in ops {
            match op {
                WinOp::Push(len) => {
                    let (n, b) = m.in_flight();
                    let r = w.push(Bytes::from(vec![0u8; len]));
                    if n < max_msgs && b + len <= max_bytes {
                        m.lens.push(len);
                        prop_assert_eq!(r, Ok(m.lens.len() as u64));
                    } else {
                        prop_assert!(r.is_err());
                    }
                }
                WinOp::Ack(k) => {
                    let x = (m.acked + k).saturating_sub(2);
                    let highest = m.lens.len() as u64;
                    let r = w.ack(x);
                    if x > highest {
                        prop_assert!(r.is_err());
                    } else {
                        let freed = x.saturating_sub(m.acked);
                        prop_assert_eq!(r, Ok(freed as usize));
                        m.acked = m.acked.max(x);
                        m.written = m.written.max(m.acked);
                    }
                }
                WinOp::Resume(k) => {
                    let x = (m.acked + k).saturating_sub(2);
                    let highest = m.lens.len() as u64;
                    let r = w.resume(x);
                    if x > highest {
                        prop_assert!(r.is_err());
                    } else {
                        // A claim below the acked count is stale: resume
                        // after the acked messages.
                        let from = x.max(m.acked);
                        prop_assert_eq!(r, Ok(m.written.saturating_sub(from) as usize));
                        m.acked = from;
                        m.written = from;
                    }
                }
                WinOp::Write(k) => {
                    for _ in 0..k {
                        match w.unsent() {
                            Some((seq, msg)) => {
                                prop_assert_eq!(seq, m.written + 1);
                                prop_assert_eq!(msg.len(), m.lens[seq as usize - 1]);
                                w.mark_sent(seq);
                                m.written += 1;
                            }
                            None => prop_assert_eq!(m.written, m.lens.len() as u64),
                        }
                    }
                }
            }
            let (n, b) = m.in_flight();
            prop_assert_eq!(w.in_flight_msgs(), n);
            prop_assert_eq!(w.in_flight_bytes(), b);
            prop_assert!(n <= max_msgs && b <= max_bytes);
            prop_assert_eq!(w.acked_through(), m.acked);
            prop_assert_eq!(w.highest_sent(), m.lens.len() as u64);
            prop_assert_eq!(w.written_through(), m.written);
            let pending: Vec<u64> = w.iter_unsent().map(|(s, _)| s).collect();
            let expected: Vec<u64> = (m.written + 1..=m.lens.len() as u64).collect();
            prop_assert_eq!(pending, expected);
        }
    }
}

// ---------------------------------------------------------------------------
// Codec
// ---------------------------------------------------------------------------

const CODEC_MAX: usize = 300;

fn arb_frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        (any::<u64>(), any::<u32>(), any::<u64>()).prop_map(|(conn_id, epoch, d)| Frame::Hello {
            conn_id,
            epoch,
            delivered_through: d,
        }),
        (
            any::<u64>(),
            prop::collection::vec(any::<u8>(), 0..=CODEC_MAX)
        )
            .prop_map(|(seq, p)| Frame::Data {
                seq,
                payload: Bytes::from(p),
            }),
        any::<u64>().prop_map(|d| Frame::Ack {
            delivered_through: d
        }),
        any::<u64>().prop_map(|nonce| Frame::Ping { nonce }),
        any::<u64>().prop_map(|nonce| Frame::Pong { nonce }),
    ]
}

/// Decodes everything decodable from `buf`, checking each decode's contract
/// on the way; never panics on any input.
fn decode_all(buf: &mut BytesMut, max: usize) -> (Vec<Frame>, Option<FrameError>) {
    let mut out = Vec::new();
    loop {
        let before = buf.clone();
        match Frame::decode(buf, max) {
            Ok(Decoded::Frame(f)) => {
                // Consumed exactly the frame, and the encoding is canonical.
                let used = before.len() - buf.len();
                assert!(used > 0);
                let mut again = BytesMut::new();
                f.encode(&mut again);
                assert_eq!(&again[..], &before[..used]);
                if let Frame::Data { payload, .. } = &f {
                    assert!(payload.len() <= max.min(MAX_PAYLOAD));
                }
                out.push(f);
            }
            Ok(Decoded::Incomplete) => {
                assert_eq!(*buf, before, "incomplete leaves the buffer alone");
                return (out, None);
            }
            Err(e) => {
                assert_eq!(*buf, before, "errors leave the buffer alone");
                return (out, Some(e));
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn codec_round_trip(f in arb_frame()) {
        let mut b = BytesMut::new();
        f.encode(&mut b);
        prop_assert_eq!(b.len(), f.encoded_len());
        prop_assert_eq!(Frame::decode(&mut b, CODEC_MAX), Ok(Decoded::Frame(f)));
        prop_assert!(b.is_empty());
    }

    /// A stream of frames read in arbitrary chunks decodes to the same frames.
    #[test]
    fn codec_stream_in_chunks(
        frames in prop::collection::vec(arb_frame(), 0..12),
        chunks in prop::collection::vec(1usize..64, 1..200),
    ) {
        let mut stream = BytesMut::new();
        for f in &frames {
            f.encode(&mut stream);
        }
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        let mut sizes = chunks.iter().cycle();
        while !stream.is_empty() {
            let n = (*sizes.next().unwrap()).min(stream.len());
            buf.extend_from_slice(&stream.split_to(n));
            let (fs, err) = decode_all(&mut buf, CODEC_MAX);
            prop_assert!(err.is_none());
            got.extend(fs);
        }
        prop_assert!(buf.is_empty());
        prop_assert_eq!(got, frames);
    }

    /// Every strict prefix of a frame is incomplete.
    #[test]
    fn codec_truncated_is_incomplete(f in arb_frame(), cut in any::<prop::sample::Index>()) {
        let mut b = BytesMut::new();
        f.encode(&mut b);
        let cut = cut.index(b.len());
        let mut part = BytesMut::from(&b[..cut]);
        prop_assert_eq!(Frame::decode(&mut part, CODEC_MAX), Ok(Decoded::Incomplete));
        prop_assert_eq!(part.len(), cut);
    }

    /// Frames above the receiver's limit are refused before their body.
    #[test]
    fn codec_limit_enforced(len in 1usize..CODEC_MAX, max in 0usize..CODEC_MAX) {
        let mut b = BytesMut::new();
        encode_data_header(1, len, &mut b);
        let r = Frame::decode(&mut b, max);
        if len <= max {
            prop_assert_eq!(r, Ok(Decoded::Incomplete));
        } else {
            let refused = matches!(
                r,
                Err(FrameError::Oversized { .. } | FrameError::PayloadTooLarge { .. })
            );
            prop_assert!(refused, "{:?}", r);
        }
    }

    /// Arbitrary bytes never panic the decoder.
    #[test]
    fn codec_byte_soup(soup in prop::collection::vec(any::<u8>(), 0..256), max in 0usize..64) {
        let mut b = BytesMut::from(&soup[..]);
        decode_all(&mut b, max);
    }

    /// Plausible headers with garbage bodies (reach deeper into the parser).
    #[test]
    fn codec_header_soup(
        parts in prop::collection::vec(
            (0u32..40, 0u8..3, 0u8..7, prop::collection::vec(any::<u8>(), 0..40)),
            1..8,
        ),
        max in 0usize..64,
    ) {
        let mut b = BytesMut::new();
        for (len, version, kind, body) in parts {
            b.put_u32(len);
            b.put_u8(version);
            b.put_u8(kind);
            b.extend_from_slice(&body);
        }
        let (_, err) = decode_all(&mut b, max);
        if let Some(FrameError::UnsupportedVersion { version }) = err {
            prop_assert_ne!(version, WIRE_VERSION);
        }
    }
}
