//! A temperature sensor of /sys/class/hwmon or /sys/class/thermal, and the parser of a reading.

use crate::expo::Writer;
use serde::{Deserialize, Serialize};

/// One temperature sensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TempSensor {
    /// hwmon chip name (`coretemp`, `k10temp`, …) or the thermal zone (`thermal_zone0`).
    pub chip: String,
    /// Sensor label (`Package id 0`, `temp1`, or the zone's type).
    pub sensor: String,
    /// The reading.
    pub celsius: f64,
    /// The sensor's critical point, if it has one.
    pub crit_celsius: Option<f64>,
    /// Its maximum, if it has one.
    pub max_celsius: Option<f64>,
    /// Whether it measures a CPU (its hwmon driver or its zone's type is a CPU's: [`is_cpu_device`]).
    /// Only CPU sensors make the `cpu_temperature` level, with those `policy.sensors.count_as_cpu`
    /// names; the others are shown and pause nothing.
    #[serde(default)]
    pub cpu: bool,
}

/// The hwmon drivers and thermal-zone types that measure a CPU package or its cores: Intel's
/// `coretemp`, AMD's `k10temp` and `k8temp`, the out-of-tree `zenpower`, VIA's `via_cputemp`, and the
/// thermal zone `x86_pkg_temp`. Besides these, a name that starts with `cpu` and ends with `_thermal`
/// or `_therm` (`-` read as `_`) is an SoC's CPU zone, or the hwmon device Linux makes of it:
/// `cpu_thermal` on a Raspberry Pi, `cpu0_thermal`, `cpu_0_0_thermal`, `cpuss_0_thermal`, Jetson's
/// `CPU-therm`. `acpitz`, `nvme`, `iwlwifi_1`, `amdgpu`, `pch_*` and the like are not a CPU's.
pub const CPU_DEVICES: &[&str] = &[
    "coretemp",
    "k10temp",
    "k8temp",
    "zenpower",
    "via_cputemp",
    "x86_pkg_temp",
];

/// Whether a hwmon device's `name` or a thermal zone's `type` is a CPU's ([`CPU_DEVICES`]).
pub fn is_cpu_device(name: &str) -> bool {
    let n = name.trim().to_ascii_lowercase().replace('-', "_");
    CPU_DEVICES.contains(&n.as_str())
        || (n.starts_with("cpu") && (n.ends_with("_thermal") || n.ends_with("_therm")))
}

/// Whether `chip` names a thermal zone (`thermal_zone3`) rather than a hwmon device.
fn is_zone(chip: &str) -> bool {
    chip.strip_prefix("thermal_zone")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

impl TempSensor {
    /// The device the sensor belongs to: the hwmon device's `name` (the `chip` label), or a thermal
    /// zone's `type` (its `sensor` label).
    pub fn device(&self) -> &str {
        if is_zone(&self.chip) {
            &self.sensor
        } else {
            &self.chip
        }
    }
}

/// Degrees Celsius from a sysfs reading in millidegrees, within physical bounds.
pub fn celsius_of(text: &str) -> Option<f64> {
    let v: i64 = text.trim().parse().ok()?;
    let c = v as f64 / 1000.0;
    (-273.0..=1000.0).contains(&c).then_some(c)
}

/// The sensors' series: `memwatch_temperature_{,crit_,max_}celsius` by chip and sensor.
pub fn series(t: &[TempSensor], w: &mut Writer) {
    let mut f = w.gauge(
        "memwatch_temperature_celsius",
        "Temperature of a hwmon sensor or thermal zone.",
    );
    for x in t {
        f.add(&[("chip", &x.chip), ("sensor", &x.sensor)], x.celsius);
    }
    drop(f);
    let mut f = w.gauge(
        "memwatch_temperature_crit_celsius",
        "Critical temperature of the sensor, where known.",
    );
    for x in t {
        f.opt(&[("chip", &x.chip), ("sensor", &x.sensor)], x.crit_celsius);
    }
    drop(f);
    let mut f = w.gauge(
        "memwatch_temperature_max_celsius",
        "Maximum (hot) temperature of the sensor, where known.",
    );
    for x in t {
        f.opt(&[("chip", &x.chip), ("sensor", &x.sensor)], x.max_celsius);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reading_is_millidegrees_within_physical_bounds() {
        assert_eq!(celsius_of("45000\n"), Some(45.0));
        assert_eq!(celsius_of("-5500"), Some(-5.5));
        assert_eq!(celsius_of("-274000"), None);
        assert_eq!(celsius_of("1000001"), None);
        assert_eq!(celsius_of("hot"), None);
        assert_eq!(celsius_of(""), None);
    }

    #[test]
    fn cpu_devices_are_told_by_driver_and_zone_type() {
        for cpu in [
            "coretemp",
            "k10temp",
            "zenpower",
            "x86_pkg_temp",
            "cpu_thermal",
            "cpu-thermal",
            "cpu0-thermal",
            "cpu_0_0_thermal",
            "CPU-therm",
        ] {
            assert!(is_cpu_device(cpu), "{cpu}");
        }
        for other in [
            "nvme",
            "iwlwifi_1",
            "acpitz",
            "amdgpu",
            "pch_cannonlake",
            "gpu_thermal",
            "thermal_zone0",
            "cpu",
            "",
        ] {
            assert!(!is_cpu_device(other), "{other}");
        }
        let t = |chip: &str, sensor: &str| TempSensor {
            chip: chip.into(),
            sensor: sensor.into(),
            celsius: 40.0,
            crit_celsius: None,
            max_celsius: None,
            cpu: false,
        };
        assert_eq!(t("thermal_zone3", "x86_pkg_temp").device(), "x86_pkg_temp");
        assert_eq!(t("nvme", "Composite").device(), "nvme");
        assert_eq!(t("thermal_zone", "acpitz").device(), "thermal_zone");
    }
}
