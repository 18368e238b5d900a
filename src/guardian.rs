//! The guardian: a tiny process the daemon starts beside itself, whose only job is to resume every job
//! the daemon paused if the daemon dies and nothing takes its place.
//!
//! How it knows: its standard input is the read end of a pipe whose only write end the daemon holds
//! (close-on-exec, so no other program inherits it). The kernel closes that end when the daemon exits
//! for any reason, SIGKILL and the OOM killer included, and the guardian's wait on it ends. That can
//! be late: a dying daemon keeps its descriptors until its last thread has left an uninterruptible
//! call (16–33 ms after a kill at a resume, see `death`), so the guardian also takes the signal the
//! kernel sends when the daemon's thread that started it exits, a thread that does nothing else
//! (`death::spawner`), and checks that the daemon is dying. It waits at the daemon's real-time
//! priority where the kernel allows it. While the daemon lives it arms the lines the state file
//! records, again after each write of it (the daemon writes a byte to the pipe), so that a death finds
//! them ready: one sleeping process, no timer, no polling, and a re-read of the state file per
//! write.
//!
//! What it does then: it gives a successor `control.successor_grace_ms` (5 s) to take over, watching
//! the runtime directory's lock (`daemon.lock`) every 50 ms. A successor — the daemon systemd restarts
//! after `RestartSec=1` — takes the lock, re-adopts the jobs and goes on holding every pause the
//! policy made (a job paused at its memory limit stays paused, rather than thawed into the OOM
//! killer); the guardian then just exits. If no daemon holds the lock when the grace is over, none is
//! coming: the guardian takes the lock, undoes every pause recorded in `state.json` (the same
//! idempotent recovery a restarted daemon runs for the pauses it does not keep, see `act::recover`),
//! marks them undone, and exits. So after a death with no successor every job runs again within the
//! grace (plus the 50 ms of a look). A daemon starting while the guardian recovers waits for the lock.
//! The guardian hears of the death before the dying daemon's lock is closed (a slow guest once showed
//! a guardian that took the dead daemon's lock for a successor's and left the job frozen). So a held
//! lock counts as a successor's only when `daemon.lock` names another pid (each holder writes its
//! own); while the dying daemon still holds it, no successor can, and the guardian looks at the
//! lines all the same.
//!
//! Under systemd the unit uses `KillMode=process`: systemd then restarts the daemon without killing
//! the guardian first (with `control-group` it would wait for the whole cgroup to empty, and the
//! guardian, waiting for that very successor, would thaw the job into its limit first). A `systemctl
//! stop` signals the daemon alone, which resumes everything before it exits; its guardian finds
//! nothing to undo and leaves within the grace. A `systemctl restart` (or a package upgrade's) signals
//! it the same way, but the daemon asks systemd which job it runs (`daemon::successor`): on a restart
//! it keeps the pauses the policy holds, does not stand its guardian down, and the successor takes
//! them over exactly as after a crash.
//!
//! A daemon that stops cleanly resumes everything first and then writes a byte to the pipe: its
//! guardian leaves as soon as the daemon has gone, with no grace to wait (it still looks, and finds
//! nothing to undo).
//!
//! Failure modes: the guardian ignores SIGTERM, SIGINT and SIGHUP (systemd's stop of the unit's cgroup
//! after a crash would otherwise kill it before it acts; in a clean stop the daemon resumes everything
//! first and the guardian exits on the pipe's end at once). It runs in its own process group, so a
//! terminal's Ctrl-C or a `kill -- -PGID` of the daemon's group does not reach it. A SIGKILL of the
//! guardian itself leaves the daemon unguarded until its next full sample, when the daemon notices and
//! starts a new one. If both die together (the whole cgroup SIGKILLed, say), only a restarted daemon
//! recovers: the jobs stay paused until then, as before the guardian existed.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::Duration;

use crate::act::persist::{self, StateLock};

mod death;
pub mod gap;
pub use gap::Gap;

