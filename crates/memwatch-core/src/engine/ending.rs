//! How jobs end: every process of a job memwatch may signal, killing what a `terminate` left after
//! its grace, and dropping a job whose root exited without leaving any of it stopped.

use crate::config::SignalName;

use super::Engine;
use crate::audit::{Action, Reason};
use crate::job::{EndedJob, Job};
use crate::policy;

/// How long a terminated job's processes get to exit after SIGTERM before SIGKILL.
pub const TERMINATE_GRACE_MS: u64 = 10_000;

impl Engine {
    /// Every process of the job memwatch may signal on its owner's behalf: its tree (while its root
    /// lives), every process in its own cgroup, and what a pause stopped; never memwatch itself.
    pub(super) fn job_members(&self, j: &Job) -> Vec<crate::host::ProcRef> {
        let mut out: Vec<crate::host::ProcRef> = Vec::new();
        let root_alive = self
            .view
            .stat(j.root.pid)
            .is_ok_and(|s| s.start_time == j.root.start_time && s.state != 'Z');
        if root_alive {
            if let Some(tree) = self.view.tree(j.root.pid) {
                out.extend(tree.iter().map(|p| p.proc_ref()));
            }
        }
        let cgroup = j
            .pause
            .as_ref()
            .and_then(|p| p.frozen())
            .or(j.freezer.as_ref());
        if let Some(f) = cgroup {
            out.extend(
                self.members_of(f)
                    .into_iter()
                    .filter_map(|pid| self.view.stat(pid).ok())
                    .map(|s| s.proc_ref()),
            );
        }
        if let Some(p) = &j.pause {
            out.extend(p.stopped.iter().copied());
        }
        let me = self.view.own_pid();
        let mut seen = std::collections::HashSet::new();
        out.retain(|r| {
            r.pid != me && seen.insert(r.pid) && self.view.owner_may_signal(r.pid, j.owner_uid)
        });
        out
    }

    /// Kills what is left of jobs terminated more than `TERMINATE_GRACE_MS` ago.
    pub(super) fn finish_terminations(&mut self, now_ms: u64) {
        let due: Vec<String> = self
            .jobs
            .values()
            .filter(|j| {
                !j.killed
                    && j.terminating_since_ms
                        .is_some_and(|t| now_ms.saturating_sub(t) >= TERMINATE_GRACE_MS)
            })
            .map(|j| j.name.clone())
            .collect();
        for name in due {
            let Some(j) = self.jobs.get(&name) else {
                continue;
            };
            let members = self.job_members(j);
            for r in &members {
                let _ = self.host.signal(*r, None, SignalName::KILL);
            }
            let cause = j.stop_cause.clone().unwrap_or(Reason::MaxPause);
            if let Some(j) = self.jobs.get_mut(&name) {
                j.killed = true;
            }
            self.record(
                now_ms,
                Action::Kill,
                &name,
                cause,
                format!(
                    "{} process(es) still alive {} s after SIGTERM were killed",
                    members.len(),
                    TERMINATE_GRACE_MS / 1000
                ),
                false,
            );
        }
    }

