//! `memwatch check` beside the other OOM killers: what systemd-oomd and earlyoom do on this machine,
//! and whether memwatch's host-memory pause comes before earlyoom's kill. Pure: what was found (the
//! types here; the `memwatch` crate's `proc::neighbours` reads them from `/proc` and the unit files)
//! and the config in, notes out.
//!
//! earlyoom acts when MemAvailable falls to `-m PERCENT` of its total (from v1.8 "user mem total",
//! MemAvailable + AnonPages, which is less than MemTotal) or to `-M SIZE` KiB, the lower of the two
//! when both are given, and free swap (if any) is under `-s`/`-S` too; by default 10 %. memwatch's
//! `[policy.host_memory] critical` is a share of MemTotal used, so memwatch pauses first only when
//! `critical` is below `1 - PERCENT/100`: at equal lines the two race, and a job growing fast is
//! killed before memwatch's next probe.

use std::path::PathBuf;

use serde::Serialize;

use crate::config::{OnCritical, RatioPolicy};

/// A running process of another OOM killer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Found {
    /// Its pid.
    pub pid: u32,
    /// Its command line, argument by argument.
    pub args: Vec<String>,
}

/// A unit setting that hands cgroups to systemd-oomd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Managed {
    /// The unit (`user@.service`, `-.slice`).
    pub unit: String,
    /// The setting, `ManagedOOMMemoryPressure=kill` or `ManagedOOMSwap=kill`, with the unit's
    /// `ManagedOOMMemoryPressureLimit=` when it sets one.
    pub setting: String,
    /// The file that says so.
    pub file: PathBuf,
}

/// What of the other OOM killers was found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Neighbours {
    /// systemd-oomd's process.
    pub oomd: Option<Found>,
    /// earlyoom's process.
    pub earlyoom: Option<Found>,
    /// Units whose cgroups systemd-oomd may kill in, by their files.
    pub managed: Vec<Managed>,
}

/// How far below earlyoom's line memwatch's critical level is advised to be (a share of MemTotal):
/// 5 points is 800 ms of growth at 1 GiB/s on a 16 GiB host.
pub const MARGIN: f64 = 0.05;

/// One thing `memwatch check` says about the other OOM killers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Note {
    /// Something to change: memwatch would act after an OOM killer, or not at all.
    pub warning: bool,
    /// For people.
    pub text: String,
}

/// An earlyoom command line memwatch cannot read its memory line from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EarlyoomArgError {
    /// `-m` or `-M` without a value.
    #[error("earlyoom's {0} has no value")]
    NoValue(String),
    /// A value that is not a number.
    #[error("earlyoom's {flag} {value:?} is not a number")]
    NotANumber {
        /// `-m` or `-M`.
        flag: String,
        /// Its value.
        value: String,
    },
}

/// earlyoom's memory line: the share of memory (0-1) left available at which it starts killing.
pub fn earlyoom_line(args: &[String], mem_total_bytes: u64) -> Result<f64, EarlyoomArgError> {
    let mut percent: Option<f64> = None;
    let mut size_kib: Option<f64> = None;
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        let (flag, inline) = match a.as_str() {
            "-m" | "-M" => (a.as_str(), None),
            s if s.len() > 2 && (s.starts_with("-m") || s.starts_with("-M")) => {
                (&s[..2], Some(&s[2..]))
            }
            _ => continue,
        };
        let value = match inline {
            Some(v) => v,
            None => it
                .next()
                .map(String::as_str)
                .ok_or_else(|| EarlyoomArgError::NoValue(flag.to_owned()))?,
        };
        // PERCENT[,KILL_PERCENT]: SIGTERM from the first.
        let first = value.split(',').next().unwrap_or("").trim();
        let n: f64 = first
            .parse()
            .ok()
            .filter(|n: &f64| n.is_finite() && *n >= 0.0)
            .ok_or_else(|| EarlyoomArgError::NotANumber {
                flag: flag.to_owned(),
                value: value.to_owned(),
            })?;
        if flag == "-m" {
            percent = Some(n);
        } else {
            size_kib = Some(n);
        }
    }
    let from_size = size_kib
        .filter(|_| mem_total_bytes > 0)
        .map(|k| k * 1024.0 / mem_total_bytes as f64 * 100.0);
    let line = match (percent, from_size) {
        (Some(p), Some(s)) => p.min(s),
        (Some(p), None) => p,
        (None, Some(s)) => s,
        (None, None) => 10.0,
    };
    Ok((line / 100.0).clamp(0.0, 1.0))
}

