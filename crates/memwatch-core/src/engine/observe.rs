//! From samples and probes to a policy observation, and one policy step.

use std::sync::Arc;

use super::Engine;
use crate::audit::{self, Reason};
use crate::config::OnCritical;
use crate::growth::Growth;
use crate::job::Limit;
use crate::job::Measurement;
use crate::policy::LimitKind;

/// One job's full measurement, from the blocking pool.
pub struct Measured {
    /// The job's name.
    pub name: String,
    /// The tree walked, its cgroup unchanged since the last walk, or the job gone.
    pub sample: Measurement,
    /// The cgroup the job owns, which a pause would freeze, decided at a walk (kept as it was when
    /// the tree was not walked).
    pub freezer: Option<crate::held::Frozen>,
    /// For a Slurm job attached by id: whether Slurm holds it suspended on this node.
    pub slurm_suspended: Option<bool>,
    /// Its processes pinned at this walk (`None`: not walked, the last walk's stay).
    pub pinned: Option<Vec<crate::host::Pinned>>,
    /// The freezer memwatch holds the job by (`MeasurePlan::held_by`) was found thawed: someone
    /// else undid the freeze (`docker unpause` writes the same `cgroup.freeze` on cgroup v2).
    pub held_thawed: bool,
}
use crate::policy::{
    self, GpuObservation, JobObservation, Observation, Projection, Reading, Resource, Temperature,
};
use crate::sample::Sample;
use crate::sample::cgroup::CgroupMemory;
use crate::sample::thermal::is_cpu_device;

/// Time to exhaustion under which probing goes fast.
const FAST_BELOW_MS: u64 = 5000;
/// How long fast probing lasts once asked for.
const FAST_FOR_MS: u64 = 3000;

/// The shortest window host growth is measured over: MemAvailable moves in steps of a few MiB every
/// few hundred ms, which a 1 s window turns into rates that jump from negative to twice the truth.
const HOST_WINDOW_MS: u64 = 5000;

/// MemAvailable's steps come at most this far apart while memory grows: the newest slope of the
/// host's sustained growth spans this long.
const HOST_STEP_MS: u64 = 1000;

/// What the engine last read of the host: the latest two samples and the host's memory, from them
/// and from the probes.
pub(super) struct Readings {
    /// The latest full sample.
    pub(super) latest: Option<Arc<Sample>>,
    /// The sample before `latest`, for rates.
    pub(super) previous: Option<Arc<Sample>>,
    /// The freshest MemAvailable and MemTotal (probe or full sample).
    pub(super) host_memory: Option<(u64, u64)>,
    /// Host memory in use (MemTotal − MemAvailable) over time: its growth is the host's. Tracked as
    /// use, not as MemAvailable, so that "the steeper slope" means faster growth; over at least
    /// `HOST_WINDOW_MS`, because MemAvailable moves in steps (the kernel folds per-CPU counts).
    pub(super) host_used: Growth,
    /// When the jobs' smaps_rollup was last read.
    pub(super) last_detailed_ms: u64,
}

impl Readings {
    /// Nothing read yet; host growth over `growth_window_ms` (`[sampling]`), at least
    /// `HOST_WINDOW_MS`.
    pub(super) fn new(growth_window_ms: u64) -> Readings {
        Readings {
            latest: None,
            previous: None,
            host_memory: None,
            host_used: Growth::stepped(growth_window_ms.max(HOST_WINDOW_MS), HOST_STEP_MS),
            last_detailed_ms: 0,
        }
    }
}

