//! /proc/pressure/{memory,cpu,io}'s reader; the figures and their parser are the core's
//! (`memwatch_core::sample::psi`).
//!
//! Where the kernel has no PSI the file is missing and the reader says so with `Ok(None)`: the series
//! are then absent, never zeros.

use std::path::Path;

use super::error::{ReadError, read_text};
use super::kept::KeptFile;

pub use memwatch_core::sample::psi::{Pressure, Psi, PsiLine, RESOURCES, parse};

/// Reads `<root>/proc/pressure/<resource>`; `Ok(None)` when the kernel has no PSI.
pub fn read(root: &Path, resource: &str) -> Result<Option<Psi>, ReadError> {
    let path = root.join("proc/pressure").join(resource);
    absent_is_none(read_text(&path).and_then(|text| parse(&path, &text)))
}

/// Reads a pressure file kept open ([`KeptFile`]); `Ok(None)` when the kernel has no PSI.
pub fn read_kept(file: &mut KeptFile) -> Result<Option<Psi>, ReadError> {
    absent_is_none(file.read().and_then(|(path, text)| parse(path, text)))
}

/// A pressure file that is not there, or that the kernel refuses to read, is no PSI.
fn absent_is_none(read: Result<Psi, ReadError>) -> Result<Option<Psi>, ReadError> {
    match read {
        Ok(psi) => Ok(Some(psi)),
        Err(e) if e.is_not_found() => Ok(None),
        // Some kernels have the files but refuse reads when PSI is disabled at boot (psi=0).
        Err(ReadError::Io { source, .. })
            if source.raw_os_error() == Some(nix::libc::EOPNOTSUPP) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_file_means_absent() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path(), "memory").unwrap(), None);
    }
}
