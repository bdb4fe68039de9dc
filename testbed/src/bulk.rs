//! A background TCP bulk flow between two testbed hosts over their rail
//! addresses: the "contention" row of TESTBED.md's fault table, and the
//! load that makes a leaf split's uplink queue.
//!
//! The sockets are made inside the hosts' namespaces (a socket's namespace
//! is fixed when it is created, [`crate::Netns::run`]); the sender
//! and receiver then run on plain threads of this process. Both are
//! bounded: the sender stops on [`BulkFlow::stop`] or when the flow's
//! maximum duration is up, the receiver drains what is in flight for at
//! most [`DRAIN_MAX`] after that and stops at EOF.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::{rail_addr, Node, Testbed};

/// Longest a receiver keeps draining after the sender stopped.
pub const DRAIN_MAX: Duration = Duration::from_secs(5);
/// Longest a flow may be asked to run.
pub const MAX_FLOW: Duration = Duration::from_secs(600);
/// How long the receiver waits for the sender's connection.
const ACCEPT_WAIT: Duration = Duration::from_secs(5);
/// Socket timeouts: how often each loop looks at the stop flag.
const POLL: Duration = Duration::from_millis(100);
const CHUNK: usize = 64 << 10;

/// Why a flow could not start or did not finish cleanly.
#[derive(Debug, thiserror::Error)]
pub enum BulkError {
    /// The flow asked for is not possible (same host, no such host or
    /// rail, a duration outside (0, [`MAX_FLOW`]]); nothing was started.
    #[error("bulk flow: bad request: {0}")]
    BadRequest(String),
    /// A socket could not be made inside a host's namespace.
    #[error("bulk flow: cannot enter namespace of host {host}: {error}")]
    Namespace { host: usize, error: std::io::Error },
    /// The receiver could not listen on its rail address.
    #[error("bulk flow: listen on {addr} (host {host}): {error}")]
    Listen {
        host: usize,
        addr: SocketAddr,
        error: std::io::Error,
    },
    /// The sender could not connect to the receiver.
    #[error("bulk flow: connect from host {host} to {addr}: {error}")]
    Connect {
        host: usize,
        addr: SocketAddr,
        error: std::io::Error,
    },
    /// The receiver was never connected to; both threads are stopped.
    #[error("bulk flow: the receiver saw no connection within {ACCEPT_WAIT:?}")]
    NoConnection,
    /// The named thread (sender or receiver) panicked; its counts are lost.
    #[error("bulk flow: {0} thread panicked")]
    Panicked(&'static str),
}

/// What a flow achieved. The rate is the receiver's: bytes received over
/// the time from its first to its last byte.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BulkReport {
    /// Bytes the sender handed to its socket.
    pub bytes_sent: u64,
    /// Bytes the receiver read.
    pub bytes_received: u64,
    /// First to last received byte, seconds.
    pub secs: f64,
    /// `bytes_received` × 8 / `secs` / 10⁶.
    pub mbps: f64,
}

/// A running flow. Dropping it stops it too (without waiting for the
/// threads, which end on their own within their bounds).
pub struct BulkFlow {
    from: usize,
    to: usize,
    rail: usize,
    stop: StopFlag,
    sent: Arc<AtomicU64>,
    received: Arc<AtomicU64>,
    sender: Option<JoinHandle<()>>,
    receiver: Option<JoinHandle<Result<(u64, Duration), BulkError>>>,
}

