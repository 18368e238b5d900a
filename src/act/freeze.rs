//! The cgroup freezer, used instead of SIGSTOP when the job owns its cgroup: one write freezes every
//! process at once (no worker can slip through between signals), and the job's parent sees no stop.
//!
//! A job owns a cgroup when it is not a hierarchy's root, every process in it (and in its children)
//! belongs to the job's tree, and memwatch itself is not among them. cgroup v2 (`cgroup.freeze`,
//! confirmed by `cgroup.events`) is preferred; the v1 freezer controller (`freezer.state`) otherwise.
//!
//! A freezer someone else asked to freeze (`docker pause`, `podman pause`: runc writes the same file)
//! is not memwatch's: it is never chosen, and a freeze that finds it so at the write does not write
//! and says so (`CgroupError::FrozenByAnother`), so that memwatch stops the job by signals and never
//! thaws the other's freeze at its resume.

use crate::sample::cgroup::Version;
use std::path::Path;
use std::time::{Duration, Instant};

use super::cgroup_error::CgroupError;
use super::signal::owner_may_freeze;
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
    let mut walked = tree.to_vec();
    walked.sort_unstable();
    candidates.into_iter().find(|f| {
        if asked_frozen(f) {
            return false;
        }
        let mut pids = Vec::new();
        pids_below(&f.dir, &mut pids)
            && !pids.is_empty()
            && !pids.contains(&me)
            && pids
                .iter()
                .all(|p| walked.binary_search(p).is_ok() || forked_from(root, *p, &walked))
            && pids.iter().all(|p| owner_may_freeze(root, *p, owner))
    })
}

/// How many parents [`forked_from`] follows before it gives up.
const ANCESTRY_AT_MOST: usize = 32;

