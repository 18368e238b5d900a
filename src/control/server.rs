//! Accepts connections on the control socket and forwards each request, with the caller's uid, to the
//! task that owns the jobs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};

use super::prepare::Preparer;
use super::{Caller, MAX_LINE, Request, Response};
use memwatch_core::engine::Prepared;

/// A request on its way to the owner task, with the channel for the answer.
pub struct Envelope {
    /// The request.
    pub request: Request,
    /// Who sent it.
    pub caller: Caller,
    /// What the request needed read from the host, read before it was sent (`prepare`).
    pub prepared: Prepared,
    /// Where the answer goes.
    pub reply: oneshot::Sender<Response>,
}

/// Why the control socket could not be bound: which path, and what.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// Another daemon answers on the socket.
    #[error("another memwatch daemon is already serving {}", .0.display())]
    Taken(PathBuf),
    /// A step on the way failed: which, on which path, and the OS's error.
    #[error("cannot {what} {}: {error}", path.display())]
    Io {
        /// What was being done ("create", "remove stale socket", "bind control socket", "set
        /// permissions on").
        what: &'static str,
        /// The directory or socket.
        path: PathBuf,
        /// The OS's error.
        error: std::io::Error,
    },
}

/// Binds the socket: creates its directory (0755), replaces a stale socket, and lets every user
/// connect (0666): authorisation is per request, by uid.
pub fn bind(path: &Path) -> Result<UnixListener, BindError> {
    use std::os::unix::fs::PermissionsExt;
    let io = |what: &'static str, at: &Path| {
        let path = at.to_owned();
        move |error| BindError::Io { what, path, error }
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io("create", dir))?;
    }
    if path.exists() {
        // A live daemon answers; a stale socket from a crash does not.
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(BindError::Taken(path.to_owned()));
        }
        std::fs::remove_file(path).map_err(io("remove stale socket", path))?;
    }
    let listener = UnixListener::bind(path).map_err(io("bind control socket", path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .map_err(io("set permissions on", path))?;
    Ok(listener)
}

/// How many connections may be open at once: in all (users other than root), and per uid. Root has
/// `per_uid` of its own on top of `total`, so no flood of other users' connections can lock root out.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once from users other than root.
    pub total: usize,
    /// Connections open at once per uid.
    pub per_uid: usize,
}

#[derive(Default)]
struct Open {
    users: usize,
    by_uid: std::collections::HashMap<u32, usize>,
}

/// One open connection's place; given back on drop.
struct Slot {
    open: std::sync::Arc<std::sync::Mutex<Open>>,
    uid: u32,
}

impl Slot {
    fn take(
        open: &std::sync::Arc<std::sync::Mutex<Open>>,
        uid: u32,
        limits: Limits,
    ) -> Option<Slot> {
        let mut o = open.lock().unwrap_or_else(|p| p.into_inner());
        let mine = o.by_uid.get(&uid).copied().unwrap_or(0);
        if mine >= limits.per_uid || (uid != 0 && o.users >= limits.total) {
            return None;
        }
        *o.by_uid.entry(uid).or_default() += 1;
        if uid != 0 {
            o.users += 1;
        }
        Some(Slot {
            open: open.clone(),
            uid,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut o = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = o.by_uid.get_mut(&self.uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                o.by_uid.remove(&self.uid);
            }
        }
        if self.uid != 0 {
            o.users = o.users.saturating_sub(1);
        }
    }
}

/// Serves connections until the listener fails; each connection gets its own task, within `limits`.
/// A connection over the limits is closed at once (the client reports it), and logged once a minute.
pub async fn serve(
    listener: UnixListener,
    to_owner: mpsc::Sender<Envelope>,
    path: PathBuf,
    limits: Limits,
    preparer: std::sync::Arc<Preparer>,
) {
    let open = std::sync::Arc::new(std::sync::Mutex::new(Open::default()));
    let mut last_warned: Option<std::time::Instant> = None;
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let Ok(cred) = stream.peer_cred() else {
                    continue;
                };
                let Some(slot) = Slot::take(&open, cred.uid(), limits) else {
                    if last_warned.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                        tracing::warn!(
                            uid = cred.uid(),
                            "control connection refused: too many open"
                        );
                        last_warned = Some(std::time::Instant::now());
                    }
                    drop(stream);
                    continue;
                };
                let tx = to_owner.clone();
                let preparer = preparer.clone();
                tokio::spawn(async move {
                    let _slot = slot;
                    if let Err(e) = connection(stream, tx, preparer).await {
                        tracing::debug!(error = %e, "control connection ended");
                    }
                });
            }
            Err(e) => {
                tracing::warn!(socket = %path.display(), error = %e, "control accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn write(stream: &mut (impl AsyncWriteExt + Unpin), r: &Response) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(r).map_err(std::io::Error::other)?;
    line.push(b'\n');
    stream.write_all(&line).await
}

async fn connection(
    stream: UnixStream,
    to_owner: mpsc::Sender<Envelope>,
    preparer: std::sync::Arc<Preparer>,
) -> std::io::Result<()> {
    let cred = stream.peer_cred()?;
    let caller = Caller {
        uid: cred.uid(),
        pid: cred.pid(),
    };
    let (read, mut write_half) = stream.into_split();
    let mut reader = BufReader::new(read);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n = tokio::time::timeout(
            Duration::from_secs(30),
            (&mut reader)
                .take(MAX_LINE as u64 + 1)
                .read_until(b'\n', &mut buf),
        )
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "idle"))??;
        if n == 0 {
            return Ok(());
        }
        if buf.len() > MAX_LINE {
            write(
                &mut write_half,
                &Response::error(format!("request longer than {MAX_LINE} bytes")),
            )
            .await?;
            return Ok(());
        }
        let response = match serde_json::from_slice::<Request>(&buf) {
            Err(e) => Response::error(format!("bad request: {e}")),
            Ok(request) => {
                // A slow read holds up this caller only, not the owner task.
                let prepared = preparer.prepare(&request, caller).await;
                let (reply, answer) = oneshot::channel();
                if to_owner
                    .send(Envelope {
                        request,
                        caller,
                        prepared,
                        reply,
                    })
                    .await
                    .is_err()
                {
                    Response::refused(super::Refusal::new(
                        super::ErrorKind::Unavailable,
                        "the daemon is shutting down",
                    ))
                } else {
                    answer.await.unwrap_or_else(|_| {
                        Response::refused(super::Refusal::new(
                            super::ErrorKind::Unavailable,
                            "the daemon is shutting down",
                        ))
                    })
                }
            }
        };
        write(&mut write_half, &response).await?;
    }
}
