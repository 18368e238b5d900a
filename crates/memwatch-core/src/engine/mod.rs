//! The engine: everything the daemon task owns besides the sampler. It turns samples and probes into
//! policy observations, runs the policy, carries out its decisions through `act`, answers control
//! commands, and renders the views the HTTP side publishes. Synchronous; the daemon task drives it.

mod adapt;
mod calm;
mod commands;
mod cuda_oom;
mod effect;
mod effects;
mod ending;
mod events;
mod notice;
mod observe;
mod pausing;
mod prepared;
mod reflex;
mod settings;
mod slurm;
mod stores;
mod timeout;
mod trainer;
mod way_out;

pub use adapt::{AdaptDone, AdaptTask, Intents, JOURNAL, Staged};
pub use calm::{Wake, WakeAnswer};
pub use effect::{Effect, Ending, Outcome, SlurmRequest};
pub use effects::PauseError;
pub use observe::Measured;
pub use prepared::{DEFAULT_PROFILE, ListedPids, OpenedConfig, Prepared, Read, config_root};
pub use reflex::{ArmError, Armed, ReflexHow, ReflexPlan};
pub use settings::Settings;
pub use stores::{LeftBehind, Stores};
pub use way_out::{NoSwap, WayOutDone, WayOutTask, WhyNot};

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;

use crate::audit::{Action, Event, Reason};
use crate::job::{EndedJob, Job, JobView};
use crate::policy;
use crate::seam::HostView;

/// What the HTTP side shows of jobs, levels and interventions.
#[derive(Debug, Clone, Default, Serialize)]
pub struct View {
    /// The daemon runs with `policy.dry_run`.
    pub dry_run: bool,
    /// Every attached job.
    pub jobs: Vec<JobView>,
    /// Each level resource (host memory, swap, pressure, temperatures, each GPU and job cgroup) and
    /// its level.
    pub levels: Vec<LevelView>,
    /// The newest events, oldest first.
    pub events: Vec<Event>,
    /// Interventions counted by action and reason, since the daemon started.
    pub interventions: Vec<InterventionCount>,
    /// The advice that applies now.
    pub advice: Vec<crate::advice::Advice>,
    /// Jobs that ended recently, newest last.
    pub ended: Vec<EndedJob>,
    /// Each job's token, so that HTTP can show a job's details to whoever presents it; never served.
    #[serde(skip)]
    pub tokens: std::collections::HashMap<String, String>,
}

/// One level resource and where it stands.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct LevelView {
    /// Its key: `host_memory`, `swap`, `pressure`, `cpu_temperature`, `gpu_memory:I`,
    /// `gpu_temperature:I`, `job_cgroup:NAME`.
    pub resource: policy::Resource,
    /// Ok, warn or critical.
    pub level: policy::Level,
    /// The value the level is judged on (a ratio 0–1, or °C), if known.
    pub value: Option<f64>,
    /// When the level last changed (engine clock, ms).
    pub since_ms: u64,
    /// While only its leave hold keeps `level` (the value is back under its line): the lower level
    /// it points to (`LevelState::settled`), which advice and config rewrites already go by. Left
    /// out otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settling: Option<policy::Level>,
}

/// How many times memwatch took one action for one reason.
#[derive(Debug, Clone, Serialize)]
pub struct InterventionCount {
    /// The action (pause, resume, terminate …).
    pub action: Action,
    /// The reason (host_memory, predicted, user …).
    pub reason: Reason,
    /// How many times.
    pub count: u64,
    /// When last (ms since the epoch).
    pub last_timestamp_ms: u64,
}

/// One job's full measurement, planned by the engine and run on the blocking pool.
pub struct MeasurePlan {
    /// The job's name.
    pub name: String,
    /// Its root process.
    pub root: crate::host::ProcRef,
    /// Whose job it is: a freeze reaches only what this user could signal.
    pub owner: u32,
    /// Its memory cgroup, if it has one.
    pub cgroup: Option<crate::sample::cgroup::CgroupDir>,
    /// For a Slurm job attached by id: its cgroup, whose every task is the job's.
    pub members: Option<PathBuf>,
    /// The measurement before, for CPU and growth.
    pub previous: Option<crate::job::JobSample>,
    /// While calm: the members of the job's cgroup at that measurement's walk. While they are the
    /// same (and its usage close), the tree is not walked again (`job::measure::measurement`).
    pub members_at_walk: Option<crate::job::members::Members>,
    /// Its processes pinned at the last walk: a walk keeps those still alive.
    pub pinned: Vec<crate::host::Pinned>,
    /// The freezer memwatch holds the job by (a held pause by its cgroup's freezer): the shell
    /// reads whether it is still asked to freeze (`Measured::held_thawed`).
    pub held_by: Option<crate::held::Frozen>,
}

