//! How the core names what it never touches on the host: a process by its pid and start time, a
//! cgroup hierarchy by its version, a process pinned by a pidfd as an opaque handle. `memwatch::proc` and `memwatch::sample::cgroup` read them from
//! /proc and cgroupfs and re-export them; the seam through which the engine reads and acts is
//! [`crate::seam`].

use serde::{Deserialize, Serialize};

mod pinned;

pub use pinned::{Pinned, pinned_open};

/// A process that cannot be confused with a later one that reuses its pid: pid plus start time
/// (clock ticks after boot, field 22 of /proc/PID/stat).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProcRef {
    /// The process id.
    pub pid: u32,
    /// Its start time, clock ticks after boot.
    pub start_time: u64,
}

/// A cgroup hierarchy's version: where its files are and what they are called. Serialized as the
/// number (1 or 2), in the API and in the state file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(into = "u8", try_from = "u8")]
pub enum Version {
    /// cgroup v1: one hierarchy per controller (`memory/`, `freezer/`).
    V1,
    /// cgroup v2: the unified hierarchy.
    V2,
}

impl From<Version> for u8 {
    fn from(v: Version) -> u8 {
        match v {
            Version::V1 => 1,
            Version::V2 => 2,
        }
    }
}

/// A cgroup version that is neither 1 nor 2 (in a state file, say).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cgroup version {0} is neither 1 nor 2")]
pub struct UnknownVersion(pub u8);

impl TryFrom<u8> for Version {
    type Error = UnknownVersion;
    fn try_from(n: u8) -> Result<Self, UnknownVersion> {
        match n {
            1 => Ok(Version::V1),
            2 => Ok(Version::V2),
            _ => Err(UnknownVersion(n)),
        }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", u8::from(*self))
    }
}

/// An OS error number (errno), shown in the OS's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    /// EIO: what an error with no number stands for.
    pub const IO: Errno = Errno(5);

    /// The number of `e`, else [`Errno::IO`].
    pub fn of(e: &std::io::Error) -> Errno {
        e.raw_os_error().map_or(Errno::IO, Errno)
    }
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::io::Error::from_raw_os_error(self.0).fmt(f)
    }
}
