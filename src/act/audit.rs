//! The audit log's file: one JSON object per event in `events.jsonl`, bounded in size, written by a
//! thread of its own ([`open`]). The records and the in-memory list are memwatch-core's (`audit`).

use std::io::Write;
use std::path::{Path, PathBuf};

pub use memwatch_core::audit::{Action, Audit, Event, EventSink, RECENT, Reason};

/// Events that may wait for the writer thread before new ones are dropped from the file (they stay in
/// memory and in the API; the drop is logged).
pub const QUEUED: usize = 1024;

/// Opens the log in `dir`, loading its newest events, and starts its file's writer: `events.jsonl`
/// in the state directory, trimmed to its newer half past `max_bytes`. The file is written by a
/// thread of its own, fed through a bounded queue, so that recording an event never waits on the
/// disk (appends, and the trim's read, rewrite and fsync); dropping the log waits for what is
/// queued.
pub fn open(dir: &Path, max_bytes: u64) -> Audit {
    let path = dir.join("events.jsonl");
    let loaded: Vec<Event> = std::fs::read_to_string(&path)
        .map(|text| {
            text.lines()
                .filter_map(|line| serde_json::from_str::<Event>(line).ok())
                .collect()
        })
        .unwrap_or_default();
    let (tx, rx) = std::sync::mpsc::sync_channel::<Event>(QUEUED);
    let file = path.clone();
    let writer = std::thread::Builder::new()
        .name("audit".into())
        .spawn(move || {
            for e in rx {
                if let Err(err) = append(&file, max_bytes, &e) {
                    tracing::warn!(path = %file.display(), error = %err, "cannot write the audit log");
                }
            }
        });
    let writer = match writer {
        Ok(handle) => Some((tx, handle)),
        Err(e) => {
            tracing::error!(error = %e, "cannot start the audit log's writer; events are kept in memory only");
            None
        }
    };
    Audit::new(
        loaded,
        Box::new(FileSink {
            path,
            writer,
            dropped: 0,
        }),
    )
}

/// The writer of `events.jsonl`.
struct FileSink {
    path: PathBuf,
    writer: Option<(
        std::sync::mpsc::SyncSender<Event>,
        std::thread::JoinHandle<()>,
    )>,
    /// Events the full queue kept out of the file.
    dropped: u64,
}

impl EventSink for FileSink {
    /// Queues the event for the file (a full queue is logged, never fatal, and never waited for).
    fn append(&mut self, e: &Event) {
        if let Some((tx, _)) = &self.writer {
            if let Err(err) = tx.try_send(e.clone()) {
                self.dropped += 1;
                tracing::warn!(path = %self.path.display(), dropped = self.dropped, error = %err, "the audit log's writer is behind; an event is not in the file");
            }
        }
    }
}

impl Drop for FileSink {
    /// Waits for the writer to write what is queued.
    fn drop(&mut self) {
        if let Some((tx, handle)) = self.writer.take() {
            drop(tx);
            let _ = handle.join();
        }
    }
}

fn append(path: &Path, max_bytes: u64, e: &Event) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut line = serde_json::to_vec(e).map_err(std::io::Error::other)?;
    line.push(b'\n');
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    f.write_all(&line)?;
    if f.metadata()?.len() > max_bytes {
        trim(path)?;
    }
    Ok(())
}

/// Keeps the newer half of the file.
fn trim(path: &Path) -> std::io::Result<()> {
    let text = std::fs::read_to_string(path)?;
    let lines: Vec<&str> = text.lines().collect();
    let keep = lines[lines.len() / 2..].join("\n") + "\n";
    super::persist::write_atomic(path, keep.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_on_disk_and_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = open(dir.path(), 2000);
        for i in 0..100 {
            a.record(Event {
                timestamp_ms: i,
                action: Action::Pause,
                job: "j".into(),
                slurm_job_id: None,
                reason: Reason::HostMemory,
                detail: "x".repeat(20),
                dry_run: false,
            });
        }
        // Dropping the log waits for its writer.
        drop(a);
        let size = std::fs::metadata(dir.path().join("events.jsonl"))
            .unwrap()
            .len();
        assert!(size <= 2000 + 200, "{size}");
        let b = open(dir.path(), 2000);
        assert_eq!(b.recent().last().unwrap().timestamp_ms, 99);
        assert_eq!(b.recent().last().unwrap().reason, Reason::HostMemory);
    }

    #[test]
    fn lines_an_older_daemon_wrote_still_load() {
        // Reasons once taken from the first word of a sentence, a level's scoped key, a limit.
        let dir = tempfile::tempdir().unwrap();
        let lines = [
            r#"{"timestamp_ms":1,"action":"checkpoint","job":"qa","reason":"qa's","detail":"qa's cgroup at 96 %","dry_run":false}"#,
            r#"{"timestamp_ms":2,"action":"level","job":"","reason":"job_cgroup:qa","detail":"","dry_run":false}"#,
            r#"{"timestamp_ms":3,"action":"near_exhaustion","job":"qa","reason":"gpu 0","detail":"","dry_run":false}"#,
            r#"{"timestamp_ms":4,"action":"pause","job":"qa","reason":"job_cgroup","detail":"","dry_run":false}"#,
        ];
        std::fs::write(dir.path().join("events.jsonl"), lines.join("\n") + "\n").unwrap();
        let a = open(dir.path(), 1 << 20);
        let reasons: Vec<Reason> = a.recent().map(|e| e.reason.clone()).collect();
        assert_eq!(
            reasons,
            [
                Reason::Other("qa's".into()),
                Reason::Other("job_cgroup:qa".into()),
                Reason::Other("gpu 0".into()),
                Reason::JobCgroup,
            ]
        );
        // Served as written.
        let e = a.recent().next().unwrap();
        assert_eq!(serde_json::to_value(e).unwrap()["reason"], "qa's");
    }
}