impl Engine {
    /// A full sample arrived, with a fresh measurement of each job (`None`: the job is gone). The
    /// sample was taken at `sampled_ms`, before the jobs were measured: host memory is placed there,
    /// among the probes', so that its growth is not skewed by the time measuring took.
    pub fn handle_sample(
        &mut self,
        sample: Arc<Sample>,
        jobs: Vec<Measured>,
        now_ms: u64,
        sampled_ms: u64,
    ) {
        if let Some(m) = &sample.host.memory {
            self.note_host(m.available_bytes, m.total_bytes, sampled_ms);
        }
        let mut killed: Vec<(String, u64)> = Vec::new();
        let mut thawed: Vec<String> = Vec::new();
        for Measured {
            name,
            sample: measured,
            freezer,
            slurm_suspended,
            pinned,
            held_thawed,
        } in jobs
        {
            if held_thawed {
                thawed.push(name.clone());
            }
            if let (Some(j), Some(suspended)) = (self.jobs.get_mut(&name), slurm_suspended) {
                j.slurm_suspended_since_ms = match (suspended, j.slurm_suspended_since_ms) {
                    (false, _) => None,
                    (true, Some(since)) => Some(since),
                    (true, None) => Some(now_ms),
                };
                if !suspended {
                    j.slurm_holders = None;
                }
            }
            // A root that died is gone even if its pid already names a new process.
            let measured = match measured {
                _ if !self.jobs.get(&name).is_none_or(|j| self.root_alive(j)) => Measurement::Gone,
                m => m,
            };
            match measured {
                Measurement::Unchanged(cg) => {
                    // As a probe: the tree is the last walk's, the cgroup is fresh.
                    if let Some(j) = self.jobs.get_mut(&name) {
                        j.cgroup_growth
                            .push(now_ms, cg.unreclaimable_bytes() as f64);
                        j.probe = Some(cg);
                        j.probed_at_ms = now_ms;
                    }
                }
                Measurement::Walked { sample: s, members } => {
                    if let Some(j) = self.jobs.get_mut(&name) {
                        if let Some(g) = s.gpu_bytes {
                            j.gpu_growth.push(now_ms, g as f64);
                        }
                        if let Some(cg) = &s.cgroup {
                            j.note_oom_kills(cg.oom_kills);
                            if !j.probing() {
                                j.cgroup_growth
                                    .push(now_ms, cg.unreclaimable_bytes() as f64);
                            }
                        }
                        j.note_processes(s.processes.len());
                        let before = j.last.as_ref().and_then(|l| l.cgroup.as_ref()?.oom_kills);
                        let now = s.cgroup.as_ref().and_then(|c| c.oom_kills);
                        if let (Some(before), Some(now)) = (before, now) {
                            if now > before {
                                killed.push((name.clone(), now - before));
                                if let Some(p) = j.pause.as_mut() {
                                    p.oom_killed += now - before;
                                }
                            }
                        }
                        j.last = Some(s);
                        j.members = members;
                        if let Some(p) = pinned {
                            j.pinned = p;
                        }
                        j.sampled_at_ms = now_ms;
                        // A Slurm job's cgroup holds Slurm's own processes: never frozen.
                        j.freezer = if j.slurm.is_some() { None } else { freezer };
                    }
                }
                Measurement::Gone => self.job_gone(&name, now_ms),
            }
        }
        for (name, n) in killed {
            let paused = self.jobs.get(&name).is_some_and(|j| j.pause.is_some());
            self.record(
                now_ms,
                audit::Action::OomKill,
                &name,
                Reason::JobCgroup,
                format!(
                    "the OOM killer ended {n} process(es) in the job's cgroups{}",
                    if paused { " while it was paused" } else { "" }
                ),
                false,
            );
        }
        for name in thawed {
            self.freeze_again(&name, now_ms);
        }
        self.verify(now_ms);
        self.renew_oomd_marks();
        self.check_slurm_holds(now_ms);
        self.adopt_pending_slurm(now_ms);
        self.finish_terminations(now_ms);
        self.readings.previous = self.readings.latest.replace(sample);
        self.dirty = true;
        self.step(now_ms);
        // Swap and limits left by ended jobs or a killed daemon: checked once a sample, not per probe.
        if !self.cfg.policy.dry_run {
            self.clear_leftovers();
        }
        self.adapt(now_ms);
        self.refresh_advice();
        self.watch_for_notices(now_ms);
    }