/// What the kernel should watch for one job (see `Engine::wake_plan`).
#[derive(Debug, Clone, PartialEq)]
pub struct WakePlan {
    /// The job's name.
    pub job: String,
    /// Its memory cgroup.
    pub dir: crate::sample::cgroup::CgroupDir,
    /// Usage thresholds in bytes (v1: the kernel's; v2: the wake thread's reads stand in for
    /// them); empty without a limit.
    pub thresholds: Vec<u64>,
    /// The critical line and the limit, bytes, where the limit is known.
    pub line: Option<(u64, u64)>,
    /// The cgroup is known to have no limit: nothing there can run out, so nothing to watch or probe
    /// (the host's memory is watched on its own).
    pub limitless: bool,
    /// The reflex to arm in the wake thread (where the thresholds are watched, or read on v2).
    pub reflex: Option<ReflexPlan>,
}

/// A calm job's tree is walked at most every (its processes × this) ms: 1 024 processes every 5 s,
/// 64 or fewer on every full sample.
const WALK_BUDGET_MS_PER_PROCESS: u64 = 5;

/// The same while calm (`Engine::calm`, full samples stretched): 1 024 processes every 25.6 s (a walk
/// of them costs about 57 ms), 400 or fewer on every calm full sample.
const WALK_BUDGET_CALM_MS_PER_PROCESS: u64 = 25;

/// The fastest growth the host's probing plans for, bytes/s: one process touching fresh pages on
/// one core reaches about 2.7 GiB/s on the development machine (BENCHMARKS.md). The v2 reflex's reads
/// plan for the same.
const FASTEST_GROWTH: f64 = crate::held::FASTEST_GROWTH;

/// smaps_rollup (PSS, swap) is read at least this often; RSS every sample.
const DETAILED_EVERY_MS: u64 = 5000;

/// While calm, smaps_rollup is read this often (a process whose RSS moved is read again anyway): it
/// walks every page table entry, the largest cost of a calm job's full sample (9 ms every 10 s for 8
/// processes sharing 64 MiB).
const DETAILED_CALM_MS: u64 = 300_000;

/// The owner task's state: the attached jobs, the policy's memory, the audit log and what is due.
/// Only the owner task touches it; every other task sends it requests.
pub struct Engine {
    /// What it reads of the configuration.
    cfg: Settings,
    /// The attached jobs, by name.
    jobs: BTreeMap<String, Job>,
    /// The policy's memory: each resource's level and each job's.
    policy: policy::State,
    /// What it records of its events.
    events: events::Log,
    /// The latest samples and the host's memory read from them and from the probes.
    readings: observe::Readings,
    /// The policy wants fast probing until this time (ms).
    fast_until_ms: u64,
    /// Something the view shows changed since the last `take_dirty`.
    dirty: bool,
    /// The advice from the latest sample, for the API.
    advice: Vec<crate::advice::Advice>,
    /// What people were told of that is not over yet.
    notices: notice::Notices,
    /// The state file, written ahead of every pause.
    state: Box<dyn crate::record::StateStore>,
    /// The clock's anchor, persisted so that a restarted daemon counts on the same line.
    clock_anchor: Option<crate::record::ClockAnchor>,
    /// Work handed off the owner task, oldest first (`poll_effect`).
    effects: std::collections::VecDeque<Effect>,
    /// What acts on the host: processes, cgroups, limits, Slurm.
    host: Arc<dyn crate::seam::HostDriver>,
    /// What the engine reads of the host: processes, cgroups, swap, Slurm's job cgroups.
    view: Arc<dyn HostView>,
    /// The jobs config work runs for.
    adapting: std::collections::BTreeSet<String>,
    /// A PSI trigger on /proc/pressure/memory wakes the daemon.
    host_watched: bool,
    /// Jobs that ended, newest last, and how (at most `ENDED_KEPT`).
    ended: std::collections::VecDeque<EndedJob>,
    /// Emergency swap and raised limits left by jobs that ended or by a killed daemon.
    leftover: way_out::Leftover,
    /// This node's name in Slurm, its calls, and the Slurm jobs waiting or being checked.
    slurm: slurm::Node,
    /// When `handle_timeout` last ran: deadlines up to then are handled.
    timeouts_handled_ms: Option<u64>,
    /// What the daemon before left beside its state file, until `recover` takes it.
    left: Option<stores::LeftBehind>,
}