/// How soon the guardian tries again for a lock the dying daemon still holds.
const DEAD_LOCK_AGAIN: Duration = Duration::from_micros(100);

/// What the daemon writes to the pipe before a clean exit.
const STAND_DOWN: &[u8] = b"S";
/// What the daemon writes to the pipe after each write of the state file: the guardian arms the
/// lines it records again, ahead of any death.
const REARM: &[u8] = b"A";

/// The write end of the current guardian's pipe (non-blocking): the only one, so that the guardian
/// hears the daemon's end when it closes. Held here rather than by [`Guardian`] so that the state
/// writer reaches it ([`state_written`]); a dropped `Guardian` closes it.
static EAR: std::sync::Mutex<Option<(u64, std::fs::File)>> = std::sync::Mutex::new(None);

/// The number of the guardian whose pipe the [`EAR`] holds (each spawn takes the next).
static SPAWNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The write end `write` under the number of `old`'s descriptor, where there was one (a restarted
/// guardian's pipe keeps its predecessor's low number); else `write` as it is.
fn in_place_of(old: Option<std::fs::File>, write: std::os::fd::OwnedFd) -> std::fs::File {
    if let Some(old) = old {
        let mut old = std::os::fd::OwnedFd::from(old);
        if nix::unistd::dup3(&write, &mut old, nix::fcntl::OFlag::O_CLOEXEC).is_ok() {
            return std::fs::File::from(old);
        }
    }
    std::fs::File::from(write)
}

/// Writes `bytes` to the guardian's pipe, if there is one.
fn tell(bytes: &[u8]) {
    use std::io::Write;
    if let Ok(Some((_, ear))) = EAR.lock().as_deref_mut() {
        let _ = ear.write(bytes);
    }
}

/// Tells the daemon's guardian, if it has one, that the state file was just written, so that it
/// arms the recorded lines now rather than after the daemon's death (a job resumed at memory speed
/// crosses the 16 MiB between its line and its limit in a few milliseconds). Never blocks: a full
/// pipe already holds a byte that wakes the guardian.
pub fn state_written() {
    tell(REARM);
}

/// The daemon's handle on its guardian: the child (the pipe end whose closing wakes it is the
/// pipe's write end, kept where the state writer reaches it).
pub struct Guardian {
    child: Child,
    /// Which spawn this is: its pipe is the [`EAR`]'s while no later one replaced it.
    spawn: u64,
    runtime_dir: PathBuf,
    process_root: PathBuf,
    grace: Duration,
    priority: u8,
}

/// The pipe between a daemon and its guardian, made before the daemon opens anything else: its
/// write end then has a low descriptor number, and the kernel, which closes a dead process's
/// descriptors in order, closes it (and the state lock, opened just before) ahead of the slow ones
/// (each PSI trigger waits out an RCU grace period as it closes: a killed daemon took 16–23 ms to
/// close them all), so the guardian hears of the death that much sooner.
pub struct Pipe {
    read: std::os::fd::OwnedFd,
    write: std::os::fd::OwnedFd,
}

impl Pipe {
    /// A close-on-exec pipe whose write end never blocks (the read end, the guardian's standard
    /// input, does).
    pub fn new() -> std::io::Result<Pipe> {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        nix::fcntl::fcntl(
            &write,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )?;
        Ok(Pipe { read, write })
    }
}

