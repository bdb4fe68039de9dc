//! Stalls on one device's egress: a gray link that delays without losing.
//! The device holds back everything it sends for a random while, again and
//! again (as a port receiving pause frames does, or a link that retries at
//! the link layer), its link up with carrier throughout.
//!
//! This kernel has no netem and no fq (whose departure times a BPF
//! program could set), so the stalls are made with the one queue that can
//! stop and restart at once: a TBF root qdisc whose rate is switched, over
//! rtnetlink, between one no traffic here reaches (100 Gbit/s) and one
//! that stops the port (8 kbit/s). A change resets TBF's tokens to its
//! burst, so each switch is followed by one filler frame sent on the device
//! from a packet socket: on a stop it spends the burst (one full frame)
//! so nothing else passes until the port flows again; on a restart it
//! makes the qdisc dequeue at once (a qdisc runs when it is given a
//! packet), so the held frames drain at full rate. The fillers (a local
//! experimental EtherType to a MAC no host has) are dropped by the host's
//! NIC. The queue (16 MB) holds what arrives meanwhile: nothing is dropped.
//!
//! Every run is bounded: [`Stalls::stop`] (or dropping the handle) ends
//! the switching task; `stop` also removes the qdisc.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use netlink_packet_core::{DefaultNla, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_REQUEST};
use netlink_packet_route::tc::{TcAttribute, TcHandle, TcMessage, TcOption};
use netlink_packet_route::RouteNetlinkMessage;

use crate::netns::Netns;

/// How a device stalls.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StallSpec {
    /// Each stall lasts a random time up to this.
    pub max_stall: Duration,
    /// Mean time from the start of one stall to the next (each gap is
    /// random, between half and one and a half times this, and never
    /// shorter than the stall plus a millisecond).
    pub every: Duration,
}

/// The flowing rate (bytes/s) and burst.
const FLOW_RATE: u64 = 100_000_000_000 / 8;
const FLOW_BURST: u32 = 1_000_000;
/// The stopped rate (bytes/s): after the filler, even a 64-byte frame
/// would wait over half a minute (stalls are at most [`MAX_STALL`]).
const STOP_RATE: u64 = 2;
/// The longest stall taken.
pub const MAX_STALL: Duration = Duration::from_secs(1);
/// One full frame: the stopped burst, and the filler's size.
const FRAME: usize = 1_514;
/// Bytes the queue holds.
const LIMIT: u32 = 16_000_000;
/// `TCA_TBF_PARMS`, `TCA_TBF_RATE64`, `TCA_TBF_BURST` (linux/pkt_sched.h).
const TCA_TBF_PARMS: u16 = 1;
const TCA_TBF_RATE64: u16 = 4;
const TCA_TBF_BURST: u16 = 6;
/// A netlink request not answered within this is an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// The root TBF message for `rate` bytes/s and `burst` bytes
/// (`struct tc_tbf_qopt`: rate, peakrate, limit, buffer, mtu; the burst
/// attribute stands for the buffer).
fn tbf(ifindex: u32, rate: u64, burst: u32) -> TcMessage {
    let mut qopt = Vec::with_capacity(36);
    qopt.extend_from_slice(&tc_htb::ratespec(rate));
    qopt.extend_from_slice(&[0u8; 12]);
    qopt.extend_from_slice(&LIMIT.to_ne_bytes());
    qopt.extend_from_slice(&[0u8; 8]);
    let mut opts = vec![
        TcOption::Other(DefaultNla::new(TCA_TBF_PARMS, qopt)),
        TcOption::Other(DefaultNla::new(TCA_TBF_BURST, burst.to_ne_bytes().to_vec())),
    ];
    if rate > u64::from(u32::MAX) {
        opts.push(TcOption::Other(DefaultNla::new(
            TCA_TBF_RATE64,
            rate.to_ne_bytes().to_vec(),
        )));
    }
    let mut m = TcMessage::with_index(ifindex as i32);
    m.header.parent = TcHandle::ROOT;
    m.attributes.push(TcAttribute::Kind("tbf".into()));
    m.attributes.push(TcAttribute::Options(opts));
    m
}

/// Sends a qdisc message (`flags` beside request and ack) and waits for
/// the kernel's answer.
async fn send(h: &rtnetlink::Handle, m: TcMessage, flags: u16) -> anyhow::Result<()> {
    let mut req = NetlinkMessage::from(RouteNetlinkMessage::NewQueueDiscipline(m));
    req.header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
    let mut resp = h.clone().request(req).context("tbf request")?;
    let wait = async {
        while let Some(msg) = resp.next().await {
            if let NetlinkPayload::Error(e) = msg.payload {
                if e.code.is_some() {
                    return Err(anyhow::Error::new(e.to_io()).context("tbf request refused"));
                }
            }
        }
        Ok(())
    };
    tokio::time::timeout(REQUEST_TIMEOUT, wait)
        .await
        .context("tbf request unanswered")?
}

