//! `memwatch_job_*`, `memwatch_level` and `memwatch_interventions_*` series, from the engine's view.

use crate::engine::View;
use memwatch_core::expo::{Kind, Writer};

/// Appends the job and intervention series to `out`.
pub fn render(out: &mut String, v: &View) {
    let mut w = Writer::new(std::mem::take(out));
    series(&mut w, v);
    *out = w.out;
}

fn series(w: &mut Writer, v: &View) {
    type Get = fn(&crate::job::JobView) -> Option<f64>;
    let series: [(&'static str, &'static str, Get); 25] = [
        (
            "memwatch_job_emergency_swap_bytes",
            "Size of the emergency swap memwatch made for the job's way out (0: none).",
            |j| {
                j.way_out
                    .as_ref()
                    .map(|w| w.swap.as_ref().map_or(0.0, |s| s.bytes as f64))
            },
        ),
        (
            "memwatch_job_lent_bytes",
            "Memory memwatch lent the job's cgroup above its own limit (0: none).",
            |j| {
                j.way_out.as_ref().map(|w| {
                    w.loan
                        .as_ref()
                        .map_or(0.0, |l| l.raised.saturating_sub(l.original) as f64)
                })
            },
        ),
        (
            "memwatch_job_config_generation",
            "Newest generation of config changes staged for the job.",
            |j| j.config.as_ref().map(|c| c.generation as f64),
        ),
        (
            "memwatch_job_config_applied_generation",
            "Newest generation the trainer acknowledged.",
            |j| j.config.as_ref().map(|c| c.applied_generation as f64),
        ),
        (
            "memwatch_job_config_unverified_changes",
            "Acknowledged config changes memwatch did not see take effect (verify_seconds passed).",
            |j| {
                j.config.as_ref().map(|c| {
                    c.directives
                        .iter()
                        .filter(|d| {
                            d.verification
                                .as_ref()
                                .is_some_and(|v| v.state == crate::adapt::VerifyState::Unverified)
                        })
                        .count() as f64
                })
            },
        ),
        (
            "memwatch_job_config_pending_changes",
            "Staged config changes the trainer has not acknowledged yet.",
            |j| {
                j.config.as_ref().map(|c| {
                    c.directives
                        .iter()
                        .filter(|d| d.applied_epoch.is_none() && d.declined.is_none())
                        .count() as f64
                })
            },
        ),
        (
            "memwatch_job_epoch",
            "The epoch the trainer last reported.",
            |j| {
                j.config
                    .as_ref()
                    .and_then(|c| c.progress.as_ref())
                    .map(|p| p.epoch as f64)
            },
        ),
        (
            "memwatch_job_paused",
            "1 while the job is paused: memwatch holds it, or Slurm holds it suspended on this node (a Slurm job another node's memwatch suspended counts on every node).",
            |j| Some(if j.state == "paused" { 1.0 } else { 0.0 }),
        ),
        (
            "memwatch_job_reflex_armed",
            "1 while a reflex is armed to stop the job at its cgroup's critical line in the daemon's wake thread (policy.reflex: on a v1 threshold's notification, or by its own reads of a v2 cgroup's memory.current), else 0.",
            |j| Some(if j.reflex.is_some() { 1.0 } else { 0.0 }),
        ),
        (
            "memwatch_job_reflex_critical_bytes",
            "The unreclaimable memory of the job's cgroup (usage less clean page cache) at which its armed reflex stops it; absent when none is armed.",
            |j| j.reflex.as_ref().map(|r| r.critical_bytes as f64),
        ),
        (
            "memwatch_job_processes",
            "Processes in the job's tree.",
            |j| j.sample.as_ref().map(|s| s.processes.len() as f64),
        ),
        (
            "memwatch_job_rss_bytes",
            "Resident memory summed over the job's processes (counts shared pages more than once).",
            |j| j.sample.as_ref().map(|s| s.rss_bytes as f64),
        ),
        (
            "memwatch_job_pss_bytes",
            "Proportional set size summed over the job's processes (shared pages split among their users, libraries' file pages included), read memwatch_job_pss_age_seconds before the sample.",
            |j| j.sample.as_ref().map(|s| s.pss_bytes as f64),
        ),
        (
            "memwatch_job_pss_age_seconds",
            "How long before the job's sample its oldest PSS reading was taken (PSS is read every few seconds, and at once for a process whose RSS moved).",
            |j| {
                j.sample.as_ref().and_then(|s| {
                    s.pss_read_ms
                        .map(|at| s.timestamp_ms.saturating_sub(at) as f64 / 1000.0)
                })
            },
        ),
        (
            "memwatch_job_swap_bytes",
            "Swap used by the job's processes.",
            |j| j.sample.as_ref().map(|s| s.swap_bytes as f64),
        ),
        (
            "memwatch_job_gpu_memory_bytes",
            "GPU memory held by the job's processes.",
            |j| {
                j.sample
                    .as_ref()
                    .and_then(|s| s.gpu_bytes)
                    .map(|b| b as f64)
            },
        ),
        (
            "memwatch_job_cgroup_memory_usage_bytes",
            "Memory charged to the job's memory cgroup.",
            |j| {
                j.sample
                    .as_ref()
                    .and_then(|s| s.cgroup.as_ref())
                    .map(|c| c.usage_bytes as f64)
            },
        ),
        (
            "memwatch_job_cgroup_memory_charged_bytes",
            "Anonymous and file pages charged to the job's memory cgroup (memory.stat): what its limit counts, kernel memory aside.",
            |j| {
                j.sample
                    .as_ref()
                    .and_then(|s| s.cgroup.as_ref())
                    .and_then(|c| c.charged_bytes())
                    .map(|b| b as f64)
            },
        ),
        (
            "memwatch_job_cgroup_memory_working_set_bytes",
            "The job cgroup's usage less inactive file cache (kubelet's working set).",
            |j| {
                j.sample
                    .as_ref()
                    .and_then(|s| s.cgroup.as_ref())
                    .map(|c| c.working_set_bytes() as f64)
            },
        ),
        (
            "memwatch_job_cgroup_memory_unreclaimable_bytes",
            "The job cgroup's usage less clean page cache (active and inactive file pages not dirty or under writeback): what its cgroup level counts.",
            |j| {
                j.sample
                    .as_ref()
                    .and_then(|s| s.cgroup.as_ref())
                    .map(|c| c.unreclaimable_bytes() as f64)
            },
        ),
        (
            "memwatch_job_cgroup_memory_limit_bytes",
            "The job cgroup's tightest memory limit; absent when unlimited.",
            |j| {
                j.sample
                    .as_ref()
                    .and_then(|s| s.cgroup.as_ref())
                    .and_then(|c| c.limit_bytes)
                    .map(|b| b as f64)
            },
        ),
        (
            "memwatch_job_cgroup_oom_kills_total",
            "OOM kills inside the job's memory cgroup.",
            |j| {
                j.sample
                    .as_ref()
                    .and_then(|s| s.cgroup.as_ref())
                    .and_then(|c| c.oom_kills)
                    .map(|n| n as f64)
            },
        ),
        (
            "memwatch_job_memory_growth_bytes_per_second",
            "Growth of the job's memory against its tightest limit.",
            |j| j.tightest.as_ref().map(|l| l.growth_bytes_per_second),
        ),
        (
            "memwatch_job_memory_headroom_bytes",
            "Room left under the job's tightest limit.",
            |j| j.tightest.as_ref().map(|l| l.headroom_bytes as f64),
        ),
        (
            "memwatch_job_time_to_exhaustion_seconds",
            "Time until the tightest limit is reached at the current growth; absent when not growing.",
            |j| {
                j.tightest
                    .as_ref()
                    .and_then(|l| l.time_to_exhaustion_seconds)
            },
        ),
    ];
    for (name, help, get) in series {
        let kind = if name.ends_with("_total") {
            Kind::Counter
        } else {
            Kind::Gauge
        };
        let mut f = w.family(name, kind, help);
        for j in &v.jobs {
            f.opt(&[("job_name", &j.name)], get(j));
        }
    }
    {
        let mut f = w.family(
            "memwatch_job_cuda_oom_total",
            Kind::Counter,
            "CUDA OOMs inside a training step the job's trainer reported, by outcome: recovered (it runs on at a smaller micro-batch) or stopped (at its floor micro-batch).",
        );
        for j in &v.jobs {
            if let Some(o) = &j.cuda_oom {
                f.add(
                    &[("job_name", &j.name), ("outcome", "recovered")],
                    o.recovered as f64,
                );
                f.add(
                    &[("job_name", &j.name), ("outcome", "stopped")],
                    o.stopped as f64,
                );
            }
        }
    }
    {
        let mut f = w.gauge(
            "memwatch_job_info",
            "Attached job identity; the value is always 1.",
        );
        for j in &v.jobs {
            let limit = j
                .tightest
                .as_ref()
                .map(|l| l.limit.to_string())
                .unwrap_or_default();
            let o = j.origin.as_ref();
            let (container, slurm) = match o {
                Some(o) if o.kind == "slurm" => (String::new(), o.id.as_str()),
                Some(o) => (o.id.chars().take(12).collect(), ""),
                None => (String::new(), ""),
            };
            let (pid, uid) = (j.pid.to_string(), j.owner_uid.to_string());
            f.add(
                &[
                    ("job_name", &j.name),
                    ("pid", &pid),
                    ("uid", &uid),
                    ("tightest_limit", &limit),
                    ("origin", o.map_or("", |o| o.kind.as_str())),
                    ("container", &container),
                    ("pod", o.and_then(|o| o.pod.as_deref()).unwrap_or("")),
                    ("slurm_job_id", slurm),
                ],
                1.0,
            );
        }
    }
    {
        let mut f = w.gauge(
            "memwatch_job_way_out",
            "Where the job's way out of a memory pause is (phase, step); 1 while it has one.",
        );
        for j in &v.jobs {
            if let Some(wo) = &j.way_out {
                f.add(
                    &[
                        ("job_name", &j.name),
                        ("phase", wo.phase.as_str()),
                        ("step", wo.step.map_or("", |s| s.as_str())),
                    ],
                    1.0,
                );
            }
        }
    }
    {
        let mut f = w.gauge(
            "memwatch_advice_active",
            "1 for each piece of advice that applies now (see /api/v1/advice).",
        );
        for a in &v.advice {
            f.add(
                &[
                    ("id", &a.id),
                    ("severity", a.severity.as_str()),
                    ("job_name", a.job.as_deref().unwrap_or("")),
                ],
                1.0,
            );
        }
    }
    {
        let mut f = w.gauge(
            "memwatch_level",
            "Policy level per resource: 0 ok, 1 warn, 2 critical.",
        );
        for l in &v.levels {
            f.add(&[("resource", &l.resource.to_string())], l.level.gauge());
        }
    }
    {
        let mut f = w.counter(
            "memwatch_interventions_total",
            "Interventions (pause, resume, checkpoint, terminate) since the daemon started.",
        );
        for c in &v.interventions {
            f.add(
                &[("action", c.action.as_str()), ("reason", c.reason.as_str())],
                c.count as f64,
            );
        }
    }
    let mut f = w.gauge(
        "memwatch_last_intervention_timestamp_seconds",
        "When the last intervention of this kind happened, Unix time.",
    );
    for c in &v.interventions {
        f.add(
            &[("action", c.action.as_str()), ("reason", c.reason.as_str())],
            c.last_timestamp_ms as f64 / 1000.0,
        );
    }
    drop(f);
    w.gauge(
        "memwatch_dry_run",
        "1 when the policy decides but sends no signal.",
    )
    .add(&[], if v.dry_run { 1.0 } else { 0.0 });
}
