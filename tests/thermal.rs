//! Thermal by what is hot: the real binary on a fixture root whose coretemp reads 50 of 100 °C and
//! whose NVMe drive reads 78.85 of 80.85 °C. The drive is shown in /metrics and pauses nothing:
//! `cpu_temperature` follows the CPU. Named in `[policy.sensors] count_as_cpu`, it counts; a bad
//! name there is refused, naming the key and the file.

mod common;

use std::path::Path;

use common::{Daemon, Opts};

const CPU_LEVEL: &str = "memwatch_level{resource=\"cpu_temperature\"}";

/// The fixture root with coretemp and the x86_pkg_temp zone at 50 °C (crit 100 and 105) and an
/// NVMe drive at 78.85 °C of its 80.85.
fn desktop() -> tempfile::TempDir {
    let dir = common::tempdir();
    common::copy_tree(&common::fixture_root(), dir.path());
    let class = dir.path().join("sys/class");
    let write = |p: &Path, text: &str| std::fs::write(p, text).unwrap();
    write(&class.join("hwmon/hwmon0/temp1_input"), "50000\n");
    write(&class.join("thermal/thermal_zone0/temp"), "50000\n");
    let nvme = class.join("hwmon/hwmon1");
    std::fs::create_dir_all(&nvme).unwrap();
    write(&nvme.join("name"), "nvme\n");
    write(&nvme.join("temp1_label"), "Composite\n");
    write(&nvme.join("temp1_input"), "78850\n");
    write(&nvme.join("temp1_max"), "76850\n");
    write(&nvme.join("temp1_crit"), "80850\n");
    dir
}

/// The value of the series that starts with `series` (its whole name and labels).
fn value(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn an_nvme_drive_near_its_critical_point_is_shown_and_pauses_nothing() {
    let root = desktop();
    let d = Daemon::start(Opts {
        root: root.path().to_owned(),
        ..Opts::default()
    });
    // Three samples in, so that the level has seen the drive more than once.
    d.wait_until(
        |d| value(&d.metrics(), "memwatch_samples_total").is_some_and(|n| n >= 3.0),
        "three samples",
    );
    let m = d.metrics();
    assert_eq!(value(&m, CPU_LEVEL), Some(0.0), "{m}");
    // Every sensor is still shown, labelled by its device and its label.
    let shown = |chip: &str, sensor: &str, family: &str| {
        value(
            &m,
            &format!("memwatch_temperature_{family}{{chip=\"{chip}\",sensor=\"{sensor}\"}}"),
        )
    };
    assert_eq!(shown("nvme", "Composite", "celsius"), Some(78.85), "{m}");
    assert_eq!(
        shown("nvme", "Composite", "crit_celsius"),
        Some(80.85),
        "{m}"
    );
    assert_eq!(
        shown("coretemp", "Package id 0", "celsius"),
        Some(50.0),
        "{m}"
    );
    // The API says which sensors are a CPU's, and the level's value is the CPU's.
    let (code, body) = d.get("/api/v1/snapshot");
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let cpu: Vec<(&str, bool)> = v["host"]["temperatures"]
        .as_array()
        .expect("host.temperatures")
        .iter()
        .map(|t| (t["chip"].as_str().unwrap_or(""), t["cpu"] == true))
        .collect();
    assert_eq!(
        cpu,
        [("coretemp", true), ("nvme", false), ("thermal_zone0", true)]
    );
    let (code, body) = d.get("/api/v1/jobs");
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let level = v["levels"]
        .as_array()
        .expect("levels")
        .iter()
        .find(|l| l["resource"] == "cpu_temperature")
        .cloned()
        .expect("a cpu_temperature level");
    assert_eq!(
        (&level["level"], &level["value"]),
        (&"ok".into(), &50.0.into())
    );
}

#[test]
fn a_drive_counted_as_a_cpu_makes_the_level_critical() {
    let root = desktop();
    let d = Daemon::start(Opts {
        root: root.path().to_owned(),
        extra_config: "[policy.sensors]\ncount_as_cpu = [\"nvme\"]\n",
        ..Opts::default()
    });
    d.wait_until(
        |d| value(&d.metrics(), CPU_LEVEL) == Some(2.0),
        "the NVMe drive, counted, 2 °C from its critical point, makes cpu_temperature critical",
    );
}

#[test]
fn a_bad_sensor_name_is_refused_naming_the_key_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("memwatch.toml");
    std::fs::write(&f, "[policy.sensors]\ncount_as_cpu = [\"nvme\", \"\"]\n").unwrap();
    let path = f.to_str().unwrap();
    let (code, _, err) = common::memwatch(&["--config", path, "config", "check"]);
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains(path) && err.contains("policy.sensors.count_as_cpu") && err.contains("line 2"),
        "{err}"
    );
    std::fs::write(&f, "[policy.sensors]\ncount_as_cpu = \"nvme\"\n").unwrap();
    let (code, _, err) = common::memwatch(&["--config", path, "config", "check"]);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains(path) && err.contains("count_as_cpu"), "{err}");
}
