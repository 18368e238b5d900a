//! Why the daemon did not start, or stopped on its own: each with what and where. The CLI prints it
//! once, with its causes (`{:#}`).

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::control::server::BindError;

/// A failure that ends [`super::run`].
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Another daemon holds the lock of the runtime or the state directory.
    #[error("another memwatch daemon is running with directory {}", .0.display())]
    Locked(PathBuf),
    /// The lock could not be taken: the directory or its lock file failed.
    #[error("cannot lock {}", dir.display())]
    Lock {
        /// The runtime or the state directory.
        dir: PathBuf,
        /// The OS's error.
        #[source]
        error: std::io::Error,
    },
    /// The task that waits for the lock did not finish.
    #[error("the lock task failed")]
    LockTask(#[source] tokio::task::JoinError),
    /// The HTTP port could not be bound.
    #[error("cannot listen on {addr}")]
    Listen {
        /// `listen` in the configuration.
        addr: SocketAddr,
        /// The OS's error.
        #[source]
        error: std::io::Error,
    },
    /// The bound port has no address.
    #[error("listening socket has no address")]
    NoAddress(#[source] std::io::Error),
    /// The control socket could not be bound.
    #[error(transparent)]
    Control(#[from] BindError),
    /// The sampler panicked this many times in a row; a supervisor restarts the daemon.
    #[error("the sampler panicked {0} times in a row")]
    SamplerPanics(u32),
}
