//! Accepts connections on the control socket and forwards each request, with the caller's uid, to the
//! task that owns the jobs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};

use super::{Caller, MAX_LINE, Request, Response};

/// A request on its way to the owner task, with the channel for the answer.
pub struct Envelope {
    pub request: Request,
    pub caller: Caller,
    pub reply: oneshot::Sender<Response>,
}

/// Binds the socket: creates its directory (0755), replaces a stale socket, and lets every user
/// connect (0666): authorisation is per request, by uid.
pub fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    if path.exists() {
        // A live daemon answers; a stale socket from a crash does not.
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            anyhow::bail!(
                "another memwatch daemon is already serving {}",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .with_context(|| format!("cannot remove stale socket {}", path.display()))?;
    }
    let listener = UnixListener::bind(path)
        .with_context(|| format!("cannot bind control socket {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .with_context(|| format!("cannot set permissions on {}", path.display()))?;
    Ok(listener)
}

/// Serves connections until the listener fails; each connection gets its own task.
pub async fn serve(listener: UnixListener, to_owner: mpsc::Sender<Envelope>, path: PathBuf) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let tx = to_owner.clone();
                tokio::spawn(async move {
                    if let Err(e) = connection(stream, tx).await {
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

async fn connection(stream: UnixStream, to_owner: mpsc::Sender<Envelope>) -> std::io::Result<()> {
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
                let (reply, answer) = oneshot::channel();
                if to_owner
                    .send(Envelope {
                        request,
                        caller,
                        reply,
                    })
                    .await
                    .is_err()
                {
                    Response::error("the daemon is shutting down")
                } else {
                    answer
                        .await
                        .unwrap_or_else(|_| Response::error("the daemon is shutting down"))
                }
            }
        };
        write(&mut write_half, &response).await?;
    }
}
