//! Reading a job's cgroup members ([`read`], [`same`]): the pids of its cgroup and those below it.
//! The members themselves, and why they stand for the tree, are memwatch-core's (`job::members`).

use std::path::Path;

use crate::sample::cgroup::{self, CgroupDir};

pub use memwatch_core::job::members::Members;

/// Reads the members of the cgroup at `cg` (and below); `None` when a `cgroup.procs` could not be
/// read (the list would be short), or the cgroup is its hierarchy's root (everyone's).
pub fn read(cg: &CgroupDir) -> Option<Members> {
    if cg.path == "/" || cg.path.is_empty() {
        return None;
    }
    let mut pids = Vec::new();
    if !cgroup::pids_below(&cg.dir, &mut pids) {
        return None;
    }
    Some(Members::of(pids))
}

/// Whether the cgroup at `dir` (and below) holds exactly `before`'s processes now; `false` also when
/// it cannot be read.
pub fn same(dir: &Path, before: &Members) -> bool {
    let mut pids = Vec::with_capacity(before.len());
    cgroup::pids_below(dir, &mut pids) && Members::of(pids) == *before
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::cgroup::Version;
    use std::fs;

    fn dir_at(path: &str, dir: &Path) -> CgroupDir {
        CgroupDir {
            version: Version::V2,
            path: path.into(),
            mount: dir.to_owned(),
            dir: dir.to_owned(),
        }
    }

    #[test]
    fn members_are_read_from_the_cgroup_and_those_below_and_compared_as_sets() {
        let t = tempfile::tempdir().unwrap();
        fs::write(t.path().join("cgroup.procs"), "30\n10\n").unwrap();
        fs::create_dir(t.path().join("worker")).unwrap();
        fs::write(t.path().join("worker/cgroup.procs"), "20\n10\n").unwrap();
        let m = read(&dir_at("/job.scope", t.path())).unwrap();
        assert_eq!(m, Members::of(vec![10, 20, 30]));
        assert!(same(t.path(), &m));
        // A fork in the worker's cgroup, then its exit: different, then the same again.
        fs::write(t.path().join("worker/cgroup.procs"), "20\n40\n").unwrap();
        assert!(!same(t.path(), &m));
        fs::write(t.path().join("worker/cgroup.procs"), "20\n").unwrap();
        assert!(same(t.path(), &m));
        // A process gone and another come: the count alone would not tell.
        fs::write(t.path().join("cgroup.procs"), "31\n10\n").unwrap();
        assert!(!same(t.path(), &m));
        // A cgroup that cannot be read is never the same.
        fs::remove_file(t.path().join("worker/cgroup.procs")).unwrap();
        assert!(!same(t.path(), &m));
        assert_eq!(read(&dir_at("/job.scope", t.path())), None);
    }

    #[test]
    fn a_hierarchys_root_is_everyones_and_never_read() {
        let t = tempfile::tempdir().unwrap();
        fs::write(t.path().join("cgroup.procs"), "1\n").unwrap();
        assert_eq!(read(&dir_at("/", t.path())), None);
    }
}
