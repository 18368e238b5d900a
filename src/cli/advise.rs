//! `memwatch advise`: the advice, most severe first, each with its evidence, change and saving.

use std::fmt::Write as _;

use crate::advice::{Advice, Severity};

pub fn render(items: &[Advice]) -> String {
    if items.is_empty() {
        return "nothing to advise: memory, swap, GPUs and temperatures look fine\n".into();
    }
    let mut o = String::new();
    for a in items {
        let sev = match a.severity {
            Severity::Critical => "CRITICAL",
            Severity::Warn => "WARN",
            Severity::Info => "INFO",
        };
        let _ = writeln!(o, "[{sev}] {}  ({})", a.title, a.id);
        for e in &a.evidence {
            let _ = writeln!(o, "    · {e}");
        }
        let _ = writeln!(o, "    change: {}", a.change);
        if let Some(s) = &a.saving {
            let _ = writeln!(o, "    saves:  {s}");
        }
        o.push('\n');
    }
    o
}
