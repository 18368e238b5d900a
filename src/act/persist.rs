//! Atomic files: the attached jobs and what is paused, so that a daemon that crashed or restarted
//! resumes what its predecessor paused.

use std::io::Write;
use std::path::{Path, PathBuf};

pub use memwatch_core::record::{
    ClockAnchor, HoldRecord, LineRecord, Persisted, PersistedJob, PersistedPause, PhaseRecord,
    STATE_FILE, StateReadError, StateStore, StateWriteError, VERSION,
};

/// Writes `bytes` to `path` so that a crash leaves the old file or the new one: a temp file in the
/// same directory, fsync, rename, fsync of the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_renamed(path, bytes, true)
}

/// Temp file, write, (fsync,) rename. Without `sync` the new file is what every process sees once this
/// returns, and it survives the writer's death at any instant (the page cache belongs to the kernel);
/// only a power loss could take it back, and a power loss also ends every process a pause concerned.
fn write_renamed(path: &Path, bytes: &[u8], sync: bool) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp: PathBuf = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        f.write_all(bytes)?;
        if sync {
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        if sync {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Creates the state directory, private (0700): the state file holds the jobs' tokens.
pub fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// Writes the state file durably (fsync'd).
pub fn save(dir: &Path, state: &Persisted) -> std::io::Result<()> {
    private_dir(dir)?;
    let bytes = serde_json::to_vec_pretty(state).map_err(std::io::Error::other)?;
    write_atomic(&dir.join(STATE_FILE), &bytes)
}

/// Called after each write of the state file (the daemon's: its guardian's word to arm again).
static AFTER_WRITE: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Has `tell` called after each write a [`StateWriter`] makes, from now on (once per process).
pub fn after_write(tell: fn()) {
    let _ = AFTER_WRITE.set(tell);
}

/// A write of the state file slower than this is logged: on a tmpfs one takes about 0.1 ms.
const SLOW_WRITE: std::time::Duration = std::time::Duration::from_millis(10);

/// The daemon's state file writer. Every write is a write-ahead: it has happened (renamed into place,
/// visible to a successor and to the guardian) when `write` returns, before any signal it describes is
/// sent. Unchanged state is not written again. The fsync that makes it durable against a power loss
/// runs on a thread of its own, so the owner task never waits for the disk.
pub struct StateWriter {
    dir: PathBuf,
    last: Vec<u8>,
    sync: Option<std::sync::mpsc::SyncSender<()>>,
}

impl StateWriter {
    /// A writer for `state.json` in `dir`, with a thread that fsyncs the directory behind the
    /// writes.
    pub fn new(dir: &Path) -> Self {
        let path = dir.join(STATE_FILE);
        // One request waiting at most: a write that finds one queued is covered by its fsync, which
        // runs after the write.
        let (tx, rx) = std::sync::mpsc::sync_channel::<()>(1);
        let spawned = std::thread::Builder::new()
            .name("state-fsync".into())
            .spawn(move || {
                while rx.recv().is_ok() {
                    // Coalesce: one fsync covers every write queued so far.
                    while rx.try_recv().is_ok() {}
                    let synced = std::fs::File::open(&path)
                        .and_then(|f| f.sync_all())
                        .and_then(|()| {
                            std::fs::File::open(path.parent().unwrap_or(Path::new(".")))?.sync_all()
                        });
                    if let Err(e) = synced {
                        tracing::debug!(error = %e, "fsync of the state file failed");
                    }
                }
            })
            .ok();
        StateWriter {
            dir: dir.to_owned(),
            last: Vec::new(),
            sync: spawned.map(|_| tx),
        }
    }

    /// Writes `state` if it differs from what was last written. An error means nothing was recorded.
    pub fn write(&mut self, state: &Persisted) -> std::io::Result<()> {
        StateStore::write(self, state)
    }
}

impl StateStore for StateWriter {
    fn write(&mut self, state: &Persisted) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(state).map_err(std::io::Error::other)?;
        if bytes == self.last {
            return Ok(());
        }
        let began = std::time::Instant::now();
        private_dir(&self.dir)?;
        write_renamed(&self.dir.join(STATE_FILE), &bytes, false)?;
        if let Some(tell) = AFTER_WRITE.get() {
            tell();
        }
        let took = began.elapsed();
        if took >= SLOW_WRITE {
            // Every write is ahead of a signal or a freeze, on the owner task: a job growing at
            // 1 GiB/s gains 10 MiB in these 10 ms.
            tracing::warn!(
                took_ms = took.as_secs_f64() * 1e3,
                dir = %self.dir.display(),
                "a slow write of the state file: the pause or resume it records waited for it \
                 (keep control.runtime_dir on a tmpfs, as /run/memwatch/state is)"
            );
        }
        self.last = bytes;
        if let Some(tx) = &self.sync {
            let _ = tx.try_send(());
        }
        Ok(())
    }

    fn invalidate(&mut self) {
        self.last.clear();
    }
}

/// An exclusive lock on a directory (`daemon.lock`): the runtime directory's is held by the daemon
/// for its whole life and by the guardian while it recovers; the state directory's by the daemon. Released by the kernel when its holder dies. The file holds the
/// pid of whoever took it last ([`lock_holder`]): a dying daemon's lock is still held for a moment
/// after its children are reparented (another of its threads may close its descriptors last), and
/// the guardian must not take it for a successor's.
pub struct StateLock {
    _file: std::fs::File,
}

impl StateLock {
    /// Takes the lock, waiting up to `wait` for another holder to let go; `Ok(None)` if it did not.
    /// Creates the directory (private) and the lock file if they are missing.
    pub fn acquire(dir: &Path, wait: std::time::Duration) -> std::io::Result<Option<StateLock>> {
        private_dir(dir)?;
        StateLock::take(dir, wait, true)
    }

    /// The same where a daemon took it before: the lock file must be there already (an error of
    /// kind `NotFound` if it, or its directory, is gone), and nothing is created. The guardian's,
    /// so that it never makes again a directory removed after its daemon's end.
    pub fn acquire_existing(
        dir: &Path,
        wait: std::time::Duration,
    ) -> std::io::Result<Option<StateLock>> {
        StateLock::take(dir, wait, false)
    }

    fn take(
        dir: &Path,
        wait: std::time::Duration,
        create: bool,
    ) -> std::io::Result<Option<StateLock>> {
        use std::os::fd::AsRawFd;
        let file = std::fs::OpenOptions::new()
            .create(create)
            .truncate(false)
            .write(true)
            .open(dir.join("daemon.lock"))?;
        let start = std::time::Instant::now();
        loop {
            // SAFETY: flock on a descriptor we own; no memory is passed.
            let rc = unsafe {
                nix::libc::flock(file.as_raw_fd(), nix::libc::LOCK_EX | nix::libc::LOCK_NB)
            };
            if rc == 0 {
                use std::os::unix::fs::FileExt;
                file.set_len(0)?;
                file.write_all_at(std::process::id().to_string().as_bytes(), 0)?;
                return Ok(Some(StateLock { _file: file }));
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(nix::libc::EWOULDBLOCK) {
                return Err(e);
            }
            if start.elapsed() >= wait {
                return Ok(None);
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

/// The pid written in `dir`'s `daemon.lock` by whoever took the lock last (`None`: none written, or
/// no lock file). Whether the lock is held now is `StateLock::acquire`'s to say.
pub fn lock_holder(dir: &Path) -> Option<u32> {
    std::fs::read_to_string(dir.join("daemon.lock"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Moves a state file an earlier build kept in the state directory (`from`) to the runtime
/// directory (`to`), unless `to` has one already: a daemon upgraded while jobs were paused still
/// finds their pauses. `Ok(true)` when one was moved.
pub fn adopt_legacy(from: &Path, to: &Path) -> std::io::Result<bool> {
    let legacy = from.join(STATE_FILE);
    if from == to || to.join(STATE_FILE).exists() {
        return Ok(false);
    }
    let bytes = match std::fs::read(&legacy) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    private_dir(to)?;
    write_atomic(&to.join(STATE_FILE), &bytes)?;
    std::fs::remove_file(&legacy)?;
    Ok(true)
}

/// Reads the state file; `Ok(None)` when there is none.
pub fn load(dir: &Path) -> Result<Option<Persisted>, StateReadError> {
    let path = dir.join(STATE_FILE);
    let error = |reason: String| StateReadError {
        path: path.clone(),
        reason,
    };
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| error(e.to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(error(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::By;
    use crate::proc::ProcRef;

    #[test]
    fn round_trip_and_garbage() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()).unwrap(), None);
        let s = Persisted {
            version: VERSION,
            jobs: vec![PersistedJob {
                name: "t".into(),
                root: ProcRef {
                    pid: 5,
                    start_time: 9,
                },
                owner_uid: 1000,
                attached_at_ms: 1,
                paused: Some(PersistedPause {
                    since_ms: 2,
                    by: By::Policy,
                    reason: "r".into(),
                    phase: PhaseRecord::Held,
                    stopped: vec![ProcRef {
                        pid: 5,
                        start_time: 9,
                    }],
                    hold: HoldRecord::SlurmSuspend {
                        job_id: "4242".into(),
                        scontrol: "scontrol".into(),
                        scancel: "scancel".into(),
                        timeout_ms: 5000,
                        holder: "node1".into(),
                        hold_seconds: 120,
                    },
                    causes: Vec::new(),
                    projected: None,
                    strict: false,
                    expired: false,
                    oomd_omit: vec![crate::job::held::OomdMark {
                        dir: "/sys/fs/cgroup/work.slice/job.service".into(),
                        previous: Some("0".into()),
                    }],
                    line: Some(LineRecord {
                        memory: "/sys/fs/cgroup/memory/job".into(),
                        version: crate::sample::cgroup::Version::V1,
                        critical_bytes: 243 << 20,
                        limit_bytes: 256 << 20,
                    }),
                }),
                config: None,
                launch: None,
                way_out: None,
                slurm: Some("4242".into()),
            }],
            clock: None,
            loans: Vec::new(),
        };
        save(dir.path(), &s).unwrap();
        assert_eq!(load(dir.path()).unwrap(), Some(s));
        std::fs::write(dir.path().join(STATE_FILE), "{garbage").unwrap();
        let e = load(dir.path()).unwrap_err();
        assert_eq!(e.path, dir.path().join(STATE_FILE));
        assert!(e.to_string().contains("state.json"), "{e}");
    }

    #[test]
    fn a_state_file_left_in_the_state_directory_moves_to_the_runtime_directory_once() {
        let base = tempfile::tempdir().unwrap();
        let (state, runtime) = (base.path().join("state"), base.path().join("run/state"));
        std::fs::create_dir_all(&state).unwrap();
        std::fs::write(state.join(STATE_FILE), "legacy").unwrap();
        assert!(adopt_legacy(&state, &runtime).unwrap());
        assert_eq!(
            std::fs::read_to_string(runtime.join(STATE_FILE)).unwrap(),
            "legacy"
        );
        assert!(!state.join(STATE_FILE).exists());
        // Nothing left to move; and a newer file in the runtime directory is never overwritten.
        assert!(!adopt_legacy(&state, &runtime).unwrap());
        std::fs::write(state.join(STATE_FILE), "older").unwrap();
        assert!(!adopt_legacy(&state, &runtime).unwrap());
        assert_eq!(
            std::fs::read_to_string(runtime.join(STATE_FILE)).unwrap(),
            "legacy"
        );
        assert!(!adopt_legacy(&runtime, &runtime).unwrap());
    }
}
