//! RDMA for railguard: the device/port/event model, two backends (`verbs`
//! over libibverbs, `soft` over NIC-bound sockets) and the resilient
//! multi-NIC connection a job uses as its transport.

pub mod contract;
pub mod damper;
pub mod model;
pub mod netdev;
pub mod resilient;
pub mod seq;
pub mod soft;
#[cfg(feature = "verbs")]
pub mod verbs;
