//! The kernel notifications the daemon asks for (v1 memory thresholds, PSI triggers on the host and on
//! v2 job cgroups), the wake thread's own reads of a v2 job's usage that stand in for v1's thresholds,
//! and the reflexes the wake thread holds (fired at a v1 threshold or a v2 read over the line), kept
//! in step with the attached jobs.

use std::sync::Arc;

use crate::sample::cgroup::Version;

use crate::config::Host;
use crate::engine::Engine;
use crate::job::Watch;

/// PSI triggers: 100 ms of "some" stall within 2 s. A window that is a multiple of 2 s is what the
/// kernel accepts from a process without CAP_SYS_RESOURCE (a container, a hardened unit), so one
/// setting works everywhere.
const PSI_STALL_US: u64 = 100_000;
const PSI_WINDOW_US: u64 = 2_000_000;

/// The kernel notifications the daemon has asked for, kept in step with the attached jobs.
pub(super) struct Watches {
    wakers: Option<crate::wake::Wakers>,
    /// The reflexes the wake thread holds and those it fired.
    armory: Arc<crate::reflex::Armory>,
    /// Where `/proc` lies.
    process_root: std::path::PathBuf,
    /// Per job: the thresholds registered (v1's, or read on v2) or empty (no limit, or not known
    /// yet), and whether the cgroup has no limit.
    jobs: std::collections::HashMap<String, (Vec<u64>, bool)>,
    /// A v1 job's limit is not known yet: sync again after the next probe, which reads it.
    pub(super) limit_unknown: bool,
    /// The v1 registrations under way, by job: the generation last asked (an older one that
    /// finishes is stale). The engine probes the job until it is done, but each threshold wakes the
    /// wake thread from its own write on, so the job's reflex is armed from the start.
    registering: std::collections::HashMap<String, u64>,
    generation: u64,
    /// Woken when the registrar finished one.
    registered: Arc<tokio::sync::Notify>,
    /// Jobs whose watch found the wake thread's queue full: probed, and asked again at each sync
    /// (each full sample, at the latest) until the watch is taken.
    behind: std::collections::HashSet<String>,
}

