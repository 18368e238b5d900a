//! Waking on the kernel's own notifications instead of polling for them.
//!
//! - cgroup v1: memory thresholds (`cgroup.event_control` with an eventfd on `memory.usage_in_bytes`).
//!   The kernel checks them every 128 page events per CPU, so a crossing is told within about half a
//!   megabyte of growth: well under a millisecond at 1 GiB/s.
//! - cgroup v2 and the host: PSI triggers (`memory.pressure`, `/proc/pressure/memory`), which the
//!   kernel raises with POLLPRI once stall time in a window passes the trigger's threshold. Their
//!   window is 500 ms at least (2 s, and a multiple of it, without CAP_SYS_RESOURCE; the daemon asks
//!   for 100 ms in 2 s), so they wake fast probing; they cannot stop a fast OOM by themselves.
//!
//! cgroup v2 has no usage thresholds: for a v2 job with a limit this thread reads `memory.current`
//! itself, timed by the room left to its critical line (the poll's timeout), and a read that finds
//! usage across one of the engine's lines wakes the owner task as v1's eventfd would ([`reads`]).
//!
//! A job whose stop at critical is armed ahead (`crate::reflex`) is stopped by this thread itself,
//! before the owner task is woken: on v1 right after the read of its threshold's eventfd, on v2 at
//! the read that finds it over its line.
//!
//! One thread polls every descriptor and wakes the owner task, which probes at once: wake-ups coalesce
//! into one pending permit (a `Notify`), so a storm of crossings costs one probe and no memory. Polling
//! stays, as the fallback and for growth rates (prediction). Every notification is counted by source
//! ([`Notified`], `memwatch_kernel_notifications_total`), and the first of each watch is logged, so
//! that a machine shows whether its kernel's triggers reach the daemon at all.

use std::collections::HashMap;
use std::io::Write as _;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};

use tokio::sync::Notify;

pub mod firers;
pub mod reads;
pub mod register;

use reads::UsageReads;
use register::{Finished, Order, Registered, Thresholds};

/// What a watch is for: the job it concerns (its name) or the host (`None`).
pub type Key = Option<String>;

enum Cmd {
    Watch(Key, Vec<OwnedFd>, Kind),
    Reads(UsageReads),
    /// The job's reads are made from now on only while it is over its line by its page cache
    /// (a v1 job's, its thresholds in: [`UsageReads::over_the_line_only`]); its other watches stay.
    OverTheLineOnly(String),
    Unwatch(Key),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// An eventfd: readable (8 bytes) on each notification.
    Eventfd,
    /// A PSI trigger: POLLPRI.
    Psi,
}

/// Kernel notifications received, by source; shared with `/metrics`.
#[derive(Debug, Default)]
pub struct Notified {
    host_psi: AtomicU64,
    job_psi: AtomicU64,
    job_threshold: AtomicU64,
    job_usage_read: AtomicU64,
}

