//! Training-config rewrites and advice, on each full sample.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::Engine;
use crate::adapt::rules::Signals;
use crate::adapt::{Directive, JobConfig};
use crate::advice::{self, Knobs};
use crate::audit::{Action, Reason};
use crate::policy::{Level, LevelState, Resource};
use crate::rewrite::profile::{Knob, Profile};
use crate::rewrite::{Format, Scalar};

/// GPU memory under this share counts as "lots of room" for growing back.
const ROOMY_GPU: f64 = 0.5;
/// After a failure to read or rewrite a job's file, wait this long before trying again.
const RETRY_MS: u64 = 60_000;

/// The journal of staged changes in the state directory.
pub const JOURNAL: &str = "journal.jsonl";

/// One job's config work, run off the owner task (`memwatch::work::adapt::run_adapt_task`).
#[derive(Debug)]
pub struct AdaptTask {
    /// The job's name.
    pub job: String,
    /// Its config file.
    pub file: PathBuf,
    /// The file's format.
    pub format: Format,
    /// Where the knobs are in the file.
    pub profile: Profile,
    /// The job's user: the file is read and written with its rights.
    pub owner: u32,
    /// The process whose root the file's path is in (`JobConfig::within`).
    pub within: Option<u32>,
    /// What the rules go by.
    pub signals: Signals,
    /// Since when the job has had lots of room (ms), carried to the next task.
    pub roomy_since: Option<u64>,
    /// A change is pending or settling: read only, propose nothing.
    pub hold: bool,
    /// The rules' settings.
    pub adapt: crate::config::Adapt,
    /// Decide, never write.
    pub dry_run: bool,
    /// The generation a new directive gets.
    pub generation: u64,
    /// The journal of changes, written ahead of each rewrite.
    pub journal: PathBuf,
    /// A rewrite journaled before a restart: adopted if the file shows it, else dropped.
    pub unconfirmed: Option<Directive>,
    /// What the trainer recovered at after a CUDA OOM: written as applied, whatever `hold` says,
    /// instead of what the rules propose.
    pub oom: Option<crate::adapt::OomStage>,
}

/// What became of a staged change.
#[derive(Debug)]
pub enum Staged {
    /// Nothing was proposed.
    Nothing,
    /// Dry run: what would have changed.
    WouldChange(String),
    /// The file was rewritten; the directive to queue.
    Written(Directive),
    /// The rewrite was refused; the file is unchanged.
    Refused(String),
    /// A rewrite journaled by the previous daemon that landed in the file: the directive to queue.
    Recovered(Directive),
    /// A rewrite journaled by the previous daemon that never reached the file.
    NeverWritten(u64),
}

/// A finished [`AdaptTask`].
#[derive(Debug)]
pub struct AdaptDone {
    /// The job's name.
    pub job: String,
    /// The knobs the file holds, or why they could not be read.
    pub knobs: Result<BTreeMap<Knob, Scalar>, crate::rewrite::file::RewriteError>,
    /// As the task had it, or since now.
    pub roomy_since: Option<u64>,
    /// What became of a change.
    pub staged: Staged,
    /// The CUDA OOM recovery the task carried, as the task had it (boxed: rare, and `Outcome`
    /// stays small).
    pub oom: Option<Box<crate::adapt::OomStage>>,
}

/// The rewrites the journal at `path` (and its rotated predecessor) shows memwatch was about to make,
/// oldest first: (job, file, directive). Read once at start, for `Intents::find`.
pub struct Intents(Vec<(String, PathBuf, Directive)>);

impl Intents {
    /// The rewrites these journal lines (oldest first) show memwatch was about to make.
    pub fn of_lines<'a>(lines: impl IntoIterator<Item = &'a str>) -> Intents {
        let mut out = Vec::new();
        for line in lines {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let (Some(job), Some(file)) = (v["job"].as_str(), v["file"].as_str()) else {
                continue;
            };
            if let Ok(d) = serde_json::from_value::<Directive>(v["intent"].clone()) {
                out.push((job.to_owned(), PathBuf::from(file), d));
            }
        }
        Intents(out)
    }

    /// The last rewrite of `file` for job `name` as generation `generation`.
    pub fn find(&self, name: &str, file: &Path, generation: u64) -> Option<Directive> {
        self.0
            .iter()
            .rev()
            .find(|(j, f, d)| j == name && f == file && d.generation == generation)
            .map(|(_, _, d)| d.clone())
    }
}

