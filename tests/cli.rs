//! The `memwatch` command: status against a running daemon, config errors, and HTTP edge cases.

mod common;

use common::{Daemon, Opts, memwatch};

#[test]
fn status_shows_memory_pressure_and_gpus() {
    let d = Daemon::start(Opts::default());
    let url = d.url();
    let (code, out, err) = memwatch(&[
        "--config",
        "/nonexistent/ok-not-read",
        "status",
        "--url",
        &url,
    ]);
    // An explicit config that does not exist is an error even for status.
    assert_eq!(code, 2, "{out}{err}");
    let (code, out, err) = memwatch(&["status", "--url", &url]);
    assert_eq!(code, 0, "{err}");
    for want in [
        "memwatch on gpu-box-01 (",
        "Mem:",
        // 30.8 GiB: free -h truncates.
        "30Gi",
        "1.4Gi",
        "Swap:",
        "4.0Gi",
        "2.0Gi",
        "memory some",
        "12.50%",
        "memory full",
        "memwatch's cgroup (v1) /job: usage 6.0Gi, limit 8.0Gi",
        "NVIDIA RTX A4500",
        "9.6Gi / 20Gi (48%)",
        "57°C",
        "93°C",
        "150 / 200 W",
        "97%",
        "throttled: SW_POWER_CAP",
        "pid 4242",
        "coretemp/Package id 0: 71°C (critical at 100°C, 29°C away)",
        // Levels first: the fixture host is 95 % used.
        "CRITICAL host memory 95 %",
        "jobs     none attached",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    let (code, out, _) = memwatch(&["status", "--json", "--url", &url]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["host"]["memory"]["total_bytes"], 33_084_669_952u64);
    assert_eq!(v["gpus"][1]["power_watts"], serde_json::Value::Null);
}

/// The issue's screen: GPU 0 at 98 % and 92 °C (both critical), a job paused by hand. Levels come
/// first, the job says why and for how long, the GPU's room is in bytes, and a terminal gets colour
/// unless NO_COLOR is set. The tmux captures are kept in target/artifacts/.
#[test]
fn status_shows_levels_and_a_paused_job_at_a_glance() {
    let d = Daemon::start(Opts::default());
    // 23960 MiB of 24564 MiB, as nvidia-smi showed it.
    d.set_gpu_state(
        r#"{"devices":[{"name":"NVIDIA RTX 4090","uuid":"GPU-x","memory_total":25757220864,
        "memory_used":25124077568,"temperature":92,"threshold_slowdown":88,"threshold_shutdown":96}]}"#,
    );
    d.wait_until(
        |d| {
            let (_, body) = d.get("/api/v1/jobs");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let critical = |key: &str| {
                v["levels"].as_array().is_some_and(|l| {
                    l.iter()
                        .any(|l| l["resource"] == key && l["level"] == "critical")
                })
            };
            critical("gpu_temperature:0") && critical("gpu_memory:0")
        },
        "GPU 0 critical",
    );
    let mut job = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let (code, out, err) = d.ctl(&["attach", &job.id().to_string(), "--name", "train"]);
    assert_eq!(code, 0, "{out}{err}");
    // The fixture host is 95 % used: memwatch pauses what is attached.
    d.wait_until(
        |d| d.job_state("train").as_deref() == Some("paused"),
        "the job paused",
    );
    // `status` reads the published view, which shows the pause once it is published.
    let url = d.url();
    let (_, out, _) = common::wait::until(
        "`memwatch status` showing the paused job",
        || memwatch(&["status", "--url", &url]),
        |(code, out, _)| {
            *code == 0
                && out
                    .lines()
                    .any(|l| l.starts_with("jobs     train (pid ") && l.contains(" PAUSED "))
        },
    );
    let first: Vec<&str> = out.lines().skip(2).take(3).collect();
    assert!(first[0].starts_with("CRITICAL "), "{out}");
    for want in [
        "GPU 0 memory 98 %",
        "GPU 0 temperature 92 °C",
        "host memory 95 %",
    ] {
        assert!(first[0].contains(want), "{want:?} not in {:?}", first[0]);
    }
    let job_line = out
        .lines()
        .find(|l| l.starts_with("jobs     train (pid "))
        .unwrap_or_else(|| panic!("no job line in:\n{out}"));
    assert!(
        job_line.contains(" PAUSED ") && job_line.contains(" s by memwatch: "),
        "{job_line}"
    );
    // How long until the longest pause runs out, in human units.
    assert!(
        job_line.ends_with("memwatch resumes it in 5 min")
            || job_line.contains("memwatch resumes it in 4 min 5"),
        "{job_line}"
    );
    assert!(
        job_line.contains("GPU 0 temperature at 92 °C; host memory at 95.5 %"),
        "{job_line}"
    );
    assert!(!out.contains("Policy") && !out.contains("User"), "{out}");
    // Room in bytes beside the percentage, rounded as free -h rounds.
    assert!(
        out.contains("23Gi / 23Gi (98%)") && out.contains("603Mi"),
        "{out}"
    );
    // In a real terminal: colour, and none with NO_COLOR.
    let artifacts = common::repo().join("target/artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    for (no_color, file) in [(false, "status-colour.ansi"), (true, "status-no-color.txt")] {
        let tmux = common::tmux::Tmux::start(
            120,
            40,
            &[
                if no_color { "NO_COLOR=1" } else { "NO_COLOR=" },
                common::bin().to_str().unwrap(),
                "status",
                "--url",
                &d.url(),
            ],
        );
        let screen = tmux.wait_for("CRITICAL");
        std::fs::write(artifacts.join(file), &screen).unwrap();
        assert_eq!(
            screen.contains("\x1b[31mCRITICAL"),
            !no_color,
            "NO_COLOR={no_color}:\n{screen}"
        );
    }
    // --watch redraws: a detach shows without running it again.
    let tmux = common::tmux::Tmux::start(
        120,
        40,
        &[
            common::bin().to_str().unwrap(),
            "status",
            "--watch",
            "0.3",
            "--url",
            &d.url(),
        ],
    );
    tmux.wait_for("train (pid");
    assert_eq!(d.ctl(&["detach", "train"]).0, 0);
    tmux.wait_for("none attached");
    let _ = job.kill();
    let _ = job.wait();
}

