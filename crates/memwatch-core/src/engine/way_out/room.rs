//! While a job runs on emergency room: whether its fix came and it fits, whether the room runs out;
//! giving the room back (swap work off the owner task), and what ended jobs and killed daemons left.

use crate::audit::{Action, Reason};
use crate::engine::Engine;
use crate::held::Record;
use crate::host::Version;
use crate::policy::LimitKind;
use crate::way_out::Phase;

use super::{CLEAR_MARGIN, SETTLED_RATE, SWAP_FULL, WayOutDone, WayOutTask};

/// What jobs that ended, or a daemon that was killed, left to undo once RAM can take it.
#[derive(Default)]
pub(in crate::engine) struct Leftover {
    /// Emergency swap areas to clear and take off.
    pub(in crate::engine) swaps: Vec<Record>,
    /// Those of them being cleared now.
    pub(in crate::engine) clearing: Vec<Record>,
    /// Raised limits to put back once usage fits.
    pub(in crate::engine) loans: Vec<crate::held::Loan>,
}

impl Engine {
    /// `swap_used`: what /proc/swaps says of the job's emergency swap, read once this turn.
    pub(in crate::engine) fn fixing(&mut self, name: &str, swap_used: Option<u64>, now_ms: u64) {
        let Some(j) = self.jobs.get(name) else {
            return;
        };
        let Some(w) = j.way_out.clone() else {
            return;
        };
        let step = w.step.map_or(Reason::Fix, Reason::from);
        if j.pause.is_some() {
            self.taken(name, step, now_ms, "the job was paused again".into());
            self.next_step(name, now_ms);
            return;
        }
        let directive = w.fix_generation.and_then(|g| {
            j.config
                .as_ref()?
                .directives
                .iter()
                .find(|d| d.generation == g)
                .cloned()
        });
        let failed = match &directive {
            None => Some("the change is no longer staged".to_owned()),
            Some(d) if d.declined.is_some() => Some(format!(
                "the trainer cannot apply it: {}",
                d.declined.clone().unwrap_or_default()
            )),
            Some(d)
                if d.verification.as_ref().map(|v| v.state)
                    == Some(crate::adapt::VerifyState::Unverified) =>
            {
                Some("acknowledged but not seen (unverified)".to_owned())
            }
            _ => None,
        };
        let applied = directive.as_ref().is_some_and(|d| {
            d.applied_epoch.is_some()
                && d.verification.as_ref().map(|v| v.state)
                    != Some(crate::adapt::VerifyState::Pending)
        });
        let room_out = self.room_running_out(name, swap_used);
        let late = now_ms.saturating_sub(w.phase_since_ms)
            >= self.cfg.way_out.fix_seconds.saturating_mul(1000);
        if let Some(why) = failed.or(room_out).or_else(|| {
            late.then(|| {
                format!(
                    "the fix did not fit the job within {} s",
                    self.cfg.way_out.fix_seconds
                )
            })
        }) {
            self.taken(name, step, now_ms, why.clone());
            self.pause_again(name, format!("way out: {why}"), now_ms);
            self.next_step(name, now_ms);
            return;
        }
        // Settled: new workers fill their caches too; the room goes back once the growth stopped.
        let settled = self.jobs.get(name).is_some_and(|j| {
            if w.limit == LimitKind::Cgroup {
                j.cgroup_growth.sustained_rate_per_second() < SETTLED_RATE
            } else {
                self.readings.host_used.sustained_rate_per_second() < SETTLED_RATE
            }
        });
        if applied && settled && self.fits_without_room(name) {
            let g = w.fix_generation.unwrap_or(0);
            self.taken(
                name,
                step,
                now_ms,
                format!("generation {g} applied now; the job fits again"),
            );
            // The relief stays until the levels leave critical by themselves (their hold times): the
            // job fits, and a level that has not caught up yet must not pause it again.
            self.set_phase(name, Phase::Clearing, now_ms);
            self.record(
                now_ms,
                Action::WayOut,
                name,
                Reason::Fixed,
                format!("generation {g} applied mid-epoch; giving the emergency room back"),
                false,
            );
            self.save();
        }
    }

    /// Why the room the job runs on is nearly used up, if it is.
    pub(in crate::engine) fn room_running_out(
        &self,
        name: &str,
        swap_used: Option<u64>,
    ) -> Option<String> {
        let j = self.jobs.get(name)?;
        let w = j.way_out.as_ref()?;
        if let Some(r) = &w.swap {
            let used = swap_used?;
            if used as f64 >= r.bytes as f64 * SWAP_FULL {
                return Some(format!(
                    "emergency swap {} is {} of {} MiB full",
                    r.device,
                    used >> 20,
                    r.bytes >> 20
                ));
            }
        }
        if let Some(l) = &w.loan {
            let held = j.cgroup()?.unreclaimable_bytes();
            if held as f64 >= l.raised as f64 * self.cfg.policy.job_cgroup.critical.0 {
                return Some(format!(
                    "the lent limit ({} MiB) is used up",
                    l.raised >> 20
                ));
            }
        }
        None
    }