/// What to say about systemd-oomd and earlyoom, given memwatch's host-memory policy.
pub fn notes(n: &Neighbours, host: &RatioPolicy, mem_total_bytes: u64) -> Vec<Note> {
    let mut out = Vec::new();
    if let Some(o) = &n.oomd {
        let units: Vec<String> = n
            .managed
            .iter()
            .map(|m| format!("{} ({})", m.unit, m.setting))
            .collect();
        out.push(Note {
            warning: false,
            text: format!(
                "systemd-oomd runs (pid {}); it kills whole cgroups under {}. memwatch marks the cgroups of a job the policy holds paused user.oomd_omit=1 (oomd honours it on cgroups owned by root, or by the watched unit's owner) and takes the mark off when the pause ends; a job under MemoryHigh= counts memory.high as its limit, so memwatch pauses it before the pressure oomd kills on",
                o.pid,
                if units.is_empty() {
                    "no unit this check could read".to_owned()
                } else {
                    units.join(", ")
                }
            ),
        });
    }
    let Some(e) = &n.earlyoom else {
        return out;
    };
    let line = match earlyoom_line(&e.args, mem_total_bytes) {
        Ok(l) => l,
        Err(err) => {
            out.push(Note {
                warning: true,
                text: format!(
                    "earlyoom runs (pid {}), but its memory line cannot be read: {err}",
                    e.pid
                ),
            });
            return out;
        }
    };
    let kills_at = 1.0 - line;
    let crit = host.critical.0;
    let advise = (kills_at - MARGIN).max(0.05);
    let advice = format!(
        "set [policy.host_memory] critical = {:.2}, critical_leave = {:.2} and warn no higher than {:.2} (warn_leave below it) in memwatch.toml, or lower earlyoom's -m",
        advise,
        (advise - 0.05).max(0.0),
        (advise - 0.10).max(0.0)
    );
    let (warning, text) = if host.action != OnCritical::Pause {
        (
            true,
            format!(
                "earlyoom runs (pid {}) and kills at {:.0} % of memory used; memwatch's host_memory action is warn, so it pauses nothing before earlyoom kills: set [policy.host_memory] action = \"pause\" and {advice}",
                e.pid,
                kills_at * 100.0
            ),
        )
    } else if crit >= kills_at {
        (
            true,
            format!(
                "earlyoom runs (pid {}) and kills when MemAvailable falls to {:.0} % (at {:.0} % used); memwatch's host_memory critical {:.2} pauses {} it: {advice}",
                e.pid,
                line * 100.0,
                kills_at * 100.0,
                crit,
                if crit > kills_at {
                    "after"
                } else {
                    "no sooner than"
                }
            ),
        )
    } else if crit > kills_at - MARGIN {
        (
            false,
            format!(
                "earlyoom runs (pid {}) and kills at {:.0} % used; memwatch pauses at {:.0} %, less than {:.0} points before: a job growing fast may reach earlyoom's line first; {advice}",
                e.pid,
                kills_at * 100.0,
                crit * 100.0,
                MARGIN * 100.0
            ),
        )
    } else {
        (
            false,
            format!(
                "earlyoom runs (pid {}) and kills at {:.0} % used; memwatch pauses first, at {:.0} %",
                e.pid,
                kills_at * 100.0,
                crit * 100.0
            ),
        )
    };
    out.push(Note { warning, text });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Policy;

    const TOTAL: u64 = 16 << 30;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    fn earlyoom(cmd: &str) -> Neighbours {
        Neighbours {
            earlyoom: Some(Found {
                pid: 400,
                args: args(cmd),
            }),
            ..Neighbours::default()
        }
    }

    #[test]
    fn earlyooms_line_from_its_command_line() {
        let cases: [(&str, f64); 8] = [
            ("earlyoom", 0.10),
            ("earlyoom -r 3600", 0.10),
            ("earlyoom -m 5", 0.05),
            ("earlyoom -m 20,18 -s 5", 0.20),
            ("earlyoom -m15", 0.15),
            // 1 GiB of 16: 6.25 %.
            ("earlyoom -M 1048576", 0.0625),
            // Both: the lower.
            ("earlyoom -m 10 -M 1048576", 0.0625),
            ("earlyoom -M 4194304 -m 10", 0.10),
        ];
        for (cmd, want) in cases {
            let got = earlyoom_line(&args(cmd), TOTAL).unwrap();
            assert!((got - want).abs() < 1e-9, "{cmd}: {got}");
        }
        assert_eq!(
            earlyoom_line(&args("earlyoom -m"), TOTAL),
            Err(EarlyoomArgError::NoValue("-m".into()))
        );
        assert_eq!(
            earlyoom_line(&args("earlyoom -m ten"), TOTAL),
            Err(EarlyoomArgError::NotANumber {
                flag: "-m".into(),
                value: "ten".into()
            })
        );
    }

    /// The defaults race earlyoom's: critical 0.90 against -m 10 is a warning that says what to
    /// set; 0.85 pauses first; with -m 5 the defaults are close; a warn action is a warning.
    #[test]
    fn warns_when_memwatch_would_act_after_earlyoom() {
        let mut host = Policy::default().host_memory;
        let n = notes(&earlyoom("/usr/bin/earlyoom -m 10"), &host, TOTAL);
        assert_eq!(n.len(), 1);
        assert!(n[0].warning, "{n:?}");
        assert!(n[0].text.contains("no sooner than"), "{}", n[0].text);
        assert!(
            n[0].text.contains("critical = 0.85, critical_leave = 0.80"),
            "{}",
            n[0].text
        );
        let n = notes(&earlyoom("earlyoom -m 15"), &host, TOTAL);
        assert!(n[0].warning && n[0].text.contains("after"), "{n:?}");
        let n = notes(&earlyoom("earlyoom -m 5"), &host, TOTAL);
        assert!(!n[0].warning && n[0].text.contains("growing fast"), "{n:?}");
        host.critical = crate::config::Ratio(0.85);
        let n = notes(&earlyoom("earlyoom -m 10"), &host, TOTAL);
        assert!(!n[0].warning && n[0].text.contains("pauses first"), "{n:?}");
        host.action = OnCritical::Warn;
        let n = notes(&earlyoom("earlyoom -m 10"), &host, TOTAL);
        assert!(
            n[0].warning && n[0].text.contains("action = \"pause\""),
            "{n:?}"
        );
        let n = notes(&earlyoom("earlyoom -m x"), &host, TOTAL);
        assert!(
            n[0].warning && n[0].text.contains("cannot be read"),
            "{n:?}"
        );
    }

    /// systemd-oomd is a note naming the units it watches; neither daemon, no note.
    #[test]
    fn names_oomd_and_its_units() {
        let host = Policy::default().host_memory;
        assert!(notes(&Neighbours::default(), &host, TOTAL).is_empty());
        let n = Neighbours {
            oomd: Some(Found {
                pid: 311,
                args: args("/usr/lib/systemd/systemd-oomd"),
            }),
            managed: vec![Managed {
                unit: "user@.service".into(),
                setting: "ManagedOOMMemoryPressure=kill, ManagedOOMMemoryPressureLimit=50%".into(),
                file: "/usr/lib/systemd/system/user@.service.d/10-oomd-user-service-defaults.conf"
                    .into(),
            }],
            earlyoom: None,
        };
        let out = notes(&n, &host, TOTAL);
        assert_eq!(out.len(), 1);
        assert!(!out[0].warning);
        assert!(out[0].text.contains("pid 311"), "{}", out[0].text);
        assert!(
            out[0]
                .text
                .contains("user@.service (ManagedOOMMemoryPressure=kill"),
            "{}",
            out[0].text
        );
        assert!(out[0].text.contains("user.oomd_omit=1"), "{}", out[0].text);
    }
}