/// How many ended jobs the view keeps.
pub const ENDED_KEPT: usize = 32;

impl Engine {
    /// An engine with no jobs that acts on the host through `host` (a test's driver records
    /// instead), reads it through `view` and writes to `stores`. It does no I/O of its own.
    pub fn with_host(
        cfg: Settings,
        clock_anchor: Option<crate::record::ClockAnchor>,
        host: Arc<dyn crate::seam::HostDriver>,
        view: Arc<dyn HostView>,
        stores: Stores,
    ) -> Self {
        let Stores {
            state,
            audit,
            slurm_node,
            left,
        } = stores;
        Engine {
            state,
            clock_anchor,
            effects: Default::default(),
            host,
            view,
            ended: std::collections::VecDeque::new(),
            leftover: Default::default(),
            slurm: slurm::Node::new(&cfg.slurm, slurm_node),
            timeouts_handled_ms: None,
            left: Some(left),
            adapting: Default::default(),
            host_watched: false,
            readings: observe::Readings::new(cfg.sampling.growth_window_ms.0),
            cfg,
            jobs: BTreeMap::new(),
            policy: policy::State::default(),
            events: events::Log {
                audit,
                counts: BTreeMap::new(),
                outbox: None,
            },
            fast_until_ms: 0,
            dirty: true,
            advice: Vec::new(),
            notices: Default::default(),
        }
    }

    /// Whether any job is attached.
    pub fn has_jobs(&self) -> bool {
        !self.jobs.is_empty()
    }

    /// The jobs to measure: name, root, cgroup, and the previous measurement to carry PSS over from
    /// (`None`: read smaps_rollup this time).
    pub fn measure_plan(&mut self, now_ms: u64) -> Vec<MeasurePlan> {
        let calm = self.calm(now_ms);
        let (every, walk_budget) = if calm {
            (DETAILED_CALM_MS, WALK_BUDGET_CALM_MS_PER_PROCESS)
        } else {
            (DETAILED_EVERY_MS, WALK_BUDGET_MS_PER_PROCESS)
        };
        let detailed = now_ms.saturating_sub(self.readings.last_detailed_ms) >= every
            || self
                .policy
                .levels
                .values()
                .any(|l| l.level >= policy::Level::Warn);
        if detailed {
            self.readings.last_detailed_ms = now_ms;
        }
        let troubled = self
            .policy
            .levels
            .values()
            .any(|l| l.level >= policy::Level::Warn);
        self.jobs
            .values_mut()
            .filter_map(|j| {
                // A calm large tree is walked less often, so its cost per second stays bounded
                // (about WALK_BUDGET_MS_PER_PROCESS per process and walk); its cgroup is probed and
                // watched by the kernel meanwhile, and a pause walks the tree afresh anyway.
                let procs = j.last.as_ref().map_or(0, |l| l.processes.len()) as u64;
                let due = troubled
                    || j.pause.is_some()
                    || now_ms.saturating_sub(j.walked_at_ms) >= procs.saturating_mul(walk_budget);
                if !due {
                    return None;
                }
                j.walked_at_ms = now_ms;
                Some(MeasurePlan {
                    name: j.name.clone(),
                    root: j.root,
                    owner: j.owner_uid,
                    cgroup: j.cgroup_dir.clone(),
                    members: j
                        .slurm
                        .as_ref()
                        .and(j.cgroup_dir.as_ref())
                        .map(|c| c.dir.clone()),
                    previous: if detailed { None } else { j.last.clone() },
                    // PSS is due at the detailed cadence, and only a walk reads it.
                    members_at_walk: (calm && !detailed).then(|| j.members.clone()).flatten(),
                    pinned: j.pinned.clone(),
                    held_by: j.pause.as_ref().and_then(|p| p.held_freezer()).cloned(),
                })
            })
            .collect()
    }

