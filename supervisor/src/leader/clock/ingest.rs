//! Ingest: validating the agents' per-second probe summaries against the
//! model ([`check_summary`]: a refused summary stores nothing), storing
//! what they carry within the store's bounds, and pruning what is too old
//! or whose hosts are gone.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use proto::v1::ProbeSummary;

use crate::api::{ApiError, ErrorKind, ProbeLoad};
use crate::leader::clock::records::{
    short, ClockReport, Ingested, NtpReport, PathFrom, PathSecond, ShapedTrack, Store, CLOCK_KEEP,
    MAX_CLOCKS_PER_HOST, MAX_PATHS_PER_HOST, MAX_SUMMARY_CLOCKS, MAX_SUMMARY_PATHS,
    MAX_SUMMARY_SHAPED, PATH_SECONDS, PATH_WINDOW, SHAPED_BUSY_SHARE,
};
use crate::model::ClusterState;

/// The span a probe summary covers (agents summarise once a second).
const SUMMARY_WINDOW: Duration = Duration::from_secs(1);

/// Why a probe summary was refused. Nothing was stored.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SummaryError {
    /// The reporting host is not registered.
    #[error("host {0:?} is not registered; register first")]
    UnknownHost(String),
    /// Too many entries.
    #[error("a probe summary carries at most {max} {what}; this one has {got}")]
    TooLarge {
        what: &'static str,
        got: usize,
        max: usize,
    },
    /// A number or relation that cannot be right.
    #[error("{0}")]
    Malformed(String),
}

impl From<SummaryError> for ApiError {
    fn from(e: SummaryError) -> Self {
        let kind = match e {
            SummaryError::UnknownHost(_) => ErrorKind::NotFound,
            SummaryError::TooLarge { .. } | SummaryError::Malformed(_) => {
                ErrorKind::InvalidArgument
            }
        };
        ApiError::new(kind, e.to_string())
    }
}

/// Checks a summary against the model without storing anything.
pub(super) fn check_summary(st: &ClusterState, s: &ProbeSummary) -> Result<(), SummaryError> {
    if !st.hosts.contains_key(&s.host) {
        return Err(SummaryError::UnknownHost(short(&s.host)));
    }
    if s.clocks.len() > MAX_SUMMARY_CLOCKS {
        return Err(SummaryError::TooLarge {
            what: "peer clocks",
            got: s.clocks.len(),
            max: MAX_SUMMARY_CLOCKS,
        });
    }
    if s.paths.len() > MAX_SUMMARY_PATHS {
        return Err(SummaryError::TooLarge {
            what: "path statistics",
            got: s.paths.len(),
            max: MAX_SUMMARY_PATHS,
        });
    }
    for c in &s.clocks {
        let bad = |what: &str| {
            SummaryError::Malformed(format!(
                "clock of host {:?} against peer {:?} on rail {}: {what}",
                short(&s.host),
                short(&c.peer),
                c.rail
            ))
        };
        if c.peer == s.host {
            return Err(bad("a host cannot report a clock against itself"));
        }
        let numbers = [
            c.offset_ns,
            c.drift_ppb,
            c.error_bound_ns,
            c.drift_error_ppb,
        ];
        if numbers.iter().any(|x| !x.is_finite()) {
            return Err(bad("offset, drift and error bounds must be finite numbers"));
        }
        if c.error_bound_ns < 0.0 || c.drift_error_ppb < 0.0 {
            return Err(bad("error bounds must be ≥ 0"));
        }
        if c.drift_ppb.abs() >= 1e8 {
            return Err(bad("drift beyond ±10 %"));
        }
        // The NTP-style round trip may be negative: it pairs two one-way
        // probes up to tens of ms apart, so the clocks' relative drift
        // (up to hundreds of ppm) adds µs to it, and on a fabric with
        // µs-scale delays that can outweigh the delays themselves.
        if c.has_ntp && !c.ntp_offset_ns.is_finite() {
            return Err(bad("the NTP offset must be a finite number"));
        }
    }
    for p in &s.paths {
        let bad = |what: &str| {
            SummaryError::Malformed(format!(
                "path {:?}/{:?} -> {:?}/{:?} on rail {}: {what}",
                short(&p.peer),
                short(&p.peer_nic),
                short(&s.host),
                short(&p.nic),
                p.rail
            ))
        };
        if p.peer == s.host {
            return Err(bad("a host cannot report a path from itself"));
        }
        if !p.line_offset_ns.is_finite() {
            return Err(bad("the line offset must be a finite number"));
        }
        if p.delays > 0 && !(p.min_ns <= p.p50_ns && p.p50_ns <= p.p99_ns) {
            return Err(bad("delay quantiles must satisfy min ≤ p50 ≤ p99"));
        }
    }
    Ok(())
}

