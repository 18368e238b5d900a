//! The trainer's requests (docs/protocol.md): directives at an epoch boundary, acknowledgements
//! (of changes, and of a checkpoint memwatch asked for), and progress. Each needs the job's token or
//! the caller's rights over the job (`find_authorised`), and a job attached with its config file.

use super::Engine;
use crate::audit::{Action, Reason};
use crate::control::{Caller, Response};

impl Engine {
    /// Runs `f` on the config of the job `target` names, once the caller is authorised for it.
    pub(super) fn with_config(
        &mut self,
        target: &str,
        token: Option<String>,
        caller: Caller,
        f: impl FnOnce(&str, &mut crate::adapt::JobConfig) -> Response,
    ) -> Response {
        let name = match self.find_authorised(target, token.as_deref(), caller) {
            Ok(n) => n,
            Err(e) => return Response::refused(e),
        };
        match self.jobs.get_mut(&name).and_then(|j| j.config.as_mut()) {
            Some(c) => f(&name, c),
            None => Response::error(format!("job {name:?} was attached without --config-file")),
        }
    }

    pub(super) fn directives(
        &mut self,
        target: &str,
        since: u64,
        token: Option<String>,
        caller: Caller,
        now_ms: u64,
    ) -> Response {
        self.with_config(target, token, caller, |_, c| {
            c.polled_at_ms = Some(now_ms);
            let mut r = Response::ok();
            r.directives = Some(crate::control::DirectivesReply {
                generation: c.generation,
                directives: c
                    .directives
                    .iter()
                    .filter(|d| d.generation > since)
                    .cloned()
                    .collect(),
                knobs: c
                    .knobs
                    .iter()
                    .map(|(k, v)| (k.name().to_owned(), v.clone()))
                    .collect(),
                checkpoint: c.checkpoint.clone().filter(|k| k.saved_at_ms.is_none()),
            });
            r
        })
    }

    /// The trainer saved the checkpoint memwatch asked for.
    pub(super) fn checkpoint_saved(
        &mut self,
        target: &str,
        token: Option<String>,
        caller: Caller,
        now_ms: u64,
    ) -> Response {
        let mut job = String::new();
        let r = self.with_config(target, token, caller, |name, c| match &mut c.checkpoint {
            Some(k) if k.saved_at_ms.is_none() => {
                k.saved_at_ms = Some(now_ms);
                job = name.to_owned();
                Response::ok()
            }
            _ => Response::error("memwatch asked for no checkpoint"),
        });
        if r.ok {
            self.save();
            self.record(
                now_ms,
                Action::Checkpoint,
                &job,
                Reason::Trainer,
                "the trainer saved its checkpoint".into(),
                false,
            );
        }
        r
    }

    /// The trainer's answer for the changes up to `generation`: applied at an epoch (and, where
    /// memwatch can see it, to be verified), or declined with a reason (bounded) so that they stop
    /// holding back later changes. Recorded either way.
    pub(super) fn answer(
        &mut self,
        target: &str,
        generation: u64,
        answer: Answer,
        token: Option<String>,
        caller: Caller,
        now_ms: u64,
    ) -> Response {
        let answer = match answer {
            Answer::Declined(why) => {
                let why: String = why.chars().take(500).collect();
                if why.trim().is_empty() {
                    return Response::error("cannot_apply needs a reason");
                }
                Answer::Declined(why)
            }
            applied => applied,
        };
        let processes = self
            .jobs
            .values()
            .find(|j| j.name == target)
            .and_then(|j| j.last.as_ref())
            .map(|s| s.processes.len());
        let mut settled = Vec::new();
        let mut job = String::new();
        let r = self.with_config(target, token, caller, |name, c| {
            if generation > c.generation {
                return Response::error(format!(
                    "generation {generation} was never staged (newest is {})",
                    c.generation
                ));
            }
            let open = c.directives.iter_mut().filter(|d| {
                d.generation <= generation
                    && d.applied_epoch.is_none()
                    && (matches!(answer, Answer::Applied { .. }) || d.declined.is_none())
            });
            for d in open {
                match &answer {
                    Answer::Applied { epoch } => {
                        d.applied_epoch = Some(*epoch);
                        d.applied_at_ms = Some(now_ms);
                        d.verification =
                            processes.and_then(|n| crate::adapt::expectation(d, n, now_ms));
                    }
                    Answer::Declined(why) => d.declined = Some(why.clone()),
                }
                settled.push(d.generation);
            }
            job = name.to_owned();
            Response::ok()
        });
        if r.ok {
            self.save();
        }
        if !settled.is_empty() {
            let (action, detail) = match &answer {
                Answer::Applied { epoch } => (
                    Action::Applied,
                    format!("generation(s) {settled:?} applied at epoch {epoch}"),
                ),
                Answer::Declined(why) => (
                    Action::Declined,
                    format!("generation(s) {settled:?} cannot be applied: {why}"),
                ),
            };
            self.record(now_ms, action, &job, Reason::Trainer, detail, false);
        }
        r
    }

    pub(super) fn progress(
        &mut self,
        target: &str,
        mut p: crate::adapt::Progress,
        token: Option<String>,
        caller: Caller,
        now_ms: u64,
    ) -> Response {
        p.timestamp_ms = now_ms;
        let mut verified = Vec::new();
        let mut job = String::new();
        let r = self.with_config(target, token, caller, |name, c| {
            if let Some(running) = &p.running {
                verified = crate::adapt::running_report(&mut c.directives, running, now_ms);
            }
            job = name.to_owned();
            c.progress = Some(p);
            Response::ok()
        });
        self.dirty |= r.ok;
        if !verified.is_empty() {
            self.save();
            self.record(
                now_ms,
                Action::Verified,
                &job,
                Reason::Trainer,
                format!("generation(s) {verified:?} verified: the trainer reports running with the change"),
                false,
            );
        }
        r
    }
}

/// What a trainer answered for a directive.
pub(super) enum Answer {
    Applied { epoch: u64 },
    Declined(String),
}
