//! Runs one supervisor process: lock the data dir, start Raft, bind the
//! listener, serve, and auto-initialise a one-node cluster when no peers are
//! configured.

use std::sync::Arc;

use crate::config::SupervisorConfig;
use crate::datadir;
use crate::leader::services::Leader;
use crate::node::Supervisor;

/// Why the daemon could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The data directory cannot be created or is locked by another process.
    #[error(transparent)]
    DataDir(#[from] datadir::DataDirError),
    /// The Raft store or node did not start.
    #[error(transparent)]
    Start(#[from] crate::node::StartError),
    /// The listen address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// The TLS files cannot be loaded, or the certificate is not this
    /// supervisor's.
    #[error("TLS: {0}")]
    Tls(String),
    /// The gRPC server stopped with an error.
    #[error("gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
    /// Raft stopped on its own: openraft stops a node on any storage
    /// error (a full or read-only disk, a failed flush) and on its own
    /// faults. The process exits rather than go on with a dead Raft core
    /// — which kept reporting itself leader, ran the leader's services on
    /// a frozen state and served reads from it — and starts again from its
    /// data directory when restarted (systemd's `Restart=on-failure`).
    #[error("Raft stopped ({0}); exiting. If that is a storage error, restart the supervisor once its data directory can be written again")]
    RaftStopped(String),
}

/// Resolves when the Raft core stops by itself, with why.
async fn raft_stopped(raft: openraft::Raft<crate::model::TypeConfig>) -> String {
    let mut m = raft.metrics();
    loop {
        if let Err(fatal) = &m.borrow_and_update().running_state {
            return fatal.to_string();
        }
        if m.changed().await.is_err() {
            return "the Raft core ended".into();
        }
    }
}

/// Starts the supervisor and serves until `shutdown` resolves.
pub async fn run(
    config: SupervisorConfig,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), DaemonError> {
    let _lock = datadir::lock(&config.data_dir)?;
    // The TLS server refuses what the replicated list revokes: the node
    // keeps this handle equal to it.
    let revocations = pki::Revocations::new();
    let tls = match &config.tls {
        pki::TlsMode::Mtls(files) => {
            let tls = pki::ServerTls::load(files.clone(), revocations.clone())
                .map_err(|e| DaemonError::Tls(e.to_string()))?;
            let me = pki::Identity::supervisor(config.id);
            if tls.identity() != me {
                return Err(DaemonError::Tls(format!(
                    "{} is the certificate of {}, not of this supervisor ({me}); issue one with `railguard pki issue supervisor --member {}`",
                    files.cert.display(),
                    tls.identity(),
                    config.id
                )));
            }
            tracing::info!(serial = %tls.serial(), identity = %tls.identity(), "mutual TLS on");
            Some(tls)
        }
        pki::TlsMode::Insecure => {
            tracing::warn!("--insecure: no TLS and no authentication; anyone who reaches this port can run jobs as root on every host. Use it only in a lab.");
            None
        }
    };
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| DaemonError::Bind {
            addr: config.listen.to_string(),
            source,
        })?;
    let single = config.peers.is_empty() && !config.join;
    let sup: Arc<Supervisor> = Supervisor::start(config, revocations).await?;
    if let Some(tls) = &tls {
        // SIGHUP re-reads the certificate this port serves and the one it
        // presents to peers.
        pki::reload_on_sighup(Some(tls.clone()), sup.client_tls.clone())
            .map_err(|e| DaemonError::Tls(e.to_string()))?;
    }
    if single {
        match sup.raft.is_initialized().await {
            Ok(false) => {
                tracing::info!(
                    id = sup.id,
                    "no peers configured: initialising a one-node cluster"
                );
                if let Err(e) = sup.initialize().await {
                    tracing::warn!(error = %e, "one-node initialisation failed");
                }
            }
            Ok(true) => {}
            Err(e) => tracing::warn!(error = %e, "cannot read initialisation state"),
        }
    }
    let leader = Leader::new(sup.clone());
    leader.spawn_loops();
    tokio::select! {
        served = crate::service::serve(leader, listener, tls, shutdown) => {
            served?;
            let _ = sup.raft.shutdown().await;
            Ok(())
        }
        why = raft_stopped(sup.raft.clone()) => {
            tracing::error!(error = %why, "Raft stopped; exiting");
            Err(DaemonError::RaftStopped(why))
        }
    }
}
