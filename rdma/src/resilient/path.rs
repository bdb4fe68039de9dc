//! One path of a resilient connection: opening it on a rail (parallel
//! connect attempts and the hello exchange), and the reader and writer tasks
//! that move its frames once it is adopted.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::seq::{Decoded, Frame};
use crate::soft::{dial, read_hello, LocalNic, NeighbourRepair};

/// An item for a path's writer task.
pub(super) struct Out {
    pub(super) frame: BytesMut,
    pub(super) payload: Option<Bytes>,
}

/// The path the connection uses: its rail and epoch, the channels to its
/// reader and writer tasks (aborted when the path is dropped) and its
/// liveness clock.
pub(super) struct Path {
    pub(super) rail: usize,
    pub(super) epoch: u32,
    /// This side opened the path (else it accepted the peer's).
    pub(super) dialed_by_me: bool,
    pub(super) writer: mpsc::Sender<Out>,
    pub(super) frames: mpsc::Receiver<Result<Frame, String>>,
    pub(super) tasks: [JoinHandle<()>; 2],
    pub(super) last_heard: Instant,
    pub(super) last_ping: Instant,
    pub(super) nic_downs: u64,
}

impl Drop for Path {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// `delivered_through` of a hello that refuses a path (never a real count).
pub(super) const REFUSED: u64 = u64::MAX;

/// A path a dial opened: the peer answered the hello with its count.
pub(super) struct DialResult {
    pub(super) rail: usize,
    pub(super) epoch: u32,
    pub(super) stream: TcpStream,
    pub(super) rest: BytesMut,
    pub(super) peer_delivered: u64,
}

/// Gap between parallel connect attempts on one rail.
const DIAL_STAGGER: Duration = Duration::from_millis(10);
/// Most parallel connect attempts on one rail.
const DIAL_ATTEMPTS: usize = 4;

/// Opens a path on one rail: a connect attempt now and, while none has
/// succeeded, another every [`DIAL_STAGGER`] (at most [`DIAL_ATTEMPTS`]),
/// all within `timeout`; before the first and the second attempt a stuck
/// neighbour entry for the peer is forgotten. (Without this, a SYN queued
/// behind a lost ARP solicitation waits a second.) The first attempt to answer wins and
/// the others are dropped (the peer refuses a repeated hello for an epoch
/// it already accepted).
pub(super) async fn dial_rail(
    nic: &LocalNic,
    remote: SocketAddr,
    hello: &Frame,
    timeout: Duration,
    repair: Option<&NeighbourRepair>,
    learned: &std::sync::atomic::AtomicU32,
) -> Result<(TcpStream, BytesMut, u64), String> {
    use futures::stream::{FuturesUnordered, StreamExt};
    let deadline = tokio::time::Instant::now() + timeout;
    let mut attempts = FuturesUnordered::new();
    let mut started = 0;
    let mut last_err = String::from("no attempt");
    loop {
        if started < DIAL_ATTEMPTS {
            if started <= 1 {
                // A stuck neighbour entry is the usual cause of a slow
                // attempt right after a flap (see NeighbourRepair): a rail
                // that was down a moment ago may hold one for its peer
                // (the entry went INCOMPLETE while the carrier was gone,
                // and the kernel solicits again only after a second), and
                // a dial that moves off a failed rail is exactly when that
                // rail-mate is needed. So look before the first attempt
                // too: a stuck entry cost the 10 ms stagger in half the
                // flaps of `bench failover`. (Before the second attempt
                // the first one's SYN may have left a new stuck entry.)
                if let Some(r) = repair {
                    r.forget(&nic.name, remote.ip()).await;
                }
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let n = started;
            attempts.push(async move { (n, dial_one(nic, remote, hello, left, learned).await) });
            started += 1;
        }
        let next = if started < DIAL_ATTEMPTS {
            (tokio::time::Instant::now() + DIAL_STAGGER).min(deadline)
        } else {
            deadline
        };
        tokio::select! {
            Some((n, r)) = attempts.next() => match r {
                Ok(ok) => {
                    tracing::debug!(
                        nic = %nic.name, %remote, attempt = n,
                        after_us = (timeout - deadline.saturating_duration_since(tokio::time::Instant::now())).as_micros() as u64,
                        "path dialled"
                    );
                    return Ok(ok);
                }
                Err(e) => {
                    tracing::debug!(nic = %nic.name, %remote, attempt = n, error = %e, "dial attempt failed");
                    last_err = e;
                    if attempts.is_empty() && started >= DIAL_ATTEMPTS {
                        return Err(last_err);
                    }
                }
            },
            _ = tokio::time::sleep_until(next) => {
                if tokio::time::Instant::now() >= deadline {
                    return Err(format!("{last_err}; timed out after {timeout:?}"));
                }
            }
        }
    }
}

async fn dial_one(
    nic: &LocalNic,
    remote: SocketAddr,
    hello: &Frame,
    timeout: Duration,
    learned: &std::sync::atomic::AtomicU32,
) -> Result<(TcpStream, BytesMut, u64), String> {
    let mut stream = dial(nic, remote, timeout)
        .await
        .map_err(|e| e.to_string())?;
    let mut b = BytesMut::with_capacity(32);
    hello.encode(&mut b);
    tokio::time::timeout(timeout, stream.write_all(&b))
        .await
        .map_err(|_| "hello write timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let (reply, stream, rest) = tokio::time::timeout(timeout, read_hello(stream))
        .await
        .map_err(|_| "no hello reply".to_string())?
        .map_err(|e| e.to_string())?;
    match reply {
        Frame::Hello {
            delivered_through: REFUSED,
            epoch,
            ..
        } => {
            learned.fetch_max(epoch, std::sync::atomic::Ordering::Relaxed);
            Err(format!("refused by the peer (its epoch {epoch})"))
        }
        Frame::Hello {
            delivered_through, ..
        } => Ok((stream, rest, delivered_through)),
        other => Err(format!("expected hello, got {}", other.kind())),
    }
}

/// Reads frames from the path into `out` until the stream ends or breaks
/// (the last item is then the error), accepting payloads up to `max`.
pub(super) async fn reader(
    mut rd: OwnedReadHalf,
    mut buf: BytesMut,
    out: mpsc::Sender<Result<Frame, String>>,
    max: usize,
) {
    loop {
        loop {
            match Frame::decode(&mut buf, max) {
                Ok(Decoded::Frame(f)) => {
                    if out.send(Ok(f)).await.is_err() {
                        return;
                    }
                }
                Ok(Decoded::Incomplete) => break,
                Err(e) => {
                    let _ = out.send(Err(e.to_string())).await;
                    return;
                }
            }
        }
        // Room for the whole frame being received (its length prefix says
        // how big; decode has checked it against the limit), so a large
        // message is read straight into one buffer without regrowing.
        let want = if buf.len() >= 4 {
            4 + u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize
        } else {
            0
        };
        let room = want.saturating_sub(buf.len()).max(64 * 1024);
        if buf.capacity() - buf.len() < room {
            buf.reserve(room.max(256 * 1024));
        }
        match rd.read_buf(&mut buf).await {
            Ok(0) => {
                let _ = out.send(Err("peer closed the path".into())).await;
                return;
            }
            Ok(_) => {}
            Err(e) => {
                let _ = out.send(Err(e.to_string())).await;
                return;
            }
        }
    }
}

/// Most frames written by one vectored write.
const WRITE_BATCH: usize = 64;

/// Writes the path's frames in order, each batch with vectored writes
/// (header and payload go out in one `writev`, the payload is not copied).
pub(super) async fn writer(mut wr: OwnedWriteHalf, mut rx: mpsc::Receiver<Out>) {
    let mut chunks: Vec<Bytes> = Vec::with_capacity(2 * WRITE_BATCH);
    while let Some(o) = rx.recv().await {
        chunks.clear();
        let push = |o: Out, chunks: &mut Vec<Bytes>| {
            chunks.push(o.frame.freeze());
            if let Some(p) = o.payload {
                chunks.push(p);
            }
        };
        push(o, &mut chunks);
        while chunks.len() < 2 * WRITE_BATCH {
            match rx.try_recv() {
                Ok(o) => push(o, &mut chunks),
                Err(_) => break,
            }
        }
        if write_all_vectored(&mut wr, &mut chunks).await.is_err() {
            return;
        }
    }
}

async fn write_all_vectored(wr: &mut OwnedWriteHalf, chunks: &mut [Bytes]) -> std::io::Result<()> {
    use bytes::Buf;
    let mut i = 0;
    while i < chunks.len() {
        let mut n = {
            let slices: Vec<std::io::IoSlice<'_>> = chunks[i..]
                .iter()
                .take(WRITE_BATCH)
                .map(|b| std::io::IoSlice::new(b))
                .collect();
            wr.write_vectored(&slices).await?
        };
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while n > 0 && i < chunks.len() {
            let len = chunks[i].len();
            if n >= len {
                n -= len;
                i += 1;
            } else {
                chunks[i].advance(n);
                n = 0;
            }
        }
    }
    Ok(())
}
