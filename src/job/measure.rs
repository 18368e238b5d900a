//! Measuring an attached job: its process tree's memory, its memory cgroup and its GPU memory.
//! Blocking reads; the daemon runs them off the async threads.

use std::path::Path;

use super::members::Members;
use crate::proc::{self, Memory, ProcRef};
use crate::sample::cgroup::{self, CgroupDir, CgroupMemory};
use crate::sample::gpu::GpuSample;
pub use memwatch_core::job::{JobSample, Measurement, ProcessSample};

/// The memory cgroup a process lives in, and the container or Slurm job its cgroup path names: one
/// read of /proc/PID/cgroup. A path the daemon cannot find under its cgroup mount (a daemon in a
/// cgroup namespace of its own is given paths outside it, `/../..`) is no cgroup, said in the log:
/// never the hierarchy's root in its place, whose limit is not the job's.
pub fn cgroup_of(root: &Path, pid: u32) -> (Option<CgroupDir>, Option<crate::job::origin::Origin>) {
    let path = proc::dir(root, pid).join("cgroup");
    let Some(m) = crate::sample::error::read_text(&path)
        .ok()
        .and_then(|text| cgroup::parse_membership(&path, &text).ok())
    else {
        return (None, None);
    };
    let dir = cgroup::locate(root, &m).filter(|d| {
        let found = cgroup::names_its_dir(d);
        if !found {
            tracing::warn!(
                pid,
                cgroup = %d.path,
                mount = %d.mount.display(),
                "the process's memory cgroup is not under the daemon's cgroup mount (is the daemon in a \
                 cgroup namespace of its own? run it in the host's): its cgroup's limit is not watched"
            );
        }
        found
    });
    let origin = crate::job::origin::of_membership(&m).map(|mut o| {
        o.name = super::runtime::name(root, &o);
        o
    });
    (dir, origin)
}

/// Does NVML's `pid` belong to this process? NVML reports host pids; a process in a container has its
/// own in NSpid, outermost first.
fn same_process(nvml_pid: u32, pid: u32, nspid: &[u32]) -> bool {
    nvml_pid == pid || nspid.first() == Some(&nvml_pid)
}

/// RSS moved this much since a process's PSS was read, its PSS is read again rather than carried:
/// the larger of 8 MiB and a twentieth of its RSS.
fn moved(before: u64, now: u64) -> bool {
    before.abs_diff(now) > (8 << 20).max(now / 20)
}

