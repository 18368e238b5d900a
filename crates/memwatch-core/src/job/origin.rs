//! Where a job runs, read from its cgroup path: a Docker, containerd, CRI-O or Podman container (with
//! its Kubernetes pod), or a Slurm job. Pure: the path in, the origin out. The layouts are those the
//! runtimes create with the cgroupfs and the systemd drivers, on cgroup v1 and v2.

use serde::{Deserialize, Serialize};

use crate::sample::cgroup::Membership;

/// A job's container or batch job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    /// "docker", "containerd", "cri-o", "podman", "kubernetes" (a pod's container whose runtime the
    /// path does not say) or "slurm".
    pub kind: String,
    /// The container id (64 hex digits), or the Slurm job id.
    pub id: String,
    /// The Kubernetes pod's uid, for a container in a pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The Slurm step ("0", "batch", "extern" …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// The name its runtime gives it, where the runtime's own records say (the host's view reads
    /// them, `memwatch::job::runtime`): a Docker container's name ("trainer"), a Kubernetes pod's
    /// container as "NAMESPACE.POD.CONTAINER".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Origin {
    /// A short name for people and for default job names: the runtime's name where it is a valid
    /// job name ("trainer", "ml.bert-7f9c.train"), else "docker-3f2a1b9c0d1e",
    /// "pod-1a2b3c4d-3f2a1b9c0d1e", "slurm-4242".
    pub fn short(&self) -> String {
        if let Some(name) = self.name.as_deref().filter(|n| is_job_name(n)) {
            return name.to_owned();
        }
        let id: String = self.id.chars().take(12).collect();
        match (&self.pod, self.kind.as_str()) {
            (Some(pod), _) => format!("pod-{}-{id}", &pod[..pod.len().min(8)]),
            (None, "slurm") => format!("slurm-{}", self.id),
            (None, kind) => format!("{kind}-{id}"),
        }
    }
}

/// 1 to 64 letters, digits, '-', '_' or '.', not a number (the rule for a job's name).
fn is_job_name(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && s.parse::<u64>().is_err()
}

fn is_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `prefix<id>.scope` or `prefix<id>` with a container id.
fn id_after<'a>(component: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = component.strip_prefix(prefix)?;
    let id = rest.strip_suffix(".scope").unwrap_or(rest);
    is_id(id).then_some(id)
}

/// A pod uid from `pod<uid>` (cgroupfs) or `kubepods-<qos>-pod<uid_with_underscores>.slice` (systemd).
fn pod_of(component: &str) -> Option<String> {
    let c = component.strip_suffix(".slice").unwrap_or(component);
    let uid = c.rsplit_once("pod").map(|(_, u)| u)?;
    let uid = uid.replace('_', "-");
    (uid.len() == 36 && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-')).then_some(uid)
}

/// The origin of a cgroup path, if it is a container's or a Slurm job's.
pub fn of_path(path: &str) -> Option<Origin> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let pod = parts.iter().find_map(|p| pod_of(p));
    let container = |kind: &str, id: &str| {
        Some(Origin {
            kind: kind.into(),
            id: id.into(),
            pod: pod.clone(),
            step: None,
            name: None,
        })
    };
    for (i, p) in parts.iter().enumerate().rev() {
        if let Some(job) = p.strip_prefix("job_").filter(|j| j.parse::<u64>().is_ok()) {
            if parts[..i]
                .iter()
                .any(|a| *a == "slurm" || a.starts_with("slurm_") || a.starts_with("slurmstepd"))
            {
                return Some(Origin {
                    kind: "slurm".into(),
                    id: job.into(),
                    pod: None,
                    step: parts[i + 1..]
                        .iter()
                        .find_map(|s| s.strip_prefix("step_"))
                        .map(str::to_owned),
                    name: None,
                });
            }
        }
        for (prefix, kind) in [
            ("docker-", "docker"),
            ("cri-containerd-", "containerd"),
            ("nerdctl-", "containerd"),
            ("crio-", "cri-o"),
            ("libpod-", "podman"),
        ] {
            if let Some(id) = id_after(p, prefix) {
                return container(kind, id);
            }
        }
        if is_id(p) {
            let parent = i.checked_sub(1).map(|j| parts[j]);
            return match parent {
                Some("docker") => container("docker", p),
                Some(_) if pod.is_some() => container("kubernetes", p),
                // containerd's cgroupfs layout: /<namespace>/<id>.
                Some(_) => container("containerd", p),
                None => None,
            };
        }
    }
    None
}