    /// The job's root exited (or its pid now names another process). Before the job is dropped, every
    /// process of it memwatch stopped is continued and its frozen cgroup thawed, and, when memwatch
    /// held it paused, every stopped process left in the job's own cgroup too: workers orphaned by a
    /// root killed during a pause (kill -9, the OOM killer, `terminate`) never stay stopped. The job
    /// stays in the view's `ended` list with how it ended.
    pub(super) fn job_gone(&mut self, name: &str, now_ms: u64) {
        // The kernel's OOM killer may be what ended it: its cgroup's count read once more, while the
        // cgroup is still there (systemd removes a unit's cgroup with its last process).
        if let Some(j) = self.jobs.get_mut(name) {
            let now = j.cgroup_dir.as_ref().and_then(|d| self.view.oom_kills(d));
            j.note_oom_kills(now);
        }
        let Some(j) = self.jobs.get(name) else {
            return;
        };
        let (mut continued, mut thawed) = (0usize, None);
        if let Some(p) = &j.pause {
            if let Some(f) = p.frozen() {
                match self.host.thaw(f) {
                    Ok(()) => thawed = Some(f.dir.clone()),
                    Err(e) => {
                        tracing::error!(cgroup = %f.dir.display(), error = %e, "cannot thaw the cgroup of a job that ended")
                    }
                }
            }
            let gone = self.host.continue_tree(&p.stopped, None);
            continued += p.stopped.len().saturating_sub(gone.len());
            // Orphans: whatever of the job's own cgroup is still stopped.
            if let Some(f) = p.frozen().or(j.freezer.as_ref()) {
                for pid in self.members_of(f) {
                    let Ok(s) = self.view.stat(pid) else {
                        continue;
                    };
                    let r = s.proc_ref();
                    if s.is_stopped()
                        && !p.stopped.contains(&r)
                        && self.view.owner_may_signal(pid, j.owner_uid)
                        && self.host.signal(r, None, SignalName::CONT).is_ok()
                    {
                        continued += 1;
                    }
                }
            }
        }
        if j.terminating_since_ms.is_some() {
            // Its end was asked for: what the root left behind goes too.
            for r in self.job_members(j) {
                let _ = self.host.signal(r, None, SignalName::TERM);
                let _ = self.host.signal(r, None, SignalName::CONT);
            }
        }
        let was_paused = j.pause.is_some();
        let oom_kills = j.oom_kills_since_attach();
        // Its trainer said it stops at its floor micro-batch after a CUDA OOM, with a checkpoint.
        let cuda_oom_stop = j
            .cuda_oom
            .as_ref()
            .and_then(crate::cuda_oom::CudaOoms::stopped_with_checkpoint)
            .filter(|_| j.terminating_since_ms.is_none());
        let mut how = match (was_paused, &thawed) {
            _ if j.terminating_since_ms.is_some() => format!(
                "stopped by memwatch: {}",
                j.stop_reason.as_deref().unwrap_or("it was terminated")
            ),
            (false, _) if cuda_oom_stop.is_some() => cuda_oom_stop.clone().unwrap_or_default(),
            (false, _) => "its root process exited".to_owned(),
            (true, Some(dir)) => format!(
                "its root process exited while paused; thawed {} and continued {continued} process(es) left behind",
                dir.display()
            ),
            (true, None) => format!(
                "its root process exited while paused; continued {continued} process(es) left behind"
            ),
        };
        if oom_kills > 0 {
            how.push_str(&format!(
                "; the kernel's OOM killer killed {oom_kills} process(es) of its cgroup since the attach"
            ));
        }
        let way_out = j
            .way_out
            .as_ref()
            .map(|w| w.account())
            .filter(|a| !a.is_empty());
        let stopped_by_memwatch = j.terminating_since_ms.is_some();
        // A Slurm job attached by id is followed until its epilog, not until its first task ends.
        let follow = j
            .slurm
            .clone()
            .filter(|_| !stopped_by_memwatch)
            .map(|id| (id, j.owner_uid));
        self.way_out_ended(name);
        let Some(j) = self.jobs.get(name) else {
            return;
        };
        let ended = EndedJob {
            name: j.name.clone(),
            pid: j.root.pid,
            owner_uid: j.owner_uid,
            attached_at_ms: j.attached_at_ms,
            ended_at_ms: now_ms,
            was_paused,
            continued,
            thawed,
            how: how.clone(),
            stopped_by_memwatch,
            cuda_oom_stop: cuda_oom_stop.is_some(),
            way_out,
            slurm_job_id: j.slurm_job_id().map(str::to_owned),
        };
        self.end_pause(name);
        self.jobs.remove(name);
        policy::forget(&mut self.policy, name);
        self.ended.push_back(ended);
        while self.ended.len() > super::ENDED_KEPT {
            self.ended.pop_front();
        }
        self.save();
        let reason = if oom_kills > 0 {
            Reason::OomKill
        } else {
            Reason::Gone
        };
        self.record(now_ms, Action::Detach, name, reason, how, false);
        if let Some((id, uid)) = follow {
            self.follow_next_step(&id, name, uid, now_ms);
        }
    }

    /// Whether a job's root process still exists, through the pidfd kept since attach (`true` when there
    /// is none: the next walk decides).
    pub(super) fn root_alive(&self, j: &Job) -> bool {
        j.pidfd
            .as_ref()
            .is_none_or(|fd| self.view.alive(fd, j.root.pid))
    }
}
