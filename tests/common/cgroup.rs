//! Real memory cgroups for tests (v1 where the memory controller is on v1, as on the CI machines;
//! v2 where it is on the unified hierarchy). Removed on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

pub struct MemCgroup {
    pub dir: PathBuf,
    pub version: u8,
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
        let cg = MemCgroup { dir, version };
        cg.set_limit(limit);
        Some(cg)
    }

    pub fn set_limit(&self, bytes: u64) {
        let file = if self.version == 1 {
            "memory.limit_in_bytes"
        } else {
            "memory.max"
        };
        std::fs::write(self.dir.join(file), bytes.to_string())
            .expect("set the cgroup's memory limit");
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

    /// Starts `program args` inside the cgroup (the shell moves itself in, then execs).
    pub fn spawn(&self, program: &std::path::Path, args: &[&str]) -> Child {
        let procs = self.dir.join("cgroup.procs");
        let mut script = format!(
            "echo $$ > '{}' && exec '{}'",
            procs.display(),
            program.display()
        );
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
        for _ in 0..100 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
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
