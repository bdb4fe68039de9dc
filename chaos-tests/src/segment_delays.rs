//! One-way delays of a job's own TCP segments, from the moment the sender's
//! TCP emitted each one to its arrival at the receiver.
//!
//! The emission time is the segment's TCP timestamp (TSval): Linux sets it
//! when TCP hands the segment down, before any qdisc, so the delay covers
//! the sender's own queues (an HTB class that holds a shaped job to its
//! rate) as well as the fabric's. TSval counts milliseconds of
//! `CLOCK_MONOTONIC`, with a random offset per connection unless the
//! sender's namespace has `net.ipv4.tcp_timestamps = 2`
//! ([`no_timestamp_offsets`]). The testbed's namespaces share one kernel,
//! so the receiver's arrival stamp (the packet socket's, `CLOCK_REALTIME`,
//! turned into `CLOCK_MONOTONIC` by their difference read at the start)
//! is on the same clock. TSval is the emission millisecond rounded down:
//! each delay is at most 1 ms above the true one.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;

use crate::capture::{self, Capturer};

/// Most segments kept per capture (later ones are counted, not kept).
pub const MAX_SAMPLES: usize = 4 << 20;
/// How far ahead of the arrival a TSval may be and still count (as no
/// delay); further ahead it is another clock's.
const TSVAL_AHEAD_MS: u32 = 10;
/// A delay above this is not a delay: the sender's TSval has a
/// per-connection offset (its namespace has `tcp_timestamps` 1).
const IMPLAUSIBLE_NS: u64 = 10_000_000_000;

/// What a capture saw.
#[derive(Debug, Clone, Default)]
pub struct SegmentDelays {
    /// (arrival, ns since the Unix epoch; delay, µs) per data segment.
    pub samples: Vec<(u64, u64)>,
    /// Segments past [`MAX_SAMPLES`].
    pub dropped: u64,
    /// Segments whose TSval made no sense as a time (an offset).
    pub implausible: u64,
}

impl SegmentDelays {
    /// The delays (µs) of segments that arrived in `[from, to]` (ns since
    /// the epoch).
    pub fn between(&self, from: u64, to: u64) -> impl Iterator<Item = u64> + '_ {
        self.samples
            .iter()
            .filter(move |(at, _)| (from..=to).contains(at))
            .map(|(_, d)| *d)
    }
}

/// Sets `net.ipv4.tcp_timestamps` to 2 in `ns`: TCP timestamps on, with
/// no random offset per connection. Connections opened afterwards carry
/// TSvals on the shared monotonic clock.
pub fn no_timestamp_offsets(ns: &testbed::netns::Netns) -> anyhow::Result<()> {
    ns.run(|| std::fs::write("/proc/sys/net/ipv4/tcp_timestamps", "2"))?
        .context("set net.ipv4.tcp_timestamps to 2")
}

impl Capturer<SegmentDelays> {
    /// Starts capturing, inside `ns`, the delays of arriving TCP data
    /// segments whose source or destination port is one of `ports`.
    pub fn start_delays(
        ns: &testbed::netns::Netns,
        ports: Vec<u16>,
    ) -> anyhow::Result<Capturer<SegmentDelays>> {
        Capturer::spawn(ns, libc::ETH_P_IP, move |fd, stop| {
            delay_loop(fd, &ports, stop)
        })
    }
}

/// `CLOCK_REALTIME` minus `CLOCK_MONOTONIC`, ns.
fn realtime_minus_monotonic() -> anyhow::Result<u64> {
    let read = |clock| -> anyhow::Result<u64> {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec for the call to fill.
        if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
            return Err(std::io::Error::last_os_error()).context("clock_gettime");
        }
        Ok(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
    };
    let m0 = read(libc::CLOCK_MONOTONIC)?;
    let r = read(libc::CLOCK_REALTIME)?;
    let m1 = read(libc::CLOCK_MONOTONIC)?;
    Ok(r.saturating_sub(m0 / 2 + m1 / 2))
}

/// The TSval of a TCP header with its options (`tcp` from the TCP
/// header's first byte); None without a timestamp option.
pub fn tsval(tcp: &[u8]) -> Option<u32> {
    let doff = usize::from(*tcp.get(12)? >> 4) * 4;
    let opts = tcp.get(20..doff.min(tcp.len()))?;
    let mut i = 0;
    while i < opts.len() {
        match opts[i] {
            0 => return None,
            1 => i += 1,
            kind => {
                let len = usize::from(*opts.get(i + 1)?);
                if len < 2 {
                    return None;
                }
                if kind == 8 && len == 10 {
                    let v = opts.get(i + 2..i + 6)?;
                    return Some(u32::from_be_bytes([v[0], v[1], v[2], v[3]]));
                }
                i += len;
            }
        }
    }
    None
}

