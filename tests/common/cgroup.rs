//! Real memory cgroups for tests (v1 where the memory controller is on v1, as on the CI machines;
//! v2 where it is on the unified hierarchy). Removed on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

pub struct MemCgroup {
    pub dir: PathBuf,
    pub version: u8,
    /// v1: a freezer cgroup of the same name the processes join too (`with_freezer`), so that the
    /// job owns a freezable cgroup and memwatch freezes it instead of signalling.
    pub freezer: Option<PathBuf>,
}

static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

impl MemCgroup {
    /// A new memory cgroup with `limit` bytes, or None where none can be made (not root, no controller).
    pub fn new(limit: u64) -> Option<MemCgroup> {
        let name = format!(
            "memwatch-test-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let v1 = PathBuf::from("/sys/fs/cgroup/memory");
        let v2 = PathBuf::from("/sys/fs/cgroup");
        let (dir, version) = if v1.join("memory.limit_in_bytes").exists() {
            (v1.join(name), 1)
        } else if std::fs::read_to_string(v2.join("cgroup.controllers"))
            .is_ok_and(|c| c.contains("memory"))
        {
            (v2.join(name), 2)
        } else {
            return None;
        };
        std::fs::create_dir(&dir).ok()?;
        let cg = MemCgroup {
            dir,
            version,
            freezer: None,
        };
        cg.set_limit(limit);
        Some(cg)
    }

    pub fn set_limit(&self, bytes: u64) {
        let file = if self.version == 1 {
            "memory.limit_in_bytes"
        } else {
            "memory.max"
        };
        // Lowering it under what the cgroup holds fails with EBUSY while the memory of a process
        // that just exited is still being freed (the last reference to its address space may be
        // a reader's of its /proc files): asked again until the kernel takes it.
        let t = std::time::Instant::now();
        loop {
            match std::fs::write(self.dir.join(file), bytes.to_string()) {
                Ok(()) => return,
                Err(e)
                    if e.kind() == std::io::ErrorKind::ResourceBusy
                        && t.elapsed() < std::time::Duration::from_secs(10) =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(10))
                }
                Err(e) => panic!(
                    "set {}'s memory limit to {bytes} (it holds {}): {e}",
                    self.dir.display(),
                    self.usage()
                ),
            }
        }
    }

    /// OOM kills inside the cgroup so far.
    pub fn oom_kills(&self) -> u64 {
        let (file, key) = if self.version == 1 {
            ("memory.oom_control", "oom_kill")
        } else {
            ("memory.events", "oom_kill")
        };
        std::fs::read_to_string(self.dir.join(file))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix(key).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0)
    }

    /// Two memory cgroups limited to `limit` for hogs: the first's processes are stopped with
    /// signals, the second's also join a freezer cgroup of their own (v1; v2's memory cgroup is
    /// frozen itself). Panics without root, a memory controller or a v1 freezer.
    pub fn pair(limit: u64) -> (MemCgroup, MemCgroup) {
        let made = || {
            MemCgroup::new(limit).unwrap_or_else(|| {
                panic!(
                    "cannot create a memory cgroup: this test needs root and a memory controller"
                )
            })
        };
        let signalled = made();
        let mut frozen = made();
        assert!(frozen.with_freezer(), "no v1 freezer to give the hog");
        (signalled, frozen)
    }

    /// On v1, also a freezer cgroup of the same name for the processes spawned from now on (v2's
    /// memory cgroup can be frozen itself). `false` where there is no v1 freezer.
    pub fn with_freezer(&mut self) -> bool {
        if self.version != 1 {
            return true;
        }
        let dir = PathBuf::from("/sys/fs/cgroup/freezer").join(self.dir.file_name().unwrap());
        if std::fs::create_dir(&dir).is_err() {
            return false;
        }
        self.freezer = Some(dir);
        true
    }

    /// Whether `pid` is stopped (state T) or frozen in its own freezer cgroup (v1 `freezer.state`
    /// FROZEN, where frozen tasks show state D; v2 `cgroup.events` frozen 1).
    pub fn paused(&self, pid: u32) -> bool {
        if super::proc_state(pid) == Some('T') {
            return true;
        }
        match (&self.freezer, self.version) {
            (Some(f), _) => {
                std::fs::read_to_string(f.join("freezer.state")).is_ok_and(|s| s.trim() == "FROZEN")
            }
            (None, 2) => std::fs::read_to_string(self.dir.join("cgroup.events"))
                .is_ok_and(|s| s.lines().any(|l| l == "frozen 1")),
            _ => false,
        }
    }

    /// The cgroup's memory usage now (bytes; 0 when it cannot be read).
    pub fn usage(&self) -> u64 {
        let file = if self.version == 1 {
            "memory.usage_in_bytes"
        } else {
            "memory.current"
        };
        std::fs::read_to_string(self.dir.join(file))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Whether its v1 freezer cgroup is frozen.
    pub fn frozen(&self) -> bool {
        self.freezer.as_ref().is_some_and(|f| {
            std::fs::read_to_string(f.join("freezer.state")).is_ok_and(|s| s.trim() == "FROZEN")
        })
    }

    /// Thaws its v1 freezer cgroup (what a test does after a frozen run).
    pub fn thaw(&self) {
        if let Some(f) = &self.freezer {
            let _ = std::fs::write(f.join("freezer.state"), "THAWED");
        }
    }

    /// Starts `program args` inside the cgroup (the shell moves itself in, then execs), and in its
    /// freezer cgroup when it has one.
    pub fn spawn(&self, program: &std::path::Path, args: &[&str]) -> Child {
        self.spawn_with(program, args, self.freezer.is_some())
    }

    /// `program args --wait-file go` (memhog) in the cgroup, started as `spawn` does, once it said
    /// `ready`: the child and its stdout, on which it says `done N` at the end.
    pub fn hog(
        &self,
        program: &std::path::Path,
        args: &[&str],
        go: &std::path::Path,
    ) -> (Child, std::io::BufReader<std::process::ChildStdout>) {
        self.hog_with(program, args, go, self.freezer.is_some())
    }

    /// `hog`, saying whether the hog joins the freezer cgroup too (`own_freezer`, as `spawn_with`).
    pub fn hog_with(
        &self,
        program: &std::path::Path,
        args: &[&str],
        go: &std::path::Path,
        own_freezer: bool,
    ) -> (Child, std::io::BufReader<std::process::ChildStdout>) {
        self.hog_as(program, args, go, own_freezer, None)
    }

    /// `hog_with`, the hog run as user `uid` when given (`spawn_as`).
    pub fn hog_as(
        &self,
        program: &std::path::Path,
        args: &[&str],
        go: &std::path::Path,
        own_freezer: bool,
        uid: Option<u32>,
    ) -> (Child, std::io::BufReader<std::process::ChildStdout>) {
        use std::io::BufRead as _;
        let go = go.to_string_lossy();
        let mut all = args.to_vec();
        all.extend(["--wait-file", &go]);
        let mut child = self.spawn_as(program, &all, own_freezer, uid);
        let mut out = std::io::BufReader::new(child.stdout.take().expect("the hog's stdout"));
        let mut line = String::new();
        out.read_line(&mut line).expect("the hog's first line");
        assert_eq!(line.trim(), "ready", "the hog did not start");
        (child, out)
    }

    /// `spawn`, saying whether the process joins the freezer cgroup too (`own_freezer`): then the job
    /// owns a freezable cgroup, else memwatch stops it with signals.
    pub fn spawn_with(&self, program: &std::path::Path, args: &[&str], own_freezer: bool) -> Child {
        self.spawn_as(program, args, own_freezer, None)
    }

    /// `spawn_with`, the program run as user `uid` when given (the shell joins the cgroups as root,
    /// then `setpriv` takes the user's uid and gid before the exec).
    pub fn spawn_as(
        &self,
        program: &std::path::Path,
        args: &[&str],
        own_freezer: bool,
        uid: Option<u32>,
    ) -> Child {
        let procs = self.dir.join("cgroup.procs");
        let mut script = format!("echo $$ > '{}'", procs.display());
        if let Some(f) = self.freezer.as_ref().filter(|_| own_freezer) {
            script.push_str(&format!(
                " && echo $$ > '{}'",
                f.join("cgroup.procs").display()
            ));
        }
        script.push_str(" && exec");
        if let Some(uid) = uid {
            script.push_str(&format!(
                " setpriv --reuid={uid} --regid={uid} --clear-groups"
            ));
        }
        script.push_str(&format!(" '{}'", program.display()));
        for a in args {
            script.push_str(&format!(" '{a}'"));
        }
        Command::new("sh")
            .args(["-c", &script])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start a process in the cgroup")
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        // Kill what is left, then remove the directory (it must be empty).
        if let Ok(procs) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for pid in procs.split_whitespace() {
                let _ = Command::new("kill").args(["-CONT", pid]).status();
                let _ = Command::new("kill").args(["-KILL", pid]).status();
            }
        }
        self.thaw();
        for _ in 0..100 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        if let Some(f) = &self.freezer {
            for _ in 0..100 {
                if std::fs::remove_dir(f).is_ok() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
}

impl MemCgroup {
    /// memhog in the cgroup, ready to touch 768 MiB at 1 GiB/s once `go` exists (`extra`: more
    /// memhog arguments, e.g. workers); returns once it said "ready".
    pub fn spawn_hog(&self, go: &std::path::Path, extra: &[&str]) -> Child {
        let mut args = vec!["--rate-mib", "1024", "--total-mib", "768"];
        args.extend_from_slice(extra);
        let go = go.to_str().expect("a UTF-8 path");
        args.extend_from_slice(&["--wait-file", go]);
        let mut hog = self.spawn(&super::memhog(), &args);
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(hog.stdout.take().expect("memhog's stdout")),
            &mut line,
        )
        .expect("memhog's ready line");
        assert_eq!(line.trim(), "ready", "memhog did not start");
        hog
    }
}