/// Whether `pid`, found in the cgroup but not in the walk's `tree` (sorted), is still the job's:
/// gone or exiting since the cgroup was read, or a descendant of a process of the tree, forked
/// after the walk (a job that forks all the time would otherwise lose its freezer to each fork the
/// walk missed). A process whose parent chain leaves the tree (reparented to a subreaper or to
/// init) is not.
fn forked_from(root: &Path, pid: u32, tree: &[u32]) -> bool {
    let mut p = pid;
    for _ in 0..ANCESTRY_AT_MOST {
        match crate::proc::read_stat(root, p) {
            Err(e) => return p == pid && e.is_gone(),
            Ok(s) if tree.binary_search(&s.ppid).is_ok() => return true,
            // Exiting (a dead task shows parent 0): nothing left to freeze.
            Ok(s) if p == pid && matches!(s.state, 'X' | 'Z') => return true,
            Ok(s) if s.ppid <= 1 => return false,
            Ok(s) => p = s.ppid,
        }
    }
    false
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
    fn freeze(&self) -> Result<bool, CgroupError>;

    /// Waits up to `wait` for the freeze to take; `false` if it did not.
    fn settled_within(&self, wait: Duration) -> bool;

    /// Thaws the cgroup; a cgroup that is gone is nothing to thaw.
    fn thaw(&self) -> Result<(), CgroupError>;
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
        if !pids_below(&self.dir, &mut pids) {
            return false;
        }
        super::signal::all_may_freeze(root, &pids, owner)
    }

    fn freeze(&self) -> Result<bool, CgroupError> {
        if asked_frozen(self) {
            return Err(CgroupError::FrozenByAnother {
                dir: self.dir.clone(),
            });
        }
        write(self, true).map_err(|(path, e)| CgroupError::write(path, &e))?;
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

    fn thaw(&self) -> Result<(), CgroupError> {
        match write(self, false) {
            Err((_, e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err((path, e)) => Err(CgroupError::write(path, &e)),
            Ok(()) => Ok(()),
        }
    }
}

/// Whether the cgroup's freezer has been asked to freeze, by anyone: v2's `cgroup.freeze` reads 1,
/// v1's `freezer.state` is not THAWED (FREEZING or FROZEN). memwatch asks only of a thawed one.
fn asked_frozen(cgroup: &Frozen) -> bool {
    match cgroup.version {
        Version::V2 => read_text(&cgroup.dir.join("cgroup.freeze")).is_ok_and(|t| t.trim() == "1"),
        Version::V1 => {
            read_text(&cgroup.dir.join("freezer.state")).is_ok_and(|t| t.trim() != "THAWED")
        }
    }
}

/// Whether the freezer memwatch froze is no longer asked to freeze: someone else wrote it thawed
/// (`docker unpause`, `podman unpause`: on cgroup v2 the same `cgroup.freeze`). A cgroup that is gone
/// or unreadable is not thawed by another.
pub fn thawed_by_another(cgroup: &Frozen) -> bool {
    let (file, _) = state_file(cgroup.version, true);
    read_text(&cgroup.dir.join(file)).is_ok() && !asked_frozen(cgroup)
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
/// An error comes with the file.
fn write(cgroup: &Frozen, freeze: bool) -> Result<(), (std::path::PathBuf, std::io::Error)> {
    use std::io::Write as _;
    let (file, value) = state_file(cgroup.version, freeze);
    let path = cgroup.dir.join(file);
    crate::delegated::open_write(&path, false, 0)
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .map_err(|e| (path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::path::PathBuf;

    /// A process under the fixture root: its cgroup line, stat (with `ppid`) and status (`uid`).
    fn process(root: &Path, pid: u32, ppid: u32, uid: u32) {
        let d = root.join("proc").join(pid.to_string());
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("cgroup"), "0::/job.scope\n").unwrap();
        fs::write(
            d.join("stat"),
            format!("{pid} (sh) S {ppid} 1 1 0 -1 0 0 0 0 0 1 1 0 0 20 0 1 0 100 0 10 0 0 0"),
        )
        .unwrap();
        fs::write(
            d.join("status"),
            format!("Uid:\t{uid}\t{uid}\t{uid}\t{uid}\n"),
        )
        .unwrap();
    }

    fn cgroup(root: &Path, pids: &[u32]) -> PathBuf {
        let dir = root.join("sys/fs/cgroup/job.scope");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("cgroup.freeze"), "0\n").unwrap();
        let procs: String = pids.iter().map(|p| format!("{p}\n")).collect();
        fs::write(dir.join("cgroup.procs"), procs).unwrap();
        dir
    }

    #[test]
    fn a_cgroup_is_the_jobs_with_the_children_forked_and_the_processes_gone_since_the_walk() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        for (pid, ppid) in [(10, 1), (11, 10), (12, 11), (13, 12)] {
            process(root, pid, ppid, 1000);
        }
        // 17 is exiting: a dead task shows parent 0.
        process(root, 17, 11, 1000);
        let stat = root.join("proc/17/stat");
        let text = fs::read_to_string(&stat)
            .unwrap()
            .replace(" S 11 ", " X 0 ");
        fs::write(&stat, text).unwrap();
        // The walk saw 10 and 11; 12 forked from 11 since and 13 from 12; 14 exited since.
        let dir = cgroup(root, &[10, 11, 12, 13, 14, 17]);
        let tree = [11, 10];
        let owned_dir = owned(root, &tree, 1000).map(|f| f.dir);
        assert_eq!(owned_dir.as_deref(), Some(dir.as_path()));
        assert!(
            Frozen {
                version: Version::V2,
                dir: dir.clone(),
            }
            .within_reach(root, 1000)
        );
        // A process reparented to init is not the job's, nor is another user's child of the job.
        process(root, 15, 1, 1000);
        cgroup(root, &[10, 11, 15]);
        assert_eq!(owned(root, &tree, 1000), None);
        process(root, 16, 11, 1001);
        cgroup(root, &[10, 11, 16]);
        assert_eq!(owned(root, &tree, 1000), None);
        // root may freeze it; a chain longer than the limit is not followed.
        assert!(owned(root, &tree, 0).is_some());
        let deep: Vec<u32> = (100..100 + ANCESTRY_AT_MOST as u32 + 1).collect();
        for (i, pid) in deep.iter().enumerate() {
            process(root, *pid, if i == 0 { 11 } else { pid - 1 }, 1000);
        }
        cgroup(root, &[10, 11, deep[ANCESTRY_AT_MOST - 1]]);
        assert!(owned(root, &tree, 1000).is_some());
        cgroup(root, &[10, 11, deep[ANCESTRY_AT_MOST]]);
        assert_eq!(owned(root, &tree, 1000), None);
    }

    /// On the machine's own processes the owner's reach is the kernel's answer: a real v1 freezer
    /// cgroup holding a user's process is within that user's reach until a root process joins it.
    #[test]
    fn a_real_cgroup_with_a_root_process_is_out_of_a_users_reach() {
        let base = Path::new("/sys/fs/cgroup/freezer");
        if !rustix::process::geteuid().is_root() || !base.join("cgroup.procs").exists() {
            crate::test_skip::cannot_run("v1_freezer_reach", "needs root and a v1 freezer");
            return;
        }
        let dir = base.join(format!("memwatch-reach-{}", std::process::id()));
        fs::create_dir(&dir).unwrap();
        let spawn = |args: &[&str]| {
            std::process::Command::new(args[0])
                .args(&args[1..])
                .spawn()
                .unwrap()
        };
        let mut user = spawn(&[
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sleep",
            "60",
        ]);
        let mut roots = spawn(&["sleep", "60"]);
        let frozen = Frozen {
            version: Version::V1,
            dir: dir.clone(),
        };
        fs::write(dir.join("cgroup.procs"), user.id().to_string()).unwrap();
        // setpriv has taken the user's uids once it has exec'd sleep.
        let dropped = (0..5000).any(|_| {
            std::thread::sleep(Duration::from_millis(1));
            crate::proc::read_status(Path::new("/"), user.id()).is_ok_and(|s| s.uids[0] == 65534)
        });
        assert!(dropped, "setpriv never took the user's uid");
        let reach = |owner| frozen.within_reach(Path::new("/"), owner);
        assert!(reach(65534), "the user's own process");
        fs::write(dir.join("cgroup.procs"), roots.id().to_string()).unwrap();
        assert!(!reach(65534), "root's process in the user's cgroup");
        assert!(!reach(1000), "a third user's reach");
        assert!(reach(0), "root reaches every process");
        for c in [&mut user, &mut roots] {
            c.kill().unwrap();
            c.wait().unwrap();
        }
        // The cgroup is empty now: nothing in it is out of reach.
        assert!(reach(65534));
        fs::remove_dir(&dir).unwrap();
    }

    /// A cgroup someone else asked to freeze (`docker pause`) is not chosen, and a freeze that finds
    /// it so writes nothing and says so; thawed again, it is the job's as before.
    #[test]
    fn a_cgroup_frozen_by_another_is_left_alone() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        process(root, 10, 1, 1000);
        let dir = cgroup(root, &[10]);
        fs::write(dir.join("cgroup.freeze"), "1\n").unwrap();
        assert_eq!(owned(root, &[10], 1000), None, "v2, frozen by another");
        let f = Frozen {
            version: Version::V2,
            dir: dir.clone(),
        };
        assert_eq!(
            f.freeze(),
            Err(CgroupError::FrozenByAnother { dir: dir.clone() })
        );
        assert_eq!(
            fs::read_to_string(dir.join("cgroup.freeze")).unwrap(),
            "1\n"
        );
        fs::write(dir.join("cgroup.freeze"), "0\n").unwrap();
        assert_eq!(owned(root, &[10], 1000).map(|f| f.dir), Some(dir.clone()));
        // v1: FROZEN or FREEZING is another's; THAWED is free.
        let v1 = root.join("sys/fs/cgroup/freezer/job");
        fs::create_dir_all(&v1).unwrap();
        let f = Frozen {
            version: Version::V1,
            dir: v1.clone(),
        };
        for (state, theirs) in [("FROZEN", true), ("FREEZING", true), ("THAWED", false)] {
            fs::write(v1.join("freezer.state"), format!("{state}\n")).unwrap();
            assert_eq!(asked_frozen(&f), theirs, "{state}");
        }
    }

    /// A freeze that cannot write the freezer's file says which file and why; a thaw of a cgroup
    /// that is gone is nothing to thaw.
    #[test]
    fn a_failed_freeze_names_its_file_and_a_gone_cgroup_thaws() {
        let dir = tempfile::tempdir().unwrap();
        let gone = Frozen {
            version: Version::V2,
            dir: dir.path().join("gone.scope"),
        };
        match gone.freeze() {
            Err(CgroupError::Write { path, errno }) => {
                assert_eq!(path, dir.path().join("gone.scope/cgroup.freeze"));
                assert_eq!(errno.0, 2, "ENOENT");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(gone.thaw(), Ok(()));
    }
}