impl Watches {
    pub(super) fn start(
        host: &Host,
        engine: &mut Engine,
        woken: Arc<tokio::sync::Notify>,
        counts: Arc<crate::wake::Notified>,
        armory: Arc<crate::reflex::Armory>,
        priority: u8,
    ) -> Watches {
        let registered = Arc::new(tokio::sync::Notify::new());
        let wakers = match crate::wake::Wakers::start(
            woken,
            counts,
            armory.clone(),
            registered.clone(),
            priority,
        ) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(error = %e, "no kernel notifications; polling only");
                None
            }
        };
        if let Some(w) = &wakers {
            let psi = host.root.join("proc/pressure/memory");
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
            armory,
            process_root: host.process_root.clone(),
            jobs: Default::default(),
            limit_unknown: false,
            registering: Default::default(),
            generation: 0,
            registered,
            behind: Default::default(),
        }
    }

    /// Woken each time a v1 job's thresholds are registered: sync then.
    pub(super) fn registered(&self) -> Arc<tokio::sync::Notify> {
        self.registered.clone()
    }

    /// Registers what is new or changed, drops what is gone.
    pub(super) fn sync(&mut self, engine: &mut Engine) {
        let Some(w) = &self.wakers else {
            return;
        };
        if w.ended() {
            self.lost(engine);
            return;
        }
        for r in w.take_registered() {
            if self.registering.get(&r.job) != Some(&r.generation) {
                continue; // asked again since, or gone
            }
            self.registering.remove(&r.job);
            match r.result {
                Ok(()) => engine.set_watch(&r.job, Watch::Watched),
                Err(e) => {
                    tracing::info!(job = %r.job, error = %e, "no kernel notifications for this job; probing it");
                    engine.set_watch(&r.job, Watch::Probed);
                }
            }
        }
        let plan = engine.wake_plan();
        self.limit_unknown = plan.iter().any(|p| p.thresholds.is_empty() && !p.limitless);
        for p in &plan {
            let key = (p.thresholds.clone(), p.limitless);
            if self.jobs.get(&p.job) != Some(&key) {
                self.registering.remove(&p.job);
                let result = match p.dir.version {
                    _ if p.limitless => Ok(Watch::Watched),
                    Version::V1
                        if !p.thresholds.is_empty() && crate::wake::on_kernel_fs(&p.dir.dir) =>
                    {
                        // Watched once the registrar is done; probed until then.
                        self.generation += 1;
                        w.watch_v1_thresholds(
                            &p.job,
                            &p.dir.dir,
                            &p.thresholds,
                            p.line,
                            self.generation,
                        )
                        .map(|()| {
                            self.registering.insert(p.job.clone(), self.generation);
                            Watch::Registering
                        })
                    }
                    Version::V2 if crate::wake::on_kernel_fs(&p.dir.dir) => {
                        if let Err(e) = w.watch_psi(
                            Some(p.job.clone()),
                            &p.dir.dir.join("memory.pressure"),
                            PSI_STALL_US,
                            PSI_WINDOW_US,
                        ) {
                            tracing::info!(job = %p.job, error = %e, "no PSI trigger on this job's cgroup");
                        }
                        match p.line {
                            Some((critical, limit)) if !p.thresholds.is_empty() => w
                                .read_usage(&p.job, &p.dir.dir, &p.thresholds, critical, limit)
                                .map(|()| Watch::Watched),
                            _ => Ok(Watch::Probed),
                        }
                    }
                    _ => Ok(Watch::Probed),
                };
                let watch = match result {
                    Ok(watch) => {
                        self.behind.remove(&p.job);
                        self.jobs.insert(p.job.clone(), key);
                        watch
                    }
                    // The registrar is behind (a v1 registration under grace periods): not
                    // recorded as asked, so the next sync asks again.
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if self.behind.insert(p.job.clone()) {
                            tracing::warn!(job = %p.job, error = %e, "the wake thread is behind; probing this job until it takes the watch");
                        }
                        Watch::Probed
                    }
                    Err(e) => {
                        tracing::info!(job = %p.job, cgroup = %p.dir.dir.display(), error = %e, "no kernel notifications for this job; probing it");
                        self.jobs.insert(p.job.clone(), key);
                        Watch::Probed
                    }
                };
                engine.set_watch(&p.job, watch);
            }
            // A reflex rides on the job's thresholds (v1: each live from its own write, and the
            // wake thread reads the usage until the last is in, so from the registration's start;
            // the wake thread dropped the old ones as it took the new eventfd) or the wake
            // thread's reads (v2). The job is probed until its thresholds are all in, and a
            // registration that fails disarms it.
            let woken = !p.limitless
                && !p.thresholds.is_empty()
                && engine.watch(&p.job).wakes_at_the_line();
            let reflex = p.reflex.as_ref().filter(|_| woken);
            if arm(
                &self.armory,
                engine,
                &p.job,
                &p.dir,
                reflex,
                &self.process_root,
            ) {
                w.rearm();
            }
        }
        self.jobs.retain(|job, _| {
            let keep = plan.iter().any(|p| &p.job == job);
            if !keep {
                w.unwatch(job);
            }
            keep
        });
        self.registering
            .retain(|job, _| plan.iter().any(|p| &p.job == job));
        self.behind.retain(|job| plan.iter().any(|p| &p.job == job));
        for job in self.armory.armed_jobs() {
            if !plan.iter().any(|p| p.job == job) && self.armory.disarm(&job) {
                engine.disarm_reflex(&job);
            }
        }
    }

    /// The wake thread ended: nothing it watched wakes the daemon and no reflex it held fires, so
    /// every job is probed, each reflex is disarmed (one that fired is still taken over), and the
    /// host's pressure is polled. Polling only from then on, as when the thread never started.
    fn lost(&mut self, engine: &mut Engine) {
        tracing::warn!(
            "the wake thread ended: kernel notifications and reflexes stop; every job is probed"
        );
        self.wakers = None;
        engine.set_host_watched(false);
        for p in engine.wake_plan() {
            engine.set_watch(&p.job, Watch::Probed);
        }
        self.disarm_all(engine);
        self.jobs.clear();
        self.registering.clear();
        self.behind.clear();
        self.limit_unknown = false;
    }

    /// The reflexes that fired since the last call, for the engine to take over.
    pub(super) fn take_fired(&self) -> Vec<crate::reflex::Fired> {
        self.armory.take_fired()
    }

    /// Disarms every reflex (the daemon is stopping); what fired meanwhile is still to be taken.
    pub(super) fn disarm_all(&self, engine: &mut Engine) {
        for job in self.armory.armed_jobs() {
            if self.armory.disarm(&job) {
                engine.disarm_reflex(&job);
            }
        }
    }
}

