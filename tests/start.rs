//! Why the real binary does not start, said once and clearly: a port in use, a state directory a
//! live daemon holds (`daemon::DaemonError`).

mod common;

use common::{Daemon, Opts, memwatch};

#[test]
fn port_in_use_is_a_clear_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (code, _, err) = memwatch(&["--config", "/dev/null", "run", "--listen", &addr]);
    assert_eq!(code, 1);
    assert!(err.contains(&format!("cannot listen on {addr}")), "{err}");
}

/// A second daemon on a live daemon's state directory, or on its runtime directory, waits for the
/// lock (5 s), then exits 1 naming the directory, and the first serves on.
#[test]
fn a_second_daemon_on_the_same_state_or_runtime_directory_is_refused() {
    let d = Daemon::start(Opts::default());
    let other = tempfile::tempdir().unwrap();
    let socket = other.path().join("control.sock");
    for (shared, control) in [
        (
            &d.state,
            format!("socket = {socket:?}\nstate_dir = {:?}", d.state),
        ),
        (
            &d.runtime,
            format!(
                "socket = {socket:?}\nstate_dir = {:?}\nruntime_dir = {:?}",
                other.path().join("state"),
                d.runtime
            ),
        ),
    ] {
        let config = other.path().join("memwatch.toml");
        std::fs::write(
            &config,
            format!("listen = \"127.0.0.1:0\"\n[gpu]\nenabled = false\n[control]\n{control}\n"),
        )
        .unwrap();
        let (code, _, err) = memwatch(&["--config", config.to_str().unwrap(), "run"]);
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains(&format!(
                "another memwatch daemon is running with directory {}",
                shared.display()
            )),
            "{err}"
        );
        assert!(!socket.exists(), "{err}");
        assert_eq!(d.get("/-/healthy").0, 200);
    }
    // The live daemon's state file is its own still.
    assert!(d.runtime.join("state.json").is_file());
}
