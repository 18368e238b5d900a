//! The daemon's composition root: [`run`] lists what starts, in order, and what stops. One task
//! owns the sampler and the engine (`owner.rs`: each turn one input, handed to the engine, then its
//! effects carried out and the view published for the HTTP side). sample → decide → act → publish.

use std::sync::Arc;
use std::time::Duration;

use crate::act::persist::{self, StateLock};
use crate::clock::Clock;
use crate::config::{self, Config};
use crate::engine::{Engine, Settings};
use crate::guardian::Guardian;
use crate::sample::Sampler;
use crate::sample::gpu::GpuSource;
use crate::sample::nvml::NvmlSource;

mod error;
mod executor;
mod owner;
mod sampling;
mod servers;
mod successor;
mod watches;
pub use error::DaemonError;
use executor::Executor;
use owner::Owner;
use watches::Watches;

pub use crate::shared::{Shared, Snapshot, stale_after_ms};

/// Builds the sampler the configuration asks for.
pub fn sampler(host: &config::Host, gpu: &config::Gpu) -> Sampler {
    let source: Option<Box<dyn GpuSource>> = gpu
        .enabled
        .then(|| Box::new(NvmlSource::new(gpu.library.clone())) as Box<dyn GpuSource>);
    if !gpu.enabled {
        tracing::info!("GPU sampling disabled by configuration");
    }
    Sampler::new(host.root.clone(), source)
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

/// Runs the daemon until SIGTERM or SIGINT. Before returning it continues every job it paused, but
/// those a restart hands to the next daemon.
pub async fn run(config: Config) -> Result<(), DaemonError> {
    let _lock = lock(&config).await?;
    // The guardian's pipe next, on low descriptors (see `guardian::Pipe`), told of each state write.
    let pipe = crate::guardian::Pipe::new();
    persist::after_write(crate::guardian::state_written);
    crate::act::pin::raise_nofile();
    // Recover first, before anything that can fail (a port in use): a predecessor's paused jobs are
    // resumed whatever happens next.
    let previous = previous_state(&config);
    let anchor = crate::clock::anchor(
        &config.host.process_root,
        previous.as_ref().and_then(|p| p.clock.as_ref()),
    );
    let clock = Clock::system(anchor.anchor_ms);
    // The reflexes the wake thread fires, disarmed by the engine's host driver before a stop of
    // its own.
    let armory = Arc::new(crate::reflex::Armory::new(&config.host.process_root));
    let host = crate::act::driver::Host::with_armory(&config.host.process_root, armory.clone());
    let settings = Settings::from(&config);
    let stores = crate::engine::open_stores(&settings);
    let view = Arc::new(crate::view::RootView::new(&config.host.process_root));
    let mut engine = Engine::with_host(settings, Some(anchor), Arc::new(host), view, stores);
    engine.recover(previous, clock.now_ms());
    let bound = servers::bind(&config).await?;
    let guardian = guardian(&config, pipe);
    let shared = Arc::new(Shared::new(&config.sampling));
    notifications(&config, &shared, &mut engine);
    shared.publish_view(engine.view());
    let (servers, requests) = bound.serve(&config, shared.clone());
    // Effects run off the owner task and report back on one bounded channel.
    let (executor, outcomes) = Executor::start(&config.host.process_root);
    let woken = Arc::new(tokio::sync::Notify::new());
    let (counts, wake) = (shared.kernel.clone(), woken.clone());
    let priority = config.policy.reflex_priority;
    let watches = Watches::start(&config.host, &mut engine, wake, counts, armory, priority);
    let mut owner = Owner::new(owner::Parts {
        sampling: config.sampling,
        host: config.host,
        gpu: config.gpu,
        clock,
        engine,
        shared,
        executor,
        outcomes,
        requests,
        watches,
        woken,
        guardian,
    });
    crate::sd_notify::notify("READY=1");
    let failure = owner.run(shutdown_signal()).await;
    crate::sd_notify::notify("STOPPING=1");
    owner.stop(failure.is_none() && successor::restart_pending());
    servers.stop().await;
    tracing::info!("stopped");
    failure.map_or(Ok(()), Err)
}

/// One daemon per runtime directory (the guardian's lock: a guardian finishing a recovery holds it
/// for a moment) and per state directory (the audit log and the journal have one writer).
async fn lock(config: &Config) -> Result<Vec<StateLock>, DaemonError> {
    let mut dirs = vec![config.control.runtime_dir()];
    if config.control.state_dir != dirs[0] {
        dirs.push(config.control.state_dir.clone());
    }
    let mut locks = Vec::new();
    for dir in dirs {
        let wait = dir.clone();
        let lock =
            tokio::task::spawn_blocking(move || StateLock::acquire(&wait, Duration::from_secs(5)))
                .await
                .map_err(DaemonError::LockTask)?
                .map_err(|error| DaemonError::Lock {
                    dir: dir.clone(),
                    error,
                })?
                .ok_or(DaemonError::Locked(dir))?;
        locks.push(lock);
    }
    Ok(locks)
}

/// The previous daemon's state file, if it left one that reads. One that an earlier build kept in
/// the state directory is moved to the runtime directory first.
fn previous_state(config: &Config) -> Option<persist::Persisted> {
    let runtime = config.control.runtime_dir();
    match persist::adopt_legacy(&config.control.state_dir, &runtime) {
        Ok(true) => tracing::info!(
            from = %config.control.state_dir.display(),
            to = %runtime.display(),
            "the state file moved to the runtime directory"
        ),
        Ok(false) => {}
        Err(e) => {
            tracing::error!(error = %e, "cannot move the state file to the runtime directory")
        }
    }
    persist::load(&runtime).unwrap_or_else(|e| {
        tracing::error!(error = %e, "cannot read the previous state; nothing to recover");
        None
    })
}

/// The guardian that undoes this daemon's pauses if it dies; none if it cannot start.
fn guardian(config: &Config, pipe: std::io::Result<crate::guardian::Pipe>) -> Option<Guardian> {
    let grace = Duration::from_millis(config.control.successor_grace_ms);
    match pipe.and_then(|pipe| {
        Guardian::spawn(
            pipe,
            &config.control.runtime_dir(),
            &config.host.process_root,
            grace,
            config.policy.reflex_priority,
        )
    }) {
        Ok(g) => {
            tracing::info!(pid = g.pid(), "guardian started");
            Some(g)
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot start the guardian; paused jobs depend on a restart if this daemon dies");
            None
        }
    }
}

/// Notifications run beside the owner task; the engine only offers them its events.
fn notifications(config: &Config, shared: &Shared, engine: &mut Engine) {
    let host = crate::sample::hostname(&config.host.root).unwrap_or_else(|| "memwatch".into());
    if let Some(outbox) = crate::notify::start(&config.notify, host, shared.notify.clone()) {
        engine.set_outbox(Box::new(outbox));
    }
}