/// Brings the job's reflex in the wake thread in step with `want`: armed (recorded first), changed,
/// or disarmed. A reflex that fired meanwhile is left for the engine, which takes it over. `true`
/// when one was armed.
fn arm(
    armory: &crate::reflex::Armory,
    engine: &mut Engine,
    job: &str,
    memory: &crate::sample::cgroup::CgroupDir,
    want: Option<&crate::engine::ReflexPlan>,
    process_root: &std::path::Path,
) -> bool {
    let armed = engine.armed_reflex(job).cloned();
    match want {
        Some(plan) if plan.is(armed.as_ref()) => false,
        Some(plan) => {
            if armed.is_some() && !armory.disarm(job) {
                return false; // it fired: the engine takes it over first
            }
            let reflex = match crate::reflex::Reflex::prepare(job, memory, plan, process_root) {
                Ok(r) => r,
                Err(e) => {
                    tracing::info!(job, error = %e, "no reflex for this job; its probe decides");
                    engine.disarm_reflex(job);
                    return false;
                }
            };
            if let Err(e) = engine.arm_reflex(job, plan) {
                tracing::warn!(job, error = %e, "the reflex is not armed: it could not be recorded");
                return false;
            }
            armory.arm(reflex);
            tracing::debug!(job, critical_bytes = plan.critical_bytes, how = ?plan.how, "reflex armed");
            true
        }
        None => {
            if armed.is_some() && armory.disarm(job) {
                engine.disarm_reflex(job);
            }
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::Watches;
    use crate::job::Watch;

    /// A child of this test attached to an engine on this machine (in dry run: nothing is
    /// signalled), its kernel watches kept by `Watches` over a registrar whose wake thread is the
    /// test's; then that thread ends, as a failed poll or a panic ends it.
    #[test]
    fn a_wake_thread_that_ends_leaves_every_job_probed_and_the_host_polled() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "[host]\nroot = \"/\"\nprocess_root = \"/\"\n[control]\nstate_dir = {:?}\nruntime_dir = {:?}\n[policy]\ndry_run = true\n",
            dir.path().join("state"),
            dir.path().join("run"),
        );
        let config = crate::config::parse(&text).unwrap();
        let mut engine = crate::engine::open(crate::engine::Settings::from(&config), None);
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let attach = crate::control::Request::Attach {
            pid: child.id(),
            itself: false,
            name: Some("job".into()),
            config_file: None,
            profile: None,
            keys: Vec::new(),
            launch: None,
        };
        let caller = crate::control::Caller {
            uid: nix::unistd::getuid().as_raw(),
            pid: None,
        };
        let r = engine.handle_command(attach, caller, Default::default(), 1_000);
        assert!(r.ok, "{:?}", r.error);
        // A probe of its cgroup that found no limit: watched as it is, nothing registered on the
        // cgroup this test runs in.
        let limitless = crate::sample::cgroup::CgroupMemory {
            version: crate::sample::cgroup::Version::V1,
            path: "/".into(),
            usage_bytes: 1 << 20,
            limit_bytes: None,
            limit_source: None,
            oom_kills: None,
            inactive_file_bytes: None,
            active_file_bytes: None,
            dirty_bytes: None,
            anon_bytes: None,
            file_bytes: None,
        };
        engine.handle_probe(None, vec![("job".into(), limitless)], 1_100);

        let registered = Arc::new(tokio::sync::Notify::new());
        let (wakers, thread, _registrar) =
            crate::wake::Wakers::with_test_thread(1024, registered.clone());
        let mut watches = Watches {
            wakers: Some(wakers),
            armory: Arc::new(crate::reflex::Armory::new(std::path::Path::new("/"))),
            process_root: "/".into(),
            jobs: Default::default(),
            limit_unknown: false,
            registering: Default::default(),
            generation: 0,
            registered: registered.clone(),
            behind: Default::default(),
        };
        engine.set_host_watched(true);
        watches.sync(&mut engine);
        assert_eq!(engine.watch("job"), Watch::Watched);
        assert!(engine.host_watched());

        drop(thread);
        // The owner task is told (the `Registered` turn), without an order of its own.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(10), registered.notified()).await
        })
        .expect("the wake thread's end was never told");
        watches.sync(&mut engine);
        assert_eq!(engine.watch("job"), Watch::Probed);
        assert!(!engine.host_watched(), "the host's pressure is polled");
        assert!(watches.wakers.is_none());
        // Nothing is asked of the thread again: the job stays probed at later syncs.
        watches.sync(&mut engine);
        assert_eq!(engine.watch("job"), Watch::Probed);
        let _ = child.kill();
        let _ = child.wait();
    }
}
