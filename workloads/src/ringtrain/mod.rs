//! `ringtrain`: the training job the chaos scenarios run under railguard.
//!
//! Deterministic data-parallel training of a small tanh MLP
//! ([`model`]: `64 → hidden → hidden → 16`, ~1.13 M parameters at the
//! default `--hidden 1024`, so 4.5 MB of gradient per step) on a synthetic
//! dataset: the batch of (step, rank) is a function of the seed, the step
//! and the rank, so the data cursor is the step. Every step each rank
//! computes its gradient and the ranks average them with a ring all-reduce
//! ([`allreduce`]) whose reduction order is fixed, so the final weights are
//! the same bits however the run was timed, interrupted, resumed or moved
//! between NICs. SGD with momentum.
//!
//! The ring runs over `rdma::resilient` connections on the host's data
//! NICs ([`net`]); with the agent's socket it speaks the job contract
//! ([`job`]): registers its connections, reports their moves and answers
//! `migrate`, `pace`, `checkpoint {step, halt}` and `stop` orders.
//! Without a socket (no `RAILGUARD_AGENT_SOCKET`, no `--agent-socket`) it
//! runs standalone.
//!
//! # Configuration
//! Flags override the environment the agent sets: `RAILGUARD_JOB`,
//! `RAILGUARD_INCARNATION`, `RAILGUARD_RANK`, `RAILGUARD_WORLD_SIZE`,
//! `RAILGUARD_PEERS`, `RAILGUARD_NICS`, `RAILGUARD_PORT`,
//! `RAILGUARD_CHECKPOINT_DIR`, `RAILGUARD_CHECKPOINT_EVERY`,
//! `RAILGUARD_RESUME_STEP`, `RAILGUARD_AGENT_SOCKET` (see [`config`]).
//!
//! # Output (stable; scenarios parse it)
//! stdout, one event per line, `key=value` pairs separated by spaces:
//! - `start rank=R world=W incarnation=I step=S steps=T params=P grad_bytes=B`
//! - `resumed step=N` — state loaded from `step-N/rank-R.ckpt`
//! - `step=N elapsed_ms=T loss=L` — every `--log-every` steps (default 10)
//!   and at the last step; `N` counts completed steps, `T` is the time
//!   since this process started training (after connecting), `L` is the
//!   global mean loss of that step (identical on every rank)
//! - `checkpoint step=N ordered=0|1 path=P` — a durable checkpoint
//! - `halted step=N` — a halting checkpoint was written; nothing more is
//!   computed, orders are still answered
//! - `stopped step=N reason=order|signal` — before exiting 143
//! - `digest=<64 hex>` — SHA-256 of the final weights (little-endian f32
//!   bytes): the last stdout line of a run that finished
//!
//! stderr: `tracing` logs and, at the end, one JSON summary line
//! (`{"event":"ringtrain_done",...}`). A bad configuration is one line,
//! `ringtrain: bad config: ...`.
//!
//! # Exit codes
//! 0 all steps done; 1 other error (including a corrupt or missing
//! checkpoint); 2 bad configuration (including a checkpoint of another
//! run); 75 fatal network error (a connection had no path for
//! `--stall-timeout`); 143 stopped by a `stop` order, SIGTERM or SIGINT.

pub mod allreduce;
pub mod checkpoint;
pub mod config;
pub mod job;
pub mod model;
pub mod net;

use std::sync::Arc;
use std::time::{Duration, Instant};

use allreduce::{Place, RingError, FLAG_CHECKPOINT, FLAG_HALT};
use checkpoint::{CheckpointError, Identity, State};
use config::Config;
use job::Orders;

/// All steps done.
pub const EXIT_DONE: i32 = 0;
/// Any other failure.
pub const EXIT_OTHER: i32 = 1;
/// A bad configuration.
pub const EXIT_CONFIG: i32 = 2;
/// A connection had no path for the stall timeout.
pub const EXIT_NETWORK: i32 = 75;
pub use job::EXIT_STOPPED;

/// How long the last sends may take to be acknowledged at the end.
const FINAL_FLUSH: Duration = Duration::from_secs(5);
/// After the final flush, how long the rank stays to acknowledge its
/// predecessor's last message (acks ride on the 50 ms pings).
const LINGER: Duration = Duration::from_millis(150);

/// A failure with its exit code.
#[derive(Debug)]
pub struct Failure {
    pub code: i32,
    pub message: String,
}

