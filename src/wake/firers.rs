//! A firer on every CPU: a v1 job's threshold crossing fires its reflex from the CPU the job grows on.
//!
//! The kernel signals a v1 threshold's eventfd from the job's own page fault, on the CPU it runs on.
//! A waiter woken on that CPU needs no interrupt: it runs as the fault returns to user mode. The wake
//! thread, though, wakes on the CPU it last ran on. Where that is another CPU, it waits for that CPU
//! to take the wake-up: an idle virtual CPU in its halt may take milliseconds, and a kernel without
//! preemption (`preempt=none`) runs a thread in a system call to its end first, the daemon's own
//! (a state file's rename, a freezer write) among them. Measured on this project's 2-vCPU machine
//! (BENCHMARKS.md): 0.3 to 5.5 ms from a job's crossing to the wake thread running.
//!
//! So each CPU the daemon may run on has a firer pinned to it, at the wake thread's priority,
//! blocked in its own epoll on every v1 job's eventfd (edge-triggered: it never reads the count,
//! which stays the wake thread's). Each crossing wakes every firer; each reads the job's usage
//! (`memory.usage_in_bytes`, kept open) and looks at the job's reflex with it
//! (`reflex::Armory::threshold_crossing`, which fires it at critical, once), unless another firer
//! looked within [`LOOKED`] at as much usage or more: the first to run looks, the others skip, and
//! a crossing further up is looked at again however soon. The wake thread still reads the eventfd
//! and looks after them, as before: the firers only make the stop sooner, never the only way to it.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::event::epoll;

/// A look at a job made this long before a firer's wake-up, at as much usage as the firer reads or
/// more, stands for its own (a crossing wakes every firer; the first looks).
pub const LOOKED: Duration = Duration::from_millis(1);

/// At most this many firers (the CPUs past it rely on the wake thread).
pub const MOST: usize = 256;

/// What a firer calls at a crossing of `job`'s thresholds: the job, when the firer woke, and the
/// usage it read then (bytes).
pub type Fire = Arc<dyn Fn(&str, Instant, u64) + Send + Sync>;

/// The token that tells the firers to stop.
const STOP: u64 = u64::MAX;

struct Watched {
    job: String,
    /// The job's `memory.usage_in_bytes`, open (a duplicate of the wake thread's).
    usage: OwnedFd,
    /// When a firer last looked at this job, in ns since the firers started (0: never).
    looked: AtomicU64,
    /// The usage that look went by, bytes.
    seen: AtomicU64,
}

/// The firers, held by the wake thread; they stop when this is dropped.
pub struct Firers {
    polls: Vec<Arc<OwnedFd>>,
    watched: Arc<Mutex<HashMap<u64, Arc<Watched>>>>,
    /// The token of each job's eventfd, and the eventfd (a duplicate, so that the firers' epolls
    /// can be told to drop it whatever becomes of the wake thread's).
    tokens: HashMap<String, (u64, OwnedFd)>,
    next: u64,
    stop: OwnedFd,
}

impl Firers {
    /// One firer on each CPU the daemon may run on (at most [`MOST`]), each at real-time
    /// `priority` where allowed (`super::realtime`), calling `fire` at each crossing.
    pub fn start(priority: u8, fire: Fire) -> std::io::Result<Firers> {
        let allowed = rustix::thread::sched_getaffinity(None)?;
        let cpus: Vec<usize> = (0..rustix::thread::CpuSet::MAX_CPU)
            .filter(|&c| allowed.is_set(c))
            .take(MOST)
            .collect();
        let stop = super::eventfd()?;
        let watched: Arc<Mutex<HashMap<u64, Arc<Watched>>>> = Arc::default();
        let epoch = Instant::now();
        let mut polls = Vec::with_capacity(cpus.len());
        for cpu in cpus {
            let ep = Arc::new(epoll::create(epoll::CreateFlags::CLOEXEC)?);
            epoll::add(
                &*ep,
                &stop,
                epoll::EventData::new_u64(STOP),
                epoll::EventFlags::IN,
            )?;
            let (e, w, f) = (ep.clone(), watched.clone(), fire.clone());
            std::thread::Builder::new()
                .name(format!("fire-{cpu}"))
                .stack_size(64 * 1024)
                .spawn(move || run(&e, cpu, priority, &w, &f, epoch))?;
            polls.push(ep);
        }
        Ok(Firers {
            polls,
            watched,
            tokens: HashMap::new(),
            next: 0,
            stop,
        })
    }

    /// How many firers run.
    pub fn count(&self) -> usize {
        self.polls.len()
    }

    /// The firers watch `efd`, `job`'s thresholds' eventfd on its `usage` (`memory.usage_in_bytes`,
    /// open), in place of its earlier one.
    pub fn watch(&mut self, job: &str, efd: &OwnedFd, usage: &OwnedFd) {
        self.unwatch(job);
        let (Ok(dup), Ok(usage)) = (efd.try_clone(), usage.try_clone()) else {
            return;
        };
        let token = self.next;
        self.next += 1;
        if let Ok(mut w) = self.watched.lock() {
            w.insert(
                token,
                Arc::new(Watched {
                    job: job.to_owned(),
                    usage,
                    looked: AtomicU64::new(0),
                    seen: AtomicU64::new(0),
                }),
            );
        }
        for ep in &self.polls {
            let flags = epoll::EventFlags::IN | epoll::EventFlags::ET;
            if let Err(e) = epoll::add(&**ep, &dup, epoll::EventData::new_u64(token), flags) {
                tracing::debug!(job, error = %e, "a firer does not watch the job's thresholds");
            }
        }
        self.tokens.insert(job.to_owned(), (token, dup));
    }