impl Guardian {
    /// Starts `memwatch guardian` for this runtime directory and process root on `pipe`, giving a
    /// successor `grace` to take over, at real-time `priority` where the kernel lets it (from a
    /// thread that only starts guardians, whose end at the daemon's death signals the guardian).
    pub fn spawn(
        pipe: Pipe,
        runtime_dir: &Path,
        process_root: &Path,
        grace: Duration,
        priority: u8,
    ) -> std::io::Result<Guardian> {
        use std::os::unix::process::CommandExt;
        let Pipe { read, write } = pipe;
        let (runtime, root) = (runtime_dir.to_owned(), process_root.to_owned());
        // Started from the spawner thread, whose end at the daemon's death signals the guardian.
        let child = death::spawner(priority, move || -> std::io::Result<Child> {
            let exe = std::env::current_exe()?;
            let mut cmd = Command::new(exe);
            // SAFETY: between fork and exec only signal(2), which is async-signal-safe. An ignored
            // disposition survives exec, so the guardian ignores these from its first instruction on.
            unsafe {
                cmd.pre_exec(|| {
                    for sig in [nix::libc::SIGTERM, nix::libc::SIGINT, nix::libc::SIGHUP] {
                        nix::libc::signal(sig, nix::libc::SIG_IGN);
                    }
                    Ok(())
                });
            }
            cmd.arg("guardian")
                .arg("--runtime-dir")
                .arg(&runtime)
                .arg("--process-root")
                .arg(&root)
                .arg("--successor-grace-ms")
                .arg(grace.as_millis().to_string())
                .stdin(Stdio::from(read))
                .stdout(Stdio::null())
                .process_group(0)
                .spawn()
        })
        .unwrap_or_else(|| Err(std::io::Error::other("the guardian's spawner thread died")))?;
        let spawn = SPAWNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if let Ok(mut ear) = EAR.lock() {
            *ear = Some((spawn, in_place_of(ear.take().map(|(_, f)| f), write)));
        }
        Ok(Guardian {
            child,
            spawn,
            runtime_dir: runtime_dir.to_owned(),
            process_root: process_root.to_owned(),
            grace,
            priority,
        })
    }

    /// Tells the guardian the daemon is stopping cleanly, everything resumed: it leaves as soon as
    /// the daemon has gone, without waiting for a successor.
    pub fn stand_down(&mut self) {
        tell(STAND_DOWN);
    }

    /// The guardian's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Starts a new guardian if this one has exited. Returns whether one was restarted.
    pub fn keep_alive(&mut self) -> bool {
        match self.child.try_wait() {
            Ok(None) => false,
            _ => match Pipe::new().and_then(|p| {
                Guardian::spawn(
                    p,
                    &self.runtime_dir,
                    &self.process_root,
                    self.grace,
                    self.priority,
                )
            }) {
                Ok(g) => {
                    tracing::warn!(pid = g.pid(), restarted = true, "guardian started");
                    *self = g;
                    true
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot restart the guardian");
                    false
                }
            },
        }
    }
}

impl Drop for Guardian {
    /// Closes the pipe, unless a later guardian's took its place: the guardian hears the end.
    fn drop(&mut self) {
        if let Ok(mut ear) = EAR.lock()
            && ear.as_ref().is_some_and(|(n, _)| *n == self.spawn)
        {
            *ear = None;
        }
    }
}

