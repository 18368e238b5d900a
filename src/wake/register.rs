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

/// Registrations finished and not yet taken, and who is told of each.
pub(super) struct Finished {
    pub(super) list: Mutex<Vec<Registered>>,
    pub(super) notify: Arc<Notify>,
}

/// The registrar's loop: each order in turn, until the owner's handle is dropped.
pub(super) fn run(
    orders: mpsc::Receiver<Order>,
    wake: mpsc::SyncSender<Cmd>,
    kick: Arc<OwnedFd>,
    finished: Arc<Finished>,
) {
    let forward = |cmd: Cmd| match wake.try_send(cmd) {
        Ok(()) => {
            let _ = nix::unistd::write(&*kick, &[1u8]);
            true
        }
        Err(e) => {
            tracing::warn!(error = %e, "the wake thread does not take commands; polling only for this watch");
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
mod tests {
    use std::io::Read as _;
    use std::sync::Arc;
    use std::time::Duration;

    use crate::wake::Wakers;

    /// A cgroup directory whose `cgroup.event_control` is a FIFO: a writer's open waits until a
    /// reader opens it, as a slow registration holds its writer.
    fn slow_cgroup() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("memory.usage_in_bytes"), "0\n").unwrap();
        nix::unistd::mkfifo(
            &d.path().join("cgroup.event_control"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        d
    }

    #[test]
    fn a_registration_that_waits_holds_neither_its_caller_nor_a_later_one_out_of_order_and_one_asked_again_is_not_written()
     {
        let d = slow_cgroup();
        let registered = Arc::new(tokio::sync::Notify::new());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let wakers = Wakers::start(
            Arc::new(tokio::sync::Notify::new()),
            Arc::default(),
            Arc::default(),
            registered.clone(),
            0,
        )
        .unwrap();
        // Asked from another thread, so that a call that waited for the registration would show as
        // no answer rather than as a test that never ends.
        let (tx, rx) = std::sync::mpsc::channel();
        let dir = d.path().to_owned();
        let wakers = std::thread::spawn(move || {
            let asked = wakers.watch_v1_thresholds("a", &dir, &[100, 200, 300], None, 7);
            let other = wakers.watch_v1_thresholds("b", &dir, &[400], None, 8);
            let again = wakers.watch_v1_thresholds("b", &dir, &[500], None, 9);
            tx.send((asked.is_ok(), other.is_ok() && again.is_ok()))
                .unwrap();
            wakers
        });
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(60)),
            Ok((true, true)),
            "asked, while nothing reads the control file"
        );
        let wakers = wakers.join().unwrap();
        assert!(
            wakers.take_registered().is_empty(),
            "nothing is registered yet"
        );

        // The kernel's side: the registrations' writes, read until both are done.
        let fifo = d.path().join("cgroup.event_control");
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || {
                // One open for the writers all (read and write: the FIFO never ends, nor is a
                // writer's open met by a reader just closing, whose writes would fail).
                let mut f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&fifo)
                    .unwrap();
                let (mut text, mut buf) = (String::new(), [0u8; 4096]);
                while !text.ends_with(" 500") {
                    let n = f.read(&mut buf).unwrap();
                    text.push_str(std::str::from_utf8(&buf[..n]).unwrap());
                }
                text
            })
        };
        let mut done = Vec::new();
        while done.len() < 3 {
            let told = rt.block_on(async {
                tokio::time::timeout(Duration::from_secs(60), registered.notified()).await
            });
            assert!(told.is_ok(), "not told: {done:?}");
            done.extend(wakers.take_registered());
        }
        let got: Vec<(&str, u64, bool)> = done
            .iter()
            .map(|r| (r.job.as_str(), r.generation, r.result.is_ok()))
            .collect();
        assert_eq!(
            got,
            [("a", 7, true), ("b", 8, false), ("b", 9, true)],
            "in order, b's first asked again before its first write"
        );
        let text = reader.join().unwrap();
        // Three writes of "<eventfd> <usage fd> <bytes>" for generation 7, none for 8 (asked
        // again), then one for 9.
        let words: Vec<&str> = text.split(' ').collect();
        let (efd, usage) = (words[0], words[1]);
        let first = format!("{efd} {usage} 100{efd} {usage} 200{efd} {usage} 300");
        assert!(text.starts_with(&first), "{text}");
        assert!(!text.contains(" 400"), "{text}");
        assert!(text.ends_with(" 500") && text.len() > first.len(), "{text}");
    }

    #[test]
    fn thresholds_are_registered_from_the_line_up_then_nearest_the_usage_first() {
        use super::in_order;
        let t = [150, 255, 285, 288, 297];
        // A job at its start: the reflex's line and those past it first, then half its limit
        // (the one it crosses first of the rest).
        assert_eq!(in_order(&t, Some(3), Some(285)), [285, 288, 297, 150, 255]);
        // Without a line: the one it crosses first is written first.
        assert_eq!(in_order(&t, Some(3), None), [150, 255, 285, 288, 297]);
        // A job at 286 whose limit changed: up from 288, then down from 285.
        assert_eq!(
            in_order(&t, Some(286), Some(285)),
            [288, 297, 285, 255, 150]
        );
        // At a threshold: it lies below (crossed on the way down).
        assert_eq!(in_order(&t, Some(285), None), [288, 297, 285, 255, 150]);
        // Between half and the line: the line up, then the warning under it, then down.
        assert_eq!(
            in_order(&t, Some(200), Some(285)),
            [285, 288, 297, 255, 150]
        );
        assert_eq!(in_order(&t, None, Some(285)), [285, 288, 297, 150, 255]);
        assert_eq!(in_order(&t, None, None), t);
    }

    #[test]
    fn a_jobs_usage_is_read_until_its_thresholds_are_in_so_that_its_reflex_fires_before_any_is() {
        use crate::reflex::tests::{MIB, v1_reflex};
        let d = slow_cgroup();
        let usage = d.path().join("memory.usage_in_bytes");
        let state = d.path().join("freezer.state");
        let armory = Arc::new(crate::reflex::Armory::default());
        armory.arm(v1_reflex("job", d.path()));
        let registered = Arc::new(tokio::sync::Notify::new());
        let wakers = Wakers::start(
            Arc::new(tokio::sync::Notify::new()),
            Arc::default(),
            armory.clone(),
            registered,
            0,
        )
        .unwrap();
        let thresholds = [500 * MIB, 800 * MIB, 950 * MIB, 951 * MIB];
        wakers
            .watch_v1_thresholds(
                "job",
                d.path(),
                &thresholds,
                Some((950 * MIB, 1000 * MIB)),
                1,
            )
            .unwrap();
        // The registrar waits at the control file's open (a FIFO no one reads): no threshold is
        // written, and the job grows past its line.
        std::fs::write(&usage, format!("{}\n", 990 * MIB)).unwrap();
        // What fired is recorded after the freeze is written: wait on the record, not the state.
        let t = std::time::Instant::now();
        let fired = loop {
            let fired = armory.take_fired();
            if !fired.is_empty() {
                break fired;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the reflex did not fire while the thresholds registered"
            );
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(std::fs::read_to_string(&state).unwrap(), "FROZEN");
        assert_eq!(fired.len(), 1);
        assert_eq!(fired[0].unreclaimable(), 990 * MIB);
        assert!(wakers.take_registered().is_empty(), "registered already");
        // The writes go through once read: each threshold.
        let mut text = String::new();
        std::fs::File::open(d.path().join("cgroup.event_control"))
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        let words: Vec<&str> = text.split(' ').collect();
        let (efd, fd) = (words[0], words[1]);
        let writes = |order: [u64; 4]| -> String {
            order
                .iter()
                .map(|m| format!("{efd} {fd} {}", m * MIB))
                .collect()
        };
        // By the usage the registrar read at its start: 10 MiB (the line up first) or 990 MiB,
        // where the job grew before it (down from the line).
        assert!(
            text == writes([950, 951, 500, 800]) || text == writes([951, 950, 800, 500]),
            "{text}"
        );
        let t = std::time::Instant::now();
        while wakers.take_registered().is_empty() {
            assert!(t.elapsed() < Duration::from_secs(10), "never registered");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_registrar_held_by_a_registration_fills_its_queue_and_a_dropped_order_is_an_error_until_it_drains()
     {
        let d = slow_cgroup();
        std::fs::write(d.path().join("memory.current"), "0\n").unwrap();
        let wakers = Wakers::start(
            Arc::new(tokio::sync::Notify::new()),
            Arc::default(),
            Arc::default(),
            Arc::new(tokio::sync::Notify::new()),
            0,
        )
        .unwrap();
        // The registrar takes this one and waits at the control file's open (a FIFO no one reads),
        // as it waits for the kernel's grace periods.
        wakers
            .watch_v1_thresholds("held", d.path(), &[100], None, 1)
            .unwrap();
        let read = |job: &str| wakers.read_usage(job, d.path(), &[100, 200], 150, 200);
        let queued = super::super::COMMANDS_QUEUED;
        let mut taken = 0;
        let dropped = loop {
            match read(&format!("job{taken}")) {
                Ok(()) => taken += 1,
                Err(e) => break e,
            }
            assert!(
                taken <= queued + 1,
                "{taken} orders taken by a held registrar"
            );
        };
        assert_eq!(dropped.kind(), std::io::ErrorKind::WouldBlock, "{dropped}");
        assert!(dropped.to_string().contains("queue is full"), "{dropped}");
        // Its queue holds them all, and one more where the registrar took the first order late.
        assert!(taken >= queued, "only {taken} queued");
        assert_eq!(
            read("again").map_err(|e| e.kind()),
            Err(std::io::ErrorKind::WouldBlock),
            "still held"
        );

        // The registration goes through (its write is read): the queue drains and takes orders.
        let fifo = d.path().join("cgroup.event_control");
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            std::fs::File::open(&fifo)
                .unwrap()
                .read_to_string(&mut text)
                .unwrap();
            text
        });
        let t = std::time::Instant::now();
        while let Err(e) = read("after") {
            assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}");
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the queue never drained"
            );
            std::thread::yield_now();
        }
        assert!(reader.join().unwrap().ends_with(" 100"));
    }

    #[test]
    fn a_cgroup_without_the_control_file_is_told_at_once() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("memory.usage_in_bytes"), "0\n").unwrap();
        let wakers = Wakers::start(
            Arc::new(tokio::sync::Notify::new()),
            Arc::default(),
            Arc::default(),
            Arc::new(tokio::sync::Notify::new()),
            0,
        )
        .unwrap();
        let e = wakers
            .watch_v1_thresholds("job", d.path(), &[100], None, 1)
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
        assert!(wakers.take_registered().is_empty());
    }
}
