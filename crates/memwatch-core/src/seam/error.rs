//! The errors of the host seam: why a signal, a Slurm call or a cgroup change did not happen, each
//! saying what and where (the pid, the command, the file), as data a caller can match.

use std::path::PathBuf;

use crate::host::Errno;

/// Why a signal was not delivered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignalError {
    /// The process exited, or its pid now belongs to another process.
    #[error("process {0} is gone (exited, or its pid now belongs to another process)")]
    Gone(u32),
    /// The kernel refused (EPERM).
    #[error("not permitted to signal process {0}")]
    Denied(u32),
    /// Anything else, with the OS's words.
    #[error("signalling process {pid} failed: {reason}")]
    Other {
        /// The process.
        pid: u32,
        /// The OS's words.
        reason: String,
    },
}

/// What came of a call the manager refused or never answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The manager has no such unit loaded (a transient unit that ended is gone).
    NoUnit(String),
    /// Anything else: busctl's words, with the call.
    Failed(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::NoUnit(s) | CallError::Failed(s) => f.write_str(s),
        }
    }
}

/// A cgroup change that failed: a limit (a loan) or a systemd-oomd mark. Nothing was changed by the
/// call that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CgroupError {
    /// Writing a cgroup file (a limit) failed.
    #[error("{path}: {errno}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS's error.
        errno: Errno,
    },
    /// Reading, setting or removing an extended attribute failed.
    #[error("{dir} ({attr}): {errno}")]
    Xattr {
        /// The cgroup's directory.
        dir: PathBuf,
        /// The attribute, with the value written where one was.
        attr: &'static str,
        /// The OS's error.
        errno: Errno,
    },
    /// The unit's manager refused or did not answer (a unit's limit goes through systemd).
    #[error("{0}")]
    Systemd(CallError),
    /// The cgroup's freezer was already asked to freeze by someone else (`docker pause`, `podman
    /// pause`, a person): memwatch leaves it alone, neither freezing it as its own nor thawing it.
    #[error("{}: already frozen by someone else (a container engine's pause?); memwatch leaves that freeze alone", dir.display())]
    FrozenByAnother {
        /// The cgroup's directory.
        dir: PathBuf,
    },
}

impl CgroupError {
    /// The error for writing `path`.
    pub fn write(path: PathBuf, e: &std::io::Error) -> CgroupError {
        CgroupError::Write {
            path,
            errno: Errno::of(e),
        }
    }
}

impl From<CallError> for CgroupError {
    fn from(e: CallError) -> Self {
        CgroupError::Systemd(e)
    }
}
