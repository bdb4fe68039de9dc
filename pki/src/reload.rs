//! [`reload_on_sighup`]: certificate rotation without a restart. On every
//! SIGHUP a process reads its certificate files again, for the port it
//! serves ([`ServerTls::reload`]) and for the connections it makes
//! ([`ClientTls::reload`]); a file that does not make a usable
//! configuration is logged and the old one kept, so a half-copied
//! certificate never takes a process off the network.

use crate::client::ClientTls;
use crate::server::ServerTls;

/// Spawns a task that reloads `server` (if this process serves) and
/// `client` on every SIGHUP. Needs a tokio runtime; fails only if the
/// signal handler cannot be installed.
pub fn reload_on_sighup(
    server: Option<ServerTls>,
    client: ClientTls,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = signal(SignalKind::hangup())?;
    Ok(tokio::spawn(async move {
        while hup.recv().await.is_some() {
            tracing::info!("SIGHUP: reloading TLS certificates");
            // Each reload logs its own error and keeps what it had.
            if let Some(s) = &server {
                let _ = s.reload();
            }
            let _ = client.reload();
        }
    }))
}
