//! The real binary on a fixture root with the fake NVML: /metrics against a golden file, promtool,
//! and the scrape following changes to the fake GPUs.

mod common;

use common::{Daemon, Opts};

/// Series whose values change from run to run.
const NONDETERMINISTIC: [&str; 3] = [
    "memwatch_collector_duration_seconds",
    "memwatch_last_collection_timestamp_seconds",
    "memwatch_samples_total",
];

fn deterministic(text: &str) -> String {
    text.lines()
        .filter(|l| !NONDETERMINISTIC.iter().any(|n| l.starts_with(n)))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn metrics_match_golden_file_and_pass_promtool() {
    let d = Daemon::start(Opts::default());
    let text = d.metrics();
    let golden_path = common::repo().join("tests/golden/metrics.txt");
    let got = deterministic(&text);
    if std::env::var_os("MEMWATCH_BLESS").is_some() {
        std::fs::create_dir_all(golden_path.parent().unwrap()).unwrap();
        std::fs::write(&golden_path, &got).unwrap();
    }
    let want = std::fs::read_to_string(&golden_path).unwrap();
    assert_eq!(
        got, want,
        "scrape differs from tests/golden/metrics.txt (MEMWATCH_BLESS=1 rewrites it)"
    );
    let findings = common::promtool_check_metrics(&text);
    assert_eq!(findings, "", "promtool check metrics found problems");
}

#[test]
fn scrape_follows_the_fake_gpu() {
    let d = Daemon::start(Opts::default());
    assert!(d.metrics().contains("memwatch_gpu_temperature_celsius{gpu=\"0\",uuid=\"GPU-0a1b2c3d-0000-4000-8000-000000000000\"} 57\n"));
    let hot = include_str!("fixtures/nvml/two-gpus.json")
        .replacen("\"temperature\": 57", "\"temperature\": 95", 1)
        .replacen(
            "\"memory_used\": 10307921510",
            "\"memory_used\": 21000000000",
            1,
        );
    d.set_gpu_state(&hot);
    d.wait_until(
        |d| {
            let m = d.metrics();
            m.contains("memwatch_gpu_temperature_celsius{gpu=\"0\",uuid=\"GPU-0a1b2c3d-0000-4000-8000-000000000000\"} 95\n")
                && m.contains("memwatch_gpu_memory_used_bytes{gpu=\"0\",uuid=\"GPU-0a1b2c3d-0000-4000-8000-000000000000\"} 21000000000\n")
        },
        "the scrape did not follow the GPU's new temperature and memory",
    );
    // A GPU disappearing (driver reset, hot-unplug) leaves one.
    let one: serde_json::Value = serde_json::from_str(&hot).unwrap();
    let mut one = one.clone();
    one["devices"].as_array_mut().unwrap().truncate(1);
    d.set_gpu_state(&one.to_string());
    d.wait_until(
        |d| d.metrics().contains("memwatch_gpus 1\n"),
        "the scrape kept a removed GPU",
    );
}

#[test]
fn unsupported_and_failing_gpu_fields_are_absent_not_sentinels() {
    let d = Daemon::start(Opts::default());
    let m = d.metrics();
    let gpu1 = "gpu=\"1\",uuid=\"GPU-0a1b2c3d-0000-4000-8000-000000000001\"";
    // GPU 1's thresholds are "not supported", its power call fails: the series are absent.
    for name in [
        "memwatch_gpu_temperature_slowdown_celsius",
        "memwatch_gpu_power_watts",
        "memwatch_gpu_power_limit_watts",
    ] {
        assert!(
            !m.contains(&format!("{name}{{{gpu1}}}")),
            "{name} present for GPU 1:\n{m}"
        );
    }
    // The process whose memory NVML cannot see has no memory series, never u64::MAX.
    assert!(!m.contains("pid=\"4243\""));
    assert!(!m.contains("18446744073709551615") && !m.contains("1.8446744073709552e19"));
    // The rest of GPU 1 is there.
    assert!(m.contains(&format!(
        "memwatch_gpu_memory_used_bytes{{{gpu1}}} 12326456934\n"
    )));
}

#[test]
fn no_driver_means_no_gpus_and_the_daemon_runs_on() {
    let d = Daemon::start(Opts {
        gpu_state: None,
        ..Opts::default()
    });
    let m = d.metrics();
    assert!(m.contains("memwatch_gpus 0\n"));
    assert!(m.contains("memwatch_memory_total_bytes 33084669952\n"));
    assert!(m.contains("memwatch_collector_success{collector=\"gpu\"} 1\n"));
    // Logged once: read once the thread that reads the daemon's stderr has the line.
    let log = d.wait_log("the missing driver logged", |l| {
        l.contains("no NVIDIA GPU available")
    });
    assert_eq!(log.matches("no NVIDIA GPU available").count(), 1, "{log}");
}

#[test]
fn nvml_failing_mid_run_is_counted_and_the_daemon_runs_on() {
    let d = Daemon::start(Opts::default());
    d.set_gpu_state(r#"{"errors": {"nvmlDeviceGetCount_v2": 15}, "devices": []}"#);
    d.wait_until(
        |d| {
            d.metrics()
                .contains("memwatch_collector_success{collector=\"gpu\"} 0\n")
        },
        "a failing NVML was not reported",
    );
    let m = d.metrics();
    assert!(m.contains("memwatch_memory_available_bytes 1503238144\n"));
    assert!(!m.contains("memwatch_gpu_info"));
    d.set_gpu_state(include_str!("fixtures/nvml/two-gpus.json"));
    d.wait_until(
        |d| d.metrics().contains("memwatch_gpus 2\n"),
        "NVML did not recover",
    );
}

#[test]
fn broken_host_files_fail_one_collector_only() {
    let dir = tempfile::tempdir().unwrap();
    common::copy_tree(&common::fixture_root(), dir.path());
    std::fs::write(
        dir.path().join("proc/meminfo"),
        "MemTotal: 12 kB\nMemFree: garbage kB\n",
    )
    .unwrap();
    std::fs::remove_dir_all(dir.path().join("proc/pressure")).unwrap();
    let d = Daemon::start(Opts {
        root: dir.path().to_owned(),
        ..Opts::default()
    });
    let m = d.metrics();
    assert!(
        m.contains("memwatch_collector_success{collector=\"meminfo\"} 0\n"),
        "{m}"
    );
    assert!(!m.contains("memwatch_memory_total_bytes"));
    // No PSI on this "kernel": the series are absent, not zero, and that is no failure.
    assert!(!m.contains("memwatch_pressure"));
    assert!(m.contains("memwatch_collector_success{collector=\"pressure\"} 1\n"));
    assert!(m.contains("memwatch_collector_success{collector=\"vmstat\"} 1\n"));
    // The failure is logged once, at warn, naming the file.
    d.wait_until(
        |d| d.metrics().contains("memwatch_samples_total 5"),
        "sampling stopped",
    );
    let warn = |l: &&str| l.contains("\"WARN\"") && l.contains("meminfo");
    let log = d.wait_log("the meminfo failure logged at warn", |l| {
        l.lines().any(|l| warn(&l))
    });
    assert_eq!(log.lines().filter(warn).count(), 1, "{log}");
    // A fixed file is picked up again.
    std::fs::copy(
        common::fixture_root().join("proc/meminfo"),
        dir.path().join("proc/meminfo"),
    )
    .unwrap();
    d.wait_until(
        |d| {
            d.metrics()
                .contains("memwatch_collector_success{collector=\"meminfo\"} 1\n")
        },
        "the meminfo collector did not recover",
    );
}

/// Prometheus always sends `Accept-Encoding: gzip`: the scrape comes gzipped, and unzips to the same
/// series as a plain scrape; a client that refuses gzip (q=0) gets plain text.
#[test]
fn metrics_are_gzipped_when_asked() {
    use std::io::{Read, Write};
    let d = Daemon::start(Opts::default());
    let raw = |accept: &str| -> (String, Vec<u8>) {
        let mut s = std::net::TcpStream::connect(d.addr).unwrap();
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept-Encoding: {accept}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).unwrap();
        let split = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        let head = String::from_utf8_lossy(&buf[..split]).to_ascii_lowercase();
        assert!(head.contains("transfer-encoding: chunked") || head.contains("content-length"));
        (head, buf[split + 4..].to_vec())
    };
    let (head, body) = raw("gzip, deflate");
    assert!(head.contains("content-encoding: gzip"), "{head}");
    assert!(head.contains("content-length"), "{head}");
    let mut text = String::new();
    flate2::read::GzDecoder::new(&body[..])
        .read_to_string(&mut text)
        .unwrap();
    let plain = d.metrics();
    assert_eq!(deterministic(&text), deterministic(&plain));
    assert!(
        body.len() * 3 < plain.len(),
        "{} gzipped vs {} plain",
        body.len(),
        plain.len()
    );
    eprintln!(
        "/metrics: {} bytes plain, {} gzipped",
        plain.len(),
        body.len()
    );
    let (head, _) = raw("gzip;q=0, identity");
    assert!(!head.contains("content-encoding"), "{head}");
}
