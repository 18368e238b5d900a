//! The audit log: one JSON object per intervention in `events.jsonl`, bounded in size, plus the
//! in-memory list served at /api/v1/events.

use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use crate::reason::Reason;

/// What an event records. Serialized as its snake_case name (`stay_paused`, `way_out` …), and
/// ordered by it (the counts per action list as they did when actions were strings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// A job was attached (by a person, `memwatch launch`, a restarted daemon or Slurm).
    Attach,
    /// A job was detached, or its root exited.
    Detach,
    /// A job was paused.
    Pause,
    /// A job was resumed.
    Resume,
    /// A job was asked to save a checkpoint.
    Checkpoint,
    /// A job was asked to stop (SIGTERM to every process).
    Terminate,
    /// A job that did not stop within the grace got SIGKILL.
    Kill,
    /// A job reached the maximum pause and stays paused, as configured.
    StayPaused,
    /// A resource changed level.
    Level,
    /// The OOM killer ended processes in a job's cgroups (its step and task cgroups included).
    OomKill,
    /// A change to a job's training config was staged (written to its file).
    Rewrite,
    /// The trainer acknowledged changes as applied.
    Applied,
    /// The trainer answered that it cannot apply changes.
    Declined,
    /// An acknowledged change was seen to take effect.
    Verified,
    /// An acknowledged change was not seen to take effect in time.
    Unverified,
    /// A step of a job's way out of a memory pause.
    WayOut,
    /// A running job will reach a limit soon at its current growth.
    NearExhaustion,
    /// A collector started failing.
    CollectorDown,
    /// A failing collector works again.
    CollectorUp,
    /// Something memwatch tried failed.
    Error,
}

impl Action {
    /// The name the API, the events and the metrics use (as serialized).
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Attach => "attach",
            Action::Detach => "detach",
            Action::Pause => "pause",
            Action::Resume => "resume",
            Action::Checkpoint => "checkpoint",
            Action::Terminate => "terminate",
            Action::Kill => "kill",
            Action::StayPaused => "stay_paused",
            Action::Level => "level",
            Action::OomKill => "oom_kill",
            Action::Rewrite => "rewrite",
            Action::Applied => "applied",
            Action::Declined => "declined",
            Action::Verified => "verified",
            Action::Unverified => "unverified",
            Action::WayOut => "way_out",
            Action::NearExhaustion => "near_exhaustion",
            Action::CollectorDown => "collector_down",
            Action::CollectorUp => "collector_up",
            Action::Error => "error",
        }
    }

    /// Every action, in the order the API's docs list them.
    pub const ALL: [Action; 20] = [
        Action::Attach,
        Action::Detach,
        Action::Pause,
        Action::Resume,
        Action::Checkpoint,
        Action::Terminate,
        Action::Kill,
        Action::StayPaused,
        Action::Level,
        Action::OomKill,
        Action::Rewrite,
        Action::Applied,
        Action::Declined,
        Action::Verified,
        Action::Unverified,
        Action::WayOut,
        Action::NearExhaustion,
        Action::CollectorDown,
        Action::CollectorUp,
        Action::Error,
    ];

    /// The action of that name, if there is one.
    pub fn parse(name: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.as_str() == name)
    }

    /// An event that is no intervention: not counted as one, and logged at info.
    pub fn is_notice(self) -> bool {
        matches!(
            self,
            Action::Level
                | Action::OomKill
                | Action::Error
                | Action::CollectorDown
                | Action::CollectorUp
                | Action::NearExhaustion
        )
    }
}

impl Ord for Action {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl PartialOrd for Action {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// One recorded intervention or level change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// When it happened (engine clock, ms since the epoch).
    pub timestamp_ms: u64,
    /// What happened.
    pub action: Action,
    /// The job, or empty for host-wide events.
    pub job: String,
    /// The Slurm job the job belongs to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_job_id: Option<String>,
    /// A short machine-readable cause: host_memory, job_cgroup, gpu_temperature, predicted, user …
    /// (docs/api.md lists them all).
    pub reason: Reason,
    /// The numbers behind it, for people.
    pub detail: String,
    /// Decided in dry-run mode: recorded, not carried out.
    pub dry_run: bool,
}

/// How many events the in-memory list keeps.
pub const RECENT: usize = 500;

/// Events that may wait for the writer thread before new ones are dropped from the file (they stay in
/// memory and in the API; the drop is logged).
pub const QUEUED: usize = 1024;

/// The audit log: `events.jsonl` in the state directory, trimmed to its newer half past its size
/// limit, and the newest events in memory. The file is written by a thread of its own, fed through a
/// bounded queue, so that recording an event never waits on the disk (appends, and the trim's
/// read, rewrite and fsync past `max_bytes`); dropping the log waits for what is queued.
pub struct Audit {
    path: PathBuf,
    recent: VecDeque<Event>,
    writer: Option<(
        std::sync::mpsc::SyncSender<Event>,
        std::thread::JoinHandle<()>,
    )>,
    /// Events the full queue kept out of the file.
    dropped: u64,
}

impl Audit {
    /// Opens the log in `dir`, loading its newest events, and starts its writer.
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
        Audit {
            path,
            recent,
            writer,
            dropped: 0,
        }
    }

    /// The newest events in memory, oldest first.
    pub fn recent(&self) -> impl Iterator<Item = &Event> {
        self.recent.iter()
    }

    /// Records an event: in memory at once, in the file by the writer (a full queue or a write that
    /// fails is logged, never fatal, and never waited for).
    pub fn record(&mut self, e: Event) {
        if let Some((tx, _)) = &self.writer {
            if let Err(err) = tx.try_send(e.clone()) {
                self.dropped += 1;
                tracing::warn!(path = %self.path.display(), dropped = self.dropped, error = %err, "the audit log's writer is behind; an event is not in the file");
            }
        }
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(e);
    }
}

impl Drop for Audit {
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
    fn action_names_are_the_serialized_ones_and_parse_back() {
        let mut seen = std::collections::BTreeSet::new();
        for a in Action::ALL {
            assert_eq!(serde_json::to_value(a).unwrap(), a.as_str());
            assert_eq!(Action::parse(a.as_str()), Some(a));
            assert!(seen.insert(a.as_str()), "{} twice", a.as_str());
        }
        assert_eq!(Action::parse("reboot"), None);
        // An events.jsonl line with an action this version does not know is skipped, not fatal.
        let line = r#"{"timestamp_ms":1,"action":"reboot","job":"","reason":"","detail":"","dry_run":false}"#;
        assert!(serde_json::from_str::<Event>(line).is_err());
    }

    #[test]
    fn bounded_on_disk_and_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = Audit::open(dir.path(), 2000);
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
        let b = Audit::open(dir.path(), 2000);
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
        let a = Audit::open(dir.path(), 1 << 20);
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
