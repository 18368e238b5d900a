//! Temperatures from /sys/class/hwmon and /sys/class/thermal, with critical and maximum thresholds.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::error::{ReadError, read_text};

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

/// Reads every sensor under `<root>/sys/class/{hwmon,thermal}`. A sensor that cannot be read (many
/// answer EIO or ENODATA while asleep) is skipped; a missing class directory means no sensors.
pub fn read(root: &Path) -> Result<Vec<TempSensor>, ReadError> {
    let mut out = Vec::new();
    read_hwmon(&root.join("sys/class/hwmon"), &mut out);
    read_zones(&root.join("sys/class/thermal"), &mut out);
    out.sort_by(|a, b| (&a.chip, &a.sensor).cmp(&(&b.chip, &b.sensor)));
    Ok(out)
}

/// Millidegrees Celsius from a sysfs file, within physical bounds.
fn millideg(path: &Path) -> Option<f64> {
    let v: i64 = read_text(path).ok()?.trim().parse().ok()?;
    let c = v as f64 / 1000.0;
    (-273.0..=1000.0).contains(&c).then_some(c)
}

fn sorted_entries(dir: &Path) -> Vec<std::fs::DirEntry> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .collect();
    v.sort_by_key(|e| e.file_name());
    v
}

fn read_hwmon(class: &Path, out: &mut Vec<TempSensor>) {
    for chip_dir in sorted_entries(class) {
        let dir = chip_dir.path();
        let chip = read_text(&dir.join("name"))
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| chip_dir.file_name().to_string_lossy().into_owned());
        for f in sorted_entries(&dir) {
            let name = f.file_name().to_string_lossy().into_owned();
            let Some(stem) = name
                .strip_suffix("_input")
                .filter(|s| s.starts_with("temp"))
            else {
                continue;
            };
            let Some(celsius) = millideg(&f.path()) else {
                continue;
            };
            let sensor = read_text(&dir.join(format!("{stem}_label")))
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(|_| stem.to_owned());
            out.push(TempSensor {
                chip: chip.clone(),
                sensor,
                celsius,
                crit_celsius: millideg(&dir.join(format!("{stem}_crit"))),
                max_celsius: millideg(&dir.join(format!("{stem}_max"))),
            });
        }
    }
}

fn read_zones(class: &Path, out: &mut Vec<TempSensor>) {
    for zone in sorted_entries(class) {
        let name = zone.file_name().to_string_lossy().into_owned();
        if !name.starts_with("thermal_zone") {
            continue;
        }
        let dir = zone.path();
        let Some(celsius) = millideg(&dir.join("temp")) else {
            continue;
        };
        let kind = read_text(&dir.join("type"))
            .map(|s| s.trim().to_owned())
            .unwrap_or_default();
        let (mut crit, mut max) = (None, None);
        for i in 0..16 {
            let Ok(t) = read_text(&dir.join(format!("trip_point_{i}_type"))) else {
                break;
            };
            let temp = millideg(&dir.join(format!("trip_point_{i}_temp")));
            match t.trim() {
                "critical" => crit = crit.or(temp),
                "hot" => max = max.or(temp),
                _ => {}
            }
        }
        out.push(TempSensor {
            chip: name,
            sensor: kind,
            celsius,
            crit_celsius: crit,
            max_celsius: max,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn hwmon_and_zones_with_broken_sensors_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let h = dir.path().join("sys/class/hwmon/hwmon0");
        fs::create_dir_all(&h).unwrap();
        fs::write(h.join("name"), "coretemp\n").unwrap();
        fs::write(h.join("temp1_input"), "54000\n").unwrap();
        fs::write(h.join("temp1_label"), "Package id 0\n").unwrap();
        fs::write(h.join("temp1_crit"), "100000\n").unwrap();
        fs::write(h.join("temp2_input"), "garbage\n").unwrap();
        fs::write(h.join("temp3_input"), "99999999999999999999\n").unwrap();
        let z = dir.path().join("sys/class/thermal/thermal_zone0");
        fs::create_dir_all(&z).unwrap();
        fs::write(z.join("type"), "x86_pkg_temp\n").unwrap();
        fs::write(z.join("temp"), "-5000\n").unwrap();
        fs::write(z.join("trip_point_0_type"), "critical\n").unwrap();
        fs::write(z.join("trip_point_0_temp"), "105000\n").unwrap();
        let s = read(dir.path()).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(
            (s[0].chip.as_str(), s[0].sensor.as_str(), s[0].celsius),
            ("coretemp", "Package id 0", 54.0)
        );
        assert_eq!(s[0].crit_celsius, Some(100.0));
        assert_eq!((s[1].celsius, s[1].crit_celsius), (-5.0, Some(105.0)));
    }

    #[test]
    fn no_sysfs_means_no_sensors() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read(dir.path()).unwrap().is_empty());
    }
}