/// Stores one summary received at `now`, already checked by
/// [`check_summary`]; entries naming unknown peers, rails or NICs are
/// skipped (logged at debug).
pub(super) fn store_summary(
    store: &mut Store,
    st: &ClusterState,
    s: &ProbeSummary,
    now: Instant,
) -> Ingested {
    let reporter = &st.hosts[&s.host];
    let rails: BTreeSet<u32> = reporter.nics.values().filter_map(|n| n.rail).collect();
    let mut out = Ingested::default();
    // Older agents leave these zero: nothing to show then; nonsense
    // (a rate above the configured one, a budget that is not a
    // percentage) is not shown either.
    let load_ok = s.pairs_per_s <= s.max_pairs_per_s
        && s.probe_cpu_budget_pct.is_finite()
        && (0.0..=100.0).contains(&s.probe_cpu_budget_pct);
    if s.max_pairs_per_s > 0 && !load_ok {
        tracing::debug!(host = %s.host, pairs_per_s = s.pairs_per_s, max_pairs_per_s = s.max_pairs_per_s, budget_pct = s.probe_cpu_budget_pct, "probe load report ignored");
    }
    if s.max_pairs_per_s > 0 && load_ok {
        store.probe_load.insert(
            s.host.clone(),
            (
                ProbeLoad {
                    pairs_per_s: s.pairs_per_s,
                    max_pairs_per_s: s.max_pairs_per_s,
                    cpu_pct: s.probe_cpu_pct.filter(|c| c.is_finite() && *c >= 0.0),
                    cpu_budget_pct: s.probe_cpu_budget_pct,
                    age_ms: 0,
                },
                now,
            ),
        );
    }
    for c in &s.clocks {
        if !st.hosts.contains_key(&c.peer) {
            tracing::debug!(host = %s.host, peer = %short(&c.peer), "clock against an unknown peer ignored");
            out.ignored += 1;
            continue;
        }
        if !rails.contains(&c.rail) {
            tracing::debug!(host = %s.host, rail = c.rail, "clock on a rail the host has no NIC on ignored");
            out.ignored += 1;
            continue;
        }
        let table = store.clocks.entry(s.host.clone()).or_default();
        let key = (c.peer.clone(), c.rail);
        if !table.contains_key(&key) && table.len() >= MAX_CLOCKS_PER_HOST {
            let oldest = table
                .iter()
                .min_by_key(|(_, r)| r.arrived)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                table.remove(&k);
            }
        }
        table.insert(
            key,
            ClockReport {
                at_ns: c.at_ns,
                offset_ns: c.offset_ns,
                drift_ppb: c.drift_ppb,
                error_bound_ns: c.error_bound_ns,
                drift_error_ppb: c.drift_error_ppb,
                samples: c.samples,
                ntp: c.has_ntp.then_some(NtpReport {
                    at_ns: c.ntp_at_ns,
                    offset_ns: c.ntp_offset_ns,
                    rtt_ns: c.ntp_rtt_ns,
                }),
                arrived: now,
            },
        );
        out.clocks += 1;
    }
    for sh in s.shaped.iter().take(MAX_SUMMARY_SHAPED) {
        if !reporter.nics.contains_key(&sh.nic) {
            out.ignored += 1;
            continue;
        }
        let key = (s.host.clone(), sh.nic.clone());
        let t = store.shaped.entry(key).or_insert(ShapedTrack {
            at: now,
            bytes: sh.shaped_bytes,
            busy_at: None,
        });
        let secs = now.saturating_duration_since(t.at).as_secs_f64();
        if sh.shaped_bytes >= t.bytes && secs > 0.0 {
            let bps = (sh.shaped_bytes - t.bytes) as f64 * 8.0 / secs;
            if bps >= SHAPED_BUSY_SHARE * sh.limit_bps as f64 {
                t.busy_at = Some(now);
            }
        }
        t.at = now;
        t.bytes = sh.shaped_bytes;
    }
    for p in &s.paths {
        let Some(peer) = st.hosts.get(&p.peer) else {
            tracing::debug!(host = %s.host, peer = %short(&p.peer), "path from an unknown peer ignored");
            out.ignored += 1;
            continue;
        };
        if p.received > 0 {
            // The probes arrived some time in the second the summary
            // covers: date the evidence by the window's start, so a host
            // lost just before a summary is not kept alive for another
            // second (heartbeats carry the exact age).
            store.heard(
                p.peer.clone(),
                now.checked_sub(SUMMARY_WINDOW).unwrap_or(now),
            );
        }
        if !reporter.nics.contains_key(&p.nic) || !peer.nics.contains_key(&p.peer_nic) {
            tracing::debug!(host = %s.host, nic = %short(&p.nic), peer = %p.peer, peer_nic = %short(&p.peer_nic), "path naming an unknown NIC ignored");
            out.ignored += 1;
            continue;
        }
        let key = PathFrom {
            src: p.peer.clone(),
            src_nic: p.peer_nic.clone(),
            dst_nic: p.nic.clone(),
            rail: p.rail,
        };
        let table = store.paths.entry(s.host.clone()).or_default();
        if !table.contains_key(&key) && table.len() >= MAX_PATHS_PER_HOST {
            let stalest = table
                .iter()
                .min_by_key(|(_, r)| r.back().map(|x| x.arrived))
                .map(|(k, _)| k.clone());
            if let Some(k) = stalest {
                table.remove(&k);
            }
        }
        let ring = table.entry(key).or_default();
        ring.push_back(PathSecond {
            arrived: now,
            at_ns: if p.corrected { p.line_at_ns } else { s.sent_ns },
            expected: p.expected,
            received: p.received,
            delays: p.delays,
            min_ns: p.min_ns,
            p50_ns: p.p50_ns,
            p99_ns: p.p99_ns,
            line_offset_ns: p.corrected.then_some(p.line_offset_ns),
        });
        while ring.len() > PATH_SECONDS {
            ring.pop_front();
        }
        out.paths += 1;
    }
    out
}

/// Drops what is too old to matter or whose hosts are gone.
pub(super) fn prune(store: &mut Store, st: &ClusterState, now: Instant) {
    let old = |t: Instant, keep: Duration| now.saturating_duration_since(t) > keep;
    store.clocks.retain(|h, t| {
        t.retain(|(peer, _), r| !old(r.arrived, CLOCK_KEEP) && st.hosts.contains_key(peer));
        !t.is_empty() && st.hosts.contains_key(h)
    });
    store.paths.retain(|h, t| {
        t.retain(|k, ring| {
            while ring.front().is_some_and(|s| old(s.arrived, PATH_WINDOW)) {
                ring.pop_front();
            }
            !ring.is_empty() && st.hosts.contains_key(&k.src)
        });
        !t.is_empty() && st.hosts.contains_key(h)
    });
    store.evidence.retain(|h, _| st.hosts.contains_key(h));
    store
        .shaped
        .retain(|(h, _), t| st.hosts.contains_key(h) && !old(t.at, PATH_WINDOW));
    store
        .probe_load
        .retain(|h, (_, at)| st.hosts.contains_key(h) && !old(*at, CLOCK_KEEP));
}
