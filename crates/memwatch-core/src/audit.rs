//! The audit log's records: what each event says (the action, the job, the typed reason, the
//! numbers), and the in-memory list of the newest, served at /api/v1/events. One JSON object per
//! event is also appended to `events.jsonl` by an [`EventSink`] (the `memwatch` crate's file
//! writer); the line format is a wire and on-disk format.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

pub use crate::reason::Reason;

/// Declares `Action` with its names and meanings (its doc comments) and `Action::ALL` from one
/// list: docs/api.md's table of actions is generated from it ([`Action::table`]).
macro_rules! actions {
    ($($(#[doc = $doc:literal])* $variant:ident = $label:literal,)*) => {
        /// What an event records. Serialized as its snake_case name (`stay_paused`, `way_out` …),
        /// and ordered by it (the counts per action list as they did when actions were strings).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum Action {
            $($(#[doc = $doc])* $variant,)*
        }

        impl Action {
            /// Every action, in the order the API's docs list them.
            pub const ALL: &'static [Action] = &[$(Action::$variant,)*];

            /// The name the API, the events and the metrics use (as serialized).
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Action::$variant => $label,)*
                }
            }

            /// What it means, as docs/api.md's table of actions has it.
            fn doc(self) -> String {
                match self {
                    $(Action::$variant => crate::reason::paragraph(&[$($doc),*]),)*
                }
            }
        }
    };
}

actions! {
    /// A job was attached (by a person, `memwatch launch`, a restarted daemon or Slurm).
    Attach = "attach",
    /// A job was detached, or its root exited.
    Detach = "detach",
    /// A job was paused.
    Pause = "pause",
    /// A job was resumed.
    Resume = "resume",
    /// A job was asked to save a checkpoint.
    Checkpoint = "checkpoint",
    /// A job was asked to stop (SIGTERM to every process).
    Terminate = "terminate",
    /// A job that did not stop within the grace got SIGKILL.
    Kill = "kill",
    /// A job reached the maximum pause and stays paused, as configured.
    StayPaused = "stay_paused",
    /// A resource changed level.
    Level = "level",
    /// The OOM killer ended processes in a job's cgroups (its Slurm step and task cgroups
    /// included).
    OomKill = "oom_kill",
    /// A change to a job's training config was staged (written to its file).
    Rewrite = "rewrite",
    /// The trainer acknowledged changes as applied.
    Applied = "applied",
    /// The trainer answered that it cannot apply changes.
    Declined = "declined",
    /// An acknowledged change was seen to take effect.
    Verified = "verified",
    /// An acknowledged change was not seen to take effect in time.
    Unverified = "unverified",
    /// The trainer reported a CUDA out-of-memory error inside a training step: it recovered at a
    /// smaller micro-batch, or stopped at its floor.
    CudaOom = "cuda_oom",
    /// A step of a job's way out of a memory pause.
    WayOut = "way_out",
    /// A running job will reach a limit within `notify.near_exhaustion_seconds` at its current
    /// growth.
    NearExhaustion = "near_exhaustion",
    /// A collector started failing (`job` is empty).
    CollectorDown = "collector_down",
    /// A failing collector works again (`job` is empty).
    CollectorUp = "collector_up",
    /// Something memwatch tried failed.
    Error = "error",
}

impl Action {
    /// docs/api.md's table of actions: name, meaning.
    pub fn table() -> String {
        let mut t = String::from("| `action` | meaning |\n|---|---|\n");
        for a in Action::ALL {
            t.push_str(&format!("| `{}` | {} |\n", a.as_str(), a.doc()));
        }
        t
    }

    /// The action of that name, if there is one.
    pub fn parse(name: &str) -> Option<Action> {
        Action::ALL.iter().copied().find(|a| a.as_str() == name)
    }

