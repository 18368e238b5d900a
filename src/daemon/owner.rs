//! The owner task: the one place the engine lives. Each turn takes the next [`Input`] (the first
//! ready, in a fixed order) and hands it to the engine, then drains the effects the engine decided,
//! keeps the kernel watches in step and publishes what changed. Everything else (samples, effects,
//! servers, the wake thread) runs beside it and reaches it through these inputs.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, Interval};

use super::DaemonError;
use super::executor::Executor;
use super::sampling::{self, FullResult};
use super::watches::Watches;
use crate::clock::Clock;
use crate::config::{Gpu, Host, Sampling};
use crate::control::server::Envelope;
use crate::engine::{Engine, Outcome, Wake, WakeAnswer};
use crate::guardian::Guardian;
use crate::sample::{Sampler, meminfo};
use crate::shared::Shared;

/// Consecutive sampler panics after which the daemon exits non-zero (a supervisor restarts it).
const MAX_SAMPLER_PANICS: u32 = 3;
/// A turn at least this long is logged: a job growing at 1 GiB/s gains 50 MiB meanwhile, with only
/// an armed reflex to stop it.
const SLOW_TURN: Duration = Duration::from_millis(50);

/// What the owner task acts on: one per turn.
enum Input {
    /// SIGTERM or SIGINT.
    Stop,
    /// Time to tell systemd's watchdog the daemon lives.
    Watchdog,
    /// The wake thread saw a kernel notification (a threshold, a PSI trigger) or fired a reflex.
    Woken,
    /// A job's v1 thresholds are registered (off this task): it is watched from now on, and its
    /// reflex can be armed.
    Registered,
    /// An effect finished. Boxed, as the sample: the input lives for one turn, and the rest are small.
    Outcome(Box<Outcome>),
    /// A reader found the published sample stale.
    Demand,
    /// A control request (CLI, HTTP), with what was read for it. Boxed, as the outcome.
    Command(Box<Envelope>),
    /// The full sample in flight finished (or its task panicked). Boxed: a sample is large, and
    /// comes once a second at most.
    Sampled(Box<Result<FullResult, tokio::task::JoinError>>),
    /// A full sample is due.
    FullDue,
    /// The engine's own deadline (a pause's grace, a way out's step) has come.
    Deadline,
    /// A probe is due.
    ProbeDue,
}

impl Input {
    /// The input's name, for the log.
    fn name(&self) -> &'static str {
        match self {
            Input::Stop => "stop",
            Input::Watchdog => "watchdog",
            Input::Woken => "woken",
            Input::Registered => "registered",
            Input::Outcome(_) => "outcome",
            Input::Demand => "demand",
            Input::Command(_) => "command",
            Input::Sampled(_) => "sampled",
            Input::FullDue => "full sample due",
            Input::Deadline => "deadline",
            Input::ProbeDue => "probe due",
        }
    }
}

/// Where the owner task's parts come from; see [`Owner::new`].
pub(super) struct Parts {
    pub(super) sampling: Sampling,
    pub(super) host: Host,
    pub(super) gpu: Gpu,
    pub(super) clock: Clock,
    pub(super) engine: Engine,
    pub(super) shared: Arc<Shared>,
    pub(super) executor: Executor,
    pub(super) outcomes: mpsc::Receiver<Outcome>,
    pub(super) requests: mpsc::Receiver<Envelope>,
    pub(super) watches: Watches,
    pub(super) woken: Arc<tokio::sync::Notify>,
    pub(super) guardian: Option<Guardian>,
}

