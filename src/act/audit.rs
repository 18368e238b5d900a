//! The audit log: one JSON object per intervention in `events.jsonl`, bounded in size, plus the
//! in-memory list served at /api/v1/events.

use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One recorded intervention or level change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// When it happened (engine clock, ms since the epoch).
    pub timestamp_ms: u64,
    /// pause, resume, checkpoint, terminate, stay_paused, attach, detach, level, error.
    pub action: String,
    /// The job, or empty for host-wide events.
    pub job: String,
    /// The Slurm job the job belongs to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_job_id: Option<String>,
    /// A short machine-readable cause: host_memory, job_cgroup, gpu_temperature, predicted, user …
    pub reason: String,
    /// The numbers behind it, for people.
    pub detail: String,
    /// Decided in dry-run mode: recorded, not carried out.
    pub dry_run: bool,
}

/// How many events the in-memory list keeps.
pub const RECENT: usize = 500;

/// The audit log: `events.jsonl` in the state directory, trimmed to its newer half past its size
/// limit, and the newest events in memory.
pub struct Audit {
    path: PathBuf,
    max_bytes: u64,
    recent: VecDeque<Event>,
}

impl Audit {
    /// Opens the log in `dir`, loading its newest events.
    pub fn open(dir: &Path, max_bytes: u64) -> Audit {
        let path = dir.join("events.jsonl");
        let mut recent = VecDeque::new();
        if let Ok(text) = std::fs::read_to_string(&path) {
            for line in text.lines() {
                if let Ok(e) = serde_json::from_str::<Event>(line) {
                    if recent.len() == RECENT {
                        recent.pop_front();
                    }
                    recent.push_back(e);
                }
            }
        }
        Audit {
            path,
            max_bytes,
            recent,
        }
    }

    /// The newest events in memory, oldest first.
    pub fn recent(&self) -> impl Iterator<Item = &Event> {
        self.recent.iter()
    }

    /// Records an event: memory, then the file (failures to write are logged, never fatal).
    pub fn record(&mut self, e: Event) {
        if let Err(err) = self.append(&e) {
            tracing::warn!(path = %self.path.display(), error = %err, "cannot write the audit log");
        }
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(e);
    }

    fn append(&self, e: &Event) -> std::io::Result<()> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut line = serde_json::to_vec(e).map_err(std::io::Error::other)?;
        line.push(b'\n');
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        f.write_all(&line)?;
        if f.metadata()?.len() > self.max_bytes {
            self.trim()?;
        }
        Ok(())
    }

    /// Keeps the newer half of the file.
    fn trim(&self) -> std::io::Result<()> {
        let text = std::fs::read_to_string(&self.path)?;
        let lines: Vec<&str> = text.lines().collect();
        let keep = lines[lines.len() / 2..].join("\n") + "\n";
        super::persist::write_atomic(&self.path, keep.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_on_disk_and_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = Audit::open(dir.path(), 2000);
        for i in 0..100 {
            a.record(Event {
                timestamp_ms: i,
                action: "pause".into(),
                job: "j".into(),
                slurm_job_id: None,
                reason: "host_memory".into(),
                detail: "x".repeat(20),
                dry_run: false,
            });
        }
        let size = std::fs::metadata(dir.path().join("events.jsonl"))
            .unwrap()
            .len();
        assert!(size <= 2000 + 200, "{size}");
        let b = Audit::open(dir.path(), 2000);
        assert_eq!(b.recent().last().unwrap().timestamp_ms, 99);
    }
}