impl Notified {
    /// `(source, count)` for each source: `host_psi` (/proc/pressure/memory), `job_psi` (a job
    /// cgroup's memory.pressure), `job_threshold` (a v1 memory threshold's eventfd),
    /// `job_usage_read` (this thread's read of a job's usage across one of its lines: a v2 job's,
    /// and a v1 job's while its thresholds register).
    pub fn snapshot(&self) -> [(&'static str, u64); 4] {
        [
            ("host_psi", self.host_psi.load(Ordering::Relaxed)),
            ("job_psi", self.job_psi.load(Ordering::Relaxed)),
            ("job_threshold", self.job_threshold.load(Ordering::Relaxed)),
            (
                "job_usage_read",
                self.job_usage_read.load(Ordering::Relaxed),
            ),
        ]
    }

    /// The notifications about jobs so far (their PSI triggers, thresholds and v2 reads across a
    /// line): counted before the owner task is woken, so a wake that finds this unchanged was the
    /// host's alone.
    pub fn jobs(&self) -> u64 {
        self.job_psi.load(Ordering::Acquire)
            + self.job_threshold.load(Ordering::Acquire)
            + self.job_usage_read.load(Ordering::Acquire)
    }

    fn count(&self, key: &Key, kind: Kind) -> u64 {
        let c = match (key, kind) {
            (None, _) => &self.host_psi,
            (Some(_), Kind::Psi) => &self.job_psi,
            (Some(_), Kind::Eventfd) => &self.job_threshold,
        };
        c.fetch_add(1, Ordering::Release) + 1
    }
}

/// The handle the owner task keeps: add and drop watches; notifications wake the `Notify` given to
/// [`Wakers::start`]. Commands reach the wake thread through the registrar ([`register`]), in order.
pub struct Wakers {
    tx: mpsc::SyncSender<Order>,
    /// Writing a byte here interrupts the wake thread's poll so it picks up new commands.
    kick: Arc<OwnedFd>,
    /// v1 registrations the registrar finished.
    finished: Arc<Finished>,
}

impl Wakers {
    /// Starts the polling thread and the registrar; each notification wakes `out` and is counted in
    /// `counts`; a v1 threshold's crossing first fires the job's reflex in `armory`, if one is armed;
    /// each finished v1 registration wakes `registered`.
    /// The wake thread runs at real-time `priority` (SCHED_FIFO; 0: the daemon's own), where the
    /// kernel allows it ([`realtime`]).
    pub fn start(
        out: Arc<Notify>,
        counts: Arc<Notified>,
        armory: Arc<crate::reflex::Armory>,
        registered: Arc<Notify>,
        priority: u8,
    ) -> std::io::Result<Wakers> {
        let (read, write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)?;
        let kick = Arc::new(write);
        let (wake_tx, wake_rx) = mpsc::sync_channel(COMMANDS_QUEUED);
        let finished = Arc::new(Finished::new(registered));
        let ends = register::Ends(finished.clone());
        std::thread::Builder::new()
            .name("wake".into())
            .spawn(move || {
                let _ends = ends;
                match realtime(priority) {
                    Ok(()) if priority > 0 => {
                        tracing::debug!(priority, "the wake thread runs at real-time priority")
                    }
                    Ok(()) => {}
                    Err(e) => tracing::info!(
                        priority,
                        error = %e,
                        "the wake thread runs at the daemon's priority: real-time scheduling refused (policy.reflex_priority; CAP_SYS_NICE or LimitRTPRIO)"
                    ),
                }
                // A firer on each CPU, so that a v1 job's crossing fires its reflex from the
                // CPU it grows on ([`firers`]).
                let (a, o) = (armory.clone(), out.clone());
                let fire: firers::Fire = Arc::new(move |job: &str, woke, usage| {
                    let crossed = a.threshold_crossing(job, woke, usage);
                    if matches!(crossed, crate::reflex::Crossing::Fired) {
                        a.let_it_stop();
                        o.notify_one();
                    }
                });
                let firers = match firers::Firers::start(priority, fire) {
                    Ok(f) => {
                        tracing::debug!(firers = f.count(), "a reflex firer on each CPU");
                        Some(f)
                    }
                    Err(e) => {
                        tracing::info!(error = %e, "no reflex firers: the wake thread alone fires a v1 job's reflex");
                        None
                    }
                };
                run(read, wake_rx, out, &counts, &armory, firers)
            })?;
        Ok(Wakers::with_registrar(kick, wake_tx, finished)?.0)
    }

    /// Starts the registrar in front of the wake thread's queue `wake` (kicked through `kick`),
    /// telling `finished`: the owner's handle, and the registrar's thread.
    fn with_registrar(
        kick: Arc<OwnedFd>,
        wake: mpsc::SyncSender<Cmd>,
        finished: Arc<Finished>,
    ) -> std::io::Result<(Wakers, std::thread::JoinHandle<()>)> {
        let (tx, rx) = mpsc::sync_channel(COMMANDS_QUEUED);
        let (k, f) = (kick.clone(), finished.clone());
        let registrar = std::thread::Builder::new()
            .name("wake-register".into())
            .spawn(move || register::run(rx, wake, k, f))?;
        Ok((Wakers { tx, kick, finished }, registrar))
    }

    /// Queues an order for the registrar; never waits (a full queue means a thread is stuck: the
    /// order is dropped and polling covers what it was for until it is asked again). `Err` when
    /// dropped, so that a watch that was never handed over is not taken for one.
    /// A full queue is `WouldBlock` (the registrar is behind: asking again later may be taken), an
    /// ended thread `BrokenPipe`.
    fn order(&self, order: Order) -> std::io::Result<()> {
        self.tx.try_send(order).map_err(|e| match e {
            mpsc::TrySendError::Full(_) => std::io::Error::new(
                std::io::ErrorKind::WouldBlock,
                format!(
                    "the wake thread's queue is full ({COMMANDS_QUEUED} orders wait for its registrar)"
                ),
            ),
            mpsc::TrySendError::Disconnected(_) => {
                tracing::warn!("the wake thread's registrar ended; polling only");
                std::io::Error::new(
                    std::io::ErrorKind::BrokenPipe,
                    "the wake thread's registrar ended",
                )
            }
        })
    }

