//! The other OOM killers on the machine, as `memwatch check` reports them: systemd-oomd and earlyoom
//! found by their processes in `/proc` (earlyoom's thresholds are on its command line), and the
//! systemd units that hand cgroups to systemd-oomd (`ManagedOOMMemoryPressure=kill`,
//! `ManagedOOMSwap=kill`), read from the unit files and drop-ins, since asking systemd needs D-Bus.
//! Every reader takes a root; what cannot be read is left out.

use std::path::{Path, PathBuf};

pub use memwatch_core::check::neighbours::{Found, Managed, Neighbours};

/// Where unit files and drop-ins live, the ones that win first (systemd's order).
const UNIT_DIRS: [&str; 7] = [
    "etc/systemd/system.control",
    "run/systemd/system.control",
    "run/systemd/transient",
    "etc/systemd/system",
    "run/systemd/system",
    "usr/lib/systemd/system",
    "lib/systemd/system",
];
/// At most this many processes and unit files are looked at, and this much of a command line.
const MOST_PROCS: usize = 100_000;
const MOST_FILES: usize = 20_000;
const FILE_MAX: u64 = 64 << 10;

/// Finds systemd-oomd and earlyoom under `process_root`'s `/proc`, and the units that hand cgroups
/// to systemd-oomd under `root`.
pub fn read(process_root: &Path, root: &Path) -> Neighbours {
    let mut out = Neighbours {
        managed: managed_units(root),
        ..Neighbours::default()
    };
    let Ok(dir) = std::fs::read_dir(process_root.join("proc")) else {
        return out;
    };
    for pid in dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .take(MOST_PROCS)
    {
        let Ok(stat) = super::read_stat(process_root, pid) else {
            continue;
        };
        let slot = match stat.comm.as_str() {
            "systemd-oomd" => &mut out.oomd,
            "earlyoom" => &mut out.earlyoom,
            _ => continue,
        };
        if slot.is_none() {
            *slot = Some(Found {
                pid,
                args: cmdline(process_root, pid),
            });
        }
    }
    out
}

