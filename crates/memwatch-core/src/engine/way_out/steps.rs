//! The ladder's steps: emergency swap or a lent limit for an urgent fix, and the checkpoint before a
//! clean stop; resuming a job on its room, and pausing it again.

use crate::audit::{Action, Reason};
use crate::engine::Engine;
use crate::host::Version;
use crate::policy;
use crate::policy::LimitKind;
use crate::way_out::Phase;

use super::{NoSwap, WayOutTask, WhyNot};

/// Emergency swap smaller than this is not worth a device.
pub(in crate::engine) const MIN_SWAP: u64 = 16 << 20;

impl Engine {
    /// The urgent fix a job could take now: the generation of its newest pending change, if its
    /// trainer asks for directives.
    pub(in crate::engine) fn urgent_fix(&self, name: &str) -> Result<u64, WhyNot> {
        let c = self
            .jobs
            .get(name)
            .and_then(|j| j.config.as_ref())
            .ok_or(WhyNot::NoConfig)?;
        if !c.speaks_protocol() {
            return Err(WhyNot::NoDirectives);
        }
        c.pending()
            .map(|d| d.generation)
            .max()
            .ok_or(WhyNot::NothingStaged)
    }

    pub(in crate::engine) fn mark_urgent(&mut self, name: &str, generation: u64) {
        if let Some(c) = self.jobs.get_mut(name).and_then(|j| j.config.as_mut()) {
            for d in c
                .directives
                .iter_mut()
                .filter(|d| d.generation == generation)
            {
                d.urgent = true;
            }
        }
        if let Some(w) = self.jobs.get_mut(name).and_then(|j| j.way_out.as_mut()) {
            w.fix_generation = Some(generation);
        }
    }

    /// The room a step adds: the shortfall plus the margin.
    pub(in crate::engine) fn room_bytes(&self, name: &str) -> u64 {
        let w = &self.cfg.way_out;
        let shortfall = self
            .jobs
            .get(name)
            .and_then(|j| j.way_out.as_ref())
            .map_or(0, |x| x.shortfall_bytes);
        let bytes = shortfall
            .saturating_add(w.swap_margin_mib << 20)
            .max(64 << 20);
        (bytes + (1 << 20) - 1) & !((1 << 20) - 1)
    }

    /// Why the job's cgroup forbids swap, if it does.
    pub(in crate::engine) fn swap_forbidden(&self, name: &str) -> Option<WhyNot> {
        let dir = self.jobs.get(name)?.cgroup_dir.as_ref()?;
        let read = |f: &str| self.view.cgroup_file(dir, f);
        let forbidden = |why| {
            Some(WhyNot::SwapForbidden {
                dir: dir.dir.clone(),
                why,
            })
        };
        if dir.version == Version::V1 {
            if read("memory.swappiness").is_some_and(|s| s.trim() == "0") {
                return forbidden(NoSwap::Swappiness);
            }
            let num = |f: &str| read(f).and_then(|s| s.trim().parse::<u64>().ok());
            if let (Some(sw), Some(l)) = (
                num("memory.memsw.limit_in_bytes"),
                num("memory.limit_in_bytes"),
            ) {
                if sw <= l {
                    return forbidden(NoSwap::MemswLimit);
                }
            }
        } else if read("memory.swap.max").is_some_and(|s| s.trim() == "0") {
            return forbidden(NoSwap::SwapMax);
        }
        None
    }

    pub(in crate::engine) fn try_swap(&mut self, name: &str, now_ms: u64) -> Result<(), WhyNot> {
        if let Some(why) = self.swap_forbidden(name) {
            return Err(why);
        }
        let generation = match self.urgent_fix(name) {
            Ok(g) => g,
            // No fix can be applied now: the job only needs room, which its held memory pushed out
            // to swap makes.
            Err(no_fix) => return self.try_reclaim(name, no_fix, now_ms),
        };
        let (bytes, zram) = self.swap_size(self.room_bytes(name))?;
        self.mark_urgent(name, generation);
        self.make_swap(name, bytes, zram, now_ms, |making| {
            format!("{making} so the job can apply generation {generation} now")
        });
        Ok(())
    }

    /// The emergency swap to make for `wanted` bytes, and whether it is zram: at most
    /// `swap_max_mib`, and with zram never more than half of what RAM has left (compressed pages live
    /// in RAM); less than [`MIN_SWAP`] is not worth a device.
    pub(in crate::engine) fn swap_size(&self, wanted: u64) -> Result<(u64, bool), WhyNot> {
        let available = self.readings.host_memory.map_or(0, |(a, _)| a);
        let zram = self.cfg.way_out.zram && self.view.zram_control();
        let mut bytes = wanted.min(self.cfg.way_out.swap_max_mib << 20);
        if zram {
            bytes = bytes.min(available / 2);
        }
        if bytes < MIN_SWAP {
            return Err(WhyNot::TooLittleForSwap {
                available_mib: available >> 20,
            });
        }
        Ok((bytes, zram))
    }

