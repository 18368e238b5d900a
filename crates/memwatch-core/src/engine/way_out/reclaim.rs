//! The swap step for a job no fix can help now (no config, a trainer that takes no directives,
//! nothing staged): its memory is pushed out to swap while it is held, and it is resumed into the
//! room that made. Emergency swap is made first unless the host's own swap has the room. The push is
//! work off the owner task (`WayOutTask::Reclaim`); what moved comes back as `WayOutDone::Reclaimed`.
//!
//! Nothing of a push needs undoing: `memory.reclaim` and `memory.force_empty` change no setting, so a
//! daemon killed mid-push leaves a held job its successor resumes whole (`Engine::recover` counts a
//! way out caught `Reclaiming` as cut short). A job that runs out of room again after its resume is
//! paused again and goes on down the ladder (the `Clearing` phase's rule): it never ping-pongs.

use crate::audit::{Action, Reason};
use crate::engine::Engine;
use crate::policy;
use crate::way_out::{Phase, Reclaimed};

use super::{WayOutTask, WhyNot};

/// A push that moved less than this freed nothing worth a resume.
const MOVED_AT_LEAST: u64 = 16 << 20;
/// A job that brought back this share of what was pushed out before it ran out of room again
/// thrashes: another push would only be undone again.
const THRASHING: f64 = 0.5;
/// Pushes in one way out at most.
const MOST_PUSHES: u32 = 16;
/// A page, for the kernel's refault counts.
const PAGE: u64 = 4096;

impl Engine {
    /// The swap step without a fix: room made by pushing the held job's memory out. `no_fix` is why
    /// there is no fix, said when the job cannot be reclaimed either.
    pub(in crate::engine) fn try_reclaim(
        &mut self,
        name: &str,
        no_fix: WhyNot,
        now_ms: u64,
    ) -> Result<(), WhyNot> {
        let j = self.jobs.get(name).ok_or(WhyNot::Gone)?;
        if j.pause.is_none() {
            return Err(WhyNot::Gone);
        }
        let (Some(_), Some(cg)) = (j.cgroup_dir.as_ref(), j.cgroup()) else {
            return Err(WhyNot::NothingToReclaim {
                no_fix: Box::new(no_fix),
            });
        };
        // What it holds that only swap can take: its anonymous memory (page cache is dropped).
        let anon = cg.anon_bytes.unwrap_or(cg.usage_bytes);
        let wanted = self.room_bytes(name).max(64 << 20).min(anon);
        if wanted < MOVED_AT_LEAST {
            return Err(WhyNot::NothingToReclaim {
                no_fix: Box::new(no_fix),
            });
        }
        let free_swap = self
            .readings
            .latest
            .as_ref()
            .and_then(|s| s.host.memory.as_ref())
            .map_or(0, |m| m.swap_free_bytes);
        let margin = self.cfg.way_out.swap_margin_mib << 20;
        if free_swap >= wanted.saturating_add(margin) {
            self.taken(
                name,
                Reason::Reclaim,
                now_ms,
                format!(
                    "no fix can be applied now ({no_fix}); the host's swap has {} MiB free: pushing up to {} MiB of the held job out to it",
                    free_swap >> 20,
                    wanted >> 20
                ),
            );
            self.start_reclaim(name, now_ms);
            return Ok(());
        }
        if let Some(r) = j.way_out.as_ref().and_then(|w| w.swap.as_ref()) {
            // One emergency device per way out: the room it has left was not enough.
            return Err(WhyNot::SwapUsedUp(r.device.to_string()));
        }
        let zram = self.cfg.way_out.zram && self.view.zram_control();
        if !zram && self.cfg.way_out.swapfile_dir.as_os_str().is_empty() {
            return Err(WhyNot::NoSwapTarget {
                no_fix: Box::new(no_fix),
                free_mib: free_swap >> 20,
            });
        }
        let (bytes, zram) = self.swap_size(wanted.saturating_add(margin))?;
        self.make_swap(name, bytes, zram, now_ms, |making| {
            format!(
                "no fix can be applied now ({no_fix}); {making} to push the held job's memory out to"
            )
        });
        Ok(())
    }

    /// Hands the push off: the job stays held while it runs.
    pub(in crate::engine) fn start_reclaim(&mut self, name: &str, now_ms: u64) {
        let Some(j) = self.jobs.get(name) else {
            return;
        };
        let (Some(dir), Some(cg)) = (j.cgroup_dir.clone(), j.cgroup()) else {
            return;
        };
        let anon = cg.anon_bytes.unwrap_or(cg.usage_bytes);
        let bytes = self.room_bytes(name).max(64 << 20).min(anon);
        self.set_phase(name, Phase::Reclaiming, now_ms);
        self.save();
        self.emit(crate::engine::Effect::WayOut(WayOutTask::Reclaim {
            job: name.to_owned(),
            dir,
            bytes,
        }));
    }

