//! `memwatch status`: health at a glance, then what `free -h`, `cat /proc/pressure/*` and
//! `nvidia-smi` would show, in one screen.
//!
//! First a line per level (critical, warn, ok: coloured on a terminal), then the attached jobs with
//! their state, why and for how long they are paused, then memory, pressure and GPUs with the room
//! left in bytes beside each percentage.

use std::fmt::Write as _;

use serde::Deserialize;

use crate::engine::LevelView;
use crate::human::{self, Paint};
use crate::job::{Limit, Pause, PauseDeadline};
use crate::policy::{By, Level};
use crate::sample::{Sample, psi};

pub use human::bytes as human;

/// What `/api/v1/jobs` says that status shows.
#[derive(Debug, Default, Deserialize)]
pub struct Overview {
    #[serde(default)]
    pub dry_run: bool,
    #[serde(default)]
    pub jobs: Vec<JobLine>,
    #[serde(default)]
    pub levels: Vec<LevelView>,
}

#[derive(Debug, Deserialize)]
pub struct JobLine {
    pub name: String,
    pub pid: u32,
    pub pause: Option<Pause>,
    #[serde(default)]
    pub tightest: Option<Limit>,
    #[serde(default)]
    pub pause_deadline: Option<PauseDeadline>,
    /// The CUDA OOMs its trainer reported (`memwatch top` shows them).
    #[serde(default)]
    pub cuda_oom: Option<crate::cuda_oom::CudaOoms>,
}

