//! The policy: a pure function from (previous state, observation, config) to (new state, decisions).
//!
//! No I/O, no clock, no tokio: the time is the observation's. The daemon turns samples into an
//! [`Observation`], calls [`evaluate`], and hands the decisions to `act`. Table-driven tests in
//! `tests.rs` run scenarios (sequences of observations) and check the decisions after each.

mod level;
mod limit;
mod resource;
mod room;
mod spared;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::config::{OnCritical, OnMaxPause, Policy, RatioPolicy, TempPolicy};
pub use level::{Level, LevelState, Reading, Thresholds};
pub use limit::{LimitKind, UnknownLimit};
pub use resource::{Cause, HostSources, KeyError, Resource, Resumed};
pub use spared::{Spared, spare};

/// A temperature with the device's own slowdown and shutdown points, where it reports them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Temperature {
    /// The reading, °C.
    pub celsius: f64,
    /// The point where the device slows itself down, if it says.
    pub slowdown: Option<f64>,
    /// The point where it shuts down, if it says.
    pub shutdown: Option<f64>,
}

/// One GPU as the policy sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuObservation {
    /// The GPU's index.
    pub index: u32,
    /// Memory used / total.
    pub memory: Reading,
    /// Its temperature, if NVML says.
    pub temperature: Option<Temperature>,
}

/// Where a job's memory is heading: the tightest limit, the room left under it and the growth rate.
#[derive(Debug, Clone, PartialEq)]
pub struct Projection {
    /// Which limit.
    pub limit: LimitKind,
    /// Bytes left before the limit.
    pub headroom_bytes: u64,
    /// Growth toward it, bytes/s.
    pub growth_bytes_per_second: f64,
}

/// Growth below this (bytes per second) is measurement noise, not growth.
pub const MIN_GROWTH: f64 = 4096.0;

impl Projection {
    /// Seconds until the limit is reached at the current rate; `None` when not growing. The one
    /// definition of time to exhaustion: `job::Limit` shows it.
    pub fn time_to_exhaustion_seconds(&self) -> Option<f64> {
        (self.growth_bytes_per_second >= MIN_GROWTH)
            .then(|| self.headroom_bytes as f64 / self.growth_bytes_per_second)
    }

    /// Milliseconds until the limit is reached at the current rate; `None` when not growing.
    pub fn time_to_exhaustion_ms(&self) -> Option<u64> {
        self.time_to_exhaustion_seconds()
            .map(|s| (s * 1000.0) as u64)
    }
}

/// One attached job as the policy sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobObservation {
    /// The job's name.
    pub name: String,
    /// Unreclaimable memory (usage less clean page cache) / limit of the job's memory cgroup; `Absent` when it has no limit.
    pub cgroup: Reading,
    /// GPUs the job holds memory on; `None` when NVML does not say.
    pub gpus: Option<Vec<u32>>,
    /// One projection per limit whose resource may pause the job.
    pub projections: Vec<Projection>,
    /// The job's pause, as the engine holds it (the one record of it; the policy keeps no copy).
    pub pause: Option<PauseState>,
}

impl JobObservation {
    /// The projection that runs out first, if any is growing.
    pub fn soonest(&self) -> Option<(&Projection, u64)> {
        self.projections
            .iter()
            .filter_map(|p| p.time_to_exhaustion_ms().map(|t| (p, t)))
            .min_by_key(|(_, t)| *t)
    }
}

/// Everything the policy looks at, at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// When the observation was made (engine clock, ms).
    pub now_ms: u64,
    /// Each host-wide resource ([`Resource::HOST`]) with its reading ([`Resource::read`]).
    pub host: Vec<(Resource, Reading)>,
    /// The hottest CPU sensor relative to its own thresholds.
    pub cpu_temperature: Option<Temperature>,
    /// Each GPU.
    pub gpus: Vec<GpuObservation>,
    /// Each attached job.
    pub jobs: Vec<JobObservation>,
}

/// Who paused a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum By {
    /// memwatch's policy, on a level or a projection.
    Policy,
    /// A person (`memwatch pause`).
    User,
}

/// What the policy needs of a paused job: the engine keeps it in the job's one pause record and shows
/// it to the policy in each observation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PauseState {
    /// When the pause began (engine clock, ms).
    pub since_ms: u64,
    /// The policy or a person.
    pub by: By,
    /// What caused it.
    pub reasons: Vec<Cause>,
    /// The limit and growth rate when a projection caused the pause.
    pub projected: Option<(LimitKind, f64)>,
    /// Set once the maximum pause was reached and the job stays paused.
    pub expired: bool,
    /// Resuming needs room for the rate seen at the pause, not the (nil) growth of a job that is
    /// held: so for every pause on a projection (`room.rs`) and the way out's own hold. The policy
    /// decides by `projected`; the flag is kept in the pause's record, where an earlier build that
    /// reads the state file holds the pause the same way.
    #[serde(default)]
    pub strict: bool,
}

