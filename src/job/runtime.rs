//! The name a container's runtime gives it, from the runtime's own records on the host, so that a job
//! attached without a name is called what its user calls it ("trainer", a pod's
//! "NAMESPACE.POD.CONTAINER") rather than after its id. Read as the daemon (root); nothing is asked of
//! the runtime's API, and where the records are not there the name stays the id's
//! (`Origin::short`).
//!
//! - Docker: `/var/lib/docker/containers/ID/config.v2.json`, its `Name` ("/trainer"), or the
//!   Kubernetes labels a dockershim pod's container carries.
//! - containerd (Kubernetes through CRI, nerdctl, Docker's own tasks): the OCI bundle's
//!   `config.json` under `/run/containerd/io.containerd.runtime.v2.task/NAMESPACE/ID/`, its
//!   annotations `io.kubernetes.cri.sandbox-namespace`, `…sandbox-name` and `…container-name`
//!   (nerdctl's `nerdctl/name`).
//! - CRI-O: `/run/containers/storage/overlay-containers/ID/userdata/config.json`, annotations
//!   `io.kubernetes.pod.namespace`, `io.kubernetes.pod.name` and `io.kubernetes.container.name`.
//! - Podman (rootful): a pod played from Kubernetes YAML (`podman kube play`) by the same annotations
//!   in `/var/lib/containers/storage/overlay-containers/ID/userdata/config.json`; any other
//!   container by its first name in containers/storage's list of containers,
//!   `/var/lib/containers/storage/overlay-containers/containers.json` (`vfs-containers/` with the
//!   vfs driver).

use std::path::Path;

use serde_json::Value;

use super::origin::Origin;

/// The runtime's name for the container `origin` names, if its records say.
pub fn name(root: &Path, origin: &Origin) -> Option<String> {
    let id = origin.id.as_str();
    match origin.kind.as_str() {
        "docker" => docker(root, id).or_else(|| containerd(root, id)),
        "containerd" | "kubernetes" => containerd(root, id).or_else(|| crio(root, id, RUN_STORAGE)),
        "cri-o" => crio(root, id, RUN_STORAGE),
        "podman" => crio(root, id, LIB_STORAGE).or_else(|| podman(root, id)),
        _ => None,
    }
}

const RUN_STORAGE: &str = "run/containers/storage/overlay-containers";
const LIB_STORAGE: &str = "var/lib/containers/storage/overlay-containers";

/// A runtime's JSON record (a few KiB; the first MiB is read).
fn record(path: &Path) -> Option<Value> {
    serde_json::from_str(&crate::sample::error::read_text(path).ok()?).ok()
}

/// "NAMESPACE.POD.CONTAINER" from a map of Kubernetes annotations or labels under `keys`.
fn pod_name(map: &Value, keys: [&str; 3]) -> Option<String> {
    let parts: Option<Vec<&str>> = keys.iter().map(|k| map.get(*k)?.as_str()).collect();
    Some(parts?.join("."))
}

fn docker(root: &Path, id: &str) -> Option<String> {
    let v = record(
        &root
            .join("var/lib/docker/containers")
            .join(id)
            .join("config.v2.json"),
    )?;
    pod_name(
        &v["Config"]["Labels"],
        [
            "io.kubernetes.pod.namespace",
            "io.kubernetes.pod.name",
            "io.kubernetes.container.name",
        ],
    )
    .or_else(|| Some(v["Name"].as_str()?.trim_start_matches('/').to_owned()))
}

fn containerd(root: &Path, id: &str) -> Option<String> {
    let tasks = root.join("run/containerd/io.containerd.runtime.v2.task");
    std::fs::read_dir(&tasks)
        .ok()?
        .filter_map(Result::ok)
        .find_map(|ns| {
            let a = record(&ns.path().join(id).join("config.json"))?["annotations"].take();
            pod_name(
                &a,
                [
                    "io.kubernetes.cri.sandbox-namespace",
                    "io.kubernetes.cri.sandbox-name",
                    "io.kubernetes.cri.container-name",
                ],
            )
            .or_else(|| Some(a["nerdctl/name"].as_str()?.to_owned()))
        })
}

