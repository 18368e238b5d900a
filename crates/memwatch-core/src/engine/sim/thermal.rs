//! Thermal by what is hot: the `cpu_temperature` level follows the CPU's sensors (hwmon drivers
//! and thermal zones that measure a CPU), not whichever sensor is nearest its critical point. An
//! NVMe drive or a Wi-Fi card near its own is shown and pauses nothing, unless
//! `[policy.sensors] count_as_cpu` names it.

use std::sync::Arc;

use crate::policy::{Cause, Level, Resource};
use crate::sample::thermal::{TempSensor, is_cpu_device};

use super::harness::{Kind, Sim};

/// A sensor as the sampler reads it: `chip` (a hwmon device's name, or `thermal_zoneN` with the
/// zone's type as `sensor`), at `celsius` with its max and crit points.
fn sensor(
    chip: &str,
    sensor: &str,
    celsius: f64,
    max: Option<f64>,
    crit: Option<f64>,
) -> TempSensor {
    let mut t = TempSensor {
        chip: chip.into(),
        sensor: sensor.into(),
        celsius,
        crit_celsius: crit,
        max_celsius: max,
        cpu: false,
    };
    t.cpu = is_cpu_device(t.device());
    t
}

/// A desktop: coretemp's package and two cores at `cpu` °C (max 84, crit 100), and an NVMe drive
/// at `nvme` °C of its 80.85 (max 76.85).
fn desktop(cpu: f64, nvme: f64) -> Vec<TempSensor> {
    vec![
        sensor("coretemp", "Package id 0", cpu, Some(84.0), Some(100.0)),
        sensor("coretemp", "Core 0", cpu - 2.0, Some(84.0), Some(100.0)),
        sensor("coretemp", "Core 1", cpu - 3.0, Some(84.0), Some(100.0)),
        sensor("nvme", "Composite", nvme, Some(76.85), Some(80.85)),
    ]
}

/// A laptop: k10temp's Tctl at `cpu` °C (no thresholds: the fallbacks, 90 and 100), an acpitz
/// zone and its hwmon twin at `acpi` °C of 98 (its critical trip point), an iwlwifi card at
/// `wifi` °C, and the x86_pkg_temp zone at `cpu` °C with no trip points.
fn laptop(cpu: f64, acpi: f64, wifi: f64) -> Vec<TempSensor> {
    vec![
        sensor("acpitz", "temp1", acpi, None, Some(98.0)),
        sensor("iwlwifi_1", "temp1", wifi, None, None),
        sensor("k10temp", "Tctl", cpu, None, None),
        sensor("thermal_zone0", "acpitz", acpi, None, Some(98.0)),
        sensor("thermal_zone1", "x86_pkg_temp", cpu, None, None),
    ]
}

/// A full sample with host memory at 30 % and these sensors; the job's last walk stands.
fn sample(s: &mut Sim, temperatures: Vec<TempSensor>) {
    s.now += 1000;
    let mut sample = crate::sample::Sample {
        timestamp_ms: s.now,
        ..Default::default()
    };
    sample.host.memory = Some(crate::sample::meminfo::MemInfo {
        total_bytes: 16 << 30,
        free_bytes: 11 << 30,
        available_bytes: 11 << 30,
        ..Default::default()
    });
    sample.host.temperatures = temperatures;
    s.engine
        .handle_sample(Arc::new(sample), Vec::new(), s.now, s.now);
    s.drain();
    s.check();
}

/// The `cpu_temperature` level and the value it is judged on.
fn cpu(s: &Sim) -> (Level, Option<f64>) {
    let v = s.engine.view();
    let l = v
        .levels
        .iter()
        .find(|l| l.resource == Resource::CpuTemperature)
        .expect("a cpu_temperature level");
    (l.level, l.value)
}

/// A job attached, sampled once with nothing hot.
fn attached(extra: &str) -> Sim {
    let mut s = Sim::with(Kind::Signals, extra, &[]);
    s.sample(0.30);
    s
}

#[test]
fn an_nvme_drive_near_its_critical_point_pauses_nothing() {
    let mut s = attached("");
    // The measured case: coretemp at 50 of 100 °C, the drive at 78.85 of 80.85 °C.
    sample(&mut s, desktop(50.0, 78.85));
    assert_eq!(cpu(&s), (Level::Ok, Some(50.0)));
    assert_eq!(s.pause(), None);
    assert!(s.all_running());
    // The CPU itself hot (98 °C, 2 under its crit): critical, and the job is paused for it.
    sample(&mut s, desktop(98.0, 40.0));
    assert_eq!(cpu(&s), (Level::Critical, Some(98.0)));
    let p = s.pause().expect("paused for the CPU's heat");
    assert_eq!(p.held.reasons, [Cause::Resource(Resource::CpuTemperature)]);
}

#[test]
fn a_laptops_level_follows_its_cpu_not_acpitz_or_the_wifi_card() {
    let mut s = attached("");
    // acpitz 1 °C from its critical trip point, the Wi-Fi card at 105 °C (over the fallback
    // shutdown point): neither is a CPU, and the CPU is at 60.
    sample(&mut s, laptop(60.0, 97.0, 105.0));
    assert_eq!(cpu(&s), (Level::Ok, Some(60.0)));
    assert_eq!(s.pause(), None);
    // The CPU at 91: past the fallback slowdown point (90), warn.
    sample(&mut s, laptop(91.0, 50.0, 40.0));
    assert_eq!(cpu(&s), (Level::Warn, Some(91.0)));
    // At 96: past the fallback shutdown point less 5, critical; the job is paused.
    sample(&mut s, laptop(96.0, 50.0, 40.0));
    assert_eq!(cpu(&s), (Level::Critical, Some(96.0)));
    assert!(s.pause().is_some());
}

#[test]
fn a_machine_with_no_cpu_sensor_has_an_ok_level_with_no_value() {
    let mut s = attached("");
    sample(
        &mut s,
        vec![
            sensor("nvme", "Composite", 80.0, Some(76.85), Some(80.85)),
            sensor("thermal_zone0", "acpitz", 97.0, None, Some(98.0)),
        ],
    );
    assert_eq!(cpu(&s), (Level::Ok, None));
    assert_eq!(s.pause(), None);
}

#[test]
fn a_drive_counted_as_a_cpu_pauses_near_its_own_critical_point() {
    let mut s = attached("[policy.sensors]\ncount_as_cpu = [\"nvme\"]\n");
    // At 60 °C the drive is 20.85 from its crit, nearer than the CPU (50 from its own): it is the
    // one the level reads, and it is ok.
    sample(&mut s, desktop(50.0, 60.0));
    assert_eq!(cpu(&s), (Level::Ok, Some(60.0)));
    assert_eq!(s.pause(), None);
    // 78.85 of 80.85: within 5 °C of its crit, nearer it than the CPU is to its own.
    sample(&mut s, desktop(50.0, 78.85));
    assert_eq!(cpu(&s), (Level::Critical, Some(78.85)));
    assert!(s.pause().is_some());
    // A thermal zone's type counts as its device's name.
    let mut s = attached("[policy.sensors]\ncount_as_cpu = [\"acpitz\"]\n");
    sample(&mut s, laptop(60.0, 97.0, 40.0));
    assert_eq!(cpu(&s), (Level::Critical, Some(97.0)));
}
