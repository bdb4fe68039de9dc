//! `railguard nic …` and `railguard qp …`: NICs, failover and failback
//! orders (waiting for their intent), and jobs' connections.

use std::time::{Duration, Instant};

use anyhow::bail;
use clap::{Subcommand, ValueEnum};
use supervisor::api::{AdminReply, AdminRequest, ApiError, ErrorKind, NicView, QpView};
use supervisor::client::AdminClient;
use supervisor::model::{AdminOp, IntentStatus, Nic, NicState, Outcome};

use crate::events::intent_line;
use crate::output::{fmt_ms, parse_duration, print_json, table};

/// `railguard nic …`.
#[derive(Subcommand, Debug)]
pub enum NicCmd {
    /// Every NIC with its state, flap count, damping penalty and last change.
    List {
        /// Only NICs in this state.
        #[arg(long, value_enum)]
        state: Option<NicStateArg>,
    },
    /// Move every connection of HOST off NIC (e.g. before maintenance).
    ///
    /// Commits a Failover intent, prints its id and waits for the outcome unless --no-wait.
    /// The NIC stays out of service for connections (SERVICE `held by` in
    /// `nic list`) until `nic failback`: automatic failback leaves it alone.
    Failover {
        /// The host whose NIC is failed over.
        host: String,
        /// The NIC to move every connection off.
        nic: String,
        /// Where to move (default: the NIC's configured backup).
        #[arg(long)]
        to: Option<String>,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Move the connections whose home is NIC on HOST back to it.
    ///
    /// Commits a Failback intent, prints its id and waits for the outcome unless --no-wait.
    /// Puts a NIC held out by `nic failover` back in service.
    Failback {
        /// The host.
        host: String,
        /// The NIC to move its connections back to (it must be up).
        nic: String,
        #[command(flatten)]
        wait: WaitArgs,
    },
}

/// How long an order command waits for its outcome.
#[derive(clap::Args, Debug)]
pub struct WaitArgs {
    /// Return once the intent is committed instead of waiting for the outcome.
    #[arg(long)]
    pub no_wait: bool,
    /// How long to wait for the outcome (exit 4 if it is still open then).
    #[arg(long, default_value = "40s", value_parser = parse_duration)]
    pub wait_timeout: Duration,
}

impl WaitArgs {
    /// The wait, or none with `--no-wait`.
    pub fn wait(&self) -> Option<Duration> {
        (!self.no_wait).then_some(self.wait_timeout)
    }
}

/// `railguard qp …`.
#[derive(Subcommand, Debug)]
pub enum QpCmd {
    /// Connections with host, job, rank, id, NIC, home rail, peer and
    /// whether they moved off their home rail.
    List {
        /// Only connections on this host.
        #[arg(long)]
        host: Option<String>,
        /// Only connections of this job.
        #[arg(long)]
        job: Option<String>,
    },
}

/// A NIC state as a CLI value.
#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum NicStateArg {
    Unknown,
    Up,
    Down,
    Flapping,
    Recovering,
    Degraded,
}

impl From<NicStateArg> for NicState {
    fn from(a: NicStateArg) -> Self {
        match a {
            NicStateArg::Unknown => NicState::Unknown,
            NicStateArg::Up => NicState::Up,
            NicStateArg::Down => NicState::Down,
            NicStateArg::Flapping => NicState::Flapping,
            NicStateArg::Recovering => NicState::Recovering,
            NicStateArg::Degraded => NicState::Degraded,
        }
    }
}

