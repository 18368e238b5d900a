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
}