impl BulkFlow {
    /// Starts a flow from host `from`'s `rail<rail>` to host `to`'s, to TCP
    /// `port` on `to`'s rail address. It runs until [`Self::stop`] or for
    /// `max` (at most [`MAX_FLOW`]), whichever comes first. Returns once
    /// the connection is made.
    pub fn start(
        tb: &Testbed,
        from: usize,
        to: usize,
        rail: usize,
        port: u16,
        max: Duration,
    ) -> Result<BulkFlow, BulkError> {
        if let Some(why) = route_error(tb, from, to, rail).or(duration_error(max, MAX_FLOW)) {
            return Err(BulkError::BadRequest(why));
        }
        let addr = SocketAddr::from((rail_addr(to, rail), port));
        let listener = tb
            .ns(Node::Host(to))
            .run(move || TcpListener::bind(addr))
            .map_err(|error| BulkError::Namespace { host: to, error })?
            .map_err(|error| BulkError::Listen {
                host: to,
                addr,
                error,
            })?;
        let stream = tb
            .ns(Node::Host(from))
            .run(move || TcpStream::connect_timeout(&addr, ACCEPT_WAIT))
            .map_err(|error| BulkError::Namespace { host: from, error })?
            .map_err(|error| BulkError::Connect {
                host: from,
                addr,
                error,
            })?;
        let deadline = Instant::now() + max;
        let stop = StopFlag::default();
        let sent = Arc::new(AtomicU64::new(0));
        let received = Arc::new(AtomicU64::new(0));
        let receiver = {
            let (stop, received) = (stop.handle(), received.clone());
            std::thread::Builder::new()
                .name(format!("bulk-rx-h{to}"))
                .spawn(move || receive(listener, deadline, &stop, &received))
                .map_err(|_| BulkError::Panicked("receiver spawn"))?
        };
        let sender = {
            let (stop, sent) = (stop.handle(), sent.clone());
            std::thread::Builder::new()
                .name(format!("bulk-tx-h{from}"))
                .spawn(move || send(stream, deadline, &stop, &sent))
                .map_err(|_| BulkError::Panicked("sender spawn"))?
        };
        tracing::info!(from, to, rail, %addr, ?max, "bulk flow started");
        Ok(BulkFlow {
            from,
            to,
            rail,
            stop,
            sent,
            received,
            sender: Some(sender),
            receiver: Some(receiver),
        })
    }

    /// (bytes sent, bytes received) so far.
    pub fn progress(&self) -> (u64, u64) {
        (
            self.sent.load(Ordering::Relaxed),
            self.received.load(Ordering::Relaxed),
        )
    }

    /// Stops the sender, lets the receiver drain (at most [`DRAIN_MAX`])
    /// and reports. Blocks for at most about `DRAIN_MAX` plus the poll
    /// interval (call it from a blocking context).
    pub fn stop(mut self) -> Result<BulkReport, BulkError> {
        self.stop.raise();
        self.join()
    }

    /// Waits for the flow to end on its own (its maximum duration), then
    /// reports.
    pub fn wait(mut self) -> Result<BulkReport, BulkError> {
        self.join()
    }

    fn join(&mut self) -> Result<BulkReport, BulkError> {
        if let Some(s) = self.sender.take() {
            s.join().map_err(|_| BulkError::Panicked("sender"))?;
        }
        // The sender has stopped: the receiver drains, bounded.
        self.stop.raise();
        let (bytes_received, span) = match self.receiver.take() {
            Some(r) => r.join().map_err(|_| BulkError::Panicked("receiver"))??,
            None => (0, Duration::ZERO),
        };
        let secs = span.as_secs_f64();
        let report = BulkReport {
            bytes_sent: self.sent.load(Ordering::Relaxed),
            bytes_received,
            secs,
            mbps: mbps(bytes_received, secs),
        };
        tracing::info!(
            from = self.from,
            to = self.to,
            rail = self.rail,
            bytes_sent = report.bytes_sent,
            bytes_received = report.bytes_received,
            secs = report.secs,
            mbps = report.mbps,
            "bulk flow stopped"
        );
        Ok(report)
    }
}

/// A load's stop flag, shared with its threads and raised when the load
/// is dropped (its threads then end on their own, within their bounds).
#[derive(Debug, Default)]
pub(crate) struct StopFlag(Arc<AtomicBool>);