    /// Verify, don't trust: checks every acknowledged change memwatch can see against the job's
    /// latest measurement; records what it found.
    fn verify(&mut self, now_ms: u64) {
        let window_ms = self.cfg.adapt.verify_seconds.saturating_mul(1000);
        let mut found = Vec::new();
        for j in self.jobs.values_mut() {
            let Some(processes) = j.last.as_ref().map(|s| s.processes.len()) else {
                continue;
            };
            let Some(c) = j.config.as_mut() else {
                continue;
            };
            for d in &mut c.directives {
                if let Some(v) = d.verification.as_mut() {
                    if v.check(processes, now_ms, window_ms) {
                        found.push((j.name.clone(), d.generation, v.clone(), processes));
                    }
                }
            }
        }
        if !found.is_empty() {
            self.save();
        }
        for (job, generation, v, processes) in found {
            let verified = v.state == crate::adapt::VerifyState::Verified;
            let detail = if verified {
                format!("generation {generation} verified: {}", v.expect)
            } else {
                tracing::warn!(
                    job,
                    generation,
                    processes,
                    "an acknowledged change did not take effect"
                );
                match v.max_processes {
                    Some(_) => format!(
                        "generation {generation} unverified: acknowledged, but after {} s the job still has {processes} processes ({})",
                        self.cfg.adapt.verify_seconds, v.expect
                    ),
                    None => format!(
                        "generation {generation} unverified: acknowledged, but within {} s the trainer never reported running with it ({})",
                        self.cfg.adapt.verify_seconds, v.expect
                    ),
                }
            };
            let action = if verified {
                audit::Action::Verified
            } else {
                audit::Action::Unverified
            };
            self.record(now_ms, action, &job, Reason::Trainer, detail, false);
        }
    }

    /// A cheap probe: MemAvailable and each job's cgroup.
    pub fn handle_probe(
        &mut self,
        host: Option<(u64, u64)>,
        cgroups: Vec<(String, CgroupMemory)>,
        now_ms: u64,
    ) {
        if let Some((available, total)) = host {
            self.note_host(available, total, now_ms);
        }
        for (name, cg) in cgroups {
            if let Some(j) = self.jobs.get_mut(&name) {
                j.note_oom_kills(cg.oom_kills);
                j.note_probe(cg, now_ms);
            }
        }
        if self.probe_matters(now_ms) {
            self.step(now_ms);
        }
    }

    /// The kernel said something changed (a cgroup threshold crossed, a PSI trigger fired): probe fast
    /// for a while, and run the policy on every probe. The host's pressure trigger alone while calm
    /// (every job's cgroup watched by its own thresholds, nothing near trouble) is answered by one
    /// full sample instead: it reads the pressure and every job, and its policy step probes fast
    /// only if it finds trouble, so a stall elsewhere on the host costs one sample, not 3 s of
    /// probes every 10 ms.
    pub fn handle_wake(&mut self, now_ms: u64, wake: super::Wake) -> super::WakeAnswer {
        if wake == super::Wake::HostPressure && self.calm(now_ms) {
            tracing::debug!(
                "the host's memory pressure trigger fired while calm: a full sample now"
            );
            return super::WakeAnswer::FullSample;
        }
        self.fast_until_ms = self.fast_until_ms.max(now_ms + FAST_FOR_MS);
        super::WakeAnswer::Probe
    }

