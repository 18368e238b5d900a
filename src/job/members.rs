//! What the kernel says of a job's processes without a walk of /proc: the pids of its cgroup and the
//! cgroups below it. A fork lands in its parent's cgroup and an exit leaves it, so while a job's whole
//! tree lies inside its cgroup, the same members mean the same tree: one read of `cgroup.procs` per
//! cgroup stands for reading every process's `children` and `stat`.

use std::path::Path;
use std::sync::Arc;

use crate::sample::cgroup::{self, CgroupDir};

/// A cgroup holding more than this many processes beyond the tree is shared with others: any change
/// among them would ask for a walk, so its members are not kept.
const OTHERS_AT_MOST: usize = 64;

/// The processes of a job's cgroup and those below it, sorted, each once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Members(Arc<[u32]>);

impl Members {
    /// Reads the members of the cgroup at `cg` (and below); `None` when a `cgroup.procs` could not
    /// be read (the list would be short), or the cgroup is its hierarchy's root (everyone's).
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

    /// The members made of these pids (any order, repeats allowed: v1 lists a process once per
    /// thread group leader but does not sort).
    pub fn of(mut pids: Vec<u32>) -> Members {
        pids.sort_unstable();
        pids.dedup();
        Members(pids.into())
    }

    /// These members, if they can stand for the tree of `pids`: every one of the tree's processes is
    /// among them, and they hold at most 64 others (`OTHERS_AT_MOST`).
    pub fn holding(self, pids: &[u32]) -> Option<Members> {
        let all_in = pids.iter().all(|p| self.0.binary_search(p).is_ok());
        (all_in && self.0.len() <= pids.len() + OTHERS_AT_MOST).then_some(self)
    }

    /// How many processes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
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
        let m = Members::read(&dir_at("/job.scope", t.path())).unwrap();
        assert_eq!(&*m.0, &[10, 20, 30]);
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
        assert_eq!(Members::read(&dir_at("/job.scope", t.path())), None);
    }

    #[test]
    fn members_stand_for_a_tree_only_when_they_hold_all_of_it_and_little_else() {
        let m = Members::of(vec![5, 3, 4, 3]);
        assert_eq!(m.len(), 3);
        assert!(m.clone().holding(&[3, 4, 5]).is_some());
        assert!(
            m.clone().holding(&[3]).is_some(),
            "a few others are allowed"
        );
        assert!(m.holding(&[3, 6]).is_none(), "6 lies outside the cgroup");
        let crowd = Members::of((1..=100).collect());
        assert!(crowd.holding(&[1, 2]).is_none(), "a shared cgroup");
    }

    #[test]
    fn a_hierarchys_root_is_everyones_and_never_read() {
        let t = tempfile::tempdir().unwrap();
        fs::write(t.path().join("cgroup.procs"), "1\n").unwrap();
        assert_eq!(Members::read(&dir_at("/", t.path())), None);
    }
}