impl StopFlag {
    /// Tells the threads to stop.
    pub(crate) fn raise(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// The flag for a thread to watch.
    pub(crate) fn handle(&self) -> Arc<AtomicBool> {
        self.0.clone()
    }
}

impl Drop for StopFlag {
    fn drop(&mut self) {
        self.raise();
    }
}

/// Why a load from host `from` to host `to` on `rail` is not possible in
/// `tb` (the same host, no such host or rail), if it is not.
pub(crate) fn route_error(tb: &Testbed, from: usize, to: usize, rail: usize) -> Option<String> {
    let hosts = tb.hosts.len();
    (from == to || from >= hosts || to >= hosts || rail > 1).then(|| {
        format!(
            "host {from} → host {to} on rail {rail} (the testbed has {hosts} hosts, rails 0 and 1)"
        )
    })
}

/// Why a load may not run for `max` (not in (0, `limit`]), if it may not.
pub(crate) fn duration_error(max: Duration, limit: Duration) -> Option<String> {
    (max.is_zero() || max > limit).then(|| format!("duration {max:?} is not in (0, {limit:?}]"))
}

/// `bytes` over `secs` in Mbit/s (0 for no time).
pub(crate) fn mbps(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 * 8.0 / secs / 1e6
    } else {
        0.0
    }
}

/// A socket timeout (nothing to read or no room to write yet).
pub(crate) fn timed_out(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// Writes until stopped or `deadline`, then closes (the receiver sees EOF
/// after the data in flight).
fn send(mut stream: TcpStream, deadline: Instant, stop: &AtomicBool, sent: &AtomicU64) {
    if let Err(e) = stream.set_write_timeout(Some(POLL)) {
        tracing::warn!(error = %e, "bulk sender: cannot set write timeout; stopping");
        return;
    }
    let chunk = vec![0x5au8; CHUNK];
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        match stream.write(&chunk) {
            Ok(n) => {
                sent.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) if timed_out(&e) || e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(error = %e, "bulk sender: write failed; stopping");
                break;
            }
        }
    }
    let _ = stream.shutdown(std::net::Shutdown::Write);
}

/// Accepts the one connection and reads to EOF; once `stop` is set (and
/// in any case after the flow's `deadline`), reads for at most
/// [`DRAIN_MAX`] more. Returns bytes read and the span from the first to
/// the last byte.
fn receive(
    listener: TcpListener,
    deadline: Instant,
    stop: &AtomicBool,
    received: &AtomicU64,
) -> Result<(u64, Duration), BulkError> {
    let accept_until = Instant::now() + ACCEPT_WAIT;
    listener
        .set_nonblocking(true)
        .map_err(|_| BulkError::NoConnection)?;
    let mut stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if timed_out(&e) && Instant::now() < accept_until => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => {
                tracing::warn!(error = %e, "bulk receiver: no connection");
                return Err(BulkError::NoConnection);
            }
        }
    };
    drop(listener);
    if stream.set_nonblocking(false).is_err() || stream.set_read_timeout(Some(POLL)).is_err() {
        return Err(BulkError::NoConnection);
    }
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    let hard_stop = deadline + DRAIN_MAX;
    let mut read_until = hard_stop;
    let mut stopping = false;
    loop {
        if !stopping && stop.load(Ordering::Relaxed) {
            stopping = true;
            read_until = (Instant::now() + DRAIN_MAX).min(hard_stop);
        }
        if Instant::now() >= read_until {
            tracing::warn!(
                bytes = total,
                "bulk receiver: drain bound reached before EOF"
            );
            break;
        }
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let now = Instant::now();
                first.get_or_insert(now);
                last = now;
                total += n as u64;
                received.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) if timed_out(&e) || e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(error = %e, "bulk receiver: read failed; stopping");
                break;
            }
        }
    }
    let span = first.map_or(Duration::ZERO, |f| last.saturating_duration_since(f));
    Ok((total, span))
}