/// The owner task's state: the engine, what feeds it, and the sampling cadence.
pub(super) struct Owner {
    /// The cadence's settings, where the machine is read, and the GPUs' (a sampler that panicked
    /// is made again from them).
    sampling: Sampling,
    host: Host,
    gpu: Gpu,
    clock: Clock,
    engine: Engine,
    shared: Arc<Shared>,
    executor: Executor,
    outcomes: mpsc::Receiver<Outcome>,
    requests: mpsc::Receiver<Envelope>,
    watches: Watches,
    woken: Arc<tokio::sync::Notify>,
    /// Woken when the registrar finished a job's thresholds.
    registered: Arc<tokio::sync::Notify>,
    guardian: Option<Guardian>,
    /// The sampler, while no full sample is in flight.
    sampler: Option<Sampler>,
    /// The full sample in flight.
    full: Option<JoinHandle<FullResult>>,
    /// When the last full sample started (its cadence: the engine's interval, stretched while
    /// calm), and whether a reader asked for a fresh one.
    full_started: Option<Instant>,
    demanded: bool,
    next_probe: Instant,
    host_meminfo: meminfo::MeminfoFile,
    /// Sampler panics in a row.
    panics: u32,
    /// systemd's watchdog: its period, if systemd asked for pings, and the ticks.
    watchdog_every: Option<Duration>,
    watchdog: Interval,
    first_sample: bool,
    /// The jobs' notifications counted so far: a wake that adds none is the host's pressure alone.
    jobs_notified: u64,
}

/// Whether the loop goes on, or stops (with the failure that stopped it, if any).
enum Flow {
    Go,
    Stop(Option<DaemonError>),
}

impl Owner {
    pub(super) fn new(p: Parts) -> Owner {
        // Under systemd: a watchdog ping from this loop while samples are fresh, so a stuck owner
        // task or a sampler that stopped is restarted (and the restarted daemon resumes what this
        // one paused). The first ping goes with the first sample; the ticks start one period later.
        let watchdog_every = crate::sd_notify::watchdog_interval();
        let period = watchdog_every.unwrap_or(Duration::from_secs(3600));
        let jobs_notified = p.shared.kernel.jobs();
        Owner {
            sampler: Some(super::sampler(&p.host, &p.gpu)),
            host_meminfo: meminfo::MeminfoFile::new(&p.host.root),
            sampling: p.sampling,
            host: p.host,
            gpu: p.gpu,
            clock: p.clock,
            engine: p.engine,
            shared: p.shared,
            executor: p.executor,
            outcomes: p.outcomes,
            requests: p.requests,
            registered: p.watches.registered(),
            watches: p.watches,
            woken: p.woken,
            guardian: p.guardian,
            full: None,
            full_started: None,
            demanded: false,
            next_probe: Instant::now(),
            panics: 0,
            watchdog_every,
            watchdog: tokio::time::interval_at(Instant::now() + period, period),
            first_sample: true,
            jobs_notified,
        }
    }

    /// Runs until `stop` resolves or the sampler keeps failing; the failure, if any.
    pub(super) async fn run(&mut self, stop: impl Future<Output = ()>) -> Option<DaemonError> {
        let mut stop = std::pin::pin!(stop);
        loop {
            let input = self.next(stop.as_mut()).await;
            let (what, started) = (input.name(), std::time::Instant::now());
            let flow = self.handle(input);
            let took = started.elapsed();
            if took >= SLOW_TURN {
                tracing::info!(
                    input = what,
                    took_ms = took.as_secs_f64() * 1000.0,
                    "a slow turn of the owner task: no job was probed and no reflex armed meanwhile"
                );
            }
            if let Flow::Stop(failure) = flow {
                return failure;
            }
        }
    }

    /// The next input: the first ready, in this order.
    async fn next(&mut self, stop: std::pin::Pin<&mut impl Future<Output = ()>>) -> Input {
        let now = self.clock.now_ms();
        let probing = self.engine.probe_interval_ms(now);
        let full_every = self.engine.sample_interval_ms(now);
        let was = self
            .shared
            .sample_interval_ms
            .swap(full_every, std::sync::atomic::Ordering::Relaxed);
        if was != full_every {
            tracing::debug!(
                interval_ms = full_every,
                why = self.engine.why_not_calm(now).unwrap_or("calm"),
                "full-sample interval"
            );
        }
        let next_full = match self.full_started {
            Some(t) if !self.demanded => t + Duration::from_millis(full_every),
            _ => Instant::now(),
        };
        // The engine's next deadline, on tokio's clock (a millisecond late rather than early).
        let deadline = self.engine.poll_timeout().map(|at| {
            Instant::now() + Duration::from_millis(at.saturating_sub(self.clock.now_ms()) + 1)
        });
        let sampling = self.full.is_none() && self.sampler.is_some();
        tokio::select! {
            biased;
            _ = stop => Input::Stop,
            _ = self.watchdog.tick(), if self.watchdog_every.is_some() => Input::Watchdog,
            _ = self.woken.notified() => Input::Woken,
            _ = self.registered.notified() => Input::Registered,
            Some(outcome) = self.outcomes.recv() => Input::Outcome(Box::new(outcome)),
            _ = self.shared.demand.notified() => Input::Demand,
            Some(env) = self.requests.recv() => Input::Command(Box::new(env)),
            done = sampling::in_flight(&mut self.full) => Input::Sampled(Box::new(done)),
            _ = tokio::time::sleep_until(next_full), if sampling => {
                // On cadence unless more than an interval late.
                let late = Instant::now().saturating_duration_since(next_full);
                let interval = Duration::from_millis(self.sampling.interval_ms.0);
                self.full_started = Some(if late < interval { next_full } else { Instant::now() });
                Input::FullDue
            }
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => Input::Deadline,
            _ = tokio::time::sleep_until(self.next_probe), if probing.is_some() => Input::ProbeDue,
        }
    }