    /// Each job's cgroup directory and what the last full read said of it, for probes.
    pub fn probe_plan(
        &self,
    ) -> Vec<(
        String,
        crate::sample::cgroup::CgroupDir,
        Option<crate::sample::cgroup::CgroupMemory>,
    )> {
        self.jobs
            .values()
            .filter_map(|j| {
                Some((
                    j.name.clone(),
                    j.cgroup_dir.clone()?,
                    j.last.as_ref().and_then(|l| l.cgroup.clone()),
                ))
            })
            .collect()
    }

    /// What the kernel should watch: each job with a memory cgroup (usage thresholds at these byte
    /// counts: v1's own, or the wake thread's reads on v2; and on v2 a PSI trigger).
    pub fn wake_plan(&self) -> Vec<WakePlan> {
        let p = &self.cfg.policy.job_cgroup;
        self.jobs
            .values()
            .filter_map(|j| {
                let dir = j.cgroup_dir.clone()?;
                let limit = j.cgroup().and_then(|c| c.limit_bytes);
                // Usage is at least the unreclaimable memory, so a usage threshold is crossed at or
                // before the level it stands for: half the limit (growth worth measuring),
                // warn, critical — and more above critical, because usage counts clean page
                // cache that the level does not: the crossing at critical may come a little
                // early, and the next one decides. Every tenth of a percent for the first percent
                // (a cgroup holding a little cache: its reflex fires half a MiB later in 512 MiB,
                // not 2.6), then every half percent.
                let thresholds = limit
                    .map(|l| {
                        let mut ratios = vec![0.5, p.warn.0, p.critical.0];
                        let mut r = p.critical.0;
                        while ratios.len() < 24 {
                            r += if r < p.critical.0 + 0.0095 {
                                0.001
                            } else {
                                0.005
                            };
                            if r >= 1.0 {
                                break;
                            }
                            ratios.push(r);
                        }
                        let mut t: Vec<u64> =
                            ratios.iter().map(|r| (l as f64 * r) as u64).collect();
                        // The critical one is the reflex's line to the byte, which the registrar
                        // writes first.
                        t[2] = self.critical_bytes(l);
                        t.sort_unstable();
                        t.dedup();
                        t
                    })
                    .unwrap_or_default();
                Some(WakePlan {
                    job: j.name.clone(),
                    dir,
                    thresholds,
                    line: limit.map(|l| (self.critical_bytes(l), l)),
                    limitless: j.cgroup().is_some() && limit.is_none(),
                    reflex: self.reflex_plan(j),
                })
            })
            .collect()
    }

    /// A job cgroup's critical line in bytes, for a limit of `limit` bytes.
    pub(crate) fn critical_bytes(&self, limit: u64) -> u64 {
        (limit as f64 * self.cfg.policy.job_cgroup.critical.0).ceil() as u64
    }

    /// How the kernel watches this job's cgroup now.
    pub fn set_watch(&mut self, job: &str, watch: crate::job::Watch) {
        if let Some(j) = self.jobs.get_mut(job) {
            j.watch = watch;
        }
    }

    /// A PSI trigger on the host's memory pressure is in place.
    pub fn set_host_watched(&mut self, watched: bool) {
        self.host_watched = watched;
    }

    /// Whether a PSI trigger on the host's memory pressure wakes the daemon (else it is polled).
    pub fn host_watched(&self) -> bool {
        self.host_watched
    }

    /// Whether the view changed since the last call.
    pub fn take_dirty(&mut self) -> bool {
        std::mem::take(&mut self.dirty)
    }

    /// Where events that people are told about go (`[notify]`).
    pub fn set_outbox(&mut self, outbox: Box<dyn crate::audit::Notify>) {
        self.events.outbox = Some(outbox);
    }