/// Measures the tree under `root_ref`, with the members of its cgroup `cg` when they can stand for
/// the tree ([`Members::holding`]); `None` when the root is gone or was replaced. The members are read
/// before the walk, so that a fork during it leaves them short of the tree (not kept) rather than a
/// step ahead of it.
///
/// With `previous` given, PSS and swap are carried over from it, with the time they were read, for
/// each process whose RSS has not moved much since; RSS comes from /proc/PID/stat every time.
/// smaps_rollup walks a process's page tables, the costliest read memwatch makes, so the daemon
/// asks for every process's every few seconds and when memory is tight, and in between only for
/// processes that are new or growing: a carried PSS is never far from the truth, and its age says
/// how old it is.
pub fn measure(
    root: &Path,
    root_ref: ProcRef,
    cg: Option<&CgroupDir>,
    members: Option<&Path>,
    gpus: &[GpuSample],
    now_ms: u64,
    previous: Option<&JobSample>,
) -> Option<(JobSample, Option<Members>)> {
    let in_cgroup = cg.and_then(super::members::read);
    let mut tree = proc::descendants(root, root_ref.pid)?;
    if tree.procs.first()?.start_time != root_ref.start_time {
        return None;
    }
    // A Slurm job's other steps: their tasks are not the batch script's descendants.
    if let Some(dir) = members {
        let mut pids = Vec::new();
        cgroup::pids_below(dir, &mut pids);
        for s in crate::slurm::tasks_of(root, &pids) {
            if !tree.procs.iter().any(|p| p.pid == s.pid) {
                tree.procs.push(s);
            }
        }
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
        let carried = previous
            .and_then(|prev| prev.processes.iter().find(|q| q.pid == p.pid))
            .filter(|q| q.pss_read_ms.is_some() && !moved(q.rss_at_pss_read, rss_now));
        let (mem, pss_read_ms, rss_at_pss_read) = match carried {
            Some(q) => (
                Memory {
                    rss_bytes: rss_now,
                    pss_bytes: q.pss_bytes,
                    swap_bytes: q.swap_bytes,
                },
                q.pss_read_ms,
                q.rss_at_pss_read,
            ),
            None => match proc::read_memory(root, p.pid) {
                // smaps_rollup's own Rss is the one that goes with its PSS.
                Ok(m) => (
                    Memory {
                        rss_bytes: rss_now,
                        ..m
                    },
                    Some(now_ms),
                    m.rss_bytes,
                ),
                Err(_) => (
                    Memory {
                        rss_bytes: rss_now,
                        ..Memory::default()
                    },
                    None,
                    0,
                ),
            },
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
            pss_read_ms,
            rss_at_pss_read,
            swap_bytes: mem.swap_bytes,
            gpu_bytes: if gpu_known {
                Some(gpu_bytes.unwrap_or(0))
            } else {
                None
            },
        });
    }
    used_gpus.sort_unstable();
    let pids: Vec<u32> = processes.iter().map(|p| p.pid).collect();
    let sample = JobSample {
        timestamp_ms: now_ms,
        rss_bytes: processes.iter().map(|p| p.rss_bytes).sum(),
        pss_bytes: processes.iter().map(|p| p.pss_bytes).sum(),
        pss_read_ms: processes.iter().filter_map(|p| p.pss_read_ms).min(),
        process_count: processes.len(),
        swap_bytes: processes.iter().map(|p| p.swap_bytes).sum(),
        gpu_bytes: gpu_known.then(|| processes.iter().filter_map(|p| p.gpu_bytes).sum()),
        gpus: gpu_known.then_some(used_gpus),
        cgroup: cg.and_then(|d| cgroup::read_dir(d).ok()),
        processes,
    };
    Some((sample, in_cgroup.and_then(|m| m.holding(&pids))))
}

/// The job's cgroup, when it shows nothing a walk would need to see since the walk `previous` came
/// from: the same `members`, usage and unreclaimable memory within max(8 MiB, 5 %) of that walk's,
/// and the same count of OOM kills. One read of each `cgroup.procs`, of the usage file and, where
/// that walk found clean page cache enough to move a level (`CgroupMemory::cache_matters`), of
/// memory.stat, instead of every process's files: a job growing into its cache at its limit moves
/// its unreclaimable memory, not its usage.
pub fn unchanged(cg: &CgroupDir, members: &Members, previous: &JobSample) -> Option<CgroupMemory> {
    let before = previous.cgroup.as_ref()?;
    if !super::members::same(&cg.dir, members) {
        return None;
    }
    let usage_bytes = cgroup::read_usage(cg).ok()?;
    let now = if before.cache_matters() {
        before.read_again(usage_bytes, cgroup::read_cache(cg)?)
    } else {
        CgroupMemory {
            usage_bytes,
            ..before.clone()
        }
    };
    let oom_kills = cgroup::read_oom_kills(cg);
    (!moved(before.usage_bytes, usage_bytes)
        && !moved(before.unreclaimable_bytes(), now.unreclaimable_bytes())
        && oom_kills == before.oom_kills)
        .then_some(now)
}

/// A job's measurement: unchanged when `members` (those of its last walk) and [`unchanged`] say
/// so, else its tree walked.
pub fn measurement(
    members: Option<&Members>,
    cg: Option<&CgroupDir>,
    previous: Option<&JobSample>,
    walk: impl FnOnce() -> Option<(JobSample, Option<Members>)>,
) -> Measurement {
    if let (Some(m), Some(cg), Some(prev)) = (members, cg, previous) {
        if let Some(now) = unchanged(cg, m, prev) {
            return Measurement::Unchanged(now);
        }
    }
    match walk() {
        Some((sample, members)) => Measurement::Walked { sample, members },
        None => Measurement::Gone,
    }
}