    /// Hands one input to the engine, then carries out what it decided.
    fn handle(&mut self, input: Input) -> Flow {
        let now = self.clock.now_ms();
        match input {
            Input::Stop => return Flow::Stop(None),
            Input::Watchdog => self.watchdog(),
            Input::Woken => self.woken(now),
            Input::Registered => {
                self.watches.sync(&mut self.engine);
                self.publish_if_dirty();
            }
            Input::Outcome(outcome) => {
                self.engine.handle_outcome(*outcome, now);
                self.executor.drain(&mut self.engine, now);
                self.publish_if_dirty();
            }
            Input::Demand => {
                // A reader found the sample stale (stretched while calm): one now, unless one is
                // on its way.
                self.demanded =
                    self.full.is_none() && self.shared.sample_age_ms() > self.shared.fresh_ms;
            }
            Input::Command(env) => self.command(*env, now),
            Input::Sampled(done) => return self.sampled(*done),
            Input::FullDue => {
                self.demanded = false;
                if let Some(s) = self.sampler.take() {
                    let root = self.host.process_root.clone();
                    self.full = Some(sampling::spawn_full(s, &mut self.engine, now, root));
                }
            }
            Input::Deadline => {
                self.engine.handle_timeout(now);
                self.executor.drain(&mut self.engine, now);
                self.watches.sync(&mut self.engine);
                self.publish_if_dirty();
            }
            Input::ProbeDue => {
                self.probe(now);
                // A new job's cgroup limit is first known from its first probe.
                if self.watches.limit_unknown {
                    self.watches.sync(&mut self.engine);
                }
            }
        }
        Flow::Go
    }

    fn watchdog(&self) {
        if self.shared.fresh() {
            crate::sd_notify::notify("WATCHDOG=1");
        } else if self.first_sample {
            tracing::debug!("no sample yet; not feeding the watchdog");
        } else {
            tracing::warn!("samples are stale; not feeding the watchdog");
        }
    }

    /// The kernel saw a crossing: what a reflex stopped is taken over first, then a probe now, on
    /// this very turn (or one full sample, for the host's pressure alone while calm).
    fn woken(&mut self, now: u64) {
        let any = self.take_over_fired(now);
        let jobs = self.shared.kernel.jobs();
        // A v2 reflex fires on the wake thread's own read, not on a notification it counts.
        let wake = if std::mem::replace(&mut self.jobs_notified, jobs) == jobs && !any {
            Wake::HostPressure
        } else {
            Wake::Job
        };
        match self.engine.handle_wake(now, wake) {
            WakeAnswer::Probe => self.probe(now),
            WakeAnswer::FullSample => self.demanded |= self.full.is_none(),
        }
        if any {
            self.watches.sync(&mut self.engine);
        }
    }

    /// Hands the engine what the reflexes stopped since the last call. `true` when one had fired
    /// (the watches need a sync).
    fn take_over_fired(&mut self, now: u64) -> bool {
        let fired = self.watches.take_fired();
        let any = !fired.is_empty();
        for f in fired {
            self.engine.handle_reflex(f, now);
        }
        any
    }