/// `memwatch guardian`: waits for the daemon's end, then for a successor up to `grace`, then undoes
/// the pauses unless a new daemon runs.
pub fn run(runtime_dir: &Path, process_root: &Path, grace: Duration) -> ExitCode {
    for sig in [
        nix::sys::signal::Signal::SIGTERM,
        nix::sys::signal::Signal::SIGINT,
        nix::sys::signal::Signal::SIGHUP,
    ] {
        // SAFETY: SIG_IGN installs no handler code.
        let _ = unsafe { nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigIgn) };
    }
    // The daemon (our parent's process) until it has died.
    let daemon = nix::unistd::getppid();
    let mut stdin = std::io::stdin().lock();
    // The lines of the reflexes the daemon has armed, armed here too while it lives (again after
    // each write of its state file), so that its death finds them ready to be looked at.
    let mut gap = Gap::arm(runtime_dir, process_root);
    let dead = u32::try_from(daemon.as_raw()).unwrap_or(0);
    let stood_down = until_death(&mut stdin, daemon, &mut gap, runtime_dir, process_root);
    // The dying daemon may still hold its descriptors, its lock among them: one still held is told
    // from a successor's by the pid in it.
    let dying = std::time::Instant::now();
    let grace = if stood_down { Duration::ZERO } else { grace };
    // Until a successor takes over, the lines of the reflexes the dead daemon had armed: armed
    // already, unless the state file changed after the last arming (the daemon died between its
    // write and its word to us).
    if stood_down {
        gap = Gap::idle(runtime_dir, process_root);
    } else if gap.stale() {
        gap = Gap::arm(runtime_dir, process_root);
    }
    gap.announce(dying);
    if successor_within(runtime_dir, grace, dead, &mut gap) {
        tracing::info!("a new memwatch daemon took over; it holds the paused jobs");
        return ExitCode::SUCCESS;
    }
    // The empty freezer cgroup the daemon held frozen for its reflexes, if it held one.
    crate::reflex::let_go_of_the_dead(process_root);
    match recover(runtime_dir, process_root) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(n) => {
            tracing::warn!(
                jobs = n,
                "the memwatch daemon died and no daemon replaced it: resumed its paused jobs"
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(error = %e, "the guardian could not recover the paused jobs");
            ExitCode::from(1)
        }
    }
}

