//! The daemon: one task owns the sampler and publishes each sample; the HTTP server reads what it
//! published. tick → sample → publish.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::Config;
use crate::history::{History, Point};
use crate::sample::Sampler;
use crate::sample::gpu::GpuSource;
use crate::sample::nvml::NvmlSource;

/// What the sampling task publishes for readers (HTTP handlers). Written by that task alone.
pub struct Shared {
    latest: RwLock<Option<Arc<crate::sample::Sample>>>,
    history: RwLock<History>,
    samples_total: AtomicU64,
    pub history_seconds: u64,
}

impl Shared {
    pub fn new(config: &Config) -> Self {
        Shared {
            latest: RwLock::new(None),
            history: RwLock::new(History::new(config.sampling.history_len())),
            samples_total: AtomicU64::new(0),
            history_seconds: config.sampling.history_seconds.0,
        }
    }

    /// The latest sample, if one was taken.
    pub fn latest(&self) -> Option<Arc<crate::sample::Sample>> {
        self.latest
            .read()
            .map(|g| g.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// History points no older than `seconds`.
    pub fn history(&self, seconds: u64) -> Vec<Point> {
        match self.history.read() {
            Ok(h) => h.since(seconds),
            Err(p) => p.into_inner().since(seconds),
        }
    }

    pub fn samples_total(&self) -> u64 {
        self.samples_total.load(Ordering::Relaxed)
    }

    fn publish(&self, sample: crate::sample::Sample) {
        let point = Point::of(&sample);
        match self.history.write() {
            Ok(mut h) => h.push(point),
            Err(p) => p.into_inner().push(point),
        }
        let sample = Some(Arc::new(sample));
        match self.latest.write() {
            Ok(mut l) => *l = sample,
            Err(p) => *p.into_inner() = sample,
        }
        self.samples_total.fetch_add(1, Ordering::Relaxed);
    }
}

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

/// The sampling loop. Runs until `stop` changes. Sampling is blocking I/O, so it runs on the blocking pool;
/// the sampler moves there and back each tick.
async fn sample_loop(
    mut sampler: Sampler,
    shared: Arc<Shared>,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let joined = tokio::task::spawn_blocking(move || {
            let s = sampler.sample();
            (sampler, s)
        })
        .await;
        match joined {
            Ok((back, sample)) => {
                sampler = back;
                shared.publish(sample);
            }
            Err(e) => {
                tracing::error!(error = %e, "the sampler panicked; sampling stops, the server keeps serving");
                return;
            }
        }
    }
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

/// Runs the daemon until SIGTERM or SIGINT.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let addr = listener
        .local_addr()
        .context("listening socket has no address")?;
    tracing::info!(%addr, "listening");

    let shared = Arc::new(Shared::new(&config));
    let (stop_tx, stop_rx) = watch::channel(false);
    let sampler = sampler(&config);
    let every = Duration::from_millis(config.sampling.interval_ms.0);
    let sampling = tokio::spawn(sample_loop(sampler, shared.clone(), every, stop_rx));

    let app = crate::http::router(shared, &config.http);
    let listener =
        crate::http::LimitedListener::new(listener, config.http.max_connections.0 as usize);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await
        .context("HTTP server failed")?;
    let _ = stop_tx.send(true);
    let _ = sampling.await;
    tracing::info!("stopped");
    Ok(())
}
