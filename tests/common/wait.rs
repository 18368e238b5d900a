//! Waiting for what another process or thread publishes later (the daemon's events, metrics and API,
//! its log, a file, a process's state): the same read is polled until its condition holds or a
//! generous deadline passes, and a wait that fails says what it last read.

use std::fmt::Debug;
use std::time::{Duration, Instant};

use super::Daemon;

/// How long a wait polls before it fails: generous, for a loaded machine.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// Between two reads.
const EVERY: Duration = Duration::from_millis(50);

/// Reads with `read` until `ok` holds on what it read, or [`DEADLINE`] passes: `Ok` with the read
/// that held, else `Err` with the last one.
pub fn poll<T>(mut read: impl FnMut() -> T, mut ok: impl FnMut(&T) -> bool) -> Result<T, T> {
    let start = Instant::now();
    loop {
        let v = read();
        if ok(&v) {
            return Ok(v);
        }
        if start.elapsed() >= DEADLINE {
            return Err(v);
        }
        std::thread::sleep(EVERY);
    }
}

/// As [`poll`]; fails the test with `what` and the last read when the deadline passes.
pub fn until<T: Debug>(what: &str, read: impl FnMut() -> T, ok: impl FnMut(&T) -> bool) -> T {
    poll(read, ok)
        .unwrap_or_else(|last| panic!("{what}: not within {DEADLINE:?}; last read:\n{last:#?}"))
}

/// As [`until`] for text (metrics, a log, a file), shown as it reads when the wait fails.
pub fn until_text(what: &str, read: impl FnMut() -> String, ok: impl Fn(&str) -> bool) -> String {
    poll(read, |t| ok(t))
        .unwrap_or_else(|last| panic!("{what}: not within {DEADLINE:?}; last read:\n{last}"))
}

/// A file's text once `ok` holds on it (a missing file reads as empty).
pub fn file(what: &str, path: &std::path::Path, ok: impl Fn(&str) -> bool) -> String {
    until_text(
        &format!("{what} ({})", path.display()),
        || std::fs::read_to_string(path).unwrap_or_default(),
        ok,
    )
}

/// A process's state letter once `ok` holds on it (`None`: the process is gone).
pub fn proc_state(what: &str, pid: u32, ok: impl Fn(Option<char>) -> bool) -> Option<char> {
    until(
        &format!("{what} (pid {pid})"),
        || super::proc_state(pid),
        |s| ok(*s),
    )
}

impl Daemon {
    /// The newest lines of the daemon's log, for a failed wait's message.
    fn log_tail(&self) -> String {
        let log = self.log.lock().unwrap();
        log[log.len().saturating_sub(40)..].join("\n")
    }

    /// Polls `read` until `ok` holds; fails with `what`, the last read and the log's tail.
    pub fn wait_for<T: Debug>(
        &self,
        what: &str,
        read: impl FnMut() -> T,
        ok: impl FnMut(&T) -> bool,
    ) -> T {
        poll(read, ok).unwrap_or_else(|last| {
            panic!(
                "{what}: not within {DEADLINE:?}; last read:\n{last:#?}\nthe daemon's log ends:\n{}",
                self.log_tail()
            )
        })
    }

    /// The events (`/api/v1/events`) once `ok` holds on them.
    pub fn wait_events(
        &self,
        what: &str,
        ok: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Vec<serde_json::Value> {
        self.wait_for(what, || self.events(), |e| ok(e))
    }

    /// The events once one of them matches `event`.
    pub fn wait_event(
        &self,
        what: &str,
        event: impl Fn(&serde_json::Value) -> bool,
    ) -> Vec<serde_json::Value> {
        self.wait_events(what, |e| e.iter().any(&event))
    }

    /// The `/metrics` text once `ok` holds on it.
    pub fn wait_metrics(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        poll(|| self.metrics(), |m| ok(m)).unwrap_or_else(|last| {
            panic!(
                "{what}: not within {DEADLINE:?}; the last scrape:\n{last}\nthe daemon's log ends:\n{}",
                self.log_tail()
            )
        })
    }

    /// An API path's JSON (a 200 answer) once `ok` holds on it.
    pub fn wait_api(
        &self,
        path: &str,
        what: &str,
        ok: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        self.wait_for(
            what,
            || {
                let (status, body) = self.get(path);
                (status == 200)
                    .then(|| serde_json::from_str(&body).ok())
                    .flatten()
                    .unwrap_or(serde_json::Value::Null)
            },
            |v| ok(v),
        )
    }

    /// The log (read from the daemon's stderr by a thread of its own) once `ok` holds on it.
    pub fn wait_log(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        poll(|| self.log_text(), |l| ok(l))
            .unwrap_or_else(|last| panic!("{what}: not within {DEADLINE:?}; the log:\n{last}"))
    }

    /// The current guardian's pid, once the daemon's log (read by a thread) says it started.
    pub fn wait_guardian_pid(&self) -> u32 {
        poll(|| self.guardian_pid(), Option::is_some)
            .unwrap_or_else(|_| {
                panic!(
                    "the daemon logged no guardian within {DEADLINE:?}; the log:\n{}",
                    self.log_text()
                )
            })
            .unwrap()
    }
}
