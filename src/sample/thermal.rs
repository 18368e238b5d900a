//! Temperatures from /sys/class/hwmon and /sys/class/thermal, with critical and maximum thresholds.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::error::{ReadError, read_text};
use super::kept::KeptFile;

pub use memwatch_core::sample::thermal::{TempSensor, celsius_of, is_cpu_device};

/// Reads every sensor under `<root>/sys/class/{hwmon,thermal}` once. A sensor that cannot be read
/// (many answer EIO or ENODATA while asleep) is skipped; a missing class directory means no sensors.
pub fn read(root: &Path) -> Result<Vec<TempSensor>, ReadError> {
    Ok(Sensors::new(root).read())
}

/// How long a list of sensors is trusted before the classes are listed again (a device plugged in,
/// a driver loaded late, a sensor gone).
pub const RELIST: Duration = Duration::from_secs(60);

/// The host's temperature sensors, for a sampler that reads them again and again: the classes are
/// listed at most once per [`RELIST`], names, labels and thresholds are read when a sensor is found,
/// and each reading's file is kept open and read again from its start on each call (sysfs shows an
/// attribute afresh at offset 0), so a sample costs one read per sensor instead of a directory walk
/// and four opens.
pub struct Sensors {
    root: PathBuf,
    found: Vec<Found>,
    listed_at: Option<Instant>,
}

/// One sensor as found: what does not change, and its reading's file.
struct Found {
    chip: String,
    sensor: String,
    input: KeptFile,
    crit_celsius: Option<f64>,
    max_celsius: Option<f64>,
    /// A CPU's sensor, by its device's name ([`is_cpu_device`]).
    cpu: bool,
}

impl Sensors {
    /// Sensors under `root`; nothing is listed before the first read.
    pub fn new(root: &Path) -> Self {
        Sensors {
            root: root.to_owned(),
            found: Vec::new(),
            listed_at: None,
        }
    }

    /// Every sensor's reading now, sorted by chip and sensor; one that cannot be read is skipped.
    pub fn read(&mut self) -> Vec<TempSensor> {
        if self.listed_at.is_none_or(|t| t.elapsed() >= RELIST) {
            self.found = list_hwmon(&self.root.join("sys/class/hwmon"));
            self.found
                .extend(list_zones(&self.root.join("sys/class/thermal")));
            self.found
                .sort_by(|a, b| (&a.chip, &a.sensor).cmp(&(&b.chip, &b.sensor)));
            self.listed_at = Some(Instant::now());
        }
        self.found
            .iter_mut()
            .filter_map(|f| {
                let celsius = f.input.read().ok().and_then(|(_, t)| celsius_of(t))?;
                Some(TempSensor {
                    chip: f.chip.clone(),
                    sensor: f.sensor.clone(),
                    celsius,
                    crit_celsius: f.crit_celsius,
                    max_celsius: f.max_celsius,
                    cpu: f.cpu,
                })
            })
            .collect()
    }
}

/// Millidegrees Celsius from a sysfs file, within physical bounds.
fn millideg(path: &Path) -> Option<f64> {
    celsius_of(&read_text(path).ok()?)
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

fn list_hwmon(class: &Path) -> Vec<Found> {
    let mut out = Vec::new();
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
            let sensor = read_text(&dir.join(format!("{stem}_label")))
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(|_| stem.to_owned());
            out.push(Found {
                cpu: is_cpu_device(&chip),
                chip: chip.clone(),
                sensor,
                input: KeptFile::new(f.path()),
                crit_celsius: millideg(&dir.join(format!("{stem}_crit"))),
                max_celsius: millideg(&dir.join(format!("{stem}_max"))),
            });
        }
    }
    out
}

fn list_zones(class: &Path) -> Vec<Found> {
    let mut out = Vec::new();
    for zone in sorted_entries(class) {
        let name = zone.file_name().to_string_lossy().into_owned();
        if !name.starts_with("thermal_zone") {
            continue;
        }
        let dir = zone.path();
        if !dir.join("temp").is_file() {
            continue;
        }
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
        out.push(Found {
            cpu: is_cpu_device(&kind),
            chip: name,
            sensor: kind,
            input: KeptFile::new(dir.join("temp")),
            crit_celsius: crit,
            max_celsius: max,
        });
    }
    out
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
        assert!(s[0].cpu && s[1].cpu);
    }

    #[test]
    fn only_cpu_drivers_and_zones_are_marked_cpu() {
        let dir = tempfile::tempdir().unwrap();
        for (i, name) in ["k10temp", "nvme", "iwlwifi_1", "acpitz"]
            .iter()
            .enumerate()
        {
            let h = dir.path().join(format!("sys/class/hwmon/hwmon{i}"));
            fs::create_dir_all(&h).unwrap();
            fs::write(h.join("name"), format!("{name}\n")).unwrap();
            fs::write(h.join("temp1_input"), "45000\n").unwrap();
        }
        for (i, kind) in ["acpitz", "x86_pkg_temp", "cpu-thermal"].iter().enumerate() {
            let z = dir
                .path()
                .join(format!("sys/class/thermal/thermal_zone{i}"));
            fs::create_dir_all(&z).unwrap();
            fs::write(z.join("type"), format!("{kind}\n")).unwrap();
            fs::write(z.join("temp"), "45000\n").unwrap();
        }
        let s = read(dir.path()).unwrap();
        let cpu: Vec<&str> = s.iter().filter(|t| t.cpu).map(|t| t.device()).collect();
        assert_eq!(cpu, ["k10temp", "x86_pkg_temp", "cpu-thermal"]);
        assert_eq!(s.len(), 7);
    }

    #[test]
    fn sensors_are_listed_once_a_while_and_their_readings_read_each_time() {
        let dir = tempfile::tempdir().unwrap();
        let h = dir.path().join("sys/class/hwmon/hwmon0");
        fs::create_dir_all(&h).unwrap();
        fs::write(h.join("name"), "k10temp\n").unwrap();
        fs::write(h.join("temp1_input"), "54000\n").unwrap();
        fs::write(h.join("temp1_crit"), "100000\n").unwrap();
        let mut sensors = Sensors::new(dir.path());
        let reading = |s: &mut Sensors| {
            s.read()
                .iter()
                .map(|t| (t.sensor.clone(), t.celsius, t.crit_celsius))
                .collect::<Vec<_>>()
        };
        assert_eq!(reading(&mut sensors), [("temp1".into(), 54.0, Some(100.0))]);
        // A new reading is read; a sensor added is not seen until the classes are listed again.
        fs::write(h.join("temp1_input"), "61500\n").unwrap();
        fs::write(h.join("temp2_input"), "40000\n").unwrap();
        assert_eq!(reading(&mut sensors), [("temp1".into(), 61.5, Some(100.0))]);
        // A sensor asleep (its reading unreadable) is skipped, and comes back when it answers.
        fs::write(h.join("temp1_input"), "").unwrap();
        assert!(reading(&mut sensors).is_empty());
        fs::write(h.join("temp1_input"), "62000\n").unwrap();
        assert_eq!(reading(&mut sensors).len(), 1);
        sensors.listed_at = Some(Instant::now() - RELIST);
        assert_eq!(
            reading(&mut sensors),
            [
                ("temp1".into(), 62.0, Some(100.0)),
                ("temp2".into(), 40.0, None)
            ]
        );
    }

    #[test]
    fn no_sysfs_means_no_sensors() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read(dir.path()).unwrap().is_empty());
    }
}
