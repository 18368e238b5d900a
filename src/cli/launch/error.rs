//! Why `memwatch launch` cannot place or start the job: the path, unit or call, and what went wrong.

use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

/// Why the job cannot be put in its cgroup or scope, or made ready to start.
#[derive(Debug, thiserror::Error)]
pub(super) enum LaunchError {
    /// `--memory-max` inside a Slurm allocation, where Slurm's `--mem` is the limit.
    #[error("inside Slurm job {0}, Slurm's --mem sets the limit: leave out --memory-max")]
    MemoryMaxInSlurm(String),
    /// The Slurm job named by the environment has no cgroup on this node.
    #[error("Slurm job {0} has no cgroup on this node")]
    NoSlurmCgroup(String),
    /// The job's own cgroup could not be made.
    #[error("cannot create the job's cgroup {}: {source} (run as root, or in a delegated cgroup)", dir.display())]
    CreateCgroup {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Neither cgroup v2 with the memory controller nor v1's memory hierarchy is mounted.
    #[error("no memory cgroup controller to put the job in")]
    NoMemoryController,
    /// `--memory-max` could not be written.
    #[error("cannot set {}: {source}", file.display())]
    SetLimit {
        /// The limit's file.
        file: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A program, argument, variable or path holds a NUL byte, which exec cannot pass.
    #[error("{0}: a NUL byte")]
    NulByte(String),
    /// The program is not on PATH.
    #[error("{0}: not found on PATH")]
    NotOnPath(String),
    /// busctl could not be run or waited for.
    #[error("cannot run busctl to ask systemd for a scope: {0}")]
    Busctl(std::io::Error),
    /// systemd refused the scope.
    #[error("systemd would not start the job's scope ({status}): {stderr} [{call}]")]
    ScopeRefused {
        /// busctl's exit status.
        status: ExitStatus,
        /// What busctl printed.
        stderr: String,
        /// The call, as a command line.
        call: String,
    },
    /// systemd did not answer in time.
    #[error("systemd did not answer within {after:?} [{call}]")]
    ScopeLate {
        /// How long it was given.
        after: Duration,
        /// The call, as a command line.
        call: String,
    },
    /// systemd started the scope but the job never appeared in it.
    #[error("the job never appeared in its scope {unit} (its cgroup: {cgroup})")]
    NotInScope {
        /// The scope's unit name.
        unit: String,
        /// The job's /proc/PID/cgroup.
        cgroup: String,
    },
}
