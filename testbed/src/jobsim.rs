//! A job stand-in for agent tests: the rank side of the job contract,
//! answering the agent's orders as a cooperative job would.
//!
//! The agent's own tests (`nodeagent/tests`) compile this file from source
//! (`#[path]`): testbed depends on nodeagent, so nodeagent cannot take it as
//! a dev-dependency (cargo refuses the cycle). It must therefore use only
//! crates both have (rdma, tokio).

use std::path::Path;
use std::time::Duration;

use rdma::contract::{ClientOptions, ContractClient, ContractError, OrderKind, OrderStream};
use tokio::sync::mpsc;

/// Connects as rank 0 of `job` to the agent's contract socket `sock`
/// (reconnecting within 100 ms) and [`obey_paces`]: returns the client and
/// the paces ordered.
pub async fn pacing_rank(
    sock: &Path,
    job: &str,
) -> Result<(ContractClient, mpsc::UnboundedReceiver<(u64, Option<u64>)>), ContractError> {
    let opts = ClientOptions {
        backoff_max: Duration::from_millis(100),
        ..Default::default()
    };
    let (client, orders) = ContractClient::connect_rank(sock, job, 0, opts).await?;
    let paces = obey_paces(&client, orders);
    Ok((client, paces))
}

/// Answers every order of `orders` `ok` and forwards each `Pace` order's
/// (connection id, bytes/s; `None`: unpaced) to the returned channel, in
/// order. Runs until the agent closes the stream or an answer cannot be
/// sent.
pub fn obey_paces(
    job: &ContractClient,
    mut orders: OrderStream,
) -> mpsc::UnboundedReceiver<(u64, Option<u64>)> {
    let (pace_tx, paces) = mpsc::unbounded_channel();
    let job = job.clone();
    tokio::spawn(async move {
        while let Some(o) = orders.next().await {
            if let OrderKind::Pace {
                conn_id,
                bytes_per_s,
            } = o.kind
            {
                let _ = pace_tx.send((conn_id, bytes_per_s));
            }
            if job.order_done(o.order_id, true, "ok").await.is_err() {
                return; // the client is closed
            }
        }
    });
    paces
}