    /// The cgroup's swapped-out bytes (v1 memory.stat `swap`, v2 memory.swap.current).
    pub(in crate::engine) fn cgroup_swap(&self, name: &str) -> u64 {
        let Some(dir) = self.jobs.get(name).and_then(|j| j.cgroup_dir.as_ref()) else {
            return 0;
        };
        if dir.version == Version::V1 {
            let file = "memory.stat";
            self.view
                .cgroup_file(dir, file)
                .and_then(|t| {
                    crate::sample::keyed::stat_values(&dir.dir.join(file), &t, ["swap"])[0]
                })
                .unwrap_or(0)
        } else {
            self.view
                .cgroup_file(dir, "memory.swap.current")
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0)
        }
    }

    /// Whether the job, with what it has swapped, fits under its own limit (the lent one put back)
    /// below the level at which a pause ends, or the host has room for it.
    pub(in crate::engine) fn fits_without_room(&self, name: &str) -> bool {
        let Some(j) = self.jobs.get(name) else {
            return false;
        };
        let Some(w) = j.way_out.as_ref() else {
            return false;
        };
        if w.limit == LimitKind::Cgroup {
            let Some(cg) = j.cgroup() else {
                return false;
            };
            let limit = w
                .loan
                .as_ref()
                .map(|l| l.original)
                .or(cg.limit_bytes)
                .unwrap_or(u64::MAX);
            let need = cg.unreclaimable_bytes() + self.cgroup_swap(name);
            (need as f64) < limit as f64 * self.cfg.policy.job_cgroup.critical_leave.0
        } else {
            let swapped = w
                .swap
                .as_ref()
                .and_then(|r| self.view.swap_used(&r.device))
                .unwrap_or(0);
            self.readings.host_memory.is_some_and(|(a, t)| {
                (a.saturating_sub(swapped) as f64)
                    > t as f64 * (1.0 - self.cfg.policy.host_memory.critical_leave.0)
            })
        }
    }

    /// Gives back what the job's way out holds once RAM can take it; then the way out is done.
    pub(in crate::engine) fn clearing(&mut self, name: &str, now_ms: u64) {
        let Some(w) = self.jobs.get(name).and_then(|j| j.way_out.clone()) else {
            return;
        };
        // Pushed out while held, the job lives on that swap: a cgroup that looks roomy just after
        // the push would take it all back with a swapoff. It goes once the job has little left there
        // (it let go of what it pushed out, or brought it back as it needed it), or with the job.
        let lives_on_it = w.reclaimed.is_some() && self.cgroup_swap(name) >= CLEAR_MARGIN;
        if let Some(r) = &w.swap {
            if !w.swap_busy && !lives_on_it && self.swap_clearable(Some(name), r) {
                let plan = self.swap_plan();
                self.emit(crate::engine::Effect::WayOut(WayOutTask::Clear {
                    job: Some(name.to_owned()),
                    record: r.clone(),
                    plan,
                }));
                if let Some(w) = self.jobs.get_mut(name).and_then(|j| j.way_out.as_mut()) {
                    w.swap_busy = true;
                }
            }
        }
        if let Some(l) = &w.loan {
            match self.host.restore_limit(l, CLEAR_MARGIN) {
                Ok(true) => {
                    if let Some(w) = self.jobs.get_mut(name).and_then(|j| j.way_out.as_mut()) {
                        w.loan = None;
                    }
                    self.record(
                        now_ms,
                        Action::WayOut,
                        name,
                        Reason::Lend,
                        format!(
                            "{} back at {} MiB (through {})",
                            l.dir.display(),
                            l.original >> 20,
                            l.owner
                        ),
                        false,
                    );
                    self.save();
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(job = name, error = %e, "cannot put the limit back yet"),
            }
        }
        if let Some(w) = self.jobs.get(name).and_then(|j| j.way_out.as_ref()) {
            if !w.holds_room() {
                self.set_phase(name, Phase::Done, now_ms);
                self.save();
            }
        }
    }

    /// Whether RAM can take back what `r` holds: the host's available memory covers its used pages with
    /// a margin, and the job's cgroup (if any) has room for what it swapped.
    pub(in crate::engine) fn swap_clearable(&self, job: Option<&str>, r: &Record) -> bool {
        let used = self.view.swap_used(&r.device).unwrap_or(0);
        let Some((available, total)) = self.readings.host_memory else {
            return false;
        };
        let margin = CLEAR_MARGIN.max(total / 20);
        if available < used.saturating_add(margin) {
            return false;
        }
        let Some(name) = job else {
            return true;
        };
        let Some(cg) = self.jobs.get(name).and_then(|j| j.cgroup()) else {
            return true;
        };
        match cg.limit_bytes {
            Some(limit) => {
                limit.saturating_sub(cg.usage_bytes)
                    >= self.cgroup_swap(name).saturating_add(CLEAR_MARGIN)
            }
            None => true,
        }
    }

    /// A swap task came back.
    pub(in crate::engine) fn way_out_done(&mut self, done: WayOutDone, now_ms: u64) {
        match done {
            WayOutDone::Made { job, result } => {
                let phase = self
                    .jobs
                    .get(&job)
                    .and_then(|j| j.way_out.as_ref())
                    .map(|w| w.phase);
                if let Some(w) = self.jobs.get_mut(&job).and_then(|j| j.way_out.as_mut()) {
                    w.swap_busy = false;
                }
                match result {
                    Ok(record) => {
                        let Some(w) = self.jobs.get_mut(&job).and_then(|j| j.way_out.as_mut())
                        else {
                            // The job ended meanwhile.
                            self.leftover.swaps.push(record);
                            return;
                        };
                        w.swap = Some(record.clone());
                        self.taken(
                            &job,
                            Reason::Swap,
                            now_ms,
                            format!("{} MiB on {}", record.bytes >> 20, record.device),
                        );
                        let paused = self.jobs.get(&job).is_some_and(|j| j.pause.is_some());
                        let fix = self
                            .jobs
                            .get(&job)
                            .and_then(|j| j.way_out.as_ref())
                            .and_then(|w| w.fix_generation);
                        if phase == Some(Phase::MakingSwap) && paused && fix.is_none() {
                            // Swap for a job no fix helps: its held memory goes out to it first.
                            self.start_reclaim(&job, now_ms);
                        } else if phase == Some(Phase::MakingSwap) && paused {
                            self.resume_with_room(&job, now_ms);
                        } else {
                            // Room came back by itself meanwhile: give it back.
                            self.set_phase(&job, Phase::Clearing, now_ms);
                        }
                        self.save();
                    }
                    Err(e) => {
                        self.taken(&job, Reason::Swap, now_ms, format!("failed: {e}"));
                        if phase == Some(Phase::MakingSwap) {
                            self.next_step(&job, now_ms);
                        }
                    }
                }
            }
            WayOutDone::Reclaimed { job, result } => self.reclaimed(&job, result, now_ms),
            WayOutDone::Cleared {
                job,
                record,
                result,
            } => {
                let name = job.clone().unwrap_or_default();
                let peak = job
                    .as_deref()
                    .and_then(|n| self.jobs.get(n))
                    .and_then(|j| j.way_out.as_ref())
                    .map(|w| format!(" (peak use {} MiB)", w.swap_peak_bytes >> 20))
                    .unwrap_or_default();
                match result {
                    Ok(()) => {
                        self.record(
                            now_ms,
                            Action::WayOut,
                            &name,
                            Reason::Swap,
                            format!("emergency swap {} cleared and removed{peak}", record.device),
                            false,
                        );
                        if let Some(w) = job
                            .as_deref()
                            .and_then(|n| self.jobs.get_mut(n))
                            .and_then(|j| j.way_out.as_mut())
                        {
                            w.swap = None;
                            w.swap_busy = false;
                        }
                        self.leftover.swaps.retain(|r| r != &record);
                    }
                    Err(e) => {
                        tracing::warn!(device = %record.device, error = %e, "cannot clear emergency swap yet");
                        if let Some(w) = job
                            .as_deref()
                            .and_then(|n| self.jobs.get_mut(n))
                            .and_then(|j| j.way_out.as_mut())
                        {
                            w.swap_busy = false;
                        }
                        self.leftover.clearing.retain(|r| r != &record);
                    }
                }
                self.save();
            }
        }
    }

    /// Clears swap and puts back limits left by jobs that ended or by a killed daemon, when safe.
    pub(in crate::engine) fn clear_leftovers(&mut self) {
        let swaps: Vec<Record> = self
            .leftover
            .swaps
            .iter()
            .filter(|r| !self.leftover.clearing.contains(r))
            .cloned()
            .collect();
        for r in swaps {
            if self.swap_clearable(None, &r) {
                self.leftover.clearing.push(r.clone());
                let plan = self.swap_plan();
                self.emit(crate::engine::Effect::WayOut(WayOutTask::Clear {
                    job: None,
                    record: r,
                    plan,
                }));
            }
        }
        let before = self.leftover.loans.len();
        let host = self.host.clone();
        self.leftover
            .loans
            .retain(|l| !matches!(host.restore_limit(l, CLEAR_MARGIN), Ok(true)));
        if self.leftover.loans.len() != before {
            self.save();
        }
    }

    /// A job ends: the room its way out held is given back (swap when RAM can take it).
    pub(in crate::engine) fn way_out_ended(&mut self, name: &str) {
        let Some(w) = self.jobs.get_mut(name).and_then(|j| j.way_out.take()) else {
            return;
        };
        if let Some(r) = w.swap {
            if !w.swap_busy {
                self.leftover.swaps.push(r);
            }
        }
        if let Some(l) = w.loan {
            if !matches!(self.host.restore_limit(&l, CLEAR_MARGIN), Ok(true)) {
                self.leftover.loans.push(l);
            }
        }
    }
}