#[test]
fn status_without_a_daemon_says_so() {
    let (code, _, err) = memwatch(&["status", "--url", "http://127.0.0.1:1"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("cannot reach the memwatch daemon at http://127.0.0.1:1"),
        "{err}"
    );
}

#[test]
fn bad_config_exits_2_naming_key_and_line_and_starts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "listen = \"127.0.0.1:0\"\n[sampling]\ninterval_ms = -5\n",
            "line 3",
            "sampling.interval_ms",
        ),
        (
            "listen = \"127.0.0.1:0\"\nport = 9300\n",
            "line 2",
            "unknown field `port`",
        ),
        ("listen = \"127.0.0.1:99999\"\n", "line 1", "listen"),
        (
            "[http]\nmax_connections = \"many\"\n",
            "line 2",
            "http.max_connections",
        ),
    ];
    for (i, (text, a, b)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("c{i}.toml"));
        std::fs::write(&path, text).unwrap();
        let (code, out, err) = memwatch(&["--config", path.to_str().unwrap(), "run"]);
        assert_eq!(code, 2, "{text}: {out}{err}");
        assert!(
            err.contains(a) && err.contains(b) && err.contains(path.to_str().unwrap()),
            "{text}: {err}"
        );
        assert!(!err.contains("listening"), "{err}");
    }
    let (code, _, err) = memwatch(&["--config", "/nonexistent/memwatch.toml", "run"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("cannot read config file /nonexistent/memwatch.toml"),
        "{err}"
    );
}

#[test]
fn config_example_is_the_shipped_file() {
    let (code, out, _) = memwatch(&["config", "example"]);
    assert_eq!(code, 0);
    assert_eq!(
        out,
        std::fs::read_to_string(common::repo().join("memwatch.example.toml")).unwrap()
    );
}

