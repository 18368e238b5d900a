//! Host RAM and memory-cgroup advice for each job: fewer workers, pin_memory off, stream the
//! dataset, keep the batch. Each item cites the level that raised it, and reads what runs.

use super::{Advice, Input, Severity, at_warn, gib, gpu_ratio, knobs, mib};
use crate::policy::Resource;
use crate::rewrite::profile::Knob;

/// GPUs below this much memory in use "have room" for the batch to stay as it is.
pub const GPU_ROOM: f64 = 0.70;

pub(super) fn host_ram(input: &Input, out: &mut Vec<Advice>) {
    let Some(m) = &input.sample.host.memory else {
        return;
    };
    let host = at_warn(
        input,
        &Resource::HostMemory,
        "host RAM",
        &format!(
            "{} available of {}",
            gib(m.available_bytes),
            gib(m.total_bytes)
        ),
    );
    let gpus_with_room = !input.sample.gpus.is_empty()
        && input
            .sample
            .gpus
            .iter()
            .all(|g| gpu_ratio(g).is_some_and(|r| r < GPU_ROOM));
    for job in input.jobs {
        let Some(s) = &job.sample else { continue };
        let cgroup = job.cgroup.and_then(|c| {
            at_warn(
                input,
                &Resource::JobCgroup(job.name.to_owned()),
                &format!("the job's memory cgroup {}", c.path),
                &format!(
                    "{} of {}, clean page cache aside",
                    gib(c.unreclaimable_bytes()),
                    c.limit_bytes.map(gib).unwrap_or_else(|| "no limit".into())
                ),
            )
        });
        // What raised it: the cgroup, host RAM, or both.
        let triggers: Vec<String> = cgroup
            .iter()
            .chain(host.iter())
            .map(|(_, line)| line.clone())
            .collect();
        if triggers.is_empty() {
            continue;
        }
        let where_ = if cgroup.is_some() && host.is_none() {
            "its memory cgroup"
        } else {
            "host RAM"
        };
        let k = knobs(input, job.name).cloned().unwrap_or_default();
        let root = s.processes.first().map(|p| p.pid);
        let workers: Vec<_> = s.processes.iter().filter(|p| Some(p.pid) != root).collect();
        // What runs: the trainer's report, else the worker processes there are now.
        let n_workers = if k.reported.contains(&Knob::Workers) {
            k.workers.unwrap_or(0)
        } else {
            workers.len() as u64
        };
        if n_workers > 0 {
            let worker_pss: u64 = workers.iter().map(|w| w.pss_bytes).sum();
            let mut evidence = triggers.clone();
            evidence.push(if k.reported.contains(&Knob::Workers) {
                format!("the trainer reports {n_workers} DataLoader worker(s) running")
            } else {
                format!(
                    "{} child process(es) of the trainer run now{}",
                    workers.len(),
                    k.workers
                        .map(|w| format!(" (the config file says {w} workers)"))
                        .unwrap_or_default()
                )
            });
            evidence.push(format!(
                "the worker processes hold {} PSS in all{}",
                gib(worker_pss),
                pss_age(s)
            ));
            evidence.extend(workers.iter().map(|w| {
                format!(
                    "worker pid {} ({}): {} PSS, {} RSS",
                    w.pid,
                    w.name,
                    mib(w.pss_bytes),
                    mib(w.rss_bytes)
                )
            }));
            out.push(Advice {
                id: format!("workers:{}", job.name),
                severity: Severity::Warn,
                job: Some(job.name.to_owned()),
                title: format!("{} is short of {where_}: use fewer DataLoader workers", job.name),
                evidence,
                change: format!("num_workers {n_workers} → 0 (in steps if data loading becomes the bottleneck)"),
                saving: Some(format!("about {} (each worker's PSS: its copy-on-write copy of the parent and its prefetched batches)", gib(worker_pss))),
            });
        }
        if k.pin_memory != Some(false) {
            let mut evidence = triggers.clone();
            evidence.push(match k.pin_memory {
                Some(on) => format!(
                    "pin_memory {} ({})",
                    if on { "on" } else { "off" },
                    k.source(Knob::PinMemory)
                ),
                None => {
                    "pin_memory: not in the config file, and the trainer has not reported it".into()
                }
            });
            out.push(Advice {
                id: format!("pin-memory:{}", job.name),
                severity: Severity::Warn,
                job: Some(job.name.to_owned()),
                title: "Turn pin_memory off".into(),
                evidence,
                change: if k.pin_memory == Some(true) {
                    "pin_memory=True → False".into()
                } else {
                    "pin_memory → False, if the DataLoader has it on".into()
                },
                saving: Some("pinned pages cannot be swapped or reclaimed, and the caching host allocator rounds them up to powers of two; typically 1–2 GiB; host-to-GPU copies get 5–10 % slower".into()),
            });
        }
        let mut evidence = triggers.clone();
        evidence.push(format!(
            "the job's processes hold {} PSS{}",
            gib(s.pss_bytes),
            pss_age(s)
        ));
        if let Some(charged) = job.cgroup.and_then(|c| c.charged_bytes()) {
            evidence.push(format!(
                "{} charged to its cgroup (anonymous and file pages)",
                gib(charged)
            ));
        }
        out.push(Advice {
            id: format!("stream-dataset:{}", job.name),
            severity: Severity::Info,
            job: Some(job.name.to_owned()),
            title: "Stream the dataset instead of holding it in RAM".into(),
            evidence,
            change: "datasets: keep_in_memory=False / streaming=True; read parquet or arrow in batches instead of loading it whole".into(),
            saving: Some("the dataset's in-memory copy (often the largest single item, e.g. 8–10 GB of PyArrow cache)".into()),
        });
        if gpus_with_room {
            let batch = match (k.micro_batch, k.accumulation) {
                (Some(b), Some(a)) => format!("keep micro-batch {b} and gradient accumulation {a}"),
                _ => "keep the micro-batch and the effective batch as they are".into(),
            };
            let mut evidence = triggers;
            evidence.extend(input.sample.gpus.iter().filter_map(|g| {
                gpu_ratio(g).map(|r| format!("GPU {} memory {:.0} % used", g.index, r * 100.0))
            }));
            out.push(Advice {
                id: format!("keep-batch:{}", job.name),
                severity: Severity::Info,
                job: Some(job.name.to_owned()),
                title:
                    "Keep the batch: the GPUs have room, and host RAM is not where activations live"
                        .into(),
                evidence,
                change: format!("{batch}; more gradient accumulation would not save host RAM"),
                saving: Some("GPU utilisation stays where it is".into()),
            });
        }
    }
}

/// ", read 4 s before this sample" when the job's oldest PSS reading is older than its sample.
fn pss_age(s: &crate::job::JobSample) -> String {
    match s.pss_read_ms {
        Some(at) if s.timestamp_ms.saturating_sub(at) >= 1000 => format!(
            " (read {} s before this sample)",
            s.timestamp_ms.saturating_sub(at) / 1000
        ),
        Some(_) => String::new(),
        None => " (smaps_rollup could not be read)".into(),
    }
}