impl Failure {
    fn new(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl From<CheckpointError> for Failure {
    fn from(e: CheckpointError) -> Self {
        let code = match e {
            CheckpointError::Mismatch { .. } => EXIT_CONFIG,
            _ => EXIT_OTHER,
        };
        Failure::new(code, e.to_string())
    }
}

impl From<RingError> for Failure {
    fn from(e: RingError) -> Self {
        match e {
            RingError::Link(c) => Failure::new(EXIT_NETWORK, format!("fatal network error: {c}")),
            RingError::Protocol(m) => Failure::new(EXIT_OTHER, format!("ring protocol: {m}")),
        }
    }
}

/// The binary's `main`: parses, validates, runs; returns the exit code.
pub fn main_entry() -> i32 {
    use clap::Parser;
    let args = match config::Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return EXIT_DONE;
            }
            let text = e.to_string();
            let line = text
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("invalid arguments")
                .trim_start_matches("error: ");
            eprintln!("ringtrain: bad config: {line}");
            return EXIT_CONFIG;
        }
    };
    let cfg = match Config::from_args(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ringtrain: {e}");
            return EXIT_CONFIG;
        }
    };
    telemetry::init(telemetry::LogFormat::Text, "info");
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ringtrain: runtime: {e}");
            return EXIT_OTHER;
        }
    };
    match rt.block_on(run(cfg)) {
        Ok(()) => EXIT_DONE,
        Err(f) => {
            eprintln!("ringtrain: {}", f.message);
            f.code
        }
    }
}

