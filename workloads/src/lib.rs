//! The jobs railguard's chaos scenarios run under the supervisor, as real
//! processes the scenarios launch by binary name from the target
//! directory.
//!
//! # Layout
//! - [`ringtrain`]: the `ringtrain` training job (deterministic ring
//!   all-reduce over resilient connections, checkpoints, job contract);
//!   the `ringtrain` binary is its `main`.
//!
//! **Invariant:** a workload knows only the job contract (`rdma::contract`)
//! and its command line / environment, never the testbed or a scenario;
//! scenarios parse its stable stdout lines and exit codes.

pub mod ringtrain;
