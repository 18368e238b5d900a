//! Keeping systemd-oomd off a job memwatch holds paused. systemd-oomd kills a whole cgroup under a
//! unit with `ManagedOOMMemoryPressure=kill` (or `ManagedOOMSwap=kill`) when its pressure (or the
//! host's swap) stays over the limit; a paused job still holds its memory, so it is the cgroup oomd
//! would pick. While the policy holds a job, memwatch sets `user.oomd_omit=1` on the cgroups oomd
//! would choose among for it, and puts back what was there when the pause ends.
//!
//! What oomd reads (systemd's `src/oom`): its kill candidates under a monitored cgroup are the
//! descendants that are leaves, or the first met on the way down with `memory.oom.group` set (killed
//! whole); it reads `user.oomd_omit` (a boolean: "1", "yes", "true", "on") on the candidate itself,
//! and honours it when the candidate is owned by root or by the owner of the monitored cgroup (a
//! delegated tree such as `user@UID.service`). So memwatch marks the job's own cgroup (or, when it
//! has child cgroups, its leaves and `memory.oom.group` children) and every ancestor below the root
//! with `memory.oom.group` set, each only when it is owned by root or by the job's owner.

use super::cgroup_error::CgroupError;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

pub use crate::job::held::OomdMark;

/// The attribute systemd-oomd reads to leave a cgroup out of its choice.
pub const OMIT: &str = "user.oomd_omit";

/// At most this many cgroups are marked for one job (a job with a tree of cgroups of its own).
const MOST: usize = 64;
/// How deep under the job's cgroup its own cgroups are walked.
const DEPTH: usize = 8;
/// Longer values are not systemd's (a boolean); they are read this far.
const VALUE_MAX: usize = 256;

/// The cgroups systemd-oomd would choose among to kill the job whose cgroup is `dir` in the cgroup
/// v2 hierarchy mounted at `mount`, as marks carrying the `user.oomd_omit` value each has now. Only
/// cgroups owned by root or by `owner` (whose marks oomd honours); none for the root cgroup.
pub fn candidates(mount: &Path, dir: &Path, owner: u32) -> Vec<OomdMark> {
    if dir == mount || !dir.starts_with(mount) {
        return Vec::new();
    }
    let mut dirs: Vec<PathBuf> = dir
        .ancestors()
        .skip(1)
        .take_while(|d| *d != mount && d.starts_with(mount))
        .filter(|d| oom_group(d))
        .map(Path::to_path_buf)
        .collect();
    own_candidates(dir, 0, &mut dirs);
    dirs.truncate(MOST);
    dirs.into_iter()
        .filter(|d| honoured(d, owner))
        .map(|d| OomdMark {
            previous: read(&d).ok().flatten(),
            dir: d,
        })
        .collect()
}

/// `dir` if it is a leaf or kills as a group, else the same of each of its child cgroups.
fn own_candidates(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    if out.len() >= MOST {
        return;
    }
    let children: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect(),
        Err(_) => Vec::new(),
    };
    if children.is_empty() || depth >= DEPTH || oom_group(dir) {
        out.push(dir.to_path_buf());
        return;
    }
    for c in children {
        own_candidates(&c, depth + 1, out);
    }
}

/// Whether a cgroup's `memory.oom.group` is set: the kernel and oomd kill it whole.
fn oom_group(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("memory.oom.group")).is_ok_and(|t| t.trim() == "1")
}

/// Whether oomd would read a mark on `dir`: owned by root, or by the job's owner.
fn honoured(dir: &Path, owner: u32) -> bool {
    std::fs::metadata(dir).is_ok_and(|m| m.uid() == 0 || m.uid() == owner)
}

/// The `user.oomd_omit` value on `dir`; `Ok(None)` when it has none.
pub fn read(dir: &Path) -> Result<Option<String>, CgroupError> {
    let mut buf = [0u8; VALUE_MAX];
    match rustix::fs::lgetxattr(dir, OMIT, &mut buf[..]) {
        Ok(n) => Ok(Some(
            String::from_utf8_lossy(&buf[..n.min(VALUE_MAX)]).into_owned(),
        )),
        Err(e) if e == rustix::io::Errno::NODATA => Ok(None),
        Err(errno) => Err(CgroupError::Xattr {
            dir: dir.to_owned(),
            attr: OMIT,
            errno: super::cgroup_error::errno(errno),
        }),
    }
}

/// A mark's work on its cgroup (`job::held::OomdMark`, plain data in memwatch-core): setting
/// `user.oomd_omit` and putting back what was there.
pub trait Marking {
    /// Sets `user.oomd_omit=1` on the cgroup.
    fn set(&self) -> Result<(), CgroupError>;

    /// Puts back what the cgroup had before the mark: the old value, or no attribute. A cgroup that
    /// is gone, or an attribute already gone, is done.
    fn restore(&self) -> Result<(), CgroupError>;
}

