//! The daemon's two doors: the HTTP port (metrics, the JSON API, the dashboard) and the control
//! socket (the CLI). Both are bound before the owner task starts, so that a port in use fails the
//! start; both forward commands to the owner task on one channel.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::control::server::{self, Envelope};
use crate::shared::Shared;

use super::DaemonError;

/// How many commands may wait for the owner task.
const COMMANDS: usize = 64;

/// The port and the socket, bound and not yet served.
pub(super) struct Bound {
    listener: TcpListener,
    control: UnixListener,
}

/// Both doors, served.
pub(super) struct Servers {
    control: JoinHandle<()>,
    socket: PathBuf,
    http: JoinHandle<()>,
    stop_http: watch::Sender<bool>,
}

/// Binds the HTTP port and the control socket (a stale socket from a crash is replaced; a live
/// daemon's is refused).
pub(super) async fn bind(config: &Config) -> Result<Bound, DaemonError> {
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|error| DaemonError::Listen {
            addr: config.listen,
            error,
        })?;
    let addr = listener.local_addr().map_err(DaemonError::NoAddress)?;
    let control = server::bind(&config.control.socket)?;
    tracing::info!(%addr, socket = %config.control.socket.display(), "listening");
    Ok(Bound { listener, control })
}

impl Bound {
    /// Serves both; the commands they take arrive on the receiver.
    pub(super) fn serve(
        self,
        config: &Config,
        shared: Arc<Shared>,
    ) -> (Servers, mpsc::Receiver<Envelope>) {
        let (to_owner, requests) = mpsc::channel::<Envelope>(COMMANDS);
        let app = crate::http::router(shared, to_owner.clone(), &config.http);
        let control = tokio::spawn(server::serve(
            self.control,
            to_owner,
            config.control.socket.clone(),
            server::Limits {
                total: config.control.max_connections.get(),
                per_uid: config.control.max_connections_per_uid.get(),
            },
            crate::control::prepare::Preparer::of(config),
        ));
        let (stop_http, mut http_stopped) = watch::channel(false);
        let limits = crate::http::Limits {
            max_connections: config.http.max_connections.get(),
            request_timeout: Duration::from_millis(config.http.request_timeout_ms.0),
        };
        let listener = self.listener;
        let http = tokio::spawn(async move {
            let stop = async move {
                let _ = http_stopped.changed().await;
            };
            crate::http::serve(listener, app, limits, stop).await
        });
        let servers = Servers {
            control,
            socket: config.control.socket.clone(),
            http,
            stop_http,
        };
        (servers, requests)
    }
}

impl Servers {
    /// Closes the socket at once and the port once its connections finish (5 s at most).
    pub(super) async fn stop(self) {
        self.control.abort();
        let _ = std::fs::remove_file(&self.socket);
        let _ = self.stop_http.send(true);
        if tokio::time::timeout(Duration::from_secs(5), self.http)
            .await
            .is_err()
        {
            tracing::warn!("HTTP connections still open after 5 s; closing them");
        }
    }
}
