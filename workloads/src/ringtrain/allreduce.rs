//! Ring all-reduce (reduce-scatter, then all-gather) with a fixed reduction
//! order, over any [`RingLink`] (the resilient connections in production,
//! in-memory channels in tests).
//!
//! The vector of `n` values is cut into `world` chunks, chunk `c` being
//! `[c·n/world, (c+1)·n/world)` (so lengths differ by at most one and a
//! chunk may be empty). In reduce-scatter hop `s` (0-based) rank `r` sends
//! chunk `(r − s) mod world` to its successor and receives chunk
//! `(r − s − 1) mod world`, adding its own values to the partial sum it
//! received. Chunk `c` is therefore always accumulated in the rank order
//! `c, c+1, …, c+world−1 (mod world)`:
//! `((g_c + g_{c+1}) + g_{c+2}) + …`, whatever the timing, which makes the
//! result bit-exact from run to run. After `world − 1` hops rank `r` holds
//! the full sum of chunk `(r + 1) mod world`; the all-gather passes the
//! finished chunks around the ring, and every rank divides by `world`.
//!
//! Every message carries a 32-byte header: the step, phase, hop, chunk, a
//! fingerprint of the run's configuration (ranks of different runs or
//! shapes refuse each other) and the sender's *flags*. Each rank ORs its
//! flags (a snapshot taken at the start of the step) into what it
//! forwards; after the reduce-scatter every rank holds the OR of all ranks'
//! flags, so all ranks learn a request (say, "checkpoint after this step")
//! at the same step.

use bytes::{BufMut, Bytes, BytesMut};
use rdma::resilient::ConnError;

/// Header bytes of every message.
pub const HEADER: usize = 32;
const MAGIC: u32 = 0x5247_4152; // "RGAR"
const VERSION: u8 = 1;

/// Flag: write a checkpoint after this step.
pub const FLAG_CHECKPOINT: u32 = 1;
/// Flag: compute nothing after this step's checkpoint.
pub const FLAG_HALT: u32 = 2;

/// The two directions of a rank's place in the ring.
#[allow(async_fn_in_trait)]
pub trait RingLink {
    /// Sends one message to the successor (may queue, must not wait for
    /// the successor to receive it).
    async fn send(&mut self, msg: Bytes) -> Result<(), ConnError>;
    /// The next message from the predecessor.
    async fn recv(&mut self) -> Result<Bytes, ConnError>;
}

/// Why an all-reduce failed.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    /// The connection to a neighbour failed (e.g. no path for the stall
    /// timeout): fatal to the run.
    #[error("ring transport: {0}")]
    Link(#[from] ConnError),
    /// A neighbour's message is malformed or out of step (no header,
    /// another configuration's fingerprint, an unexpected step, phase,
    /// hop or chunk): the ranks disagree, fatal to the run.
    #[error("ring protocol: {0}")]
    Protocol(String),
}

/// Where this rank is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    pub rank: usize,
    pub world: usize,
}

/// Bounds of chunk `c` of `n` values cut in `world`.
pub fn chunk_bounds(n: usize, world: usize, c: usize) -> (usize, usize) {
    (c * n / world, (c + 1) * n / world)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    phase: u8,
    hop: u16,
    step: u64,
    chunk: u32,
    flags: u32,
    fingerprint: u32,
    count: u32,
}

fn encode(h: Header, values: &[f32]) -> Bytes {
    let mut b = BytesMut::with_capacity(HEADER + 4 * values.len());
    b.put_u32_le(MAGIC);
    b.put_u8(VERSION);
    b.put_u8(h.phase);
    b.put_u16_le(h.hop);
    b.put_u64_le(h.step);
    b.put_u32_le(h.chunk);
    b.put_u32_le(h.flags);
    b.put_u32_le(h.fingerprint);
    b.put_u32_le(h.count);
    for v in values {
        b.put_f32_le(*v);
    }
    b.freeze()
}

fn u32_at(m: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(m[at..at + 4].try_into().expect("4 bytes"))
}

fn decode(m: &[u8]) -> Result<(Header, &[u8]), RingError> {
    let bad = |s: String| Err(RingError::Protocol(s));
    if m.len() < HEADER {
        return bad(format!("message of {} bytes has no header", m.len()));
    }
    if u32_at(m, 0) != MAGIC || m[4] != VERSION {
        return bad("message is not a ringtrain all-reduce message of version 1".into());
    }
    let h = Header {
        phase: m[5],
        hop: u16::from_le_bytes([m[6], m[7]]),
        step: u64::from_le_bytes(m[8..16].try_into().expect("8 bytes")),
        chunk: u32_at(m, 16),
        flags: u32_at(m, 20),
        fingerprint: u32_at(m, 24),
        count: u32_at(m, 28),
    };
    let body = &m[HEADER..];
    if body.len() != 4 * h.count as usize {
        return bad(format!(
            "header says {} values, body has {} bytes",
            h.count,
            body.len()
        ));
    }
    Ok((h, body))
}

