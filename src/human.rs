//! Numbers and words for people: sizes the way `free -h` writes them, durations in the units people
//! use, resources in plain words, and levels in colour on a terminal (never when `NO_COLOR` is set or
//! the output is not a terminal). Used by the commands and by the messages memwatch sends.

use crate::policy::Level;

pub use memwatch_core::human::{bytes, duration};

/// Colours for a terminal, or none.
#[derive(Debug, Clone, Copy)]
pub struct Paint {
    /// Whether to colour.
    pub on: bool,
}

impl Paint {
    /// Colour when stdout is a terminal and `NO_COLOR` is unset or empty (no-color.org).
    pub fn for_stdout() -> Paint {
        use std::io::IsTerminal;
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Paint {
            on: std::io::stdout().is_terminal() && !no_color,
        }
    }

    /// `text` in the level's colour: red and bold for critical, yellow for warn, green for ok.
    pub fn level(self, level: Level, text: &str) -> String {
        if !self.on {
            return text.to_owned();
        }
        let code = match level {
            Level::Critical => "1;31",
            Level::Warn => "33",
            Level::Ok => "32",
        };
        format!("\x1b[{code}m{text}\x1b[0m")
    }

    /// `text` in bold, when colouring.
    pub fn bold(self, text: &str) -> String {
        if self.on {
            format!("\x1b[1m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_like_free() {
        const K: u64 = 1024;
        for (b, want) in [
            (0, "0B"),
            (999, "999B"),
            (1000, "1.0Ki"),
            (1536, "1.5Ki"),
            (603 * K * K, "603Mi"),
            (1000 * K * K, "1.0Gi"),
            (24 * K * K * K, "24Gi"),
            // 23960 MiB, as nvidia-smi showed it: free truncates to 23Gi.
            (23960 * K * K, "23Gi"),
            // 9.96 GiB: "10.0" is too long for one decimal, so the whole part, truncated.
            (9 * K * K * K + 983 * K * K, "9Gi"),
            (1434 * K * K, "1.4Gi"),
        ] {
            assert_eq!(bytes(b), want, "{b}");
        }
    }

    #[test]
    fn durations_in_human_units() {
        assert_eq!(duration(0.4), "0.4 s");
        assert_eq!(duration(45.0), "45 s");
        assert_eq!(duration(123.0), "2 min 3 s");
        assert_eq!(duration(9072.6), "2 h 31 min");
        assert_eq!(duration(7200.0), "2 h");
        assert_eq!(duration(3.0 * 86_400.0 + 7300.0), "3 d 2 h");
        assert_eq!(duration(f64::INFINITY), "-");
    }

    #[test]
    fn no_colour_when_off() {
        assert_eq!(Paint { on: false }.level(Level::Critical, "x"), "x");
        assert_eq!(
            Paint { on: true }.level(Level::Warn, "x"),
            "\x1b[33mx\x1b[0m"
        );
    }
}