    /// The view the HTTP side publishes.
    pub fn view(&self) -> View {
        View {
            dry_run: self.cfg.policy.dry_run,
            jobs: self.jobs.values().map(|j| self.job_view(j)).collect(),
            ended: self.ended.iter().cloned().collect(),
            tokens: self
                .jobs
                .values()
                .filter_map(|j| Some((j.name.clone(), j.config.as_ref()?.token.clone())))
                .collect(),
            levels: self
                .policy
                .levels
                .iter()
                .map(|(k, l)| LevelView {
                    resource: k.clone(),
                    level: l.level,
                    value: l.value,
                    since_ms: l.since_ms,
                    settling: (l.settled() != l.level).then(|| l.settled()),
                })
                .collect(),
            events: self.events.audit.recent().cloned().collect(),
            interventions: self
                .events
                .counts
                .iter()
                .map(|((action, reason), (count, last))| InterventionCount {
                    action: *action,
                    reason: reason.clone(),
                    count: *count,
                    last_timestamp_ms: *last,
                })
                .collect(),
            advice: self.advice.clone(),
        }
    }

    fn job_view(&self, j: &Job) -> JobView {
        let limits = self.limits(j);
        JobView {
            name: j.name.clone(),
            pid: j.root.pid,
            start_time: j.root.start_time,
            owner_uid: j.owner_uid,
            attached_at_ms: j.attached_at_ms,
            state: if j.pause.is_some() || j.slurm_suspended_since_ms.is_some() {
                "paused".into()
            } else {
                "running".into()
            },
            pause: j.pause.clone(),
            reflex: j.armed.as_ref().map(|a| a.view()),
            watch: j.watch,
            slurm_suspended_since_ms: j.slurm_suspended_since_ms,
            slurm_holders: j
                .slurm_holders
                .as_ref()
                .map(|(_, nodes)| nodes.clone())
                .unwrap_or_default(),
            sample: j.last.clone().map(|mut s| {
                s.cgroup = j.cgroup().cloned();
                s
            }),
            tightest: crate::job::tightest(&limits).cloned(),
            limits,
            config: j.config.as_ref().map(|c| c.view()),
            launch: j.launch.clone(),
            way_out: j.way_out.clone(),
            pause_deadline: self.pause_deadline(j),
            origin: j.origin.clone(),
            details: true,
            cuda_oom: j.cuda_oom.clone(),
        }
    }

    /// When a paused job's longest pause runs out, and what follows. None for a pause by hand: the
    /// policy never ends it (`memwatch resume` does; detach and stopping the daemon resume it too).
    fn pause_deadline(&self, j: &Job) -> Option<crate::job::PauseDeadline> {
        let pause = j.policy_pause()?;
        let p = &self.cfg.policy;
        let state = self.policy.jobs.get(&j.name);
        let then = if state.is_some_and(|s| s.managed) {
            "way out"
        } else {
            match p.on_max_pause {
                crate::config::OnMaxPause::Resume => "resume",
                crate::config::OnMaxPause::Terminate => "terminate",
                crate::config::OnMaxPause::Stay => "stay",
            }
        };
        Some(crate::job::PauseDeadline {
            at_ms: self.max_pause_due(pause),
            then: then.into(),
        })
    }
}

#[cfg(test)]
mod sim;

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    fn engine(critical: f64, available: u64, total: u64) -> Engine {
        let mut cfg = crate::config::Config::default();
        cfg.policy.host_memory.critical = crate::config::Ratio(critical);
        let host = sim::host::FakeHost::new("/sim".as_ref());
        let mut e = sim::harness::Sim::engine_of(&host, Settings::from(&cfg));
        e.readings.host_memory = Some((available, total));
        e
    }

    #[test]
    fn the_host_is_probed_when_a_fast_hog_could_cross_its_critical_line_between_two_samples() {
        // 22 of 24 GiB free, critical at 90 %: 19.6 GiB of room, far more than 4 GiB/s × 1 s.
        assert!(!engine(0.90, 22 * G, 24 * G).probe_host(0));
        // Half used: probed.
        assert!(engine(0.90, 12 * G, 24 * G).probe_host(0));
        // A critical line at 12 % used with 22 of 24 GiB free: 0.9 GiB of room, a quarter second
        // of a fast hog.
        assert!(engine(0.12, 22 * G, 24 * G).probe_host(0));
        // Unknown host memory: probed.
        let mut e = engine(0.90, 0, 0);
        e.readings.host_memory = None;
        assert!(e.probe_host(0));
    }
}
