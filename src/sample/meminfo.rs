//! /proc/meminfo's reader; the figures and their parser are the core's
//! (`memwatch_core::sample::meminfo`).

use std::path::Path;

use super::error::{ReadError, read_text};
use super::kept::KeptFile;

pub use memwatch_core::sample::meminfo::{MemInfo, parse};

/// Reads `<root>/proc/meminfo`.
pub fn read(root: &Path) -> Result<MemInfo, ReadError> {
    let path = root.join("proc/meminfo");
    parse(&path, &read_text(&path)?)
}

/// `<root>/proc/meminfo` kept open ([`KeptFile`]): the host probe's read, which runs every few
/// seconds with a job attached, opens nothing.
pub struct MeminfoFile(KeptFile);

impl MeminfoFile {
    /// Opens nothing yet: the first read does.
    pub fn new(root: &Path) -> Self {
        MeminfoFile(KeptFile::new(root.join("proc/meminfo")))
    }

    /// Reads and parses the file.
    pub fn read(&mut self) -> Result<MemInfo, ReadError> {
        let (path, text) = self.0.read()?;
        parse(path, text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kept_file_reads_the_kernels_meminfo_again_and_again() {
        let mut f = MeminfoFile::new(Path::new("/"));
        let once = read(Path::new("/")).unwrap();
        for _ in 0..3 {
            let again = f.read().unwrap();
            assert_eq!(again.total_bytes, once.total_bytes);
            assert!(again.available_bytes > 0 && again.available_bytes <= again.total_bytes);
        }
        assert!(f.0.is_open(), "kept open between reads");
    }

    #[test]
    fn a_fixture_file_is_read_afresh_each_time() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("proc")).unwrap();
        let write = |avail: u64| {
            let tmp = dir.path().join("proc/meminfo.new");
            std::fs::write(&tmp, format!("MemTotal: 1000 kB\nMemFree: 10 kB\nMemAvailable: {avail} kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n")).unwrap();
            std::fs::rename(&tmp, dir.path().join("proc/meminfo")).unwrap();
        };
        let mut f = MeminfoFile::new(dir.path());
        write(500);
        assert_eq!(f.read().unwrap().available_bytes, 500 * 1024);
        write(300);
        assert_eq!(f.read().unwrap().available_bytes, 300 * 1024);
        std::fs::remove_file(dir.path().join("proc/meminfo")).unwrap();
        let e = f.read().unwrap_err().to_string();
        assert!(e.contains("proc/meminfo"), "{e}");
    }
}
