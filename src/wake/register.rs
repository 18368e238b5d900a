//! The registrar: the one way into the wake thread, and the thread that makes a v1 job's threshold
//! writes, so that the owner task never waits for them.
//!
//! The kernel registers each v1 memory threshold (a write to `cgroup.event_control`) under an RCU
//! grace period (`synchronize_rcu` in `mem_cgroup_usage_register_event`): a job's two dozen
//! thresholds took 100 to 230 ms on this 2-core machine with a hog running (BENCHMARKS.md). Made on
//! the owner task, that stopped every probe, reflex arm and control request for as long, at each
//! attach and each change of a limit. Here they are made on a thread of their own; the owner task
//! goes on probing the job (it is not watched yet, though its reflex is armed: the thresholds it
//! fires on are live from their own writes) and hears when they are done
//! ([`Wakers::take_registered`](super::Wakers::take_registered), its `Notify`). The wake thread
//! polls the job's eventfd before the first write, and the thresholds are written the reflex's line
//! and those past it first, then the rest nearest above the job's usage, so that each wakes the
//! owner task from its own write on and the reflex is live at its line from the first: 20 took 250
//! to 300 ms here, and a job growing at 1 GiB/s from its first task crossed half its 300 MiB limit
//! before the last was written, with nothing to wake its owner (the Slurm job of
//! `tests/slurm_word.rs`, OOM-killed in 3 of 15 runs that way).
//!
//! The first write waits for the removal of the cgroup's earlier thresholds, a previous watch's
//! (another job's on the same cgroup, or this one's before its limit changed), one grace period
//! each: hundreds of ms, in which a job growing at 4 GiB/s from its attach reached its line with
//! none of its own in, and was stopped by the owner's probe or not at all (3 of 20 OOM-killed,
//! BENCHMARKS.md). So until the last is in, the wake thread also reads the job's usage on its own
//! timer, as it reads a v2 job's ([`UsageReads::to_the_line`]).
//!
//! Every command for the wake thread passes through this thread's queue, in the order it was
//! given, so a job's later watch, or its unwatch, never overtakes an earlier registration. A
//! registration that a later order of the same job makes moot (its thresholds asked again, its
//! watches dropped) stops before its next write: a job let go of while its thresholds register
//! no longer holds the next job's registration, and its reads, behind two dozen grace periods.

use std::collections::VecDeque;
use std::io::Write as _;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Instant;

use tokio::sync::Notify;

use super::reads::UsageReads;
use super::{Cmd, Kind};

/// What the registrar is given.
pub(super) enum Order {
    /// Passed on to the wake thread as it is.
    Forward(Cmd),
    /// A v1 job's thresholds to register, then watch.
    Thresholds(Thresholds),
}

/// A v1 job's thresholds, with what they are registered on (opened by the caller, so that a cgroup
/// without the files is told at once).
pub(super) struct Thresholds {
    pub(super) job: String,
    pub(super) generation: u64,
    pub(super) efd: OwnedFd,
    pub(super) usage: std::fs::File,
    pub(super) control: PathBuf,
    pub(super) thresholds: Vec<u64>,
    /// The critical line (one of `thresholds`: the reflex's, registered first) and the limit,
    /// bytes, where the limit is known.
    pub(super) line: Option<(u64, u64)>,
}

impl Order {
    /// Whether this order, given after a registration of `job`'s thresholds, makes the rest of it
    /// moot: `job`'s thresholds asked again, or its watches dropped.
    fn supersedes(&self, job: &str) -> bool {
        match self {
            Order::Thresholds(t) => t.job == job,
            Order::Forward(Cmd::Unwatch(Some(j))) => j == job,
            Order::Forward(_) => false,
        }
    }
}

/// A registration that finished: its job, the generation it was asked with
/// ([`Wakers::watch_v1_thresholds`](super::Wakers::watch_v1_thresholds)), and whether the kernel took
/// every threshold (the wake thread watches them from the first write on, and stops where one fails).
#[derive(Debug)]
pub struct Registered {
    /// The job.
    pub job: String,
    /// The generation it was asked with.
    pub generation: u64,
    /// `Ok` when every threshold was registered (the wake thread watches them).
    pub result: std::io::Result<()>,
}

/// What the registrar and the wake thread tell the owner task: the registrations finished and not
/// yet taken, whether the wake thread has ended, and who is told of each.
pub(super) struct Finished {
    pub(super) list: Mutex<Vec<Registered>>,
    /// The wake thread ended (its poll failed, or it took no more commands): no notification
    /// reaches the owner and no reflex fires from here on.
    pub(super) ended: AtomicBool,
    pub(super) notify: Arc<Notify>,
}

impl Finished {
    /// Registrations finished, none yet, told to `notify`.
    pub(super) fn new(notify: Arc<Notify>) -> Finished {
        Finished {
            list: Mutex::new(Vec::new()),
            ended: AtomicBool::new(false),
            notify,
        }
    }

    /// The wake thread ended: told once to the owner task, which probes every job from then on.
    pub(super) fn end(&self) {
        if !self.ended.swap(true, Ordering::AcqRel) {
            self.notify.notify_one();
        }
    }
}

/// Marks the wake thread's end on [`Finished`] when dropped: held by the wake thread for its whole
/// run, so that any way out of it (a failed poll, its kick closed, a panic) is told.
pub(super) struct Ends(pub(super) Arc<Finished>);