    /// Hands off making `bytes` of emergency swap (`zram`, else a swapfile) for the job, which waits
    /// for it (`MakingSwap`), and records it: `why` words the event around "making N MiB of
    /// emergency swap (zram)".
    pub(in crate::engine) fn make_swap(
        &mut self,
        name: &str,
        bytes: u64,
        zram: bool,
        now_ms: u64,
        why: impl FnOnce(String) -> String,
    ) {
        let making = format!(
            "making {} MiB of emergency swap ({})",
            bytes >> 20,
            if zram { "zram" } else { "swapfile" }
        );
        self.record(
            now_ms,
            Action::WayOut,
            name,
            Reason::Swap,
            why(making),
            false,
        );
        let plan = self.swap_plan();
        self.emit(crate::engine::Effect::WayOut(WayOutTask::Make {
            job: name.to_owned(),
            bytes,
            plan,
        }));
        if let Some(w) = self.jobs.get_mut(name).and_then(|j| j.way_out.as_mut()) {
            w.swap_busy = true;
        }
        self.set_phase(name, Phase::MakingSwap, now_ms);
    }

    pub(in crate::engine) fn try_lend(&mut self, name: &str, now_ms: u64) -> Result<(), WhyNot> {
        let j = self.jobs.get(name).ok_or(WhyNot::Gone)?;
        if !self.cfg.way_out.lend && !j.launch.as_ref().is_some_and(|l| l.lend) {
            return Err(WhyNot::LendNotAllowed);
        }
        if j.way_out
            .as_ref()
            .is_some_and(|w| w.limit != LimitKind::Cgroup)
        {
            return Err(WhyNot::HostRanOut);
        }
        let dir = j.cgroup_dir.clone().ok_or(WhyNot::NoCgroup)?;
        let original = self
            .view
            .own_limit(&dir)
            .ok_or_else(|| WhyNot::NoOwnLimit(dir.dir.clone()))?;
        let generation = self.urgent_fix(name)?;
        let lent = self
            .room_bytes(name)
            .min(self.cfg.way_out.lend_max_mib << 20);
        let (available, total) = self.readings.host_memory.ok_or(WhyNot::HostUnknown)?;
        // What the host can spare: its available memory above the warn level.
        let keep = (total as f64 * (1.0 - self.cfg.policy.host_memory.warn.0)) as u64;
        let spare = available.saturating_sub(keep);
        if spare < lent {
            return Err(WhyNot::CannotSpare {
                spare_mib: spare >> 20,
                needed_mib: lent >> 20,
            });
        }
        let loan = crate::held::Loan {
            job: name.to_owned(),
            dir: dir.dir.clone(),
            version: dir.version,
            original,
            raised: original.saturating_add(lent),
            owner: j.cgroup_owner.clone(),
        };
        // Write-ahead: the loan is in the state file before the limit moves.
        if let Some(w) = self.jobs.get_mut(name).and_then(|j| j.way_out.as_mut()) {
            w.loan = Some(loan.clone());
        }
        if let Err(e) = self.write_state() {
            if let Some(w) = self.jobs.get_mut(name).and_then(|j| j.way_out.as_mut()) {
                w.loan = None;
            }
            return Err(WhyNot::NotRecorded(e));
        }
        if let Err(e) = self.host.set_limit(&loan) {
            let _ = self.host.restore_limit(&loan, 0);
            if let Some(w) = self.jobs.get_mut(name).and_then(|j| j.way_out.as_mut()) {
                w.loan = None;
            }
            return Err(e.into());
        }
        self.mark_urgent(name, generation);
        self.record(
            now_ms,
            Action::WayOut,
            name,
            Reason::Lend,
            format!(
                "raised {} from {} to {} MiB (through {}) so the job can apply generation {generation} now",
                dir.dir.display(),
                original >> 20,
                loan.raised >> 20,
                loan.owner
            ),
            false,
        );
        self.resume_with_room(name, now_ms);
        Ok(())
    }

