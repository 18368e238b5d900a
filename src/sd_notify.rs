//! systemd's notify protocol: READY=1 once serving, WATCHDOG=1 while the owner task is alive, STOPPING=1
//! on the way out. Messages are datagrams to `$NOTIFY_SOCKET`; without it (not under systemd) every call
//! does nothing.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// How long READY and STOPPING may wait for room in the notify socket's queue.
pub const SEND_TIMEOUT: Duration = Duration::from_millis(250);

/// Sends one notification; errors are logged, never fatal. The caller is the owner task, so a
/// notify socket whose queue is full (a manager that is not reading) must not stop it: a watchdog
/// ping is dropped at once (the manager that misses it restarts the daemon, as it should), any other
/// message waits at most [`SEND_TIMEOUT`].
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let Ok(sock) = UnixDatagram::unbound() else {
        return;
    };
    let bounded = if state == "WATCHDOG=1" {
        sock.set_nonblocking(true)
    } else {
        sock.set_write_timeout(Some(SEND_TIMEOUT))
    };
    if let Err(e) = bounded {
        tracing::debug!(error = %e, state, "sd_notify: cannot bound the send; not sent");
        return;
    }
    let bytes = path.as_encoded_bytes();
    let result = if let Some(name) = bytes.strip_prefix(b"@") {
        // An abstract socket.
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(name)
            .and_then(|a| sock.send_to_addr(state.as_bytes(), &a))
    } else {
        sock.send_to(state.as_bytes(), &path)
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, state, "sd_notify failed");
    }
}

/// Half the watchdog interval systemd asked for (`WATCHDOG_USEC`, for this pid), if any.
pub fn watchdog_interval() -> Option<Duration> {
    if let Some(pid) = std::env::var("WATCHDOG_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
    {
        if pid != std::process::id() {
            return None;
        }
    }
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}

#[cfg(test)]
mod tests {
    /// The tests here set the process's environment: one at a time.
    static ENV: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn sends_to_the_notify_socket() {
        let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let server = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        // SAFETY: tests in this module do not read the environment concurrently.
        unsafe { std::env::set_var("NOTIFY_SOCKET", &path) };
        super::notify("READY=1");
        unsafe { std::env::remove_var("NOTIFY_SOCKET") };
        let mut buf = [0u8; 64];
        let n = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
    }

    /// A manager that stops reading fills the socket's queue; notifying then returns (a ping at
    /// once, anything else within the send timeout) instead of blocking the owner task.
    #[test]
    fn a_full_notify_socket_never_blocks_the_caller() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let _server = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: tests in this module do not read the environment concurrently.
        unsafe { std::env::set_var("NOTIFY_SOCKET", &path) };
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // The queue holds a few datagrams (net.unix.max_dgram_qlen, 10 by default): far more.
            for _ in 0..200 {
                super::notify("WATCHDOG=1");
            }
            super::notify("STOPPING=1");
            let _ = done.send(());
        });
        let returned = finished.recv_timeout(std::time::Duration::from_secs(10));
        unsafe { std::env::remove_var("NOTIFY_SOCKET") };
        assert!(
            returned.is_ok(),
            "notifying a socket nobody reads blocked for 10 s"
        );
    }
}
