//! [`PlaybookModel`]: the sequential specification of one stored playbook
//! as the admin-history scenarios write and read it — applied with a
//! value of the writer's (its `description`), deleted, shown.

use super::model::Model;

/// Operations on one playbook name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PbOp {
    /// `playbook apply` of a valid playbook whose description carries the
    /// value (every write its own).
    Apply(u64),
    /// `playbook delete`: refused (not found) when there is none.
    Delete,
    /// `playbook show`: its value, or none.
    Read,
}

/// What an operation returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PbResult {
    Ok,
    /// Not found (a delete of a playbook that is not stored); no effect.
    Refused,
    Read(Option<u64>),
}

/// The stored playbook's value, if stored.
pub struct PlaybookModel;

impl Model for PlaybookModel {
    type State = Option<u64>;
    type Input = PbOp;
    type Output = PbResult;

    fn init(&self) -> Option<u64> {
        None
    }

    fn is_read(&self, input: &PbOp) -> bool {
        *input == PbOp::Read
    }

    fn is_refused(&self, out: &PbResult) -> bool {
        *out == PbResult::Refused
    }

    fn step(&self, s: &Option<u64>, input: &PbOp, out: Option<&PbResult>) -> Option<Option<u64>> {
        let ok = matches!(out, None | Some(PbResult::Ok));
        match input {
            PbOp::Read => match out {
                None => Some(*s),
                Some(PbResult::Read(v)) if v == s => Some(*s),
                _ => None,
            },
            PbOp::Apply(v) if ok => Some(Some(*v)),
            PbOp::Delete if s.is_none() => {
                matches!(out, None | Some(PbResult::Refused)).then_some(None)
            }
            PbOp::Delete if ok => Some(None),
            _ => None,
        }
    }
}

/// The text of a valid playbook named `name` carrying `value`, one notify
/// step. Its trigger, `link_contention` at the lowest priority, never
/// runs it: the admin-history clusters have no topology, so no link is
/// ever named, and the shipped `link-contention` playbook outranks it.
pub fn text(name: &str, value: u64) -> String {
    format!(
        "name = \"{name}\"\ndescription = \"v{value}\"\npriority = 1\n\n[trigger]\nincidents = [\"link_contention\"]\n\n[[steps]]\nid = \"note\"\naction = \"notify\"\nmessage = \"linearizability probe\"\n"
    )
}

/// The value [`text`] put in a stored playbook's source.
pub fn value_of(source: &str) -> Option<u64> {
    let line = source
        .lines()
        .find(|l| l.starts_with("description = \"v"))?;
    line.trim_start_matches("description = \"v")
        .trim_end_matches('"')
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linearizability::{check, Operation, Verdict};

    #[test]
    fn the_text_is_a_valid_playbook_and_carries_its_value() {
        let t = text("lin-pb0", 42);
        playbooks::parse("lin-pb0.toml", &t).expect("valid");
        assert_eq!(value_of(&t), Some(42));
    }

    #[test]
    fn apply_delete_read() {
        let good = [
            Operation::done(0, PbOp::Delete, 0, 5, PbResult::Refused),
            Operation::done(0, PbOp::Apply(1), 10, 20, PbResult::Ok),
            Operation::done(1, PbOp::Read, 30, 40, PbResult::Read(Some(1))),
            Operation::done(1, PbOp::Delete, 50, 60, PbResult::Ok),
            Operation::done(0, PbOp::Read, 70, 80, PbResult::Read(None)),
        ];
        assert_eq!(check(&PlaybookModel, &good, 100_000), Verdict::Linearizable);
        // A read of a deleted value, after the delete returned.
        let stale = [
            Operation::done(0, PbOp::Apply(1), 0, 10, PbResult::Ok),
            Operation::done(1, PbOp::Delete, 20, 30, PbResult::Ok),
            Operation::done(0, PbOp::Read, 40, 50, PbResult::Read(Some(1))),
        ];
        assert!(matches!(
            check(&PlaybookModel, &stale, 100_000),
            Verdict::NotLinearizable { .. }
        ));
        // A delete refused while a value is stored.
        let refused = [
            Operation::done(0, PbOp::Apply(1), 0, 10, PbResult::Ok),
            Operation::done(1, PbOp::Delete, 20, 30, PbResult::Refused),
        ];
        assert!(matches!(
            check(&PlaybookModel, &refused, 100_000),
            Verdict::NotLinearizable { .. }
        ));
    }
}
