//! Bursty UDP cross traffic between two testbed hosts over a rail: bursts
//! of full-size datagrams (geometric size, mean [`BurstSpec::mean_burst`])
//! at exponential gaps, paced on absolute deadlines to an average rate.
//!
//! Collective traffic arrives in bursts; a queue fed this way is busy most
//! of the time at high load yet empties now and then, unlike the standing
//! queue of a TCP bulk flow. The sender keeps its schedule on deadlines
//! (a late wake-up sends the due bursts at once rather than lowering the
//! rate); the receiver drains and counts. Both are bounded: the sender
//! stops on [`BurstLoad::stop`] or when the maximum duration is up, the
//! receiver once quiet after that, and `DRAIN` after the maximum
//! duration at the latest.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

use crate::bulk::{duration_error, mbps, route_error, timed_out, StopFlag};
use crate::{rail_addr, Node, Testbed};

/// UDP payload of every datagram (with headers, a 1442-byte frame).
pub const PAYLOAD: usize = 1400;
/// Bytes on the wire per datagram (Ethernet, IPv4 and UDP headers).
pub const FRAME: usize = PAYLOAD + 14 + 20 + 8;
/// Longest a load may run.
pub const MAX_LOAD: Duration = Duration::from_secs(600);
/// How long the receiver keeps draining after the sender stopped.
const DRAIN: Duration = Duration::from_millis(500);
/// Receive timeout: how often the receiver looks at the stop flag.
const POLL: Duration = Duration::from_millis(100);
/// Largest burst (the geometric tail is cut here).
const MAX_BURST: u32 = 256;
/// Longest sleep of the sender (it also checks the stop flag).
const MAX_SLEEP: Duration = Duration::from_millis(50);
/// Most the sender may fall behind its schedule: beyond it the schedule
/// restarts from now (an unreachable rate is not chased flat out).
const MAX_LAG: Duration = Duration::from_millis(100);

/// What to send.
#[derive(Debug, Clone)]
pub struct BurstSpec {
    pub from: usize,
    pub to: usize,
    pub rail: usize,
    pub port: u16,
    /// Average rate on the wire, bits/s (frames, headers included).
    pub rate_bps: u64,
    /// Mean datagrams per burst (≥ 1).
    pub mean_burst: f64,
    pub max: Duration,
    pub seed: u64,
}

/// Why a load could not start or did not finish cleanly.
#[derive(Debug, thiserror::Error)]
pub enum BurstError {
    /// The load asked for is not possible (same host, no such host or
    /// rail, a zero rate, a mean burst outside 1..=`MAX_BURST`, a
    /// duration outside (0, [`MAX_LOAD`]]); nothing was started.
    #[error("burst load: bad request: {0}")]
    BadRequest(String),
    /// A socket could not be made inside a host's namespace.
    #[error("burst load: cannot enter namespace of host {host}: {error}")]
    Namespace { host: usize, error: std::io::Error },
    /// A UDP socket could not be bound or connected on a rail address.
    #[error("burst load: socket on host {host} ({addr}): {error}")]
    Socket {
        host: usize,
        addr: SocketAddr,
        error: std::io::Error,
    },
    /// The named thread (sender or receiver) could not be started.
    #[error("burst load: cannot start the {0} thread: {1}")]
    Spawn(&'static str, std::io::Error),
    /// The named thread (sender or receiver) panicked; its counts are lost.
    #[error("burst load: {0} thread panicked")]
    Panicked(&'static str),
}

/// What a load did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BurstReport {
    pub sent: u64,
    pub received: u64,
    /// Sender's running time, seconds.
    pub secs: f64,
    /// Offered rate on the wire, Mbit/s.
    pub offered_mbps: f64,
    /// Delivered rate on the wire, Mbit/s.
    pub delivered_mbps: f64,
}

/// A running load. Dropping it stops it (without waiting).
pub struct BurstLoad {
    spec: BurstSpec,
    stop: StopFlag,
    received: Arc<AtomicU64>,
    sender: Option<JoinHandle<(u64, Duration)>>,
    receiver: Option<JoinHandle<()>>,
}

impl BurstLoad {
    /// Opens both sockets (each in its host's namespace) and starts.
    pub fn start(tb: &Testbed, spec: BurstSpec) -> Result<BurstLoad, BurstError> {
        if let Some(why) = route_error(tb, spec.from, spec.to, spec.rail) {
            return Err(BurstError::BadRequest(why));
        }
        if spec.rate_bps == 0 || !(1.0..=f64::from(MAX_BURST)).contains(&spec.mean_burst) {
            return Err(BurstError::BadRequest(format!(
                "rate {} bit/s, mean burst {} (want a rate > 0 and a burst in 1..={MAX_BURST})",
                spec.rate_bps, spec.mean_burst
            )));
        }
        if let Some(why) = duration_error(spec.max, MAX_LOAD) {
            return Err(BurstError::BadRequest(why));
        }
        let dst = SocketAddr::from((rail_addr(spec.to, spec.rail), spec.port));
        let src = SocketAddr::from((rail_addr(spec.from, spec.rail), 0));
        // Both timeouts on both sockets: each loop looks at its stop flag.
        let open = |host: usize, addr: SocketAddr| {
            tb.ns(Node::Host(host))
                .run(move || {
                    let s = UdpSocket::bind(addr)?;
                    s.set_read_timeout(Some(POLL))?;
                    s.set_write_timeout(Some(POLL))?;
                    Ok(s)
                })
                .map_err(|error| BurstError::Namespace { host, error })?
                .map_err(|error: std::io::Error| BurstError::Socket { host, addr, error })
        };
        let rx = open(spec.to, dst)?;
        let tx = open(spec.from, src)?;
        let stop = StopFlag::default();
        let received = Arc::new(AtomicU64::new(0));
        let deadline = Instant::now() + spec.max;
        let receiver = {
            let (stop, received) = (stop.handle(), received.clone());
            std::thread::Builder::new()
                .name(format!("burst-rx-h{}", spec.to))
                .spawn(move || receive(rx, deadline + DRAIN, &stop, &received))
                .map_err(|e| BurstError::Spawn("receiver", e))?
        };
        let sender = {
            let (stop_tx, s) = (stop.handle(), spec.clone());
            std::thread::Builder::new()
                .name(format!("burst-tx-h{}", spec.from))
                .spawn(move || send(tx, dst, &s, deadline, &stop_tx))
                .map_err(|e| {
                    // The receiver would otherwise run to its hard deadline.
                    stop.raise();
                    BurstError::Spawn("sender", e)
                })?
        };
        tracing::info!(
            from = spec.from,
            to = spec.to,
            rail = spec.rail,
            rate_bps = spec.rate_bps,
            mean_burst = spec.mean_burst,
            "burst load started"
        );
        Ok(BurstLoad {
            spec,
            stop,
            received,
            sender: Some(sender),
            receiver: Some(receiver),
        })
    }

