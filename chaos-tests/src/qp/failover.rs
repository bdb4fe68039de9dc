//! `bench failover`: link down to first message delivered over the backup
//! (p50/p99 over many flaps), steady throughput of a resilient connection
//! against plain TCP on the same veth, and the throughput dip around a
//! flap.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rdma::resilient::{ConnConfig, Failback, Rail, ResilientConnection, Side};
use rdma::soft::Endpoint;

use super::traffic::{
    drain, host_nics, join, spawn_in, totals, wait_established, HostTraffic, Sizes, TrafficSpec,
    PORT,
};
use testbed::rail_addr;

const CHUNK: usize = 1 << 20;
/// Alternating throughput trials of each kind.
const THROUGHPUT_TRIALS: u16 = 5;

/// Bytes/s of one resilient connection from host 0 to host 1, sending the
/// same 1 MiB buffer (no payload generation in the way) for `secs`.
async fn resilient_throughput(tb: &testbed::Testbed, secs: f64, port: u16) -> anyhow::Result<f64> {
    use testbed::Node;
    let open = move |host: usize, peer: usize| async move {
        let ep = Arc::new(Endpoint::bind(host_nics(host), port).await?);
        let rails = (0..2)
            .map(|r| Rail {
                nic: r,
                remote: std::net::SocketAddr::new(rail_addr(peer, r).into(), port),
            })
            .collect();
        let side = if host == 0 { Side::A } else { Side::B };
        let mut cfg = ConnConfig::new(77, side, rails);
        cfg.failback = Failback::Never;
        anyhow::Ok((ep.clone(), ResilientConnection::open(ep, cfg)?))
    };
    let rx = spawn_in(tb.ns(Node::Host(1)), move || async move {
        let (_ep, mut conn) = open(1, 0).await?;
        let mut total = 0u64;
        let mut first: Option<Instant> = None;
        let mut last = Instant::now();
        loop {
            match tokio::time::timeout(Duration::from_secs(2), conn.recv()).await {
                Ok(Ok(m)) => {
                    let now = Instant::now();
                    if first.is_none() {
                        first = Some(now);
                    } else {
                        total += m.len() as u64;
                    }
                    last = now;
                }
                Ok(Err(e)) => return Err(e.into()),
                Err(_) => break,
            }
        }
        let span = last
            .saturating_duration_since(first.unwrap_or(last))
            .as_secs_f64();
        anyhow::Ok(total as f64 / span.max(1e-9))
    })?;
    let tx = spawn_in(tb.ns(Node::Host(0)), move || async move {
        let (_ep, conn) = open(0, 1).await?;
        let buf = Bytes::from(vec![7u8; CHUNK]);
        let end = Instant::now() + Duration::from_secs_f64(secs);
        while Instant::now() < end {
            conn.send(buf.clone()).await?;
        }
        conn.flush(Duration::from_secs(10)).await?;
        anyhow::Ok(())
    })?;
    join(tx)?;
    join(rx)
}

/// Bytes/s of one plain TCP stream over the same rail, same buffer size.
async fn tcp_throughput(tb: &testbed::Testbed, secs: f64, port: u16) -> anyhow::Result<f64> {
    use testbed::Node;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = std::net::SocketAddr::new(rail_addr(1, 0).into(), port);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let rx = spawn_in(tb.ns(Node::Host(1)), move || async move {
        let l = tokio::net::TcpListener::bind(addr).await?;
        let _ = ready_tx.send(());
        let (mut s, _) = l.accept().await?;
        let mut buf = vec![0u8; CHUNK];
        let mut total = 0u64;
        let mut first: Option<Instant> = None;
        loop {
            let n = s.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            if first.is_none() {
                first = Some(Instant::now());
            } else {
                total += n as u64;
            }
        }
        let span = first.map(|f| f.elapsed().as_secs_f64()).unwrap_or(0.0);
        anyhow::Ok(total as f64 / span.max(1e-9))
    })?;
    ready_rx.recv_timeout(Duration::from_secs(5))?;
    let tx = spawn_in(tb.ns(Node::Host(0)), move || async move {
        let sock = tokio::net::TcpSocket::new_v4()?;
        sock.bind_device(Some(b"rail0"))?;
        let mut s = sock.connect(addr).await?;
        s.set_nodelay(true)?;
        let buf = vec![7u8; CHUNK];
        let end = Instant::now() + Duration::from_secs_f64(secs);
        while Instant::now() < end {
            s.write_all(&buf).await?;
        }
        s.shutdown().await?;
        anyhow::Ok(())
    })?;
    join(tx)?;
    join(rx)
}

