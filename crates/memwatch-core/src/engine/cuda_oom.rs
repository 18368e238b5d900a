//! A trainer's CUDA OOM report (`{"cmd": "oom"}`, `POST /api/v1/jobs/{job}/oom`): authorised like
//! its progress, checked, counted on the job, recorded as a `cuda_oom` event, and, when the trainer
//! recovered at a smaller micro-batch and the job has a config file with both knobs, staged in that
//! file as applied (`Engine::stage_oom`), so that a relaunch starts from it.

use super::Engine;
use crate::audit::{Action, Reason};
use crate::control::{Caller, Refusal, Response};
use crate::cuda_oom::{OomReport, Staging};
use crate::rewrite::profile::Knob;

impl Engine {
    pub(super) fn cuda_oom(
        &mut self,
        target: &str,
        report: OomReport,
        token: Option<String>,
        caller: Caller,
        now_ms: u64,
    ) -> Response {
        let name = match self.find_authorised(target, token.as_deref(), caller) {
            Ok(n) => n,
            Err(e) => return Response::refused(e),
        };
        let report = match report.checked() {
            Ok(r) => r,
            Err(e) => {
                return Response::refused(Refusal::invalid(format!(
                    "invalid CUDA OOM report: {e}"
                )));
            }
        };
        let Some(job) = self.jobs.get_mut(&name) else {
            return Response::refused(Refusal::not_found(format!(
                "no attached job named {name:?}"
            )));
        };
        let launched = job.launch.is_some();
        // A recovery, or a stop that names the micro-batch to relaunch at: staged either way.
        let stage = match (report.micro_batch_after.is_some(), job.config.as_ref()) {
            (false, _) => None,
            (true, None) => Some(Err("the job was attached without a config file".to_owned())),
            (true, Some(c)) => {
                let both = [Knob::MicroBatch, Knob::Accumulation]
                    .iter()
                    .all(|k| c.profile.path(*k).is_some());
                if both {
                    Some(Ok(()))
                } else {
                    Some(Err(
                        "its config's profile names no micro_batch and accumulation keys"
                            .to_owned(),
                    ))
                }
            }
        };
        let staging = match &stage {
            None => Staging::None,
            Some(Ok(())) => Staging::ConfigFile,
            Some(Err(why)) => Staging::Not(why.clone()),
        };
        let detail = report.describe(&staging, launched);
        let directive = match (&stage, report.micro_batch_after, report.accumulation_after) {
            (Some(Ok(_)), Some(micro), Some(accumulation)) => Some(crate::adapt::OomStage {
                micro_batch: u64::from(micro),
                accumulation: u64::from(accumulation),
                epoch: report.epoch,
                reported_at_ms: now_ms,
                reason: format!(
                    "CUDA OOM in the {} pass at epoch {}, step {}: the trainer {} micro-batch {micro} × accumulation {accumulation}",
                    report.phase,
                    report.epoch,
                    report.step,
                    if report.recovered {
                        "recovered at"
                    } else {
                        "stops, to be relaunched at"
                    }
                ),
            }),
            _ => None,
        };
        job.cuda_oom
            .get_or_insert_with(Default::default)
            .note(report, now_ms);
        self.dirty = true;
        self.record(
            now_ms,
            Action::CudaOom,
            &name,
            Reason::CudaOom,
            detail,
            false,
        );
        if let Some(stage) = directive {
            self.stage_oom(&name, stage, now_ms);
        }
        self.save();
        self.refresh_advice();
        Response::ok()
    }
}
