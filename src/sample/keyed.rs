//! Flat keyed files of the memory cgroup: one number (memory.current, memory.usage_in_bytes), or
//! `key value` per line (memory.stat, memory.events, memory.oom_control), read whole or parsed from
//! text already read.

use std::path::Path;

use super::error::{ReadError, parse_u64, read_text};

pub use memwatch_core::sample::keyed::stat_values;

/// The one number in the file at `path`.
pub fn read_u64(path: &Path) -> Result<u64, ReadError> {
    let text = read_text(path)?;
    parse_u64(path, "value", &text)
}

/// Reads `key value` lines (memory.events, memory.oom_control, memory.stat) and returns `key`'s value.
pub fn key_value(path: &Path, key: &str) -> Result<Option<u64>, ReadError> {
    let text = read_text(path)?;
    for line in text.lines() {
        if let Some((k, v)) = line.split_once(' ') {
            if k == key {
                return parse_u64(path, key, v).map(Some);
            }
        }
    }
    Ok(None)
}

/// Several keys of one `key value` file, read once; a key the file lacks, or a file that cannot be
/// read, gives `None`.
pub fn key_values<const N: usize>(path: &Path, keys: [&str; N]) -> [Option<u64>; N] {
    match read_text(path) {
        Ok(text) => stat_values(path, &text, keys),
        Err(_) => [None; N],
    }
}