    /// An event that is no intervention: not counted as one, and logged at info.
    pub fn is_notice(self) -> bool {
        matches!(
            self,
            Action::Level
                | Action::OomKill
                | Action::CudaOom
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

/// Where recorded events go besides memory: the file's writer. It must not wait on the disk.
pub trait EventSink: Send {
    /// Takes one event to keep (a failure is the sink's to report).
    fn append(&mut self, e: &Event);
}

/// Where events people are told about go (`[notify]`: the `memwatch` crate's `notify::Outbox`). It
/// never waits.
pub trait Notify: Send {
    /// Offers an event; one that is no notice is ignored.
    fn offer(&self, e: &Event);
}

/// A sink that keeps nothing: a log in memory only.
#[derive(Debug, Default)]
pub struct NoSink;

impl EventSink for NoSink {
    fn append(&mut self, _: &Event) {}
}

/// The audit log: the newest events in memory (at most [`RECENT`]), each also handed to its sink.
pub struct Audit {
    recent: VecDeque<Event>,
    sink: Box<dyn EventSink>,
}

impl Audit {
    /// A log that starts with the newest of `loaded` (oldest first) and hands new events to `sink`.
    pub fn new(loaded: impl IntoIterator<Item = Event>, sink: Box<dyn EventSink>) -> Audit {
        let mut recent = VecDeque::new();
        for e in loaded {
            if recent.len() == RECENT {
                recent.pop_front();
            }
            recent.push_back(e);
        }
        Audit { recent, sink }
    }

    /// The newest events in memory, oldest first.
    pub fn recent(&self) -> impl Iterator<Item = &Event> {
        self.recent.iter()
    }

    /// Records an event: in memory at once, and through the sink.
    pub fn record(&mut self, e: Event) {
        self.sink.append(&e);
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn action_names_are_the_serialized_ones_and_parse_back() {
        let mut seen = std::collections::BTreeSet::new();
        for &a in Action::ALL {
            assert_eq!(serde_json::to_value(a).unwrap(), a.as_str());
            assert_eq!(Action::parse(a.as_str()), Some(a));
            assert!(seen.insert(a.as_str()), "{} twice", a.as_str());
        }
        assert_eq!(Action::parse("reboot"), None);
        // An events.jsonl line with an action this version does not know is skipped, not fatal.
        let line = r#"{"timestamp_ms":1,"action":"reboot","job":"","reason":"","detail":"","dry_run":false}"#;
        assert!(serde_json::from_str::<Event>(line).is_err());
    }

    /// docs/api.md's tables of actions and of reasons are `Action::table()` and `Reason::table()`,
    /// in its `/api/v1/events` section (one test, so that blessing writes the file once).
    #[test]
    fn the_api_docs_tables_of_actions_and_reasons_are_generated() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/api.md");
        let mut doc = std::fs::read_to_string(&path).unwrap();
        let section = doc
            .find("\n## `/api/v1/events`")
            .expect("docs/api.md has a /api/v1/events section");
        let mut drifted = Vec::new();
        for (header, table) in [
            ("\n| `action` | meaning |", Action::table()),
            ("\n| `reason` | with `action` | meaning |", Reason::table()),
        ] {
            let start = section
                + doc[section..]
                    .find(header)
                    .unwrap_or_else(|| panic!("the /api/v1/events section has a table {header:?}"))
                + 1;
            let len = doc[start..]
                .split_inclusive('\n')
                .take_while(|l| l.starts_with('|'))
                .map(str::len)
                .sum::<usize>();
            if doc[start..start + len] != table {
                drifted.push(header.trim());
                doc.replace_range(start..start + len, &table);
            }
        }
        if std::env::var_os("MEMWATCH_BLESS").is_some() {
            std::fs::write(&path, &doc).unwrap();
        } else {
            assert!(
                drifted.is_empty(),
                "docs/api.md's tables drifted ({drifted:?}): run `MEMWATCH_BLESS=1 cargo test -p memwatch-core api_docs`"
            );
        }
    }

    /// The list keeps the newest `RECENT`, loaded or recorded, and hands every recorded one (only
    /// those) to the sink.
    #[test]
    fn the_newest_are_kept_and_each_recorded_one_goes_to_the_sink() {
        use std::sync::{Arc, Mutex};
        struct Kept(Arc<Mutex<Vec<u64>>>);
        impl EventSink for Kept {
            fn append(&mut self, e: &Event) {
                self.0.lock().unwrap().push(e.timestamp_ms);
            }
        }
        let event = |t| Event {
            timestamp_ms: t,
            action: Action::Pause,
            job: "j".into(),
            slurm_job_id: None,
            reason: Reason::HostMemory,
            detail: String::new(),
            dry_run: false,
        };
        let kept = Arc::new(Mutex::new(Vec::new()));
        let loaded = (0..RECENT as u64 + 10).map(event);
        let mut a = Audit::new(loaded, Box::new(Kept(kept.clone())));
        assert_eq!(a.recent().count(), RECENT);
        assert_eq!(a.recent().next().unwrap().timestamp_ms, 10);
        a.record(event(9_999));
        assert_eq!(a.recent().count(), RECENT);
        assert_eq!(a.recent().next().unwrap().timestamp_ms, 11);
        assert_eq!(a.recent().last().unwrap().timestamp_ms, 9_999);
        assert_eq!(*kept.lock().unwrap(), [9_999]);
    }
}
