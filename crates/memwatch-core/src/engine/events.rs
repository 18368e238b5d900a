//! Events: what the engine records for people and the API (the audit log, the counts of
//! interventions, the notices' outbox), each naming its job's Slurm job where it has one.

use std::collections::BTreeMap;

use super::Engine;
use crate::audit::{Action, Audit, Event, Notify, Reason};

/// What the engine records of its events.
pub(super) struct Log {
    /// The audit log: every event, the recent ones kept for the API.
    pub(super) audit: Audit,
    /// Each intervention's count by reason, with when it was last made (ms).
    pub(super) counts: BTreeMap<(Action, Reason), (u64, u64)>,
    /// Notifications, when channels are configured.
    pub(super) outbox: Option<Box<dyn Notify>>,
}

impl Engine {
    pub(super) fn record(
        &mut self,
        now_ms: u64,
        action: Action,
        job: &str,
        reason: Reason,
        detail: String,
        dry_run: bool,
    ) {
        // A job that just ended is among the ended ones.
        let slurm_job_id = match self.jobs.get(job) {
            Some(j) => j.slurm_job_id().map(str::to_owned),
            None => self
                .ended
                .iter()
                .rev()
                .find(|e| e.name == job)
                .and_then(|e| e.slurm_job_id.clone()),
        };
        self.record_for(now_ms, action, job, slurm_job_id, reason, detail, dry_run);
    }

    /// Records an event of `job`, which belongs to Slurm job `slurm_job_id` (a Slurm job attached by
    /// id before any process of it ran here is no attached job yet: its events name it all the same).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn record_for(
        &mut self,
        now_ms: u64,
        action: Action,
        job: &str,
        slurm_job_id: Option<String>,
        reason: Reason,
        detail: String,
        dry_run: bool,
    ) {
        debug_assert!(
            !matches!(reason, Reason::Other(_)),
            "an event's reason is one docs/api.md lists"
        );
        self.dirty = true;
        // Events that are no intervention: not counted as one, logged at info.
        let notice = action.is_notice();
        match action {
            Action::Attach | Action::Detach => {}
            _ if notice => {}
            _ => {
                let c = self
                    .events
                    .counts
                    .entry((action, reason.clone()))
                    .or_insert((0, 0));
                c.0 += 1;
                c.1 = now_ms;
            }
        }
        let level = if notice {
            tracing::Level::INFO
        } else {
            tracing::Level::WARN
        };
        if level == tracing::Level::WARN {
            tracing::warn!(action = action.as_str(), job, reason = reason.as_str(), detail = %detail, dry_run, "intervention");
        } else {
            tracing::info!(action = action.as_str(), job, reason = reason.as_str(), detail = %detail, "event");
        }
        let event = Event {
            timestamp_ms: now_ms,
            action,
            job: job.to_owned(),
            slurm_job_id,
            reason,
            detail,
            dry_run,
        };
        if let Some(o) = &self.events.outbox {
            o.offer(&event);
        }
        self.events.audit.record(event);
    }
}
