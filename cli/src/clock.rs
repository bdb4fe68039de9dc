//! `railguard clock` and `railguard paths`: the leader's clock solution per
//! host, per-path one-way delays, and the contention detector's per-path
//! queueing.

use supervisor::api::{ClockView, PathsView, QueueingView};

use crate::output::{fmt_ms, num};

pub fn print_clock(v: &ClockView) {
    match (&v.solution, &v.reference) {
        (Some(s), Some(r)) => {
            println!(
                "reference: {r} (id {}); solution at {} ns on its clock, solved {:.1} s ago; \
                 {} edges used, {} rejected; chi2/dof {}",
                v.reference_id.unwrap_or_default(),
                s.at_ns,
                s.age_ms as f64 / 1e3,
                s.edges_used,
                s.edges_rejected,
                num(s.chi2_per_dof, 2)
            );
        }
        _ => println!("no clock solution yet (no fresh probe summaries from connected hosts)"),
    }
    if let Some(e) = &v.solve_error {
        println!("last solve failed: {e}");
    }
    if v.hosts.is_empty() {
        println!("no hosts registered");
        return;
    }
    println!(
        "{:>5}  {:<14} {:<9} {:>14} {:>10} {:>10} {:>9} {:>6}  SINCE",
        "ID", "HOST", "STATE", "OFFSET ns", "DRIFT ppb", "ERROR ns", "PROBE/s", "CPU%"
    );
    for h in &v.hosts {
        let live = h.live.as_ref();
        let held = live
            .and_then(|l| l.holdover_ms)
            .map(|ms| format!("  (held over {:.1} s)", ms as f64 / 1e3))
            .unwrap_or_default();
        // Pairs/s per peer now / configured, and the probe thread's CPU.
        let rate = h
            .probe
            .as_ref()
            .map(|p| format!("{}/{}", p.pairs_per_s, p.max_pairs_per_s))
            .unwrap_or_else(|| "-".into());
        println!(
            "{:>5}  {:<14} {:<9} {:>14} {:>10} {:>10} {:>9} {:>6}  {}{held}",
            h.id,
            h.host,
            format!("{:?}", h.state),
            num(live.map(|l| l.offset_ns), 1),
            num(live.map(|l| l.drift_ppb), 1),
            num(live.map(|l| l.error_bound_ns), 1),
            rate,
            num(h.probe.as_ref().and_then(|p| p.cpu_pct), 2),
            fmt_ms(h.state_changed_ms)
        );
    }
}

pub fn print_paths(v: &PathsView) {
    if v.paths.is_empty() {
        println!("no paths measured in the last {} s", v.window_s);
        return;
    }
    println!(
        "last {} s; min = min of per-second minima, p50 = median of per-second medians, \
         p99 = max of per-second p99s",
        v.window_s
    );
    println!(
        "{:<22} {:<22} {:>4} {:>9} {:>9} {:>9} {:>7} {:>8} {:>6}  CORR",
        "SRC", "DST", "RAIL", "MIN µs", "P50 µs", "P99 µs", "LOSS %", "SAMPLES", "AGE s"
    );
    for p in &v.paths {
        let corr = match p.correction {
            supervisor::api::Correction::Network => "network",
            supervisor::api::Correction::Pair => "pair",
            supervisor::api::Correction::Raw => "raw",
        };
        println!(
            "{:<22} {:<22} {:>4} {:>9} {:>9} {:>9} {:>7} {:>8} {:>6.1}  {corr}",
            format!("{}/{}", p.src, p.src_nic),
            format!("{}/{}", p.dst, p.dst_nic),
            p.rail,
            num(p.min_us, 1),
            num(p.p50_us, 1),
            num(p.p99_us, 1),
            num(p.loss_pct, 1),
            p.samples,
            p.age_ms as f64 / 1e3,
        );
    }
    if v.paths.len() < v.total {
        println!("({} of {} paths shown)", v.paths.len(), v.total);
    }
}

pub fn print_queueing(v: &QueueingView) {
    if !v.topology {
        println!("(no topology loaded: contended paths are not localised to a link)");
    }
    if v.paths.is_empty() {
        println!(
            "no such paths (contended: a second's median queueing ≥ {:.0} µs)",
            v.enter_us
        );
        return;
    }
    println!(
        "{:<24} {:<24} {:>11} {:>11} {:>11} {:>9}  CONTENDED FOR s",
        "SRC", "DST", "BASE µs", "QUEUE p50", "QUEUE p99", "AGE s"
    );
    for p in &v.paths {
        println!(
            "{:<24} {:<24} {:>11.1} {:>11.1} {:>11.1} {:>9.1}  {}",
            format!("{}/{}", p.path.src, p.path.src_nic),
            format!("{}/{}", p.path.dst, p.path.dst_nic),
            p.baseline_us,
            p.queueing_p50_us,
            p.queueing_p99_us,
            p.age_ms as f64 / 1e3,
            p.contended_ms
                .map_or("-".into(), |ms| format!("{:.1}", ms as f64 / 1e3)),
        );
    }
    if v.paths.len() < v.total {
        println!("({} of {} paths shown)", v.paths.len(), v.total);
    }
}