/// containers/storage's list, `[{"id": …, "names": ["trainer"], …}, …]`, under each storage driver.
fn podman(root: &Path, id: &str) -> Option<String> {
    ["overlay", "vfs"].iter().find_map(|driver| {
        let list = record(
            &root
                .join("var/lib/containers/storage")
                .join(format!("{driver}-containers"))
                .join("containers.json"),
        )?;
        let c = list.as_array()?.iter().find(|c| c["id"] == id)?;
        Some(c["names"].get(0)?.as_str()?.to_owned())
    })
}

fn crio(root: &Path, id: &str, storage: &str) -> Option<String> {
    let v = record(&root.join(storage).join(id).join("userdata/config.json"))?;
    pod_name(
        &v["annotations"],
        [
            "io.kubernetes.pod.namespace",
            "io.kubernetes.pod.name",
            "io.kubernetes.container.name",
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f2a1b9c0d1e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f90";

    fn origin(kind: &str) -> Origin {
        Origin {
            kind: kind.into(),
            id: ID.into(),
            pod: None,
            step: None,
            name: None,
        }
    }

    fn put(root: &Path, rel: &str, json: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, json).unwrap();
    }

    /// Each runtime's record, as it lays it out, names the container; none is no name.
    #[test]
    fn each_runtimes_record_names_its_container() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        assert_eq!(name(root, &origin("docker")), None);
        put(
            root,
            &format!("var/lib/docker/containers/{ID}/config.v2.json"),
            r#"{"ID": "x", "Name": "/trainer", "Config": {"Labels": {}}}"#,
        );
        assert_eq!(name(root, &origin("docker")).as_deref(), Some("trainer"));
        put(
            root,
            &format!("run/containerd/io.containerd.runtime.v2.task/k8s.io/{ID}/config.json"),
            r#"{"ociVersion": "1.1.0", "annotations": {
                "io.kubernetes.cri.container-type": "container",
                "io.kubernetes.cri.sandbox-namespace": "ml",
                "io.kubernetes.cri.sandbox-name": "bert-7f9c",
                "io.kubernetes.cri.container-name": "train"}}"#,
        );
        assert_eq!(
            name(root, &origin("containerd")).as_deref(),
            Some("ml.bert-7f9c.train")
        );
        put(
            root,
            &format!("{RUN_STORAGE}/{ID}/userdata/config.json"),
            r#"{"annotations": {"io.kubernetes.pod.namespace": "ml",
                "io.kubernetes.pod.name": "gpt-1", "io.kubernetes.container.name": "w"}}"#,
        );
        assert_eq!(name(root, &origin("cri-o")).as_deref(), Some("ml.gpt-1.w"));
        // A podman container outside a played pod: by its name in containers/storage's list.
        put(
            root,
            &format!("{LIB_STORAGE}/{ID}/userdata/config.json"),
            r#"{"annotations": {"io.container.manager": "libpod"}}"#,
        );
        assert_eq!(name(root, &origin("podman")), None);
        put(
            root,
            &format!("{LIB_STORAGE}/containers.json"),
            &format!(
                r#"[{{"id": "0{}", "names": ["other"]}}, {{"id": "{ID}", "names": ["trainer", "t2"], "image": "x"}}]"#,
                &ID[1..]
            ),
        );
        assert_eq!(name(root, &origin("podman")).as_deref(), Some("trainer"));
        assert_eq!(name(root, &origin("slurm")), None);
        // Garbage is no name, not an error (and no containerd task of that id either).
        std::fs::remove_dir_all(root.join("run/containerd")).unwrap();
        put(
            root,
            &format!("var/lib/docker/containers/{ID}/config.v2.json"),
            "{not json",
        );
        assert_eq!(name(root, &origin("docker")), None);
    }
}
