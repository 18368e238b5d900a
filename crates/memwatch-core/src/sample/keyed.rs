//! `key value` per line files of the memory cgroup (memory.stat, memory.events,
//! memory.oom_control), parsed from text already read.

use std::path::Path;

use super::error::parse_u64;

/// The values of `keys` in `text`, a `key value` per line file such as memory.stat read from `path`
/// (kept open by memwatch's reflex); a key absent or unparsable is `None`.
pub fn stat_values<const N: usize>(path: &Path, text: &str, keys: [&str; N]) -> [Option<u64>; N] {
    let mut out = [None; N];
    for line in text.lines() {
        if let Some((k, v)) = line.split_once(' ') {
            if let Some(i) = keys.iter().position(|key| *key == k) {
                out[i] = parse_u64(path, k, v).ok();
            }
        }
    }
    out
}
