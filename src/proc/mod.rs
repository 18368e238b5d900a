//! Reading processes from `<root>/proc`: identity (pid + start time), owner, memory, and process trees.
//!
//! Like the host readers, everything takes a root path. The parsers are the core's
//! (`memwatch_core::proc`).

pub mod neighbours;
pub mod pinned;
mod tree;

use std::path::{Path, PathBuf};

use crate::sample::error::{ReadError, read_text};

pub use tree::{Tree, descendants};
pub(crate) use tree::{children_files, children_of, parent_map};

pub use memwatch_core::host::ProcRef;
pub use memwatch_core::proc::{Memory, Stat, Status, parse_rollup, parse_stat, parse_status};

/// The process directory of `pid` under `root`.
pub fn dir(root: &Path, pid: u32) -> PathBuf {
    root.join("proc").join(pid.to_string())
}

/// Reads /proc/PID/stat under `root`.
pub fn read_stat(root: &Path, pid: u32) -> Result<Stat, ReadError> {
    let path = dir(root, pid).join("stat");
    parse_stat(&path, &read_text(&path)?)
}

/// Reads /proc/PID/status under `root`.
pub fn read_status(root: &Path, pid: u32) -> Result<Status, ReadError> {
    let path = dir(root, pid).join("status");
    parse_status(&path, &read_text(&path)?)
}

/// Reads /proc/PID/smaps_rollup (Linux 4.14+).
pub fn read_memory(root: &Path, pid: u32) -> Result<Memory, ReadError> {
    let path = dir(root, pid).join("smaps_rollup");
    parse_rollup(&path, &read_text(&path)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        let s = read_stat(Path::new("/"), me).unwrap();
        assert_eq!(s.pid, me);
        assert!(!s.is_kernel_thread());
        assert!(read_memory(Path::new("/"), me).unwrap().rss_bytes > 0);
    }
}
