//! Process trees: an attached process and all its descendants, found fresh each time.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use super::{Stat, read_stat};

/// A snapshot of one process tree, root first, then breadth-first.
#[derive(Debug, Clone, Default)]
pub struct Tree {
    /// The processes, root first.
    pub procs: Vec<Stat>,
}

/// Children of `pid` from /proc/PID/task/*/children (Linux 3.5+ with CONFIG_PROC_CHILDREN).
pub(crate) fn children_files(root: &Path, pid: u32) -> Option<Vec<u32>> {
    let tasks = std::fs::read_dir(super::dir(root, pid).join("task")).ok()?;
    let mut out = Vec::new();
    let mut any = false;
    for t in tasks.flatten() {
        let Ok(text) = crate::sample::error::read_text(&t.path().join("children")) else {
            continue;
        };
        any = true;
        out.extend(pids_in(&text));
    }
    any.then_some(out)
}

/// The pids a `children` file lists.
fn pids_in(text: &str) -> impl Iterator<Item = u32> + '_ {
    text.split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
}

/// Children of `pid`, which had `threads` threads when its stat was read (and was not a zombie, whose
/// live threads would hold its children): a single-threaded process's are its main thread's, read
/// from that one file (one open and read instead of a listing of `task/` and a read per thread). A
/// thread started since then, and any child it forked, is missed here: the callers that must miss
/// nothing walk again with [`children_files`]. `None` as [`children_files`].
pub(crate) fn children_of(root: &Path, pid: u32, threads: u32) -> Option<Vec<u32>> {
    if threads == 1 {
        let path = super::dir(root, pid)
            .join("task")
            .join(pid.to_string())
            .join("children");
        if let Ok(text) = crate::sample::error::read_text(&path) {
            return Some(pids_in(&text).collect());
        }
    }
    children_files(root, pid)
}

/// All processes' parent links, from a full scan of /proc (the fallback when `children` files are absent).
pub(crate) fn parent_map(root: &Path) -> HashMap<u32, Vec<u32>> {
    let mut map: HashMap<u32, Vec<u32>> = HashMap::new();
    let Ok(entries) = std::fs::read_dir(root.join("proc")) else {
        return map;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Ok(s) = read_stat(root, pid) {
            map.entry(s.ppid).or_default().push(pid);
        }
    }
    map
}

/// The tree under `root_pid`, if the root still exists. Processes that vanish mid-walk are skipped; a
/// pid seen twice is kept once.
pub fn descendants(root: &Path, root_pid: u32) -> Option<Tree> {
    let first = read_stat(root, root_pid).ok()?;
    let mut seen: HashSet<u32> = HashSet::from([root_pid]);
    let mut procs = vec![first];
    let mut fallback: Option<HashMap<u32, Vec<u32>>> = None;
    let mut i = 0;
    while i < procs.len() {
        // A zombie leader's live threads hold its children: every thread's list is read then.
        let threads = if procs[i].state == 'Z' {
            0
        } else {
            procs[i].threads
        };
        let pid = procs[i].pid;
        let kids = match children_of(root, pid, threads) {
            Some(k) => k,
            None => fallback
                .get_or_insert_with(|| parent_map(root))
                .get(&pid)
                .cloned()
                .unwrap_or_default(),
        };
        for kid in kids {
            if seen.insert(kid) {
                if let Ok(s) = read_stat(root, kid) {
                    // Guard against a reused pid that is no longer our child.
                    if s.ppid == pid {
                        procs.push(s);
                    }
                }
            }
        }
        i += 1;
    }
    Some(Tree { procs })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn finds_real_children_and_grandchildren() {
        let mut child = Command::new("sh")
            .args(["-c", "sleep 30 & sleep 30 & wait"])
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut found = 0;
        for _ in 0..100 {
            found = descendants(Path::new("/"), pid)
                .map(|t| t.procs.len())
                .unwrap_or(0);
            if found == 3 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = Command::new("pkill")
            .args(["-P", &pid.to_string()])
            .status();
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(found, 3);
        assert!(descendants(Path::new("/"), u32::MAX - 1).is_none());
    }
}
