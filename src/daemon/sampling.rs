//! The two ways the owner task reads the machine: the full sample (host, GPUs and every job's tree,
//! on the blocking pool) and the cheap probe (MemAvailable and each job's cgroup usage, inline).

use tokio::task::JoinHandle;

use crate::engine::{Engine, Measured};
use crate::job::measure::Measurement;
use crate::sample::{Sample, Sampler, cgroup, meminfo};

/// The sampler back, its sample, each job's measurement, and when the sample was taken (measuring
/// the jobs after it can take a while: the host's numbers are as old as the sample).
pub(super) type FullResult = (Sampler, Sample, Vec<Measured>, std::time::Instant);

/// Awaits the in-flight full sample, or never when there is none.
pub(super) async fn in_flight(
    h: &mut Option<JoinHandle<FullResult>>,
) -> Result<FullResult, tokio::task::JoinError> {
    match h {
        Some(h) => h.await,
        None => std::future::pending().await,
    }
}

/// Takes a full sample and measures every job, on the blocking pool.
pub(super) fn spawn_full(
    mut sampler: Sampler,
    engine: &mut Engine,
    now_ms: u64,
    process_root: std::path::PathBuf,
) -> JoinHandle<FullResult> {
    let plan = engine.measure_plan(now_ms);
    tokio::task::spawn_blocking(move || {
        let sample = sampler.sample();
        let taken = std::time::Instant::now();
        let now = sample.timestamp_ms;
        let jobs = plan
            .into_iter()
            .map(|p| {
                let m = crate::job::measure::measurement(
                    p.members_at_walk.as_ref(),
                    p.cgroup.as_ref(),
                    p.previous.as_ref(),
                    || {
                        crate::job::measure::measure(
                            &process_root,
                            p.root,
                            p.cgroup.as_ref(),
                            p.members.as_deref(),
                            &sample.gpus,
                            now,
                            p.previous.as_ref(),
                        )
                    },
                );
                // Which cgroup a pause would freeze is decided at each walk, so the pause itself
                // walks nothing.
                let freezer = match &m {
                    Measurement::Walked { sample, .. } => {
                        let pids: Vec<u32> = sample.processes.iter().map(|p| p.pid).collect();
                        crate::act::freeze::owned(&process_root, &pids, p.owner)
                    }
                    _ => None,
                };
                // Its processes pinned, so that a pause signals them before it reads anything.
                let pinned = match &m {
                    Measurement::Walked { sample, .. } => {
                        let walked: Vec<(u32, u32)> = sample
                            .processes
                            .iter()
                            .filter(|q| q.pid != p.root.pid)
                            .map(|q| (q.pid, q.ppid))
                            .collect();
                        Some(crate::act::pin::pin_members(
                            &process_root,
                            &walked,
                            &p.pinned,
                            crate::act::pin::MAX_PINNED,
                        ))
                    }
                    _ => None,
                };
                // A Slurm job (its members are its cgroup's): is Slurm holding it suspended here?
                let slurm_suspended = p
                    .members
                    .as_ref()
                    .and(p.cgroup.as_ref())
                    .map(|c| crate::slurm::suspended_here(&process_root, c));
                // The freeze memwatch holds it by, still asked for? (One small read.)
                let held_thawed = p
                    .held_by
                    .as_ref()
                    .is_some_and(crate::act::freeze::thawed_by_another);
                Measured {
                    name: p.name,
                    sample: m,
                    freezer,
                    slurm_suspended,
                    pinned,
                    held_thawed,
                }
            })
            .collect();
        (sampler, sample, jobs, taken)
    })
}

/// What a probe saw: (MemAvailable, MemTotal), and each job's cgroup.
pub(super) type Probe = (Option<(u64, u64)>, Vec<(String, cgroup::CgroupMemory)>);

/// The cheap probe: MemAvailable and every job's cgroup. Small reads, done inline.
/// The usage file is read (one small read), and memory.stat's page cache where the last reading's
/// clean cache could move the job's level (`CgroupMemory::cache_matters`; about 50 µs more): a
/// job's own memory grows into its cache at its limit with its usage flat, which a cache as of the
/// last full sample would hide. The limit comes from the last full read of the cgroup, which every
/// full sample refreshes.
pub(super) fn probe(engine: &Engine, host_meminfo: &mut meminfo::MeminfoFile, now: u64) -> Probe {
    let host = engine
        .probe_host(now)
        .then(|| host_meminfo.read().ok())
        .flatten()
        .map(|m| (m.available_bytes, m.total_bytes));
    let cgroups = engine
        .probe_plan()
        .into_iter()
        .filter_map(|(name, dir, last)| {
            // Usage, and the OOM kills: a job the OOM killer ends may take its cgroup with it
            // before the next full sample reads them.
            let fresh = match last {
                Some(last) => {
                    // The OOM kills first: the cache's read (about 50 µs here, more in a slow
                    // guest) must not widen the time in which a killed job's cgroup may vanish.
                    let oom_kills = cgroup::read_oom_kills(&dir).or(last.oom_kills);
                    let usage = cgroup::read_usage(&dir).ok()?;
                    let cache = last.cache_matters().then(|| cgroup::read_cache(&dir));
                    let mut fresh = match cache.flatten() {
                        Some(cache) => last.read_again(usage, cache),
                        None => cgroup::CgroupMemory {
                            usage_bytes: usage,
                            ..last
                        },
                    };
                    fresh.oom_kills = oom_kills;
                    fresh
                }
                None => cgroup::read_dir(&dir).ok()?,
            };
            Some((name, fresh))
        })
        .collect();
    (host, cgroups)
}
