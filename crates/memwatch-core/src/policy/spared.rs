//! One resume when a projection's pause has no way out. A job paused because its growth would reach a
//! limit within the reaction time is held until that limit has room for the growth (`room.rs`); when
//! the room does not come and no step of the way out applies, it would be held to the longest pause
//! and stopped. But nothing was critical for it: a job whose burst ended as it was paused, below its
//! critical line, would have run fine. So the engine resumes it once ([`spare`]); its critical line
//! (and the reflex at the line, where armed) holds it if it grows, and for the rest of the episode a
//! projection alone does not pause it again ([`upkeep`]): the growth measured after the resume is new
//! evidence, but the line is where it is stopped.
//!
//! The episode ends when the level of the limit that was projected has fallen back to ok since the
//! resume (room came), or once the job has run, not paused, for `max_pause_seconds`. It cannot
//! ping-pong: a job is spared only while no episode is open, so between two such resumes it ran
//! unpaused for the longest pause, or its level fell back to ok (its value under the leave threshold
//! for the leave hold); a pause within the episode (at the line) is held to the way out as any.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::LimitKind;
use super::{
    By, Cause, JobObservation, JobState, Level, LevelState, PauseState, Reading, Resource,
};
use super::{State, concerns};
use crate::config::{OnCritical, Policy};

/// A job resumed with no way out of its projection's pause: the episode during which a projection
/// alone does not pause it again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Spared {
    /// The level of the limit that was projected (`job_cgroup:NAME`, `host_memory`, `gpu_memory:N`),
    /// when the limit has one: its return to ok ends the episode.
    pub line: Option<Resource>,
    /// When the job was resumed (ms).
    pub at_ms: u64,
    /// Since when it has run without a pause (ms).
    pub running_since_ms: u64,
}

/// The level of a projection's limit.
fn line_of(job: &str, limit: LimitKind) -> Resource {
    match limit {
        LimitKind::Cgroup => Resource::JobCgroup(job.to_owned()),
        LimitKind::Host => Resource::HostMemory,
        LimitKind::Gpu(i) => Resource::GpuMemory(i),
    }
}

/// What the configuration does when `r` is critical.
fn action(r: &Resource, cfg: &Policy) -> Option<OnCritical> {
    match r {
        Resource::CpuTemperature => Some(cfg.cpu_temperature.action),
        Resource::GpuTemperature(_) => Some(cfg.gpu_temperature.action),
        _ => cfg.ratio(r.kind()).map(|p| p.action),
    }
}

/// The way out found no step for `job`'s pause `p` at `now_ms`. Whether to resume it once: the pause
/// is the policy's, a projection alone caused it, nothing that pauses the job (on `gpus`, every GPU
/// where NVML does not say) is critical now, and no episode is open. If so, the episode begins.
pub fn spare(
    state: &mut State,
    job: &str,
    gpus: Option<Vec<u32>>,
    p: &PauseState,
    now_ms: u64,
    cfg: &Policy,
) -> bool {
    let Some((limit, _)) = &p.projected else {
        return false;
    };
    if p.by != By::Policy || p.expired || p.reasons.iter().any(|c| *c != Cause::Predicted) {
        return false;
    }
    let seen = JobObservation {
        name: job.to_owned(),
        cgroup: Reading::Absent,
        gpus,
        projections: Vec::new(),
        pause: None,
    };
    let js = state.jobs.entry(job.to_owned()).or_default();
    let critical = state.levels.iter().any(|(k, l)| {
        l.level == Level::Critical
            && action(k, cfg) == Some(OnCritical::Pause)
            && concerns(k, &seen)
            && !js.overridden.contains(k)
    });
    if critical || js.spared.is_some() {
        return false;
    }
    js.spared = Some(Spared {
        line: Some(line_of(job, *limit)),
        at_ms: now_ms,
        running_since_ms: now_ms,
    });
    true
}

