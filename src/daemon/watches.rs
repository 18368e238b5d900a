//! The kernel notifications the daemon asks for (v1 memory thresholds, PSI triggers on the host and on
//! v2 job cgroups), kept in step with the attached jobs.

use std::sync::Arc;

use crate::sample::cgroup::Version;

use crate::config::Config;
use crate::engine::Engine;

/// PSI triggers: 100 ms of "some" stall within 2 s. A window that is a multiple of 2 s is what the
/// kernel accepts from a process without CAP_SYS_RESOURCE (a container, a hardened unit), so one
/// setting works everywhere.
const PSI_STALL_US: u64 = 100_000;
const PSI_WINDOW_US: u64 = 2_000_000;

/// The kernel notifications the daemon has asked for, kept in step with the attached jobs.
pub(super) struct Watches {
    wakers: Option<crate::wake::Wakers>,
    /// Per job: the thresholds registered (v1) or empty (a v2 PSI trigger, or no limit), and whether
    /// the cgroup has no limit.
    jobs: std::collections::HashMap<String, (Vec<u64>, bool)>,
    /// A v1 job's limit is not known yet: sync again after the next probe, which reads it.
    pub(super) limit_unknown: bool,
}

impl Watches {
    pub(super) fn start(
        config: &Config,
        engine: &mut Engine,
        woken: Arc<tokio::sync::Notify>,
        counts: Arc<crate::wake::Notified>,
    ) -> Watches {
        let wakers = match crate::wake::Wakers::start(woken, counts) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(error = %e, "no kernel notifications; polling only");
                None
            }
        };
        if let Some(w) = &wakers {
            let psi = config.host.root.join("proc/pressure/memory");
            if crate::wake::on_kernel_fs(&psi) {
                match w.watch_psi(None, &psi, PSI_STALL_US, PSI_WINDOW_US) {
                    Ok(()) => engine.set_host_watched(true),
                    Err(e) => {
                        tracing::info!(error = %e, "no PSI trigger on the host's memory pressure")
                    }
                }
            }
        }
        Watches {
            wakers,
            jobs: Default::default(),
            limit_unknown: false,
        }
    }

    /// Registers what is new or changed, drops what is gone.
    pub(super) fn sync(&mut self, engine: &mut Engine) {
        let Some(w) = &self.wakers else {
            return;
        };
        let plan = engine.wake_plan();
        self.limit_unknown = plan
            .iter()
            .any(|p| p.dir.version == Version::V1 && p.thresholds.is_empty() && !p.limitless);
        for p in &plan {
            let key = (p.thresholds.clone(), p.limitless);
            if self.jobs.get(&p.job) == Some(&key) {
                continue;
            }
            let result = match p.dir.version {
                _ if p.limitless => Ok(true),
                Version::V1
                    if !p.thresholds.is_empty() && crate::wake::on_kernel_fs(&p.dir.dir) =>
                {
                    w.watch_v1_thresholds(&p.job, &p.dir.dir, &p.thresholds)
                        .map(|()| true)
                }
                Version::V2 if crate::wake::on_kernel_fs(&p.dir.dir) => w
                    .watch_psi(
                        Some(p.job.clone()),
                        &p.dir.dir.join("memory.pressure"),
                        PSI_STALL_US,
                        PSI_WINDOW_US,
                    )
                    .map(|()| false),
                _ => Ok(false),
            };
            let watched = result.unwrap_or_else(|e| {
                tracing::info!(job = %p.job, cgroup = %p.dir.dir.display(), error = %e, "no kernel notifications for this job; probing it");
                false
            });
            engine.set_watched(&p.job, watched);
            self.jobs.insert(p.job.clone(), key);
        }
        self.jobs.retain(|job, _| {
            let keep = plan.iter().any(|p| &p.job == job);
            if !keep {
                w.unwatch(job);
            }
            keep
        });
    }
}