    pub(in crate::engine) fn try_checkpoint(
        &mut self,
        name: &str,
        now_ms: u64,
    ) -> Result<(), WhyNot> {
        let j = self.jobs.get(name).ok_or(WhyNot::Gone)?;
        let protocol = j.config.as_ref().is_some_and(|c| c.speaks_protocol());
        let sig = crate::config::SignalName::parse(&self.cfg.policy.checkpoint_signal);
        // Relaunched by `memwatch launch`, or requeued by Slurm (which runs it again, from its
        // checkpoint if it saves one on SIGTERM).
        let restarted =
            j.launch.is_some() || (j.slurm_job_id().is_some() && self.cfg.slurm.requeue);
        if !protocol && sig.is_none() && !restarted {
            return Err(WhyNot::NothingRestarts);
        }
        // Room that is running out is no room: the whole job resumed on a full emergency swap
        // fills the limit before the trainer reaches its save, and the OOM killer ends it.
        let room = j.way_out.as_ref().is_some_and(|w| w.holds_room()) && {
            let used = j
                .way_out
                .as_ref()
                .and_then(|w| w.swap.as_ref())
                .and_then(|r| self.view.swap_used(&r.device));
            self.room_running_out(name, used).is_none()
        };
        if let Some(c) = self.jobs.get_mut(name).and_then(|j| j.config.as_mut()) {
            if protocol {
                c.checkpoint = Some(crate::adapt::CheckpointRequest {
                    requested_at_ms: now_ms,
                    saved_at_ms: None,
                });
            }
        }
        if !protocol && sig.is_none() {
            // A trainer that knows nothing of memwatch: the clean stop (SIGTERM) is its chance to
            // save, as under Slurm or Kubernetes.
            self.taken(
                name,
                Reason::Checkpoint,
                now_ms,
                "the job is asked to stop with SIGTERM (its chance to save)".into(),
            );
            self.stop(name, now_ms);
            return Ok(());
        }
        // The trainer must run to save: all of it while emergency room lasts, else its root alone.
        if room {
            self.resume_with_room(name, now_ms);
        } else {
            self.run_root_alone(name);
        }
        if let (Some(sig), Some(j)) = (sig, self.jobs.get(name)) {
            if let Err(e) = self.signal_root(j, sig) {
                tracing::warn!(job = name, error = %e, "checkpoint signal failed");
            }
        }
        self.set_phase(name, Phase::Checkpointing, now_ms);
        self.record(
            now_ms,
            Action::Checkpoint,
            name,
            Reason::WayOut,
            format!(
                "checkpoint requested{}{}{}; the job is stopped cleanly once it is saved or in {} s",
                if protocol { " (directive)" } else { "" },
                sig.map(|s| format!(" ({s})")).unwrap_or_default(),
                if room {
                    ""
                } else {
                    "; its root runs alone, the rest of it stays paused"
                },
                self.cfg.way_out.checkpoint_grace_seconds
            ),
            false,
        );
        Ok(())
    }

    /// Lets a paused job's root run while the rest of it stays stopped (a frozen cgroup becomes
    /// stopped processes first: the freezer cannot thaw one process).
    pub(in crate::engine) fn run_root_alone(&mut self, name: &str) {
        let Some(j) = self.jobs.get(name) else {
            return;
        };
        let Some(p) = j.pause.clone() else {
            return;
        };
        let mut stopped = p.stopped.clone();
        if let Some(f) = p.frozen() {
            for pid in self.members_of(f) {
                if pid == j.root.pid {
                    continue;
                }
                let Ok(s) = self.view.stat(pid) else {
                    continue;
                };
                let r = s.proc_ref();
                if self.view.owner_may_signal(pid, j.owner_uid)
                    && self
                        .host
                        .signal(r, None, crate::config::SignalName::STOP)
                        .is_ok()
                {
                    stopped.push(r);
                }
            }
        }
        // Recorded before the thaw: a crash now continues them all.
        if let Some(pause) = self.jobs.get_mut(name).and_then(|j| j.pause.as_mut()) {
            pause.stopped = stopped;
        }
        self.save();
        let Some(j) = self.jobs.get(name) else {
            return;
        };
        if let Some(f) = p.frozen() {
            if let Err(e) = self.host.thaw(f) {
                tracing::error!(cgroup = %f.dir.display(), error = %e, "cannot thaw for the checkpoint");
            }
        }
        let _ = self.signal_root(j, crate::config::SignalName::CONT);
        if let Some(pause) = self.jobs.get_mut(name).and_then(|j| j.pause.as_mut()) {
            pause.mechanism = crate::held::Mechanism::Signals;
        }
        self.save();
    }

    /// Resumes a paused job that now has emergency room, for its fix.
    pub(in crate::engine) fn resume_with_room(&mut self, name: &str, now_ms: u64) {
        self.resume_job(name);
        policy::run_through(&mut self.policy, name, &Self::relieved(name));
        self.set_phase(name, Phase::Fixing, now_ms);
        self.record(
            now_ms,
            Action::Resume,
            name,
            Reason::WayOut,
            "resumed with emergency room to apply its fix".into(),
            false,
        );
    }

    /// Pauses a job the way out resumed, when its room ran out or its fix did not come.
    pub(in crate::engine) fn pause_again(&mut self, name: &str, why: String, now_ms: u64) {
        let (limit, rate) = self
            .jobs
            .get(name)
            .and_then(|j| j.way_out.as_ref())
            .map_or((LimitKind::Cgroup, 0.0), |w| (w.limit, w.rate));
        let state = policy::hold(&mut self.policy, name, now_ms, limit, rate);
        if let Some(js) = self.policy.jobs.get_mut(name) {
            js.managed = true;
        }
        if let Err(e) = self.pause_job(name, state, &why, now_ms) {
            tracing::warn!(job = name, error = %e, "cannot pause the job again");
        }
        self.record(now_ms, Action::Pause, name, Reason::WayOut, why, false);
    }
}
