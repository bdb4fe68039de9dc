//! The netns testbed (TESTBED.md) and everything a scenario needs to run a
//! railguard cluster in it: one namespace per node, a fabric namespace
//! with bridges, veth "cables", addresses, all made through netlink; fault
//! injectors for every row of TESTBED.md's fault table; a cleanup guard
//! that runs on drop (also on panic), a registry that Ctrl-C handlers can
//! flush, and a sweeper for leftovers of dead runs.
//!
//! Topology for `TestbedSpec { supervisors: S, hosts: N }`, prefix `rgXXXXX-`:
//! - `<p>fab`: bridges `mgmt`, `rail0`, `rail1`; fabric-side cable ends
//!   `s<i>m`, `h<i>m`, `h<i>r0`, `h<i>r1`.
//! - `<p>s<i>`: `mgmt0` = 10.200.0.(i+1)/16.
//! - `<p>h<i>`: `mgmt0` = 10.200.1.i/16, `rail0` = 10.201.0.(i+1)/16,
//!   `rail1` = 10.202.0.(i+1)/16 (each rail the other's backup).
//!
//! With [`TestbedOptions::leaf_splits`] a rail is two leaf bridges joined
//! by a shaped veth uplink ([`leaf`]); [`Testbed::topology`] describes
//! what was built for the supervisor's `--topology`.
//!
//! # Layout
//! - [`plan`]: what to build, node names and addresses (pure data).
//! - [`netns`]: namespaces made like `ip netns add`, netlink handles and
//!   commands inside them.
//! - [`bed`]: the [`Testbed`] handle: build, fault injectors, processes in
//!   nodes, teardown on drop.
//! - [`leaf`]: the leaf split of a rail and the topology file describing
//!   what was built.
//! - [`drops`]: tc drops on a device that leave its link up (gray links,
//!   partitions of the management network).
//! - [`stalls`]: a device that holds back what it sends for random
//!   moments, its link up (gray links that delay).
//! - [`cleanup`]: the Ctrl-C registry, owner files and the sweeper.
//! - [`cluster`]: [`cluster::SupervisorCluster`], real supervisor
//!   processes on loopback (SIGKILL, restart, joiners), and
//!   [`cluster::bin_path`], how every scenario finds the workspace's
//!   binaries.
//! - [`disk`]: [`disk::LoopDisk`], a small ext4 filesystem on a loop
//!   device that fills, turns read-only or freezes on demand (the disk
//!   faults of `scenario disk-faults`).
//! - [`agentsim`]: a client of the agent API that stands in for agents on
//!   loopback clusters.
//! - [`netcluster`]: supervisors and agents running inside the testbed.
//! - [`job_user`]: the `railguard-job` user agents run ranks as, made
//!   when missing.
//! - [`link_reader`]: the kernel's link messages in a namespace, read and
//!   stamped on a thread of their own (`bench detect`'s reference for when
//!   the kernel published a change).
//! - [`bulk`], [`burst`]: a TCP bulk flow and bursty UDP cross traffic
//!   between testbed hosts (the loads of the contention runs and of
//!   `bench clock-sync`).
//!
//! **Invariant:** nothing here knows a scenario or a checker; the
//! dependencies point from the chaos suite and the workloads' tests to
//! this crate, never back.

pub mod agentsim;
pub mod bed;
pub mod bulk;
pub mod burst;
pub mod cleanup;
pub mod cluster;
pub mod disk;
pub mod drops;
pub mod job_user;
pub mod jobsim;
pub mod leaf;
pub mod link_reader;
pub mod netcluster;
pub mod netns;
pub mod plan;
pub mod stalls;

pub use bed::{require_root, FlapPattern, LinkStatus, Side, Testbed};
pub use cleanup::{
    cleanup_all_live, register_dir, register_pid, sweep, unregister_dir, unregister_pid, OWNER_DIR,
};
pub use leaf::{LeafSplit, TestbedOptions, UplinkStats};
pub use netns::Netns;
pub use plan::{host_name, mgmt_addr, rail_addr, Node, TestbedSpec, NS_PREFIX};