    /// The firers no longer watch `job`.
    pub fn unwatch(&mut self, job: &str) {
        let Some((token, dup)) = self.tokens.remove(job) else {
            return;
        };
        for ep in &self.polls {
            let _ = epoll::delete(&**ep, &dup);
        }
        if let Ok(mut w) = self.watched.lock() {
            w.remove(&token);
        }
    }
}

impl Drop for Firers {
    fn drop(&mut self) {
        let _ = rustix::io::write(&self.stop, &1u64.to_ne_bytes());
    }
}

fn run(
    ep: &OwnedFd,
    cpu: usize,
    priority: u8,
    watched: &Mutex<HashMap<u64, Arc<Watched>>>,
    fire: &Fire,
    epoch: Instant,
) {
    let mut one = rustix::thread::CpuSet::new();
    one.set(cpu);
    if let Err(e) = rustix::thread::sched_setaffinity(None, &one) {
        tracing::debug!(cpu, error = %e, "a firer not pinned to its CPU");
    }
    if let Err(e) = super::realtime(priority) {
        tracing::debug!(cpu, error = %e, "a firer runs at the daemon's priority");
    }
    let mut events = Vec::with_capacity(16);
    loop {
        events.clear();
        match epoll::wait(ep, rustix::buffer::spare_capacity(&mut events), None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => {
                tracing::debug!(cpu, error = %e, "a firer stops");
                return;
            }
        }
        let woke = Instant::now();
        let at = u64::try_from(woke.duration_since(epoch).as_nanos()).unwrap_or(u64::MAX);
        for ev in &events {
            let token = ev.data.u64();
            if token == STOP {
                return;
            }
            let Some(w) = watched.lock().ok().and_then(|w| w.get(&token).cloned()) else {
                continue;
            };
            let Some(usage) = read_usage(&w.usage) else {
                continue;
            };
            let last = w.looked.load(Ordering::Acquire);
            let recent = last != 0 && at.saturating_sub(last) < LOOKED.as_nanos() as u64;
            if (recent && w.seen.load(Ordering::Acquire) >= usage)
                || w.looked
                    .compare_exchange(last, at.max(1), Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
            {
                continue;
            }
            w.seen.store(usage, Ordering::Release);
            fire(&w.job, woke, usage);
        }
    }
}

/// The job's usage, read from the start of its open `memory.usage_in_bytes`.
fn read_usage(usage: &OwnedFd) -> Option<u64> {
    let mut buf = [0u8; 32];
    let n = rustix::io::pread(usage, &mut buf, 0).ok()?;
    std::str::from_utf8(buf.get(..n)?).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn signal(efd: &OwnedFd) {
        rustix::io::write(efd, &1u64.to_ne_bytes()).expect("eventfd write");
    }

    /// Every call `fire` gets (the job, the usage and the CPUs its firer may run on), until none
    /// comes for `quiet`.
    fn drain(rx: &mpsc::Receiver<Call>, quiet: Duration) -> Vec<Call> {
        std::iter::from_fn(|| rx.recv_timeout(quiet).ok()).collect()
    }

    type Call = (String, u64, Option<u32>);

    #[test]
    fn a_crossing_is_looked_at_by_a_firer_pinned_to_a_cpu_with_the_usage_it_reads_and_its_count_is_left_to_the_wake_thread()
     {
        let dir = tempfile::tempdir().expect("tempdir");
        let usage_path = dir.path().join("memory.usage_in_bytes");
        std::fs::write(&usage_path, "1000\n").expect("usage");
        let usage: OwnedFd = std::fs::File::open(&usage_path).expect("open").into();
        let (tx, rx) = mpsc::channel::<Call>();
        let tx = Mutex::new(tx);
        let fire: Fire = Arc::new(move |job: &str, _, usage| {
            let cpus = rustix::thread::sched_getaffinity(None)
                .map(|s| s.count())
                .ok();
            let _ = tx.lock().map(|t| t.send((job.to_owned(), usage, cpus)));
        });
        let mut firers = Firers::start(0, fire).expect("firers");
        let n = firers.count();
        assert!(n >= 1);
        let efd = super::super::eventfd().expect("eventfd");
        firers.watch("a", &efd, &usage);
        signal(&efd);
        let first = rx.recv_timeout(Duration::from_secs(10)).expect("fired");
        assert_eq!(
            first,
            ("a".to_owned(), 1000, Some(1)),
            "a firer runs on one CPU"
        );
        // Every firer is woken, each looks once at most (those within LOOKED of a look at as
        // much usage skip it).
        assert!(drain(&rx, Duration::from_millis(200)).len() < n);
        // The firers never read the count: it is still there for the wake thread.
        let mut count = [0u8; 8];
        assert_eq!(rustix::io::read(&efd, &mut count).expect("count"), 8);
        assert_eq!(u64::from_ne_bytes(count), 1);
        // A crossing further up is looked at again, however soon.
        std::fs::write(&usage_path, "2000\n").expect("usage");
        signal(&efd);
        let again = rx.recv_timeout(Duration::from_secs(10)).expect("again");
        assert_eq!((again.0.as_str(), again.1), ("a", 2000));
        // Unwatched: no more looks (what the last crossing's late firers did is drained first).
        firers.unwatch("a");
        drain(&rx, Duration::from_millis(200));
        std::fs::write(&usage_path, "3000\n").expect("usage");
        signal(&efd);
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    }
}