/// The policy's memory of one job (its pause is not here: it lives in the job's record).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobState {
    /// Critical resources whose current episode the user chose to run through (a manual resume).
    pub overridden: BTreeSet<Resource>,
    /// A checkpoint was requested; pause at this time (ms).
    pub checkpoint_deadline_ms: Option<u64>,
    /// The engine's way out is in charge of this job's memory pause: the policy still resumes it when
    /// room comes back, but never on the maximum pause (the engine ends it).
    #[serde(default)]
    pub managed: bool,
    /// Resumed once with no way out of a projection's pause (`spared.rs`): until the episode ends, a
    /// projection alone does not pause it again.
    #[serde(default)]
    pub spared: Option<Spared>,
}

/// The policy's whole state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct State {
    /// Each resource's level, by key (`host_memory`, `gpu_memory:0`, `job_cgroup:NAME` …).
    pub levels: BTreeMap<Resource, LevelState>,
    /// Each job's memory.
    pub jobs: BTreeMap<String, JobState>,
}

/// What the policy wants done or recorded.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// A resource changed level.
    LevelChanged {
        /// The resource.
        key: Resource,
        /// The level before.
        from: Level,
        /// The level now.
        to: Level,
        /// The value behind the change.
        value: Option<f64>,
    },
    /// Send the job its checkpoint signal (before a pause, where `policy.checkpoint_signal` is
    /// set).
    Checkpoint {
        /// The job.
        job: String,
        /// What is critical for it (the first, by key): its event's reason.
        cause: Cause,
        /// Why, for people.
        reason: String,
    },
    /// Pause the job: once it is paused, `pause` is its record's policy part.
    Pause {
        /// The job.
        job: String,
        /// The first of the pause's causes (by key, a projection last): its event's reason.
        cause: Cause,
        /// Why, for people.
        reason: String,
        /// What the pause is to hold, for the job's record.
        pause: PauseState,
    },
    /// Resume the job.
    Resume {
        /// The job.
        job: String,
        /// What ended the pause: its event's reason.
        why: Resumed,
        /// Why, for people.
        reason: String,
    },
    /// Stop the job (the maximum pause was reached and the configuration says to terminate): its
    /// event's reason is `max_pause`.
    Terminate {
        /// The job.
        job: String,
        /// Why, for people.
        reason: String,
    },
    /// The maximum pause was reached and the configuration says to stay paused: its event's reason
    /// is `max_pause`.
    StayPaused {
        /// The job.
        job: String,
        /// Why, for people.
        reason: String,
    },
}

fn ratio_thresholds(p: &RatioPolicy) -> Thresholds {
    Thresholds {
        warn_enter: p.warn.0,
        warn_leave: p.warn_leave.0,
        critical_enter: p.critical.0,
        critical_leave: p.critical_leave.0,
        enter_hold_ms: p.enter_hold_ms,
        leave_hold_ms: p.leave_hold_ms,
    }
}

/// Temperature thresholds from the device's own points, or the configured fallbacks.
pub fn temp_thresholds(t: &Temperature, p: &TempPolicy) -> Thresholds {
    let slowdown = t.slowdown.unwrap_or(p.fallback_slowdown_celsius);
    let shutdown = t
        .shutdown
        .unwrap_or(p.fallback_shutdown_celsius)
        .max(slowdown);
    let warn_enter = slowdown - p.warn_below_slowdown;
    let critical_enter = (shutdown - p.critical_below_shutdown).max(warn_enter);
    Thresholds {
        warn_enter,
        warn_leave: warn_enter - 5.0,
        critical_enter,
        critical_leave: (slowdown - p.resume_below_slowdown).min(critical_enter - 1.0),
        enter_hold_ms: p.enter_hold_ms,
        leave_hold_ms: p.leave_hold_ms,
    }
}

