//! Who owns a job's cgroup: systemd (a unit's own cgroup, on the system manager or a user's) or
//! nobody memwatch knows of (cgroupfs). Decided once per job when it is attached or adopted, from its
//! cgroup path as `/proc/PID/cgroup` gives it, and carried by the job and its loans; memwatch's host
//! seam acts on it, so the engine never asks where a job runs. Whether systemd runs on the machine
//! is memwatch's `job::owner::of` to find out.
//!
//! systemd names a unit's cgroup after the unit (`cg_escape`: a name that begins with `_` or `.`, or
//! `cgroup.`, or a controller's name and a dot, or is one of v1's special files, gets a `_` in front),
//! nests it in its slices (`a.slice/a-b.slice/x.service`), and a user's manager runs inside
//! `user@UID.service`, whose subtree it owns. A cgroup under a unit that is not a slice (a delegated
//! subtree: a container runtime's, Slurm's) is its owner's to write, not systemd's.

use crate::held::{Bus, CgroupOwner};

/// The suffixes of units that have a cgroup of their own.
const UNIT_KINDS: [&str; 6] = [".service", ".scope", ".slice", ".socket", ".mount", ".swap"];

/// v1's and v2's controller names: a unit named `NAME.…` after one of these is escaped.
const CONTROLLERS: [&str; 14] = [
    "cpu",
    "cpuacct",
    "cpuset",
    "io",
    "blkio",
    "memory",
    "devices",
    "pids",
    "bpf-firewall",
    "bpf-devices",
    "bpf-foreign",
    "bpf-socket-bind",
    "bpf-restrict-network-interfaces",
    "freezer",
];

/// The unit whose cgroup a directory name is (`cg_unescape`), if it names one.
fn unit_of(component: &str) -> Option<String> {
    let name = component.strip_prefix('_').unwrap_or(component);
    let valid = !name.is_empty()
        && name.len() <= 255
        && UNIT_KINDS
            .iter()
            .any(|k| name.len() > k.len() && name.ends_with(k))
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ":-_.\\@".contains(c));
    // An unescaped name that systemd would have escaped is a directory someone else made.
    let escaped = component.starts_with('_');
    let needs_escape = name.starts_with('_')
        || name.starts_with('.')
        || name.starts_with("cgroup.")
        || CONTROLLERS
            .iter()
            .any(|c| name.strip_prefix(c).is_some_and(|r| r.starts_with('.')));
    (valid && escaped == needs_escape).then(|| name.to_owned())
}

/// The uid of a user's manager from its unit (`user@1000.service`).
fn user_manager(unit: &str) -> Option<u32> {
    unit.strip_prefix("user@")?
        .strip_suffix(".service")?
        .parse()
        .ok()
}

/// The owner of the cgroup at `path` (inside the hierarchy, as `/proc/PID/cgroup` has it) on a
/// machine where systemd does (`systemd`) or does not run. Pure.
pub fn of_path(path: &str, systemd: bool) -> CgroupOwner {
    if !systemd {
        return CgroupOwner::Cgroupfs;
    }
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let Some((last, parents)) = parts.split_last() else {
        return CgroupOwner::Cgroupfs;
    };
    let mut bus = Bus::System;
    for p in parents {
        match unit_of(p) {
            Some(u) if u.ends_with(".slice") => {}
            // The user's manager owns what is below it.
            Some(u) if bus == Bus::System => match user_manager(&u) {
                Some(uid) => bus = Bus::User(uid),
                None => return CgroupOwner::Cgroupfs,
            },
            _ => return CgroupOwner::Cgroupfs,
        }
    }
    match unit_of(last) {
        Some(unit) => CgroupOwner::Systemd { bus, unit },
        None => CgroupOwner::Cgroupfs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn system(unit: &str) -> CgroupOwner {
        CgroupOwner::Systemd {
            bus: Bus::System,
            unit: unit.into(),
        }
    }

    fn user(uid: u32, unit: &str) -> CgroupOwner {
        CgroupOwner::Systemd {
            bus: Bus::User(uid),
            unit: unit.into(),
        }
    }

    #[test]
    fn units_are_read_from_their_cgroup_paths() {
        let cases: &[(&str, CgroupOwner)] = &[
            ("/system.slice/train.service", system("train.service")),
            ("/system.slice/run-u7.scope", system("run-u7.scope")),
            (
                "/user.slice/user-1000.slice/session-3.scope",
                system("session-3.scope"),
            ),
            (
                "/user.slice/user-1000.slice/user@1000.service",
                system("user@1000.service"),
            ),
            (
                "/user.slice/user-1000.slice/user@1000.service/app.slice/train.service",
                user(1000, "train.service"),
            ),
            (
                "/user.slice/user-1000.slice/user@1000.service/app.slice/run-r3f.scope",
                user(1000, "run-r3f.scope"),
            ),
            (
                "/user.slice/user-1000.slice/user@1000.service/app.slice",
                user(1000, "app.slice"),
            ),
            ("/machine.slice", system("machine.slice")),
            (
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-ab.scope",
                system("cri-containerd-ab.scope"),
            ),
            // systemd-escape's \x2d stays as the unit is named.
            (
                "/system.slice/system-train.slice/train@gpu\\x2d0.service",
                system("train@gpu\\x2d0.service"),
            ),
            // cg_escape: a name that would clash with a controller's files gets a `_`.
            ("/system.slice/_cpu.service", system("cpu.service")),
            ("/system.slice/__x.service", system("_x.service")),
            ("/system.slice/_cgroup.service", system("cgroup.service")),
        ];
        for (path, want) in cases {
            assert_eq!(&of_path(path, true), want, "{path}");
        }
    }

    #[test]
    fn what_is_not_a_units_own_cgroup_is_written_directly() {
        for path in [
            "/",
            "",
            "/memwatch/job-1",
            // A delegated subtree: below a service, Slurm's and a runtime's own cgroups.
            "/system.slice/slurmstepd.scope/job_42/step_0",
            "/system.slice/docker.service/inner",
            // Not a unit name (a space; unescaped where systemd escapes; an empty name).
            "/system.slice/my job.service",
            "/system.slice/cpu.service",
            "/system.slice/.service",
            // A user's manager inside another's.
            "/user.slice/user-1.slice/user@1.service/app.slice/user@2.service/x.service",
            // A parent that is no unit.
            "/jobs/train.service",
        ] {
            assert_eq!(of_path(path, true), CgroupOwner::Cgroupfs, "{path}");
        }
        assert_eq!(
            of_path("/system.slice/train.service", false),
            CgroupOwner::Cgroupfs,
            "no systemd, no unit"
        );
    }

    #[test]
    fn owners_are_named_for_people_and_records() {
        assert_eq!(
            user(1000, "t.service").to_string(),
            "systemd unit t.service of user 1000's manager"
        );
        let json = serde_json::to_value(user(1000, "t.service")).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"kind": "systemd", "bus": {"user": 1000}, "unit": "t.service"})
        );
        assert_eq!(
            serde_json::to_value(system("t.service")).unwrap()["bus"],
            "system"
        );
    }
}
