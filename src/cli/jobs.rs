//! `memwatch jobs`: attached jobs, whether they run, and how close each is to its tightest limit.

use std::fmt::Write as _;

use super::status::human;
use crate::job::JobView;

fn opt(v: Option<u64>) -> String {
    v.map(human).unwrap_or_else(|| "-".into())
}

/// What the memory columns are, where it matters: a PSS read a while ago says so, and where the job
/// has a cgroup, what is charged to it (what its limit counts, unlike PSS, which also splits
/// shared libraries' file pages among their users).
fn memory_line(s: &crate::job::JobSample) -> Option<String> {
    let mut parts = Vec::new();
    match s.pss_read_ms {
        Some(at) if s.timestamp_ms.saturating_sub(at) >= 2000 => parts.push(format!(
            "PSS read {} s before RSS",
            s.timestamp_ms.saturating_sub(at) / 1000
        )),
        Some(_) => {}
        None => parts.push("PSS unreadable (smaps_rollup)".into()),
    }
    if let Some(c) = &s.cgroup {
        if let (Some(anon), Some(file)) = (c.anon_bytes, c.file_bytes) {
            parts.push(format!(
                "charged to its cgroup: {} (anon {} + file {})",
                human(anon + file),
                human(anon),
                human(file)
            ));
        }
    }
    (!parts.is_empty()).then(|| format!("memory: {}", parts.join("; ")))
}

pub fn render(jobs: &[JobView], now_ms: u64) -> String {
    if jobs.is_empty() {
        return "no jobs attached (memwatch attach <pid>)\n".into();
    }
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<20}{:>8}  {:<18}{:>6}{:>9}{:>9}{:>8}{:>9}{:>18}  TIGHTEST LIMIT",
        "JOB", "PID", "STATE", "PROCS", "PSS", "RSS", "SWAP", "GPU", "CGROUP MEM/LIMIT",
    );
    for j in jobs {
        let state = match &j.pause {
            Some(p) => {
                let dry = if p.dry_run { " (dry)" } else { "" };
                format!(
                    "paused {}{dry}",
                    crate::human::duration(now_ms.saturating_sub(p.since_ms) as f64 / 1000.0)
                )
            }
            None => match j.slurm_suspended_since_ms {
                // Another node's memwatch (or a person) suspended the Slurm job.
                Some(since) => format!(
                    "suspended {}",
                    crate::human::duration(now_ms.saturating_sub(since) as f64 / 1000.0)
                ),
                None => "running".into(),
            },
        };
        let s = j.sample.as_ref();
        let cg = s.and_then(|s| s.cgroup.as_ref()).map(|c| {
            format!(
                "{}/{}",
                human(c.unreclaimable_bytes()),
                c.limit_bytes.map(human).unwrap_or_else(|| "none".into())
            )
        });
        let tight = j
            .tightest
            .as_ref()
            .map(|l| match l.time_to_exhaustion_seconds {
                Some(_) if j.pause.is_some() => {
                    format!("{}: {} left", l.limit, human(l.headroom_bytes))
                }
                Some(t) => format!(
                    "{}: {} left, full in {}",
                    l.limit,
                    human(l.headroom_bytes),
                    crate::human::duration(t)
                ),
                None => format!("{}: {} left, not growing", l.limit, human(l.headroom_bytes)),
            });
        let _ = writeln!(
            o,
            "{:<20}{:>8}  {:<18}{:>6}{:>9}{:>9}{:>8}{:>9}{:>18}  {}",
            j.name,
            j.pid,
            state,
            s.map(|s| s.process_count.to_string())
                .unwrap_or_else(|| "-".into()),
            opt(s.map(|s| s.pss_bytes)),
            opt(s.map(|s| s.rss_bytes)),
            opt(s.map(|s| s.swap_bytes)),
            opt(s.and_then(|s| s.gpu_bytes)),
            cg.unwrap_or_else(|| "-".into()),
            tight.unwrap_or_else(|| "-".into()),
        );
        if !j.details {
            let _ = writeln!(
                o,
                "    uid {}'s job: its processes and config are shown to its owner and root",
                j.owner_uid
            );
        }
        if let Some(line) = s.and_then(memory_line) {
            let _ = writeln!(o, "    {line}");
        }
        if let Some(p) = &j.pause {
            let _ = writeln!(
                o,
                "    paused by {}: {}",
                super::status::paused_by(p.by),
                p.reason
            );
        }
        if let Some(w) = &j.way_out {
            way_out(&mut o, w, now_ms);
        }
        if let Some(l) = &j.launch {
            let _ = writeln!(
                o,
                "    launched: run {} of at most {}",
                l.run,
                l.max_restarts + 1
            );
            for earlier in &l.previous {
                let _ = writeln!(o, "      {earlier}");
            }
        }
        if let Some(oom) = &j.cuda_oom {
            let _ = writeln!(o, "    {}", cuda_oom_line(oom, now_ms));
        }
        if let Some(c) = j.config.as_ref().filter(|_| j.details) {
            let knobs: Vec<String> = c.knobs.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(
                o,
                "    config {} ({}): {}",
                c.file.display(),
                c.profile,
                knobs.join(", ")
            );
            for d in &c.directives {
                let changes: Vec<String> = d
                    .changes
                    .iter()
                    .map(|ch| format!("{} {} → {}", ch.path, ch.old, ch.new))
                    .collect();
                let state = match (d.applied_epoch, &d.declined, d.urgent) {
                    (_, Some(why), _) => format!("declined: {why}"),
                    (Some(e), _, _) => match d.verification.as_ref().map(|v| v.state) {
                        Some(crate::adapt::VerifyState::Verified) => {
                            format!("applied at epoch {e}, verified")
                        }
                        Some(crate::adapt::VerifyState::Unverified)
                            if d.verification
                                .as_ref()
                                .is_some_and(|v| v.max_processes.is_none()) =>
                        {
                            format!(
                                "applied at epoch {e}, UNVERIFIED: the trainer never reported running with it"
                            )
                        }
                        Some(crate::adapt::VerifyState::Unverified) => {
                            format!("applied at epoch {e}, UNVERIFIED: not seen in the job")
                        }
                        Some(crate::adapt::VerifyState::Pending) => {
                            format!("applied at epoch {e}, being verified")
                        }
                        None => format!("applied at epoch {e}"),
                    },
                    (None, None, true) => "pending, urgent: applies at the next step".into(),
                    (None, None, false) => "pending: applies at the next epoch boundary".into(),
                };
                let _ = writeln!(
                    o,
                    "    generation {}: {} [{state}]",
                    d.generation,
                    changes.join(", ")
                );
            }
            if let Some(p) = &c.progress {
                let loss = p.loss.map(|l| format!(", loss {l:.4}")).unwrap_or_default();
                let _ = writeln!(o, "    progress: epoch {}, step {}{loss}", p.epoch, p.step);
            }
            if let Some(e) = &c.last_error {
                let _ = writeln!(o, "    config error: {e}");
            }
        }
    }
    o
}