/// Commits an order (failover/failback) and, with `wait`, polls its intent
/// until it closes; a failed or cancelled order is an error (exit 2), one
/// still open when `wait` runs out is an unknown outcome (exit 4).
pub async fn order(
    client: &AdminClient,
    op: AdminOp,
    wait: Option<Duration>,
    json: bool,
) -> anyhow::Result<()> {
    let reply = client.call(AdminRequest::Write { op }, false).await?;
    let AdminReply::IntentOpened { id, log_index, .. } = reply else {
        bail!(ApiError::internal(format!(
            "unexpected reply to an order: {reply:?}"
        )));
    };
    let Some(wait) = wait else {
        if json {
            return print_json(&reply);
        }
        println!("intent {id} opened (log index {log_index}); follow it with `railguard intents`");
        return Ok(());
    };
    if !json {
        println!(
            "intent {id} opened (log index {log_index}); waiting up to {wait:?} for the agent"
        );
    }
    let deadline = Instant::now() + wait;
    loop {
        match client.call(AdminRequest::IntentShow { id }, false).await {
            Ok(AdminReply::Intent { intent }) => {
                if let IntentStatus::Closed(outcome) = &intent.status {
                    if json {
                        print_json(&intent)?;
                    } else {
                        println!("{}", intent_line(&intent));
                    }
                    return match outcome {
                        Outcome::Done => Ok(()),
                        Outcome::Failed { error } => Err(ApiError::new(
                            ErrorKind::FailedPrecondition,
                            format!("intent {id} failed: {error}"),
                        )
                        .into()),
                        Outcome::Cancelled { why } => Err(ApiError::new(
                            ErrorKind::FailedPrecondition,
                            format!("intent {id} was cancelled: {why}"),
                        )
                        .into()),
                    };
                }
            }
            Ok(other) => bail!(ApiError::internal(format!("unexpected reply {other:?}"))),
            // A leader election: keep asking until the deadline.
            Err(e) if e.kind == ErrorKind::Unavailable => {}
            Err(e) => return Err(e.into()),
        }
        if Instant::now() + Duration::from_millis(200) >= deadline {
            bail!(ApiError::unknown(format!(
                "intent {id} is still open after {wait:?}; follow it with `railguard intents`"
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub fn print_nics(nics: &[NicView]) {
    if nics.is_empty() {
        println!("no NICs");
        return;
    }
    let wide = crate::output::wide();
    print!(
        "{:<14} {:<8} {:>4} {:<8} {:<15} {:<10} {:>6} {:>8}  {:<24} {:<16}",
        "HOST",
        "NIC",
        "RAIL",
        "BACKUP",
        "ADDR",
        "STATE",
        "FLAPS",
        "PENALTY",
        "LAST CHANGE",
        "SERVICE"
    );
    if wide {
        print!(
            " {:<8} {:>7} {:>7} {:<5} INCIDENTS",
            "RDMA", "CARRIER", "LINKCHG", "LINK"
        );
    }
    println!();
    for v in nics {
        print!("{:<14} {}", v.host, nic_row(&v.nic));
        if wide {
            let n = &v.nic;
            print!(
                " {:<8} {:>7} {:>7} {:<5} {}",
                n.rdma_device.as_deref().unwrap_or("-"),
                n.carrier_changes,
                n.link_transitions,
                n.link_up.map_or("-", |u| if u { "up" } else { "down" }),
                if n.open_incidents.is_empty() {
                    "-".to_string()
                } else {
                    n.open_incidents
                        .iter()
                        .map(|(k, id)| format!("{id}:{k}"))
                        .collect::<Vec<_>>()
                        .join(",")
                }
            );
        }
        println!();
    }
}

/// One NIC's columns: name, rail, backup, address, state, flaps, penalty,
/// last change, service (`in`, or `held by WHO`: an admin's failover holds
/// it out of service for connections until `nic failback`).
pub fn nic_row(n: &Nic) -> String {
    format!(
        "{:<8} {:>4} {:<8} {:<15} {:<10} {:>6} {:>8.0}  {:<24} {:<16}",
        n.name,
        n.rail.map(|r| r.to_string()).unwrap_or_else(|| "-".into()),
        n.backup.as_deref().unwrap_or("-"),
        n.addr.as_deref().unwrap_or("-"),
        format!("{:?}", n.state),
        n.flaps,
        n.damping_penalty,
        fmt_ms(n.last_change_ms),
        match &n.held_out {
            Some(h) => format!("held by {}", h.by),
            None => "in".to_string(),
        }
    )
}

pub fn print_qps(qps: &[QpView], truncated: bool) {
    if qps.is_empty() {
        println!("no connections");
        return;
    }
    table!(
        qps,
        "{:<14} {:<16} {:>5} {:>20} {:<8} {:>4} {:<20} {}",
        ["HOST", "JOB", "RANK", "CONN", "NIC", "RAIL", "PEER", "MOVED"],
        |QpView { host, qp: q }| [
            host,
            q.job,
            q.rank,
            q.conn_id,
            q.nic,
            q.rail,
            format!("{}/{}", q.peer_host, q.peer_rank),
            if q.moved { "yes" } else { "no" }
        ],
    );
    if truncated {
        println!("(more connections match; narrow with --host or --job)");
    }
}
