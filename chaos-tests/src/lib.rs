//! railguard's chaos suite: scenarios, invariant checkers and benchmarks
//! run against real supervisor and agent processes, on loopback or in the
//! netns testbed (the `testbed` crate builds both kinds of cluster and
//! injects the faults; the `workloads` crate holds the `ringtrain` job),
//! driven by the `railguard-chaos` binary.
//!
//! # Layout
//! - [`linearizability`]: porcupine-style checker and the host model.
//! - [`admin_history`]: `leader-kill` and `cluster-crash` scenarios.
//! - [`bench`](mod@bench): the `raft-commit` benchmark; [`etcd`]: the etcd
//!   cluster and client it compares with (`--peer etcd`).
//! - [`detect`]: the `detect` benchmark (flap and host-loss detection times).
//! - [`demo`]: the README's first command.
//! - [`sim`]: `fuzz`, the deterministic simulation of the supervisor
//!   cluster (openraft and the model, seeded faults, named checkers).
//! - [`disk_faults`]: `disk-faults` (supervisors' disks that fill, turn
//!   read-only or stall, under admin writes; clock steps on hosts).
//! - [`nic_flap`]: the `nic-flap` scenario and its transition checker.
//! - [`qp`]: traffic over resilient connections between testbed hosts: the
//!   `qp-migrate` scenario and the `failover` bench.
//! - [`clock_sync`]: the `clock-sync` bench (estimated offsets against the
//!   injected truth, railguard vs an NTP-style estimator).
//! - [`probe_scenarios`]: `mgmt-partition` and `probe-blackhole`;
//!   [`gray_link`]: `gray-link` (a rail that loses packets, link up);
//!   [`partitions`]: `partitions` (the management network split around
//!   the leader under admin writes and playbook orders; [`splits`]: the
//!   shapes of those splits).
//! - [`playbook_scenarios`]: `bad-playbooks`; [`playbook_leader_kill`]:
//!   `playbook-leader-kill` (multi-step playbooks through leader crashes,
//!   checked against the agents' execution journals).
//! - [`training`]: `ringtrain` jobs under railguard (`train-*` scenarios,
//!   `bench goodput`); [`contention`]: the leaf-split contention scenario
//!   and bench.

pub mod admin_failover;
pub mod admin_history;
pub mod bench;
pub mod capture;
pub mod clock_sync;
pub mod contention;
pub mod demo;
pub mod detect;
pub mod disk_faults;
pub mod etcd;
pub mod gray_link;
pub mod linearizability;
pub mod nic_flap;
pub mod partitions;
pub mod pause_leader;
pub mod playbook_leader_kill;
pub mod playbook_scenarios;
pub mod probe_scenarios;
pub mod qp;
pub mod rail_cuts;
pub mod security;
pub mod segment_delays;
pub mod sim;
pub mod splits;
pub mod tcp_failover;
pub mod torch;
pub mod torch_baseline;
pub mod torch_goodput;
pub mod training;
