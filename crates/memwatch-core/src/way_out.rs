//! A paused job's way out, as memwatch goes down the ladder: where it is, what it tried, and the room it
//! holds for the job (emergency swap, a lent limit) until the job fits again.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::config::Step;
use crate::held::{self as swap, Loan};

/// Where a job is on the ladder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Emergency swap is being made (off the owner task).
    MakingSwap,
    /// The paused job's memory is being pushed out to swap while it is held (off the owner task).
    Reclaiming,
    /// Resumed with emergency room: the trainer applies the urgent fix.
    Fixing,
    /// The fix held: the room is given back once RAM can take it.
    Clearing,
    /// A checkpoint was asked for; the job is stopped when it is saved or the grace is over.
    Checkpointing,
    /// Being stopped cleanly (SIGTERM to every process, SIGKILL after a grace).
    Stopping,
    /// No step applied: the job is stopped at the maximum pause (or stays, if so configured).
    NoWayOut,
    /// The job fits again and the room is given back.
    Done,
}

impl Phase {
    /// Every phase, in ladder order.
    pub const ALL: [Phase; 8] = [
        Phase::MakingSwap,
        Phase::Reclaiming,
        Phase::Fixing,
        Phase::Clearing,
        Phase::Checkpointing,
        Phase::Stopping,
        Phase::NoWayOut,
        Phase::Done,
    ];

    /// The name the API, the events and the metrics use (as serialized).
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::MakingSwap => "making_swap",
            Phase::Reclaiming => "reclaiming",
            Phase::Fixing => "fixing",
            Phase::Clearing => "clearing",
            Phase::Checkpointing => "checkpointing",
            Phase::Stopping => "stopping",
            Phase::NoWayOut => "no_way_out",
            Phase::Done => "done",
        }
    }
}

/// One step taken (or skipped), for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Taken {
    /// The step: swap, lend, checkpoint, fix, room.
    pub step: String,
    /// When (engine clock, ms).
    pub at_ms: u64,
    /// What happened, for people.
    pub outcome: String,
}

/// A job's way out of a memory pause.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WayOut {
    /// When the ladder began (engine clock, ms).
    pub started_ms: u64,
    /// The limit that ran out ("cgroup" or "host" in the record).
    pub limit: crate::policy::LimitKind,
    /// What the job would add while its fix comes (growth at the pause × `fix_seconds`).
    pub shortfall_bytes: u64,
    /// The growth rate at the pause (bytes/s).
    pub rate: f64,
    /// Where the job is on the ladder.
    pub phase: Phase,
    /// Since when (engine clock, ms).
    pub phase_since_ms: u64,
    /// The steps still to try, in order.
    pub remaining: Vec<Step>,
    /// The step being taken.
    pub step: Option<Step>,
    /// What was tried, oldest first.
    pub taken: Vec<Taken>,
    /// Emergency swap made for the job.
    pub swap: Option<swap::Record>,
    /// The most of the emergency swap in use at once, as seen on the way out's turns.
    #[serde(default)]
    pub swap_peak_bytes: u64,
    /// A swap made or cleared off the owner task is not back yet.
    #[serde(default)]
    pub swap_busy: bool,
    /// The job's cgroup limit memwatch raised.
    pub loan: Option<Loan>,
    /// The urgent directive the job was resumed to apply.
    pub fix_generation: Option<u64>,
    /// What was pushed out to swap of the job's memory while it was held, over this way out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaimed: Option<Reclaimed>,
    /// How many times its held memory was pushed out in this way out.
    #[serde(default)]
    pub pushes: u32,
    /// What those pushes moved, in all (bytes).
    #[serde(default)]
    pub pushed_bytes: u64,
}

/// A held job's memory pushed out to swap (`memory.reclaim` on cgroup v2, `memory.force_empty` on
/// v1), as measured around the push.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reclaimed {
    /// How: "memory.reclaim" or "memory.force_empty".
    pub how: String,
    /// The cgroup's usage before and after (bytes).
    pub usage_before: u64,
    /// After.
    pub usage_after: u64,
    /// What the cgroup had in swap after (bytes).
    pub swap_after: u64,
    /// How long the push took (ms).
    pub ms: u64,
    /// The cgroup's `workingset_refault_anon` right after: its refaults since are counted from it.
    pub refaults_at: Option<u64>,
}