/// Who paused a job, in words.
pub fn paused_by(by: By) -> &'static str {
    match by {
        By::Policy => "memwatch",
        By::User => "hand (memwatch pause)",
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

/// The levels, worst first: one line each for critical and warn with their values and how long,
/// and one for what is ok. Resources that do not exist here (no swap, no sensor) are left out.
fn levels(o: &mut String, levels: &[LevelView], now_ms: u64, paint: Paint) {
    for level in [Level::Critical, Level::Warn] {
        let items: Vec<String> = levels
            .iter()
            .filter(|l| l.level == level)
            .map(|l| {
                let leaving = l
                    .settling
                    .map(|to| format!(" (leaving: {} unless it rises again)", to.as_str()))
                    .unwrap_or_default();
                format!(
                    "{}{} for {}{leaving}",
                    l.resource.words(),
                    l.resource.value_words(l.value),
                    human::duration(now_ms.saturating_sub(l.since_ms) as f64 / 1000.0)
                )
            })
            .collect();
        if !items.is_empty() {
            let label = format!("{:<9}", level.as_str().to_uppercase());
            let _ = writeln!(o, "{}{}", paint.level(level, &label), items.join(" · "));
        }
    }
    let ok: Vec<String> = levels
        .iter()
        .filter(|l| l.level == Level::Ok && l.value.is_some())
        .map(|l| format!("{}{}", l.resource.words(), l.resource.value_words(l.value)))
        .collect();
    if !ok.is_empty() {
        let _ = writeln!(
            o,
            "{}{}",
            paint.level(Level::Ok, &format!("{:<9}", "ok")),
            ok.join(" · ")
        );
    }
}

/// Attached jobs: running with their tightest limit, or paused with why, for how long, and until when.
fn jobs(o: &mut String, jobs: &[JobLine], now_ms: u64, paint: Paint) {
    if jobs.is_empty() {
        let _ = writeln!(o, "jobs     none attached (memwatch attach <pid>)");
        return;
    }
    // Paused jobs first.
    let mut sorted: Vec<&JobLine> = jobs.iter().collect();
    sorted.sort_by_key(|j| (j.pause.is_none(), j.name.clone()));
    for (i, j) in sorted.into_iter().enumerate() {
        let head = if i == 0 { "jobs" } else { "" };
        let what = match &j.pause {
            Some(p) => {
                let dry = if p.dry_run {
                    " (dry run: nothing stopped)"
                } else {
                    ""
                };
                let until = j
                    .pause_deadline
                    .as_ref()
                    .map(|d| {
                        format!(
                            "; {} in {}",
                            match d.then.as_str() {
                                "way out" => "its way out continues",
                                "terminate" => "memwatch ends it",
                                "stay" => "the pause is marked expired",
                                _ => "memwatch resumes it",
                            },
                            human::duration(d.at_ms.saturating_sub(now_ms) as f64 / 1000.0)
                        )
                    })
                    .unwrap_or_else(|| match p.by {
                        By::User => format!("; until resumed (memwatch resume {})", j.name),
                        By::Policy => String::new(),
                    });
                paint.level(
                    Level::Critical,
                    &format!(
                        "PAUSED {} by {}{dry}: {}{until}",
                        human::duration(now_ms.saturating_sub(p.since_ms) as f64 / 1000.0),
                        paused_by(p.by),
                        p.reason
                    ),
                )
            }
            None => match &j.tightest {
                Some(l) => format!(
                    "running; {}: {} left{}",
                    l.limit,
                    human(l.headroom_bytes),
                    l.time_to_exhaustion_seconds
                        .map(|t| format!(", full in {} at this rate", human::duration(t)))
                        .unwrap_or_else(|| ", not growing".into())
                ),
                None => "running".into(),
            },
        };
        let _ = writeln!(o, "{head:<9}{} (pid {}) {what}", paint.bold(&j.name), j.pid);
    }
}

/// `memwatch status [--json] [--watch SECONDS]`: one screen, or one refreshed in place.
pub(super) fn run(
    cli: &super::Cli,
    json: bool,
    url: Option<String>,
    watch: Option<f64>,
) -> Result<(), super::Failure> {
    let config = super::load_config(cli)?;
    let url = url.unwrap_or_else(|| super::daemon_url(&config));
    let client = crate::client::Client::new(&url);
    if json {
        println!("{}", serde_json::to_string_pretty(&client.snapshot()?)?);
        return Ok(());
    }
    let paint = Paint::for_stdout();
    let screen = || -> anyhow::Result<String> {
        let sample: Sample = client.sample()?;
        let view: Overview = client.get("/api/v1/jobs")?;
        Ok(render(&sample, &view, &url, crate::clock::wall_ms(), paint))
    };
    match watch {
        None => print!("{}", screen()?),
        Some(secs) if !(0.1..=3600.0).contains(&secs) => {
            return Err(super::usage(anyhow::anyhow!(
                "--watch takes 0.1 to 3600 seconds, got {secs}"
            )));
        }
        Some(secs) => loop {
            // Home and clear, then the screen; a daemon that went away is said in place.
            let text = screen().unwrap_or_else(|e| format!("{e:#}\n"));
            print!("\x1b[H\x1b[2J{text}");
            std::io::Write::flush(&mut std::io::stdout())?;
            std::thread::sleep(std::time::Duration::from_secs_f64(secs));
        },
    }
    Ok(())
}

/// Renders the status screen. `now_ms` dates the sample's age.
pub fn render(s: &Sample, view: &Overview, url: &str, now_ms: u64, paint: Paint) -> String {
    let mut o = String::new();
    let age = now_ms.saturating_sub(s.timestamp_ms) as f64 / 1000.0;
    let host = s.host.hostname.as_deref().unwrap_or("this machine");
    let dry = if view.dry_run { ", DRY RUN" } else { "" };
    let _ = writeln!(
        o,
        "memwatch on {host} ({url}{dry}), sample {} old\n",
        human::duration(age)
    );
    levels(&mut o, &view.levels, now_ms, paint);
    jobs(&mut o, &view.jobs, now_ms, paint);
    o.push('\n');
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
        let limit = match cg.limit_bytes {
            Some(l) => format!(
                "limit {}, {} left",
                human(l),
                human(l.saturating_sub(cg.unreclaimable_bytes()))
            ),
            None => "no limit".into(),
        };
        let _ = writeln!(
            o,
            "memwatch's cgroup (v{}) {}: usage {}, {limit}",
            cg.version,
            cg.path,
            human(cg.usage_bytes)
        );
    }
    o.push('\n');
    pressure(&mut o, s);
    o.push('\n');
    gpus(&mut o, s);
    if !s.host.temperatures.is_empty() {
        o.push('\n');
        for t in &s.host.temperatures {
            let crit = t
                .crit_celsius
                .map(|c| format!(" (critical at {c:.0}°C, {:.0}°C away)", c - t.celsius))
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

fn pressure(o: &mut String, s: &Sample) {
    let p = &s.host.pressure;
    if psi::RESOURCES.iter().all(|r| p.get(r).is_none()) {
        let _ = writeln!(o, "pressure: this kernel has no PSI");
        return;
    }
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
                "{:<14}{:>9}{:>9}{:>9}{:>14}",
                format!("{r} {kind}"),
                pct(l.avg10),
                pct(l.avg60),
                pct(l.avg300),
                human::duration(l.total_seconds)
            );
        }
    }
}

fn gpus(o: &mut String, s: &Sample) {
    if s.gpus.is_empty() {
        let _ = writeln!(
            o,
            "GPUs: none visible (no NVIDIA driver, no GPU, or GPU sampling disabled)"
        );
        return;
    }
    let _ = writeln!(
        o,
        "{:<4}{:<22}{:>24}{:>9}{:>7}{:>10}{:>10}{:>13}{:>6}",
        "GPU", "name", "memory used/total", "left", "temp", "slowdown", "shutdown", "power", "util"
    );
    for g in &s.gpus {
        let (mem, left) = match (g.memory_used_bytes, g.memory_total_bytes) {
            (Some(u), Some(t)) if t > 0 => (
                format!(
                    "{} / {} ({:.0}%)",
                    human(u),
                    human(t),
                    u as f64 * 100.0 / t as f64
                ),
                human(t.saturating_sub(u)),
            ),
            _ => ("-".into(), "-".into()),
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
        let name: String = g.name.as_deref().unwrap_or("-").chars().take(21).collect();
        let _ = writeln!(
            o,
            "{:<4}{:<22}{:>24}{:>9}{:>7}{:>10}{:>10}{:>13}{:>6}",
            g.index,
            name,
            mem,
            left,
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