/// Waits on `stdin`, the daemon's pipe, until the daemon `daemon` has died (the pipe's end, or the
/// death signal with the daemon dying), arming `gap` again at each word that the state file was
/// written. Returns whether the daemon stood its guardian down first (a clean stop).
fn until_death(
    stdin: &mut std::io::StdinLock<'_>,
    daemon: nix::unistd::Pid,
    gap: &mut Gap,
    runtime_dir: &Path,
    process_root: &Path,
) -> bool {
    let dead = u32::try_from(daemon.as_raw()).unwrap_or(0);
    if death::listen(daemon) {
        return death::drain(stdin).1.contains(&STAND_DOWN[0]);
    }
    let (mut buf, mut stood_down) = ([0u8; 64], false);
    loop {
        if !death::wait(stdin) {
            if death::heard_of(dead) {
                // What it wrote last (a stand-down comes before a clean exit).
                let (_, rest) = death::drain(stdin);
                stood_down |= rest.contains(&STAND_DOWN[0]);
                return stood_down;
            }
            continue;
        }
        match stdin.read(&mut buf) {
            Ok(0) => return stood_down,
            Ok(n) => {
                stood_down |= buf[..n].contains(&STAND_DOWN[0]);
                if !stood_down && buf[..n].contains(&REARM[0]) {
                    *gap = Gap::arm(runtime_dir, process_root);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return stood_down,
        }
    }
}

/// Whether a daemon other than `dead` holds the state lock within `grace` (looked at every 50 ms,
/// or as often as `gap`'s lines need): a lock still held by `dead`'s own descriptors (its last
/// thread has not closed them yet, though we were reparented) is no successor's. A lock taken for a
/// look is let go at once, so a daemon starting meanwhile waits a moment at most; while it is held,
/// `gap` looks at the lines due and holds a job at its own.
fn successor_within(runtime_dir: &Path, grace: Duration, dead: u32, gap: &mut Gap) -> bool {
    let start = std::time::Instant::now();
    loop {
        let again = match StateLock::acquire_existing(runtime_dir, Duration::ZERO) {
            // Held by another: a successor runs, unless it is the dead daemon's lock.
            Ok(None) if persist::lock_holder(runtime_dir) != Some(dead) => return true,
            // Still the dying daemon's: it closes in a moment. Meanwhile no successor can take it,
            // and the dying daemon acts no more: the lines are looked at all the same.
            Ok(None) => {
                gap.look(std::time::Instant::now());
                gap.next_look(std::time::Instant::now())
                    .min(DEAD_LOCK_AGAIN)
            }
            Ok(Some(lock)) => {
                gap.look(std::time::Instant::now());
                drop(lock);
                gap.next_look(std::time::Instant::now())
            }
            // The directory (or its lock) was removed: nothing is left to guard, or to hand over.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return false,
            Err(e) => {
                tracing::error!(error = %e, "cannot look at the state lock; not waiting for a successor");
                return false;
            }
        };
        if start.elapsed() >= grace {
            return false;
        }
        std::thread::sleep(again);
    }
}

/// Why the guardian could not undo the dead daemon's pauses.
#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    /// The state lock could not be taken.
    #[error("{dir}: cannot take the state lock: {source}")]
    Lock {
        /// The runtime directory.
        dir: std::path::PathBuf,
        /// The OS's error.
        #[source]
        source: std::io::Error,
    },
    /// The state file could not be read.
    #[error(transparent)]
    Read(#[from] persist::StateReadError),
    /// The state file, its pauses undone, could not be written back.
    #[error("{dir}: cannot write the state file back: {source}")]
    Write {
        /// The runtime directory.
        dir: std::path::PathBuf,
        /// The OS's error.
        #[source]
        source: std::io::Error,
    },
}

/// Takes the lock and undoes every recorded pause; returns how many jobs it resumed. `Ok(0)` without
/// touching anything when another daemon holds the lock.
pub fn recover(runtime_dir: &Path, process_root: &Path) -> Result<usize, RecoverError> {
    if !runtime_dir.join(persist::STATE_FILE).is_file() {
        // Nothing was ever recorded (or the directory is gone): nothing to undo, nothing to create.
        return Ok(0);
    }
    // The daemon took the lock before it wrote the state file, so the lock file is there; gone
    // since, with its directory, there is nothing to undo and nothing is made again.
    let lock = match StateLock::acquire_existing(runtime_dir, Duration::from_millis(200)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        taken => taken.map_err(|source| RecoverError::Lock {
            dir: runtime_dir.to_owned(),
            source,
        })?,
    };
    let Some(_lock) = lock else {
        // A new daemon runs and recovers by itself.
        return Ok(0);
    };
    let Some(mut state) = persist::load(runtime_dir)? else {
        return Ok(0);
    };
    let mut resumed = 0;
    let host = crate::act::driver::Host::new(process_root);
    let view = crate::view::RootView::new(process_root);
    for job in &mut state.jobs {
        if let Some(done) = crate::act::recover::undo_pause(&host, &view, job) {
            tracing::warn!(job = %job.name, "{done}");
            job.paused = None;
            resumed += 1;
        }
    }
    if resumed > 0 {
        // Written in this build's format, so labelled with its version.
        state.version = persist::VERSION;
        persist::save(runtime_dir, &state).map_err(|source| RecoverError::Write {
            dir: runtime_dir.to_owned(),
            source,
        })?;
    }
    Ok(resumed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lock held by the dead daemon's own descriptors (its pid in `daemon.lock`) is no successor's;
    /// a lock held by any other pid is.
    #[test]
    fn the_dead_daemons_own_lock_is_no_successor() {
        let dir = tempfile::tempdir().unwrap();
        let held = StateLock::acquire(dir.path(), Duration::ZERO)
            .unwrap()
            .expect("the lock");
        let me = std::process::id();
        assert_eq!(persist::lock_holder(dir.path()), Some(me));
        let mut gap = Gap::idle(dir.path(), Path::new("/"));
        assert!(!successor_within(
            dir.path(),
            Duration::from_millis(120),
            me,
            &mut gap
        ));
        assert!(successor_within(
            dir.path(),
            Duration::from_millis(120),
            1,
            &mut gap
        ));
        drop(held);
        // Released, it is nobody's. Another test's child, forked while a descriptor of the lock was
        // open here (this one, or the one each look takes), holds it until its exec: ask again
        // until such a moment has passed.
        let asked = std::time::Instant::now();
        while successor_within(dir.path(), Duration::ZERO, 1, &mut gap) {
            assert!(
                asked.elapsed() < Duration::from_secs(5),
                "a released lock still taken for a successor's"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
