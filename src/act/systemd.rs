//! A systemd unit's limits, changed through its manager: `SetUnitProperties` with `runtime` true (for
//! this boot; systemd keeps it in a drop-in under `/run/systemd/system.control/`), made over D-Bus with
//! `busctl`, systemd's own client, bounded by a timeout. systemd rewrites a unit's `memory.max` from
//! its `MemoryMax` whenever it reloads, so a limit written to the cgroup's file behind its back can
//! vanish; a property set through the manager is the unit's, and stays.
//!
//! The system manager is asked on the system bus; a user's manager on that user's bus, which busctl
//! reaches as root by running as the user (`--user --machine=UID@.host`).

use std::time::Duration;

use crate::command::RunError;
use crate::job::held::Bus;

/// How long the manager may take to answer.
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// The arguments of the `busctl` call that sets `unit`'s `MemoryMax` to `bytes` for this boot.
pub fn set_memory_max_args(bus: Bus, unit: &str, bytes: u64) -> Vec<String> {
    let mut args: Vec<String> = match bus {
        Bus::System => vec!["--system".into()],
        Bus::User(uid) => vec!["--user".into(), format!("--machine={uid}@.host")],
    };
    args.push(format!("--timeout={}", TIMEOUT.as_secs()));
    args.extend(
        [
            "call",
            "org.freedesktop.systemd1",
            "/org/freedesktop/systemd1",
            "org.freedesktop.systemd1.Manager",
            "SetUnitProperties",
            "sba(sv)",
            unit,
            "true",
            "1",
            "MemoryMax",
            "t",
        ]
        .map(String::from),
    );
    args.push(bytes.to_string());
    args
}

pub use memwatch_core::seam::CallError;

/// After a call to a unit's manager failed, the next call for that unit waits this long. The caller
/// is the owner task, which must not wait on a bus that does not answer every turn (a loan whose
/// restore keeps failing is retried each sample).
pub const BACKOFF: Duration = Duration::from_secs(30);

/// When a call for each unit last failed, for [`BACKOFF`].
static FAILED: std::sync::Mutex<Vec<(Bus, String, std::time::Instant)>> =
    std::sync::Mutex::new(Vec::new());

/// Sets `unit`'s `MemoryMax` to `bytes` through its manager, for this boot. Within [`BACKOFF`] of
/// a failed call for the same unit, fails at once without asking.
pub fn set_memory_max(bus: Bus, unit: &str, bytes: u64) -> Result<(), CallError> {
    let mut failed = FAILED.lock().unwrap_or_else(|p| p.into_inner());
    failed.retain(|(_, _, at)| at.elapsed() < BACKOFF);
    if let Some((_, _, at)) = failed.iter().find(|(b, u, _)| *b == bus && u == unit) {
        return Err(CallError::Failed(format!(
            "not asked: the last call for {unit} failed {} s ago (retried after {} s)",
            at.elapsed().as_secs(),
            BACKOFF.as_secs()
        )));
    }
    drop(failed);
    let args = set_memory_max_args(bus, unit, bytes);
    let shown = format!("busctl {}", args.join(" "));
    let started = std::time::Instant::now();
    let result = call(&args, &shown, unit, bytes);
    if matches!(result, Err(CallError::Failed(_))) {
        FAILED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((bus, unit.to_owned(), started));
    }
    tracing::info!(
        unit,
        memory_max = bytes,
        ms = started.elapsed().as_millis() as u64,
        ok = result.is_ok(),
        "MemoryMax set through systemd"
    );
    result
}

fn call(args: &[String], shown: &str, unit: &str, bytes: u64) -> Result<(), CallError> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // busctl's own timeout bounds the call; this bounds busctl (a stuck bus connection).
    match crate::command::run("busctl", &args, TIMEOUT + Duration::from_secs(1)) {
        Ok(_) => Ok(()),
        Err(RunError::Failed { status, stderr, .. }) => {
            let what = format!(
                "systemd refused MemoryMax={bytes} for {unit} ({status}): {stderr} [{shown}]"
            );
            // busctl prints the D-Bus error's message, not its name: "Unit X not loaded." is
            // org.freedesktop.systemd1.NoSuchUnit's.
            if stderr.contains("not loaded") || stderr.contains("NoSuchUnit") {
                Err(CallError::NoUnit(what))
            } else {
                Err(CallError::Failed(what))
            }
        }
        Err(RunError::Late { .. }) => Err(CallError::Failed(format!(
            "systemd did not answer within {TIMEOUT:?} [{shown}]"
        ))),
        Err(e @ RunError::Spawn { .. }) => Err(CallError::Failed(format!("{e} [{shown}]"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SetUnitProperties, runtime, one typed property; the user's manager through their own bus.
    #[test]
    fn the_call_sets_memory_max_for_this_boot() {
        let a = set_memory_max_args(Bus::System, "train\\x2d1.service", 1 << 30);
        assert_eq!(
            a.join(" "),
            "--system --timeout=2 call org.freedesktop.systemd1 /org/freedesktop/systemd1 \
             org.freedesktop.systemd1.Manager SetUnitProperties sba(sv) train\\x2d1.service true 1 \
             MemoryMax t 1073741824"
        );
        let u = set_memory_max_args(Bus::User(1000), "t.service", 5);
        assert_eq!(&u[..3], ["--user", "--machine=1000@.host", "--timeout=2"]);
    }

    /// A manager that failed is not asked again for that unit within the back-off, so a loan whose
    /// restore keeps failing costs the owner task one call per back-off, not one per turn.
    #[test]
    fn a_failed_unit_is_not_asked_again_within_the_backoff() {
        // No user manager answers for this uid here, or busctl is missing: either way it fails.
        let first = set_memory_max(Bus::User(4_000_000), "backoff-test.service", 1 << 30);
        assert!(matches!(first, Err(CallError::Failed(_))), "{first:?}");
        let started = std::time::Instant::now();
        let second = set_memory_max(Bus::User(4_000_000), "backoff-test.service", 1 << 30);
        match second {
            Err(CallError::Failed(e)) => assert!(e.starts_with("not asked"), "{e}"),
            other => panic!("{other:?}"),
        }
        assert!(started.elapsed() < Duration::from_millis(100));
    }
}
