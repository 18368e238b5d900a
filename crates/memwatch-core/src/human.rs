//! Numbers for people: sizes the way `free -h` writes them, durations in the units people use. The
//! engine's messages and the commands' output share them (`memwatch::human` adds colour).

/// Bytes the way procps `free -h` writes them: 1024-based; a unit's value with one decimal when that
/// fits in three characters ("1.5Gi", "9.9Gi"), else its whole part, truncated ("23Gi" for 23.96
/// GiB, as free says); values of 1000 or more move up a unit ("1.0Gi" for 1000 MiB).
pub fn bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes < 1000 {
        return format!("{bytes}B");
    }
    let mut v = bytes as f64;
    for unit in UNITS {
        v /= 1024.0;
        let one = format!("{v:.1}");
        if one.len() <= 3 {
            return format!("{one}{unit}");
        }
        let whole = v.trunc();
        if whole < 1000.0 {
            return format!("{whole:.0}{unit}");
        }
    }
    format!("{v:.0}Ei")
}

/// A duration in the units people use: "45 s", "2 min 3 s", "1 h 4 min", "3 d 2 h".
pub fn duration(seconds: f64) -> String {
    if !seconds.is_finite() || seconds < 0.0 {
        return "-".into();
    }
    let s = seconds.round() as u64;
    match s {
        0..=59 if seconds < 10.0 => format!("{seconds:.1} s"),
        0..=59 => format!("{s} s"),
        60..=3599 => pair(s / 60, "min", s % 60, "s"),
        3600..=86_399 => pair(s / 3600, "h", s % 3600 / 60, "min"),
        _ => pair(s / 86_400, "d", s % 86_400 / 3600, "h"),
    }
}

fn pair(a: u64, ua: &str, b: u64, ub: &str) -> String {
    if b == 0 {
        format!("{a} {ua}")
    } else {
        format!("{a} {ua} {b} {ub}")
    }
}