/// The level keys, with their reading, thresholds and action, for one observation.
fn resources(obs: &Observation, cfg: &Policy) -> Vec<(Resource, Reading, Thresholds, OnCritical)> {
    let mut v: Vec<_> = obs
        .host
        .iter()
        .filter_map(|(r, reading)| {
            let p = cfg.ratio(r.kind())?;
            Some((r.clone(), *reading, ratio_thresholds(p), p.action))
        })
        .collect();
    let temp = |t: &Option<Temperature>, p: &TempPolicy| match t {
        Some(t) => (Reading::Value(t.celsius), temp_thresholds(t, p)),
        None => (
            Reading::Absent,
            temp_thresholds(
                &Temperature {
                    celsius: 0.0,
                    slowdown: None,
                    shutdown: None,
                },
                p,
            ),
        ),
    };
    let (r, t) = temp(&obs.cpu_temperature, &cfg.cpu_temperature);
    v.push((Resource::CpuTemperature, r, t, cfg.cpu_temperature.action));
    for g in &obs.gpus {
        v.push((
            Resource::GpuMemory(g.index),
            g.memory,
            ratio_thresholds(&cfg.gpu_memory),
            cfg.gpu_memory.action,
        ));
        let (r, t) = temp(&g.temperature, &cfg.gpu_temperature);
        v.push((
            Resource::GpuTemperature(g.index),
            r,
            t,
            cfg.gpu_temperature.action,
        ));
    }
    for j in &obs.jobs {
        v.push((
            Resource::JobCgroup(j.name.clone()),
            j.cgroup,
            ratio_thresholds(&cfg.job_cgroup),
            cfg.job_cgroup.action,
        ));
    }
    v
}

/// Whether resource `r` concerns job `job`: the host's resources every job; a GPU's the jobs on
/// it (every job where NVML does not say); a job's cgroup that job alone.
fn concerns(r: &Resource, job: &JobObservation) -> bool {
    match r {
        Resource::JobCgroup(name) => *name == job.name,
        Resource::GpuMemory(i) | Resource::GpuTemperature(i) => {
            job.gpus.as_ref().is_none_or(|gpus| gpus.contains(i))
        }
        _ => true,
    }
}

fn describe(r: &Resource, l: &LevelState) -> String {
    let what = r.words();
    match l.value {
        Some(v) if r.is_temperature() => format!("{what} at {v:.0} °C"),
        Some(v) => format!("{what} at {:.1} %", v * 100.0),
        None => what,
    }
}

