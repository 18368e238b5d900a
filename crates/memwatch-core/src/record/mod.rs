//! The state file's records (`state.json`): the attached jobs and the pauses memwatch holds, so that
//! a daemon that crashed or restarted, or the guardian, undoes or adopts what its predecessor left.
//! An on-disk format, versioned ([`VERSION`]); the file's writes are the `memwatch` crate's
//! (`act::persist`).

mod pause;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::host::ProcRef;

pub use pause::{HoldRecord, LineRecord, PersistedPause, PhaseRecord, VERSION};

/// The state file's name inside the runtime directory (`control.runtime_dir`).
pub const STATE_FILE: &str = "state.json";

/// The state file could not be read or does not parse: which file, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct StateReadError {
    /// The state file.
    pub path: PathBuf,
    /// The OS's or the parser's words (with the line and column).
    pub reason: String,
}

/// The state file could not be written: whatever was to be recorded ahead of an act does not go
/// ahead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot write {path}: {reason}")]
pub struct StateWriteError {
    /// The state file.
    pub path: PathBuf,
    /// The OS's words.
    pub reason: String,
}

/// One attached job as the state file keeps it, for a restarted daemon to adopt again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PersistedJob {
    /// The job's name.
    pub name: String,
    /// Its root process (pid and start time, so a reused pid is not taken for it).
    pub root: ProcRef,
    /// The uid that owns the job: the only one besides root that may act on it.
    pub owner_uid: u32,
    /// When it was attached (engine clock, ms).
    pub attached_at_ms: u64,
    /// The pause memwatch holds on it, if any.
    pub paused: Option<PersistedPause>,
    /// Its managed training config, if one was given.
    #[serde(default)]
    pub config: Option<crate::adapt::JobConfig>,
    /// Started by `memwatch launch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch: Option<crate::job::Launched>,
    /// Its way out, with the room memwatch holds for it (a lent limit is settled from here after a
    /// crash).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub way_out: Option<crate::way_out::WayOut>,
    /// Attached by Slurm job id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<String>,
}

/// The state file (`state.json`): what a restarted daemon or the guardian needs to undo or adopt.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Persisted {
    /// The file format's version.
    pub version: u32,
    /// Every attached job.
    pub jobs: Vec<PersistedJob>,
    /// The engine clock's anchor and the boot it belongs to (see `clock`).
    #[serde(default)]
    pub clock: Option<ClockAnchor>,
    /// Limits memwatch raised for jobs that ended, not yet put back (usage did not fit yet).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub loans: Vec<crate::held::Loan>,
}

/// The engine clock's anchor for one boot, so that a restarted daemon's clock goes on where the
/// last one left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockAnchor {
    /// `/proc/sys/kernel/random/boot_id` of the boot the anchor belongs to.
    pub boot_id: String,
    /// Engine time (ms) at boot time 0.
    pub anchor_ms: u64,
}

/// Where the engine writes the state file ahead of every act it describes (the `memwatch` crate's
/// `act::persist::StateWriter`). A write has happened, visible to a successor and to the guardian,
/// when `write` returns.
pub trait StateStore: Send {
    /// Writes `state` if it differs from what was last written. An error means nothing was
    /// recorded.
    fn write(&mut self, state: &Persisted) -> std::io::Result<()>;
    /// Forgets what was written, so the next `write` writes (after another process changed the
    /// file).
    fn invalidate(&mut self);
}
