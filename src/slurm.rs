//! Where a Slurm job is on this node: its job cgroup, its tasks and its leader. Reads only (which
//! task leads, and the ids and `listpids` text, are memwatch-core's `slurm`); the scontrol and
//! scancel calls are `act::slurm`'s.
//!
//! Slurm's cgroup plugin puts a job's steps and tasks under one job cgroup: on v1
//! `<controller>/slurm[_NODE]/uid_UID/job_ID/step_STEP/task_N`, on v2
//! `<mount>/system.slice/slurmstepd.scope/job_ID/step_STEP/user/task_N`. The job cgroup holds the
//! job's memory limit and every process of the job on this node, `slurmstepd`s included; the tasks
//! are the rest. Where the plugin is not used, `scontrol listpids` names the processes.

use std::path::{Path, PathBuf};

use crate::proc::{self, Stat};
use crate::sample::cgroup::{CgroupDir, Version, pids_below};

pub use memwatch_core::slurm::{JobCgroup, is_stepd, leader, parse_listpids, tops, valid_id};

/// The job cgroup of Slurm job `id` under `root` (normally "/"), if it exists on this node.
pub fn find_job(root: &Path, id: &str) -> Option<JobCgroup> {
    find_job_on(root, id, "")
}

/// [`find_job`] on Slurm node `node`: where this host runs several slurmd (`slurmd -N`), each has a
/// root of its own (`slurm_NODE`), and only this node's is searched once it is there.
pub fn find_job_on(root: &Path, id: &str, node: &str) -> Option<JobCgroup> {
    if !valid_id(id) {
        return None;
    }
    let job = format!("job_{id}");
    let fs = root.join("sys/fs/cgroup");
    let v1 = fs.join("memory");
    let v2 = fs.join("cgroup.controllers").is_file().then(|| fs.clone());
    let mut candidates: Vec<(Version, PathBuf, PathBuf)> = Vec::new();
    if v1.is_dir() {
        candidates.extend(
            slurm_roots(&v1, node)
                .into_iter()
                .map(|d| (Version::V1, v1.clone(), d)),
        );
    }
    if let Some(v2) = v2 {
        candidates.push((
            Version::V2,
            v2.clone(),
            v2.join("system.slice/slurmstepd.scope"),
        ));
        candidates.extend(
            slurm_roots(&v2, node)
                .into_iter()
                .map(|d| (Version::V2, v2.clone(), d)),
        );
    }
    for (version, mount, base) in candidates {
        let mut dirs = vec![base.join(&job)];
        if let Ok(entries) = std::fs::read_dir(&base) {
            dirs.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("uid_"))
                    .map(|e| e.path().join(&job)),
            );
        }
        if let Some(dir) = dirs.into_iter().find(|d| d.is_dir()) {
            let rel = dir.strip_prefix(&mount).ok()?;
            let uid = rel.iter().find_map(|c| {
                c.to_str()
                    .and_then(|c| c.strip_prefix("uid_"))
                    .and_then(|u| u.parse().ok())
            });
            return Some(JobCgroup {
                memory: CgroupDir {
                    version,
                    path: format!("/{}", rel.display()),
                    mount,
                    dir,
                },
                uid,
            });
        }
    }
    None
}

/// `slurm` and `slurm_NODE` (several slurmd on one host) directly under a hierarchy's mount; only
/// `slurm_{node}` where that one is there.
fn slurm_roots(mount: &Path, node: &str) -> Vec<PathBuf> {
    let own = mount.join(format!("slurm_{node}"));
    if !node.is_empty() && own.is_dir() {
        return vec![own];
    }
    let Ok(entries) = std::fs::read_dir(mount) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n == "slurm" || n.starts_with("slurm_")
        })
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

/// Whether Slurm holds the job suspended on this node, whoever asked (this node's memwatch, another
/// node's, a person): its job or step cgroups frozen by Slurm's own freezer (v1: the `freezer`
/// hierarchy at the memory cgroup's path, `freezer.state` FROZEN or FREEZING; v2: `cgroup.freeze` 1).
/// Reads a few small files: the job's cgroup and its `step_*` children.
pub fn suspended_here(root: &Path, job: &CgroupDir) -> bool {
    let (dir, file, frozen): (PathBuf, &str, &[&str]) = match job.version {
        Version::V1 => (
            root.join("sys/fs/cgroup/freezer")
                .join(job.path.trim_start_matches('/')),
            "freezer.state",
            &["FROZEN", "FREEZING"],
        ),
        Version::V2 => (job.dir.clone(), "cgroup.freeze", &["1"]),
    };
    let is_frozen =
        |d: &Path| std::fs::read_to_string(d.join(file)).is_ok_and(|t| frozen.contains(&t.trim()));
    if is_frozen(&dir) {
        return true;
    }
    std::fs::read_dir(&dir).is_ok_and(|entries| {
        entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("step_"))
            .any(|e| is_frozen(&e.path()))
    })
}

