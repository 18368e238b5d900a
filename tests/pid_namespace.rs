//! A job in a container knows itself by its container's pid, not the host's. The Python client, in a
//! pid namespace of its own (`unshare --pid --fork --mount-proc`, the namespace docker and podman
//! give a container), attaches itself over the control socket: the daemon attaches the process the
//! socket names (SO_PEERCRED, translated by the kernel into the daemon's namespace), and refuses a
//! client whose own pid does not agree with it. Before, the client's pid was taken as the host's:
//! the wrong process, or pid 1 refused.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use common::{Daemon, Opts};

/// The client's script: attaches itself, prints what it sent and what came back, then sends an
/// attach of itself that names a pid it does not have, and waits for a line on stdin.
const SCRIPT: &str = r#"
import json, os, socket, sys
import memwatch
c = memwatch.Client(name="boxed", socket_path=sys.argv[1])
ok = c.attach()
print(json.dumps({"ok": ok, "pid": os.getpid()}), flush=True)
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
    s.connect(sys.argv[1])
    lie = {"cmd": "attach", "self": True, "pid": os.getpid() + 1000, "name": "liar"}
    s.sendall(json.dumps(lie).encode() + b"\n")
    print(s.makefile().readline().strip(), flush=True)
sys.stdin.readline()
"#;

#[test]
fn a_client_in_its_own_pid_namespace_attaches_itself_by_the_sockets_pid() {
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        ..Opts::default()
    });
    let dir = common::tempdir();
    let script = dir.path().join("client.py");
    std::fs::write(&script, SCRIPT).unwrap();
    // sh is the namespace's pid 1 and python its child (sh does not exec the last command when
    // another follows), as in a container whose entrypoint is a shell.
    let mut child = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "sh", "-c"])
        .arg(r#"python3 "$0" "$1"; exit $?"#)
        .arg(&script)
        .arg(&d.socket)
        .env("PYTHONPATH", common::repo().join("python/src"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run unshare (util-linux)");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let said: serde_json::Value = serde_json::from_str(&line)
        .unwrap_or_else(|e| panic!("the client said {line:?} ({e}); log:\n{}", d.log_text()));
    assert_eq!(said["ok"], true, "the client could not attach: {said}");
    let inner = said["pid"].as_u64().unwrap();
    assert!(inner < 10, "the client's pid is its namespace's: {said}");
    let job = d
        .jobs()
        .into_iter()
        .find(|j| j["name"] == "boxed")
        .expect("the job is attached");
    let host = job["pid"].as_u64().unwrap();
    assert_ne!(host, inner, "{job}");
    let status = std::fs::read_to_string(format!("/proc/{host}/status")).unwrap();
    let nspid: Vec<u64> = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .expect("NSpid")
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();
    assert_eq!(
        nspid,
        [host, inner],
        "the daemon attached the client itself, by the host's pid"
    );
    let cmdline = std::fs::read_to_string(format!("/proc/{host}/cmdline")).unwrap();
    assert!(cmdline.contains("client.py"), "{cmdline:?}");
    line.clear();
    out.read_line(&mut line).unwrap();
    let refused: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(refused["ok"], false, "{refused}");
    let error = refused["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(&format!("says it is pid {}", inner + 1000))
            && error.contains(&format!(
                "peer is pid {host} here and pid {inner} in its own"
            )),
        "{error}"
    );
    assert!(!d.jobs().iter().any(|j| j["name"] == "liar"));
    child.stdin.take().unwrap().write_all(b"\n").unwrap();
    assert!(child.wait().unwrap().success());
}