const REDUCE_SCATTER: u8 = 0;
const ALL_GATHER: u8 = 1;

/// All-reduces `values` in place: afterwards every rank holds the average
/// (`sum / world`, the sum in the fixed order described in the module
/// docs). Returns the OR of every rank's `flags`.
pub async fn all_reduce<L: RingLink>(
    link: &mut L,
    place: Place,
    step: u64,
    fingerprint: u32,
    flags: u32,
    values: &mut [f32],
) -> Result<u32, RingError> {
    let Place { rank, world } = place;
    assert!(world >= 1 && rank < world, "rank {rank} of {world}");
    if world == 1 {
        return Ok(flags);
    }
    let n = values.len();
    let mut acc = flags;
    for phase in [REDUCE_SCATTER, ALL_GATHER] {
        for s in 0..world - 1 {
            // Reduce-scatter hop s: send (r − s), receive (r − s − 1).
            // All-gather hop s: send (r + 1 − s), receive (r − s).
            let (send_c, recv_c) = if phase == REDUCE_SCATTER {
                (
                    (rank + world - s) % world,
                    (rank + 2 * world - s - 1) % world,
                )
            } else {
                ((rank + 1 + world - s) % world, (rank + world - s) % world)
            };
            let (a, b) = chunk_bounds(n, world, send_c);
            let head = |chunk: usize, count: usize| Header {
                phase,
                hop: s as u16,
                step,
                chunk: chunk as u32,
                flags: acc,
                fingerprint,
                count: count as u32,
            };
            link.send(encode(head(send_c, b - a), &values[a..b]))
                .await?;
            let msg = link.recv().await?;
            let (h, body) = decode(&msg)?;
            let (a, b) = chunk_bounds(n, world, recv_c);
            let want = head(recv_c, b - a);
            if h.fingerprint != fingerprint {
                return Err(RingError::Protocol(format!(
                    "the predecessor runs a different configuration (fingerprint {:08x}, ours {fingerprint:08x}): same seed, shape, batch, world and learning rate on every rank?",
                    h.fingerprint
                )));
            }
            if (h.step, h.phase, h.hop, h.chunk, h.count)
                != (want.step, want.phase, want.hop, want.chunk, want.count)
            {
                return Err(RingError::Protocol(format!(
                    "expected step {} phase {} hop {} chunk {} ({} values), got step {} phase {} hop {} chunk {} ({} values)",
                    want.step, want.phase, want.hop, want.chunk, want.count,
                    h.step, h.phase, h.hop, h.chunk, h.count
                )));
            }
            acc |= h.flags;
            let dst = &mut values[a..b];
            let src = body
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4")));
            if phase == REDUCE_SCATTER {
                // The partial sum of the ranks before us (in ring order)
                // plus ours; IEEE addition is commutative, so this is
                // `partial + ours` exactly.
                for (d, p) in dst.iter_mut().zip(src) {
                    *d += p;
                }
            } else {
                for (d, v) in dst.iter_mut().zip(src) {
                    *d = v;
                }
            }
        }
    }
    let inv = world as f32;
    for v in values.iter_mut() {
        *v /= inv;
    }
    Ok(acc)
}