    /// Whether this probe could change a decision: a level is raised or close to rising, a job grows
    /// toward a limit, or probing is fast anyway. When calm, the probe only records growth and the full
    /// sample (every second) runs the policy; a job that starts to grow is caught by its growth rate.
    fn probe_matters(&self, now_ms: u64) -> bool {
        const NEAR: f64 = 0.05;
        let p = &self.cfg.policy;
        if now_ms < self.fast_until_ms
            || self
                .policy
                .levels
                .values()
                .any(|l| l.level != crate::policy::Level::Ok)
        {
            return true;
        }
        if self
            .readings
            .host_memory
            .is_some_and(|(a, t)| t > 0 && 1.0 - a as f64 / t as f64 >= p.host_memory.warn.0 - NEAR)
        {
            return true;
        }
        self.jobs.values().any(|j| {
            let near_level = j
                .cgroup()
                .and_then(|c| {
                    c.limit_bytes
                        .filter(|l| *l > 0)
                        .map(|l| c.unreclaimable_bytes() as f64 / l as f64)
                })
                .is_some_and(|r| r >= p.job_cgroup.warn.0 - NEAR);
            let growing = self.limits(j).iter().any(|l| {
                l.time_to_exhaustion_seconds
                    .is_some_and(|t| t * 1000.0 < FAST_BELOW_MS as f64)
            });
            near_level || growing || j.pause.is_some() || self.over_by_cache(j)
        })
    }

    fn note_host(&mut self, available: u64, total: u64, now_ms: u64) {
        self.readings.host_memory = Some((available, total));
        self.readings
            .host_used
            .push(now_ms, total.saturating_sub(available) as f64);
    }

    /// Every limit a job's memory runs against, with its headroom and growth.
    pub(super) fn limits(&self, j: &crate::job::Job) -> Vec<Limit> {
        self.limits_with(j, false)
    }

    /// Limits with growth as a trend only (`Growth::sustained_rate_per_second`): what prediction and
    /// resume decisions use, so bursts and per-step buffers pause nothing.
    pub(super) fn limits_with(&self, j: &crate::job::Job, sustained: bool) -> Vec<Limit> {
        self.limits_on(j, sustained)
            .into_iter()
            .map(|(_, l)| l)
            .collect()
    }

    /// `limits_with`, each with the resource it is a limit of (the job's cgroup, the host's RAM, a
    /// GPU's memory).
    pub(super) fn limits_on(&self, j: &crate::job::Job, sustained: bool) -> Vec<(Resource, Limit)> {
        let rate = |g: &crate::growth::Growth| {
            if sustained {
                g.sustained_rate_per_second()
            } else {
                g.rate_per_second()
            }
        };
        let mut v = Vec::new();
        if let Some(cg) = j.cgroup() {
            if let Some(limit) = cg.limit_bytes {
                v.push((
                    Resource::JobCgroup(j.name.clone()),
                    Limit::new(
                        LimitKind::Cgroup,
                        limit.saturating_sub(cg.unreclaimable_bytes()),
                        rate(&j.cgroup_growth),
                    ),
                ));
            }
        }
        if let Some((available, _)) = self.readings.host_memory {
            v.push((
                Resource::HostMemory,
                Limit::new(
                    LimitKind::Host,
                    available,
                    if sustained {
                        self.readings.host_used.sustained_rate_per_second()
                    } else {
                        self.readings.host_used.trend_per_second()
                    },
                ),
            ));
        }
        if let (Some(sample), Some(last)) = (&self.readings.latest, &j.last) {
            for idx in last.gpus.iter().flatten() {
                let Some(g) = sample.gpus.iter().find(|g| g.index == *idx) else {
                    continue;
                };
                if let (Some(total), Some(used)) = (g.memory_total_bytes, g.memory_used_bytes) {
                    v.push((
                        Resource::GpuMemory(*idx),
                        Limit::new(
                            LimitKind::Gpu(*idx),
                            total.saturating_sub(used),
                            rate(&j.gpu_growth),
                        ),
                    ));
                }
            }
        }
        v
    }

    fn action_of(&self, limit: LimitKind) -> OnCritical {
        let p = &self.cfg.policy;
        match limit {
            LimitKind::Cgroup => p.job_cgroup.action,
            LimitKind::Host => p.host_memory.action,
            LimitKind::Gpu(_) => p.gpu_memory.action,
        }
    }