    /// Stops the sender, lets the receiver drain and reports.
    pub fn stop(mut self) -> Result<BurstReport, BurstError> {
        self.stop.raise();
        let (sent, ran) = self
            .sender
            .take()
            .map(|s| s.join().map_err(|_| BurstError::Panicked("sender")))
            .transpose()?
            .unwrap_or_default();
        // The receiver drains what is still queued and stops once quiet.
        if let Some(r) = self.receiver.take() {
            r.join().map_err(|_| BurstError::Panicked("receiver"))?;
        }
        let received = self.received.load(Ordering::Relaxed);
        let secs = ran.as_secs_f64();
        let report = BurstReport {
            sent,
            received,
            secs,
            offered_mbps: mbps(sent * FRAME as u64, secs),
            delivered_mbps: mbps(received * FRAME as u64, secs),
        };
        tracing::info!(
            from = self.spec.from,
            to = self.spec.to,
            rail = self.spec.rail,
            sent,
            received,
            offered_mbps = report.offered_mbps,
            "burst load stopped"
        );
        Ok(report)
    }
}

/// Sends bursts on schedule until stopped or `deadline`; returns the
/// datagrams sent and the time it ran.
fn send(
    sock: UdpSocket,
    dst: SocketAddr,
    spec: &BurstSpec,
    deadline: Instant,
    stop: &AtomicBool,
) -> (u64, Duration) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed);
    let payload = [0xb5u8; PAYLOAD];
    // Mean gap between bursts for the average rate.
    let mean_gap_s = spec.mean_burst * (FRAME * 8) as f64 / spec.rate_bps as f64;
    let p_stop = 1.0 / spec.mean_burst;
    let t0 = Instant::now();
    let mut next = t0;
    let mut sent = 0u64;
    let mut errors = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        if next > now {
            std::thread::sleep((next - now).min(MAX_SLEEP));
            continue;
        }
        if now - next > MAX_LAG {
            next = now;
        }
        let mut n = 1;
        while n < MAX_BURST && rng.gen::<f64>() >= p_stop {
            n += 1;
        }
        for _ in 0..n {
            match sock.send_to(&payload, dst) {
                Ok(_) => sent += 1,
                Err(e) => {
                    errors += 1;
                    if errors.is_power_of_two() {
                        tracing::debug!(error = %e, errors, "burst send failed");
                    }
                }
            }
        }
        // Exponential gap (inverse transform; 1 - u is in (0, 1]).
        let u: f64 = rng.gen();
        next += Duration::from_secs_f64(-mean_gap_s * (1.0 - u).ln());
    }
    (sent, t0.elapsed())
}

/// Counts datagrams until stopped (then drains until quiet), at the
/// latest until `hard_deadline`.
fn receive(sock: UdpSocket, hard_deadline: Instant, stop: &AtomicBool, received: &AtomicU64) {
    let mut buf = [0u8; 2048];
    while Instant::now() < hard_deadline {
        match sock.recv(&mut buf) {
            Ok(_) => {
                received.fetch_add(1, Ordering::Relaxed);
            }
            // Quiet for a poll interval: done once stopped.
            Err(_) if stop.load(Ordering::Relaxed) => return,
            Err(e) if timed_out(&e) => {}
            // Anything else: do not spin on it.
            Err(_) => std::thread::sleep(POLL),
        }
    }
}
