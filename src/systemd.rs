//! sd_notify over `NOTIFY_SOCKET` (a datagram), with std only.

use std::os::unix::net::UnixDatagram;

/// Sends one notification (`READY=1`, `WATCHDOG=1`, `STOPPING=1`) when run under systemd
/// with `Type=notify`; does nothing otherwise.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let Ok(sock) = UnixDatagram::unbound() else {
        return;
    };
    let bytes = path.as_encoded_bytes();
    if let Some(abstract_name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        if let Ok(addr) = std::os::unix::net::SocketAddr::from_abstract_name(abstract_name) {
            let _ = sock.send_to_addr(state.as_bytes(), &addr);
        }
    } else {
        let _ = sock.send_to(state.as_bytes(), path);
    }
}