#[test]
fn http_errors_are_clear() {
    let d = Daemon::start(Opts::default());
    assert_eq!(d.get("/nope").0, 404);
    for q in [
        "seconds=0",
        "seconds=-1",
        "seconds=abc",
        "seconds=99999999999999999999",
        "bogus=1",
    ] {
        let (status, body) = d.get(&format!("/api/v1/history?{q}"));
        assert_eq!(status, 400, "{q}");
        assert!(body.contains("\"error\""), "{q}: {body}");
    }
    let (status, body) = d.get("/api/v1/history?seconds=60");
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(!v["points"].as_array().unwrap().is_empty());
    assert_eq!(v["points"][0]["gpus"][0]["temperature_celsius"], 57.0);
    // Every error is JSON, also those the HTTP framework makes itself.
    let ack = |headers: &str, body: &str| {
        d.request(&format!(
            "POST /api/v1/jobs/x/ack HTTP/1.1\r\nHost: x\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ))
    };
    for (what, (status, body), want) in [
        (
            "a POST to /metrics",
            d.request(
                "POST /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 3\r\n\r\nabc",
            ),
            405,
        ),
        ("no content type", ack("", "{}"), 415),
        (
            "a body that is not JSON",
            ack("Content-Type: application/json\r\n", "{nope"),
            400,
        ),
        (
            "JSON of the wrong shape",
            ack("Content-Type: application/json\r\n", "{\"generation\": \"x\"}"),
            422,
        ),
        (
            "a body over max_body_bytes",
            ack("Content-Type: application/json\r\n", &" ".repeat(70_000)),
            413,
        ),
    ] {
        assert_eq!(status, want, "{what}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("{what}: the {status} body is not JSON ({e}): {body}"));
        assert!(
            v["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{what}: {body}"
        );
    }
    // Garbage is not HTTP: 400 or a closed connection, and the daemon serves on.
    let (status, _) = d.request("\u{1}\u{2}garbage\r\n\r\n");
    assert!(status == 400 || status == 0);
    assert_eq!(d.get("/-/healthy"), (200, "OK\n".into()));
    let (status, body) = d.get("/api/v1/snapshot");
    assert_eq!(status, 200);
    assert!(body.contains("\"collectors\""));
}

#[test]
fn a_new_connection_takes_the_place_of_the_oldest_idle_one() {
    use std::io::{Read, Write};
    let d = Daemon::start(Opts {
        extra_config: "[http]\nmax_connections = 2",
        ..Opts::default()
    });
    // Two idle connections take both slots.
    let mut a = std::net::TcpStream::connect(d.addr).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    let mut b = std::net::TcpStream::connect(d.addr).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    // A third is served at once: the oldest idle connection made room.
    let (status, _) = d.get("/-/healthy");
    assert_eq!(status, 200);
    a.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    assert_eq!(
        a.read(&mut [0u8; 16]).unwrap(),
        0,
        "the oldest was not closed"
    );
    // The younger one is still served.
    b.write_all(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    b.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 64];
    let n = b.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
}

#[test]
fn check_plans_a_model_for_this_machine() {
    let args = [
        "--config",
        "/dev/null",
        "check",
        "--params",
        "1.5e9",
        "--layers",
        "48",
        "--hidden",
        "1600",
        "--heads",
        "25",
        "--seq-len",
        "1024",
        "--gpus",
        "2",
        "--gpu-memory-gib",
        "8",
        "--ram-gib",
        "60",
    ];
    let (code, out, err) = memwatch(&args);
    assert_eq!(code, 0, "{err}");
    for want in [
        "ZeRO-2 + CPU optimizer offload",
        "layout: ZeRO-2 + CPU optimizer offload",
        "\"train_micro_batch_size_per_gpu\"",
        "distributed_type: DEEPSPEED",
    ] {
        assert!(out.contains(want), "missing {want:?}:\n{out}");
    }
    let mut json = args.to_vec();
    json.push("--json");
    let (code, out, _) = memwatch(&json);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let ds = &v["deepspeed"];
    assert_eq!(
        ds["train_batch_size"].as_u64().unwrap(),
        ds["train_micro_batch_size_per_gpu"].as_u64().unwrap()
            * ds["gradient_accumulation_steps"].as_u64().unwrap()
            * 2
    );
    for (bad, want) in [
        (
            vec!["--config", "/dev/null", "check", "--params=-5"],
            "--params",
        ),
        (
            vec!["--config", "/dev/null", "check", "--layers", "12"],
            "give --params or --model-config too",
        ),
        (
            vec![
                "--config",
                "/dev/null",
                "check",
                "--params",
                "1e9",
                "--optimizer",
                "sgd",
            ],
            "Adam",
        ),
        (
            vec!["--config", "/dev/null", "check", "--params", "7X"],
            "unknown suffix",
        ),
        (
            vec![
                "--config",
                "/dev/null",
                "check",
                "--params",
                "7B",
                "--gpus",
                "0",
            ],
            "--gpus",
        ),
        (
            vec![
                "--config",
                "/dev/null",
                "check",
                "--params",
                "7B",
                "--gpu-memory-gib",
                "0",
            ],
            "positive number of GiB",
        ),
        (
            vec![
                "--config",
                "/dev/null",
                "check",
                "--params",
                "7B",
                "--nodes",
                "0",
            ],
            "--nodes",
        ),
    ] {
        let (code, _, err) = memwatch(&bad);
        assert_eq!(code, 2, "{bad:?}");
        assert!(err.contains(want), "{err}");
    }
    // Nothing fits: said, no config, exit status 3.
    let (code, out, err) = memwatch(&[
        "--config",
        "/dev/null",
        "check",
        "--params",
        "1.5B",
        "--gpus",
        "1",
        "--gpu-memory-gib",
        "24",
        "--ram-gib",
        "21",
    ]);
    assert_eq!(code, 3, "{out}{err}");
    assert!(out.contains("ZeRO-2 would fit on 2 GPUs"), "{out}");
    assert!(out.contains("nothing fits: no config is emitted"), "{out}");
    assert!(!out.contains("train_micro_batch_size_per_gpu"), "{out}");
}

#[test]
fn check_reads_the_gpus_through_nvml() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        format!(
            "[host]\nroot = {:?}\n[gpu]\nlibrary = {:?}\n",
            common::fixture_root(),
            common::fake_nvml()
        ),
    )
    .unwrap();
    let out = std::process::Command::new(common::bin())
        .args([
            "--config",
            config.to_str().unwrap(),
            "check",
            "--params",
            "3e8",
        ])
        .env(
            "MEMWATCH_FAKE_NVML_STATE",
            common::repo().join("tests/fixtures/nvml/two-gpus.json"),
        )
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("GPU 1: NVIDIA RTX A4500, 20.00 GiB"),
        "{text}"
    );
    assert!(text.contains("the notes' tier: > 12 GiB: ZeRO-2"), "{text}");
    // The fixture host has 1.4 GiB available: no workers, no pinned memory.
    assert!(
        text.contains("DataLoader workers 0, pin_memory false"),
        "{text}"
    );
    // ZeRO-2 would need 4 bytes × params × 2 ranks × 1.5 = 3.4 GiB of host RAM to load the model; with
    // 1.4 GiB available, ZeRO-3 with zero_init is what fits.
    assert!(text.contains("layout: ZeRO-3\n"), "{text}");
}

/// `memwatch check --json | head -c 1`: the reader goes away; the command ends quietly (SIGPIPE, as
/// `cat` does), never with a panic.
#[test]
fn a_closed_pipe_is_no_panic() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    for args in [
        &[
            "check",
            "--json",
            "--params",
            "1.5e9",
            "--gpus",
            "1",
            "--gpu-memory-gib",
            "24",
            "--ram-gib",
            "64",
        ][..],
        &["config", "example"][..],
    ] {
        // A pipe whose read end is closed before the command starts: its first write fails.
        let (read, write) = nix::unistd::pipe().unwrap();
        drop(read);
        let mut child = std::process::Command::new(common::bin())
            .args(args)
            .stdout(std::process::Stdio::from(write))
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let status = child.wait().unwrap();
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(
            status.signal(),
            Some(nix::libc::SIGPIPE),
            "{args:?}: {status:?} {err}"
        );
    }
}
