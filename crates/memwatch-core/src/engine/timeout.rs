//! Deadlines that no sample brings: the engine says when its next one is due (`poll_timeout`), and the
//! daemon wakes it then (`handle_timeout`), so that a grace, a pause's longest length or a way-out step
//! ends on time however far apart samples are.

use super::Engine;
use super::ending::TERMINATE_GRACE_MS;
use crate::way_out::Phase;

impl Engine {
    /// When the earliest deadline still to be acted on is due (engine clock, ms): a terminated job's
    /// grace before SIGKILL, a policy pause's longest length, the policy's checkpoint grace, and the
    /// way out's waits (the time to decide, a fix's time, a checkpoint's grace, the longest pause of a
    /// job with no way out). A deadline already handled by `handle_timeout` is not returned again:
    /// what it led to waits for new measurements.
    pub fn poll_timeout(&self) -> Option<u64> {
        let mut due: Vec<u64> = Vec::new();
        let max_pause = self.cfg.policy.max_pause_seconds.saturating_mul(1000);
        let w = &self.cfg.way_out;
        for j in self.jobs.values() {
            if let (Some(t), false) = (j.terminating_since_ms, j.killed) {
                due.push(t.saturating_add(TERMINATE_GRACE_MS));
                continue;
            }
            let pause = j.policy_pause();
            let paused_since = pause.map(|p| p.since_ms);
            let state = self.policy.jobs.get(&j.name);
            if let Some(p) = pause {
                if !p.held.expired && state.is_none_or(|s| !s.managed) {
                    due.push(self.max_pause_due(p));
                }
            }
            if let Some(t) = state.and_then(|s| s.checkpoint_deadline_ms) {
                due.push(t);
            }
            let phase = j.way_out.as_ref().map(|w| (w.phase, w.phase_since_ms));
            match (phase, paused_since) {
                (None | Some((Phase::Done, _)), Some(since)) => {
                    due.push(since.saturating_add(w.decide_seconds.saturating_mul(1000)));
                }
                (Some((Phase::Fixing, t)), _) => {
                    due.push(t.saturating_add(w.fix_seconds.saturating_mul(1000)));
                }
                (Some((Phase::Checkpointing, t)), _) => {
                    due.push(t.saturating_add(w.checkpoint_grace_seconds.saturating_mul(1000)));
                }
                (Some((Phase::NoWayOut, _)), Some(since)) => {
                    due.push(since.saturating_add(max_pause));
                }
                _ => {}
            }
        }
        due.into_iter()
            .filter(|t| self.timeouts_handled_ms.is_none_or(|h| *t > h))
            .min()
    }

    /// When a pause reaches `policy.max_pause_seconds` (engine clock, ms): the one place this is
    /// computed, for `poll_timeout` and for the API's `pause_deadline`.
    pub(super) fn max_pause_due(&self, p: &crate::job::Pause) -> u64 {
        p.since_ms
            .saturating_add(self.cfg.policy.max_pause_seconds.saturating_mul(1000))
    }

    /// A deadline from `poll_timeout` is due: ends the graces that ran out and runs the policy and the
    /// way out on the latest measurements (a pause's longest length, a way-out step's wait).
    pub fn handle_timeout(&mut self, now_ms: u64) {
        self.timeouts_handled_ms = Some(now_ms);
        self.finish_terminations(now_ms);
        self.step(now_ms);
        self.dirty = true;
    }
}
