//! Effects: signals (and Slurm's, through scontrol), freezes, emergency swap, lent limits (through
//! systemd for a unit's cgroup, `systemd.rs`), the state file, the state lock, the audit log, and
//! recovery of a predecessor's pauses. The engine decides; this carries out.

pub mod as_owner;
pub mod audit;
pub mod cgroup_error;
pub mod driver;
pub mod freeze;
pub mod lend;
pub mod oomd;
pub mod pause;
pub mod persist;
pub mod pin;
pub mod reclaim;
pub mod recover;
pub mod signal;
pub mod slurm;
pub mod swap;
pub mod systemd;

pub use memwatch_core::slurm::holds as slurm_holds;
pub use signal::signal_by_name;

/// Writes an executable script for a test (a fake `scontrol`) without this process ever holding it
/// open for writing: a test on another thread that forks meanwhile carries every descriptor of this
/// process until its child's exec, and an exec of the script while any descriptor has it open for
/// writing fails with ETXTBSY ("text file busy"). The text is staged in a file beside it, and
/// `install` (a child of its own) writes the script.
#[cfg(test)]
pub(crate) fn test_script(path: &std::path::Path, text: &str) {
    let staged = path.with_file_name(format!(
        ".{}.staged",
        path.file_name().unwrap_or_default().to_string_lossy()
    ));
    std::fs::write(&staged, text).unwrap();
    let installed = std::process::Command::new("install")
        .args(["-m", "755"])
        .arg(&staged)
        .arg(path)
        .status()
        .unwrap();
    assert!(
        installed.success(),
        "install {}: {installed}",
        path.display()
    );
    std::fs::remove_file(&staged).unwrap();
}
