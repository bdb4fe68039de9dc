//! The control socket file: binding it (stale files replaced, a live
//! agent's path refused), its owner group and mode 0660.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;

use tokio::net::UnixListener;

/// Control socket failures.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Another process (an agent) answers on the socket path.
    #[error("control socket {path}: another agent is listening on it")]
    InUse { path: String },
    /// The path exists and is something other than a socket.
    #[error("control socket {path}: the path exists and is not a socket; remove it or pass another --control-socket")]
    NotASocket { path: String },
    /// The agent may not create the socket at the path.
    #[error("control socket {path}: permission denied; run the agent as root or pass --control-socket PATH")]
    Permission { path: String },
    /// Any other failure binding or preparing the socket.
    #[error("control socket {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Binds the control socket: creates its directory, removes a socket file
/// nobody listens on (left by a crashed agent), and refuses a path another
/// agent is serving or that is not a socket. The socket is mode 0660,
/// owned by root and the group `group` (None: root's group), so only root
/// and that group's members (the job user's group) may connect; who may
/// speak for which rank is checked per connection ([`Peer`]).
pub fn bind(path: &Path, group: Option<u32>) -> Result<UnixListener, ControlError> {
    let shown = path.display().to_string();
    let io = |source: std::io::Error| {
        if source.kind() == std::io::ErrorKind::PermissionDenied {
            ControlError::Permission {
                path: shown.clone(),
            }
        } else {
            ControlError::Io {
                path: shown.clone(),
                source,
            }
        }
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => {
            return Err(ControlError::NotASocket { path: shown });
        }
        Ok(_) => match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => return Err(ControlError::InUse { path: shown }),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                tracing::info!(socket = %shown, "removing a stale control socket");
                std::fs::remove_file(path).map_err(io)?;
            }
            Err(e) => return Err(io(e)),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    let l = UnixListener::bind(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AddrInUse {
            ControlError::InUse {
                path: shown.clone(),
            }
        } else {
            io(e)
        }
    })?;
    std::os::unix::fs::chown(path, None, group).map_err(io)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(io)?;
    Ok(l)
}
