//! What the owner task publishes and the HTTP side reads: the latest sample and the engine's view,
//! swapped in together as one snapshot, and the history. One writer (the daemon's owner task), many
//! readers; nothing here acts.

use std::sync::{Arc, RwLock};

use crate::config::Sampling;
use crate::engine::View;
use crate::history::{History, Point};
use crate::sample::Sample;

/// One published moment: the latest sample and the engine's view, swapped in together so that no
/// reader ever mixes one sample with another's view.
#[derive(Default)]
pub struct Snapshot {
    /// The newest sample.
    pub sample: Option<Arc<Sample>>,
    /// The engine's view at that sample.
    pub view: Arc<View>,
    /// Samples taken since the daemon started.
    pub samples_total: u64,
    /// Boot-clock milliseconds when the latest sample was published.
    pub sampled_at_boot_ms: u64,
}

/// What the owner task publishes for readers (HTTP handlers). Written by that task alone.
pub struct Shared {
    snapshot: RwLock<Arc<Snapshot>>,
    history: RwLock<History>,
    /// Seconds of history kept.
    pub history_seconds: u64,
    /// A sample older than this is stale: `/-/ready` answers 503 and the watchdog is not fed.
    pub stale_after_ms: u64,
    /// Notification counts by channel and outcome, for `/metrics`.
    pub notify: Arc<crate::notify::Stats>,
    /// Kernel notifications (PSI triggers, memory thresholds) received, by source, for `/metrics`.
    pub kernel: Arc<crate::wake::Notified>,
    /// A reader found the sample older than `fresh_ms`: the owner task takes one now.
    pub demand: tokio::sync::Notify,
    /// A sample at most this old is fresh enough for a reader (`sampling.interval_ms`).
    pub fresh_ms: u64,
    /// The full-sample interval now, ms (stretched while calm), set by the owner task.
    pub sample_interval_ms: std::sync::atomic::AtomicU64,
    /// Samples published so far, for readers that wait for the next one.
    published: tokio::sync::watch::Sender<u64>,
}

impl Shared {
    /// Empty, sized from the sampling settings.
    pub fn new(sampling: &Sampling) -> Self {
        Shared {
            snapshot: RwLock::new(Arc::new(Snapshot::default())),
            history: RwLock::new(History::new(sampling.history_len())),
            history_seconds: sampling.history_seconds.0,
            stale_after_ms: stale_after_ms(sampling.calm_interval_ms.0.max(sampling.interval_ms.0)),
            notify: Arc::default(),
            kernel: Arc::default(),
            demand: tokio::sync::Notify::new(),
            fresh_ms: sampling.interval_ms.0,
            sample_interval_ms: sampling.interval_ms.0.into(),
            published: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Everything last published, at once.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        match self.snapshot.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// The latest sample, if one was taken.
    pub fn latest(&self) -> Option<Arc<Sample>> {
        self.snapshot().sample.clone()
    }

    /// Jobs, levels, events and intervention counts as last published.
    pub fn view(&self) -> Arc<View> {
        self.snapshot().view.clone()
    }

    /// History points no older than `seconds`.
    pub fn history(&self, seconds: u64) -> Vec<Point> {
        match self.history.read() {
            Ok(h) => h.since(seconds),
            Err(p) => p.into_inner().since(seconds),
        }
    }

    /// History points newer than `ms`: what a client that holds up to `ms` lacks.
    pub fn history_after(&self, ms: u64) -> Vec<Point> {
        match self.history.read() {
            Ok(h) => h.after(ms),
            Err(p) => p.into_inner().after(ms),
        }
    }

    /// Samples taken since the daemon started.
    pub fn samples_total(&self) -> u64 {
        self.snapshot().samples_total
    }

    /// Whether the latest sample is recent enough to act and report on.
    pub fn fresh(&self) -> bool {
        let s = self.snapshot();
        s.sample.is_some()
            && crate::clock::boot_ms().saturating_sub(s.sampled_at_boot_ms) <= self.stale_after_ms
    }

    /// How old the latest sample is, ms (`u64::MAX` before the first).
    pub fn sample_age_ms(&self) -> u64 {
        let s = self.snapshot();
        match s.sample {
            Some(_) => crate::clock::boot_ms().saturating_sub(s.sampled_at_boot_ms),
            None => u64::MAX,
        }
    }

    /// Makes the sample fresh for a reader while samples are stretched (calm): when it is older than
    /// `fresh_ms`, asks the owner task for one and waits for it, at most `wait`. Returns at once when
    /// fresh, or when samples are not stretched (a late sample then is a slow sampler, which a reader
    /// must not wait on).
    pub async fn freshen(&self, wait: std::time::Duration) {
        let stretched = self
            .sample_interval_ms
            .load(std::sync::atomic::Ordering::Relaxed)
            > self.fresh_ms;
        if !stretched || self.sample_age_ms() <= self.fresh_ms {
            return;
        }
        let mut next = self.published.subscribe();
        self.demand.notify_one();
        let _ = tokio::time::timeout(wait, next.changed()).await;
    }

    fn swap(&self, f: impl FnOnce(&Snapshot) -> Snapshot) {
        let mut guard = match self.snapshot.write() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let next = f(&guard);
        *guard = Arc::new(next);
    }

    pub(crate) fn publish_sample(&self, sample: Arc<Sample>, view: Option<View>) {
        let point = match &view {
            Some(v) => Point::of(&sample, &v.jobs),
            None => Point::of(&sample, &self.snapshot().view.jobs),
        };
        match self.history.write() {
            Ok(mut h) => h.push(point),
            Err(p) => p.into_inner().push(point),
        }
        self.swap(|old| Snapshot {
            sample: Some(sample),
            view: view.map(Arc::new).unwrap_or_else(|| old.view.clone()),
            samples_total: old.samples_total + 1,
            sampled_at_boot_ms: crate::clock::boot_ms(),
        });
        self.published.send_modify(|n| *n += 1);
    }

    pub(crate) fn publish_view(&self, view: View) {
        self.swap(|old| Snapshot {
            sample: old.sample.clone(),
            view: Arc::new(view),
            samples_total: old.samples_total,
            sampled_at_boot_ms: old.sampled_at_boot_ms,
        });
    }
}

/// How old a sample may get before the daemon calls itself not ready: three (calm) intervals, at
/// least 5 s.
pub fn stale_after_ms(interval_ms: u64) -> u64 {
    interval_ms.saturating_mul(3).max(5000)
}
