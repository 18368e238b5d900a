//! /proc/pressure/{memory,cpu,io}: pressure stall information.
//!
//! Where the kernel has no PSI the file is missing and memwatch's reader says so with `Ok(None)`:
//! the series are then absent, never zeros.

use std::path::Path;

use crate::expo::Writer;
use serde::{Deserialize, Serialize};

use super::error::ReadError;

/// One PSI line: shares of wall time (0–1) stalled over 10/60/300 s, and the total stall time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PsiLine {
    /// Share stalled over the last 10 s.
    pub avg10: f64,
    /// Share stalled over the last 60 s.
    pub avg60: f64,
    /// Share stalled over the last 300 s.
    pub avg300: f64,
    /// Total stall time since boot.
    pub total_seconds: f64,
}

/// A resource's pressure. `full` is absent for the CPU on kernels before 5.13.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Psi {
    /// Some task stalled.
    pub some: PsiLine,
    /// Every non-idle task stalled at once.
    pub full: Option<PsiLine>,
}

/// Pressure for the three resources; each absent where the kernel has no PSI.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Pressure {
    /// Memory pressure.
    pub memory: Option<Psi>,
    /// CPU pressure.
    pub cpu: Option<Psi>,
    /// I/O pressure.
    pub io: Option<Psi>,
}

/// The resources PSI reports on.
pub const RESOURCES: [&str; 3] = ["memory", "cpu", "io"];

impl Pressure {
    /// The pressure of `resource` (memory, cpu or io).
    pub fn get(&self, resource: &str) -> Option<&Psi> {
        match resource {
            "memory" => self.memory.as_ref(),
            "cpu" => self.cpu.as_ref(),
            "io" => self.io.as_ref(),
            _ => None,
        }
    }
}

/// Parses one /proc/pressure file's text (`path` names it in errors).
pub fn parse(path: &Path, text: &str) -> Result<Psi, ReadError> {
    let mut some = None;
    let mut full = None;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let slot = match words.next() {
            Some("some") => &mut some,
            Some("full") => &mut full,
            _ => continue,
        };
        *slot = Some(parse_line(path, words)?);
    }
    let some = some.ok_or_else(|| ReadError::parse(path, "no `some` line"))?;
    Ok(Psi { some, full })
}

fn parse_line<'a>(path: &Path, words: impl Iterator<Item = &'a str>) -> Result<PsiLine, ReadError> {
    let (mut a10, mut a60, mut a300, mut total) = (None, None, None, None);
    for word in words {
        let Some((k, v)) = word.split_once('=') else {
            continue;
        };
        let bad = || ReadError::parse(path, format!("{k}={v:?} is not a number"));
        match k {
            "avg10" | "avg60" | "avg300" => {
                let pct: f64 = v.parse().map_err(|_| bad())?;
                if !(0.0..=100.0).contains(&pct) {
                    return Err(ReadError::parse(
                        path,
                        format!("{k}={v} is not a percentage"),
                    ));
                }
                let slot = match k {
                    "avg10" => &mut a10,
                    "avg60" => &mut a60,
                    _ => &mut a300,
                };
                *slot = Some(pct / 100.0);
            }
            "total" => total = Some(v.parse::<u64>().map_err(|_| bad())?),
            _ => {}
        }
    }
    match (a10, a60, a300, total) {
        (Some(avg10), Some(avg60), Some(avg300), Some(us)) => Ok(PsiLine {
            avg10,
            avg60,
            avg300,
            total_seconds: us as f64 / 1e6,
        }),
        _ => Err(ReadError::parse(
            path,
            "a pressure line lacks avg10, avg60, avg300 or total",
        )),
    }
}

impl Pressure {
    /// Its series: `memwatch_pressure_{waiting,stalled}_{seconds_total,ratio}` by resource.
    pub fn series(&self, w: &mut Writer) {
        let p = self;
        let lines = |full: bool| {
            RESOURCES.iter().filter_map(move |r| {
                let psi = p.get(r)?;
                let line = if full { psi.full? } else { psi.some };
                Some((*r, line))
            })
        };
        let mut f = w.counter(
            "memwatch_pressure_waiting_seconds_total",
            "Time at least one task was stalled on the resource (PSI some total).",
        );
        for (r, l) in lines(false) {
            f.add(&[("resource", r)], l.total_seconds);
        }
        drop(f);
        let mut f = w.counter(
            "memwatch_pressure_stalled_seconds_total",
            "Time all non-idle tasks were stalled on the resource at once (PSI full total).",
        );
        for (r, l) in lines(true) {
            f.add(&[("resource", r)], l.total_seconds);
        }
        drop(f);
        let mut f = w.gauge(
            "memwatch_pressure_waiting_ratio",
            "Share of time at least one task was stalled, averaged over the window (PSI some avgN).",
        );
        for (r, l) in lines(false) {
            f.add(&[("resource", r), ("window", "10s")], l.avg10)
                .add(&[("resource", r), ("window", "60s")], l.avg60)
                .add(&[("resource", r), ("window", "300s")], l.avg300);
        }
        drop(f);
        let mut f = w.gauge(
            "memwatch_pressure_stalled_ratio",
            "Share of time all non-idle tasks were stalled, averaged over the window (PSI full avgN).",
        );
        for (r, l) in lines(true) {
            f.add(&[("resource", r), ("window", "10s")], l.avg10)
                .add(&[("resource", r), ("window", "60s")], l.avg60)
                .add(&[("resource", r), ("window", "300s")], l.avg300);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(t: &str) -> Result<Psi, ReadError> {
        parse(Path::new("memory"), t)
    }

    #[test]
    fn parses_some_and_full() {
        let psi = p("some avg10=1.50 avg60=0.25 avg300=0.00 total=2500000\n\
                     full avg10=0.50 avg60=0.00 avg300=0.00 total=1000000\n")
        .unwrap();
        assert_eq!(psi.some.avg10, 0.015);
        assert_eq!(psi.some.total_seconds, 2.5);
        assert_eq!(psi.full.unwrap().total_seconds, 1.0);
        assert!(
            p("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
                .unwrap()
                .full
                .is_none()
        );
    }

    #[test]
    fn hostile_lines_are_errors() {
        for t in [
            "",
            "some",
            "some avg10=",
            "some avg10=1 avg60=1 avg300=1",
            "some avg10=NaN avg60=1 avg300=1 total=1",
            "some avg10=101 avg60=1 avg300=1 total=1",
            "some avg10=1 avg60=1 avg300=1 total=-1",
            "full avg10=1 avg60=1 avg300=1 total=1",
            "some avg10=1 avg60=1 avg300=1 total=99999999999999999999999",
        ] {
            assert!(p(t).is_err(), "{t:?}");
        }
    }
}
