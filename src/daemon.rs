//! The daemon: one task owns the sampler and the engine (jobs, policy, actions). It selects over the
//! full-sample tick, the adaptive probe tick, control requests and the stop signal, and publishes what
//! the HTTP side reads. tick → sample → decide → act → publish.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::Config;
use crate::control::server::{self, Envelope};
use crate::engine::{Engine, View};
use crate::history::{History, Point};
use crate::job::JobSample;
use crate::sample::gpu::GpuSource;
use crate::sample::nvml::NvmlSource;
use crate::sample::{Sample, Sampler, cgroup, meminfo};

/// What the owner task publishes for readers (HTTP handlers). Written by that task alone.
pub struct Shared {
    latest: RwLock<Option<Arc<Sample>>>,
    history: RwLock<History>,
    view: RwLock<Arc<View>>,
    samples_total: AtomicU64,
    pub history_seconds: u64,
}

fn read<T: Clone>(l: &RwLock<T>) -> T {
    l.read()
        .map(|g| g.clone())
        .unwrap_or_else(|p| p.into_inner().clone())
}

fn write<T>(l: &RwLock<T>, f: impl FnOnce(&mut T)) {
    match l.write() {
        Ok(mut g) => f(&mut g),
        Err(p) => f(&mut p.into_inner()),
    }
}

impl Shared {
    pub fn new(config: &Config) -> Self {
        Shared {
            latest: RwLock::new(None),
            history: RwLock::new(History::new(config.sampling.history_len())),
            view: RwLock::new(Arc::new(View::default())),
            samples_total: AtomicU64::new(0),
            history_seconds: config.sampling.history_seconds.0,
        }
    }

    /// The latest sample, if one was taken.
    pub fn latest(&self) -> Option<Arc<Sample>> {
        read(&self.latest)
    }

