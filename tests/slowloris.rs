//! A local user cannot take the HTTP server away from Prometheus: an unprivileged user holds 500
//! connections open, half idle, half sending their headers one byte at a time, and reopens each as soon
//! as the daemon closes it. `/metrics` still answers every probe at once, because a connection gets
//! `request_timeout_ms` to send its request and, with the table full, a new connection takes the place
//! of the one idle longest.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Daemon, Opts};

/// The attack, as the user runs it: keeps N connections open to ADDR for SECONDS, every odd one
/// dribbling a request head, and counts how often the daemon closed one.
const SLOWLORIS: &str = r#"
import resource, socket, sys, time
host, port, n, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 64), hard))
def open_one():
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect((host, port))
    except BlockingIOError:
        pass
    return s
conns = [open_one() for _ in range(n)]
opened, closed = n, 0
end = time.time() + seconds
step = 0
while time.time() < end:
    step += 1
    for i, s in enumerate(conns):
        dead = False
        try:
            if s.recv(4096) == b"":
                dead = True
        except BlockingIOError:
            pass
        except OSError:
            dead = True
        if not dead and i % 2 == 1:
            try:
                s.send(b"GET /metrics HTTP/1.1\r\n" if step == 1 else b"X")
            except BlockingIOError:
                pass
            except OSError:
                dead = True
        if dead:
            s.close()
            closed += 1
            conns[i] = open_one()
            opened += 1
    time.sleep(0.2)
print(f"opened {opened} closed {closed}", flush=True)
"#;

#[test]
fn slow_and_idle_connections_from_a_user_never_starve_metrics() {
    common::ensure_user("memwatch-slow");
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        interval_ms: 1000,
        extra_config: "[http]\nmax_connections = 256\nrequest_timeout_ms = 2000\n",
        ..Opts::default()
    });
    let daemon_pid = d.child.id();
    let fds_before = common::fds(daemon_pid);
    let seconds = 12.0;
    let mut attack = Command::new("runuser")
        .args([
            "-u",
            "memwatch-slow",
            "--",
            "/usr/bin/python3",
            "-c",
            SLOWLORIS,
        ])
        .arg(d.addr.ip().to_string())
        .arg(d.addr.port().to_string())
        .arg("500")
        .arg(seconds.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();

    // Probe as Prometheus would, every 300 ms while the attack runs.
    let start = Instant::now();
    let (mut probes, mut worst, mut most_fds) = (0, Duration::ZERO, 0);
    std::thread::sleep(Duration::from_millis(500));
    while start.elapsed() < Duration::from_secs_f64(seconds - 1.0) {
        let t = Instant::now();
        let (status, body) = d.get("/metrics");
        let took = t.elapsed();
        assert_eq!(
            status, 200,
            "probe {probes} failed after {took:?} during the attack"
        );
        assert!(body.contains("memwatch_up"), "probe {probes}: {body:.200}");
        worst = worst.max(took);
        probes += 1;
        most_fds = most_fds.max(common::fds(daemon_pid));
        std::thread::sleep(Duration::from_millis(300));
    }
    let mut report = String::new();
    BufReader::new(attack.stdout.take().unwrap())
        .read_line(&mut report)
        .unwrap();
    let _ = attack.wait();
    let closed: u64 = report
        .split_whitespace()
        .nth(3)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    eprintln!(
        "the attack: {}; {probes} probes all answered, the slowest in {worst:?}; the daemon held at most {most_fds} descriptors (before: {fds_before})",
        report.trim()
    );
    assert!(probes >= 20, "only {probes} probes ran");
    // Typically milliseconds; a probe whose SYN met a full accept backlog during the attack's churn is
    // retransmitted by the kernel after 1 s, which is allowed once.
    assert!(worst < Duration::from_secs(3), "a probe waited {worst:?}");
    // Every attacking connection was closed at least once by the request timeout or by eviction.
    assert!(
        closed >= 500,
        "the daemon closed only {closed} of the attack's connections"
    );
    assert!(
        most_fds <= fds_before + 256 + 32,
        "{most_fds} descriptors: the connection table is not bounded"
    );
}
