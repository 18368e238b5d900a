//! What the kernel says of a job's processes without a walk of /proc: the pids of its cgroup and the
//! cgroups below it. A fork lands in its parent's cgroup and an exit leaves it, so while a job's whole
//! tree lies inside its cgroup, the same members mean the same tree: one read of `cgroup.procs` per
//! cgroup stands for reading every process's `children` and `stat`. Their reading is the `memwatch`
//! crate's (`job::members`).

use std::sync::Arc;

/// A cgroup holding more than this many processes beyond the tree is shared with others: any change
/// among them would ask for a walk, so its members are not kept.
const OTHERS_AT_MOST: usize = 64;

/// The processes of a job's cgroup and those below it, sorted, each once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Members(Arc<[u32]>);

impl Members {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
