//! railguard's chaos suite: real supervisor processes (and, as later issues
//! land, real network namespaces), fault injection, invariant checkers and
//! benchmarks, driven by the `railguard-chaos` binary.
//!
//! # Layout
//! - [`cluster`]: supervisor processes on loopback, SIGKILL and restart.
//! - [`agentsim`]: a client of the agent API (stands in for the agent).
//! - [`linearizability`]: porcupine-style checker and the host model.
//! - [`admin_history`]: `leader-kill` and `cluster-crash` scenarios.
//! - [`bench`]: the `raft-commit` benchmark.
//! - [`detect`]: the `detect` benchmark (flap and host-loss detection times).
//! - [`demo`]: the README's first command.
//! - [`testbed`]: network namespaces, cables, fault injectors, cleanup.
//! - [`netcluster`]: supervisors and agents running inside the testbed.
//! - [`bulk`], [`burst`]: a TCP bulk flow and bursty UDP cross traffic
//!   between testbed hosts (the loads of the contention runs and of
//!   `bench clock-sync`).
//! - [`nic_flap`]: the `nic-flap` scenario and its transition checker.
//! - [`qp`]: traffic over resilient connections between testbed hosts: the
//!   `qp-migrate` scenario and the `failover` bench.
//! - [`clock_sync`]: the `clock-sync` bench (estimated offsets against the
//!   injected truth, railguard vs an NTP-style estimator).
//! - [`probe_scenarios`]: `mgmt-partition` and `probe-blackhole`.
//! - [`playbook_scenarios`]: `bad-playbooks`; [`playbook_leader_kill`]:
//!   `playbook-leader-kill` (multi-step playbooks through leader crashes,
//!   checked against the agents' execution journals).
//! - [`ringtrain`]: the `ringtrain` training job (deterministic ring
//!   all-reduce over resilient connections, checkpoints, job contract).

pub mod admin_history;
pub mod agentsim;
pub mod bench;
pub mod bulk;
pub mod burst;
pub mod clock_sync;
pub mod cluster;
pub mod contention;
pub mod demo;
pub mod detect;
pub mod linearizability;
pub mod netcluster;
pub mod nic_flap;
pub mod playbook_leader_kill;
pub mod playbook_scenarios;
pub mod probe_scenarios;
pub mod qp;
pub mod ringtrain;
pub mod testbed;
pub mod training;
