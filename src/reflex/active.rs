//! The v1 freezer kept active while a v1 freezer reflex is armed, so that the reflex's freeze is
//! never the kernel's first.
//!
//! cgroup v1's freezer turns the kernel's `freezer_active` static key on when a cgroup starts
//! freezing while none is, and off at the last thaw. Each turn patches the kernel's text on every
//! CPU, which waits for each of them: on the development machine (2 vCPUs) a freeze written that
//! way took 100 to 141 µs at the median and up to 0.56 ms, against about 2 µs while another cgroup
//! was frozen (`benches/freeze_first.rs`; BENCHMARKS.md). So while a v1 freezer reflex is armed
//! the daemon holds one empty freezer cgroup of its own frozen, `memwatch-freezer-active.PID` at
//! the hierarchy's root, and lets it go when none is armed. v2's `cgroup.freeze` turns no such key
//! (5 µs either way), so nothing is held for it.
//!
//! What holding costs: the kernel's `freezing()` checks (at a signal's delivery, in freezable
//! kernel threads) take their slow path, a few loads, while it is held. The cgroup holds no
//! process. One found in it when the reflex is armed is thawed with it, and nothing is held.
//! A daemon killed with it held leaves it frozen and empty; the next daemon lets it go at its start
//! ([`let_go_of_the_dead`]).

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// The name of a daemon's held cgroup, before its pid.
pub const PREFIX: &str = "memwatch-freezer-active.";

/// The v1 freezer hierarchy's root under `process_root`.
fn hierarchy(process_root: &Path) -> PathBuf {
    process_root.join("sys/fs/cgroup/freezer")
}

/// An empty v1 freezer cgroup held frozen: thawed and removed when dropped.
#[derive(Debug)]
pub struct Held {
    dir: PathBuf,
    state: std::fs::File,
}

impl Held {
    /// Makes this daemon's cgroup in the v1 freezer hierarchy under `process_root` and freezes it.
    /// An error where there is no such hierarchy (or it is a fixture's plain directory), where the
    /// daemon may not make it, or where it holds a process.
    pub fn hold(process_root: &Path) -> std::io::Result<Held> {
        let dir = hierarchy(process_root).join(format!("{PREFIX}{}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let state = dir.join("freezer.state");
        if !state.is_file() {
            // Not a cgroup: a directory the kernel gave no control files.
            let _ = std::fs::remove_dir(&dir);
            return Err(std::io::Error::other(format!(
                "{} is not a v1 freezer cgroup",
                dir.display()
            )));
        }
        let held = Held {
            state: crate::delegated::open_write(&state, false, 0)?,
            dir,
        };
        if !held.is_empty() {
            // Dropped: thawed and left (the removal fails while it has members).
            return Err(std::io::Error::other(format!(
                "{} holds a process",
                held.dir.display()
            )));
        }
        let mut state = &held.state;
        state.write_all(b"FROZEN")?;
        Ok(held)
    }

    /// The held cgroup's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether no process is in the cgroup (unread: not empty).
    fn is_empty(&self) -> bool {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .is_ok_and(|procs| procs.trim().is_empty())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut state = &self.state;
        let thawed = state.write_all(b"THAWED");
        if let Err(e) = thawed.and_then(|()| std::fs::remove_dir(&self.dir)) {
            tracing::debug!(cgroup = %self.dir.display(), error = %e, "the held freezer cgroup was not removed");
        }
    }
}

/// Whether `pid` is a process that runs under `process_root`'s /proc: not gone, and not a zombie
/// (a daemon killed under a parent that has not reaped it yet holds nothing any more).
fn alive(process_root: &Path, pid: u32) -> bool {
    match crate::proc::read_stat(process_root, pid) {
        Ok(s) => !matches!(s.state, 'Z' | 'X'),
        Err(e) => !e.is_gone(),
    }
}

/// Thaws and removes the cgroups held by daemons that are gone (killed while holding one, or a
/// zombie); those of a live daemon are left to it.
pub fn let_go_of_the_dead(process_root: &Path) {
    let Ok(entries) = std::fs::read_dir(hierarchy(process_root)) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || alive(process_root, pid) {
            continue;
        }
        let dir = entry.path();
        let thawed = std::fs::write(dir.join("freezer.state"), "THAWED");
        match thawed.and_then(|()| std::fs::remove_dir(&dir)) {
            Ok(()) => {
                tracing::info!(cgroup = %dir.display(), "let go of the freezer cgroup a daemon that is gone held")
            }
            Err(e) => {
                tracing::warn!(cgroup = %dir.display(), error = %e, "cannot let go of the freezer cgroup a daemon that is gone held")
            }
        }
    }
}