/// Advances the policy by one observation.
pub fn evaluate(prev: &State, obs: &Observation, cfg: &Policy) -> (State, Vec<Decision>) {
    let now = obs.now_ms;
    let mut out = Vec::new();
    let mut state = State::default();
    let mut pausing = BTreeSet::new();

    for (key, reading, thresholds, action) in resources(obs, cfg) {
        let before = prev
            .levels
            .get(&key)
            .copied()
            .unwrap_or_else(|| LevelState::new(now));
        let after = level::step(before, reading, &thresholds, now);
        if after.level != before.level {
            out.push(Decision::LevelChanged {
                key: key.clone(),
                from: before.level,
                to: after.level,
                value: after.value,
            });
        }
        if after.level == Level::Critical && action == OnCritical::Pause {
            pausing.insert(key.clone());
        }
        state.levels.insert(key, after);
    }

    for job in &obs.jobs {
        let mut js = prev.jobs.get(&job.name).cloned().unwrap_or_default();
        // An override lasts while its resource stays critical.
        js.overridden.retain(|k| pausing.contains(k));
        let critical: Vec<&Resource> = pausing
            .iter()
            .filter(|k| concerns(k, job) && !js.overridden.contains(*k))
            .collect();
        let soonest = job.soonest();
        let tte = soonest.map(|(_, t)| t);
        let spared = spared::upkeep(&mut js, job.pause.is_some(), &state.levels, now, cfg);
        let predicted = !spared && tte.is_some_and(|t| t < cfg.reaction_ms);

        match job.pause.clone() {
            None => {
                if critical.is_empty() && !predicted {
                    js.checkpoint_deadline_ms = None;
                } else {
                    let mut reasons: Vec<String> = critical
                        .iter()
                        .map(|k| describe(k, &state.levels[*k]))
                        .collect();
                    if let (true, Some((p, t))) = (predicted, soonest) {
                        reasons.push(format!(
                            "{} limit projected to be reached in {t} ms at {:.0} MiB/s",
                            p.limit,
                            p.growth_bytes_per_second / 1048576.0
                        ));
                    }
                    let reason = reasons.join("; ");
                    // Never empty here: something is critical, or a projection runs out.
                    let mut keys: Vec<Cause> = critical
                        .iter()
                        .map(|k| Cause::Resource((*k).clone()))
                        .collect();
                    if predicted {
                        keys.push(Cause::Predicted);
                    }
                    let cause = keys[0].clone();
                    let time_to_checkpoint = tte.is_none_or(|t| t > 2 * cfg.checkpoint_grace_ms);
                    match js.checkpoint_deadline_ms {
                        None if !cfg.checkpoint_signal.is_empty()
                            && time_to_checkpoint
                            && !predicted =>
                        {
                            js.checkpoint_deadline_ms = Some(now + cfg.checkpoint_grace_ms);
                            out.push(Decision::Checkpoint {
                                job: job.name.clone(),
                                cause,
                                reason,
                            });
                        }
                        Some(deadline) if now < deadline && !predicted => {}
                        _ => {
                            js.checkpoint_deadline_ms = None;
                            out.push(Decision::Pause {
                                job: job.name.clone(),
                                cause,
                                reason,
                                pause: PauseState {
                                    since_ms: now,
                                    by: By::Policy,
                                    reasons: keys,
                                    projected: soonest
                                        .filter(|_| predicted)
                                        .map(|(p, _)| (p.limit, p.growth_bytes_per_second)),
                                    expired: false,
                                    strict: predicted,
                                },
                            });
                        }
                    }
                }
            }
            Some(p) if p.by == By::Policy && !p.expired => {
                let paused_ms = now.saturating_sub(p.since_ms);
                // After a pause for fast growth: only into room for the growth that caused it
                // (`room.rs`); the nil growth of a job that is held is no sign that it stopped.
                let room_ok = room::room_to_resume(&p, job, now, cfg);
                if paused_ms >= cfg.max_pause_seconds.saturating_mul(1000) && !js.managed {
                    let reason = format!("paused for the maximum of {} s", cfg.max_pause_seconds);
                    match cfg.on_max_pause {
                        OnMaxPause::Resume => {
                            out.push(Decision::Resume {
                                job: job.name.clone(),
                                why: Resumed::MaxPause,
                                reason,
                            });
                        }
                        OnMaxPause::Terminate => {
                            out.push(Decision::Terminate {
                                job: job.name.clone(),
                                reason,
                            });
                        }
                        OnMaxPause::Stay => {
                            out.push(Decision::StayPaused {
                                job: job.name.clone(),
                                reason,
                            });
                        }
                    }
                } else if critical.is_empty()
                    && room_ok
                    && level::causes_read(&p.reasons, &state.levels)
                {
                    out.push(Decision::Resume {
                        job: job.name.clone(),
                        why: Resumed::Recovered,
                        reason: format!(
                            "recovered from {}",
                            p.reasons
                                .iter()
                                .map(Cause::to_string)
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    });
                }
            }
            Some(_) => {}
        }
        state.jobs.insert(job.name.clone(), js);
    }
    (state, out)
}

/// The user paused a job: the policy will not resume it. Returns the pause for the job's record.
pub fn user_pause(state: &mut State, job: &str, now_ms: u64) -> PauseState {
    let js = state.jobs.entry(job.to_owned()).or_default();
    js.checkpoint_deadline_ms = None;
    PauseState {
        since_ms: now_ms,
        by: By::User,
        reasons: vec![Cause::User],
        projected: None,
        expired: false,
        strict: false,
    }
}

/// The user resumed a job: resources critical now will not pause it again until they recover.
pub fn user_resume(state: &mut State, job: &str) {
    let critical: BTreeSet<Resource> = state
        .levels
        .iter()
        .filter(|(_, l)| l.level == Level::Critical)
        .map(|(k, _)| k.clone())
        .collect();
    let js = state.jobs.entry(job.to_owned()).or_default();
    js.checkpoint_deadline_ms = None;
    js.overridden = critical;
}

/// The engine resumed a paused job with emergency room (swap, a lent limit) so that it can apply a fix:
/// the resources critical now (`keys` among them) will not pause it again until they recover or the
/// engine pauses it itself (`hold`).
pub fn run_through(state: &mut State, job: &str, keys: &[Resource]) {
    let critical: BTreeSet<Resource> = state
        .levels
        .iter()
        .filter(|(k, l)| l.level == Level::Critical || keys.contains(k))
        .map(|(k, _)| k.clone())
        .collect();
    let js = state.jobs.entry(job.to_owned()).or_default();
    js.checkpoint_deadline_ms = None;
    js.overridden.extend(critical);
}

/// The engine pauses a job itself (its emergency room ran out, or its fix did not come): it stays
/// paused until `limit` has room for `rate` again, like a pause on a projection. Returns
/// the pause for the job's record.
pub fn hold(state: &mut State, job: &str, now_ms: u64, limit: LimitKind, rate: f64) -> PauseState {
    let js = state.jobs.entry(job.to_owned()).or_default();
    js.overridden.clear();
    js.checkpoint_deadline_ms = None;
    PauseState {
        since_ms: now_ms,
        by: By::Policy,
        reasons: vec![Cause::WayOut],
        projected: Some((limit, rate)),
        expired: false,
        strict: true,
    }
}

/// The job is gone or detached.
pub fn forget(state: &mut State, job: &str) {
    state.jobs.remove(job);
    state.levels.remove(&Resource::JobCgroup(job.to_owned()));
}