/// The delay (ns) of a segment stamped `tsval` (ms, truncated to 32 bits)
/// that arrived at `arrival_mono` (ns of the same clock).
pub fn delay_ns(tsval: u32, arrival_mono: u64) -> u64 {
    let now_ms = arrival_mono / 1_000_000;
    // The TSval's full millisecond: `now_ms` less how far TSval is behind
    // it (wrapping at 32 bits). A TSval a little ahead (it was taken
    // after the arrival stamp's clock reading rounded down, or paced
    // segments were stamped for their departure) is a delay of 0.
    let ahead = tsval.wrapping_sub(now_ms as u32);
    if (1..=TSVAL_AHEAD_MS).contains(&ahead) {
        return 0;
    }
    let behind = u64::from((now_ms as u32).wrapping_sub(tsval));
    // Behind the clock's start: another clock's stamp.
    let Some(sent_ms) = now_ms.checked_sub(behind) else {
        return u64::MAX;
    };
    arrival_mono.saturating_sub(sent_ms * 1_000_000)
}

fn delay_loop(fd: OwnedFd, ports: &[u16], stop: &AtomicBool) -> anyhow::Result<SegmentDelays> {
    let offset = realtime_minus_monotonic()?;
    let mut out = SegmentDelays::default();
    let mut buf = [0u8; 128];
    while !stop.load(Ordering::Relaxed) {
        let Some(p) = capture::recv_packet(&fd, &mut buf)? else {
            continue;
        };
        if p.outgoing {
            continue;
        }
        let pkt = &buf[..p.wire_len.min(buf.len())];
        let Some((ihl, payload)) = capture::tcp_payload(pkt, p.wire_len) else {
            continue;
        };
        let Some(tcp) = pkt.get(ihl..) else { continue };
        let (sport, dport) = (
            u16::from_be_bytes([tcp[0], tcp[1]]),
            u16::from_be_bytes([tcp[2], tcp[3]]),
        );
        if payload == 0 || !(ports.contains(&sport) || ports.contains(&dport)) {
            continue;
        }
        let Some(ts) = tsval(tcp) else { continue };
        let d = delay_ns(ts, p.at.saturating_sub(offset));
        if d > IMPLAUSIBLE_NS {
            out.implausible += 1;
        } else if out.samples.len() < MAX_SAMPLES {
            out.samples.push((p.at, d / 1_000));
        } else {
            out.dropped += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TCP header with options `opts` (padded to a word).
    fn tcp_with(opts: &[u8]) -> Vec<u8> {
        let mut o = opts.to_vec();
        while !o.len().is_multiple_of(4) {
            o.push(0);
        }
        let mut t = vec![0u8; 20];
        t[12] = (((20 + o.len()) / 4) as u8) << 4;
        t.extend(o);
        t
    }

    #[test]
    fn the_timestamp_option_is_found_among_others() {
        // NOP, NOP, timestamp (kind 8, length 10).
        let t = tcp_with(&[1, 1, 8, 10, 0, 0, 0x12, 0x34, 0, 0, 0, 1]);
        assert_eq!(tsval(&t), Some(0x1234));
        // MSS first, then SACK-permitted, then the timestamp.
        let t = tcp_with(&[2, 4, 5, 0xb4, 4, 2, 8, 10, 0, 0, 0, 7, 0, 0, 0, 0]);
        assert_eq!(tsval(&t), Some(7));
        assert_eq!(tsval(&tcp_with(&[])), None);
        assert_eq!(tsval(&tcp_with(&[2, 4, 5, 0xb4])), None);
        // A zero length would loop forever; an option past the header's end
        // is not read.
        assert_eq!(tsval(&tcp_with(&[3, 0, 8, 10])), None);
        assert_eq!(tsval(&tcp_with(&[8, 10, 0, 0])), None);
    }

    #[test]
    fn delays_count_from_the_stamped_millisecond_across_the_wrap() {
        // Sent in millisecond 5,000, arrived 5,003.25 ms: 3.25 ms.
        assert_eq!(delay_ns(5_000, 5_003_250_000), 3_250_000);
        // The 32-bit TSval wrapped between sending and arrival.
        let now_ms: u64 = (1 << 32) + 2;
        let sent = (now_ms - 4) as u32;
        assert_eq!(delay_ns(sent, now_ms * 1_000_000 + 500_000), 4_500_000);
        // A TSval from another clock is far off, never negative.
        assert!(delay_ns(123, 9_000_000_000_000) > IMPLAUSIBLE_NS);
        // One a millisecond ahead of the arrival is no delay; far ahead,
        // another clock.
        assert_eq!(delay_ns(5_004, 5_003_250_000), 0);
        assert!(delay_ns(9_000, 5_003_250_000) > IMPLAUSIBLE_NS);
    }
}
