//! The CLI's side of the control socket.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use super::{Request, Response};

/// Sends one request and returns the daemon's answer; an `ok: false` answer becomes an error that
/// holds the [`super::Refusal`] (`downcast_ref` for its kind).
pub fn call(socket: &Path, request: &Request) -> anyhow::Result<Response> {
    let mut stream = UnixStream::connect(socket).map_err(|e| {
        anyhow::anyhow!(
            "cannot reach the memwatch daemon on {}: {e} (is it running? `memwatch run` or `systemctl start memwatch`)",
            socket.display()
        )
    })?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut line = serde_json::to_vec(request)?;
    line.push(b'\n');
    stream.write_all(&line)?;
    let mut reply = String::new();
    BufReader::new(&stream).read_line(&mut reply)?;
    let response: Response = serde_json::from_str(&reply).map_err(|e| {
        anyhow::anyhow!("the daemon sent an answer memwatch cannot read ({e}): {reply:?}")
    })?;
    match response.refusal() {
        Some(r) => Err(r.into()),
        None => Ok(response),
    }
}
