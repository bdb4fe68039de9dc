//! Packet drops on one device's egress, for faults that leave every link
//! up: a random share (a gray link) or everything from given addresses (a
//! partition, one way or both).
//!
//! This kernel has no netem and no tc actions (`gact`), so a drop is a
//! classification: an HTB root whose default class 1:1 passes everything,
//! and a class 1:2 whose only queue is a `pfifo` of length 0 — a packet
//! classified there is dropped. Filters pick the packets: a classic-BPF
//! program that reads the kernel's random number (`ld rand`) and matches
//! below the share, or `u32` matches on the IPv4 source address. Set up
//! with the `tc` program (iproute2) in the device's namespace; [`clear`]
//! removes it all.

use std::net::Ipv4Addr;

use anyhow::Context;

/// Runs `tc -n ns ARGS…`; its output, or an error with its complaint.
pub(crate) async fn tc(ns: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = tokio::process::Command::new("tc")
        .arg("-n")
        .arg(ns)
        .args(args)
        .output()
        .await
        .context("run tc")?;
    anyhow::ensure!(
        out.status.success(),
        "tc {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// What `tc qdisc show dev DEV` prints.
pub(crate) async fn show(ns: &str, dev: &str) -> anyhow::Result<String> {
    tc(ns, &["qdisc", "show", "dev", dev]).await
}

/// Removes whatever root qdisc `dev` has (none is fine).
pub async fn clear(ns: &str, dev: &str) {
    let _ = tc(ns, &["qdisc", "del", "dev", dev, "root"]).await;
}

/// The HTB root with its passing class 1:1 and its dropping class 1:2.
async fn drop_class(ns: &str, dev: &str) -> anyhow::Result<()> {
    tc(
        ns,
        &[
            "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1", "r2q",
            "100000",
        ],
    )
    .await?;
    for class in ["1:1", "1:2"] {
        tc(
            ns,
            &[
                "class", "add", "dev", dev, "parent", "1:", "classid", class, "htb", "rate",
                "100gbit",
            ],
        )
        .await?;
    }
    tc(
        ns,
        &[
            "qdisc", "add", "dev", dev, "parent", "1:2", "handle", "2:", "pfifo", "limit", "0",
        ],
    )
    .await?;
    Ok(())
}

/// Drops `pct` % (0–100] of what `dev` sends, each packet at random.
pub async fn random(ns: &str, dev: &str, pct: f64) -> anyhow::Result<()> {
    anyhow::ensure!(pct > 0.0 && pct <= 100.0, "loss {pct} %: want (0, 100]");
    drop_class(ns, dev).await?;
    // ld rand; jge #k, +1; ret #-1 (match: class 1:2); ret #0.
    let k = ((pct / 100.0) * 4_294_967_296.0).min(4_294_967_295.0) as u64;
    let prog = format!("4,32 0 0 4294963256,53 1 0 {k},6 0 0 4294967295,6 0 0 0");
    tc(
        ns,
        &[
            "filter", "add", "dev", dev, "parent", "1:", "protocol", "all", "prio", "1", "bpf",
            "bytecode", &prog, "flowid", "1:2",
        ],
    )
    .await?;
    Ok(())
}

/// Drops every IPv4 packet `dev` sends whose source is one of `from`.
pub async fn from_sources(ns: &str, dev: &str, from: &[Ipv4Addr]) -> anyhow::Result<()> {
    drop_class(ns, dev).await?;
    for a in from {
        let src = format!("{a}/32");
        tc(
            ns,
            &[
                "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
                "match", "ip", "src", &src, "flowid", "1:2",
            ],
        )
        .await?;
    }
    Ok(())
}