/// A job's way out of its memory pause: where it is, the room memwatch holds, what was tried.
fn way_out(o: &mut String, w: &crate::job::way_out::WayOut, now_ms: u64) {
    use crate::job::way_out::Phase;
    let phase = match w.phase {
        Phase::MakingSwap => "making emergency swap",
        Phase::Reclaiming => "pushing its memory out to swap while it is held",
        Phase::Fixing => "running on emergency room until its fix applies",
        Phase::Clearing => "fixed; giving the emergency room back",
        Phase::Checkpointing => "waiting for its checkpoint",
        Phase::Stopping => "being stopped cleanly",
        Phase::NoWayOut => "no way out: stopped at the longest pause",
        Phase::Done => "done",
    };
    let secs = now_ms.saturating_sub(w.phase_since_ms) / 1000;
    let mut room = Vec::new();
    if let Some(s) = &w.swap {
        room.push(format!("emergency swap {} on {}", human(s.bytes), s.device));
    }
    if let Some(l) = &w.loan {
        room.push(format!(
            "limit lent {} → {}",
            human(l.original),
            human(l.raised)
        ));
    }
    if let Some(r) = &w.reclaimed {
        room.push(format!(
            "{} pushed out while held ({} → {} in {} ms)",
            human(r.moved()),
            human(r.usage_before),
            human(r.usage_after),
            r.ms
        ));
    }
    let room = if room.is_empty() {
        String::new()
    } else {
        format!("; {}", room.join(", "))
    };
    let _ = writeln!(o, "    way out: {phase} ({secs}s){room}");
    for t in &w.taken {
        let ago = now_ms.saturating_sub(t.at_ms) / 1000;
        let _ = writeln!(o, "      {}: {} ({ago}s ago)", t.step, t.outcome);
    }
}

