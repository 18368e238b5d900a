//! The parts of a process's /proc files memwatch uses (stat, status, smaps_rollup), and their
//! parsers. Parsers are total: hostile text (a process name such as `foo) Z 1`, truncation, overflow)
//! gives an error value, never a panic.

use std::path::Path;

use serde::{Deserialize, Serialize};

pub use crate::host::ProcRef;
use crate::sample::error::{ReadError, parse_u64};

/// The parts of /proc/PID/stat memwatch uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// The process id.
    pub pid: u32,
    /// Its command name (field 2, without the parentheses).
    pub comm: String,
    /// R, S, D, T (stopped), t (traced), Z, X, I …
    pub state: char,
    /// Its parent's pid.
    pub ppid: u32,
    /// Flags; `PF_KTHREAD` (0x200000) marks kernel threads.
    pub flags: u64,
    /// Its start time, clock ticks after boot.
    pub start_time: u64,
    /// Resident pages.
    pub rss_pages: u64,
    /// CPU time used, user plus system, in clock ticks (`utime` + `stime`).
    pub cpu_ticks: u64,
    /// Its threads (`num_threads`): with one, its children are its main thread's.
    pub threads: u32,
}

const PF_KTHREAD: u64 = 0x0020_0000;

impl Stat {
    /// A kernel thread (never part of a job memwatch acts on).
    pub fn is_kernel_thread(&self) -> bool {
        self.flags & PF_KTHREAD != 0 || self.pid == 2 || self.ppid == 2
    }
    /// The process as a pid-reuse-safe reference.
    pub fn proc_ref(&self) -> ProcRef {
        ProcRef {
            pid: self.pid,
            start_time: self.start_time,
        }
    }
    /// Stopped (T) or traced (t).
    pub fn is_stopped(&self) -> bool {
        matches!(self.state, 'T' | 't')
    }
}

/// Parses /proc/PID/stat. The name sits in parentheses and may itself hold `)`, spaces or digits, so the
/// fields are read after the *last* `)`.
pub fn parse_stat(path: &Path, text: &str) -> Result<Stat, ReadError> {
    let open = text
        .find('(')
        .ok_or_else(|| ReadError::parse(path, "no `(` before the name"))?;
    let close = text
        .rfind(')')
        .ok_or_else(|| ReadError::parse(path, "no `)` after the name"))?;
    if close < open {
        return Err(ReadError::parse(path, "`)` before `(`"));
    }
    let pid = parse_u64(path, "pid", &text[..open])?;
    let comm = text[open + 1..close].to_owned();
    // Fields after the name, numbered from 3 (state) as in proc(5).
    let rest: Vec<&str> = text[close + 1..].split_whitespace().collect();
    let field = |n: usize| {
        rest.get(n - 3)
            .copied()
            .ok_or_else(|| ReadError::parse(path, format!("truncated: no field {n}")))
    };
    let state = field(3)?.chars().next().unwrap_or('?');
    let num = |n: usize, name: &str| -> Result<u64, ReadError> { parse_u64(path, name, field(n)?) };
    let to_u32 = |v: u64, name: &str| {
        u32::try_from(v).map_err(|_| ReadError::parse(path, format!("{name} {v} out of range")))
    };
    Ok(Stat {
        pid: to_u32(pid, "pid")?,
        comm,
        state,
        ppid: to_u32(num(4, "ppid")?, "ppid")?,
        flags: num(9, "flags")?,
        start_time: num(22, "starttime")?,
        rss_pages: num(24, "rss")?,
        cpu_ticks: num(14, "utime")?.saturating_add(num(15, "stime")?),
        threads: to_u32(num(20, "num_threads")?, "num_threads")?,
    })
}

/// The parts of /proc/PID/status memwatch uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// Real, effective, saved and filesystem uids.
    pub uids: [u32; 4],
    /// The pid in each pid namespace, outermost first (Linux 4.1+); empty when absent.
    pub nspid: Vec<u32>,
}

