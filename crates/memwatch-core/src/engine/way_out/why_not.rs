//! Why a step of the way out is skipped: one typed reason per case, matched by tests and shown to
//! people ("skipped: …" in the job's way-out record and its event) through its `Display`.

use std::path::PathBuf;

use crate::seam::CgroupError;

/// Why the job's cgroup forbids swap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoSwap {
    /// v1: `memory.swappiness` 0.
    Swappiness,
    /// v1: a memory+swap limit no higher than the memory limit.
    MemswLimit,
    /// v2: `memory.swap.max` 0.
    SwapMax,
}

impl std::fmt::Display for NoSwap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NoSwap::Swappiness => "memory.swappiness is 0",
            NoSwap::MemswLimit => "memory.memsw.limit_in_bytes leaves no room for swap",
            NoSwap::SwapMax => "memory.swap.max is 0",
        })
    }
}

/// Why a step (emergency swap, a lent limit, the checkpoint) is not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WhyNot {
    /// The job is gone.
    #[error("gone")]
    Gone,
    /// No config file: no fix to apply.
    #[error("the job was attached without a config file, so no fix can be applied now")]
    NoConfig,
    /// The trainer takes no directives.
    #[error("its trainer does not take directives (it neither attached itself nor asked for any)")]
    NoDirectives,
    /// Nothing is staged.
    #[error("no change is staged for it (the knobs are at their bounds)")]
    NothingStaged,
    /// The cgroup forbids swap.
    #[error("the job's cgroup forbids swap ({dir}: {why})")]
    SwapForbidden {
        /// The cgroup's directory.
        dir: PathBuf,
        /// Which setting.
        why: NoSwap,
    },
    /// Too little RAM left to back swap.
    #[error("the host has {available_mib} MiB available, too little to back swap")]
    TooLittleForSwap {
        /// What the host has available (MiB).
        available_mib: u64,
    },
    /// Lending is not allowed for the job.
    #[error("not allowed (way_out.lend, or memwatch launch --lend)")]
    LendNotAllowed,
    /// The host ran out, not the job's cgroup: a loan would not help.
    #[error("the host ran out, not the job's cgroup")]
    HostRanOut,
    /// The job has no memory cgroup.
    #[error("the job has no memory cgroup")]
    NoCgroup,
    /// The cgroup's limit is not its own (inherited, or none).
    #[error("{0} has no limit of its own for memwatch to raise")]
    NoOwnLimit(PathBuf),
    /// No host memory reading yet.
    #[error("the host's memory is unknown")]
    HostUnknown,
    /// The host cannot spare the room.
    #[error("the host can spare {spare_mib} MiB, not the {needed_mib} MiB needed")]
    CannotSpare {
        /// What the host can spare above its warn level (MiB).
        spare_mib: u64,
        /// What the job needs (MiB).
        needed_mib: u64,
    },
    /// The loan could not be written ahead to the state file.
    #[error("the loan could not be recorded ({0})")]
    NotRecorded(crate::record::StateWriteError),
    /// Raising the limit failed.
    #[error(transparent)]
    Limit(#[from] CgroupError),
    /// No fix, and no held memory of its own to push out (no memory cgroup, or little in it).
    #[error("{no_fix}, and the job has no memory of its own cgroup to push out to swap")]
    NothingToReclaim {
        /// Why no fix applies.
        no_fix: Box<WhyNot>,
    },
    /// No fix, and nowhere to push the held job's memory out to.
    #[error(
        "{no_fix}, and its memory has nowhere to go: the host's swap has {free_mib} MiB free, and neither zram (way_out.zram, /sys/class/zram-control) nor way_out.swapfile_dir can make more"
    )]
    NoSwapTarget {
        /// Why no fix applies.
        no_fix: Box<WhyNot>,
        /// The host's free swap (MiB).
        free_mib: u64,
    },
    /// The emergency swap made for an earlier push has no room for another.
    #[error("its emergency swap {0} has too little room left for another push")]
    SwapUsedUp(String),
    /// Nothing would save or restart the job.
    #[error(
        "nothing would save or restart the job (no trainer asking for directives, no policy.checkpoint_signal, not started by memwatch launch, not a Slurm job with slurm.requeue)"
    )]
    NothingRestarts,
}
