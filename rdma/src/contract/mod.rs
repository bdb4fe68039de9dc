//! The job contract: how a training job (its ranks, their transports) talks
//! to the node agent over a Unix stream socket (default
//! [`DEFAULT_SOCKET`], overridden by `$RAILGUARD_AGENT_SOCKET`).
//!
//! **Wire format.** One JSON object per line (`\n`-terminated, at most
//! [`MAX_LINE`] bytes), each with a `"type"` tag. JSON numbers carry `u64`
//! ids exactly; clients in languages with 53-bit numbers must keep ids below
//! 2^53.
//!
//! Job → agent (each answered by exactly one `ok` or `error` line, in order):
//! - `hello {job, rank, pid}`: first message of every connection.
//! - `conn_up {job, rank, conn_id, nic, peer_host, peer_rank, rail}`: a
//!   connection exists (or its placement changed); `nic` is the NIC it uses
//!   now, `rail` its home rail. `conn_id` is unique within the connection to
//!   the agent.
//! - `conn_moved {conn_id, nic}`: the transport moved the connection.
//! - `conn_closed {conn_id}`.
//! - `order_done {order_id, ok, detail, step}`: the answer to an order
//!   (send `conn_moved` for every connection that moved first); `step`
//!   only in a successful checkpoint order's answer.
//! - `checkpointed {step}`: this rank's part of the checkpoint at `step` is
//!   durable (written and renamed into place). Send it for periodic
//!   checkpoints and ordered ones alike; the supervisor records a checkpoint
//!   as complete (a restart point) once every rank of the job sent it.
//!
//! Agent → job, at any time between replies: `order {order_id, kind}` with
//! `kind` one of `migrate {conn_ids, to_nic}` (`to_nic` null: any healthy
//! NIC), `pace {conn_id, bytes_per_s}` (null: unpaced), `checkpoint {step,
//! halt}` and `stop`. Every order must be answered with `order_done`. A
//! checkpoint order lets the ranks agree on the step (null: the next one
//! they can all reach); with `halt` the rank computes nothing after it and
//! waits to be stopped (a drain moves the job without losing a step). Its
//! `order_done` names the step in `step`; the detail is only for people.
//! Also `held_out {nics}`: the host's NICs an admin holds out of service
//! for connections (`railguard nic failover` until `nic failback`), the
//! whole set, after an accepted hello once the agent knows it and on every
//! change; not answered. A transport leaves those NICs and does not fail
//! back to them ([`crate::soft::Endpoint::follow_held`]).
//!
//! Example: `{"type":"conn_moved","conn_id":7,"nic":"rail1"}`.
//!
//! **Client.** [`ContractClient`] keeps the job's registration (hello and
//! every live connection) and survives agent restarts: it reconnects with
//! capped backoff and re-sends `hello` and the current `conn_up`s, so the
//! job never notices. Calls made while the agent is away are recorded and
//! answered [`Delivery::Deferred`]; orders are delivered once each on the
//! [`OrderStream`] even if the agent repeats them.
//!
//! **Layout.** `messages` (the vocabulary and its bounds), `error`
//! ([`ContractError`]), `wire` (bounded JSON lines), `client`
//! ([`ContractClient`]). The agent's side of the socket is in the node agent.

mod client;
mod error;
mod messages;
mod wire;

pub use client::{ClientOptions, ContractClient, Delivery, OrderStream};
pub use error::ContractError;
pub use messages::{
    check_name, socket_path, truncate, AgentMessage, ConnUp, Hello, JobMessage, Order, OrderAnswer,
    OrderKind, AGENT_MESSAGE_TYPES, DEFAULT_SOCKET, JOB_MESSAGE_TYPES, MAX_CONNS_PER_CLIENT,
    MAX_DETAIL_LEN, MAX_LINE, MAX_MIGRATE_CONNS, MAX_NAME_LEN, SOCKET_ENV,
};
pub use wire::{decode_agent, decode_job, encode, write_message, LineReader};