    fn send(&self, cmd: Cmd) -> std::io::Result<()> {
        self.order(Order::Forward(cmd))
    }

    /// Watches a v1 memory cgroup: notified whenever usage crosses one of `thresholds` (bytes), up or
    /// down. Replaces the job's earlier watch. The files are opened here (an error is told now); the
    /// registrar hands the watch to the wake thread, registers the thresholds one by one, each live
    /// from its own write, the reflex's line and those past it first (`line`: the critical line and
    /// the limit, bytes, where known; the wake thread reads the job's usage against them until the
    /// last is in), and tells, as `generation`, that it is done ([`Wakers::take_registered`]).
    /// `Ok`: asked.
    pub fn watch_v1_thresholds(
        &self,
        job: &str,
        dir: &Path,
        thresholds: &[u64],
        line: Option<(u64, u64)>,
        generation: u64,
    ) -> std::io::Result<()> {
        let efd = eventfd()?;
        let usage = std::fs::File::open(dir.join("memory.usage_in_bytes"))?;
        let control = dir.join("cgroup.event_control");
        std::fs::metadata(&control)?;
        self.order(Order::Thresholds(Thresholds {
            job: job.to_owned(),
            generation,
            efd,
            usage,
            control,
            thresholds: thresholds.to_vec(),
            line,
        }))
    }

    /// Whether the wake thread has ended (its poll failed, or it panicked): from then on no
    /// notification comes and no reflex fires, so the owner probes every job. Told once to the
    /// `Notify` given to [`Wakers::start`] for finished registrations.
    pub fn ended(&self) -> bool {
        self.finished.ended.load(Ordering::Acquire)
    }

    /// The v1 registrations finished since the last call.
    pub fn take_registered(&self) -> Vec<Registered> {
        self.finished
            .list
            .lock()
            .map(|mut l| std::mem::take(&mut *l))
            .unwrap_or_default()
    }

    /// A PSI trigger on `pressure_file` (a cgroup's `memory.pressure` or `/proc/pressure/memory`):
    /// notified when "some" stall time passes `stall_us` within `window_us`.
    pub fn watch_psi(
        &self,
        key: Key,
        pressure_file: &Path,
        stall_us: u64,
        window_us: u64,
    ) -> std::io::Result<()> {
        // A user's own cgroup (delegated) is written with that user's rights; the kernel then
        // takes a window that is a multiple of 2 s, as the daemon asks.
        let mut f = crate::delegated::open_write(pressure_file, true, nix::libc::O_NONBLOCK)?;
        // The trigger string must be written with its terminating NUL in one write.
        f.write_all(format!("some {stall_us} {window_us}\0").as_bytes())?;
        self.send(Cmd::Watch(key, vec![f.into()], Kind::Psi))
    }

    /// Reads a v2 memory cgroup's usage on the thread's own timer against `thresholds` (bytes), the
    /// critical line among them at `critical_bytes` of `limit_bytes`: notified whenever a read finds
    /// usage across one of them, up or down ([`reads`]). Replaces the job's earlier reads.
    pub fn read_usage(
        &self,
        job: &str,
        dir: &Path,
        thresholds: &[u64],
        critical_bytes: u64,
        limit_bytes: u64,
    ) -> std::io::Result<()> {
        // Opened once here so that a cgroup without the file is told now, not at each read.
        std::fs::File::open(dir.join("memory.current"))?;
        self.send(Cmd::Reads(UsageReads::new(
            job,
            &dir.join("memory.current"),
            thresholds,
            critical_bytes,
            limit_bytes,
        )))
    }

    /// Interrupts the thread's poll so it looks at a reflex just armed (a v2 job's usage is read at
    /// once).
    pub fn rearm(&self) {
        let _ = nix::unistd::write(&*self.kick, &[1u8]);
    }

