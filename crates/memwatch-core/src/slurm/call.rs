//! A call memwatch makes to Slurm for a whole job, what Slurm did with it, and why it gave no answer
//! to go by. The host seam's driver makes these calls; the hold protocol ([`super::protocol`]) is
//! what they run.

/// How often a hold is written before memwatch gives up on it (another node wrote the comment in
/// between: its read, our write, its write).
pub const HOLD_TRIES: usize = 3;

/// A call memwatch makes to Slurm for a whole job, on every node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlurmCall {
    /// `scontrol suspend`.
    Suspend,
    /// `scontrol resume`.
    Resume,
    /// `scontrol requeue`.
    Requeue,
    /// `scancel`.
    Cancel,
    /// `scancel --full --signal=NAME` (a name such as "USR1").
    Signal(String),
    /// While this node holds the job: its state and holds read back (`scontrol show job`), this
    /// node's hold renewed, and the job suspended again if it was resumed behind this node's back.
    Hold,
    /// While Slurm holds the job suspended and this node does not: which nodes hold it (`scontrol
    /// show job`, read only).
    Holders,
}

/// What Slurm did with a call that went through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlurmAnswer {
    /// What was asked.
    Done,
    /// A resume that was not made: these other nodes still hold the job suspended. This node's
    /// hold is released.
    KeptBy(Vec<String>),
    /// A `Hold` found the job running and suspended it again.
    Resuspended,
    /// The nodes whose holds keep the job suspended now (a `Hold` that found it suspended, after
    /// renewing this node's; `Holders`).
    Holders(Vec<String>),
    /// A `Holders` read found every hold on the job's suspension run out (these nodes died holding
    /// it, or lost Slurm for longer than their hold counts): the holds were cleared and the job
    /// resumed.
    Orphaned(Vec<String>),
}

impl std::fmt::Display for SlurmCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SlurmCall::Suspend => f.write_str("scontrol suspend"),
            SlurmCall::Resume => f.write_str("scontrol resume"),
            SlurmCall::Requeue => f.write_str("scontrol requeue"),
            SlurmCall::Cancel => f.write_str("scancel"),
            SlurmCall::Signal(s) => write!(f, "scancel --signal={s}"),
            SlurmCall::Hold | SlurmCall::Holders => f.write_str("scontrol show job"),
        }
    }
}

/// Why a Slurm call gave no answer to go by: which command, and what Slurm (or the machine) said.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlurmError {
    /// The command could not run: nothing was done.
    #[error("cannot run `{command}`: {reason}")]
    Spawn {
        /// The command line.
        command: String,
        /// The OS's words.
        reason: String,
    },
    /// It ran and failed: nothing was done.
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        /// The command line.
        command: String,
        /// How it exited.
        status: String,
        /// What it said.
        stderr: String,
    },
    /// It did not finish in time and was killed: slurmctld may still have carried it out.
    #[error("`{command}` did not finish within {timeout_ms} ms")]
    Late {
        /// The command line.
        command: String,
        /// The timeout.
        timeout_ms: u64,
    },
    /// The job is in a state the call cannot act on.
    #[error("the job is {0}")]
    State(String),
    /// `scontrol show job` named no state.
    #[error("`scontrol show job` gave no JobState")]
    NoState,
    /// The call gave no answer, and the job's state read back is not what it asked for.
    #[error("{call}; {state}")]
    NotAsAsked {
        /// The call's own failure.
        call: Box<SlurmError>,
        /// What the read back found (the job's state, or no state).
        state: Box<SlurmError>,
    },
    /// The call gave no answer, and the job's state cannot be read back.
    #[error("{call}; the job's state cannot be read back: {read}")]
    Unreadable {
        /// The call's own failure.
        call: Box<SlurmError>,
        /// The read's.
        read: Box<SlurmError>,
    },
    /// The daemon's Slurm thread has too many calls queued: this one was not made.
    #[error("too many Slurm calls are waiting")]
    Busy,
    /// Other nodes kept rewriting the job's holds.
    #[error("the job's holds changed under every one of {HOLD_TRIES} writes")]
    HoldsRace,
}
