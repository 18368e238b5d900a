//! The readers' error is the core's ([`ReadError`], naming the file); here, the read of a small
//! kernel file.

use std::path::Path;

pub use memwatch_core::sample::error::{ReadError, parse_u64};

/// Reads a small text file; kernel files are read whole. Anything over 1 MiB is refused.
pub fn read_text(path: &Path) -> Result<String, ReadError> {
    use std::io::Read;
    let io = |source| ReadError::Io {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut text = String::new();
    file.take(1 << 20).read_to_string(&mut text).map_err(io)?;
    Ok(text)
}