/// A process's arguments (empty when unreadable).
fn cmdline(root: &Path, pid: u32) -> Vec<String> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    let read = std::fs::File::open(super::dir(root, pid).join("cmdline"))
        .and_then(|f| f.take(FILE_MAX).read_to_end(&mut bytes));
    if read.is_err() {
        return Vec::new();
    }
    bytes
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// The `ManagedOOM…=kill` settings in unit files and drop-ins under `root`, one per unit and
/// setting, the winning directory's.
pub fn managed_units(root: &Path) -> Vec<Managed> {
    let mut files = Vec::new();
    for d in UNIT_DIRS {
        let Ok(entries) = std::fs::read_dir(root.join(d)) else {
            continue;
        };
        let mut entries: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        entries.sort();
        for p in entries {
            let Some(name) = p.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
                continue;
            };
            if let Some(unit) = name.strip_suffix(".d").filter(|_| p.is_dir()) {
                let mut confs: Vec<PathBuf> = std::fs::read_dir(&p)
                    .map(|rd| rd.flatten().map(|e| e.path()).collect())
                    .unwrap_or_default();
                confs.sort();
                files.extend(
                    confs
                        .into_iter()
                        .filter(|c| c.extension().is_some_and(|x| x == "conf"))
                        .map(|c| (unit.to_owned(), c)),
                );
            } else if [".service", ".slice", ".scope"]
                .iter()
                .any(|s| name.ends_with(s))
            {
                files.push((name, p));
            }
            if files.len() >= MOST_FILES {
                break;
            }
        }
    }
    let mut out: Vec<Managed> = Vec::new();
    for (unit, file) in files {
        let Ok(text) = crate::sample::error::read_text(&file) else {
            continue;
        };
        let limit = text.lines().find_map(|l| {
            l.trim()
                .strip_prefix("ManagedOOMMemoryPressureLimit=")
                .map(str::trim)
        });
        for line in text.lines().map(str::trim) {
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            let key = key.trim();
            if !matches!(key, "ManagedOOMMemoryPressure" | "ManagedOOMSwap") {
                continue;
            }
            if value.trim() != "kill"
                || out
                    .iter()
                    .any(|m| m.unit == unit && m.setting.starts_with(key))
            {
                continue;
            }
            let setting = match (key, limit) {
                ("ManagedOOMMemoryPressure", Some(l)) if !l.is_empty() => {
                    format!("{key}=kill, ManagedOOMMemoryPressureLimit={l}")
                }
                _ => format!("{key}=kill"),
            };
            out.push(Managed {
                unit: unit.clone(),
                setting,
                file: file.clone(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &[u8]) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    fn stat(pid: u32, comm: &str) -> Vec<u8> {
        format!("{pid} ({comm}) S 1 {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 500 0 0\n")
            .into_bytes()
    }

    /// Both daemons found by name with their arguments, a stranger and garbage ignored; the units
    /// Debian ships for oomd, a drop-in, a transient slice, and an /etc unit that overrides
    /// /usr/lib's (its setting read once).
    #[test]
    fn finds_both_killers_and_the_units_oomd_watches() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        write(r, "proc/1/stat", &stat(1, "systemd"));
        write(r, "proc/311/stat", &stat(311, "systemd-oomd"));
        write(r, "proc/311/cmdline", b"/usr/lib/systemd/systemd-oomd\0");
        write(r, "proc/400/stat", &stat(400, "earlyoom"));
        write(
            r,
            "proc/400/cmdline",
            b"/usr/bin/earlyoom\0-r\x003600\0-m\x005,3\0",
        );
        write(r, "proc/401/stat", b"garbage");
        write(r, "proc/self/stat", &stat(9, "memwatch"));
        write(
            r,
            "usr/lib/systemd/system/user@.service.d/10-oomd-user-service-defaults.conf",
            b"[Service]\nManagedOOMMemoryPressure=kill\nManagedOOMMemoryPressureLimit=50%\n",
        );
        write(
            r,
            "usr/lib/systemd/system/-.slice.d/10-oomd-root-slice-defaults.conf",
            b"[Slice]\nManagedOOMSwap=kill\n",
        );
        write(
            r,
            "run/systemd/transient/work.slice",
            b"[Slice]\nManagedOOMMemoryPressure = kill\n",
        );
        write(
            r,
            "etc/systemd/system/quiet.service",
            b"[Service]\nManagedOOMMemoryPressure=auto\n",
        );
        write(
            r,
            "etc/systemd/system/batch.slice",
            b"[Slice]\nManagedOOMMemoryPressure=kill\nManagedOOMMemoryPressureLimit=20%\n",
        );
        write(
            r,
            "usr/lib/systemd/system/batch.slice",
            b"[Slice]\nManagedOOMMemoryPressure=kill\n",
        );
        let n = read(r, r);
        assert_eq!(n.oomd.as_ref().map(|f| f.pid), Some(311));
        assert_eq!(
            n.earlyoom.map(|f| f.args),
            Some(vec![
                "/usr/bin/earlyoom".to_owned(),
                "-r".into(),
                "3600".into(),
                "-m".into(),
                "5,3".into()
            ])
        );
        let got: Vec<(String, String)> = n
            .managed
            .iter()
            .map(|m| (m.unit.clone(), m.setting.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "work.slice".to_owned(),
                    "ManagedOOMMemoryPressure=kill".into()
                ),
                (
                    "batch.slice".into(),
                    "ManagedOOMMemoryPressure=kill, ManagedOOMMemoryPressureLimit=20%".into()
                ),
                ("-.slice".into(), "ManagedOOMSwap=kill".into()),
                (
                    "user@.service".into(),
                    "ManagedOOMMemoryPressure=kill, ManagedOOMMemoryPressureLimit=50%".into()
                ),
            ]
        );
        // No /proc and no units: nothing found, nothing fails.
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(read(empty.path(), empty.path()), Neighbours::default());
    }
}
