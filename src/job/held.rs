//! What memwatch holds for a job, as records: a cgroup it froze, an emergency swap device, a limit it
//! lent, a Slurm job it suspended. Plain data, kept in the job, the state file and the API; `act`
//! does the work (its `impl` blocks for these types live there), so the job's model never imports
//! the code that acts.

use crate::sample::cgroup::Version;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// A cgroup memwatch froze, remembered so it can be thawed (also by a restarted daemon).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frozen {
    /// cgroup v1 (the freezer hierarchy) or v2 (cgroup.freeze).
    pub version: Version,
    /// The frozen cgroup's directory.
    pub dir: PathBuf,
}

/// One emergency swap device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// /dev/zramN, made through /sys/class/zram-control.
    Zram(u32),
    /// A swapfile memwatch created.
    File(PathBuf),
}

/// A recorded emergency swap device: for which job, and how big.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The device.
    pub device: Device,
    /// The job it was made for.
    pub job: String,
    /// Its size.
    pub bytes: u64,
}

/// A raised limit and what it was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Loan {
    /// The job the limit was raised for.
    pub job: String,
    /// The cgroup directory whose limit file was raised.
    pub dir: PathBuf,
    /// 1 or 2.
    pub version: Version,
    /// The limit before the loan (bytes).
    pub original: u64,
    /// The limit during the loan.
    pub raised: u64,
}

/// A job memwatch suspended through Slurm: what resumes it, also for a restarted daemon or the
/// guardian.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Suspended {
    /// The Slurm job's id.
    pub job_id: String,
    /// The commands that resume or requeue it.
    pub ctl: Slurmctl,
}

/// The scontrol and scancel calls memwatch makes, with their settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slurmctl {
    /// The scontrol program.
    pub scontrol: String,
    /// The scancel program.
    pub scancel: String,
    /// How long one call may run.
    pub timeout_ms: u64,
}
