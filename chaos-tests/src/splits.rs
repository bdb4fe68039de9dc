//! The shapes of a split of the management network around the leader, as
//! cuts between testbed nodes (`(a, b)`: `a` no longer hears `b`), for
//! [`testbed::bed::Testbed::set_mgmt_cuts`].

use serde::Serialize;
use testbed::Node;

/// How the management network is split around the leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PartitionKind {
    Symmetric,
    Asymmetric,
    LeaderWithAgents,
}

impl PartitionKind {
    /// In the order the waves take them.
    pub const ALL: [PartitionKind; 3] = [
        PartitionKind::Symmetric,
        PartitionKind::Asymmetric,
        PartitionKind::LeaderWithAgents,
    ];

    /// The kind of wave `wave`.
    pub fn of_wave(wave: usize) -> PartitionKind {
        Self::ALL[wave % Self::ALL.len()]
    }

    /// The cuts `(a, b)` — `a` no longer hears `b` — of this split around
    /// supervisor `leader` (index) of `supervisors`, with `hosts` hosts;
    /// the last host is never cut (the clients' and the CLI's).
    pub fn cuts(self, leader: usize, supervisors: usize, hosts: usize) -> Vec<(Node, Node)> {
        let l = Node::Supervisor(leader);
        let others: Vec<Node> = (0..supervisors)
            .filter(|i| *i != leader)
            .map(Node::Supervisor)
            .collect();
        let both = |x: &[Node], y: &[Node]| {
            let mut v = Vec::new();
            for a in x {
                for b in y {
                    v.push((*a, *b));
                    v.push((*b, *a));
                }
            }
            v
        };
        match self {
            PartitionKind::Symmetric => both(&[l], &others),
            PartitionKind::Asymmetric => others.iter().map(|o| (*o, l)).collect(),
            PartitionKind::LeaderWithAgents => {
                // The hosts but the last, split in two halves.
                let cut_hosts = hosts.saturating_sub(1);
                let half = cut_hosts.div_ceil(2);
                let mut x = vec![l];
                x.extend((0..half).map(Node::Host));
                let mut y = others;
                y.extend((half..cut_hosts).map(Node::Host));
                both(&x, &y)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn hears(cuts: &[(Node, Node)], a: Node, b: Node) -> bool {
        !cuts.contains(&(a, b))
    }

    #[test]
    fn each_split_cuts_what_its_name_says_and_never_the_last_host() {
        let (s, h) = (Node::Supervisor, Node::Host);
        let sym = PartitionKind::Symmetric.cuts(1, 3, 4);
        for o in [s(0), s(2)] {
            assert!(!hears(&sym, s(1), o) && !hears(&sym, o, s(1)));
        }
        assert!(hears(&sym, s(0), s(2)) && hears(&sym, s(1), h(0)));
        let asym = PartitionKind::Asymmetric.cuts(1, 3, 4);
        for o in [s(0), s(2)] {
            assert!(!hears(&asym, o, s(1)), "the others do not hear the leader");
            assert!(hears(&asym, s(1), o), "the leader still hears them");
        }
        let with = PartitionKind::LeaderWithAgents.cuts(0, 3, 4);
        let side_x = [s(0), h(0), h(1)];
        let side_y = [s(1), s(2), h(2)];
        for a in side_x {
            for b in side_y {
                assert!(!hears(&with, a, b) && !hears(&with, b, a), "{a:?} {b:?}");
            }
        }
        assert!(hears(&with, s(0), h(0)) && hears(&with, s(1), s(2)));
        for kind in PartitionKind::ALL {
            let touched: BTreeSet<Node> = kind
                .cuts(2, 3, 4)
                .into_iter()
                .flat_map(|(a, b)| [a, b])
                .collect();
            assert!(!touched.contains(&h(3)), "{kind:?}");
        }
        assert_eq!(PartitionKind::of_wave(4), PartitionKind::Asymmetric);
    }
}
