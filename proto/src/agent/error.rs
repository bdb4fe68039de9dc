//! [`BorderError`]: a wire message that does not make a valid border value.

/// A wire message that does not make a valid border value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BorderError {
    /// An `AgentOrder` without a kind (or of a kind this side does not
    /// know: protobuf drops unknown oneof members).
    #[error("order {order_id} has no kind this agent knows")]
    NoOrderKind {
        /// The order's id.
        order_id: u64,
    },
    /// A `NicStateChange` whose state is unspecified or out of range.
    #[error("NIC {nic}: state {state} is not a NIC state")]
    BadNicState {
        /// The NIC the report is about.
        nic: String,
        /// The raw enum value received.
        state: i32,
    },
    /// An `AgentEvent` without a kind (or of a kind this side does not
    /// know).
    #[error("event {seq} has no kind this side knows")]
    NoEventKind {
        /// The event's sequence number.
        seq: u64,
    },
    /// A NIC report whose damping penalty is negative, NaN or infinite.
    #[error("NIC {nic}: damping penalty {penalty} is not a finite number >= 0")]
    BadPenalty {
        /// The NIC the report is about.
        nic: String,
        /// The penalty received.
        penalty: f64,
    },
    /// An `OrderResult` that failed (`ok` false) yet carries a checkpoint
    /// step.
    #[error("order {order_id} failed but names checkpoint step {step}")]
    StepOnFailure {
        /// The order's id.
        order_id: u64,
        /// The step it named.
        step: u64,
    },
    /// A `Reroute` order with a route that is not `IPv4 via IPv4 dev
    /// NAME`, or with more than [`super::MAX_REROUTES`] routes.
    #[error("order {order_id}: {why}")]
    BadReroute {
        /// The order's id.
        order_id: u64,
        /// What is wrong.
        why: String,
    },
}