/// `bench failover` settings.
#[derive(Debug, Clone)]
pub struct FailoverRun {
    pub flaps: usize,
    pub seed: u64,
    pub throughput_secs: f64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct FailoverReport {
    pub ok: bool,
    pub bench: &'static str,
    pub flaps: usize,
    pub resumed: usize,
    pub resume_p50_ms: f64,
    pub resume_p99_ms: f64,
    pub resume_max_ms: f64,
    pub resilient_mb_s: f64,
    pub tcp_mb_s: f64,
    pub throughput_ratio: f64,
    /// Lowest 100 ms throughput after a flap, as a share of the steady rate.
    pub dip_min_share: f64,
    /// How long throughput stayed under half the steady rate after the flap.
    pub dip_below_half_ms: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub goal: &'static str,
    pub goal_met: bool,
}

/// `spec`'s traffic between hosts 0 and 1 of `tb`, both ways, once every
/// connection has a path (at most 15 s).
async fn start_pair(
    tb: &testbed::Testbed,
    spec: TrafficSpec,
) -> anyhow::Result<(HostTraffic, HostTraffic)> {
    let (a, b) = HostTraffic::start_pair(tb, spec)?;
    anyhow::ensure!(
        wait_established(&a, &b, Duration::from_secs(15)).await,
        "connection did not come up"
    );
    Ok((a, b))
}

/// Runs the bench.
pub async fn failover(cfg: FailoverRun) -> anyhow::Result<FailoverReport> {
    use testbed::{Side as CableSide, Testbed, TestbedSpec};
    let mut rng = rand::rngs::StdRng::seed_from_u64(cfg.seed);
    eprintln!("[failover] building 2 hosts");
    let mut tb = Testbed::build(TestbedSpec {
        supervisors: 0,
        hosts: 2,
    })
    .await?;
    // 1. Steady throughput, resilient vs plain TCP on the same rail,
    // alternating so machine noise hits both alike; medians of the trials.
    let (mut rs, mut ts) = (Vec::new(), Vec::new());
    for t in 0..THROUGHPUT_TRIALS {
        rs.push(resilient_throughput(&tb, cfg.throughput_secs, PORT + 10 + t).await?);
        ts.push(tcp_throughput(&tb, cfg.throughput_secs, PORT + 30 + t).await?);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let resilient = median(&mut rs);
    let tcp = median(&mut ts);
    eprintln!(
        "[failover] steady (median of {THROUGHPUT_TRIALS}): resilient {:.0} MB/s, plain TCP {:.0} MB/s",
        resilient / 1e6,
        tcp / 1e6
    );
    // 2. Resume time over many flaps: small messages both ways.
    let spec = TrafficSpec {
        conns: 1,
        sizes: Sizes::Fixed(1024),
        rate_per_conn: Some(4 << 20),
        both_ways: true,
        failback: false,
        window_bytes: 16 << 20,
        stall_timeout: Duration::from_secs(30),
        seed: cfg.seed,
        agent: None,
    };
    let (a, b) = start_pair(&tb, spec).await?;
    let mut resume_us = Vec::new();
    // Every flap's resume time with where the cable was pulled, for the
    // slowest ones' report.
    let mut flaps = Vec::new();
    for i in 0..cfg.flaps {
        let before = a.conn_stats()[0].clone();
        let Some(rail) = before.rail else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        // Alternate the end and the side of the cable.
        let (host, side) = match i % 4 {
            0 => (0, CableSide::Host),
            1 => (1, CableSide::Fabric),
            2 => (1, CableSide::Host),
            _ => (0, CableSide::Fabric),
        };
        let n_a = a.rx[0].switches.lock().expect("switches").len();
        let n_b = b.rx[0].switches.lock().expect("switches").len();
        let t0 = Instant::now();
        tb.set_cable(host, rail, side, false).await?;
        // First delivery over a new path, either direction.
        let deadline = t0 + Duration::from_secs(5);
        let mut resumed = None;
        while Instant::now() < deadline {
            let first = [(&a, n_a), (&b, n_b)]
                .iter()
                .filter_map(|(h, n)| {
                    h.rx[0]
                        .switches
                        .lock()
                        .expect("switches")
                        .get(*n)
                        .map(|(t, _)| *t)
                })
                .min();
            if let Some(t) = first {
                resumed = Some(t.saturating_duration_since(t0));
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        match resumed {
            Some(d) => {
                if d > Duration::from_millis(20) {
                    eprintln!(
                        "[failover] flap {i} (h{host} rail{rail} {side:?} side): resumed after {:.1} ms",
                        d.as_secs_f64() * 1e3
                    );
                }
                resume_us.push(d.as_micros() as u64);
                flaps.push((d, i, host, side));
            }
            None => eprintln!("[failover] flap {i}: no delivery over a new path within 5 s"),
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(150..250))).await;
        tb.set_cable(host, rail, side, true).await?;
        tokio::time::sleep(Duration::from_millis(rng.gen_range(250..400))).await;
        if (i + 1) % 25 == 0 {
            let mut s = resume_us.clone();
            s.sort_unstable();
            eprintln!(
                "[failover] {} flaps: resume p50 {:.2} ms",
                i + 1,
                crate::bench::percentile_ms(&s, 50.0)
            );
        }
    }
    let drained = drain(&a, &b, Duration::from_secs(30)).await;
    let t = totals(&a, &b);
    a.join();
    b.join();
    // 3. The dip: saturate, flap the rail under the connection, look at
    // the receiver's 10 ms buckets.
    let (dip_min_share, dip_below_half_ms) = dip(&mut tb, cfg.seed).await?;
    resume_us.sort_unstable();
    let p = |q| crate::bench::percentile_ms(&resume_us, q);
    flaps.sort_by_key(|f| std::cmp::Reverse(f.0));
    eprintln!(
        "[failover] resume p90 {:.2} ms; slowest: {}",
        p(90.0),
        flaps
            .iter()
            .take(5)
            .map(|(d, i, h, s)| format!(
                "{:.1} ms (flap {i}, h{h} {s:?} side)",
                d.as_secs_f64() * 1e3
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let ratio = if tcp > 0.0 { resilient / tcp } else { 0.0 };
    let goal_met = p(99.0) <= 5.0 && ratio >= 0.9 && resume_us.len() >= 100;
    let ok = drained
        && t.lost == 0
        && t.duplicated == 0
        && t.reordered == 0
        && resume_us.len() == cfg.flaps;
    Ok(FailoverReport {
        ok,
        bench: "failover",
        flaps: cfg.flaps,
        resumed: resume_us.len(),
        resume_p50_ms: p(50.0),
        resume_p99_ms: p(99.0),
        resume_max_ms: resume_us.last().map_or(0.0, |x| *x as f64 / 1000.0),
        resilient_mb_s: resilient / 1e6,
        tcp_mb_s: tcp / 1e6,
        throughput_ratio: ratio,
        dip_min_share,
        dip_below_half_ms,
        lost: t.lost,
        duplicated: t.duplicated,
        reordered: t.reordered,
        goal: "resume <= 5 ms p99 over >= 100 flaps; steady throughput >= 90% of plain TCP",
        goal_met,
    })
}

async fn dip(tb: &mut testbed::Testbed, seed: u64) -> anyhow::Result<(f64, u64)> {
    use testbed::Side as CableSide;
    let spec = TrafficSpec {
        conns: 1,
        sizes: Sizes::Fixed(256 << 10),
        rate_per_conn: None,
        both_ways: false,
        failback: false,
        window_bytes: 64 << 20,
        stall_timeout: Duration::from_secs(30),
        seed,
        agent: None,
    };
    let (a, b) = start_pair(tb, spec).await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let rail = a.conn_stats()[0].rail.unwrap_or(0);
    let flap_at = b.started.elapsed();
    tb.set_cable(0, rail, CableSide::Host, false).await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    tb.set_cable(0, rail, CableSide::Host, true).await?;
    let _ = drain(&a, &b, Duration::from_secs(30)).await;
    let timeline = b.rx[0].timeline.lock().expect("timeline").clone();
    a.join();
    b.join();
    let flap_bucket = (flap_at.as_millis() / 10) as usize;
    // Steady: the second before the flap (after warm-up).
    let before =
        &timeline[flap_bucket.saturating_sub(100).max(20)..flap_bucket.min(timeline.len())];
    let steady = before.iter().sum::<u64>() as f64 / before.len().max(1) as f64;
    if steady <= 0.0 {
        return Ok((0.0, 0));
    }
    let after = &timeline[flap_bucket.min(timeline.len())..(flap_bucket + 100).min(timeline.len())];
    let windows: Vec<f64> = after
        .windows(10)
        .map(|w| w.iter().sum::<u64>() as f64 / 10.0 / steady)
        .collect();
    let min_share = windows.iter().copied().fold(f64::INFINITY, f64::min);
    let below_half = after.iter().filter(|b| (**b as f64) < steady / 2.0).count() as u64 * 10;
    Ok((
        if min_share.is_finite() {
            min_share
        } else {
            0.0
        },
        below_half,
    ))
}
