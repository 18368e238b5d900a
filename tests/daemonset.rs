//! The DaemonSet of `deploy/kubernetes/memwatch.yaml`, run as its pod would run, by docker on this
//! node: the image `scripts/build-image.sh` builds from this repository (a debootstrap root and the
//! Debian package; nothing pulled); the pod's host pid namespace, user, read-only root, capabilities,
//! no privilege escalation, volumes and args all read from the manifest itself; its ConfigMap as the
//! config, with only the address moved to a free port on the host's network (the pod's own port) and
//! the socket and state directories made fresh for the test. A training container beside it,
//! attached by its host pid through the socket the pod shares on the host: its cgroup's limit is
//! watched, it is paused by a freeze of its cgroup in the host's cgroup tree and resumed, and its
//! engine sees it running after, never OOM-killed. Not a kubelet: no probes, no ConfigMap updates.

mod common;

use std::net::TcpListener;
use std::process::Command;

use common::containers::Engine;
use common::manifest::of_kind;

const MIB: u64 = 1 << 20;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// `memwatch ARGS --socket SOCKET` on the host: (exit code, stdout, stderr).
fn ctl(socket: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(common::bin())
        .args(args)
        .arg("--socket")
        .arg(socket)
        .output()
        .expect("run memwatch");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn job(socket: &std::path::Path, name: &str) -> serde_json::Value {
    let (code, out, err) = ctl(socket, &["jobs", "--json"]);
    assert_eq!(code, 0, "memwatch jobs: {err}");
    let jobs: Vec<serde_json::Value> = serde_json::from_str(&out).expect("jobs --json");
    jobs.into_iter()
        .find(|j| j["name"] == name)
        .unwrap_or(serde_json::Value::Null)
}

#[test]
fn the_daemonset_attaches_freezes_and_resumes_a_training_container_on_this_node() {
    let Some(docker) = Engine::get("docker") else {
        return;
    };
    // The image, from this repository.
    let deb = common::script_output("scripts/build-deb.sh", &["--debug"]);
    let image = common::script_output("scripts/build-image.sh", &["--deb", &deb, "docker"]);

    // The pod, from the manifest.
    let docs = common::manifest::docs();
    let ds = of_kind(&docs, "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(
        c["image"].as_str(),
        Some(image.as_str()),
        "the manifest names the image built"
    );
    let port = free_port();
    let toml = of_kind(&docs, "ConfigMap")["data"]["memwatch.toml"]
        .as_str()
        .expect("the ConfigMap's memwatch.toml")
        .replace(
            "listen = \"0.0.0.0:9300\"",
            &format!("listen = \"127.0.0.1:{port}\""),
        );
    assert!(
        toml.contains(&format!("127.0.0.1:{port}")),
        "the ConfigMap's address moved: {toml}"
    );
    let dirs = common::tempdir();
    let (config_dir, run_dir, state_dir) = (
        dirs.path().join("config"),
        dirs.path().join("run"),
        dirs.path().join("state"),
    );
    for d in [&config_dir, &run_dir, &state_dir] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(config_dir.join("memwatch.toml"), &toml).unwrap();
    let mut opts: Vec<String> = vec!["--network".into(), "host".into()];
    if pod["hostPID"].as_bool() == Some(true) {
        opts.extend(["--pid".into(), "host".into()]);
    }
    let sc = &c["securityContext"];
    if sc["readOnlyRootFilesystem"].as_bool() == Some(true) {
        opts.push("--read-only".into());
    }
    if let Some(uid) = sc["runAsUser"].as_i64() {
        opts.extend(["--user".into(), uid.to_string()]);
    }
    if sc["allowPrivilegeEscalation"].as_bool() == Some(false) {
        opts.extend(["--security-opt".into(), "no-new-privileges".into()]);
    }
    for cap in sc["capabilities"]["drop"].as_vec().into_iter().flatten() {
        opts.extend(["--cap-drop".into(), cap.as_str().unwrap().into()]);
    }
    for cap in sc["capabilities"]["add"].as_vec().into_iter().flatten() {
        opts.extend(["--cap-add".into(), cap.as_str().unwrap().into()]);
    }
    let volumes = pod["volumes"].as_vec().expect("volumes");
    for m in c["volumeMounts"].as_vec().expect("volumeMounts") {
        let name = m["name"].as_str().unwrap();
        let v = volumes
            .iter()
            .find(|v| v["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("no volume {name}"));
        let host = match (name, v["hostPath"]["path"].as_str()) {
            ("config", _) => config_dir.display().to_string(),
            (_, Some("/run/memwatch")) => run_dir.display().to_string(),
            (_, Some("/var/lib/memwatch")) => state_dir.display().to_string(),
            (_, Some(p)) => p.to_owned(),
            (_, None) => panic!("volume {name}: neither the ConfigMap nor a hostPath"),
        };
        let ro = if m["readOnly"].as_bool() == Some(true) {
            ":ro"
        } else {
            ""
        };
        opts.extend([
            "-v".into(),
            format!("{host}:{}{ro}", m["mountPath"].as_str().unwrap()),
        ]);
    }
    let args: Vec<String> = c["args"]
        .as_vec()
        .expect("args")
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    let opts: Vec<&str> = opts.iter().map(String::as_str).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let name = format!("mw-test-daemonset-{}", std::process::id());
    let daemon = docker.run_image(&name, &image, &opts, &args);
    let socket = run_dir.join("control.sock");
    common::wait::until(
        &format!("the DaemonSet's socket: {}", docker.logs(&name)),
        || socket.exists(),
        |up| *up,
    );
    let (code, metrics) = common::wait::until(
        "the DaemonSet's /metrics",
        || {
            common::http(
                format!("127.0.0.1:{port}").parse().unwrap(),
                b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            )
        },
        |(code, _)| *code == 200,
    );
    assert_eq!(code, 200);
    assert!(metrics.contains("\nmemwatch_up 1\n"), "{metrics}");

    // A training container beside it: 300 MiB limit, holding 50 MiB.
    let trainee = docker.run(
        &format!("mw-test-trainee-{}", std::process::id()),
        &["--memory", "300m"],
        &[
            "python3",
            "-c",
            "import time\nb = bytearray(50 << 20)\nwhile True: time.sleep(0.1)",
        ],
    );
    let (code, out, err) = ctl(&socket, &["attach", &trainee.pid.to_string()]);
    assert_eq!(code, 0, "attach: {err}; {}", docker.logs(&name));
    let job_name = out
        .trim()
        .strip_prefix("attached ")
        .and_then(|s| s.strip_suffix(&format!(" (pid {})", trainee.pid)))
        .unwrap_or_else(|| panic!("attach said {out:?}"))
        .to_owned();
    // Named by its id here: the pod reads a Docker node's records only with
    // /var/lib/docker/containers mounted, which the manifest leaves to Docker nodes.
    assert_eq!(job_name, format!("docker-{}", &trainee.id[..12]));
    let j = common::wait::until(
        "the trainee's cgroup limit, read in the host's tree",
        || job(&socket, &job_name),
        |j| j["sample"]["cgroup"]["limit_bytes"].as_u64() == Some(300 * MIB),
    );
    assert_eq!(j["pid"], trainee.pid, "{j}");
    assert_eq!(
        j["sample"]["cgroup"]["path"].as_str(),
        Some(format!("/docker/{}", trainee.id).as_str()),
        "{j}"
    );

    // A pause by hand: frozen in the host's cgroup tree, through the pod's mount of it.
    assert_eq!(ctl(&socket, &["pause", &job_name]).0, 0);
    let j = common::wait::until(
        "the trainee held",
        || job(&socket, &job_name),
        |j| j["state"] == "paused" && j["pause"]["phase"] == "held",
    );
    let hold = &j["pause"]["mechanism"];
    let dir = hold["dir"]
        .as_str()
        .unwrap_or_else(|| panic!("held how? {j}"));
    let on_host = dir
        .strip_prefix("/host")
        .unwrap_or_else(|| panic!("the freezer is not the host's: {dir}"));
    let frozen = match hold["kind"].as_str() {
        Some("cgroup_v2_freeze") => std::fs::read_to_string(format!("{on_host}/cgroup.events"))
            .unwrap()
            .lines()
            .any(|l| l == "frozen 1"),
        Some("cgroup_v1_freezer") => {
            std::fs::read_to_string(format!("{on_host}/freezer.state"))
                .unwrap()
                .trim()
                == "FROZEN"
        }
        other => panic!("held by {other:?}, not a freezer: {j}"),
    };
    assert!(frozen, "{on_host} is not frozen: {j}");
    assert_eq!(ctl(&socket, &["resume", &job_name]).0, 0);
    common::wait::until(
        "the trainee running again",
        || job(&socket, &job_name),
        |j| j["state"] == "running",
    );
    assert_eq!(
        docker.inspect(&trainee.name, "{{.State.Status}}"),
        "running"
    );
    assert_eq!(
        docker.inspect(&trainee.name, "{{.State.OOMKilled}}"),
        "false"
    );
    assert_eq!(ctl(&socket, &["detach", &job_name]).0, 0);
    drop(daemon);
}
