//! The way out of a memory pause. A pause buys time and frees nothing: when the room a paused job needs
//! has not come back within `way_out.decide_seconds`, memwatch goes down the configured ladder —
//! emergency swap or a lent cgroup limit so that the job can run to an urgent fix, then a checkpoint
//! and a clean stop (relaunched by `memwatch launch`) — recording each step. A job no step helps is
//! stopped at the maximum pause: it is never resumed into the same shortfall, and never re-paused in a
//! loop; but one a projection alone paused, below its critical line, is resumed once (`spared.rs`).
//! The room memwatch lends is given back once the job fits again, and after a crash.

use super::Engine;

mod reclaim;
mod room;
mod spared;
mod steps;
mod why_not;

pub(super) use room::Leftover;
pub use why_not::{NoSwap, WhyNot};

use crate::audit::{Action, Reason};
use crate::config::{OnMaxPause, Step};
use crate::held::Record;
use crate::policy::{Cause, LimitKind, Resource};
use crate::way_out::{Phase, SwapError, SwapPlan, Taken, WayOut};

/// Blocking swap work, run off the owner task (`memwatch::work::way_out::run_way_out_task`).
#[derive(Debug)]
pub enum WayOutTask {
    /// Make emergency swap for a job.
    Make {
        /// The job.
        job: String,
        /// How much.
        bytes: u64,
        /// How (zram or a swapfile, and where records go).
        plan: SwapPlan,
    },
    /// Push up to `bytes` of the held job's memory in cgroup `dir` out to swap.
    Reclaim {
        /// The job.
        job: String,
        /// Its memory cgroup.
        dir: crate::sample::cgroup::CgroupDir,
        /// How much to push out at most (v1's `memory.force_empty` pushes what it can).
        bytes: u64,
    },
    /// `job`: `None` for a device left by a job that ended or by a killed daemon.
    Clear {
        /// The job it was made for, if it is still attached.
        job: Option<String>,
        /// The swap device's record.
        record: Record,
        /// How it was made.
        plan: SwapPlan,
    },
}

/// A finished [`WayOutTask`].
#[derive(Debug)]
pub enum WayOutDone {
    /// Emergency swap was made, or why not.
    Made {
        /// The job.
        job: String,
        /// The device, or why there is none.
        result: Result<Record, SwapError>,
    },
    /// The held job's memory was pushed out, or why not.
    Reclaimed {
        /// The job.
        job: String,
        /// What moved, or why nothing could.
        result: Result<crate::way_out::Reclaimed, String>,
    },
    /// Emergency swap was cleared, or why not.
    Cleared {
        /// The job, if it is still attached.
        job: Option<String>,
        /// The device's record.
        record: Record,
        /// Whether swapoff and the removal worked.
        result: Result<(), SwapError>,
    },
}

/// Emergency swap in use at or above this share of its size: the room is running out. Below
/// systemd-oomd's default `SwapUsedLimit` (90 % of all swap, over which it kills the cgroup using the
/// most swap in a slice with `ManagedOOMSwap=kill`, as Debian and Ubuntu set on `-.slice`): where the
/// emergency device is the only swap, the job is paused again before oomd would kill it.
const SWAP_FULL: f64 = 0.8;
/// Growth under this (bytes/s) counts as settled.
const SETTLED_RATE: f64 = 1048576.0;
/// Room left to spare when swap is cleared or a limit put back.
const CLEAR_MARGIN: u64 = 64 << 20;

impl Engine {
    pub(in crate::engine) fn swap_plan(&self) -> SwapPlan {
        let w = &self.cfg.way_out;
        SwapPlan {
            root: self.cfg.process_root.clone(),
            state_dir: self.cfg.state_dir.clone(),
            zram: w.zram,
            swapfile_dir: (!w.swapfile_dir.as_os_str().is_empty()).then(|| w.swapfile_dir.clone()),
        }
    }

    /// The resources a job resumed with emergency room runs through (see `policy::run_through`).
    pub(in crate::engine) fn relieved(name: &str) -> Vec<Resource> {
        vec![Resource::JobCgroup(name.to_owned()), Resource::HostMemory]
    }

    /// Whether the job runs on emergency room now: its cgroup and host projections are the way out's
    /// to watch, not the policy's.
    pub(in crate::engine) fn runs_on_room(&self, name: &str) -> bool {
        self.jobs
            .get(name)
            .and_then(|j| j.way_out.as_ref())
            .is_some_and(|w| w.phase == Phase::Fixing)
    }

