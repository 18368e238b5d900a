//! What the page-cache tests share: a v1 memory cgroup with its own freezer and a daemon to watch a
//! job in it, and a file the job's reads bring into the cache.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command};

use super::Daemon;
use super::cgroup::MemCgroup;

/// A v1 memory cgroup limited to `limit` bytes with a freezer cgroup of its own, and a daemon that
/// samples and probes every second and predicts nothing (`reaction_ms = 0`): only the lines decide.
/// `None`, said on stderr, where this machine has no v1 memory and freezer controllers (the reflex
/// rides on v1's thresholds).
pub fn cgroup_and_daemon(test: &str, limit: u64) -> Option<(MemCgroup, Daemon)> {
    let Some(mut cg) = MemCgroup::new(limit) else {
        super::skip::cannot_run(test, "no memory cgroup to test in (needs root)");
        return None;
    };
    if cg.version != 1 || !cg.with_freezer() {
        super::skip::cannot_run(test, "no v1 memory and freezer controllers");
        return None;
    }
    Some((cg, Daemon::level_only()))
}

/// `mib` MiB of zeros in `dir/name`, written past the page cache (O_DIRECT), so that a job's reads
/// are what cache it, in the job's own cgroup. `dir` should be on a disk, not a tmpfs, whose pages
/// stay charged to their writer.
pub fn uncached_file(dir: &Path, name: &str, mib: u64) -> PathBuf {
    let file = dir.join(name);
    let dd = Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", file.display()))
        .args([
            "bs=1M",
            &format!("count={mib}"),
            "oflag=direct",
            "status=none",
        ])
        .status()
        .expect("dd");
    assert!(dd.success(), "dd could not write {}", file.display());
    file
}

/// `sh -c script` started in `cg` (the script's first line is `ready`), attached to `d` as `name`
/// once it said so, and its reflex recorded as armed: the child and its stdout past that line.
pub fn attached_job(
    cg: &MemCgroup,
    d: &Daemon,
    script: &str,
    name: &str,
) -> (Child, BufReader<ChildStdout>) {
    let mut job = cg.spawn(Path::new("/bin/sh"), &["-c", script]);
    let mut out = BufReader::new(job.stdout.take().expect("the job's stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("the job's first line");
    assert_eq!(line.trim(), "ready");
    let pid = job.id().to_string();
    let (code, _, err) = d.ctl(&["attach", &pid, "--name", name]);
    assert_eq!(code, 0, "attach: {err}");
    d.wait_until(
        |d| super::recorded_pause(&d.runtime, name).is_some_and(|p| p["phase"] == "armed"),
        "the reflex recorded as armed",
    );
    (job, out)
}