/// Jobs that ended recently, newest last: how each ended and how long ago. Empty when none.
pub fn render_ended(ended: &[crate::job::EndedJob], now_ms: u64) -> String {
    let mut o = String::new();
    if ended.is_empty() {
        return o;
    }
    let _ = writeln!(o, "\nended:");
    for e in ended {
        let ago = now_ms.saturating_sub(e.ended_at_ms) / 1000;
        let _ = writeln!(o, "  {} (pid {}), {ago} s ago: {}", e.name, e.pid, e.how);
        if let Some(w) = &e.way_out {
            let _ = writeln!(o, "    way out: {w}");
        }
    }
    o
}

/// The CUDA OOMs a job's trainer reported: how many, and what the last did.
fn cuda_oom_line(oom: &crate::cuda_oom::CudaOoms, now_ms: u64) -> String {
    let mut line = format!(
        "CUDA OOMs: {} recovered, {} stopped",
        oom.recovered, oom.stopped
    );
    if let Some(last) = &oom.last {
        let r = &last.report;
        let ago = crate::human::duration(now_ms.saturating_sub(last.at_ms) as f64 / 1000.0);
        let what = match (r.micro_batch_after, r.accumulation_after) {
            (Some(after), Some(acc)) if r.recovered => format!(
                "micro-batch {} → {after} × accumulation {acc}",
                r.micro_batch_before
            ),
            _ if r.checkpointed => format!(
                "stopped at micro-batch {}, checkpoint saved",
                r.micro_batch_before
            ),
            _ => format!("stopped at micro-batch {}", r.micro_batch_before),
        };
        let _ = write!(
            line,
            "; last {ago} ago at epoch {}, step {} ({} pass): {what}",
            r.epoch, r.step, r.phase
        );
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::JobSample;

    #[test]
    fn the_cuda_oom_line_counts_them_and_says_what_the_last_did() {
        let report: crate::cuda_oom::OomReport = serde_json::from_value(serde_json::json!({
            "epoch": 2, "step": 37, "phase": "backward", "micro_batch_before": 32,
            "recovered": true, "micro_batch_after": 16, "accumulation_after": 4,
            "unknown_field": "ignored"
        }))
        .expect("a report");
        let mut oom = crate::cuda_oom::CudaOoms::default();
        oom.note(report, 10_000);
        assert_eq!(
            cuda_oom_line(&oom, 22_000),
            "CUDA OOMs: 1 recovered, 0 stopped; last 12 s ago at epoch 2, step 37 (backward pass): micro-batch 32 → 16 × accumulation 4"
        );
        oom.last = None;
        assert_eq!(
            cuda_oom_line(&oom, 22_000),
            "CUDA OOMs: 1 recovered, 0 stopped"
        );
    }
    use crate::sample::cgroup::CgroupMemory;

    #[test]
    fn the_memory_line_says_how_old_pss_is_and_what_the_cgroup_is_charged() {
        let mut s = JobSample {
            timestamp_ms: 10_000,
            processes: Vec::new(),
            process_count: 0,
            rss_bytes: 1 << 30,
            pss_bytes: 1 << 29,
            pss_read_ms: Some(9_500),
            swap_bytes: 0,
            cgroup: None,
            gpu_bytes: None,
            gpus: None,
        };
        // Fresh PSS and no cgroup: nothing to add to the columns.
        assert_eq!(memory_line(&s), None);
        s.pss_read_ms = Some(6_000);
        s.cgroup = Some(CgroupMemory {
            version: crate::sample::cgroup::Version::V2,
            path: "/job".into(),
            usage_bytes: 1 << 30,
            limit_bytes: None,
            limit_source: None,
            oom_kills: None,
            inactive_file_bytes: None,
            active_file_bytes: None,
            dirty_bytes: None,
            anon_bytes: Some(900 << 20),
            file_bytes: Some(124 << 20),
        });
        assert_eq!(
            memory_line(&s).as_deref(),
            Some(
                "memory: PSS read 4 s before RSS; charged to its cgroup: 1.0Gi (anon 900Mi + file 124Mi)"
            )
        );
        s.pss_read_ms = None;
        s.cgroup = None;
        assert_eq!(
            memory_line(&s).as_deref(),
            Some("memory: PSS unreadable (smaps_rollup)")
        );
    }
}
