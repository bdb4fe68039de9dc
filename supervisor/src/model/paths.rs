//! Connectivity between hosts: which pairs share a working data rail.
//!
//! Two hosts' ranks can talk only over a rail both of them have a working
//! NIC on: host A with rail0 down and host B with rail1 down each still
//! have a local backup, yet no connection between A and B can be made. The
//! supervisor derives this from the committed NIC states (which include the
//! probe mesh's verdicts: a NIC silent to its probe peers is marked Down),
//! so every replica agrees on it.
//!
//! - A rail **works** for a host when it has a NIC on it that is not known
//!   unusable (not Down or Flapping; a NIC not yet reported counts, as for
//!   [`Host::cut_off`]).
//! - A **path is cut** between two hosts when both have data NICs, neither
//!   is cut off (that is its own incident) and no rail works for both. The
//!   pair gets a `no_common_rail` incident while they share a job, and
//!   placement never puts them in one job.
//! - The path is **restored** when both have an Up NIC on the same rail
//!   (a NIC still settling or damped does not end the incident, so a rail
//!   that flaps does not open one incident per flap).

use std::collections::BTreeSet;

use crate::model::hosts::{Host, NicState};

/// The rails on which `h` has a NIC that is not known unusable.
pub fn working_rails(h: &Host) -> BTreeSet<u32> {
    h.nics
        .values()
        .filter(|n| !matches!(n.state, NicState::Down | NicState::Flapping))
        .filter_map(|n| n.rail)
        .collect()
}

/// The rails on which `h` has an Up NIC.
fn up_rails(h: &Host) -> BTreeSet<u32> {
    h.nics
        .values()
        .filter(|n| n.state == NicState::Up)
        .filter_map(|n| n.rail)
        .collect()
}

/// The working rails by which `h`'s paths are judged: `None` when they are
/// not (no data NIC, or cut off: that is its own incident).
pub fn judged_rails(h: &Host) -> Option<BTreeSet<u32>> {
    let has_data = h.nics.values().any(|n| n.rail.is_some());
    (has_data && !h.cut_off()).then(|| working_rails(h))
}

/// Whether two hosts' [`judged_rails`] say their path is cut.
pub fn rails_cut(a: &Option<BTreeSet<u32>>, b: &Option<BTreeSet<u32>>) -> bool {
    matches!((a, b), (Some(a), Some(b)) if a.is_disjoint(b))
}

/// Whether `a` and `b` have data NICs, neither is cut off, and no rail
/// works for both.
pub fn path_cut(a: &Host, b: &Host) -> bool {
    rails_cut(&judged_rails(a), &judged_rails(b))
}

/// Whether `a` and `b` both have an Up NIC on one rail.
pub fn path_restored(a: &Host, b: &Host) -> bool {
    !up_rails(a).is_disjoint(&up_rails(b))
}

/// The rails on which `a` and `b` both have an Up NIC.
pub fn shared_up_rails(a: &Host, b: &Host) -> Vec<u32> {
    up_rails(a).intersection(&up_rails(b)).copied().collect()
}

/// Whether `a` and `b` now share an Up rail that is not in `before`: a
/// rail that came back since then, not one that was there all along.
pub fn path_gained(a: &Host, b: &Host, before: &[u32]) -> bool {
    shared_up_rails(a, b).iter().any(|r| !before.contains(r))
}

/// A host's data NICs and their states: "rail0 Down, rail1 Up".
pub fn rail_states(h: &Host) -> String {
    let nics: Vec<String> = h
        .nics
        .values()
        .filter(|n| n.rail.is_some())
        .map(|n| format!("{} {:?}", n.name, n.state))
        .collect();
    nics.join(", ")
}

/// A pair's rails for an incident's detail: "h1 rail0 Down, rail1 Up".
pub fn describe(h: &Host) -> String {
    format!("{} {}", h.name, rail_states(h))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::command::Proposal;
    use crate::model::state::ClusterState;
    use crate::model::testkit::register_two_rails_for_test;
    use openraft::{CommittedLeaderId, LogId};

    /// Host `name` with `rail0` and `rail1` in the given states.
    fn host(name: &str, states: &[(u32, NicState)]) -> Host {
        let mut st = ClusterState::default();
        let p = Proposal {
            at_ms: 1,
            cmds: vec![register_two_rails_for_test(0, name)],
        };
        st.apply_proposal(&LogId::new(CommittedLeaderId::new(1, 1), 1), &p);
        let mut h = st.hosts.remove(name).expect("registered");
        h.nics
            .retain(|_, n| states.iter().any(|(r, _)| n.rail == Some(*r)));
        for (rail, state) in states {
            h.nics
                .get_mut(&format!("rail{rail}"))
                .expect("registered")
                .state = *state;
        }
        h
    }

    #[test]
    fn neighbours_that_lost_different_rails_have_no_common_rail() {
        use NicState::*;
        let a = host("h1", &[(0, Down), (1, Up)]);
        let b = host("h2", &[(0, Up), (1, Down)]);
        let c = host("h3", &[(0, Up), (1, Up)]);
        assert!(path_cut(&a, &b) && path_cut(&b, &a));
        assert!(!path_cut(&a, &c) && !path_cut(&b, &c));
        // A Flapping NIC is as unusable as a Down one.
        let b2 = host("h2", &[(0, Up), (1, Flapping)]);
        assert!(path_cut(&a, &b2));
        // A NIC not yet reported, or back and settling, may work.
        let b3 = host("h2", &[(0, Up), (1, Unknown)]);
        let b4 = host("h2", &[(0, Up), (1, Recovering)]);
        assert!(!path_cut(&a, &b3) && !path_cut(&a, &b4));
        // ... but only Up on both sides restores the path.
        assert!(!path_restored(&a, &b4));
        let b5 = host("h2", &[(0, Up), (1, Up)]);
        assert!(path_restored(&a, &b5));
        // A cut-off host has its own incident; a host without data NICs
        // cannot be judged.
        let cut = host("h4", &[(0, Down), (1, Down)]);
        let bare = host("h5", &[]);
        assert!(!path_cut(&a, &cut) && !path_cut(&a, &bare));
        assert_eq!(describe(&a), "h1 rail0 Down, rail1 Up");
    }
}