impl Drop for Ends {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// The registrar's loop: each order in turn, until the owner's handle is dropped or the wake thread
/// ends. A command waits for room in the wake thread's queue (it takes them all at each turn, and
/// each one kicks it), so none is dropped while the wake thread lives; once it has ended, the
/// registrar ends too, and each later order is refused (`BrokenPipe`) rather than taken for a
/// watch.
pub(super) fn run(
    orders: mpsc::Receiver<Order>,
    wake: mpsc::SyncSender<Cmd>,
    kick: Arc<OwnedFd>,
    finished: Arc<Finished>,
) {
    let forward = |cmd: Cmd| match wake.send(cmd) {
        Ok(()) => {
            let _ = nix::unistd::write(&*kick, &[1u8]);
            true
        }
        Err(_) => {
            tracing::warn!("the wake thread takes no more commands; every job is probed");
            finished.end();
            false
        }
    };
    // Orders taken from the channel while a registration was being written, in their order.
    let mut pending: VecDeque<Order> = VecDeque::new();
    while let Some(order) = pending.pop_front().or_else(|| orders.recv().ok()) {
        match order {
            Order::Forward(cmd) => {
                forward(cmd);
            }
            Order::Thresholds(t) => {
                let started = Instant::now();
                let (job, count, generation) = (t.job.clone(), t.thresholds.len(), t.generation);
                // Asked again, or let go of, since: the rest is not written (the kernel removes
                // what was with the eventfd), and what was asked next starts a grace period sooner.
                let superseded = || {
                    pending.extend(orders.try_iter());
                    pending.iter().any(|o| o.supersedes(&job))
                };
                let result = watch_then_register(t, &forward, superseded);
                tracing::debug!(
                    job,
                    thresholds = count,
                    took_ms = started.elapsed().as_secs_f64() * 1000.0,
                    ok = result.is_ok(),
                    "v1 thresholds registered"
                );
                if let Ok(mut list) = finished.list.lock() {
                    list.push(Registered {
                        job,
                        generation,
                        result,
                    });
                }
                finished.notify.notify_one();
            }
        }
        if finished.ended.load(Ordering::Acquire) {
            return;
        }
    }
}

/// Hands the job's eventfd to the wake thread first, then writes each threshold to the cgroup's
/// `cgroup.event_control`, the reflex's line and those past it first, then the rest nearest the
/// usage first ([`in_order`]): each threshold wakes the owner from its own write on, not from the
/// last one's, 10 to 20 ms of RCU grace period apart (hundreds of ms where a previous watch's
/// thresholds on the cgroup are still being removed, each under a grace period of its own). A job
/// that grows from its first task on crosses half its limit while its last thresholds are still
/// being written; the reflex is live at its line from the first write, the owner probes the job
/// until the last. Where a write fails, the watch is dropped (the kernel removes the
/// thresholds written with the eventfd's close) and the job is probed, as any job not watched.
fn watch_then_register(
    t: Thresholds,
    forward: &impl Fn(Cmd) -> bool,
    mut superseded: impl FnMut() -> bool,
) -> std::io::Result<()> {
    let (efd, usage) = (t.efd.try_clone()?, t.usage.try_clone()?);
    let usage_file = t.control.with_file_name("memory.usage_in_bytes");
    let now = crate::sample::keyed::read_u64(&usage_file);
    let order = in_order(
        &t.thresholds,
        now.ok(),
        t.line.map(|(critical, _)| critical),
    );
    if !forward(Cmd::Watch(
        Some(t.job.clone()),
        vec![t.efd, t.usage.into()],
        Kind::Eventfd,
    )) {
        return Err(std::io::Error::other(
            "the wake thread does not take commands",
        ));
    }
    // Until the last threshold is in, the wake thread reads the usage on its own timer, as it
    // does a v2 job's: the first write waits for the removal of the cgroup's earlier thresholds
    // (a previous watch's, one grace period each), and a job growing meanwhile would reach its
    // line with none of its own live.
    let read = t.line.is_some_and(|(critical, limit)| {
        forward(Cmd::Reads(
            UsageReads::new(&t.job, &usage_file, &t.thresholds, critical, limit).to_the_line(),
        ))
    });
    let written = std::fs::OpenOptions::new()
        .write(true)
        .open(&t.control)
        .and_then(|mut control| {
            order.iter().try_for_each(|th| {
                if superseded() {
                    return Err(std::io::Error::other(
                        "asked again or let go of before the last threshold",
                    ));
                }
                control
                    .write_all(format!("{} {} {th}", efd.as_raw_fd(), usage.as_raw_fd()).as_bytes())
            })
        });
    if written.is_err() {
        forward(Cmd::Unwatch(Some(t.job)));
    } else if read {
        forward(Cmd::OverTheLineOnly(t.job));
    }
    written
}

/// `thresholds` in the order they are registered: those above `usage` and at or past the reflex's
/// `line` from the nearest up (the reflex fires on them), then the rest above `usage` from the
/// nearest up, then those at or below it from the nearest down (each the next the job's usage
/// crosses, growing or shrinking); the usage is taken as 0 where it is not known.
fn in_order(thresholds: &[u64], usage: Option<u64>, line: Option<u64>) -> Vec<u64> {
    let mut sorted = thresholds.to_vec();
    sorted.sort_unstable();
    let (below, above) = sorted.split_at(usage.map_or(0, |u| sorted.partition_point(|t| *t <= u)));
    let (short, past) = above.split_at(line.map_or(0, |l| above.partition_point(|t| *t < l)));
    past.iter()
        .chain(short)
        .chain(below.iter().rev())
        .copied()
        .collect()
}

#[cfg(test)]
#[path = "register_tests.rs"]
mod tests;
