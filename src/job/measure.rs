//! Measuring an attached job: its process tree's memory, its memory cgroup and its GPU memory.
//! Blocking reads; the daemon runs them off the async threads.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::proc::{self, Memory, ProcRef};
use crate::sample::cgroup::{self, CgroupDir, CgroupMemory};
use crate::sample::gpu::GpuSample;

/// One process of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessSample {
    pub pid: u32,
    pub ppid: u32,
    pub name: String,
    pub state: String,
    pub rss_bytes: u64,
    pub pss_bytes: u64,
    pub swap_bytes: u64,
    /// GPU memory this process holds, summed over GPUs; `None` when NVML does not say.
    pub gpu_bytes: Option<u64>,
}

/// A job at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSample {
    pub timestamp_ms: u64,
    pub processes: Vec<ProcessSample>,
    pub rss_bytes: u64,
    pub pss_bytes: u64,
    pub swap_bytes: u64,
    pub cgroup: Option<CgroupMemory>,
    /// GPU memory held by the tree; `None` when no GPU reports processes.
    pub gpu_bytes: Option<u64>,
    /// GPUs the tree holds memory on; `None` when NVML does not say.
    pub gpus: Option<Vec<u32>>,
}

/// The memory cgroup a process lives in.
pub fn cgroup_of(root: &Path, pid: u32) -> Option<CgroupDir> {
    let path = proc::dir(root, pid).join("cgroup");
    let text = crate::sample::error::read_text(&path).ok()?;
    let m = cgroup::parse_membership(&path, &text).ok()?;
    cgroup::locate(root, &m)
}

/// Does NVML's `pid` belong to this process? NVML reports host pids; a process in a container has its
/// own in NSpid, outermost first.
fn same_process(nvml_pid: u32, pid: u32, nspid: &[u32]) -> bool {
    nvml_pid == pid || nspid.first() == Some(&nvml_pid)
}

/// Measures the tree under `root_ref`; `None` when the root is gone or was replaced.
///
/// With `previous` given, PSS and swap are carried over from it per pid and RSS comes from
/// /proc/PID/stat: smaps_rollup walks a process's page tables, the costliest read memwatch makes, so
/// the daemon asks for it every few seconds and when memory is tight, not every second.
pub fn measure(
    root: &Path,
    root_ref: ProcRef,
    cg: Option<&CgroupDir>,
    gpus: &[GpuSample],
    now_ms: u64,
    previous: Option<&JobSample>,
) -> Option<JobSample> {
    let tree = proc::descendants(root, root_ref.pid)?;
    if tree.procs.first()?.start_time != root_ref.start_time {
        return None;
    }
    let gpu_known = gpus.iter().any(|g| g.processes.is_some());
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|v| u64::try_from(v).ok())
        .unwrap_or(4096);
    let mut used_gpus: Vec<u32> = Vec::new();
    let mut processes = Vec::with_capacity(tree.procs.len());
    for p in &tree.procs {
        let rss_now = p.rss_pages * page;
        let carried = previous.and_then(|prev| prev.processes.iter().find(|q| q.pid == p.pid));
        let mem = match (previous, carried) {
            (Some(_), Some(q)) => Memory {
                rss_bytes: rss_now,
                pss_bytes: q.pss_bytes.min(rss_now),
                swap_bytes: q.swap_bytes,
            },
            (Some(_), None) => Memory {
                rss_bytes: rss_now,
                pss_bytes: rss_now,
                swap_bytes: 0,
            },
            (None, _) => proc::read_memory(root, p.pid).unwrap_or(Memory {
                rss_bytes: rss_now,
                ..Memory::default()
            }),
        };
        // NSpid matters only for matching NVML's pids.
        let nspid = if gpu_known {
            proc::read_status(root, p.pid)
                .map(|s| s.nspid)
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        let mut gpu_bytes = None;
        for g in gpus {
            for gp in g
                .processes
                .iter()
                .flatten()
                .filter(|gp| same_process(gp.pid, p.pid, &nspid))
            {
                *gpu_bytes.get_or_insert(0) += gp.used_bytes.unwrap_or(0);
                if !used_gpus.contains(&g.index) {
                    used_gpus.push(g.index);
                }
            }
        }
        processes.push(ProcessSample {
            pid: p.pid,
            ppid: p.ppid,
            name: p.comm.clone(),
            state: p.state.to_string(),
            rss_bytes: mem.rss_bytes,
            pss_bytes: mem.pss_bytes,
            swap_bytes: mem.swap_bytes,
            gpu_bytes: if gpu_known {
                Some(gpu_bytes.unwrap_or(0))
            } else {
                None
            },
        });
    }
    used_gpus.sort_unstable();
    Some(JobSample {
        timestamp_ms: now_ms,
        rss_bytes: processes.iter().map(|p| p.rss_bytes).sum(),
        pss_bytes: processes.iter().map(|p| p.pss_bytes).sum(),
        swap_bytes: processes.iter().map(|p| p.swap_bytes).sum(),
        gpu_bytes: gpu_known.then(|| processes.iter().filter_map(|p| p.gpu_bytes).sum()),
        gpus: gpu_known.then_some(used_gpus),
        cgroup: cg.and_then(|d| cgroup::read_dir(d).ok()),
        processes,
    })
}