/// The knobs advice looks at: what the trainer last reported running with, else the file's.
pub fn knobs_for_advice(c: &JobConfig) -> Knobs {
    let running = c.progress.as_ref().and_then(|p| p.running.as_ref());
    let get = |k| running.and_then(|r| r.get(&k)).or_else(|| c.knobs.get(&k));
    let u = |k| get(k).and_then(Scalar::as_u64);
    Knobs {
        micro_batch: u(Knob::MicroBatch),
        accumulation: u(Knob::Accumulation),
        workers: u(Knob::Workers),
        pin_memory: get(Knob::PinMemory).and_then(Scalar::as_bool),
        seq_len: u(Knob::SeqLen),
        world_size: u(Knob::WorldSize),
        reported: running
            .map(|r| r.keys().copied().collect())
            .unwrap_or_default(),
    }
}

impl Engine {
    /// "`what` is at critical (97 % used)" when the level of `key` is warn or worse, as
    /// `LevelState::settled` has it (a level held only by its leave hold asks for no cut).
    fn evidence(&self, key: &Resource, what: &str) -> Option<String> {
        let l = self.policy.levels.get(key)?;
        let level = l.settled();
        (level >= Level::Warn).then(|| match l.value {
            Some(v) => format!("{what} is at {} ({:.0} % used)", level.as_str(), v * 100.0),
            None => format!("{what} is at {}", level.as_str()),
        })
    }

    fn level(&self, key: &Resource) -> Level {
        self.policy
            .levels
            .get(key)
            .map_or(Level::Ok, LevelState::settled)
    }

    fn signals(
        &self,
        name: &str,
        gpus: Option<&Vec<u32>>,
        roomy_since: Option<u64>,
        now_ms: u64,
    ) -> (Signals, Option<u64>) {
        // Each signal is the evidence the rewrite cites: the resource at warn or worse, its level, its
        // number. A job paused for memory (a projection can pause it below warn) needs the cut as much.
        let ram = self
            .evidence(
                &Resource::JobCgroup(name.to_owned()),
                "the job's memory cgroup",
            )
            .or_else(|| self.evidence(&Resource::HostMemory, "host RAM"))
            .or_else(|| {
                self.memory_pause(name)
                    .map(|_| "the job is paused for memory below warn (a projection)".to_owned())
            });
        let job_gpus: Vec<u32> = match gpus {
            Some(g) => g.clone(),
            None => self
                .readings
                .latest
                .as_ref()
                .map(|s| s.gpus.iter().map(|g| g.index).collect())
                .unwrap_or_default(),
        };
        let gpu = job_gpus
            .iter()
            .find_map(|i| self.evidence(&Resource::GpuMemory(*i), &format!("GPU {i}'s memory")));
        let roomy = ram.is_none()
            && gpu.is_none()
            && self.level(&Resource::HostMemory) == Level::Ok
            && self.readings.latest.as_ref().is_some_and(|s| {
                s.gpus
                    .iter()
                    .filter(|g| job_gpus.contains(&g.index))
                    .all(|g| match (g.memory_used_bytes, g.memory_total_bytes) {
                        (Some(u), Some(t)) if t > 0 => (u as f64 / t as f64) < ROOMY_GPU,
                        _ => false,
                    })
            });
        let since = if roomy {
            Some(roomy_since.unwrap_or(now_ms))
        } else {
            None
        };
        (
            Signals {
                ram,
                gpu,
                roomy_for_ms: since.map(|s| now_ms.saturating_sub(s)),
            },
            since,
        )
    }

    /// Plans a read (and maybe a rewrite) of each managed config, for the daemon to run off the owner
    /// task (`Effect::Adapt`, `run_adapt_task`, `Outcome::Adapted`). One task per job at a time.
    pub(super) fn adapt(&mut self, now_ms: u64) {
        let names: Vec<String> = self
            .jobs
            .iter()
            .filter(|(n, j)| j.config.is_some() && !self.adapting.contains(*n))
            .map(|(n, _)| n.clone())
            .collect();
        for name in names {
            self.adapt_job(&name, now_ms);
        }
    }

