//! The leaf split (TESTBED.md, "Contention"): a rail's fabric becomes
//! two leaf bridges joined by a veth "uplink" whose two ends are each held
//! to the uplink rate by our own HTB code (the `tc-htb` crate), so traffic
//! between the leaves queues there, one queue per direction.
//!
//! In the fabric namespace, for a split of rail `r`:
//! - bridge `rail<r>` is leaf 0 (hosts not in [`LeafSplit::right`]),
//! - bridge `rail<r>b` is leaf 1 (hosts in `right`),
//! - veth `up<r>a` (a port of `rail<r>`) ↔ `up<r>b` (a port of `rail<r>b`).
//!
//! Addresses do not change: the split is purely at the bridge level.
//! Each rail may be split (one [`LeafSplit`] per rail).
//!
//! This module also describes what was built as a
//! [`supervisor::topology::TopologyFile`], named the way
//! [`crate::plan::host_name`] names hosts.

use supervisor::topology::{AttachDef, LinkDef, SwitchDef, TopologyFile};

use crate::plan::host_name;

/// Splits `rail` into two leaves joined by a shaped uplink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafSplit {
    /// The rail (0 or 1) that is split; the other rail stays one bridge.
    pub rail: usize,
    /// Host indices on leaf 1; every other host is on leaf 0.
    pub right: Vec<usize>,
    /// Rate of each direction of the uplink, bits/s (HTB rate = ceil).
    pub uplink_bps: u64,
}

/// Optional parts of the topology, on top of [`crate::plan::TestbedSpec`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TestbedOptions {
    /// Split rails into two leaves with a shaped uplink each (at most one
    /// split per rail).
    pub leaf_splits: Vec<LeafSplit>,
}

/// Checks splits against a testbed of `hosts` hosts: each valid, at most
/// one per rail.
pub fn validate_splits(splits: &[LeafSplit], hosts: usize) -> anyhow::Result<()> {
    let mut rails = std::collections::BTreeSet::new();
    for s in splits {
        s.validate(hosts)?;
        anyhow::ensure!(rails.insert(s.rail), "rail {} is split twice", s.rail);
    }
    Ok(())
}

/// Transmit counters of the two uplink ends (each end's tx is one
/// direction's traffic through its HTB).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UplinkStats {
    /// Bytes sent by `up<r>a`: leaf 0 → leaf 1.
    pub leaf0_to_leaf1_bytes: u64,
    /// Bytes sent by `up<r>b`: leaf 1 → leaf 0.
    pub leaf1_to_leaf0_bytes: u64,
}

impl LeafSplit {
    /// Checks the split against a testbed of `hosts` hosts.
    pub fn validate(&self, hosts: usize) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.rail < 2,
            "leaf split of rail {}: the testbed has rails 0 and 1",
            self.rail
        );
        let mut seen = std::collections::BTreeSet::new();
        for &h in &self.right {
            anyhow::ensure!(
                h < hosts,
                "leaf split: host {h} on leaf 1 is out of range (the testbed has {hosts} hosts)"
            );
            anyhow::ensure!(seen.insert(h), "leaf split: host {h} listed twice");
        }
        tc_htb::validate(&[], self.uplink_bps)
            .map_err(|e| anyhow::anyhow!("leaf split: uplink rate: {e}"))?;
        Ok(())
    }

    /// Leaf (0 or 1) of `host`.
    pub fn leaf_of(&self, host: usize) -> usize {
        usize::from(self.right.contains(&host))
    }

    /// The fabric bridge of leaf `leaf`.
    pub fn bridge(&self, leaf: usize) -> String {
        if leaf == 0 {
            format!("rail{}", self.rail)
        } else {
            format!("rail{}b", self.rail)
        }
    }

    /// The uplink's two veth ends: (leaf 0's port, leaf 1's port).
    pub fn uplink_ends(&self) -> (String, String) {
        (format!("up{}a", self.rail), format!("up{}b", self.rail))
    }

    /// The uplink's name in the topology file.
    pub fn uplink_link_name(&self) -> String {
        format!("rail{}-uplink", self.rail)
    }

    /// The topology switch name of leaf `leaf`.
    pub fn switch_name(&self, leaf: usize) -> String {
        format!("rail{}-leaf{leaf}", self.rail)
    }
}

/// A rate in the form `playbooks::parse_rate` reads back exactly: the
/// largest of Tbit/Gbit/Mbit/kbit that divides it, else bits.
pub fn rate_string(bps: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1_000_000_000_000, "Tbit"),
        (1_000_000_000, "Gbit"),
        (1_000_000, "Mbit"),
        (1_000, "kbit"),
    ];
    for (mult, unit) in UNITS {
        if bps >= mult && bps.is_multiple_of(mult) {
            return format!("{}{unit}", bps / mult);
        }
    }
    format!("{bps}bit")
}