impl Marking for OomdMark {
    fn set(&self) -> Result<(), CgroupError> {
        rustix::fs::lsetxattr(&self.dir, OMIT, b"1", rustix::fs::XattrFlags::empty()).map_err(
            |errno| CgroupError::Xattr {
                dir: self.dir.clone(),
                attr: "user.oomd_omit=1",
                errno: super::cgroup_error::errno(errno),
            },
        )
    }

    fn restore(&self) -> Result<(), CgroupError> {
        let r = match &self.previous {
            Some(v) => rustix::fs::lsetxattr(
                &self.dir,
                OMIT,
                v.as_bytes(),
                rustix::fs::XattrFlags::empty(),
            ),
            None => rustix::fs::lremovexattr(&self.dir, OMIT),
        };
        match r {
            Ok(()) => Ok(()),
            Err(e) if e == rustix::io::Errno::NODATA || e == rustix::io::Errno::NOENT => Ok(()),
            Err(errno) => Err(CgroupError::Xattr {
                dir: self.dir.clone(),
                attr: OMIT,
                errno: super::cgroup_error::errno(errno),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cgroup(root: &Path, rel: &str, oom_group: bool) -> PathBuf {
        let d = root.join(rel);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("memory.oom.group"),
            if oom_group { "1\n" } else { "0\n" },
        )
        .unwrap();
        d
    }

    fn dirs(marks: &[OomdMark]) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = marks.iter().map(|m| m.dir.clone()).collect();
        v.sort();
        v
    }

    /// A leaf job cgroup is its own candidate; an ancestor that kills as a group is one too (oomd
    /// would kill it whole, the job with it); a job with cgroups of its own has its leaves and
    /// group-killed children marked, not itself; the root cgroup is never marked.
    #[test]
    fn the_candidates_are_what_oomd_would_pick_from() {
        let t = tempfile::tempdir().unwrap();
        let mount = t.path();
        let slice = cgroup(mount, "work.slice", false);
        let job = cgroup(mount, "work.slice/job.service", false);
        assert_eq!(dirs(&candidates(mount, &job, 0)), vec![job.clone()]);
        std::fs::write(slice.join("memory.oom.group"), "1\n").unwrap();
        assert_eq!(
            dirs(&candidates(mount, &job, 0)),
            vec![slice.clone(), job.clone()]
        );
        std::fs::write(slice.join("memory.oom.group"), "0\n").unwrap();
        let a = cgroup(mount, "work.slice/job.service/a", false);
        let g = cgroup(mount, "work.slice/job.service/g", true);
        let _g_inner = cgroup(mount, "work.slice/job.service/g/inner", false);
        let b = cgroup(mount, "work.slice/job.service/b/leaf", false);
        assert_eq!(dirs(&candidates(mount, &job, 0)), vec![a, b, g]);
        assert!(candidates(mount, mount, 0).is_empty());
        assert!(candidates(mount, Path::new("/elsewhere"), 0).is_empty());
    }

    /// Only cgroups whose marks oomd honours: root's or the job owner's (the test's files are the
    /// test user's, so they count as root's only when the test runs as root).
    #[test]
    fn marks_go_only_where_oomd_reads_them() {
        let t = tempfile::tempdir().unwrap();
        let job = cgroup(t.path(), "job.scope", false);
        let me = std::fs::metadata(&job).unwrap().uid();
        assert_eq!(candidates(t.path(), &job, me).len(), 1);
        let other = if me == 4242 { 4243 } else { 4242 };
        assert_eq!(
            candidates(t.path(), &job, other).len(),
            usize::from(me == 0)
        );
    }

    /// A mark is set, and taken off again leaves what was there: nothing, or the old value.
    #[test]
    fn a_mark_puts_back_what_was_there() {
        let t = tempfile::tempdir().unwrap();
        let job = cgroup(t.path(), "job.scope", false);
        let me = std::fs::metadata(&job).unwrap().uid();
        let mark = candidates(t.path(), &job, me).remove(0);
        assert_eq!(mark.previous, None);
        if let Err(e) = mark.set() {
            // A filesystem without user attributes.
            crate::test_skip::cannot_run("oomd_mark", &format!("no user xattrs here: {e}"));
            return;
        }
        assert_eq!(read(&job), Ok(Some("1".into())));
        mark.restore().unwrap();
        assert_eq!(read(&job), Ok(None));
        // Restoring twice is nothing.
        mark.restore().unwrap();
        rustix::fs::lsetxattr(&job, OMIT, b"0", rustix::fs::XattrFlags::empty()).unwrap();
        let mark = candidates(t.path(), &job, me).remove(0);
        assert_eq!(mark.previous.as_deref(), Some("0"));
        mark.set().unwrap();
        assert_eq!(read(&job), Ok(Some("1".into())));
        mark.restore().unwrap();
        assert_eq!(read(&job), Ok(Some("0".into())));
        // A cgroup that is gone is done.
        std::fs::remove_dir_all(&job).unwrap();
        assert_eq!(mark.restore(), Ok(()));
    }
}