    /// Plans one job's config task, unless one is under way or the last failed within `RETRY_MS`.
    pub(super) fn adapt_job(&mut self, name: &str, now_ms: u64) {
        if self.adapting.contains(name) {
            return;
        }
        let name = name.to_owned();
        let Some(job) = self.jobs.get(&name) else {
            return;
        };
        let Some(c) = job.config.as_ref() else {
            return;
        };
        if c.last_error
            .as_ref()
            .is_some_and(|(t, _)| now_ms.saturating_sub(*t) < RETRY_MS)
        {
            return;
        }
        let gpus = job.last.as_ref().and_then(|l| l.gpus.clone());
        let (signals, roomy_since) = self.signals(&name, gpus.as_ref(), c.roomy_since_ms, now_ms);
        let settling = c
            .directives
            .iter()
            .filter_map(|d| d.applied_at_ms)
            .max()
            .is_some_and(|t| {
                now_ms.saturating_sub(t) < self.cfg.adapt.settle_seconds.saturating_mul(1000)
            });
        let task = AdaptTask {
            job: name.clone(),
            file: c.file.clone(),
            format: c.format,
            profile: c.profile.clone(),
            owner: job.owner_uid,
            within: c.within,
            signals,
            roomy_since,
            hold: c.pending().next().is_some() || settling,
            unconfirmed: c.unconfirmed.clone(),
            adapt: self.cfg.adapt.clone(),
            dry_run: self.cfg.policy.dry_run,
            generation: c.generation + 1,
            journal: self.cfg.state_dir.join(JOURNAL),
            oom: c.oom_stage.clone(),
        };
        self.adapting.insert(name);
        self.emit(super::Effect::Adapt(Box::new(task)));
    }

    /// The result of a config task: new knobs, maybe a staged directive, or an error.
    pub(super) fn adapt_done(&mut self, done: AdaptDone, now_ms: u64) {
        self.adapting.remove(&done.job);
        if let Some(j) = self.jobs.get_mut(&done.job) {
            j.adapted_at_ms = Some(now_ms);
        }
        let name = done.job;
        let Some(mut c) = self.jobs.get(&name).and_then(|j| j.config.clone()) else {
            return;
        };
        let knobs = match done.knobs {
            Ok(k) => k,
            Err(e) => {
                self.config_error(&name, now_ms, format!("cannot read the config: {e}"));
                return;
            }
        };
        c.knobs = knobs;
        c.roomy_since_ms = done.roomy_since;
        c.last_error = None;
        c.unconfirmed = None;
        // The CUDA OOM recovery this task carried is done with unless the task left it (a rewrite
        // refused, a journaled rewrite settled first); a newer report's is kept.
        let oom_done = !matches!(
            done.staged,
            Staged::Refused(_) | Staged::Recovered(_) | Staged::NeverWritten(_)
        );
        if oom_done && done.oom.is_some() && c.oom_stage.as_ref() == done.oom.as_deref() {
            c.oom_stage = None;
        }
        let (staged, recovered) = match done.staged {
            Staged::Recovered(d) => (Staged::Written(d), true),
            other => (other, false),
        };
        match staged {
            Staged::Nothing | Staged::Recovered(_) => {}
            Staged::NeverWritten(generation) => {
                self.record(
                    now_ms,
                    Action::Rewrite,
                    &name,
                    Reason::Restart,
                    format!(
                        "generation {generation} was journaled before a restart but never reached {}; nothing changed",
                        c.file.display()
                    ),
                    false,
                );
            }
            Staged::WouldChange(what) => {
                self.record(now_ms, Action::Rewrite, &name, Reason::Adapt, what, true);
            }
            Staged::Refused(e) => {
                if let Some(j) = self.jobs.get_mut(&name) {
                    j.config = Some(c);
                }
                self.config_error(&name, now_ms, format!("rewrite refused: {e}"));
                return;
            }
            Staged::Written(mut d) => {
                c.generation = d.generation;
                d.staged_processes = self
                    .jobs
                    .get(&name)
                    .and_then(crate::job::Job::usual_processes);
                for ch in &d.changes {
                    c.knobs.insert(ch.knob, ch.new.clone());
                }
                d.staged_at_ms = now_ms;
                // Written as applied: what a trainer recovered at after a CUDA OOM.
                let from_oom = d.applied_epoch;
                if from_oom.is_some() {
                    supersede(&mut c.directives, d.generation);
                }
                let summary: Vec<String> = d
                    .changes
                    .iter()
                    .map(|ch| format!("{} {} → {}", ch.path, ch.old, ch.new))
                    .collect();
                let detail = format!(
                    "generation {}{}: {} ({}){}",
                    d.generation,
                    if recovered {
                        ", written before a restart"
                    } else {
                        ""
                    },
                    summary.join(", "),
                    d.reason,
                    from_oom.map_or(String::new(), |e| format!(
                        "; the trainer runs with it since epoch {e}: applied and verified by its report"
                    ))
                );
                let reason = if from_oom.is_some() {
                    Reason::CudaOom
                } else {
                    Reason::Adapt
                };
                c.directives.push(d);
                // Bounded: the oldest acknowledged directives go first.
                let cap = self.cfg.max_directives_per_job;
                while c.directives.len() > cap {
                    match c.directives.iter().position(|d| d.applied_epoch.is_some()) {
                        Some(i) => c.directives.remove(i),
                        None => c.directives.remove(0),
                    };
                }
                self.record(now_ms, Action::Rewrite, &name, reason, detail, false);
            }
        }
        if let Some(j) = self.jobs.get_mut(&name) {
            j.config = Some(c);
        }
        self.dirty = true;
        self.save();
    }