/// Parses /proc/PID/status text (`path` names it in errors).
pub fn parse_status(path: &Path, text: &str) -> Result<Status, ReadError> {
    let mut uids = None;
    let mut nspid = Vec::new();
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("Uid:") {
            let nums: Result<Vec<u32>, _> = v.split_whitespace().map(str::parse::<u32>).collect();
            match nums.ok().filter(|n| n.len() == 4) {
                Some(n) => uids = Some([n[0], n[1], n[2], n[3]]),
                None => return Err(ReadError::parse(path, format!("bad Uid line {line:?}"))),
            }
        } else if let Some(v) = line.strip_prefix("NSpid:") {
            nspid = v
                .split_whitespace()
                .map(|p| {
                    parse_u64(path, "NSpid", p).and_then(|p| {
                        u32::try_from(p).map_err(|_| ReadError::parse(path, "NSpid out of range"))
                    })
                })
                .collect::<Result<_, _>>()?;
        }
    }
    Ok(Status {
        uids: uids.ok_or_else(|| ReadError::parse(path, "no Uid line"))?,
        nspid,
    })
}

/// A process's memory: resident, proportional (shared pages divided among their users) and swapped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Memory {
    /// Resident memory (Rss).
    pub rss_bytes: u64,
    /// Proportional set size (Pss).
    pub pss_bytes: u64,
    /// Swapped-out memory (Swap).
    pub swap_bytes: u64,
}

/// Parses /proc/PID/smaps_rollup text (`path` names it in errors).
pub fn parse_rollup(path: &Path, text: &str) -> Result<Memory, ReadError> {
    let (mut rss, mut pss, mut swap) = (None, None, None);
    for line in text.lines() {
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        let slot = match key {
            "Rss" => &mut rss,
            "Pss" => &mut pss,
            "Swap" => &mut swap,
            _ => continue,
        };
        let kib = parse_u64(path, key, rest.trim().trim_end_matches("kB"))?;
        *slot = Some(
            kib.checked_mul(1024)
                .ok_or_else(|| ReadError::parse(path, format!("{key} overflows")))?,
        );
    }
    match (rss, pss) {
        (Some(rss_bytes), Some(pss_bytes)) => Ok(Memory {
            rss_bytes,
            pss_bytes,
            swap_bytes: swap.unwrap_or(0),
        }),
        // A kernel thread or a zombie has an empty rollup.
        _ if text.trim().is_empty() => Ok(Memory::default()),
        _ => Err(ReadError::parse(path, "no Rss or Pss line")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(text: &str) -> Result<Stat, ReadError> {
        parse_stat(Path::new("stat"), text)
    }

    const TAIL: &str =
        "1 2 3 4 -1 4194560 100 0 0 0 5 6 0 0 20 0 3 0 98765 1000000 250 18446744073709551615";

    #[test]
    fn stat_with_hostile_names() {
        let s = stat(&format!("42 (foo) Z 1) S {TAIL}\n")).unwrap();
        assert_eq!(
            (s.pid, s.comm.as_str(), s.state, s.ppid),
            (42, "foo) Z 1", 'S', 1)
        );
        assert_eq!((s.start_time, s.rss_pages, s.threads), (98765, 250, 3));
        let s = stat(&format!("7 (a b (c)) T {TAIL}")).unwrap();
        assert_eq!((s.comm.as_str(), s.is_stopped()), ("a b (c)", true));
    }

    #[test]
    fn stat_garbage_is_an_error() {
        for t in [
            "",
            "42",
            "42 (x",
            "42 x) S 1",
            ")42 (x S 1",
            "42 (x) S 1 2 3",
            "x (y) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22",
            "99999999999 (y) S 1 2 3 4 -1 4194560 100 0 0 0 5 6 0 0 20 0 3 0 98765 1 250",
        ] {
            assert!(stat(t).is_err(), "{t:?}");
        }
    }

    #[test]
    fn status_and_rollup() {
        let p = Path::new("status");
        let s = parse_status(
            p,
            "Name:\tx\nUid:\t1000\t1000\t1000\t1000\nNSpid:\t812\t7\n",
        )
        .unwrap();
        assert_eq!((s.uids[0], s.nspid.clone()), (1000, vec![812, 7]));
        assert!(parse_status(p, "Name: x\n").is_err());
        assert!(parse_status(p, "Uid: 1 2\n").is_err());
        let m = parse_rollup(
            p,
            "00-ff ---p 0 0 [rollup]\nRss: 1604 kB\nPss: 540 kB\nSwap: 8 kB\n",
        )
        .unwrap();
        assert_eq!(
            (m.rss_bytes, m.pss_bytes, m.swap_bytes),
            (1604 * 1024, 540 * 1024, 8192)
        );
        assert!(parse_rollup(p, "Rss: lots kB\nPss: 1 kB").is_err());
        assert!(parse_rollup(p, "Rss: 99999999999999999999 kB\nPss: 1 kB").is_err());
        assert_eq!(parse_rollup(p, "").unwrap(), Memory::default());
    }
}