impl Reclaimed {
    /// What moved out (bytes).
    pub fn moved(&self) -> u64 {
        self.usage_before.saturating_sub(self.usage_after)
    }
}

impl WayOut {
    /// Whether memwatch holds room for the job (which must be given back).
    pub fn holds_room(&self) -> bool {
        self.swap.is_some() || self.loan.is_some() || self.swap_busy
    }

    /// The account so far, one line.
    pub fn account(&self) -> String {
        self.taken
            .iter()
            .map(|t| format!("{}: {}", t.step, t.outcome))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// How emergency swap may be made.
#[derive(Debug, Clone)]
pub struct SwapPlan {
    /// The root under which /sys, /proc and /dev are (the process root).
    pub root: PathBuf,
    /// Where a record of each swap device is written before it exists (so a successor can clear
    /// it).
    pub state_dir: PathBuf,
    /// Whether to use zram where the kernel has it.
    pub zram: bool,
    /// A directory on a local disk for a swapfile, if any.
    pub swapfile_dir: Option<PathBuf>,
}

/// Why emergency swap could not be made or removed: what, and where (the file, the directory, the
/// tool). What was made half-way is undone before it is returned.
#[derive(Debug, thiserror::Error)]
pub enum SwapError {
    /// zram is wanted but the kernel has no zram-control, and no swapfile directory is set.
    #[error("no zram ({0} is missing) and no way_out.swapfile_dir")]
    NoZram(PathBuf),
    /// zram is off and no swapfile directory is set.
    #[error("zram is off and there is no way_out.swapfile_dir")]
    Nowhere,
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS's error.
        #[source]
        source: std::io::Error,
    },
    /// zram's hot_add gave no device number.
    #[error("{path}: not a device number: {text:?}")]
    NotADevice {
        /// The hot_add file.
        path: PathBuf,
        /// What it held.
        text: String,
    },
    /// The swapfile directory cannot be asked about.
    #[error("{dir}: {errno}")]
    Statfs {
        /// The directory.
        dir: PathBuf,
        /// The OS's error.
        errno: crate::host::Errno,
    },
    /// The swapfile directory is not on a local disk.
    #[error("{dir} is on {fs}, not a local disk: no swapfile there")]
    NotLocal {
        /// The directory.
        dir: PathBuf,
        /// Its filesystem.
        fs: &'static str,
    },
    /// The swapfile directory's disk has too little room.
    #[error(
        "{dir} has {free_mib} MiB free, too little for {want_mib} MiB of swap and 1 GiB to spare"
    )]
    TooLittleDisk {
        /// The directory.
        dir: PathBuf,
        /// Free on its disk (MiB).
        free_mib: u64,
        /// The swap wanted (MiB).
        want_mib: u64,
    },
    /// The swapfile could not be allocated.
    #[error("{path}: cannot allocate {bytes} bytes: {errno}")]
    Allocate {
        /// The swapfile.
        path: PathBuf,
        /// Its size.
        bytes: u64,
        /// The OS's error.
        errno: crate::host::Errno,
    },
    /// mkswap, swapon or swapoff could not be started.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The tool.
        program: PathBuf,
        /// The OS's error.
        #[source]
        source: std::io::Error,
    },
    /// mkswap, swapon or swapoff failed.
    #[error("{program} {args} failed ({status}): {stderr}")]
    Failed {
        /// The tool.
        program: PathBuf,
        /// Its arguments.
        args: String,
        /// How it exited.
        status: std::process::ExitStatus,
        /// What it said.
        stderr: String,
    },
    /// The device's record could not be encoded.
    #[error("cannot encode the swap record: {0}")]
    Encode(#[from] serde_json::Error),
}

#[cfg(test)]
mod tests {
    use super::Phase;

    #[test]
    fn phase_names_are_the_serialized_ones() {
        for p in Phase::ALL {
            assert_eq!(serde_json::to_value(p).unwrap(), p.as_str());
        }
    }
}