    /// Jobs, levels, events and intervention counts as last published.
    pub fn view(&self) -> Arc<View> {
        read(&self.view)
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

    fn publish_sample(&self, sample: Arc<Sample>) {
        let point = Point::of(&sample);
        write(&self.history, |h| h.push(point));
        write(&self.latest, |l| *l = Some(sample));
        self.samples_total.fetch_add(1, Ordering::Relaxed);
    }

    fn publish_view(&self, view: View) {
        write(&self.view, |v| *v = Arc::new(view));
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

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
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

type FullResult = (Sampler, Sample, Vec<(String, Option<JobSample>)>);

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
    process_root: std::path::PathBuf,
) -> JoinHandle<FullResult> {
    let plan = engine.measure_plan(now_ms());
    tokio::task::spawn_blocking(move || {
        let sample = sampler.sample();
        let now = sample.timestamp_ms;
        let jobs = plan
            .into_iter()
            .map(|p| {
                let m = crate::job::measure::measure(
                    &process_root,
                    p.root,
                    p.cgroup.as_ref(),
                    &sample.gpus,
                    now,
                    p.previous.as_ref(),
                );
                (p.name, m)
            })
            .collect();
        (sampler, sample, jobs)
    })
}

/// What a probe saw: (MemAvailable, MemTotal), and each job's cgroup.
type Probe = (Option<(u64, u64)>, Vec<(String, cgroup::CgroupMemory)>);

/// The cheap probe: MemAvailable and every job's cgroup. Small reads, done inline.
/// Only the usage file is read (one small read); limit and inactive file cache come from the last full
/// read of the cgroup, which every full sample refreshes.
fn probe(config: &Config, engine: &Engine, now: u64) -> Probe {
    let host = engine
        .probe_host(now)
        .then(|| meminfo::read(&config.host.root).ok())
        .flatten()
        .map(|m| (m.available_bytes, m.total_bytes));
    let cgroups = engine
        .probe_plan()
        .into_iter()
        .filter_map(|(name, dir, last)| {
            let fresh = match last {
                Some(last) => cgroup::CgroupMemory {
                    usage_bytes: cgroup::read_usage(&dir).ok()?,
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
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let addr = listener
        .local_addr()
        .context("listening socket has no address")?;
    let control = server::bind(&config.control.socket)?;
    tracing::info!(%addr, socket = %config.control.socket.display(), "listening");

    let shared = Arc::new(Shared::new(&config));
    let mut engine = Engine::new(config.clone());
    engine.recover(now_ms());
    shared.publish_view(engine.view());

    let (to_owner, mut requests) = mpsc::channel::<Envelope>(64);
    let to_http_owner = to_owner.clone();
    let control_task = tokio::spawn(server::serve(
        control,
        to_owner,
        config.control.socket.clone(),
    ));

    let (stop_http, mut http_stopped) = watch::channel(false);
    let app = crate::http::router(shared.clone(), to_http_owner, &config.http);
    let listener =
        crate::http::LimitedListener::new(listener, config.http.max_connections.0 as usize);
    let http = tokio::spawn(async move {
        let stop = async move {
            let _ = http_stopped.changed().await;
        };
        axum::serve(listener, app)
            .with_graceful_shutdown(stop)
            .await
    });

    let every = Duration::from_millis(config.sampling.interval_ms.0);
    let mut next_full = Instant::now();
    let mut next_probe = Instant::now();
    let mut sampler = Some(sampler(&config));
    let mut full: Option<JoinHandle<FullResult>> = None;
    let mut stop = std::pin::pin!(shutdown_signal());
    // Under systemd: ready now, and a watchdog ping from this loop, so a stuck owner task is restarted
    // (and the restarted daemon resumes what this one paused).
    crate::notify::notify("READY=1");
    let watchdog_every = crate::notify::watchdog_interval();
    let mut watchdog = tokio::time::interval(watchdog_every.unwrap_or(Duration::from_secs(3600)));

    loop {
        let probing = engine.probe_interval_ms(now_ms());
        tokio::select! {
            biased;
                        _ = stop.as_mut() => break,
            _ = watchdog.tick(), if watchdog_every.is_some() => crate::notify::notify("WATCHDOG=1"),
            Some(env) = requests.recv() => {
                let reply = engine.handle(env.request, env.caller, now_ms());
                let _ = env.reply.send(reply);
                shared.publish_view(engine.view());
                let _ = engine.take_dirty();
                // A new job is probed at once.
                next_probe = Instant::now();
            }
            done = in_flight(&mut full) => {
                full = None;
                match done {
                    Ok((s, sample, jobs)) => {
                        sampler = Some(s);
                        let sample = Arc::new(sample);
                        shared.publish_sample(sample.clone());
                        engine.on_sample(sample, jobs, now_ms());
                        if engine.take_dirty() {
                            shared.publish_view(engine.view());
                        }
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "the sampler panicked; sampling stops, jobs stay protected by probes");
                    }
                }
            }
            _ = tokio::time::sleep_until(next_full), if full.is_none() && sampler.is_some() => {
                next_full += every;
                if next_full < Instant::now() {
                    next_full = Instant::now() + every;
                }
                if let Some(s) = sampler.take() {
                    full = Some(spawn_full(s, &mut engine, config.host.process_root.clone()));
                }
            }
            _ = tokio::time::sleep_until(next_probe), if probing.is_some() => {
                let now = now_ms();
                let (host, cgroups) = probe(&config, &engine, now);
                engine.on_probe(host, cgroups, now);
                if engine.take_dirty() {
                    shared.publish_view(engine.view());
                }
                let wait = engine.probe_interval_ms(now).unwrap_or(config.sampling.probe_interval_ms.0);
                next_probe = Instant::now() + Duration::from_millis(wait);
            }
        }
    }

    crate::notify::notify("STOPPING=1");
    engine.shutdown(now_ms());
    shared.publish_view(engine.view());
    control_task.abort();
    let _ = std::fs::remove_file(&config.control.socket);
    let _ = stop_http.send(true);
    match tokio::time::timeout(Duration::from_secs(5), http).await {
        Ok(Ok(Err(e))) => tracing::warn!(error = %e, "HTTP server ended with an error"),
        Err(_) => tracing::warn!("HTTP connections still open after 5 s; closing them"),
        _ => {}
    }
    tracing::info!("stopped");
    Ok(())
}
