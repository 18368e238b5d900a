//! Where systemd runs the machine, a launched job runs in a transient scope of its own, as
//! `systemd-run --scope` would make it: asked of the system manager by root and of the user's own
//! manager by everyone else (whose subtree systemd delegates), over D-Bus (`StartTransientUnit`,
//! the job's pid held at its gate moved in by systemd; the manager reached by its bus or its private
//! socket, `manager.rs`). systemd then knows the job, accounts for it, shows it in `systemctl
//! status` and `systemd-cgls`, and removes the scope when the job ends; nothing is made at the root
//! of the cgroup tree.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::error::LaunchError;
use super::manager::{Manager, Ways};

/// How long systemd may take to start the scope.
const START: Duration = Duration::from_secs(10);

/// Whether systemd is the init system here with cgroup v2's memory controller (`sd_booted`'s test).
pub(super) fn systemd_runs_here() -> bool {
    Path::new("/run/systemd/system").is_dir()
        && std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
            .is_ok_and(|c| c.split_whitespace().any(|x| x == "memory"))
}

/// A unit name's part from a job name: what systemd allows, anything else as `_`.
fn unit_part(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_-.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The scope's name for run `run` of the job `name` launched by this process.
pub(super) fn unit_name(name: &str, run: u32) -> String {
    format!(
        "memwatch-{}-{}-{run}.scope",
        unit_part(name),
        std::process::id()
    )
}

/// Asks systemd for `unit` around `pid` (held at its gate) and waits until the process is in it;
/// returns the scope's cgroup directory.
pub(super) fn start(unit: &str, pid: u32, memory_max: Option<u64>) -> Result<PathBuf, LaunchError> {
    let ways = Ways::for_caller();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(LaunchError::Runtime)?;
    let asked = Instant::now();
    runtime.block_on(async {
        let manager = Manager::reach(&ways, START).await?;
        let left = START.saturating_sub(asked.elapsed());
        match tokio::time::timeout(left, manager.start_scope(unit, pid, memory_max)).await {
            Ok(done) => done,
            Err(_) => Err(LaunchError::ScopeLate {
                after: START,
                unit: unit.to_owned(),
                via: manager.via.clone(),
            }),
        }
    })?;
    // The job is in the scope once its /proc/PID/cgroup names it.
    let started = Instant::now();
    loop {
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        if let Some(path) = text
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .filter(|p| p.ends_with(&format!("/{unit}")))
        {
            return Ok(Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/')));
        }
        if started.elapsed() >= START {
            return Err(LaunchError::NotInScope {
                unit: unit.to_owned(),
                cgroup: text.trim().to_owned(),
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A unit name keeps what systemd allows of the job's name.
    #[test]
    fn a_unit_name_keeps_what_systemd_allows() {
        assert_eq!(unit_part("a b/é"), "a_b__");
        assert!(unit_name("t", 0).starts_with("memwatch-t-"));
        assert!(unit_name("t", 0).ends_with("-0.scope"));
    }
}
