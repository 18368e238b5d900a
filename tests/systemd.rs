//! The systemd unit: it verifies, its exposure stays low, and the daemon speaks the notify protocol
//! (READY, WATCHDOG pings, STOPPING) that Type=notify and WatchdogSec rely on, and stops the pings
//! while its sampler hangs.

mod common;

use std::os::unix::net::UnixDatagram;
use std::process::Command;
use std::time::Duration;

use common::{Daemon, Opts};

fn unit_for_this_build(dir: &std::path::Path) -> std::path::PathBuf {
    let text = std::fs::read_to_string(common::repo().join("systemd/memwatch.service")).unwrap();
    let unit = dir.join("memwatch.service");
    std::fs::write(
        &unit,
        text.replace("/usr/local/bin/memwatch", common::bin().to_str().unwrap()),
    )
    .unwrap();
    unit
}

#[test]
fn the_unit_verifies_and_is_hardened() {
    let dir = tempfile::tempdir().unwrap();
    let unit = unit_for_this_build(dir.path());
    let out = Command::new("systemd-analyze")
        .arg("verify")
        // Documentation=man:memwatch(1) is installed with the package or install.sh, not here.
        .arg("--man=no")
        .arg(&unit)
        .output()
        .expect("systemd-analyze (Debian package systemd; ./scripts/test.sh installs it)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && !text.contains("memwatch.service"),
        "{text}"
    );
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=true"])
        .arg(&unit)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let level: f64 = text
        .lines()
        .find_map(|l| l.split("memwatch.service: ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in:\n{text}"));
    eprintln!("systemd-analyze security: exposure {level}");
    assert!(level <= 4.0, "exposure {level}:\n{text}");
    let unit_text = std::fs::read_to_string(&unit).unwrap();
    for want in [
        "Type=notify",
        "Restart=always",
        "OOMScoreAdjust=-900",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "CapabilityBoundingSet=CAP_KILL",
        "SystemCallFilter=@system-service @swap",
    ] {
        assert!(unit_text.contains(want), "{want}");
    }
}

/// The opt-in drop-in that lets the way out make emergency swap verifies with the unit, and systemd
/// reads it: the exposure it reports rises (administrator capability, writable kernel tunables).
#[test]
fn the_emergency_swap_drop_in_verifies() {
    let exposure = |unit: &std::path::Path| -> f64 {
        let out = Command::new("systemd-analyze")
            .args(["security", "--offline=true"])
            .arg(unit)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .find_map(|l| l.split("memwatch.service: ").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no exposure level in:\n{text}"))
    };
    let dir = tempfile::tempdir().unwrap();
    let unit = unit_for_this_build(dir.path());
    let base = exposure(&unit);
    let drop_ins = dir.path().join("memwatch.service.d");
    std::fs::create_dir(&drop_ins).unwrap();
    std::fs::copy(
        common::repo().join("systemd/emergency-swap.conf"),
        drop_ins.join("emergency-swap.conf"),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        // Documentation=man:memwatch(1) is installed with the package or install.sh, not here.
        .arg("--man=no")
        .arg(&unit)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && !text.contains("emergency-swap"),
        "{text}"
    );
    let with = exposure(&unit);
    assert!(with > base, "the drop-in was not read: {base} → {with}");
}

#[test]
fn the_daemon_speaks_the_notify_protocol() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify");
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // What systemd would set, in the daemon's environment only.
    let socket = path.to_str().unwrap();
    let mut d = Daemon::start(Opts {
        gpu_state: None,
        env: &[("NOTIFY_SOCKET", socket), ("WATCHDOG_USEC", "200000")],
        ..Opts::default()
    });
    let mut buf = [0u8; 128];
    let mut got = Vec::new();
    while got
        .iter()
        .filter(|m: &&String| m.as_str() == "WATCHDOG=1")
        .count()
        < 3
    {
        let n = sock.recv(&mut buf).expect("a notification");
        got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    assert_eq!(got[0], "READY=1", "{got:?}");
    // A healthy start feeds the watchdog from its first sample and never calls its samples stale.
    let log = d.log_text();
    assert!(
        !log.contains("samples are stale"),
        "a healthy start said its samples were stale:\n{log}"
    );
    assert_eq!(d.terminate(), Some(0));
    let mut rest = Vec::new();
    while let Ok(n) = sock.recv(&mut buf) {
        rest.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        if rest.last().is_some_and(|m| m == "STOPPING=1") {
            break;
        }
    }
    assert_eq!(
        rest.last().map(String::as_str),
        Some("STOPPING=1"),
        "{rest:?}"
    );
}

/// A sampler that hangs (its /proc/vmstat, which only the full sample reads, a FIFO nobody writes, so
/// the read blocks) starves the watchdog: once the last sample is older than the staleness bound, the pings stop and the daemon
/// says why, so systemd restarts it; when the read comes back, the pings do too.
#[test]
fn a_hung_sampler_stops_the_watchdog_pings_and_they_come_back_with_it() {
    use std::io::Write as _;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    common::copy_tree(&common::fixture_root(), &root);
    let path = dir.path().join("notify");
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let socket = path.to_str().unwrap();
    let mut d = Daemon::start(Opts {
        root: root.clone(),
        gpu_state: None,
        env: &[("NOTIFY_SOCKET", socket), ("WATCHDOG_USEC", "200000")],
        ..Opts::default()
    });
    let recv = |sock: &UnixDatagram| {
        let mut buf = [0u8; 128];
        let n = sock.recv(&mut buf).expect("a notification");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let mut pings = 0;
    while pings < 3 {
        pings += usize::from(recv(&sock) == "WATCHDOG=1");
    }

    // From now on every read of vmstat blocks.
    let vmstat = root.join("proc/vmstat");
    let real = std::fs::read(&vmstat).unwrap();
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    std::fs::rename(&fifo, &vmstat).unwrap();
    d.wait_log("the stale-sample warning", |l| {
        l.contains("samples are stale; not feeding the watchdog")
    });
    // Pings sent before the warning may still be queued; after it, none comes while the read hangs.
    while sock.set_nonblocking(true).is_ok() && sock.recv(&mut [0u8; 128]).is_ok() {}
    sock.set_nonblocking(false).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(600)))
        .unwrap();
    let mut buf = [0u8; 128];
    match sock.recv(&mut buf) {
        Ok(n) => panic!(
            "the daemon sent {:?} while its sampler hung",
            String::from_utf8_lossy(&buf[..n])
        ),
        Err(e) => assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "{e}"
        ),
    }

    // The hung read returns (the writer comes), and the real file is back for the next ones.
    let mut writer = std::fs::OpenOptions::new()
        .write(true)
        .open(&vmstat)
        .unwrap();
    let back = dir.path().join("vmstat");
    std::fs::write(&back, &real).unwrap();
    std::fs::rename(&back, &vmstat).unwrap();
    writer.write_all(&real).unwrap();
    drop(writer);
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    while recv(&sock) != "WATCHDOG=1" {}
    assert_eq!(d.terminate(), Some(0));
}
