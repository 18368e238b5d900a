//! The daemon: one task owns the sampler and the engine (jobs, policy, actions). It selects over the
//! full-sample tick, the adaptive probe tick, control requests and the stop signal, and publishes what
//! the HTTP side reads. tick → sample → decide → act → publish.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::act::persist::{self, StateLock};
use crate::clock::Clock;
use crate::config::Config;
use crate::control::server::{self, Envelope};
use crate::engine::{Engine, Measured};
use crate::guardian::Guardian;
use crate::sample::gpu::GpuSource;
use crate::sample::nvml::NvmlSource;
use crate::sample::{Sample, Sampler, cgroup, meminfo};

mod executor;
mod successor;
mod watches;
use executor::Executor;
use watches::Watches;

pub use crate::shared::{Shared, Snapshot, stale_after_ms};

/// Builds the sampler the configuration asks for.
pub fn sampler(config: &Config) -> Sampler {
    let gpu: Option<Box<dyn GpuSource>> = config
        .gpu
        .enabled
        .then(|| Box::new(NvmlSource::new(config.gpu.library.clone())) as Box<dyn GpuSource>);
    if !config.gpu.enabled {
        tracing::info!("GPU sampling disabled by configuration");
    }
    Sampler::new(config.host.root.clone(), gpu)
}

/// Resolves when SIGTERM or SIGINT arrives.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut t), Ok(mut i)) => {
            tokio::select! {
                _ = t.recv() => tracing::info!("SIGTERM received, stopping"),
                _ = i.recv() => tracing::info!("SIGINT received, stopping"),
            }
        }
        _ => {
            tracing::warn!("cannot install signal handlers; stop with SIGKILL");
            std::future::pending::<()>().await;
        }
    }
}

/// The sampler back, its sample, each job's measurement, and when the sample was taken (measuring
/// the jobs after it can take a while: the host's numbers are as old as the sample).
type FullResult = (Sampler, Sample, Vec<Measured>, std::time::Instant);

/// Awaits the in-flight full sample, or never when there is none.
async fn in_flight(
    h: &mut Option<JoinHandle<FullResult>>,
) -> Result<FullResult, tokio::task::JoinError> {
    match h {
        Some(h) => h.await,
        None => std::future::pending().await,
    }
}

/// Takes a full sample and measures every job, on the blocking pool.
fn spawn_full(
    mut sampler: Sampler,
    engine: &mut Engine,
    now_ms: u64,
    process_root: std::path::PathBuf,
) -> JoinHandle<FullResult> {
    let plan = engine.measure_plan(now_ms);
    tokio::task::spawn_blocking(move || {
        let sample = sampler.sample();
        let taken = std::time::Instant::now();
        let now = sample.timestamp_ms;
        let jobs = plan
            .into_iter()
            .map(|p| {
                let m = crate::job::measure::measure(
                    &process_root,
                    p.root,
                    p.cgroup.as_ref(),
                    p.members.as_deref(),
                    &sample.gpus,
                    now,
                    p.previous.as_ref(),
                );
                // Which cgroup a pause would freeze is decided here, once per full sample, so the
                // pause itself walks nothing.
                let freezer = m.as_ref().and_then(|m| {
                    let pids: Vec<u32> = m.processes.iter().map(|p| p.pid).collect();
                    crate::act::freeze::owned(&process_root, &pids, p.owner)
                });
                // A Slurm job (its members are its cgroup's): is Slurm holding it suspended here?
                let slurm_suspended = p
                    .members
                    .as_ref()
                    .and(p.cgroup.as_ref())
                    .map(|c| crate::slurm::suspended_here(&process_root, c));
                Measured {
                    name: p.name,
                    sample: m,
                    freezer,
                    slurm_suspended,
                }
            })
            .collect();
        (sampler, sample, jobs, taken)
    })
}

/// What a probe saw: (MemAvailable, MemTotal), and each job's cgroup.
type Probe = (Option<(u64, u64)>, Vec<(String, cgroup::CgroupMemory)>);

/// The cheap probe: MemAvailable and every job's cgroup. Small reads, done inline.
/// Only the usage file is read (one small read); limit and inactive file cache come from the last full
/// read of the cgroup, which every full sample refreshes.
fn probe(engine: &Engine, host_meminfo: &mut meminfo::MeminfoFile, now: u64) -> Probe {
    let host = engine
        .probe_host(now)
        .then(|| host_meminfo.read().ok())
        .flatten()
        .map(|m| (m.available_bytes, m.total_bytes));
    let cgroups = engine
        .probe_plan()
        .into_iter()
        .filter_map(|(name, dir, last)| {
            // Usage, and the OOM kills: a job the OOM killer ends may take its cgroup with it
            // before the next full sample reads them.
            let fresh = match last {
                Some(last) => cgroup::CgroupMemory {
                    usage_bytes: cgroup::read_usage(&dir).ok()?,
                    oom_kills: cgroup::read_oom_kills(&dir).or(last.oom_kills),
                    ..last
                },
                None => cgroup::read_dir(&dir).ok()?,
            };
            Some((name, fresh))
        })
        .collect();
    (host, cgroups)
}

