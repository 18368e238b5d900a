//! Signals as the configuration names them ("SIGUSR1", "usr1", "10"), without a system crate: a table
//! of Linux's standard signals and their numbers. The `memwatch` crate turns a [`SignalName`] into
//! nix's `Signal` where it sends one (`memwatch::act::signal_by_name`), and its tests check this table against
//! nix's, name by name and number by number, on the architecture they run on.

use std::fmt;

// The numbers below are Linux's generic ones (x86, Arm, RISC-V, PowerPC, s390, LoongArch). MIPS and
// SPARC number several signals differently.
#[cfg(any(
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc",
    target_arch = "sparc64"
))]
compile_error!(
    "memwatch-core's signal table holds Linux's generic numbers, not this architecture's"
);

/// Linux's standard signals, in number order (the real-time ones are not names a user configures).
const SIGNALS: [(&str, i32); 31] = [
    ("SIGHUP", 1),
    ("SIGINT", 2),
    ("SIGQUIT", 3),
    ("SIGILL", 4),
    ("SIGTRAP", 5),
    ("SIGABRT", 6),
    ("SIGBUS", 7),
    ("SIGFPE", 8),
    ("SIGKILL", 9),
    ("SIGUSR1", 10),
    ("SIGSEGV", 11),
    ("SIGUSR2", 12),
    ("SIGPIPE", 13),
    ("SIGALRM", 14),
    ("SIGTERM", 15),
    ("SIGSTKFLT", 16),
    ("SIGCHLD", 17),
    ("SIGCONT", 18),
    ("SIGSTOP", 19),
    ("SIGTSTP", 20),
    ("SIGTTIN", 21),
    ("SIGTTOU", 22),
    ("SIGURG", 23),
    ("SIGXCPU", 24),
    ("SIGXFSZ", 25),
    ("SIGVTALRM", 26),
    ("SIGPROF", 27),
    ("SIGWINCH", 28),
    ("SIGIO", 29),
    ("SIGPWR", 30),
    ("SIGSYS", 31),
];

/// One of Linux's standard signals: its name ("SIGUSR1") and its number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignalName {
    name: &'static str,
    number: i32,
}

impl SignalName {
    /// SIGSTOP: stops a process (it cannot be caught).
    pub const STOP: SignalName = SignalName {
        name: "SIGSTOP",
        number: 19,
    };
    /// SIGCONT: continues a stopped process.
    pub const CONT: SignalName = SignalName {
        name: "SIGCONT",
        number: 18,
    };
    /// SIGTERM: asks a process to end.
    pub const TERM: SignalName = SignalName {
        name: "SIGTERM",
        number: 15,
    };
    /// SIGKILL: ends a process (it cannot be caught).
    pub const KILL: SignalName = SignalName {
        name: "SIGKILL",
        number: 9,
    };

    /// Parses "SIGUSR1", "usr1" (any case, spaces around ignored) or a number ("10").
    pub fn parse(text: &str) -> Option<SignalName> {
        let text = text.trim();
        if let Ok(n) = text.parse::<i32>() {
            return Self::all().find(|s| s.number == n);
        }
        let upper = text.to_ascii_uppercase();
        let full = upper.strip_prefix("SIG").unwrap_or(&upper);
        Self::all().find(|s| &s.name[3..] == full)
    }

    /// Every standard signal, in number order.
    pub fn all() -> impl Iterator<Item = SignalName> {
        SIGNALS
            .iter()
            .map(|&(name, number)| SignalName { name, number })
    }

    /// "SIGUSR1".
    pub fn name(self) -> &'static str {
        self.name
    }

    /// Linux's number for it.
    pub fn number(self) -> i32 {
        self.number
    }

    /// Whether it stops, continues or kills a process, so that it cannot stand for "save a checkpoint".
    pub fn stops_continues_or_kills(self) -> bool {
        matches!(
            self.name,
            "SIGSTOP" | "SIGTSTP" | "SIGTTIN" | "SIGTTOU" | "SIGCONT" | "SIGKILL"
        )
    }
}

impl fmt::Display for SignalName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::SignalName;

    #[test]
    fn the_named_constants_are_those_of_the_table() {
        for (c, name) in [
            (SignalName::STOP, "SIGSTOP"),
            (SignalName::CONT, "SIGCONT"),
            (SignalName::TERM, "SIGTERM"),
            (SignalName::KILL, "SIGKILL"),
        ] {
            assert_eq!(SignalName::parse(name), Some(c));
        }
    }

    #[test]
    fn names_numbers_and_case() {
        let usr1 = SignalName::parse("SIGUSR1").unwrap();
        assert_eq!((usr1.name(), usr1.number()), ("SIGUSR1", 10));
        assert_eq!(SignalName::parse(" usr1 "), Some(usr1));
        assert_eq!(SignalName::parse("10"), Some(usr1));
        assert_eq!(SignalName::parse("sigterm").map(|s| s.number()), Some(15));
        for bad in ["SIGNOPE", "", "SIG", "0", "32", "-9", "SIGSIGUSR1"] {
            assert_eq!(SignalName::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_table_is_in_number_order_without_gaps() {
        let numbers: Vec<i32> = SignalName::all().map(|s| s.number()).collect();
        assert_eq!(numbers, (1..=31).collect::<Vec<_>>());
        assert!(SignalName::all().all(|s| s.name().starts_with("SIG")));
    }

    #[test]
    fn what_cannot_ask_for_a_checkpoint() {
        let refused: Vec<&str> = SignalName::all()
            .filter(|s| s.stops_continues_or_kills())
            .map(SignalName::name)
            .collect();
        assert_eq!(
            refused,
            [
                "SIGKILL", "SIGCONT", "SIGSTOP", "SIGTSTP", "SIGTTIN", "SIGTTOU"
            ]
        );
    }
}
