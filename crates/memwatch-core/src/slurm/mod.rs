//! A Slurm job as memwatch names it: its id, its job cgroup on a node, which of its tasks it follows
//! (the leader, the tops of its trees), `scontrol listpids`' text, and each node's hold on its
//! suspension as the job's `AdminComment` keeps it (`holds`). memwatch's `slurm` finds the
//! cgroup and reads the tasks.

pub mod call;
pub mod holds;
pub mod protocol;

use crate::proc::Stat;
use crate::sample::cgroup::CgroupDir;

/// A Slurm job id: digits only, as scontrol prints them (array and het jobs by their own job id).
pub fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 20 && id.bytes().all(|b| b.is_ascii_digit())
}

/// A job's cgroup on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobCgroup {
    /// The job-level memory cgroup: its limit is the job's on this node.
    pub memory: CgroupDir,
    /// The job's user, from the `uid_UID` component (v1).
    pub uid: Option<u32>,
}

/// Whether a process is Slurm's own (`slurmstepd`), not one of the job's tasks.
pub fn is_stepd(s: &Stat) -> bool {
    s.comm.starts_with("slurmstepd")
}

/// The tasks among a Slurm job's processes (not `slurmstepd`, not zombies), oldest first, each
/// once.
pub fn tasks(stats: impl IntoIterator<Item = Stat>) -> Vec<Stat> {
    let mut out: Vec<Stat> = stats
        .into_iter()
        .filter(|s| !is_stepd(s) && s.state != 'Z')
        .collect();
    out.sort_by_key(|s| (s.start_time, s.pid));
    out.dedup_by_key(|s| s.pid);
    out
}

/// The process memwatch follows the job by: the oldest task whose parent is not a task (the batch
/// script on the batch node, else the first task of the first step).
pub fn leader(tasks: &[Stat]) -> Option<&Stat> {
    tasks
        .iter()
        .find(|s| !tasks.iter().any(|t| t.pid == s.ppid))
}

/// The tops of the job's process trees: each task whose parent is not a task.
pub fn tops(tasks: &[Stat]) -> Vec<&Stat> {
    tasks
        .iter()
        .filter(|s| !tasks.iter().any(|t| t.pid == s.ppid))
        .collect()
}

/// The pids `scontrol listpids` prints (header, then `PID JOBID STEPID LOCALID GLOBALID` rows).
pub fn parse_listpids(text: &str) -> Vec<u32> {
    text.lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(pid: u32, ppid: u32, comm: &str) -> Stat {
        Stat {
            pid,
            comm: comm.into(),
            state: 'S',
            ppid,
            flags: 0,
            start_time: u64::from(pid),
            rss_pages: 0,
            cpu_ticks: 0,
            threads: 1,
        }
    }

    #[test]
    fn the_leader_is_the_oldest_task_whose_parent_is_not_a_task() {
        // slurmstepd (10) runs the batch script (11), which runs srun's tasks 12 and 13; 12 forks 14.
        let tasks = [
            task(11, 10, "bash"),
            task(12, 11, "python"),
            task(13, 11, "python"),
            task(14, 12, "pt_data_worker"),
        ];
        assert_eq!(leader(&tasks).map(|s| s.pid), Some(11));
        assert_eq!(
            tops(&tasks).iter().map(|s| s.pid).collect::<Vec<_>>(),
            vec![11]
        );
        // On a node without the batch script, each step's first task tops a tree of its own.
        let tasks = [
            task(21, 20, "python"),
            task(22, 20, "python"),
            task(23, 21, "worker"),
        ];
        assert_eq!(leader(&tasks).map(|s| s.pid), Some(21));
        assert_eq!(
            tops(&tasks).iter().map(|s| s.pid).collect::<Vec<_>>(),
            vec![21, 22]
        );
        assert_eq!(leader(&[]), None);
        assert!(is_stepd(&task(10, 1, "slurmstepd")) && !is_stepd(&task(11, 10, "bash")));
    }

    #[test]
    fn reads_listpids() {
        let text = "PID      JOBID    STEPID   LOCALID GLOBALID\n\
                    9019     1        batch    0       0\n\
                    9035     1        0        0       0\n";
        assert_eq!(parse_listpids(text), vec![9019, 9035]);
        assert!(valid_id("4242"));
        assert!(!valid_id("42_1"), "array tasks go by their own job id");
        assert!(!valid_id(""));
    }
}
