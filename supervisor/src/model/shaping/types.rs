//! Link contention and shaping types: the link incident's evidence, the
//! detector's command, and the HTB shape a NIC should carry.

use crate::topology::DirLink;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::Ipv4Addr;

/// Share of a link's rate the plan hands out when the step names none
/// (the rest keeps the queue empty).
pub const DEFAULT_HEADROOM: f64 = 0.95;

/// Share of the usable rate left to traffic that is not a job's (bulk
/// copies, anything unknown) when jobs cross the link; the jobs split the
/// rest fairly. Deliberately small: the training jobs are what the
/// cluster is for (MLTCP/CASSINI-style unfairness in their favour).
/// Without jobs crossing, the rest gets it all.
pub const OTHER_SHARE: f64 = 0.05;

/// An agent's refusals of one desired shape before the reconciler stops
/// asking (the shape stays desired and shown; an admin can clear it).
pub const MAX_SHAPE_FAILURES: u32 = 3;

/// Rate of the default (unmatched) class when the topology gives the NIC's
/// cable no rate.
pub const DEFAULT_NIC_RATE_BPS: u64 = 10_000_000_000;

/// Smallest class rate a plan hands out.
pub const MIN_CLASS_BPS: u64 = 1_000_000;

/// Most host NICs on one side of a link an incident records.
pub const MAX_SIDE_NICS: usize = 1024;

/// Most contended paths an incident names.
pub const MAX_INCIDENT_PATHS: usize = 64;

/// A host's NIC.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct HostNic {
    pub host: String,
    pub nic: String,
}

/// What a `link_contention` incident knows about its link (committed with
/// it: the topology itself is not replicated).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkContention {
    pub link: DirLink,
    pub rate_bps: Option<u64>,
    /// Host NICs on the `from` side: they send across.
    pub senders: Vec<HostNic>,
    /// Host NICs on the `to` side.
    pub receivers: Vec<HostNic>,
    /// The contended paths when it opened, `src/nic→dst/nic`.
    pub paths: Vec<String>,
    /// Their worst queueing delay p99 then (µs).
    pub queueing_p99_us: f64,
}

/// The leader's contention decisions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ContentionCommand {
    /// Open a `link_contention` incident (no-op while one is open for the
    /// same directed link). `host` anchors it (the worst path's sender).
    Open { host: String, info: LinkContention },
    /// Close it: the link has been quiet long enough.
    Close { incident: u64, why: String },
}

/// One flow match of a class (0 = any for ports; protocol 0 = no port).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FlowSpec {
    pub dst: Ipv4Addr,
    pub protocol: u8,
    pub dst_port: u16,
    pub src_port: u16,
}

/// One HTB class of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassSpec {
    pub minor: u16,
    /// For people and logs: `job NAME` or `other`.
    pub label: String,
    /// The job whose ranks' traffic the class carries (`None`: the class
    /// of everything else).
    pub job: Option<String>,
    pub rate_bps: u64,
    pub ceil_bps: u64,
    pub flows: Vec<FlowSpec>,
}

/// The desired shaping of one host NIC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NicShape {
    pub incident: u64,
    /// Unique per desired shape (bumped on every change).
    pub version: u64,
    /// The directed link it relieves (display).
    pub link: String,
    pub classes: Vec<ClassSpec>,
    pub default_rate_bps: u64,
    /// Per-connection pacing of each job's ranks on the host (bits/s).
    pub pace: BTreeMap<String, u64>,
    /// On-Ramp-style edge holding: the agent holds a job's connections to
    /// a peer while the one-way delay to it exceeds the path's baseline by
    /// more than this (µs); none = off.
    pub hold_queueing_us: Option<u32>,
    /// Refusals of this version so far.
    pub failures: u32,
}

/// A plan before it is versioned: host → (nic, shape).
pub type Plan = BTreeMap<String, (String, NicShape)>;
