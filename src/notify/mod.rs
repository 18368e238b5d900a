//! Notifications: the engine's events, told to people over webhooks, Slack/Mattermost, ntfy or a
//! command.
//!
//! The engine offers each event it records to an [`Outbox`] (a `try_send`: it never waits). A
//! dispatcher task maps it to a [`NoticeKind`], applies each channel's filter and rate limits, and
//! hands it to that channel's own worker task, which delivers with a timeout and retries with
//! backoff. A slow or dead receiver fills only its own queue; what does not fit is dropped and
//! counted. Channels are named in logs and metrics by their `name`, never by URL or token.

mod deliver;
mod limit;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;

use serde::Serialize;
use tokio::sync::mpsc;

use crate::act::audit::{Action, Event, Reason};
use crate::config::{Channel, NoticeKind, Notify};

pub use deliver::message;

/// One thing to tell people.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Notice {
    /// What kind of event it is.
    pub kind: NoticeKind,
    /// The job, or "" for the host.
    pub job: String,
    /// The Slurm job the job belongs to, if any.
    pub slurm_job_id: Option<String>,
    /// A short machine-readable cause (as in the event).
    pub reason: Reason,
    /// The numbers behind it, for people.
    pub detail: String,
    /// When it happened (ms since the epoch).
    pub timestamp_ms: u64,
    /// Decided in dry-run mode.
    pub dry_run: bool,
    /// The machine's host name.
    pub host: String,
    /// Notices of this kind for this job the channel held back since the last one it sent.
    pub held_back: u64,
}

/// The kind of notice an engine event is, if it is one people are told about.
pub fn kind_of(e: &Event) -> Option<NoticeKind> {
    Some(match (e.action, &e.reason) {
        (Action::Pause, _) => NoticeKind::Pause,
        (Action::Resume, _) => NoticeKind::Resume,
        (Action::Terminate, _) => NoticeKind::Stop,
        (Action::Attach, Reason::Relaunch) => NoticeKind::Restart,
        (Action::Rewrite, _) if !e.dry_run => NoticeKind::Staged,
        (Action::Applied, _) => NoticeKind::Applied,
        (Action::Unverified, _) => NoticeKind::Unverified,
        (Action::NearExhaustion, _) => NoticeKind::NearExhaustion,
        (Action::CollectorDown, _) => NoticeKind::CollectorDown,
        _ => return None,
    })
}

/// Counts per channel and outcome, for `/metrics`.
#[derive(Debug, Default)]
pub struct Stats {
    counts: Mutex<BTreeMap<(String, &'static str), u64>>,
}

impl Stats {
    fn add(&self, channel: &str, outcome: &'static str) {
        if let Ok(mut c) = self.counts.lock() {
            *c.entry((channel.to_owned(), outcome)).or_insert(0) += 1;
        }
    }

    /// (channel, outcome, count): outcomes are sent, failed (every try failed), retried (a try
    /// failed and another followed), held_back (rate limits) and dropped (the queue was full).
    pub fn snapshot(&self) -> Vec<(String, &'static str, u64)> {
        self.counts
            .lock()
            .map(|c| c.iter().map(|((ch, o), n)| (ch.clone(), *o, *n)).collect())
            .unwrap_or_default()
    }
}

/// Where the engine drops events; cheap to clone.
#[derive(Clone)]
pub struct Outbox {
    tx: mpsc::Sender<Event>,
    stats: Arc<Stats>,
}

impl memwatch_core::audit::Notify for Outbox {
    /// Offers an event; never waits. An event that is no notice is ignored.
    fn offer(&self, e: &Event) {
        if kind_of(e).is_some() && self.tx.try_send(e.clone()).is_err() {
            self.stats.add("*", "dropped");
        }
    }
}

/// Starts the dispatcher and one worker per channel; `None` when no channel is configured.
pub fn start(cfg: &Notify, host: String, stats: Arc<Stats>) -> Option<Outbox> {
    if cfg.channels.is_empty() {
        return None;
    }
    let (tx, mut rx) = mpsc::channel::<Event>(256);
    let mut workers: Vec<(Channel, limit::Limiter, mpsc::Sender<Notice>)> = Vec::new();
    for c in &cfg.channels {
        let (wtx, wrx) = mpsc::channel::<Notice>(32);
        tokio::spawn(deliver::worker(c.clone(), wrx, stats.clone()));
        workers.push((c.clone(), limit::Limiter::new(c), wtx));
    }
    let dispatch_stats = stats.clone();
    tokio::spawn(async move {
        while let Some(e) = rx.recv().await {
            let Some(kind) = kind_of(&e) else { continue };
            for (c, limiter, wtx) in &mut workers {
                if !c.events.contains(&kind) {
                    continue;
                }
                let Some(held_back) = limiter.admit(kind, &e.job, e.timestamp_ms) else {
                    dispatch_stats.add(&c.name, "held_back");
                    continue;
                };
                let notice = Notice {
                    kind,
                    job: e.job.clone(),
                    slurm_job_id: e.slurm_job_id.clone(),
                    reason: e.reason.clone(),
                    detail: e.detail.clone(),
                    timestamp_ms: e.timestamp_ms,
                    dry_run: e.dry_run,
                    host: host.clone(),
                    held_back,
                };
                if wtx.try_send(notice).is_err() {
                    dispatch_stats.add(&c.name, "dropped");
                    tracing::warn!(channel = %c.name, "notification queue full; dropped one");
                }
            }
        }
    });
    Some(Outbox { tx, stats })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(action: &str, reason: &str, dry_run: bool) -> Event {
        Event {
            timestamp_ms: 0,
            action: Action::parse(action).unwrap(),
            job: "j".into(),
            slurm_job_id: None,
            reason: Reason::parse(reason),
            detail: String::new(),
            dry_run,
        }
    }

    #[test]
    fn which_events_people_are_told_about() {
        for (action, reason, kind) in [
            ("pause", "host_memory", Some(NoticeKind::Pause)),
            ("resume", "recovered", Some(NoticeKind::Resume)),
            ("terminate", "way_out", Some(NoticeKind::Stop)),
            ("attach", "relaunch", Some(NoticeKind::Restart)),
            ("attach", "user", None),
            ("rewrite", "adapt", Some(NoticeKind::Staged)),
            ("applied", "trainer", Some(NoticeKind::Applied)),
            ("unverified", "trainer", Some(NoticeKind::Unverified)),
            (
                "near_exhaustion",
                "job_cgroup",
                Some(NoticeKind::NearExhaustion),
            ),
            ("collector_down", "gpu", Some(NoticeKind::CollectorDown)),
            ("level", "swap", None),
        ] {
            assert_eq!(
                kind_of(&event(action, reason, false)),
                kind,
                "{action}/{reason}"
            );
        }
        // A rewrite in dry-run mode stages nothing.
        assert_eq!(kind_of(&event("rewrite", "adapt", true)), None);
    }
}