    /// What came of a push.
    pub(in crate::engine) fn reclaimed(
        &mut self,
        name: &str,
        result: Result<Reclaimed, String>,
        now_ms: u64,
    ) {
        let Some(j) = self.jobs.get(name) else {
            return;
        };
        if j.way_out.as_ref().map(|w| w.phase) != Some(Phase::Reclaiming) {
            return;
        }
        if j.pause.is_none() {
            // Resumed meanwhile (by hand, or its level came back as the push went on).
            if let Ok(r) = result {
                self.taken(
                    name,
                    Reason::Reclaim,
                    now_ms,
                    format!(
                        "{} MiB pushed out to swap while held ({}, {} ms; its cgroup {} → {} MiB); the job was resumed as its room came back",
                        r.moved() >> 20,
                        r.how,
                        r.ms,
                        r.usage_before >> 20,
                        r.usage_after >> 20
                    ),
                );
                self.note_push(name, r);
            }
            self.set_phase(name, Phase::Clearing, now_ms);
            self.save();
            return;
        }
        match result {
            Ok(r) if r.moved() >= MOVED_AT_LEAST => {
                let secs = (r.ms as f64 / 1000.0).max(0.001);
                self.taken(
                    name,
                    Reason::Reclaim,
                    now_ms,
                    format!(
                        "{} MiB pushed out to swap while held ({}, {} ms, {:.0} MiB/s; its cgroup {} → {} MiB, {} MiB in swap)",
                        r.moved() >> 20,
                        r.how,
                        r.ms,
                        (r.moved() >> 20) as f64 / secs,
                        r.usage_before >> 20,
                        r.usage_after >> 20,
                        r.swap_after >> 20
                    ),
                );
                self.note_push(name, r);
                self.resume_into_room(name, now_ms);
            }
            Ok(r) => {
                self.taken(
                    name,
                    Reason::Reclaim,
                    now_ms,
                    format!(
                        "freed nothing worth a resume ({} MiB moved by {})",
                        r.moved() >> 20,
                        r.how
                    ),
                );
                self.next_step(name, now_ms);
            }
            Err(e) => {
                self.taken(name, Reason::Reclaim, now_ms, format!("failed: {e}"));
                self.next_step(name, now_ms);
            }
        }
        self.save();
    }

    /// Whether the job's held memory is being pushed out (or its swap made for that): its resume is
    /// the push's to make.
    pub(in crate::engine) fn pushing(&self, name: &str) -> bool {
        self.jobs
            .get(name)
            .and_then(|j| j.way_out.as_ref())
            .is_some_and(|w| {
                w.phase == Phase::Reclaiming
                    || (w.phase == Phase::MakingSwap && w.fix_generation.is_none())
            })
    }

    /// Keeps what a push moved, added to the way out's earlier pushes.
    fn note_push(&mut self, name: &str, r: Reclaimed) {
        if let Some(w) = self.jobs.get_mut(name).and_then(|j| j.way_out.as_mut()) {
            w.pushes += 1;
            w.pushed_bytes = w.pushed_bytes.saturating_add(r.moved());
            w.reclaimed = Some(r);
        }
    }

    /// Whether the job runs (or ran, until this pause) on room a push made, and no fix.
    pub(in crate::engine) fn reclaimed_run(&self, name: &str) -> bool {
        self.jobs
            .get(name)
            .and_then(|j| j.way_out.as_ref())
            .is_some_and(|w| w.reclaimed.is_some() && w.fix_generation.is_none())
    }

    /// The job ran out of room again after a push: pushed out again unless it thrashes (brought back
    /// at least [`THRASHING`] of what the last push moved) or has been pushed [`MOST_PUSHES`]
    /// times; else on down the ladder.
    pub(in crate::engine) fn reclaim_again(&mut self, name: &str, now_ms: u64) {
        let Some(w) = self.jobs.get(name).and_then(|j| j.way_out.clone()) else {
            return;
        };
        let Some(last) = w.reclaimed.clone() else {
            return;
        };
        let refaulted = match (last.refaults_at, self.refaults(name)) {
            (Some(at), Some(now)) => Some(now.saturating_sub(at).saturating_mul(PAGE)),
            _ => None,
        };
        let thrashing = refaulted.is_none_or(|b| b as f64 >= last.moved() as f64 * THRASHING);
        let ran = now_ms.saturating_sub(w.phase_since_ms) / 1000;
        let brought = refaulted.map_or_else(
            || "its refaults cannot be read".to_owned(),
            |b| {
                format!(
                    "it brought back {} of the {} MiB pushed out",
                    b >> 20,
                    last.moved() >> 20
                )
            },
        );
        if thrashing || w.pushes >= MOST_PUSHES {
            let why = if thrashing {
                format!("it thrashes: {brought} in {ran} s")
            } else {
                format!("pushed out {} times already", w.pushes)
            };
            self.taken(
                name,
                Reason::Reclaim,
                now_ms,
                format!("the job ran out of room again; not pushed out again ({why})"),
            );
            self.next_step(name, now_ms);
            return;
        }
        self.taken(
            name,
            Reason::Reclaim,
            now_ms,
            format!("the job ran out of room again after {ran} s ({brought}): pushed out again"),
        );
        if let Err(why) = self.try_reclaim(name, WhyNot::NothingStaged, now_ms) {
            self.taken(name, Reason::Reclaim, now_ms, format!("skipped: {why}"));
            self.next_step(name, now_ms);
        }
        self.save();
    }

    /// The job's cgroup's `workingset_refault_anon` now: pages of anonymous memory brought back.
    fn refaults(&self, name: &str) -> Option<u64> {
        let dir = self.jobs.get(name)?.cgroup_dir.as_ref()?;
        let file = "memory.stat";
        let text = self.view.cgroup_file(dir, file)?;
        crate::sample::keyed::stat_values(&dir.dir.join(file), &text, ["workingset_refault_anon"])
            [0]
    }

    /// Resumes a held job into the room its push made. The way out then gives its emergency swap back
    /// once RAM can take it (`Clearing`); a job that runs out of room again is paused again and goes
    /// on down the ladder.
    fn resume_into_room(&mut self, name: &str, now_ms: u64) {
        self.resume_job(name);
        policy::run_through(&mut self.policy, name, &Self::relieved(name));
        self.set_phase(name, Phase::Clearing, now_ms);
        self.record(
            now_ms,
            Action::Resume,
            name,
            Reason::WayOut,
            "resumed into the room its memory pushed out to swap made".into(),
            false,
        );
    }
}