/// The origin of a process from its cgroup membership: the memory controller's path on v1, else the
/// unified path.
pub fn of_membership(m: &Membership) -> Option<Origin> {
    m.v1_memory
        .as_deref()
        .and_then(of_path)
        .or_else(|| m.v2.as_deref().and_then(of_path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::cgroup::parse_membership;

    const ID: &str = "3f2a1b9c0d1e4f5a6b7c8d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c";
    const POD: &str = "1a2b3c4d-5e6f-7081-92a3-b4c5d6e7f809";

    fn fixture(name: &str) -> Option<Origin> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/cgroups")
            .join(name);
        let text = std::fs::read_to_string(&path).unwrap();
        of_membership(&parse_membership(&path, &text).unwrap())
    }

    #[test]
    fn containers_and_slurm_jobs_on_v1_and_v2() {
        for (file, kind, pod, short) in [
            ("docker-v1", "docker", None, "docker-3f2a1b9c0d1e"),
            ("docker-v2", "docker", None, "docker-3f2a1b9c0d1e"),
            (
                "containerd-v1",
                "containerd",
                None,
                "containerd-3f2a1b9c0d1e",
            ),
            (
                "containerd-v2",
                "containerd",
                None,
                "containerd-3f2a1b9c0d1e",
            ),
            (
                "kubepods-containerd-v1",
                "kubernetes",
                Some(POD),
                "pod-1a2b3c4d-3f2a1b9c0d1e",
            ),
            (
                "kubepods-containerd-v2",
                "containerd",
                Some(POD),
                "pod-1a2b3c4d-3f2a1b9c0d1e",
            ),
            ("crio-v1", "cri-o", Some(POD), "pod-1a2b3c4d-3f2a1b9c0d1e"),
            ("crio-v2", "cri-o", Some(POD), "pod-1a2b3c4d-3f2a1b9c0d1e"),
            ("podman-v1", "podman", None, "podman-3f2a1b9c0d1e"),
            ("podman-v2", "podman", None, "podman-3f2a1b9c0d1e"),
        ] {
            let o = fixture(file).unwrap_or_else(|| panic!("{file}: no origin"));
            assert_eq!(
                (o.kind.as_str(), o.id.as_str(), o.pod.as_deref()),
                (kind, ID, pod),
                "{file}"
            );
            assert_eq!(o.short(), short, "{file}");
        }
        for (file, step) in [("slurm-v1", "0"), ("slurm-v2", "batch")] {
            let o = fixture(file).unwrap();
            assert_eq!(
                (o.kind.as_str(), o.id.as_str(), o.step.as_deref()),
                ("slurm", "4242", Some(step)),
                "{file}"
            );
            assert_eq!(o.short(), "slurm-4242");
        }
        // Several slurmd on one host (`slurm_NODE`), as the cgroup plugin names them.
        let o = of_path("/slurm_node1/uid_0/job_7/step_batch/task_0").unwrap();
        assert_eq!((o.id.as_str(), o.step.as_deref()), ("7", Some("batch")));
        // The job's own cgroup names the job and no step.
        assert_eq!(of_path("/slurm/uid_0/job_7").unwrap().step, None);
        assert_eq!(fixture("none-v2"), None);
        // The runtime's own name, where the host's records gave one that makes a job's name.
        let mut named = fixture("docker-v2").unwrap();
        named.name = Some("trainer".into());
        assert_eq!(named.short(), "trainer");
        named.name = Some("a/b".into());
        assert_eq!(named.short(), "docker-3f2a1b9c0d1e");
        named.name = Some("1234".into());
        assert_eq!(named.short(), "docker-3f2a1b9c0d1e");
        // Not ids: a conmon scope, a short hex name, a job_ outside Slurm.
        assert_eq!(
            of_path(&format!("/machine.slice/libpod-conmon-{ID}.scope")),
            None
        );
        assert_eq!(of_path("/docker/abc123"), None);
        assert_eq!(of_path("/user.slice/job_12"), None);
    }
}
