//! Why memwatch could not change a job's cgroup: its limit (a loan) or its systemd-oomd mark. Typed,
//! with the file or the cgroup it concerns, so the way out can say what failed where. The types are
//! the core's (the host seam's errors).

pub use memwatch_core::seam::{CgroupError, Errno};

/// The core's errno for rustix's.
pub fn errno(e: rustix::io::Errno) -> Errno {
    Errno(e.raw_os_error())
}
