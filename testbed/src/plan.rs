//! The testbed's plan: what to build ([`TestbedSpec`]), its nodes
//! ([`Node`]), their names and their addresses. Pure data and arithmetic,
//! shared by the builder, the leaf split and every scenario.

use std::net::Ipv4Addr;

/// Every testbed namespace starts with this.
pub const NS_PREFIX: &str = "rg";

/// What to build (optional parts: [`TestbedOptions`](crate::leaf::TestbedOptions)).
#[derive(Debug, Clone, Copy)]
pub struct TestbedSpec {
    pub supervisors: usize,
    pub hosts: usize,
}

/// The name host `i` registers under (`railguard-agent --host`), and its
/// name in the topology file.
pub fn host_name(i: usize) -> String {
    format!("h{i}")
}

/// A node of the testbed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Node {
    Supervisor(usize),
    Host(usize),
}

/// Addresses of the plan.
pub fn mgmt_addr(node: Node) -> Ipv4Addr {
    match node {
        Node::Supervisor(i) => Ipv4Addr::new(10, 200, 0, i as u8 + 1),
        Node::Host(i) => Ipv4Addr::new(10, 200, 1, i as u8),
    }
}

/// Address of host `i`'s `rail<r>`.
pub fn rail_addr(host: usize, rail: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 201 + rail as u8, 0, host as u8 + 1)
}