/// Runs the daemon until SIGTERM or SIGINT. Before returning it continues every job it paused.
pub async fn run(config: Config) -> anyhow::Result<()> {
    // One daemon per state directory; a guardian finishing a recovery holds the lock for a moment.
    let state_dir = config.control.state_dir.clone();
    let lock =
        tokio::task::spawn_blocking(move || StateLock::acquire(&state_dir, Duration::from_secs(5)))
            .await
            .context("the lock task failed")?
            .with_context(|| format!("cannot lock {}", config.control.state_dir.display()))?;
    let Some(_lock) = lock else {
        anyhow::bail!(
            "another memwatch daemon is running with state directory {}",
            config.control.state_dir.display()
        );
    };

    // Recover first, before anything that can fail (a port in use): a predecessor's paused jobs are
    // resumed whatever happens next.
    let previous = match persist::load(&config.control.state_dir) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot read the previous state; nothing to recover");
            None
        }
    };
    let anchor = clock_anchor(&config, previous.as_ref());
    let clock = Clock::system(anchor.anchor_ms);
    // The reflexes the wake thread fires, disarmed by the engine's host driver before a stop of
    // its own.
    let armory = Arc::new(crate::reflex::Armory::default());
    let mut engine = Engine::with_host(
        config.clone(),
        Some(anchor),
        Arc::new(crate::act::driver::Host::with_armory(
            &config.host.process_root,
            armory.clone(),
        )),
    );
    engine.recover(previous, clock.now_ms());

    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let addr = listener
        .local_addr()
        .context("listening socket has no address")?;
    let control = server::bind(&config.control.socket)?;
    tracing::info!(%addr, socket = %config.control.socket.display(), "listening");

    let mut guardian = match Guardian::spawn(
        &config.control.state_dir,
        &config.host.process_root,
        Duration::from_millis(config.control.successor_grace_ms),
    ) {
        Ok(g) => {
            tracing::info!(pid = g.pid(), "guardian started");
            Some(g)
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot start the guardian; paused jobs depend on a restart if this daemon dies");
            None
        }
    };

    let shared = Arc::new(Shared::new(&config));
    // Notifications run beside the owner task; the engine only offers them its events.
    let host = crate::sample::hostname(&config.host.root).unwrap_or_else(|| "memwatch".into());
    if let Some(outbox) = crate::notify::start(&config.notify, host, shared.notify.clone()) {
        engine.set_outbox(outbox);
    }
    shared.publish_view(engine.view());

    let (to_owner, mut requests) = mpsc::channel::<Envelope>(64);
    let to_http_owner = to_owner.clone();
    let control_task = tokio::spawn(server::serve(
        control,
        to_owner,
        config.control.socket.clone(),
        server::Limits {
            total: config.control.max_connections.get(),
            per_uid: config.control.max_connections_per_uid.get(),
        },
    ));

    let (stop_http, mut http_stopped) = watch::channel(false);
    let app = crate::http::router(shared.clone(), to_http_owner, &config.http);
    let limits = crate::http::Limits {
        max_connections: config.http.max_connections.get(),
        request_timeout: Duration::from_millis(config.http.request_timeout_ms.0),
    };
    let http = tokio::spawn(async move {
        let stop = async move {
            let _ = http_stopped.changed().await;
        };
        crate::http::serve(listener, app, limits, stop).await
    });

    // When the last full sample started (its cadence: the engine's interval, stretched while calm),
    // and whether a reader asked for a fresh one.
    let mut full_started: Option<Instant> = None;
    let mut host_meminfo = meminfo::MeminfoFile::new(&config.host.root);
    let mut demanded = false;
    let mut next_probe = Instant::now();
    let mut sampler = Some(sampler(&config));
    let mut full: Option<JoinHandle<FullResult>> = None;
    let mut panics = 0u32;
    let mut failure: Option<anyhow::Error> = None;
    // Effects run off the owner task and report back on one bounded channel: a sender waits (on the
    // blocking pool or the Slurm thread, never on the owner task) while it is full. Wake-ups coalesce
    // into one pending permit.
    let (executor, mut outcomes) = Executor::start(&config.host.process_root);
    let woken = Arc::new(tokio::sync::Notify::new());
    let mut watches = Watches::start(
        &config,
        &mut engine,
        woken.clone(),
        shared.kernel.clone(),
        armory,
    );
    let mut stop = std::pin::pin!(shutdown_signal());
    // Under systemd: ready now, and a watchdog ping from this loop while samples are fresh, so a stuck
    // owner task or a sampler that stopped is restarted (and the restarted daemon resumes what this
    // one paused).
    crate::sd_notify::notify("READY=1");
    let watchdog_every = crate::sd_notify::watchdog_interval();
    // The first ping goes with the first sample; the ticks start one period later.
    let watchdog_period = watchdog_every.unwrap_or(Duration::from_secs(3600));
    let mut watchdog = tokio::time::interval_at(Instant::now() + watchdog_period, watchdog_period);
    let mut first_sample = true;
    // The jobs' notifications counted so far: a wake that adds none is the host's pressure alone.
    let mut jobs_notified = shared.kernel.jobs();

    loop {
        let probing = engine.probe_interval_ms(clock.now_ms());
        let full_every = engine.sample_interval_ms(clock.now_ms());
        let was = shared
            .sample_interval_ms
            .swap(full_every, std::sync::atomic::Ordering::Relaxed);
        if was != full_every {
            tracing::debug!(
                interval_ms = full_every,
                why = engine.why_not_calm(clock.now_ms()).unwrap_or("calm"),
                "full-sample interval"
            );
        }
        let next_full = match full_started {
            Some(t) if !demanded => t + Duration::from_millis(full_every),
            _ => Instant::now(),
        };
        // The engine's next deadline, on tokio's clock (a millisecond late rather than early).
        let deadline = engine.poll_timeout().map(|at| {
            Instant::now() + Duration::from_millis(at.saturating_sub(clock.now_ms()) + 1)
        });
        tokio::select! {
            biased;
            _ = stop.as_mut() => break,
            _ = watchdog.tick(), if watchdog_every.is_some() => {
                if shared.fresh() {
                    crate::sd_notify::notify("WATCHDOG=1");
                } else if first_sample {
                    tracing::debug!("no sample yet; not feeding the watchdog");
                } else {
                    tracing::warn!("samples are stale; not feeding the watchdog");
                }
            }
            _ = woken.notified() => {
                // The kernel saw a crossing: what a reflex stopped is taken over first, then a
                // probe now, on this very turn.
                let now = clock.now_ms();
                let any = take_over_fired(&watches, &mut engine, now);
                let jobs = shared.kernel.jobs();
                let wake = if std::mem::replace(&mut jobs_notified, jobs) == jobs {
                    crate::engine::Wake::HostPressure
                } else {
                    crate::engine::Wake::Job
                };
                match engine.handle_wake(now, wake) {
                    crate::engine::WakeAnswer::Probe => {
                        next_probe = run_probe(&config, &mut host_meminfo, &mut engine, &shared, &executor, now);
                    }
                    crate::engine::WakeAnswer::FullSample => demanded |= full.is_none(),
                }
                if any {
                    watches.sync(&mut engine);
                }
            }
            Some(outcome) = outcomes.recv() => {
                let now = clock.now_ms();
                engine.handle_outcome(outcome, now);
                executor.drain(&mut engine, now);
                if engine.take_dirty() {
                    shared.publish_view(engine.view());
                }
            }
            _ = shared.demand.notified() => {
                // A reader found the sample stale (stretched while calm): one now, unless one is
                // on its way.
                demanded = full.is_none() && shared.sample_age_ms() > shared.fresh_ms;
            }
            Some(env) = requests.recv() => {
                let now = clock.now_ms();
                // A command while samples are stretched gets a fresh one next.
                demanded |= full_every > shared.fresh_ms && shared.sample_age_ms() > shared.fresh_ms;
                let reply = engine.handle_command(env.request, env.caller, now);
                let _ = env.reply.send(reply);
                executor.drain(&mut engine, now);
                watches.sync(&mut engine);
                shared.publish_view(engine.view());
                let _ = engine.take_dirty();
                // A new job is probed at once.
                next_probe = Instant::now();
            }
            done = in_flight(&mut full) => {
                full = None;
                match done {
                    Ok((s, sample, jobs, taken)) => {
                        panics = 0;
                        sampler = Some(s);
                        let sample = Arc::new(sample);
                        let now = clock.now_ms();
                        let age = u64::try_from(taken.elapsed().as_millis()).unwrap_or(u64::MAX);
                        engine.handle_sample(sample.clone(), jobs, now, now.saturating_sub(age));
                        executor.drain(&mut engine, now);
                        watches.sync(&mut engine);
                        let view = engine.take_dirty().then(|| engine.view());
                        shared.publish_sample(sample, view);
                        if std::mem::take(&mut first_sample) && watchdog_every.is_some() {
                            crate::sd_notify::notify("WATCHDOG=1");
                        }
                        if let Some(g) = guardian.as_mut() {
                            g.keep_alive();
                        }
                    }
                    Err(e) => {
                        panics += 1;
                        if panics >= MAX_SAMPLER_PANICS {
                            tracing::error!(error = %e, panics, "the sampler keeps panicking; stopping so that a supervisor restarts the daemon");
                            failure = Some(anyhow::anyhow!("the sampler panicked {panics} times in a row"));
                            break;
                        }
                        tracing::error!(error = %e, panics, "the sampler panicked; starting a new one");
                        sampler = Some(self::sampler(&config));
                    }
                }
            }
            _ = tokio::time::sleep_until(next_full), if full.is_none() && sampler.is_some() => {
                // On cadence unless more than an interval late.
                let late = Instant::now().saturating_duration_since(next_full);
                full_started = Some(if late < Duration::from_millis(config.sampling.interval_ms.0) {
                    next_full
                } else {
                    Instant::now()
                });
                demanded = false;
                if let Some(s) = sampler.take() {
                    full = Some(spawn_full(s, &mut engine, clock.now_ms(), config.host.process_root.clone()));
                }
            }
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                let now = clock.now_ms();
                engine.handle_timeout(now);
                executor.drain(&mut engine, now);
                watches.sync(&mut engine);
                if engine.take_dirty() {
                    shared.publish_view(engine.view());
                }
            }
            _ = tokio::time::sleep_until(next_probe), if probing.is_some() => {
                next_probe = run_probe(&config, &mut host_meminfo, &mut engine, &shared, &executor, clock.now_ms());
                // A new job's cgroup limit is first known from its first probe.
                if watches.limit_unknown {
                    watches.sync(&mut engine);
                }
            }
        }
    }

    crate::sd_notify::notify("STOPPING=1");
    // No stop may come after the daemon let its jobs go: the reflexes are disarmed, and what fired
    // before is taken over (and so let go below).
    watches.disarm_all(&mut engine);
    for f in watches.take_fired() {
        engine.handle_reflex(f, clock.now_ms());
    }
    // A restart keeps the pauses the policy holds for the next daemon; the guardian then waits for
    // it as after a crash, and undoes them if it does not come.
    let successor = failure.is_none() && successor::restart_pending();
    let kept = engine.shutdown(clock.now_ms(), successor);
    executor.finish(&mut engine, &mut outcomes, || clock.now_ms());
    if !kept.is_empty() {
        tracing::info!(jobs = ?kept, "restarting: the pauses the policy holds are kept for the next daemon");
    } else if let Some(g) = guardian.as_mut() {
        g.stand_down();
    }
    shared.publish_view(engine.view());
    control_task.abort();
    let _ = std::fs::remove_file(&config.control.socket);
    let _ = stop_http.send(true);
    if tokio::time::timeout(Duration::from_secs(5), http)
        .await
        .is_err()
    {
        tracing::warn!("HTTP connections still open after 5 s; closing them");
    }
    tracing::info!("stopped");
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Hands the engine what the reflexes stopped since the last call. `true` when one had fired (the
/// watches need a sync).
fn take_over_fired(watches: &Watches, engine: &mut Engine, now: u64) -> bool {
    let fired = watches.take_fired();
    let any = !fired.is_empty();
    for f in fired {
        engine.handle_reflex(f, now);
    }
    any
}

/// One probe and policy step; returns when the next probe is due.
fn run_probe(
    config: &Config,
    host_meminfo: &mut meminfo::MeminfoFile,
    engine: &mut Engine,
    shared: &Shared,
    executor: &Executor,
    now: u64,
) -> Instant {
    let (host, cgroups) = probe(engine, host_meminfo, now);
    engine.handle_probe(host, cgroups, now);
    executor.drain(engine, now);
    if engine.take_dirty() {
        shared.publish_view(engine.view());
    }
    let wait = engine
        .probe_interval_ms(now)
        .unwrap_or(config.sampling.probe_interval_ms.0);
    Instant::now() + Duration::from_millis(wait)
}

/// Consecutive sampler panics after which the daemon exits non-zero (a supervisor restarts it).
const MAX_SAMPLER_PANICS: u32 = 3;

/// The clock's anchor: the persisted one when it belongs to this boot, else a fresh one.
fn clock_anchor(config: &Config, previous: Option<&persist::Persisted>) -> persist::ClockAnchor {
    let boot_id = crate::clock::boot_id(&config.host.process_root).unwrap_or_default();
    match previous.and_then(|p| p.clock.clone()) {
        Some(a) if !boot_id.is_empty() && a.boot_id == boot_id => a,
        _ => persist::ClockAnchor {
            boot_id,
            anchor_ms: Clock::fresh_anchor(crate::clock::wall_ms(), crate::clock::boot_ms()),
        },
    }
}