/// Runs the job to the end (or exits the process on stop).
pub async fn run(cfg: Config) -> Result<(), Failure> {
    let cfg = Arc::new(cfg);
    let id = Identity {
        seed: cfg.seed,
        shape: cfg.shape,
        batch: cfg.batch as u32,
        world: cfg.world,
        rank: cfg.rank,
        lr: cfg.lr,
        momentum: cfg.momentum,
    };
    let nparams = cfg.shape.params();
    // The state first: a bad checkpoint fails before touching the network.
    let mut state = if cfg.resume_step > 0 {
        let dir = cfg.checkpoint_dir.as_deref().expect("validated");
        let s = tokio::task::block_in_place(|| checkpoint::load(dir, &id, cfg.resume_step))?;
        println!("resumed step={}", s.step);
        s
    } else {
        State {
            step: 0,
            cursor: 0,
            params: model::init_params(cfg.shape, cfg.seed),
            velocity: vec![0f32; nparams],
        }
    };
    let orders: Orders = Arc::default();
    job::lock(&orders).completed = state.step;
    // One extra value carries the loss through the all-reduce.
    let values = nparams + 1;
    let mut net = if cfg.world > 1 {
        Some(
            net::RingNet::open(&cfg, values)
                .await
                .map_err(|e| Failure::new(EXIT_OTHER, e.to_string()))?,
        )
    } else {
        None
    };
    let conns = net.as_ref().map(|n| n.conns.clone()).unwrap_or_default();
    let client = match &cfg.agent_socket {
        Some(sock) => {
            let (client, stream) = job::connect(&cfg, sock, &conns)
                .await
                .map_err(|e| Failure::new(EXIT_OTHER, format!("{e:#}")))?;
            // NICs an admin holds out of service: the connections leave
            // them and do not fail back to them.
            if let Some(n) = &net {
                n.endpoint.follow_held(client.held_out());
            }
            tokio::spawn(job::serve(
                cfg.clone(),
                client.clone(),
                stream,
                conns.clone(),
                orders.clone(),
            ));
            Some(client)
        }
        None => None,
    };
    {
        let (client, conns, orders) = (client.clone(), conns.clone(), orders.clone());
        tokio::spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let (Ok(mut term), Ok(mut int)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) else {
                tracing::warn!("no signal handlers; SIGTERM kills without a report");
                return;
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            job::exit_stopped(client.as_ref(), &conns, &orders, "signal").await;
        });
    }
    println!(
        "start rank={} world={} incarnation={} step={} steps={} params={} grad_bytes={}",
        cfg.rank,
        cfg.world,
        cfg.incarnation,
        state.step,
        cfg.steps,
        nparams,
        4 * nparams
    );
    let place = Place {
        rank: cfg.rank as usize,
        world: cfg.world as usize,
    };
    let fingerprint = cfg.fingerprint();
    let started = Instant::now();
    let first = state.step;
    let mut grad = vec![0f32; values];
    while state.step < cfg.steps {
        let s = state.step;
        let local = job::lock(&orders).local_flags(s + 1);
        let loss = tokio::task::block_in_place(|| {
            let b = model::batch(cfg.shape, cfg.seed, state.cursor, cfg.rank, cfg.batch);
            model::loss_and_grad(cfg.shape, &state.params, &b, &mut grad[..nparams])
        });
        grad[nparams] = loss;
        let flags = match net.as_mut() {
            Some(n) => {
                allreduce::all_reduce(&mut n.link(), place, s, fingerprint, local, &mut grad)
                    .await?
            }
            None => local,
        };
        tokio::task::block_in_place(|| {
            model::sgd_momentum(
                &mut state.params,
                &mut state.velocity,
                &grad[..nparams],
                cfg.lr,
                cfg.momentum,
            )
        });
        state.step += 1;
        state.cursor += 1;
        let n = state.step;
        job::lock(&orders).completed = n;
        if n % cfg.log_every == 0 || n == cfg.steps {
            println!(
                "step={n} elapsed_ms={} loss={:.6}",
                started.elapsed().as_millis(),
                grad[nparams]
            );
        }
        let ordered = flags & FLAG_CHECKPOINT != 0;
        let scheduled = cfg.checkpoint_every > 0 && n % cfg.checkpoint_every == 0;
        if ordered || scheduled {
            checkpoint_now(&cfg, &id, &state, client.as_ref(), ordered).await?;
        }
        if ordered {
            let halt = flags & FLAG_HALT != 0 && n < cfg.steps;
            let (done, orphaned) = {
                let mut o = job::lock(&orders);
                let done =
                    o.checkpoint_written(n, halt, local & FLAG_CHECKPOINT != 0, Instant::now());
                // Halted: orders for a later step can never be carried out.
                let orphaned: Vec<_> = if halt {
                    o.halted_at = Some(n);
                    o.pending.drain(..).collect()
                } else {
                    Vec::new()
                };
                (done, orphaned)
            };
            if let Some(c) = &client {
                for p in &done {
                    if let Err(e) = c.checkpoint_done(p.order_id, n).await {
                        tracing::warn!(order_id = p.order_id, error = %e, "order answer not delivered");
                    }
                }
                for p in &orphaned {
                    let want = p
                        .step
                        .map_or("the next step".into(), |s| format!("step {s}"));
                    let detail = format!("halted at step {n} before {want}");
                    if let Err(e) = c.order_done(p.order_id, false, &detail).await {
                        tracing::warn!(order_id = p.order_id, error = %e, "order answer not delivered");
                    }
                }
            }
            if halt {
                println!("halted step={n}");
                tracing::info!(step = n, "halted; waiting to be stopped");
                // Connections stay open (peers halt at the same step);
                // the order handler or a signal ends the process.
                std::future::pending::<()>().await;
            }
        }
        if !cfg.step_delay.is_zero() {
            tokio::time::sleep(cfg.step_delay).await;
        }
    }
    let elapsed = started.elapsed();
    let stale: Vec<_> = {
        let mut o = job::lock(&orders);
        o.finished = true;
        o.pending.drain(..).collect()
    };
    if let Some(c) = &client {
        for p in stale {
            let detail = format!("the job finished all {} steps first", cfg.steps);
            let _ = c.order_done(p.order_id, false, &detail).await;
        }
    }
    if let Some(n) = &net {
        match n.out.flush(FINAL_FLUSH).await {
            Ok(true) => {}
            Ok(false) => tracing::warn!("the successor did not acknowledge the last step in time"),
            Err(e) => tracing::warn!(error = %e, "final flush"),
        }
        tokio::time::sleep(LINGER).await;
    }
    if let Some(c) = &client {
        for conn in &conns {
            let _ = tokio::time::timeout(Duration::from_secs(1), c.conn_closed(conn.id)).await;
        }
    }
    let digest = model::digest(&state.params);
    let computed = cfg.steps - first;
    let summary = serde_json::json!({
        "event": "ringtrain_done",
        "rank": cfg.rank,
        "world": cfg.world,
        "steps": cfg.steps,
        "computed_steps": computed,
        "resumed_from": first,
        "elapsed_ms": elapsed.as_millis() as u64,
        "ms_per_step": if computed > 0 { elapsed.as_secs_f64() * 1e3 / computed as f64 } else { 0.0 },
        "grad_bytes": 4 * nparams,
        "loss": grad[nparams],
        "digest": digest,
    });
    eprintln!("{summary}");
    println!("digest={digest}");
    drop(net);
    Ok(())
}

/// Writes this rank's checkpoint and tells the agent.
async fn checkpoint_now(
    cfg: &Config,
    id: &Identity,
    state: &State,
    client: Option<&rdma::contract::ContractClient>,
    ordered: bool,
) -> Result<(), Failure> {
    let Some(dir) = cfg.checkpoint_dir.as_deref() else {
        tracing::warn!(
            step = state.step,
            "a peer asked for a checkpoint; this rank has no checkpoint directory"
        );
        return Ok(());
    };
    let path = tokio::task::block_in_place(|| checkpoint::write(dir, id, state))?;
    println!(
        "checkpoint step={} ordered={} path={}",
        state.step,
        u8::from(ordered),
        path.display()
    );
    if let Some(c) = client {
        if let Err(e) = c.checkpointed(state.step).await {
            tracing::warn!(step = state.step, error = %e, "checkpointed not delivered");
        }
    }
    Ok(())
}
