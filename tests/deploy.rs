//! The Kubernetes manifest (deploy/kubernetes/memwatch.yaml): validated against Kubernetes' own schemas
//! (PyPI's kubernetes-validate, strict), and checked against what it must agree with: the systemd
//! unit's capabilities and writable paths, memwatch's own config parser, and the Service and
//! ServiceMonitor that scrape it.

mod common;

use common::manifest::{docs, of_kind};
use yaml_rust2::Yaml;

fn strs(y: &Yaml) -> Vec<String> {
    y.as_vec()
        .map(|v| {
            v.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The value of `Key=` in the unit, words split.
fn unit(key: &str) -> Vec<String> {
    let text = std::fs::read_to_string(common::repo().join("systemd/memwatch.service")).unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix(&format!("{key}=")))
        .flat_map(|v| v.split_whitespace().map(str::to_owned))
        .collect()
}

#[test]
fn the_daemonset_matches_the_unit_the_config_and_its_scraper() {
    let docs = docs();
    for d in &docs {
        assert!(
            d["apiVersion"].as_str().is_some() && d["metadata"]["name"].as_str().is_some(),
            "{d:?}"
        );
    }
    let ds = of_kind(&docs, "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(
        pod["hostPID"].as_bool(),
        Some(true),
        "jobs are followed by host pids"
    );
    assert_eq!(pod["automountServiceAccountToken"].as_bool(), Some(false));
    let c = &pod["containers"][0];
    let sc = &c["securityContext"];
    // The same capabilities as the unit's bounding set, and nothing else.
    let mut caps = strs(&sc["capabilities"]["add"]);
    let mut want: Vec<String> = unit("CapabilityBoundingSet")
        .iter()
        .map(|c| c.trim_start_matches("CAP_").to_owned())
        .collect();
    caps.sort();
    want.sort();
    assert_eq!(caps, want);
    assert_eq!(strs(&sc["capabilities"]["drop"]), vec!["ALL"]);
    assert_eq!(unit("NoNewPrivileges"), vec!["yes"]);
    assert_eq!(sc["allowPrivilegeEscalation"].as_bool(), Some(false));
    assert_eq!(unit("ProtectSystem"), vec!["strict"]);
    assert_eq!(sc["readOnlyRootFilesystem"].as_bool(), Some(true));
    // Mounts: the host's /proc and /sys read-only; writable only what the unit makes writable.
    let mounts = c["volumeMounts"].as_vec().unwrap();
    let mount = |path: &str| {
        mounts
            .iter()
            .find(|m| m["mountPath"].as_str() == Some(path))
            .unwrap_or_else(|| panic!("no mount at {path}"))
    };
    let ro = |path: &str| mount(path)["readOnly"].as_bool() == Some(true);
    assert!(ro("/host/proc") && ro("/host/sys") && ro("/etc/memwatch"));
    assert_eq!(unit("ReadWritePaths"), vec!["/sys/fs/cgroup"]);
    for writable in ["/host/sys/fs/cgroup", "/run/memwatch", "/var/lib/memwatch"] {
        assert!(!ro(writable), "{writable} must be writable");
    }
    for m in mounts {
        let writable = m["readOnly"].as_bool() != Some(true);
        let path = m["mountPath"].as_str().unwrap();
        assert!(
            !writable
                || ["/host/sys/fs/cgroup", "/run/memwatch", "/var/lib/memwatch"].contains(&path),
            "{path} is writable and the unit allows no such thing"
        );
        // Each mount has its volume, from the host where it says /host.
        let name = m["name"].as_str().unwrap();
        let vol = pod["volumes"]
            .as_vec()
            .unwrap()
            .iter()
            .find(|v| v["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("no volume {name}"));
        if let Some(host) = path.strip_prefix("/host") {
            assert_eq!(vol["hostPath"]["path"].as_str(), Some(host), "{path}");
        }
    }
    // The config memwatch reads there is valid for memwatch and agrees with the mounts and ports.
    let cm = of_kind(&docs, "ConfigMap");
    let toml = cm["data"]["memwatch.toml"].as_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("memwatch.toml");
    std::fs::write(&f, toml).unwrap();
    let (code, out, err) = common::memwatch(&["--config", f.to_str().unwrap(), "config", "check"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("listen = \"0.0.0.0:9300\"") && out.contains("root = \"/host\""),
        "{out}"
    );
    assert!(
        out.contains("socket = \"/run/memwatch/control.sock\"")
            && out.contains("state_dir = \"/var/lib/memwatch\""),
        "{out}"
    );
    assert_eq!(c["ports"][0]["containerPort"].as_i64(), Some(9300));
    assert_eq!(
        strs(&c["args"]),
        vec!["--config", "/etc/memwatch/memwatch.toml", "run"]
    );
    assert_eq!(
        c["readinessProbe"]["httpGet"]["path"].as_str(),
        Some("/-/ready")
    );
    assert_eq!(
        c["livenessProbe"]["httpGet"]["path"].as_str(),
        Some("/-/healthy")
    );
    // The Service selects the pods; the ServiceMonitor selects the Service and scrapes its port.
    let labels = &ds["spec"]["template"]["metadata"]["labels"];
    let svc = of_kind(&docs, "Service");
    assert_eq!(&svc["spec"]["selector"], labels);
    let sm = of_kind(&docs, "ServiceMonitor");
    assert_eq!(
        &sm["spec"]["selector"]["matchLabels"],
        &svc["metadata"]["labels"]
    );
    assert_eq!(
        sm["spec"]["endpoints"][0]["port"],
        svc["spec"]["ports"][0]["name"]
    );
    assert_eq!(
        sm["spec"]["endpoints"][0]["path"].as_str(),
        Some("/metrics")
    );
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], c["ports"][0]["name"]);
}

/// The schema validator: `MEMWATCH_KUBERNETES_VALIDATE` (scripts/test.sh installs it and sets this),
/// else `kubernetes-validate` on the PATH.
fn validate(manifest: &std::path::Path) -> (bool, String) {
    let validator = std::env::var_os("MEMWATCH_KUBERNETES_VALIDATE")
        .unwrap_or_else(|| "kubernetes-validate".into());
    let out = std::process::Command::new(&validator)
        .args(["--strict", "--kubernetes-version", "1.37.0"])
        .arg(manifest)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {validator:?} ({e}): install it with pip install -r \
                 deploy/kubernetes/requirements-validate.txt (scripts/test.sh does)"
            )
        });
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn the_manifest_passes_kubernetes_own_schemas_strictly() {
    let manifest = common::repo().join("deploy/kubernetes/memwatch.yaml");
    let (ok, out) = validate(&manifest);
    assert!(ok, "{out}");
    for resource in [
        "namespace/memwatch",
        "serviceaccount/memwatch",
        "configmap/memwatch",
        "daemonset/memwatch",
        "service/memwatch",
    ] {
        assert!(
            out.contains(&format!("passed for resource {resource} ")),
            "{resource} was not validated: {out}"
        );
    }
    // The Prometheus Operator's ServiceMonitor is a custom resource, not among Kubernetes' schemas: the
    // one document only the checks above cover.
    assert_eq!(out.matches("Couldn't find schema").count(), 1, "{out}");
    assert!(out.contains("kind ServiceMonitor"), "{out}");

    // The validator is live: a field Kubernetes does not know in the pod spec is refused.
    let text = std::fs::read_to_string(&manifest).unwrap();
    let bad = text.replacen("hostPID: true", "hostPID: true\n      hostPIDs: true", 1);
    assert_ne!(bad, text, "the manifest no longer sets hostPID");
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("memwatch.yaml");
    std::fs::write(&copy, bad).unwrap();
    let (ok, out) = validate(&copy);
    assert!(!ok, "an unknown pod field passed: {out}");
    assert!(out.contains("'hostPIDs' was unexpected"), "{out}");
}
