//! The CLI's side of the control socket.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{Refusal, Request, Response};

/// Why a request over the control socket has no answer, or was refused: which socket, and what.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// Nothing answers on the socket.
    #[error(
        "cannot reach the memwatch daemon on {}: {error} (is it running? `memwatch run` or `systemctl start memwatch`)",
        socket.display()
    )]
    Connect {
        /// The socket.
        socket: PathBuf,
        /// The OS's error.
        error: std::io::Error,
    },
    /// Writing the request or reading the answer failed (or took over 30 s).
    #[error("the memwatch daemon on {}: {error}", socket.display())]
    Io {
        /// The socket.
        socket: PathBuf,
        /// The OS's error.
        error: std::io::Error,
    },
    /// The answer is not a response.
    #[error("the daemon sent an answer memwatch cannot read ({error}): {reply:?}")]
    Reply {
        /// What it sent.
        reply: String,
        /// Why it does not parse.
        error: serde_json::Error,
    },
    /// The daemon refused the request: its kind says why ([`Refusal::kind`]).
    #[error(transparent)]
    Refused(#[from] Refusal),
}

impl CallError {
    /// The daemon's refusal, when it refused.
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            CallError::Refused(r) => Some(r),
            _ => None,
        }
    }
}

/// Sends one request and returns the daemon's answer; an `ok: false` answer is
/// [`CallError::Refused`].
pub fn call(socket: &Path, request: &Request) -> Result<Response, CallError> {
    let io = |error| CallError::Io {
        socket: socket.to_owned(),
        error,
    };
    let mut stream = UnixStream::connect(socket).map_err(|error| CallError::Connect {
        socket: socket.to_owned(),
        error,
    })?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(io)?;
    let mut line = serde_json::to_vec(request).map_err(|e| io(e.into()))?;
    line.push(b'\n');
    stream.write_all(&line).map_err(io)?;
    let mut reply = String::new();
    BufReader::new(&stream).read_line(&mut reply).map_err(io)?;
    let response: Response =
        serde_json::from_str(&reply).map_err(|error| CallError::Reply { reply, error })?;
    match response.refusal() {
        Some(r) => Err(r.into()),
        None => Ok(response),
    }
}