    /// Before each policy step: a job running on emergency room is not paused again for the
    /// resources the room relieves (the way out guards it itself).
    pub(in crate::engine) fn relieve(&mut self) {
        let names: Vec<String> = self
            .jobs
            .keys()
            .filter(|n| self.runs_on_room(n))
            .cloned()
            .collect();
        for name in names {
            let js = self.policy.jobs.entry(name.clone()).or_default();
            js.overridden.extend(Self::relieved(&name));
        }
    }

    /// The limit and growth rate behind a job's pause, when it is a memory pause the way out can help
    /// (the job's cgroup or the host; not a GPU or a temperature).
    pub(in crate::engine) fn memory_pause(&self, name: &str) -> Option<(LimitKind, f64)> {
        let j = self.jobs.get(name)?;
        let p = j.policy_pause()?;
        let mut limit = None;
        for r in &p.held.reasons {
            let l = match r {
                Cause::Resource(Resource::JobCgroup(job)) if job == name => LimitKind::Cgroup,
                Cause::Resource(Resource::HostMemory) => LimitKind::Host,
                Cause::Predicted | Cause::WayOut => match p.held.projected.as_ref() {
                    Some((l, _)) if l.is_ram() => *l,
                    _ => return None,
                },
                _ => return None,
            };
            limit.get_or_insert(l);
        }
        let limit = limit?;
        let measured = if limit == LimitKind::Cgroup {
            j.cgroup_growth.sustained_rate_per_second()
        } else {
            self.readings.host_used.sustained_rate_per_second()
        };
        // Measured while paused, the growth is nil: the rate when the pause began counts too.
        let at_start = if limit == LimitKind::Cgroup {
            p.growth_at_start.cgroup
        } else {
            p.growth_at_start.host
        };
        let at_pause = p
            .held
            .projected
            .as_ref()
            .map_or(0.0, |(_, r)| *r)
            .max(at_start);
        Some((limit, at_pause.max(measured).max(0.0)))
    }

    /// One turn of every job's way out; after each policy step.
    pub(in crate::engine) fn way_out(&mut self, now_ms: u64) {
        if self.cfg.policy.dry_run {
            return;
        }
        let names: Vec<String> = self.jobs.keys().cloned().collect();
        for name in names {
            self.way_out_turn(&name, now_ms);
        }
    }

