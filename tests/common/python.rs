//! The Python with torch that the test command set up (scripts/test.sh puts its venv first on
//! PATH; `MEMWATCH_SKIP_TRAINER` sets up none).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// `python3` on PATH if it imports torch.
pub fn torch_python() -> Option<PathBuf> {
    let out = Command::new("python3")
        .args(["-c", "import sys, torch; print(sys.executable)"])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// The Python with torch, its libraries loaded once outside any test cgroup (so that their page
/// cache is not charged to one). Where there is none, the test named `test` fails, unless the run
/// set none up on purpose (`MEMWATCH_SKIP_TRAINER`) or `MEMWATCH_ALLOW_SKIP` names it: `None`, said.
pub fn ready_python(test: &str) -> Option<PathBuf> {
    let Some(python) = torch_python() else {
        if std::env::var_os("MEMWATCH_SKIP_TRAINER").is_some() {
            eprintln!("skipped {test}: no python3 with torch, as MEMWATCH_SKIP_TRAINER asked");
        } else {
            super::skip::cannot_run(
                test,
                "no python3 with torch on PATH (scripts/test.sh sets one up)",
            );
        }
        return None;
    };
    warm(&python);
    Some(python)
}

/// Loads torch's libraries once, outside the test's cgroups.
fn warm(python: &Path) {
    let _ = Command::new(python)
        .args([
            "-c",
            "import torch.utils.data, torch.distributed, torch.nn.parallel",
        ])
        .stderr(Stdio::null())
        .status();
}
