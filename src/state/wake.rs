//! The service's wake-up socket, `StateDir/wake.sock`: a hook that queued an event sends one
//! datagram to it, and the service's sender ([`crate::service::sender`]), which has bound it,
//! looks at the outbox at once. A socket file nobody has bound (the service died) refuses the
//! datagram: the hook then sends itself.

use super::layout::WAKE_SOCKET;
use super::StateDir;
use std::io::ErrorKind;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};

/// The path of the wake-up socket under `state_dir`.
pub fn socket_path(state_dir: &Path) -> PathBuf {
    state_dir.join(WAKE_SOCKET)
}

/// A connection to a live sender, or `None` when no service listens: the path is missing, is
/// not a socket (a symlink is never followed), or is a socket nobody has bound (a service
/// that died leaves one behind: connecting to it is refused). Costs one `lstat` and one
/// `connect`; never blocks.
pub fn connect(state_dir: &Path) -> Option<UnixDatagram> {
    let path = socket_path(state_dir);
    let meta = std::fs::symlink_metadata(&path).ok()?;
    if !meta.file_type().is_socket() {
        return None;
    }
    let sock = UnixDatagram::unbound().ok()?;
    sock.set_nonblocking(true).ok()?;
    sock.connect(&path).ok()?;
    Some(sock)
}

/// Wakes the sender through a socket from [`connect`]. True when the sender has it (or
/// already has more wake-ups queued than it needs: a full socket buffer means it is busy
/// reading the outbox anyway); false when the sender is gone.
pub fn wake(sock: &UnixDatagram) -> bool {
    match sock.send(b"w") {
        Ok(_) => true,
        Err(e) => e.kind() == ErrorKind::WouldBlock,
    }
}

/// Binds the wake-up socket, replacing a stale one (never anything that is not a socket).
pub fn bind(path: &Path, outbox: &StateDir) -> Result<UnixDatagram, String> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            // Still bound by a live process? Then a second service is running.
            if connect(outbox.root()).is_some() {
                return Err(format!(
                    "{} is in use: another cvslurm service runs on this StateDir",
                    path.display()
                ));
            }
            std::fs::remove_file(path)
                .map_err(|e| format!("cannot remove the stale {}: {e}", path.display()))?;
        }
        Ok(_) => {
            return Err(format!(
                "{} exists and is not a socket; remove it (hooks send directly meanwhile)",
                path.display()
            ))
        }
        Err(_) => {}
    }
    let sock =
        UnixDatagram::bind(path).map_err(|e| format!("cannot bind {}: {e}", path.display()))?;
    // The hooks (SlurmUser) must be able to write to it: 0600 for the service's own user,
    // handed to StateDir's owner when the service runs as root.
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
    if let Some((uid, gid)) = outbox.owner() {
        let _ = std::os::unix::fs::lchown(path, Some(uid), Some(gid));
    }
    Ok(sock)
}