/// What [`all_reduce`] computes, without a network: chunk `c` summed in the
/// rank order `c, c+1, …` (mod world), then divided by `world`.
pub fn reference(inputs: &[Vec<f32>]) -> Vec<f32> {
    let world = inputs.len();
    let n = inputs[0].len();
    let mut out = vec![0f32; n];
    for c in 0..world {
        let (a, b) = chunk_bounds(n, world, c);
        for (i, o) in out.iter_mut().enumerate().take(b).skip(a) {
            let mut s = inputs[c][i];
            for k in 1..world {
                s += inputs[(c + k) % world][i];
            }
            *o = s / world as f32;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::ringtrain::allreduce::*;
    use crate::ringtrain::model::SplitMix;
    use tokio::sync::mpsc;

    /// An in-memory link that sleeps a random few hundred microseconds
    /// around each call, so the ranks interleave differently every run.
    struct ChanLink {
        tx: mpsc::UnboundedSender<Bytes>,
        rx: mpsc::UnboundedReceiver<Bytes>,
        rng: SplitMix,
    }

    impl ChanLink {
        async fn jitter(&mut self) {
            let us = self.rng.next_u64() % 400;
            tokio::time::sleep(std::time::Duration::from_micros(us)).await;
        }
    }

    impl RingLink for ChanLink {
        async fn send(&mut self, msg: Bytes) -> Result<(), ConnError> {
            self.jitter().await;
            self.tx.send(msg).map_err(|_| ConnError::Closed)
        }
        async fn recv(&mut self) -> Result<Bytes, ConnError> {
            self.jitter().await;
            self.rx.recv().await.ok_or(ConnError::Closed)
        }
    }

    /// Values of very different magnitudes: the order of additions shows
    /// in the low bits.
    fn inputs(world: usize, n: usize, seed: u64) -> Vec<Vec<f32>> {
        let mut rng = SplitMix::new(seed);
        (0..world)
            .map(|_| {
                (0..n)
                    .map(|_| {
                        let e = (rng.next_u64() % 20) as i32 - 10;
                        rng.next_signed() * 2f32.powi(e)
                    })
                    .collect()
            })
            .collect()
    }

    async fn run_ring(inputs: Vec<Vec<f32>>, flags: Vec<u32>, seed: u64) -> Vec<(Vec<f32>, u32)> {
        let world = inputs.len();
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..world).map(|_| mpsc::unbounded_channel()).unzip();
        // Rank r sends into channel r+1 and receives from channel r.
        let mut rxs: Vec<_> = rxs.into_iter().map(Some).collect();
        let mut tasks = Vec::new();
        for (r, mut v) in inputs.into_iter().enumerate() {
            let mut link = ChanLink {
                tx: txs[(r + 1) % world].clone(),
                rx: rxs[r].take().expect("receiver"),
                rng: SplitMix::keyed(&[seed, r as u64]),
            };
            let f = flags[r];
            tasks.push(tokio::spawn(async move {
                let place = Place { rank: r, world };
                let got = all_reduce(&mut link, place, 7, 0xabcd, f, &mut v)
                    .await
                    .expect("all-reduce");
                (v, got)
            }));
        }
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.expect("rank task"));
        }
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bit_exact_with_the_fixed_order_for_every_world_size() {
        for world in 1..=8usize {
            for n in [0usize, 1, 3, 7, 64, 1001] {
                let data = inputs(world, n, (world * 1000 + n) as u64);
                let want = reference(&data);
                for trial in 0..3u64 {
                    let got = run_ring(data.clone(), vec![0; world], trial).await;
                    for (r, (v, _)) in got.iter().enumerate() {
                        let same = v.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same && v.len() == n,
                            "world {world} n {n} rank {r} trial {trial}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_order_matters_so_the_test_above_can_fail() {
        // Summing in plain rank order differs from the ring order somewhere.
        let data = inputs(5, 1000, 3);
        let ring = reference(&data);
        let plain: Vec<f32> = (0..1000)
            .map(|i| data.iter().fold(0f32, |s, v| s + v[i]) / 5.0)
            .collect();
        assert!(ring
            .iter()
            .zip(&plain)
            .any(|(a, b)| a.to_bits() != b.to_bits()));
    }

    #[tokio::test]
    async fn every_rank_learns_every_flag() {
        let world = 5;
        let flags = vec![0, FLAG_CHECKPOINT, 0, 0, FLAG_HALT];
        let got = run_ring(inputs(world, 10, 1), flags, 9).await;
        for (_, f) in got {
            assert_eq!(f, FLAG_CHECKPOINT | FLAG_HALT);
        }
    }

    #[test]
    fn chunks_cover_everything_once() {
        for world in 1..=8 {
            for n in 0..40 {
                let mut next = 0;
                for c in 0..world {
                    let (a, b) = chunk_bounds(n, world, c);
                    assert_eq!(a, next);
                    assert!(b >= a && b - a <= n / world + 1);
                    next = b;
                }
                assert_eq!(next, n);
            }
        }
    }

    #[tokio::test]
    async fn a_mismatched_peer_is_refused_clearly() {
        let (tx, rx) = mpsc::unbounded_channel();
        // Rank 1 of 2 whose "predecessor" sends a message of another step.
        tx.send(encode(
            Header {
                phase: REDUCE_SCATTER,
                hop: 0,
                step: 99,
                chunk: 0,
                flags: 0,
                fingerprint: 1,
                count: 2,
            },
            &[1.0, 2.0],
        ))
        .expect("send");
        let (out, _keep) = mpsc::unbounded_channel();
        let mut link = ChanLink {
            tx: out,
            rx,
            rng: SplitMix::new(1),
        };
        let mut v = vec![0f32; 4];
        let e = all_reduce(&mut link, Place { rank: 1, world: 2 }, 5, 1, 0, &mut v)
            .await
            .expect_err("step mismatch");
        assert!(e.to_string().contains("expected step 5"), "{e}");
    }
}
