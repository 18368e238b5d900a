//! Why `memwatch launch` cannot place or start the job: the path, unit or call, and what went wrong.

use std::path::PathBuf;
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
    /// The runtime that talks to systemd could not be made.
    #[error("cannot start the runtime that asks systemd for a scope: {0}")]
    Runtime(std::io::Error),
    /// Neither the manager's bus nor its private socket answered.
    #[error("cannot reach systemd to start the job's scope (tried {tried}): {advice}")]
    NoManager {
        /// Each way tried and why it failed.
        tried: String,
        /// What to do.
        advice: &'static str,
    },
    /// systemd refused the scope.
    #[error("systemd would not start the job's scope {unit} (asked over {via}): {error}: {detail}")]
    ScopeRefused {
        /// The scope's unit name.
        unit: String,
        /// The D-Bus error's name (`org.freedesktop.systemd1.UnitExists`, …).
        error: String,
        /// systemd's message.
        detail: String,
        /// How the manager was reached.
        via: String,
    },
    /// The call failed below systemd (the connection, the message).
    #[error("asking systemd for the job's scope {unit} over {via} failed: {error}")]
    Bus {
        /// The scope's unit name.
        unit: String,
        /// How the manager was reached.
        via: String,
        /// What went wrong.
        error: String,
    },
    /// systemd did not answer in time.
    #[error("systemd did not start the job's scope {unit} within {after:?} (asked over {via})")]
    ScopeLate {
        /// How long it was given.
        after: Duration,
        /// The scope's unit name.
        unit: String,
        /// How the manager was reached.
        via: String,
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
