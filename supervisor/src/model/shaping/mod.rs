//! Link contention and reshaping in the replicated model (DESIGN.md flow 4).
//!
//! The leader's detector ([`crate::contention`]) commits a
//! `link_contention` incident naming a directed link, the host NICs on
//! each side of it (from the topology, so every replica decides the same
//! without reading the file) and the link's rate. A playbook's
//! `reshape_rate` step then computes a **plan** in apply: for every host
//! NIC sending across the link, HTB classes with filters for each job's
//! flows that cross it and one class for everything else crossing it:
//! the jobs split the usable rate fairly after [`OTHER_SHARE`] of it is
//! set aside for the rest (split between the sending hosts), and every
//! class's ceiling is its rate, so the sum never exceeds the usable rate
//! and the link's queue stays empty.
//! The plan is the **desired** shaping (`ClusterState::shapes`); the
//! reconciler orders each agent to install it (`ShapeNic`) and records
//! what each confirmed (`applied_shapes`). When the incident closes, its
//! desired shapes go and the reconciler orders `ClearShape` wherever
//! something was applied: nothing stays behind on a NIC.
//!
//! Idempotent by construction: wanted actions are the difference between
//! desired and applied versions, and an open intent for the same action
//! is never doubled. A shape an agent refuses is retried at most
//! [`MAX_SHAPE_FAILURES`] times.

pub(crate) mod plan;
pub(crate) mod types;

pub(crate) use plan::apply;
pub use plan::{plan, shape_order_obsolete, validate, wanted_shape_actions};
pub use types::{
    ClassSpec, ContentionCommand, FlowSpec, HostNic, LinkContention, NicShape, Plan,
    DEFAULT_HEADROOM, DEFAULT_NIC_RATE_BPS, MAX_INCIDENT_PATHS, MAX_SHAPE_FAILURES, MAX_SIDE_NICS,
    MIN_CLASS_BPS, OTHER_SHARE,
};
