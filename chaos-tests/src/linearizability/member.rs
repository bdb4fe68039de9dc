//! [`MemberModel`]: the sequential specification of one spare supervisor's
//! place in the Raft membership as `cluster add-member`, `cluster
//! remove-member` and `cluster members` see it.
//!
//! What the model observes is whether the spare is a *voter*. An add is
//! two Raft changes (a learner, then its promotion, itself a joint
//! configuration and then the final one), so a read during an add may see
//! a learner: that is "not a voter" until the joint configuration that
//! counts it commits, the add's linearization point (a joint
//! configuration's voters are both sides'; `cluster members` answers from
//! the applied membership). A remove takes effect when its configuration
//! commits. A refused add (the
//! spare did not catch up in time) removes the learner it added, so it
//! changes nothing a voter read can see (nor does one refused for a
//! spare that already was a member: it stays as it was); an add whose
//! outcome is unknown
//! may leave a learner, again "not a voter".

use super::model::Model;

/// Operations on the spare's membership.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemberOp {
    /// `cluster add-member`: a voter once it returns (idempotent).
    Add,
    /// `cluster remove-member`: refused (not found) when it is not a
    /// member at all.
    Remove,
    /// `cluster members`: whether it is a voter.
    Read,
}

/// What an operation returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberResult {
    Ok,
    /// Nothing changed: an add whose learner did not catch up, or a
    /// remove of a non-member.
    Refused,
    /// Whether the spare is a voter.
    Read(bool),
}

/// Whether the spare is a voter.
pub struct MemberModel;

impl Model for MemberModel {
    type State = bool;
    type Input = MemberOp;
    type Output = MemberResult;

    fn init(&self) -> bool {
        false
    }

    fn is_read(&self, input: &MemberOp) -> bool {
        *input == MemberOp::Read
    }

    fn is_refused(&self, out: &MemberResult) -> bool {
        *out == MemberResult::Refused
    }

    fn step(&self, voter: &bool, input: &MemberOp, out: Option<&MemberResult>) -> Option<bool> {
        match (input, out) {
            (MemberOp::Read, None) => Some(*voter),
            (MemberOp::Read, Some(MemberResult::Read(v))) => (v == voter).then_some(*voter),
            (MemberOp::Add, None | Some(MemberResult::Ok)) => Some(true),
            // Refused: nothing changed (a new learner was taken back; a
            // member it already was stays as it was).
            (MemberOp::Add, Some(MemberResult::Refused)) => Some(*voter),
            (MemberOp::Remove, None | Some(MemberResult::Ok)) => Some(false),
            // Not found: not even a learner, so certainly not a voter.
            (MemberOp::Remove, Some(MemberResult::Refused)) => (!*voter).then_some(false),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linearizability::{check, Operation, Verdict};

    #[test]
    fn add_remove_read() {
        let good = [
            Operation::done(0, MemberOp::Remove, 0, 5, MemberResult::Refused),
            Operation::done(1, MemberOp::Read, 1, 4, MemberResult::Read(false)),
            Operation::done(0, MemberOp::Add, 10, 30, MemberResult::Ok),
            // Concurrent with the add: either answer.
            Operation::done(1, MemberOp::Read, 12, 14, MemberResult::Read(false)),
            Operation::done(2, MemberOp::Read, 20, 25, MemberResult::Read(true)),
            Operation::done(0, MemberOp::Add, 40, 45, MemberResult::Ok),
            Operation::done(1, MemberOp::Read, 50, 55, MemberResult::Read(true)),
            Operation::done(0, MemberOp::Remove, 60, 70, MemberResult::Ok),
            Operation::done(1, MemberOp::Read, 80, 85, MemberResult::Read(false)),
        ];
        assert_eq!(check(&MemberModel, &good, 100_000), Verdict::Linearizable);
    }

    #[test]
    fn a_stale_or_flickering_read_is_caught() {
        // A read that still sees the voter after its removal returned.
        let stale = [
            Operation::done(0, MemberOp::Add, 0, 10, MemberResult::Ok),
            Operation::done(0, MemberOp::Remove, 20, 30, MemberResult::Ok),
            Operation::done(1, MemberOp::Read, 40, 50, MemberResult::Read(true)),
        ];
        assert!(matches!(
            check(&MemberModel, &stale, 100_000),
            Verdict::NotLinearizable { .. }
        ));
        // An add whose outcome is unknown may take effect, but then it
        // stays: a voter seen and then gone with no remove is a violation
        // (a membership shown before it was committed, then lost).
        let flicker = [
            Operation {
                client: 0,
                input: MemberOp::Add,
                call: 0,
                ret: None,
                output: None,
            },
            Operation::done(1, MemberOp::Read, 10, 20, MemberResult::Read(true)),
            Operation::done(1, MemberOp::Read, 30, 40, MemberResult::Read(false)),
        ];
        assert!(matches!(
            check(&MemberModel, &flicker, 100_000),
            Verdict::NotLinearizable { .. }
        ));
        // A refused remove while the spare is a voter.
        let refused = [
            Operation::done(0, MemberOp::Add, 0, 10, MemberResult::Ok),
            Operation::done(0, MemberOp::Remove, 20, 30, MemberResult::Refused),
        ];
        assert!(matches!(
            check(&MemberModel, &refused, 100_000),
            Verdict::NotLinearizable { .. }
        ));
    }
}
