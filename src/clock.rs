//! The daemon's clock. Every duration memwatch measures (hold times, max pause, checkpoint deadlines,
//! growth slopes, settle times) comes from `CLOCK_BOOTTIME`, which never steps: an NTP correction or a
//! hand-set date cannot shorten or stretch a pause. To keep the numbers readable as dates (the API, the
//! state file and the dashboard show them), the engine's milliseconds are boot time plus an anchor, the
//! wall time at boot as first seen in this boot. The anchor is persisted with the boot id, so every
//! daemon of the same boot counts on the same line and persisted deadlines survive a restart; a new
//! boot gets a new anchor (and no job survives a reboot anyway).
//!
//! After an NTP step the engine's stamps differ from the wall clock by the step until the next boot;
//! durations never do.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, from the wall clock (stamps only, never durations).
pub fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Milliseconds of `CLOCK_BOOTTIME`: monotonic, counts suspend, never steps.
pub fn boot_ms() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .map(|t| t.tv_sec() as u64 * 1000 + t.tv_nsec() as u64 / 1_000_000)
        .unwrap_or(0)
}

/// A monotonic clock that reads like wall time: `anchor + boot time`.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    /// Wall milliseconds at boot time zero (as first seen in this boot).
    pub anchor_ms: u64,
    boot: fn() -> u64,
}

impl Clock {
    /// A clock anchored at `anchor_ms`, reading boot time from `boot` (tests pass their own).
    pub fn new(anchor_ms: u64, boot: fn() -> u64) -> Self {
        Clock { anchor_ms, boot }
    }

    /// The anchor to use now: the wall time minus the boot time.
    pub fn fresh_anchor(wall: u64, boot: u64) -> u64 {
        wall.saturating_sub(boot)
    }

    /// The system clock, anchored at `anchor_ms`.
    pub fn system(anchor_ms: u64) -> Self {
        Clock::new(anchor_ms, boot_ms)
    }

    /// The engine's "now": monotonic milliseconds on the wall-time scale.
    pub fn now_ms(&self) -> u64 {
        self.anchor_ms.saturating_add((self.boot)())
    }
}

/// The boot id (`/proc/sys/kernel/random/boot_id`), which tells one boot from the next.
pub fn boot_id(root: &std::path::Path) -> Option<String> {
    std::fs::read_to_string(root.join("proc/sys/kernel/random/boot_id"))
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty() && s.len() <= 64)
}

/// The clock's anchor on the machine under `process_root`: `previous` (a state file's) when it
/// belongs to this boot, else a fresh one. The daemon's at start, and the guardian's for the pauses
/// it records, so that both count in the same engine time.
pub fn anchor(
    process_root: &std::path::Path,
    previous: Option<&memwatch_core::record::ClockAnchor>,
) -> memwatch_core::record::ClockAnchor {
    let boot_id = boot_id(process_root).unwrap_or_default();
    match previous {
        Some(a) if !boot_id.is_empty() && a.boot_id == boot_id => a.clone(),
        _ => memwatch_core::record::ClockAnchor {
            boot_id,
            anchor_ms: Clock::fresh_anchor(wall_ms(), boot_ms()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{OnMaxPause, Policy};
    use crate::policy::{self, Decision, JobObservation, Observation, Reading};
    use std::sync::atomic::{AtomicU64, Ordering};

    static BOOT: AtomicU64 = AtomicU64::new(0);
    fn fake_boot() -> u64 {
        BOOT.load(Ordering::SeqCst)
    }

    fn observation(now_ms: u64, host: f64) -> Observation {
        Observation {
            now_ms,
            host: vec![(policy::Resource::HostMemory, Reading::Value(host))],
            cpu_temperature: None,
            gpus: Vec::new(),
            jobs: vec![JobObservation {
                name: "j".into(),
                cgroup: Reading::Absent,
                gpus: None,
                projections: Vec::new(),
                pause: None,
            }],
        }
    }

    /// The wall clock steps back an hour while a job is paused: the policy, fed this clock, still
    /// resumes at exactly `max_pause_seconds` of real (boot) time, not an hour later.
    #[test]
    fn a_wall_clock_jump_back_does_not_stretch_a_pause() {
        let cfg = Policy {
            max_pause_seconds: 10,
            on_max_pause: OnMaxPause::Resume,
            ..Policy::default()
        };
        // Boot time 1000 s; wall time "now".
        BOOT.store(1_000_000, Ordering::SeqCst);
        let wall = 1_800_000_000_000u64;
        let clock = Clock::new(Clock::fresh_anchor(wall, fake_boot()), fake_boot);
        let mut state = policy::State::default();
        let t0 = clock.now_ms();
        let (s, d) = policy::evaluate(&state, &observation(t0, 0.99), &cfg);
        state = s;
        // The engine keeps the pause's record and shows it in the next observations.
        let pause = d.iter().find_map(|d| match d {
            Decision::Pause { pause, .. } => Some(pause.clone()),
            _ => None,
        });
        assert!(pause.is_some(), "{d:?}");
        let observation = |now: u64, host: f64| {
            let mut o = observation(now, host);
            o.jobs[0].pause = pause.clone();
            o
        };
        // An NTP step of −1 h happens now; the wall clock is not read by the clock at all, so the
        // anchor stays; only boot time moves. Still critical, 9.9 s later: no resume yet.
        let stepped_wall = wall - 3_600_000;
        assert!(stepped_wall < wall);
        BOOT.store(1_000_000 + 9_900, Ordering::SeqCst);
        let (s, d) = policy::evaluate(&state, &observation(clock.now_ms(), 0.99), &cfg);
        state = s;
        assert!(d.is_empty(), "{d:?}");
        // At 10 s of boot time the pause ends, wall clock or not.
        BOOT.store(1_000_000 + 10_000, Ordering::SeqCst);
        let (_, d) = policy::evaluate(&state, &observation(clock.now_ms(), 0.99), &cfg);
        assert!(
            d.iter().any(|d| matches!(
                d,
                Decision::Resume {
                    why: crate::policy::Resumed::MaxPause,
                    ..
                }
            )),
            "{d:?}"
        );
        // A fresh anchor taken after the step (a restarted daemon in a new boot) only shifts the
        // scale; time never runs backwards for a clock that keeps its anchor.
        let later = Clock::new(Clock::fresh_anchor(stepped_wall, fake_boot()), fake_boot);
        assert!(later.now_ms() < clock.now_ms());
        assert!(clock.now_ms() >= t0);
    }

    #[test]
    fn boot_time_is_monotonic_and_nonzero() {
        let a = boot_ms();
        let b = boot_ms();
        assert!(a > 0 && b >= a);
    }
}
