//! /proc/vmstat: swap traffic, OOM kills and major faults (cumulative counters).

use std::path::Path;

use crate::expo::Writer;
use serde::{Deserialize, Serialize};

use super::error::{ReadError, parse_u64};

/// Cumulative counters from /proc/vmstat. Swap traffic is in pages; `oom_kill` needs Linux 4.13.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmStat {
    /// Pages swapped in since boot.
    pub pswpin: u64,
    /// Pages swapped out since boot.
    pub pswpout: u64,
    /// Major page faults since boot.
    pub pgmajfault: u64,
    /// OOM kills since boot (Linux 4.13+).
    pub oom_kill: Option<u64>,
}

/// Parses /proc/vmstat text (`path` names it in errors).
pub fn parse(path: &Path, text: &str) -> Result<VmStat, ReadError> {
    let mut v = VmStat::default();
    let mut seen = 0;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(' ') else {
            continue;
        };
        let slot = match key {
            "pswpin" => &mut v.pswpin,
            "pswpout" => &mut v.pswpout,
            "pgmajfault" => &mut v.pgmajfault,
            "oom_kill" => {
                v.oom_kill = Some(parse_u64(path, key, value)?);
                continue;
            }
            _ => continue,
        };
        *slot = parse_u64(path, key, value)?;
        seen += 1;
    }
    if seen < 3 {
        return Err(ReadError::parse(
            path,
            "pswpin, pswpout or pgmajfault missing",
        ));
    }
    Ok(v)
}

impl VmStat {
    /// Its series: `memwatch_memory_swapped_{in,out}_bytes_total`, `memwatch_memory_major_faults_total`,
    /// `memwatch_oom_kills_total`; pages counted in bytes of `page_size_bytes`.
    pub fn series(&self, page_size_bytes: u64, w: &mut Writer) {
        let page = page_size_bytes as f64;
        w.counter(
            "memwatch_memory_swapped_in_bytes_total",
            "Bytes read in from swap (pswpin).",
        )
        .add(&[], self.pswpin as f64 * page);
        w.counter(
            "memwatch_memory_swapped_out_bytes_total",
            "Bytes written out to swap (pswpout).",
        )
        .add(&[], self.pswpout as f64 * page);
        w.counter(
            "memwatch_memory_major_faults_total",
            "Page faults that needed I/O (pgmajfault).",
        )
        .add(&[], self.pgmajfault as f64);
        w.counter(
            "memwatch_oom_kills_total",
            "Processes killed by the kernel's OOM killer (oom_kill).",
        )
        .opt(&[], self.oom_kill.map(|n| n as f64));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let p = |t: &str| parse(Path::new("vmstat"), t);
        let v = p("nr_free_pages 5\npswpin 10\npswpout 20\npgmajfault 3\noom_kill 1\n").unwrap();
        assert_eq!(
            (v.pswpin, v.pswpout, v.pgmajfault, v.oom_kill),
            (10, 20, 3, Some(1))
        );
        assert_eq!(
            p("pswpin 1\npswpout 2\npgmajfault 3\n").unwrap().oom_kill,
            None
        );
        for bad in [
            "",
            "pswpin x\npswpout 2\npgmajfault 3\n",
            "pswpin 1\n",
            "pswpin 99999999999999999999999\n",
        ] {
            assert!(p(bad).is_err(), "{bad:?}");
        }
    }
}