    /// Marks a CUDA OOM recovery's config task to run now, past the hold on rule-made changes.
    pub(super) fn stage_oom(&mut self, name: &str, stage: crate::adapt::OomStage, now_ms: u64) {
        let Some(c) = self.jobs.get_mut(name).and_then(|j| j.config.as_mut()) else {
            return;
        };
        c.oom_stage = Some(stage);
        // Now, or with the next full sample when a task is under way (or one failed within
        // `RETRY_MS`).
        self.adapt_job(name, now_ms);
    }

    fn config_error(&mut self, name: &str, now_ms: u64, message: String) {
        if let Some(c) = self.jobs.get_mut(name).and_then(|j| j.config.as_mut()) {
            c.last_error = Some((now_ms, message.clone()));
        }
        self.record(now_ms, Action::Error, name, Reason::Adapt, message, false);
    }

    /// Recomputes the advice from the latest sample.
    pub(super) fn refresh_advice(&mut self) {
        let Some(sample) = self.readings.latest.clone() else {
            return;
        };
        let jobs: Vec<advice::JobSeen> = self
            .jobs
            .values()
            .map(|j| advice::JobSeen {
                name: &j.name,
                sample: j.last.as_ref(),
                cgroup: j.cgroup(),
            })
            .collect();
        let knobs: Vec<(String, Knobs)> = self
            .jobs
            .values()
            .filter_map(|j| Some((j.name.clone(), knobs_for_advice(j.config.as_ref()?))))
            .collect();
        let hour_ago = sample.timestamp_ms.saturating_sub(3_600_000);
        let mut thermal: BTreeMap<String, u32> = BTreeMap::new();
        for e in self.events.audit.recent().filter(|e| {
            e.action == Action::Pause
                && e.reason == Reason::GpuTemperature
                && e.timestamp_ms >= hour_ago
        }) {
            *thermal.entry(e.job.clone()).or_default() += 1;
        }
        let thermal: Vec<(String, u32)> = thermal.into_iter().collect();
        self.advice = advice::advise(&advice::Input {
            sample: &sample,
            previous: self.readings.previous.as_deref(),
            jobs: &jobs,
            knobs: &knobs,
            thermal_pauses: &thermal,
            levels: &self.policy.levels,
        });
        // A job's last CUDA OOM, where fragmentation explains it.
        let fragmented: Vec<advice::Advice> = self
            .jobs
            .values()
            .filter_map(|j| {
                let last = j.cuda_oom.as_ref()?.last.as_ref()?;
                advice::cuda_oom::fragmentation(&j.name, last)
            })
            .collect();
        if !fragmented.is_empty() {
            self.advice.extend(fragmented);
            advice::sort(&mut self.advice);
        }
    }
}

/// A CUDA OOM recovery staged as `generation` supersedes the changes still pending that only move the
/// micro-batch and accumulation: the trainer runs smaller already, and the file holds its values. They
/// are marked declined, so that no trainer applies them after the fact and none holds back later ones.
fn supersede(directives: &mut [Directive], generation: u64) {
    for d in directives.iter_mut().filter(|d| {
        d.generation < generation
            && d.applied_epoch.is_none()
            && d.declined.is_none()
            && d.changes
                .iter()
                .all(|ch| matches!(ch.knob, Knob::MicroBatch | Knob::Accumulation))
    }) {
        d.declined = Some(format!(
            "superseded by generation {generation}: the trainer recovered from a CUDA OOM at a smaller micro-batch"
        ));
    }
}
