//! Where systemd runs the machine, a launched job runs in a transient scope of its own, as
//! `systemd-run --scope` would make it: asked of the system manager by root and of the user's own
//! manager by everyone else (whose subtree systemd delegates), over D-Bus with `busctl`
//! (`StartTransientUnit`, the job's pid held at its gate moved in by systemd). systemd then knows
//! the job, accounts for it, shows it in `systemctl status` and `systemd-cgls`, and removes the
//! scope when the job ends; nothing is made at the root of the cgroup tree. busctl is systemd's own
//! client and is there wherever systemd is, so this needs no D-Bus library.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use wait_timeout::ChildExt;

use super::error::LaunchError;

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

/// The arguments of the `busctl` call that starts `unit` around `pid`.
fn busctl_args(unit: &str, pid: u32, memory_max: Option<u64>, user: bool) -> Vec<String> {
    let mut props: Vec<[String; 3]> = vec![
        [
            "Description".into(),
            "s".into(),
            format!("memwatch launch: {unit}"),
        ],
        [
            "CollectMode".into(),
            "s".into(),
            "inactive-or-failed".into(),
        ],
    ];
    if let Some(bytes) = memory_max {
        props.push(["MemoryMax".into(), "t".into(), bytes.to_string()]);
    }
    let mut args: Vec<String> = Vec::new();
    if user {
        args.push("--user".into());
    }
    args.extend(
        [
            "call",
            "org.freedesktop.systemd1",
            "/org/freedesktop/systemd1",
            "org.freedesktop.systemd1.Manager",
            "StartTransientUnit",
            "ssa(sv)a(sa(sv))",
            unit,
            "fail",
        ]
        .map(String::from),
    );
    args.push((props.len() + 1).to_string());
    args.extend(["PIDs".into(), "au".into(), "1".into(), pid.to_string()]);
    for p in props {
        args.extend(p);
    }
    args.push("0".into());
    args
}

/// Asks systemd for `unit` around `pid` (held at its gate) and waits until the process is in it;
/// returns the scope's cgroup directory.
pub(super) fn start(unit: &str, pid: u32, memory_max: Option<u64>) -> Result<PathBuf, LaunchError> {
    let user = !nix::unistd::Uid::effective().is_root();
    let args = busctl_args(unit, pid, memory_max, user);
    let shown = format!("busctl {}", args.join(" "));
    let mut child = Command::new("busctl")
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(LaunchError::Busctl)?;
    match child.wait_timeout(START) {
        Ok(Some(status)) if status.success() => {}
        Ok(Some(status)) => {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            return Err(LaunchError::ScopeRefused {
                status,
                stderr: err.trim().to_owned(),
                call: shown,
            });
        }
        Ok(None) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(LaunchError::ScopeLate {
                after: START,
                call: shown,
            });
        }
        Err(e) => return Err(LaunchError::Busctl(e)),
    }
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

    /// The call is StartTransientUnit with the pid, the collect mode and the limit as typed
    /// properties, for systemd's manager or (not root) the user's.
    #[test]
    fn the_call_names_the_pid_and_the_limit() {
        let a = busctl_args("memwatch-t-1-0.scope", 42, Some(300 << 20), true);
        assert_eq!(a[0], "--user");
        let tail = a[7..].join(" ");
        assert_eq!(
            tail,
            "memwatch-t-1-0.scope fail 4 PIDs au 1 42 Description s memwatch launch: memwatch-t-1-0.scope \
             CollectMode s inactive-or-failed MemoryMax t 314572800 0"
        );
        assert_eq!(unit_part("a b/é"), "a_b__");
    }
}