/// Each policy step, for a job: keeps its episode (`paused` now or not) or ends it. Returns whether
/// a projection alone is kept from pausing it.
pub(super) fn upkeep(
    js: &mut JobState,
    paused: bool,
    levels: &BTreeMap<Resource, LevelState>,
    now_ms: u64,
    cfg: &Policy,
) -> bool {
    let Some(s) = js.spared.as_mut() else {
        return false;
    };
    if paused {
        s.running_since_ms = now_ms;
    }
    let back_to_ok = s
        .line
        .as_ref()
        .and_then(|r| levels.get(r))
        .is_some_and(|l| l.level == Level::Ok && l.since_ms > s.at_ms);
    let ran =
        now_ms.saturating_sub(s.running_since_ms) >= cfg.max_pause_seconds.saturating_mul(1000);
    if back_to_ok || ran {
        js.spared = None;
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::LimitKind;
    use super::*;

    /// Paused at 0 ms on `train`'s cgroup projection.
    fn projected() -> PauseState {
        PauseState {
            since_ms: 0,
            by: By::Policy,
            reasons: vec![Cause::Predicted],
            projected: Some((LimitKind::Cgroup, 148.0 * 1048576.0)),
            expired: false,
            strict: true,
        }
    }

    fn level(level: Level, since_ms: u64) -> LevelState {
        LevelState {
            level,
            pending: None,
            value: None,
            since_ms,
            known: true,
        }
    }

    fn line() -> Resource {
        Resource::JobCgroup("train".into())
    }

    /// Spared once: a second time in the same episode, a pause with a level among its causes, a
    /// person's pause, or a job at its critical line now, never.
    #[test]
    fn a_job_is_spared_once_and_only_below_its_line() {
        let cfg = Policy::default();
        let mut state = State::default();
        state.levels.insert(line(), level(Level::Warn, 0));
        assert!(spare(&mut state, "train", None, &projected(), 5_000, &cfg));
        assert_eq!(
            state.jobs["train"].spared,
            Some(Spared {
                line: Some(line()),
                at_ms: 5_000,
                running_since_ms: 5_000
            })
        );
        assert!(!spare(&mut state, "train", None, &projected(), 6_000, &cfg));

        let mut fresh = State::default();
        let at_line = PauseState {
            reasons: vec![Cause::Resource(line()), Cause::Predicted],
            ..projected()
        };
        assert!(!spare(&mut fresh, "train", None, &at_line, 5_000, &cfg));
        let by_hand = PauseState {
            by: By::User,
            ..projected()
        };
        assert!(!spare(&mut fresh, "train", None, &by_hand, 5_000, &cfg));
        fresh.levels.insert(line(), level(Level::Critical, 0));
        assert!(!spare(&mut fresh, "train", None, &projected(), 5_000, &cfg));
        // Another job's line, or swap (warn only by default) at critical, holds nobody.
        fresh.levels.insert(line(), level(Level::Warn, 0));
        fresh.levels.insert(
            Resource::JobCgroup("other".into()),
            level(Level::Critical, 0),
        );
        fresh
            .levels
            .insert(Resource::Swap, level(Level::Critical, 0));
        // GPU 1 at critical with pausing configured: only a job on it (or one NVML says nothing of).
        fresh
            .levels
            .insert(Resource::GpuTemperature(1), level(Level::Critical, 0));
        assert!(!spare(&mut fresh, "train", None, &projected(), 5_000, &cfg));
        assert!(spare(
            &mut fresh,
            "train",
            Some(vec![0]),
            &projected(),
            5_000,
            &cfg
        ));
        assert_eq!(
            line_of("train", LimitKind::Gpu(3)),
            Resource::GpuMemory(3),
            "a GPU's limit is its memory's level"
        );
    }

    /// The episode lasts while the job is paused and until it has run for `max_pause_seconds`, or
    /// until its line's level falls back to ok after the resume; a level that was ok already ends
    /// nothing.
    #[test]
    fn the_episode_ends_back_at_ok_or_after_the_longest_pause_of_running() {
        let cfg = Policy::default();
        let max = cfg.max_pause_seconds * 1000;
        let mut state = State::default();
        state.levels.insert(line(), level(Level::Ok, 0));
        assert!(spare(&mut state, "train", None, &projected(), 5_000, &cfg));
        let mut js = state.jobs["train"].clone();
        let mut levels = state.levels.clone();
        assert!(upkeep(&mut js, false, &levels, 5_000 + max - 1, &cfg));
        // Paused at the line meanwhile: the running time counts again from its resume.
        assert!(upkeep(&mut js, true, &levels, 6_000, &cfg));
        assert!(upkeep(&mut js, false, &levels, 5_000 + max, &cfg));
        assert!(!upkeep(&mut js, false, &levels, 6_000 + max, &cfg));
        assert_eq!(js.spared, None);

        let mut js = state.jobs["train"].clone();
        levels.insert(line(), level(Level::Warn, 5_500));
        assert!(upkeep(&mut js, false, &levels, 7_000, &cfg));
        levels.insert(line(), level(Level::Ok, 9_000));
        assert!(!upkeep(&mut js, false, &levels, 9_000, &cfg));
        assert_eq!(js.spared, None);
        assert!(!upkeep(&mut js, false, &levels, 9_100, &cfg));
    }
}