/// The index of `dev` and a packet socket that sends raw frames out of it
/// (called inside the device's namespace).
fn filler_socket(dev: &str) -> anyhow::Result<(u32, OwnedFd)> {
    let name = std::ffi::CString::new(dev).context("device name")?;
    // SAFETY: `name` is a valid C string for the duration of the call.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if ifindex == 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("no device {dev}"));
    }
    // SAFETY: plain socket call; the result is checked before use.
    let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error()).context("packet socket (needs root)");
    }
    // SAFETY: `raw` is a new descriptor owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: an all-zero sockaddr_ll is valid; the fields are set below.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_ifindex = ifindex as i32;
    // SAFETY: `addr` outlives the call and its size is passed.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error()).context("bind the packet socket");
    }
    Ok((ifindex, fd))
}

/// One filler frame out of the socket's device.
fn send_filler(fd: &OwnedFd) -> anyhow::Result<()> {
    let mut frame = [0u8; FRAME];
    // To 02:00:5e:ff:ff:fe (locally administered, no host's), from
    // 02:00:5e:ff:ff:ff, EtherType 0x88b5 (local experimental).
    frame[..6].copy_from_slice(&[0x02, 0x00, 0x5e, 0xff, 0xff, 0xfe]);
    frame[6..12].copy_from_slice(&[0x02, 0x00, 0x5e, 0xff, 0xff, 0xff]);
    frame[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    // SAFETY: `frame` outlives the call and its length is passed.
    let n = unsafe { libc::send(fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
    anyhow::ensure!(
        n == FRAME as isize,
        "send the filler frame: {}",
        std::io::Error::last_os_error()
    );
    Ok(())
}

/// A device stalling until stopped.
#[derive(Debug)]
pub struct Stalls {
    ns: String,
    dev: String,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Stalls {
    /// Installs the TBF root on `dev` in `ns` (replacing any root qdisc)
    /// and starts stalling it as `spec` says.
    pub async fn start(ns: &Netns, dev: &str, spec: StallSpec) -> anyhow::Result<Stalls> {
        anyhow::ensure!(
            !spec.max_stall.is_zero() && spec.max_stall < spec.every && spec.max_stall <= MAX_STALL,
            "stalls of up to {:?} every {:?}: want 0 < max_stall < every, max_stall <= {MAX_STALL:?}",
            spec.max_stall,
            spec.every
        );
        let h = ns.netlink().context("netlink in the fabric")?;
        let name = dev.to_string();
        let (ifindex, fd) = ns.run(move || filler_socket(&name))??;
        send(
            &h,
            tbf(ifindex, FLOW_RATE, FLOW_BURST),
            netlink_packet_core::NLM_F_CREATE | netlink_packet_core::NLM_F_REPLACE,
        )
        .await
        .with_context(|| format!("install the stalling qdisc on {dev}"))?;
        let task = tokio::spawn(async move {
            loop {
                let stall = spec.max_stall.mul_f64(rand::random::<f64>().max(0.01));
                let gap = spec.every.mul_f64(0.5 + rand::random::<f64>());
                tokio::time::sleep(gap.max(stall + Duration::from_millis(1))).await;
                send(&h, tbf(ifindex, STOP_RATE, FRAME as u32), 0).await?;
                send_filler(&fd)?;
                tokio::time::sleep(stall).await;
                send(&h, tbf(ifindex, FLOW_RATE, FLOW_BURST), 0).await?;
                send_filler(&fd)?;
            }
        });
        tracing::info!(
            ns = %ns.name,
            dev,
            max_stall_ms = spec.max_stall.as_millis() as u64,
            every_ms = spec.every.as_millis() as u64,
            "device stalls started"
        );
        Ok(Stalls {
            ns: ns.name.clone(),
            dev: dev.to_string(),
            task,
        })
    }

    /// Ends the stalls and removes the qdisc (the device flows freely; a
    /// stall cut short goes with it). An error if the stalls had stopped
    /// by themselves (a request failed) or the qdisc stayed.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.task.abort();
        // The task only ever ends by itself on an error; aborting a task
        // that had already ended keeps that error.
        let ran = match (&mut self.task).await {
            Ok(Err(e)) => Err(e.context("the stalls stopped early")),
            _ => Ok(()),
        };
        crate::drops::clear(&self.ns, &self.dev).await;
        let shown = crate::drops::show(&self.ns, &self.dev).await?;
        anyhow::ensure!(
            !shown.contains("tbf"),
            "{}: the stalling qdisc is still there: {shown}",
            self.dev
        );
        ran
    }
}

impl Drop for Stalls {
    fn drop(&mut self) {
        self.task.abort();
    }
}
