//! Why memwatch could not change a job's cgroup: its limit (a loan) or its systemd-oomd mark. Typed,
//! with the file or the cgroup it concerns, so the way out can say what failed where.

use std::path::PathBuf;

use rustix::io::Errno;

use super::systemd::CallError;

/// A cgroup change that failed. Nothing was changed by the call that failed.
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
}

impl CgroupError {
    /// The error for writing `path`.
    pub fn write(path: PathBuf, e: &std::io::Error) -> CgroupError {
        CgroupError::Write {
            path,
            errno: Errno::from_io_error(e).unwrap_or(Errno::IO),
        }
    }
}

impl From<CallError> for CgroupError {
    fn from(e: CallError) -> Self {
        CgroupError::Systemd(e)
    }
}
