//! No way out of a projection's pause: the job is resumed once, below its critical line, which holds
//! it if it grows (`policy::spare`, and `policy/spared.rs` for the episode that follows).

use crate::audit::{Action, Reason};
use crate::engine::Engine;
use crate::policy;
use crate::way_out::Phase;

impl Engine {
    /// The ladder found no way out of `name`'s pause: whether to resume it once, because a
    /// projection alone caused the pause and nothing that pauses it is critical now
    /// (`policy::spare`, which opens the episode).
    pub(in crate::engine) fn spare(&mut self, name: &str, now_ms: u64) -> bool {
        let Some(j) = self.jobs.get(name) else {
            return false;
        };
        let Some(p) = j.policy_pause().map(crate::job::Pause::policy) else {
            return false;
        };
        let gpus = j.last.as_ref().and_then(|l| l.gpus.clone());
        policy::spare(&mut self.policy, name, gpus, &p, now_ms, &self.cfg.policy)
    }

    /// Resumes a job [`Engine::spare`] spared: its way out is over (room held from an earlier one
    /// is given back once the job fits), and the policy's own rules hold again.
    pub(in crate::engine) fn resume_spared(&mut self, name: &str, now_ms: u64) {
        let phase = match self.jobs.get(name).and_then(|j| j.way_out.as_ref()) {
            Some(w) if w.holds_room() => Phase::Clearing,
            _ => Phase::Done,
        };
        self.resume_job(name);
        self.set_phase(name, phase, now_ms);
        self.record(
            now_ms,
            Action::Resume,
            name,
            Reason::NoWayOut,
            format!(
                "no way out; resumed below its critical line, which holds it if it grows (a projection alone does not pause it again until its level is back to ok or it has run for {} s)",
                self.cfg.policy.max_pause_seconds
            ),
            false,
        );
    }
}
