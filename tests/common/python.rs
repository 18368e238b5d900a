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
/// cache is not charged to one); `None` (the test is skipped, and says so) where there is none.
pub fn ready_python() -> Option<PathBuf> {
    let Some(python) = torch_python() else {
        eprintln!("skipped: no python3 with torch (MEMWATCH_SKIP_TRAINER)");
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