/// The topology of a testbed with `hosts` hosts and the given splits:
/// per rail one switch `rail<r>` (or, for a split rail, `rail<r>-leaf0`,
/// `rail<r>-leaf1` and the link `rail<r>-uplink` at the uplink rate), and
/// an attachment for every host NIC.
pub fn topology(hosts: usize, splits: &[LeafSplit]) -> TopologyFile {
    let mut file = TopologyFile::default();
    let split_of = |rail: usize| splits.iter().find(|s| s.rail == rail);
    for rail in 0..2 {
        match split_of(rail) {
            Some(s) => {
                for leaf in 0..2 {
                    file.switches.push(SwitchDef {
                        name: s.switch_name(leaf),
                    });
                }
                file.links.push(LinkDef {
                    name: s.uplink_link_name(),
                    a: s.switch_name(0),
                    b: s.switch_name(1),
                    rate: Some(rate_string(s.uplink_bps)),
                });
            }
            None => file.switches.push(SwitchDef {
                name: format!("rail{rail}"),
            }),
        }
    }
    for h in 0..hosts {
        for rail in 0..2 {
            let switch = match split_of(rail) {
                Some(s) => s.switch_name(s.leaf_of(h)),
                None => format!("rail{rail}"),
            };
            file.attach.push(AttachDef {
                host: host_name(h),
                nic: format!("rail{rail}"),
                switch,
                rate: None,
            });
        }
    }
    file
}

#[cfg(test)]
mod tests {
    use crate::leaf::*;
    use supervisor::topology::Topology;

    fn split() -> LeafSplit {
        LeafSplit {
            rail: 0,
            right: vec![2, 3],
            uplink_bps: 100_000_000,
        }
    }

    #[test]
    fn rates_read_back_exactly() {
        for bps in [
            100_000_000,
            400_000_000,
            1_500_000_000,
            10_000_000_000,
            8_000,
            123_456,
            2_000_000_000_000,
        ] {
            let s = rate_string(bps);
            assert_eq!(playbooks::parse_rate(&s), Ok(bps), "{s}");
        }
        assert_eq!(rate_string(400_000_000), "400Mbit");
        assert_eq!(rate_string(1_500_000_000), "1500Mbit");
    }

    #[test]
    fn the_split_topology_routes_across_the_uplink_only_between_leaves() {
        let file = topology(4, &[split()]);
        let text = toml::to_string(&file).unwrap();
        let t = Topology::parse(&text).unwrap();
        assert_eq!(t.file(), &file);
        let crosses = |a: &str, b: &str, nic: &str| {
            t.route(a, nic, b, nic)
                .unwrap()
                .iter()
                .any(|d| d.link == "rail0-uplink")
        };
        assert!(crosses("h0", "h2", "rail0"));
        assert!(crosses("h3", "h1", "rail0"));
        assert!(!crosses("h0", "h1", "rail0"));
        assert!(!crosses("h2", "h3", "rail0"));
        assert!(!crosses("h0", "h2", "rail1"), "rail1 is not split");
        assert_eq!(t.link("rail0-uplink").unwrap().rate_bps, Some(100_000_000));
        assert_eq!(t.switch_of("h2", "rail0"), Some("rail0-leaf1"));
        assert_eq!(t.switch_of("h1", "rail0"), Some("rail0-leaf0"));
        assert_eq!(t.switch_of("h2", "rail1"), Some("rail1"));
    }

    #[test]
    fn without_a_split_each_rail_is_one_switch() {
        let t = Topology::build(topology(3, &[])).unwrap();
        assert_eq!(t.route("h0", "rail0", "h2", "rail0").unwrap().len(), 2);
        assert_eq!(t.links().len(), 6, "one cable per host NIC, no uplink");
    }

    #[test]
    fn bad_splits_are_refused() {
        let mut s = split();
        assert!(s.validate(4).is_ok());
        s.right = vec![4];
        assert!(s
            .validate(4)
            .unwrap_err()
            .to_string()
            .contains("out of range"));
        s.right = vec![1, 1];
        assert!(s.validate(4).unwrap_err().to_string().contains("twice"));
        s.right = vec![1];
        s.rail = 2;
        assert!(s.validate(4).unwrap_err().to_string().contains("rail 2"));
        s.rail = 0;
        s.uplink_bps = 0;
        assert!(s.validate(4).is_err());
    }

    #[test]
    fn both_rails_may_be_split_each_once() {
        let mut other = split();
        other.rail = 1;
        assert!(validate_splits(&[split(), other.clone()], 4).is_ok());
        let t = Topology::build(topology(4, &[split(), other])).unwrap();
        assert!(t.link("rail0-uplink").is_some());
        assert!(t.link("rail1-uplink").is_some());
        assert_eq!(t.switch_of("h2", "rail1"), Some("rail1-leaf1"));
        let err = validate_splits(&[split(), split()], 4).unwrap_err();
        assert!(err.to_string().contains("split twice"), "{err}");
    }
}
