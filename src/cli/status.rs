//! `memwatch status`: what `free -h`, `cat /proc/pressure/*` and `nvidia-smi` would show, in one table.

use std::fmt::Write as _;

use crate::sample::{Sample, psi};

/// Bytes the way `free -h` writes them: 1024-based, three significant digits at most.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "Ki", "Mi", "Gi", "Ti", "Pi"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes}B")
    } else if v < 10.0 {
        format!("{v:.1}{}", UNITS[unit])
    } else {
        format!("{v:.0}{}", UNITS[unit])
    }
}

fn opt(v: Option<u64>) -> String {
    v.map(human).unwrap_or_else(|| "-".into())
}

fn pct(r: f64) -> String {
    format!("{:.2}%", r * 100.0)
}

fn celsius(v: Option<f64>) -> String {
    v.map(|c| format!("{c:.0}°C")).unwrap_or_else(|| "-".into())
}

/// Renders the status table. `now_ms` dates the sample's age.
pub fn render(s: &Sample, url: &str, now_ms: u64) -> String {
    let mut o = String::new();
    let age = now_ms.saturating_sub(s.timestamp_ms) as f64 / 1000.0;
    let _ = writeln!(o, "memwatch at {url}, sample taken {age:.1} s ago\n");
    if let Some(m) = &s.host.memory {
        let buff_cache = m.buffers_bytes.unwrap_or(0) + m.cached_bytes.unwrap_or(0);
        let used = m
            .total_bytes
            .saturating_sub(m.free_bytes)
            .saturating_sub(buff_cache);
        let _ = writeln!(
            o,
            "{:<6}{:>11}{:>11}{:>11}{:>11}{:>12}{:>12}",
            "", "total", "used", "free", "shared", "buff/cache", "available"
        );
        let _ = writeln!(
            o,
            "{:<6}{:>11}{:>11}{:>11}{:>11}{:>12}{:>12}",
            "Mem:",
            human(m.total_bytes),
            human(used),
            human(m.free_bytes),
            opt(m.shmem_bytes),
            human(buff_cache),
            human(m.available_bytes)
        );
        let _ = writeln!(
            o,
            "{:<6}{:>11}{:>11}{:>11}",
            "Swap:",
            human(m.swap_total_bytes),
            human(m.swap_used_bytes()),
            human(m.swap_free_bytes)
        );
    } else {
        let _ = writeln!(o, "memory: unavailable (see the daemon's log)");
    }
    if let Some(cg) = &s.host.cgroup {
        let limit = cg.limit_bytes.map(human).unwrap_or_else(|| "none".into());
        let _ = writeln!(
            o,
            "cgroup v{} {}: usage {}, limit {limit}",
            cg.version,
            cg.path,
            human(cg.usage_bytes)
        );
    }
    o.push('\n');
    let p = &s.host.pressure;
    if psi::RESOURCES.iter().all(|r| p.get(r).is_none()) {
        let _ = writeln!(o, "pressure: this kernel has no PSI");
    } else {
        let _ = writeln!(
            o,
            "{:<14}{:>9}{:>9}{:>9}{:>14}",
            "pressure", "avg10", "avg60", "avg300", "total"
        );
        for r in psi::RESOURCES {
            let Some(psi) = p.get(r) else { continue };
            for (kind, line) in [("some", Some(psi.some)), ("full", psi.full)] {
                let Some(l) = line else { continue };
                let _ = writeln!(
                    o,
                    "{:<14}{:>9}{:>9}{:>9}{:>13.1}s",
                    format!("{r} {kind}"),
                    pct(l.avg10),
                    pct(l.avg60),
                    pct(l.avg300),
                    l.total_seconds
                );
            }
        }
    }
    o.push('\n');
    if s.gpus.is_empty() {
        let _ = writeln!(
            o,
            "GPUs: none visible (no NVIDIA driver, no GPU, or GPU sampling disabled)"
        );
    } else {
        let _ = writeln!(
            o,
            "{:<4}{:<24}{:>22}{:>7}{:>10}{:>10}{:>15}{:>6}",
            "GPU", "name", "memory used/total", "temp", "slowdown", "shutdown", "power", "util"
        );
        for g in &s.gpus {
            let mem = match (g.memory_used_bytes, g.memory_total_bytes) {
                (Some(u), Some(t)) if t > 0 => {
                    format!(
                        "{} / {} ({:.0}%)",
                        human(u),
                        human(t),
                        u as f64 * 100.0 / t as f64
                    )
                }
                _ => "-".into(),
            };
            let power = match (g.power_watts, g.power_limit_watts) {
                (Some(p), Some(l)) => format!("{p:.0} / {l:.0} W"),
                (Some(p), None) => format!("{p:.0} W"),
                _ => "-".into(),
            };
            let util = g
                .utilization_gpu_ratio
                .map(|u| format!("{:.0}%", u * 100.0))
                .unwrap_or_else(|| "-".into());
            let name: String = g.name.as_deref().unwrap_or("-").chars().take(23).collect();
            let _ = writeln!(
                o,
                "{:<4}{:<24}{:>22}{:>7}{:>10}{:>10}{:>15}{:>6}",
                g.index,
                name,
                mem,
                celsius(g.temperature_celsius),
                celsius(g.temperature_slowdown_celsius),
                celsius(g.temperature_shutdown_celsius),
                power,
                util
            );
            if let Some(reasons) = g.throttle_reasons.as_ref().filter(|r| !r.is_empty()) {
                let _ = writeln!(o, "    throttled: {}", reasons.join(", "));
            }
            for p in g.processes.iter().flatten() {
                let _ = writeln!(o, "    pid {:<10} {}", p.pid, opt(p.used_bytes));
            }
        }
    }
    if !s.host.temperatures.is_empty() {
        o.push('\n');
        for t in &s.host.temperatures {
            let crit = t
                .crit_celsius
                .map(|c| format!(" (crit {c:.0}°C)"))
                .unwrap_or_default();
            let _ = writeln!(o, "{}/{}: {:.0}°C{crit}", t.chip, t.sensor, t.celsius);
        }
    }
    let failed: Vec<&str> = s
        .collectors
        .iter()
        .filter(|c| !c.success)
        .map(|c| c.name.as_str())
        .collect();
    if !failed.is_empty() {
        let _ = writeln!(
            o,
            "\nfailing collectors: {} (see the daemon's log)",
            failed.join(", ")
        );
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_sizes_like_free() {
        assert_eq!(human(0), "0B");
        assert_eq!(human(1023), "1023B");
        assert_eq!(human(1536), "1.5Ki");
        assert_eq!(human(24 * 1024 * 1024 * 1024), "24Gi");
    }
}