    pub(in crate::engine) fn way_out_turn(&mut self, name: &str, now_ms: u64) {
        let used = self
            .jobs
            .get(name)
            .and_then(|j| j.way_out.as_ref()?.swap.as_ref())
            .and_then(|r| self.view.swap_used(&r.device));
        if let (Some(used), Some(w)) = (
            used,
            self.jobs.get_mut(name).and_then(|j| j.way_out.as_mut()),
        ) {
            w.swap_peak_bytes = w.swap_peak_bytes.max(used);
        }
        let Some(j) = self.jobs.get(name) else {
            return;
        };
        if j.terminating_since_ms.is_some() {
            return;
        }
        let paused_since = j.policy_pause().map(|p| p.since_ms);
        let phase = j.way_out.as_ref().map(|w| w.phase);
        match phase {
            None | Some(Phase::Done) => {
                let decide = self.cfg.way_out.decide_seconds.saturating_mul(1000);
                // A job with a config waits for one round of the rules since its pause began, so
                // that the cut it needs is staged before the ladder looks for a fix.
                let rules_ran = j.config.is_none()
                    || paused_since.is_some_and(|t| j.adapted_at_ms.is_some_and(|a| a > t));
                if rules_ran && paused_since.is_some_and(|t| now_ms.saturating_sub(t) >= decide) {
                    if let Some((limit, rate)) = self.memory_pause(name) {
                        self.start_ladder(name, limit, rate, now_ms);
                    }
                }
            }
            Some(Phase::MakingSwap) | Some(Phase::Reclaiming) => {}
            Some(Phase::Fixing) => self.fixing(name, used, now_ms),
            Some(Phase::Clearing) => {
                if paused_since.is_some() {
                    // Paused again while its room is being given back: the way out holds the job
                    // again, so the policy's longest pause does not resume it behind the ladder.
                    if let Some(js) = self.policy.jobs.get_mut(name) {
                        js.managed = true;
                    }
                }
                if paused_since.is_some() && self.reclaimed_run(name) {
                    // Resumed into room a push made: pushed out again while it does not thrash.
                    self.reclaim_again(name, now_ms);
                } else if paused_since.is_some() {
                    // The fix did not hold: on down the ladder, the room kept.
                    self.taken(
                        name,
                        Reason::Fix,
                        now_ms,
                        "the job ran out of room again".into(),
                    );
                    self.next_step(name, now_ms);
                } else {
                    self.clearing(name, now_ms);
                }
            }
            Some(Phase::Checkpointing) => {
                let saved = j
                    .config
                    .as_ref()
                    .and_then(|c| c.checkpoint.as_ref())
                    .is_some_and(|k| k.saved_at_ms.is_some());
                let since = j.way_out.as_ref().map_or(now_ms, |w| w.phase_since_ms);
                let grace = self
                    .cfg
                    .way_out
                    .checkpoint_grace_seconds
                    .saturating_mul(1000);
                if saved || now_ms.saturating_sub(since) >= grace {
                    let outcome = if saved {
                        "the trainer saved its checkpoint".to_owned()
                    } else {
                        format!("no acknowledgement within {} s", grace / 1000)
                    };
                    self.taken(name, Reason::Checkpoint, now_ms, outcome);
                    self.stop(name, now_ms);
                }
            }
            Some(Phase::Stopping) => {}
            Some(Phase::NoWayOut) => {
                let Some(since) = paused_since else {
                    // Room came back by itself after all.
                    self.taken(
                        name,
                        Reason::Room,
                        now_ms,
                        "came back; the job runs on".into(),
                    );
                    self.set_phase(name, Phase::Clearing, now_ms);
                    return;
                };
                let max = self.cfg.policy.max_pause_seconds.saturating_mul(1000);
                if now_ms.saturating_sub(since) >= max
                    && self.cfg.policy.on_max_pause != OnMaxPause::Stay
                {
                    self.stop(name, now_ms);
                }
            }
        }
    }

    pub(in crate::engine) fn start_ladder(
        &mut self,
        name: &str,
        limit: LimitKind,
        rate: f64,
        now_ms: u64,
    ) {
        let w = &self.cfg.way_out;
        let shortfall = (rate * w.fix_seconds as f64) as u64;
        let previous = self.jobs.get(name).and_then(|j| j.way_out.clone());
        // Never a loop: a pause soon after a way out ended goes on down that ladder, past the steps
        // already taken, instead of starting it over.
        let again = previous.as_ref().filter(|p| {
            now_ms.saturating_sub(p.phase_since_ms)
                < self.cfg.policy.max_pause_seconds.saturating_mul(1000)
        });
        let remaining = match again {
            Some(p) => p.remaining.clone(),
            None => w.steps.clone(),
        };
        let taken = again.map(|p| p.taken.clone()).unwrap_or_default();
        let way_out = WayOut {
            started_ms: now_ms,
            limit,
            shortfall_bytes: shortfall,
            rate,
            phase: Phase::NoWayOut,
            phase_since_ms: now_ms,
            remaining,
            step: None,
            taken,
            // Room still held from an earlier way out stays the job's until given back.
            swap: previous.as_ref().and_then(|p| p.swap.clone()),
            swap_busy: previous.as_ref().is_some_and(|p| p.swap_busy),
            swap_peak_bytes: previous.as_ref().map_or(0, |p| p.swap_peak_bytes),
            loan: previous.and_then(|p| p.loan),
            fix_generation: None,
            reclaimed: None,
            pushes: 0,
            pushed_bytes: 0,
        };
        if let Some(j) = self.jobs.get_mut(name) {
            j.way_out = Some(way_out);
        }
        if let Some(js) = self.policy.jobs.get_mut(name) {
            js.managed = true;
        }
        self.record(
            now_ms,
            Action::WayOut,
            name,
            Reason::NoRoom,
            format!(
                "the {limit} limit's room did not come back within {} s (growth {:.0} MiB/s, shortfall {} MiB over {} s); trying: {}",
                self.cfg.way_out.decide_seconds,
                rate / 1048576.0,
                shortfall >> 20,
                self.cfg.way_out.fix_seconds,
                match self.jobs.get(name).and_then(|j| j.way_out.as_ref()) {
                    Some(w) if !w.remaining.is_empty() => w
                        .remaining
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    _ if self.cfg.way_out.steps.is_empty() =>
                        "nothing (way_out.steps = [])".to_owned(),
                    _ => "nothing left (a way out ended moments ago)".to_owned(),
                }
            ),
            false,
        );
        self.next_step(name, now_ms);
    }

