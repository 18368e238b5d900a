//! The readers' error is the core's ([`ReadError`], naming the file); here, the read of a small
//! kernel file.

use std::path::Path;

pub use memwatch_core::sample::error::{ReadError, parse_u64};

/// The buffer a read starts with: /proc/PID/stat, status, a cgroup's files fit, so each is read in
/// one `read` and a second that finds the end (an empty buffer would start with a 32-byte probe and
/// grow by doubling: five reads for a 300-byte stat).
const FIRST_READ: usize = 4096;

/// Reads a small text file; kernel files are read whole. Only its first 1 MiB is read.
pub fn read_text(path: &Path) -> Result<String, ReadError> {
    use std::io::Read;
    let io = |source| ReadError::Io {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut bytes = Vec::with_capacity(FIRST_READ);
    file.take(1 << 20).read_to_end(&mut bytes).map_err(io)?;
    String::from_utf8(bytes)
        .map_err(|e| io(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
}
