//! The cgroup freezer, used instead of SIGSTOP when the job owns its cgroup: one write freezes every
//! process at once (no worker can slip through between signals), and the job's parent sees no stop.
//!
//! A job owns a cgroup when it is not a hierarchy's root, every process in it (and in its children)
//! belongs to the job's tree, and memwatch itself is not among them. cgroup v2 (`cgroup.freeze`,
//! confirmed by `cgroup.events`) is preferred; the v1 freezer controller (`freezer.state`) otherwise.

use crate::sample::cgroup::Version;
use std::path::Path;
use std::time::{Duration, Instant};

pub use crate::job::held::Frozen;
use crate::sample::cgroup::pids_below;
use crate::sample::error::read_text;

/// How long a freeze may take to settle before memwatch falls back to signals.
pub const SETTLE: Duration = Duration::from_millis(500);
/// How long the owner task watches a freeze settle before it hands the wait to another thread.
const SETTLE_INLINE: Duration = Duration::from_millis(3);

/// The cgroup the job of user `owner` owns, if any: `tree` is the job's pids, root first.
pub fn owned(root: &Path, tree: &[u32], owner: u32) -> Option<Frozen> {
    let first = *tree.first()?;
    let path = root.join("proc").join(first.to_string()).join("cgroup");
    let m = crate::sample::cgroup::parse_membership(&path, &read_text(&path).ok()?).ok()?;
    let me = std::process::id();
    let mut candidates = Vec::new();
    let own = |cg: &Option<String>| {
        cg.as_deref()
            .filter(|cg| *cg != "/")
            .map(|cg| cg.trim_start_matches('/').to_owned())
    };
    if let Some(rel) = own(&m.v2) {
        for mount in ["sys/fs/cgroup/unified", "sys/fs/cgroup"] {
            let dir = root.join(mount).join(&rel);
            if dir.join("cgroup.freeze").is_file() {
                candidates.push(Frozen {
                    version: Version::V2,
                    dir,
                });
                break;
            }
        }
    }
    if let Some(rel) = own(&m.v1_freezer) {
        let dir = root.join("sys/fs/cgroup/freezer").join(rel);
        if dir.join("freezer.state").is_file() {
            candidates.push(Frozen {
                version: Version::V1,
                dir,
            });
        }
    }
    candidates.sort_by_key(|f| std::cmp::Reverse(f.version));
    candidates.into_iter().find(|f| {
        let mut pids = Vec::new();
        pids_below(&f.dir, &mut pids)
            && !pids.is_empty()
            && !pids.contains(&me)
            && pids.iter().all(|p| tree.contains(p))
            && pids
                .iter()
                .all(|p| super::signal::owner_may_signal(root, *p, owner))
    })
}

/// The freezer's work on a frozen cgroup's record (`job::held::Frozen`, plain data in memwatch-core):
/// reading its members, writing its freezer file, waiting for it to settle.
pub trait Freezing {
    /// The pids in the cgroup and its children now (empty when it cannot be read).
    fn members(&self) -> Vec<u32>;

    /// Whether every process in the cgroup could be signalled by `owner` now (checked again just
    /// before a freeze: a process may have become root since the last full sample).
    fn within_reach(&self, root: &Path, owner: u32) -> bool;

    /// Asks the kernel to freeze the cgroup and watches it settle for a few milliseconds (a freeze
    /// usually settles in microseconds). `Ok(true)`: frozen. `Ok(false)`: still freezing; the caller
    /// finishes the wait off its own thread with [`Freezing::settled_within`].
    fn freeze(&self) -> std::io::Result<bool>;

    /// Waits up to `wait` for the freeze to take; `false` if it did not.
    fn settled_within(&self, wait: Duration) -> bool;

    /// Thaws the cgroup; a cgroup that is gone is nothing to thaw.
    fn thaw(&self) -> std::io::Result<()>;
}

impl Freezing for Frozen {
    fn members(&self) -> Vec<u32> {
        let mut pids = Vec::new();
        pids_below(&self.dir, &mut pids);
        pids
    }

    fn within_reach(&self, root: &Path, owner: u32) -> bool {
        if owner == 0 {
            return true;
        }
        let mut pids = Vec::new();
        pids_below(&self.dir, &mut pids)
            && pids
                .iter()
                .all(|p| super::signal::owner_may_signal(root, *p, owner))
    }

    fn freeze(&self) -> std::io::Result<bool> {
        write(self, true)?;
        Ok(self.settled_within(SETTLE_INLINE))
    }

    fn settled_within(&self, wait: Duration) -> bool {
        let start = Instant::now();
        loop {
            if is_frozen(self) {
                return true;
            }
            if start.elapsed() >= wait {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    fn thaw(&self) -> std::io::Result<()> {
        match write(self, false) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }
}

fn is_frozen(cgroup: &Frozen) -> bool {
    match cgroup.version {
        Version::V2 => read_text(&cgroup.dir.join("cgroup.events"))
            .is_ok_and(|t| t.lines().any(|l| l.trim() == "frozen 1")),
        Version::V1 => {
            read_text(&cgroup.dir.join("freezer.state")).is_ok_and(|t| t.trim() == "FROZEN")
        }
    }
}

/// The freezer's file in a cgroup of `version`, and what is written there to freeze (or thaw) it.
pub fn state_file(version: Version, freeze: bool) -> (&'static str, &'static str) {
    match version {
        Version::V2 => ("cgroup.freeze", if freeze { "1" } else { "0" }),
        Version::V1 => ("freezer.state", if freeze { "FROZEN" } else { "THAWED" }),
    }
}

/// Writes the freezer's file; in a cgroup delegated to the job's user (a user's own systemd
/// manager made it), with that user's rights (`crate::delegated`).
fn write(cgroup: &Frozen, freeze: bool) -> std::io::Result<()> {
    use std::io::Write as _;
    let (file, value) = state_file(cgroup.version, freeze);
    crate::delegated::open_write(&cgroup.dir.join(file), false, 0)?.write_all(value.as_bytes())
}
