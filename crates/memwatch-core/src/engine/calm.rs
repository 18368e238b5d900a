//! How often the engine wants to look: full samples stretched to `sampling.calm_interval_ms` while
//! all is calm and the kernel watches for change; the host's MemAvailable read cheaply in between
//! while fast growth could reach its critical line; probes between full samples near trouble.

use super::{Engine, FASTEST_GROWTH};
use crate::policy::{Level, LevelState, Resource};

/// A ratio within this of its warn line is near it: not calm.
const NEAR: f64 = 0.05;

/// What the kernel's notification was about (the wake thread's counts tell them apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// The PSI trigger on the host's memory pressure, and nothing else.
    HostPressure,
    /// A job's cgroup: one of its v1 thresholds crossed, a v2 read found it across one of its lines,
    /// or its PSI trigger fired.
    Job,
}

/// What the daemon does about a notification ([`Engine::handle_wake`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeAnswer {
    /// Probe now (and fast for a while).
    Probe,
    /// Take a full sample now.
    FullSample,
}

impl Engine {
    /// How long until the next full sample, in ms: `sampling.calm_interval_ms` while calm, else
    /// `sampling.interval_ms`.
    pub fn sample_interval_ms(&self, now_ms: u64) -> u64 {
        let s = &self.cfg.sampling;
        if self.calm(now_ms) {
            s.calm_interval_ms.0.max(s.interval_ms.0)
        } else {
            s.interval_ms.0
        }
    }

    /// Whether nothing moves that only a full sample would see: a full sample has been taken; the
    /// kernel watches the host's pressure and every job's cgroup (v1 thresholds, or the wake thread's
    /// reads of a v2 job's usage that stand in for them); no job is paused,
    /// uses a GPU or has an effect, adaptation or Slurm call in flight; no probing is fast; and every
    /// level is ok, with none waiting to change and no ratio within 5 points of its warn line.
    pub fn calm(&self, now_ms: u64) -> bool {
        self.why_not_calm(now_ms).is_none()
    }