    fn command(&mut self, env: Envelope, now: u64) {
        // A command while samples are stretched gets a fresh one next.
        let full_every = self
            .shared
            .sample_interval_ms
            .load(std::sync::atomic::Ordering::Relaxed);
        let fresh = self.shared.fresh_ms;
        self.demanded |= full_every > fresh && self.shared.sample_age_ms() > fresh;
        let reply = self
            .engine
            .handle_command(env.request, env.caller, env.prepared, now);
        let _ = env.reply.send(reply);
        self.executor.drain(&mut self.engine, now);
        self.watches.sync(&mut self.engine);
        self.shared.publish_view(self.engine.view());
        let _ = self.engine.take_dirty();
        // A new job is probed at once.
        self.next_probe = Instant::now();
    }

    fn sampled(&mut self, done: Result<FullResult, tokio::task::JoinError>) -> Flow {
        self.full = None;
        let (s, sample, jobs, taken) = match done {
            Ok(r) => r,
            Err(e) => {
                self.panics += 1;
                let panics = self.panics;
                if panics >= MAX_SAMPLER_PANICS {
                    tracing::error!(error = %e, panics, "the sampler keeps panicking; stopping so that a supervisor restarts the daemon");
                    return Flow::Stop(Some(DaemonError::SamplerPanics(panics)));
                }
                tracing::error!(error = %e, panics, "the sampler panicked; starting a new one");
                self.sampler = Some(super::sampler(&self.host, &self.gpu));
                return Flow::Go;
            }
        };
        self.panics = 0;
        self.sampler = Some(s);
        let sample = Arc::new(sample);
        let now = self.clock.now_ms();
        let age = u64::try_from(taken.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.engine
            .handle_sample(sample.clone(), jobs, now, now.saturating_sub(age));
        self.executor.drain(&mut self.engine, now);
        self.watches.sync(&mut self.engine);
        let view = self.engine.take_dirty().then(|| self.engine.view());
        self.shared.publish_sample(sample, view);
        if std::mem::take(&mut self.first_sample) && self.watchdog_every.is_some() {
            crate::sd_notify::notify("WATCHDOG=1");
        }
        if let Some(g) = self.guardian.as_mut() {
            g.keep_alive();
        }
        Flow::Go
    }

    /// One probe and policy step; the next probe is due one probe interval later.
    fn probe(&mut self, now: u64) {
        let (host, cgroups) = sampling::probe(&self.engine, &mut self.host_meminfo, now);
        self.engine.handle_probe(host, cgroups, now);
        self.executor.drain(&mut self.engine, now);
        // A probe that paused, resumed or moved a job between levels changed what its reflex should
        // be: a job resumed here is armed again now, not at the next full sample (up to a calm
        // interval later, while it may grow as fast as before its pause).
        if self.engine.take_dirty() {
            self.watches.sync(&mut self.engine);
            self.shared.publish_view(self.engine.view());
        }
        let wait = self
            .engine
            .probe_interval_ms(now)
            .unwrap_or(self.sampling.probe_interval_ms.0);
        self.next_probe = Instant::now() + Duration::from_millis(wait);
    }

    fn publish_if_dirty(&mut self) {
        if self.engine.take_dirty() {
            self.shared.publish_view(self.engine.view());
        }
    }

    /// The stop: no stop may come after the daemon let its jobs go, so the reflexes are disarmed and
    /// what fired before is taken over (and so let go). A restart keeps the pauses the policy holds
    /// for the next daemon (the guardian then waits for it as after a crash, and undoes them if it
    /// does not come); a plain stop resumes everything and stands the guardian down.
    pub(super) fn stop(mut self, restart: bool) {
        let now = self.clock.now_ms();
        self.watches.disarm_all(&mut self.engine);
        self.take_over_fired(now);
        let kept = self.engine.shutdown(now, restart);
        let clock = self.clock;
        self.executor
            .finish(&mut self.engine, &mut self.outcomes, || clock.now_ms());
        if !kept.is_empty() {
            tracing::info!(jobs = ?kept, "restarting: the pauses the policy holds are kept for the next daemon");
        } else if let Some(g) = self.guardian.as_mut() {
            g.stand_down();
        }
        self.shared.publish_view(self.engine.view());
    }
}
