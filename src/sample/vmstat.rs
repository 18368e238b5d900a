//! /proc/vmstat's reader; the counters and their parser are the core's
//! (`memwatch_core::sample::vmstat`).

use std::path::Path;

use super::error::{ReadError, read_text};

pub use memwatch_core::sample::vmstat::{VmStat, parse};

/// Reads `<root>/proc/vmstat`.
pub fn read(root: &Path) -> Result<VmStat, ReadError> {
    let path = root.join("proc/vmstat");
    parse(&path, &read_text(&path)?)
}