    /// What keeps the engine from calm ([`Self::calm`]), in a few words; `None` when calm.
    pub fn why_not_calm(&self, now_ms: u64) -> Option<&'static str> {
        let s = &self.cfg.sampling;
        let job_why = |j: &crate::job::Job| {
            if j.watch != crate::job::Watch::Watched {
                Some("a job's cgroup is not watched (no thresholds, no reads of its usage)")
            } else if self.over_by_cache(j) {
                Some("a job's usage is over its critical line, held under it by its page cache")
            } else if j.pause.is_some() {
                Some("a job is paused")
            } else if j.last.is_none() {
                Some("a job is not measured yet")
            } else if j
                .last
                .as_ref()
                .is_some_and(|l| l.gpu_bytes.unwrap_or(0) > 0)
            {
                Some("a job uses a GPU")
            } else {
                None
            }
        };
        if s.calm_interval_ms.0 <= s.interval_ms.0 {
            Some("calm_interval_ms is not above interval_ms")
        } else if self.readings.latest.is_none() {
            Some("no full sample yet")
        } else if !self.host_watched {
            Some("no PSI trigger on the host")
        } else if now_ms < self.fast_until_ms {
            Some("the kernel notified a change a moment ago")
        } else if !self.effects.is_empty()
            || !self.adapting.is_empty()
            || !self.slurm.pending.is_empty()
            || !self.slurm.checking.is_empty()
        {
            Some("work in flight")
        } else if let Some(why) = self.jobs.values().find_map(job_why) {
            Some(why)
        } else if self
            .policy
            .levels
            .iter()
            .any(|(r, l)| l.level != Level::Ok || l.pending.is_some() || self.near(r, l))
        {
            Some("a level is raised, changing or near its warn line")
        } else {
            None
        }
    }

    /// Whether the job's cgroup usage is at or over its critical line while its clean page cache
    /// holds its unreclaimable memory under it. Its usage thresholds (or the wake thread's reads of
    /// a v2 job's usage) then tell little: as the job's own memory grows, the kernel drops cache to
    /// make room and usage barely moves. So such a job is probed (its page cache read with its usage)
    /// and the engine is not calm while it lasts.
    pub(super) fn over_by_cache(&self, j: &crate::job::Job) -> bool {
        let critical = self.cfg.policy.job_cgroup.critical.0;
        j.cgroup().is_some_and(|c| {
            c.limit_bytes.filter(|l| *l > 0).is_some_and(|l| {
                let line = l as f64 * critical;
                c.usage_bytes as f64 >= line && (c.unreclaimable_bytes() as f64) < line
            })
        })
    }

    /// Whether a resource's last value lies within [`NEAR`] of its warn line (ratios only:
    /// temperatures move over tens of seconds and their lines are each device's own).
    fn near(&self, resource: &Resource, l: &LevelState) -> bool {
        // Found by its key, as the policy finds it: a new ratio resource is near by the same rule.
        let Some(policy) = self.cfg.policy.ratio(resource.kind()) else {
            return false;
        };
        l.value.is_some_and(|v| v >= policy.warn.0 - NEAR)
    }

    /// How long growing at 4 GiB/s would take to use the room above the host's critical line, ms
    /// (0 when unknown). No kernel notification comes for MemAvailable: between two reads of it, no
    /// more time may pass than this (earlyoom sizes its sleep the same way).
    pub(super) fn host_room_ms(&self) -> u64 {
        let critical = self.cfg.policy.host_memory.critical.0;
        self.readings.host_memory.map_or(0, |(a, t)| {
            let room = a as f64 - t as f64 * (1.0 - critical);
            (room.max(0.0) / FASTEST_GROWTH * 1000.0) as u64
        })
    }

    /// Whether the room above the host's critical line is short: the host is at least half used, or
    /// growing at 4 GiB/s would reach the line within `interval_ms`.
    pub(super) fn host_room_short(&self, interval_ms: u64) -> bool {
        self.readings
            .host_memory
            .is_none_or(|(a, t)| t == 0 || a * 2 <= t)
            || self.host_room_ms() <= interval_ms
    }

    /// Whether probes should read /proc/meminfo: near trouble, when the room above the host's
    /// critical line is short (`host_room_short`), or when it would not last until the next
    /// full sample.
    pub fn probe_host(&self, now_ms: u64) -> bool {
        now_ms < self.fast_until_ms
            || self.host_room_short(self.cfg.sampling.interval_ms.0)
            || self.host_room_ms() < self.sample_interval_ms(now_ms)
    }

    /// How long until the next probe: fast near trouble, every `probe_interval_ms` while a job's
    /// cgroup is not watched or a level is raised, none without jobs. While the kernel (or, on v2,
    /// the wake thread's reads) watches every job's cgroup and the host's pressure, and every level is
    /// ok, only the host's MemAvailable can run out unseen: it alone is read, as often as its room
    /// needs (`host_room_ms`, as earlyoom sizes its sleep) and at most every `probe_interval_ms`, when
    /// that is sooner than the next full sample.
    pub fn probe_interval_ms(&self, now_ms: u64) -> Option<u64> {
        let s = &self.cfg.sampling;
        // Without a job there is nothing to stop between full samples: the host's levels only warn.
        if self.jobs.is_empty() {
            return None;
        }
        if now_ms < self.fast_until_ms {
            return Some(s.fast_interval_ms.0);
        }
        let watched = self.host_watched
            && self
                .jobs
                .values()
                // A job outside any memory cgroup has nothing to probe but the host; one over its
                // line by its page cache is watched in name only (`over_by_cache`).
                .all(|j| {
                    (j.watch == crate::job::Watch::Watched || j.cgroup_dir.is_none())
                        && !self.over_by_cache(j)
                        && j.pause.is_none()
                })
            && self.policy.levels.values().all(|l| l.level == Level::Ok);
        if !watched {
            return Some(s.probe_interval_ms.0);
        }
        let every = self.sample_interval_ms(now_ms);
        let room = self.host_room_ms();
        (room < every).then(|| room.max(s.probe_interval_ms.0))
    }
}