    /// Drops the job's watches (the kernel removes a threshold when its eventfd closes).
    pub fn unwatch(&self, job: &str) {
        if let Err(e) = self.send(Cmd::Unwatch(Some(job.to_owned()))) {
            tracing::warn!(job, error = %e, "the wake thread keeps this job's watch until an order for the job replaces it");
        }
    }
}

pub use crate::sample::kept::on_kernel_fs;

/// The wake thread's place, taken by a test ([`Wakers::with_test_thread`]): the commands the
/// registrar forwards to it, and its end, which dropping this is (as a failed poll or a panic ends
/// the real one).
#[cfg(test)]
pub(crate) struct TestWakeThread {
    commands: mpsc::Receiver<Cmd>,
    _ends: register::Ends,
    _kicked: OwnedFd,
}

#[cfg(test)]
impl Wakers {
    /// The owner's handle over a registrar of its own, as [`Wakers::start`] makes it, whose wake
    /// thread is the test's: `room` commands of room in its queue, and `registered` told of each
    /// finished registration and of the thread's end. Also the registrar's thread.
    pub(crate) fn with_test_thread(
        room: usize,
        registered: Arc<Notify>,
    ) -> (Wakers, TestWakeThread, std::thread::JoinHandle<()>) {
        let (wake, commands) = mpsc::sync_channel(room);
        let (kicked, kick) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
                .expect("a pipe");
        let finished = Arc::new(Finished::new(registered));
        let thread = TestWakeThread {
            commands,
            _ends: register::Ends(finished.clone()),
            _kicked: kicked,
        };
        let (wakers, registrar) =
            Wakers::with_registrar(Arc::new(kick), wake, finished).expect("a registrar");
        (wakers, thread, registrar)
    }
}

fn eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: plain syscall; a non-negative return is a new descriptor we own.
    let fd = unsafe { nix::libc::eventfd(0, nix::libc::EFD_CLOEXEC | nix::libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

struct Watch {
    fds: Vec<OwnedFd>,
    kind: Kind,
    /// Notifications from this watch so far.
    seen: u64,
}

/// Commands that may wait for the wake thread (it takes them all at each turn).
const COMMANDS_QUEUED: usize = 256;

/// Puts the calling thread in SCHED_FIFO at `priority` (none at 0), so that it runs the moment the
/// kernel wakes it, ahead of every thread of the normal policy, a job's busy ones among them. It
/// sleeps but for the short work of a notification. The kernel refuses without CAP_SYS_NICE or an
/// RLIMIT_RTPRIO of at least `priority` (or with real-time group scheduling and no budget for the
/// daemon's cgroup): the thread then keeps the daemon's policy, and the error says why.
pub fn realtime(priority: u8) -> std::io::Result<()> {
    if priority == 0 {
        return Ok(());
    }
    let param = nix::libc::sched_param {
        sched_priority: i32::from(priority),
    };
    // SAFETY: sched_setscheduler(2) on the calling thread (pid 0) with a parameter that lives
    // across the call; it changes nothing but this thread's scheduling.
    let rc = unsafe { nix::libc::sched_setscheduler(0, nix::libc::SCHED_FIFO, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn run(
    kick: OwnedFd,
    rx: mpsc::Receiver<Cmd>,
    out: Arc<Notify>,
    counts: &Notified,
    armory: &crate::reflex::Armory,
    mut firers: Option<firers::Firers>,
) {
    let mut watches: HashMap<Key, Watch> = HashMap::new();
    let mut reads: HashMap<String, (UsageReads, u64)> = HashMap::new();
    let mut kicked = false;
    loop {
        while let Ok(cmd) = rx.try_recv() {
            match cmd {
                Cmd::Watch(key, fds, kind) => {
                    if let (Some(f), Some(job)) = (firers.as_mut(), &key) {
                        match (kind, fds.first(), fds.get(1)) {
                            (Kind::Eventfd, Some(efd), Some(usage)) => f.watch(job, efd, usage),
                            _ => f.unwatch(job),
                        }
                    }
                    watches.insert(key, Watch { fds, kind, seen: 0 });
                }
                Cmd::Reads(r) => {
                    reads.insert(r.job().to_owned(), (r, 0));
                }
                Cmd::OverTheLineOnly(job) => {
                    if let Some((r, _)) = reads.get_mut(&job) {
                        r.over_the_line_only();
                    }
                }
                Cmd::Unwatch(key) => {
                    if let Some(job) = &key {
                        reads.remove(job);
                        if let Some(f) = firers.as_mut() {
                            f.unwatch(job);
                        }
                    }
                    watches.remove(&key);
                }
            }
        }
        if std::mem::take(&mut kicked) {
            // A reflex armed or changed: read each job now, so that one already over its line
            // is stopped at once (a v1 job's reads over the line only: one read, which goes on
            // only where the job's cache holds it under its line).
            for (r, _) in reads.values_mut() {
                r.read_now();
            }
        }
        let mut keys: Vec<Key> = Vec::new();
        let mut polls = vec![nix::libc::pollfd {
            fd: kick.as_raw_fd(),
            events: nix::libc::POLLIN,
            revents: 0,
        }];
        for (key, w) in &watches {
            let fd: RawFd = match w.fds.first() {
                Some(fd) => fd.as_raw_fd(),
                None => continue,
            };
            keys.push(key.clone());
            polls.push(nix::libc::pollfd {
                fd,
                events: match w.kind {
                    Kind::Eventfd => nix::libc::POLLIN,
                    Kind::Psi => nix::libc::POLLPRI,
                },
                revents: 0,
            });
        }
        // Until the next read of a job's usage is due, or for ever.
        let timeout = reads
            .values()
            .filter_map(|(r, _)| r.due())
            .min()
            .map(|due| {
                let left = due.saturating_duration_since(std::time::Instant::now());
                nix::libc::timespec {
                    tv_sec: left.as_secs() as nix::libc::time_t,
                    tv_nsec: nix::libc::c_long::from(left.subsec_nanos() as i32),
                }
            });
        let timeout_ptr = timeout
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const nix::libc::timespec);
        // SAFETY: `polls` is a valid array of pollfd for its length; the timeout is null or points
        // to a timespec that lives through the call; no signal mask is given.
        let n = unsafe {
            nix::libc::ppoll(
                polls.as_mut_ptr(),
                polls.len() as nix::libc::nfds_t,
                timeout_ptr,
                std::ptr::null(),
            )
        };
        let woke = std::time::Instant::now();
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            tracing::warn!(error = %std::io::Error::last_os_error(), "kernel notifications stop; polling goes on");
            return;
        }
        if polls[0].revents != 0 {
            kicked = true;
            let mut buf = [0u8; 64];
            while nix::unistd::read(&kick, &mut buf).is_ok_and(|n| n > 0) {}
            if polls[0].revents & (nix::libc::POLLHUP | nix::libc::POLLERR) != 0 {
                return;
            }
        }
        let mut dead = Vec::new();
        for (p, key) in polls[1..].iter().zip(keys) {
            if p.revents == 0 {
                continue;
            }
            if p.revents & (nix::libc::POLLERR | nix::libc::POLLNVAL) != 0 {
                // A PSI trigger's cgroup went away: drop the watch.
                dead.push(key.clone());
                continue;
            }
            if p.revents & nix::libc::POLLIN != 0 {
                let mut count = [0u8; 8];
                // SAFETY: reading 8 bytes into an 8-byte buffer from an eventfd.
                let _ = unsafe { nix::libc::read(p.fd, count.as_mut_ptr().cast(), 8) };
                if let Some(job) = &key {
                    // Over the line by its cache, the job's next threshold may be more of its
                    // growth away than its line (or, at its limit, never crossed): its usage and
                    // cache are read on the thread's timer until it is under its line or stopped.
                    if let crate::reflex::Crossing::Cached(room) = armory.crossing(job, woke)
                        && let Some((r, _)) = reads.get_mut(job)
                    {
                        r.cached(woke, room);
                    }
                }
            }
            // Counted before the owner task wakes: it tells the host's wake from a job's by the
            // counts.
            let counted = watches
                .get_mut(&key)
                .map(|w| (counts.count(&key, w.kind), w));
            armory.let_it_stop();
            out.notify_one();
            if let Some((total, w)) = counted {
                w.seen += 1;
                if w.seen == 1 {
                    let what = match w.kind {
                        Kind::Psi => "a PSI trigger on memory.pressure",
                        Kind::Eventfd => "a memory threshold",
                    };
                    let whose = key.as_deref().unwrap_or("the host");
                    tracing::info!(
                        job = whose,
                        total,
                        "first kernel notification from {what} of {whose}"
                    );
                }
            }
        }
        // The jobs whose read is due (after the thresholds' crossings: a v1 stop first).
        let now = std::time::Instant::now();
        for (r, seen) in reads.values_mut() {
            let turn = r.turn(now, armory);
            if turn.crossed {
                let total = counts.job_usage_read.fetch_add(1, Ordering::Release) + 1;
                *seen += 1;
                if *seen == 1 {
                    tracing::info!(
                        job = r.job(),
                        total,
                        "first read of {}'s usage across one of its lines",
                        r.job()
                    );
                }
            }
            if turn.crossed || turn.fired {
                armory.let_it_stop();
                out.notify_one();
            }
        }
        for key in dead {
            watches.remove(&key);
        }
    }
}