/// The job's tasks on this node (every process in its cgroup but the slurmstepds), oldest first.
pub fn tasks(root: &Path, job: &JobCgroup) -> Vec<Stat> {
    let mut pids = Vec::new();
    pids_below(&job.memory.dir, &mut pids);
    tasks_of(root, &pids)
}

/// The tasks among `pids`, oldest first.
pub fn tasks_of(root: &Path, pids: &[u32]) -> Vec<Stat> {
    memwatch_core::slurm::tasks(pids.iter().filter_map(|p| proc::read_stat(root, *p).ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mkdirs(root: &Path, rel: &str, procs: &str) {
        let d = root.join(rel);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("cgroup.procs"), procs).unwrap();
    }

    #[test]
    fn finds_the_job_cgroup_on_v1_and_v2() {
        let t = tempfile::tempdir().unwrap();
        let v1 = t.path().join("v1");
        mkdirs(&v1, "sys/fs/cgroup/memory/slurm_node1/uid_1000/job_42", "");
        mkdirs(
            &v1,
            "sys/fs/cgroup/memory/slurm_node1/uid_1000/job_42/step_0",
            "",
        );
        mkdirs(
            &v1,
            "sys/fs/cgroup/memory/slurm_node1/uid_1000/job_42/step_0/task_1",
            "77\n",
        );
        let j = find_job(&v1, "42").unwrap();
        assert_eq!(j.memory.version, Version::V1);
        assert_eq!(j.memory.path, "/slurm_node1/uid_1000/job_42");
        assert_eq!(j.uid, Some(1000));
        let mut pids = Vec::new();
        assert!(pids_below(&j.memory.dir, &mut pids));
        assert_eq!(pids, vec![77]);
        assert_eq!(find_job(&v1, "4"), None, "job_4 is not job_42");
        assert_eq!(find_job(&v1, "../42"), None);
        // Two slurmd on this host, each with a job 42 (two clusters): node2's memwatch takes its own.
        mkdirs(
            &v1,
            "sys/fs/cgroup/memory/slurm_node2/uid_1001/job_42/step_0/task_0",
            "88\n",
        );
        let j = find_job_on(&v1, "42", "node2").unwrap();
        assert_eq!(j.memory.path, "/slurm_node2/uid_1001/job_42");
        assert_eq!(j.uid, Some(1001));
        assert_eq!(
            find_job_on(&v1, "42", "node1").unwrap().memory.path,
            "/slurm_node1/uid_1000/job_42"
        );
        // A node without a root of its own (one slurmd, `slurm`) searches them all.
        assert!(find_job_on(&v1, "42", "other").is_some());
        // Suspended by Slurm: a step's freezer is frozen.
        let j = find_job_on(&v1, "42", "node1").unwrap();
        assert!(
            !suspended_here(&v1, &j.memory),
            "no freezer hierarchy: not suspended"
        );
        let step = v1.join("sys/fs/cgroup/freezer/slurm_node1/uid_1000/job_42/step_0");
        std::fs::create_dir_all(&step).unwrap();
        std::fs::write(step.join("freezer.state"), "THAWED\n").unwrap();
        assert!(!suspended_here(&v1, &j.memory));
        std::fs::write(step.join("freezer.state"), "FROZEN\n").unwrap();
        assert!(suspended_here(&v1, &j.memory));

        let v2 = t.path().join("v2");
        mkdirs(&v2, "sys/fs/cgroup", "");
        std::fs::write(v2.join("sys/fs/cgroup/cgroup.controllers"), "memory\n").unwrap();
        mkdirs(
            &v2,
            "sys/fs/cgroup/system.slice/slurmstepd.scope/job_7/step_batch/user/task_0",
            "9\n",
        );
        let j = find_job(&v2, "7").unwrap();
        assert_eq!(j.memory.version, Version::V2);
        assert_eq!(j.memory.path, "/system.slice/slurmstepd.scope/job_7");
        assert_eq!(j.uid, None);
        assert!(!suspended_here(&v2, &j.memory));
        let step = v2.join("sys/fs/cgroup/system.slice/slurmstepd.scope/job_7/step_batch");
        std::fs::write(step.join("cgroup.freeze"), "1\n").unwrap();
        assert!(suspended_here(&v2, &j.memory));
    }
}