    fn observation(&self, now_ms: u64) -> Observation {
        let s = self.readings.latest.as_deref();
        let src = policy::HostSources {
            sample: s,
            memory: self.readings.host_memory,
        };
        let host = policy::Resource::HOST
            .iter()
            .map(|r| (r.clone(), r.read(&src)))
            .collect();
        // The CPU's sensors (and those `[policy.sensors]` counts as a CPU's), the one nearest its
        // shutdown point; an NVMe drive or a Wi-Fi card near its own pauses nothing by default.
        let counted = &self.cfg.policy.sensors;
        let cpu_temperature = s.and_then(|s| {
            s.host
                .temperatures
                .iter()
                .filter(|t| is_cpu_device(t.device()) || counted.counts(t.device()))
                .map(|t| Temperature {
                    celsius: t.celsius,
                    slowdown: t.max_celsius,
                    shutdown: t.crit_celsius,
                })
                .max_by(|a, b| {
                    let margin = |t: &Temperature| {
                        t.celsius
                            - t.shutdown.unwrap_or(
                                self.cfg.policy.cpu_temperature.fallback_shutdown_celsius,
                            )
                    };
                    margin(a).total_cmp(&margin(b))
                })
        });
        let gpus = s
            .map(|s| {
                s.gpus
                    .iter()
                    .map(|g| GpuObservation {
                        index: g.index,
                        memory: match (g.memory_used_bytes, g.memory_total_bytes) {
                            (Some(u), Some(t)) if t > 0 => Reading::Value(u as f64 / t as f64),
                            _ => Reading::Absent,
                        },
                        temperature: g.temperature_celsius.map(|c| Temperature {
                            celsius: c,
                            slowdown: g.temperature_slowdown_celsius,
                            shutdown: g.temperature_shutdown_celsius,
                        }),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let jobs = self
            .jobs
            .values()
            .map(|j| {
                let cgroup = match j.cgroup() {
                    Some(cg) => match cg.limit_bytes {
                        Some(l) if l > 0 => {
                            Reading::Value(cg.unreclaimable_bytes() as f64 / l as f64)
                        }
                        _ => Reading::Absent,
                    },
                    None if j.cgroup_dir.is_some() => Reading::Unknown,
                    None => Reading::Absent,
                };
                // Only limits whose resource may pause count for prediction; a job running on
                // emergency room is guarded by its way out on the limits the room relieves.
                let on_room = self.runs_on_room(&j.name);
                let limits: Vec<Limit> = self
                    .limits_with(j, true)
                    .into_iter()
                    .filter(|l| self.action_of(l.limit) == OnCritical::Pause)
                    .filter(|l| !(on_room && l.limit.is_ram()))
                    .collect();
                let projections = limits
                    .iter()
                    .map(|l| Projection {
                        limit: l.limit,
                        headroom_bytes: l.headroom_bytes,
                        growth_bytes_per_second: l.growth_bytes_per_second,
                    })
                    .collect();
                JobObservation {
                    name: j.name.clone(),
                    cgroup,
                    gpus: j.last.as_ref().and_then(|l| l.gpus.clone()),
                    projections,
                    pause: j.pause.as_ref().map(crate::job::Pause::policy),
                }
            })
            .collect();
        Observation {
            now_ms,
            host,
            cpu_temperature,
            gpus,
            jobs,
        }
    }

    /// One policy step and its effects.
    pub fn step(&mut self, now_ms: u64) {
        let obs = self.observation(now_ms);
        let near = obs
            .jobs
            .iter()
            .any(|j| j.soonest().is_some_and(|(_, t)| t < FAST_BELOW_MS));
        self.relieve();
        let (next, decisions) = policy::evaluate(&self.policy, &obs, &self.cfg.policy);
        self.policy = next;
        let troubled = self.policy.levels.iter().any(|(k, l)| {
            l.level >= policy::Level::Warn && *k != policy::Resource::Swap && !k.is_temperature()
        });
        if near || troubled {
            self.fast_until_ms = now_ms + FAST_FOR_MS;
        }
        for d in decisions {
            self.apply(d, now_ms);
        }
        self.way_out(now_ms);
    }
}
