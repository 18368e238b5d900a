//! A CUDA OOM that fragmentation explains (the rule is `cuda_oom::OomReport::fragmentation`): the
//! trainer's last report shows PyTorch's caching allocator holding more than the request in cached
//! blocks, none of which fit it. `expandable_segments:True` lets the allocator grow a segment in
//! place rather than leave such gaps.

use super::{Advice, Severity};
use crate::cuda_oom::{LastOom, size};

/// The advice for job `job`'s last CUDA OOM, if its figures show fragmentation.
pub fn fragmentation(job: &str, last: &LastOom) -> Option<Advice> {
    let r = &last.report;
    let f = r.fragmentation()?;
    let share = f.cached() as f64 / f.reserved as f64 * 100.0;
    let mut evidence = vec![
        format!(
            "at its last CUDA OOM (epoch {}, step {}, {} pass) PyTorch had {} allocated and {} reserved: {} reserved but unallocated, {share:.0} % of what it reserved",
            r.epoch,
            r.step,
            r.phase,
            size(f.allocated),
            size(f.reserved),
            size(f.cached())
        ),
        format!(
            "it tried to allocate {}, less than the {} it held cached: no cached block was large enough",
            size(f.requested),
            size(f.cached())
        ),
        "fragmentation, by memwatch's rule: reserved − allocated ≥ the request, and reserved ≥ 1.25 × allocated".into(),
    ];
    if let (Some(free), Some(total)) = (r.gpu_free_bytes, r.gpu_total_bytes) {
        evidence.push(format!(
            "the GPU had {} free of {}",
            size(free),
            size(total)
        ));
    }
    evidence.push(match (r.recovered, r.micro_batch_after) {
        (true, Some(after)) => format!(
            "the trainer recovered at micro-batch {after} (from {})",
            r.micro_batch_before
        ),
        _ => format!(
            "the trainer stopped at its floor micro-batch {}",
            r.micro_batch_before
        ),
    });
    Some(Advice {
        id: format!("cuda-fragmentation:{job}"),
        severity: Severity::Warn,
        job: Some(job.to_owned()),
        title: format!(
            "Job {job}'s CUDA OOM was fragmentation: {} cached, but no block fit {}",
            size(f.cached()),
            size(f.requested)
        ),
        evidence,
        change: "Start the trainer with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in its environment (set before torch first uses CUDA)".into(),
        saving: Some(format!(
            "up to {} of cached GPU memory becomes usable for one allocation; micro-batch {} may fit again",
            size(f.cached()),
            r.micro_batch_before
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda_oom::OomReport;

    const G: u64 = 1 << 30;

    fn last(allocated: u64, reserved: u64) -> LastOom {
        LastOom {
            report: OomReport {
                epoch: 2,
                step: 37,
                phase: "backward".into(),
                micro_batch_before: 32,
                recovered: true,
                micro_batch_after: Some(16),
                accumulation_after: Some(4),
                min_micro_batch: None,
                checkpointed: false,
                requested_bytes: Some(2 * G),
                allocated_bytes: Some(allocated),
                reserved_bytes: Some(reserved),
                gpu_free_bytes: Some(G),
                gpu_total_bytes: Some(80 * G),
                device: Some(0),
                rank: None,
                world_size: None,
                snapshot: None,
                message: None,
            },
            at_ms: 1,
        }
    }

    #[test]
    fn a_fragmented_cache_advises_expandable_segments_with_the_figures() {
        let a = fragmentation("train", &last(56 * G, 76 * G)).unwrap();
        assert_eq!(a.id, "cuda-fragmentation:train");
        assert_eq!(a.severity, Severity::Warn);
        assert!(
            a.change
                .contains("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
            "{}",
            a.change
        );
        let ev = a.evidence.join("\n");
        for figure in [
            "56.00 GiB allocated",
            "76.00 GiB reserved",
            "20.00 GiB reserved but unallocated, 26 %",
            "tried to allocate 2.00 GiB",
            "1.00 GiB free of 80.00 GiB",
            "recovered at micro-batch 16 (from 32)",
        ] {
            assert!(ev.contains(figure), "{figure:?} missing from:\n{ev}");
        }
        assert!(a.saving.unwrap().contains("micro-batch 32 may fit again"));
        // A full GPU, not a fragmented one: no such advice.
        assert!(fragmentation("train", &last(74 * G, 76 * G)).is_none());
    }
}