    /// Takes the next step that applies; records why each skipped one did not.
    pub(in crate::engine) fn next_step(&mut self, name: &str, now_ms: u64) {
        loop {
            let Some(step) = self
                .jobs
                .get_mut(name)
                .and_then(|j| j.way_out.as_mut())
                .and_then(|w| {
                    let s = (!w.remaining.is_empty()).then(|| w.remaining.remove(0));
                    w.step = s;
                    s
                })
            else {
                self.no_way_out(name, now_ms);
                return;
            };
            let tried = match step {
                Step::Swap => self.try_swap(name, now_ms),
                Step::Lend => self.try_lend(name, now_ms),
                Step::Checkpoint => self.try_checkpoint(name, now_ms),
            };
            match tried {
                Ok(()) => {
                    self.save();
                    return;
                }
                Err(why) => self.taken(name, step.into(), now_ms, format!("skipped: {why}")),
            }
        }
    }

    pub(in crate::engine) fn no_way_out(&mut self, name: &str, now_ms: u64) {
        self.set_phase(name, Phase::NoWayOut, now_ms);
        let stay = self.cfg.policy.on_max_pause == OnMaxPause::Stay;
        let max = self.cfg.policy.max_pause_seconds;
        let account = self.account_of(name);
        let spared = self.spare(name, now_ms);
        self.record(
            now_ms,
            Action::WayOut,
            name,
            Reason::NoWayOut,
            format!(
                "no way out ({}); {}",
                if account.is_empty() {
                    "no step configured".to_owned()
                } else {
                    account
                },
                if spared {
                    "paused on a projection alone, below its critical line: resumed once".to_owned()
                } else if stay {
                    "it stays paused (on_max_pause = \"stay\")".to_owned()
                } else {
                    format!(
                        "it will be stopped cleanly {max} s into its pause rather than resumed into the same shortfall"
                    )
                }
            ),
            false,
        );
        if spared {
            self.resume_spared(name, now_ms);
        }
        self.save();
    }

    /// The account of a job's way out so far ("" when it has none).
    fn account_of(&self, name: &str) -> String {
        self.jobs
            .get(name)
            .and_then(|j| j.way_out.as_ref())
            .map(|w| w.account())
            .unwrap_or_default()
    }

    /// Stops the whole job cleanly: the way out's last step.
    pub(in crate::engine) fn stop(&mut self, name: &str, now_ms: u64) {
        let account = self.account_of(name);
        self.set_phase(name, Phase::Stopping, now_ms);
        let reason = if account.is_empty() {
            "no way out of its memory pause".to_owned()
        } else {
            format!("the way out of its memory pause ({account})")
        };
        self.terminate_job(name, &reason, Reason::WayOut, now_ms);
    }

    pub(in crate::engine) fn set_phase(&mut self, name: &str, phase: Phase, now_ms: u64) {
        if let Some(w) = self.jobs.get_mut(name).and_then(|j| j.way_out.as_mut()) {
            if w.phase != phase {
                w.phase = phase;
                w.phase_since_ms = now_ms;
            }
        }
        if matches!(phase, Phase::Clearing | Phase::Done) {
            // The pause is over: the policy's own rules hold again.
            if let Some(js) = self.policy.jobs.get_mut(name) {
                js.managed = false;
            }
        }
        self.dirty = true;
    }

    /// Records a step taken (or skipped): in the way out's account, and as a `way_out` event whose
    /// reason is the step (`swap`, `lend`, `checkpoint`, `fix`, `room`).
    pub(in crate::engine) fn taken(
        &mut self,
        name: &str,
        step: Reason,
        now_ms: u64,
        outcome: String,
    ) {
        if let Some(w) = self.jobs.get_mut(name).and_then(|j| j.way_out.as_mut()) {
            w.taken.push(Taken {
                step: step.to_string(),
                at_ms: now_ms,
                outcome: outcome.clone(),
            });
            if w.taken.len() > 16 {
                w.taken.remove(0);
            }
        }
        self.record(
            now_ms,
            Action::WayOut,
            name,
            step.clone(),
            format!("{step}: {outcome}"),
            false,
        );
    }
}
