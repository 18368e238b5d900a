//! A temperature sensor of /sys/class/hwmon or /sys/class/thermal, and the parser of a reading.

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
