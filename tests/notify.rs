//! Notifications against real local receivers: an HTTP server speaking as a generic webhook, a
//! Slack/Mattermost incoming webhook and ntfy, and a command hook. Delivery, retries with backoff,
//! rate limits, a dead receiver that never delays a pause, and secrets kept out of the log.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Daemon, Opts};

/// One request as the receiver saw it.
#[derive(Debug, Clone)]
struct Got {
    at: Instant,
    path: String,
    headers: Vec<(String, String)>,
    body: String,
}

impl Got {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A local HTTP receiver. `answers` gives the status for each request in turn (then 200); 0 means
/// never answer (hold the connection open).
struct Receiver {
    addr: String,
    got: Arc<Mutex<Vec<Got>>>,
}

impl Receiver {
    fn start(answers: Vec<u16>) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        let got: Arc<Mutex<Vec<Got>>> = Arc::default();
        let seen = got.clone();
        std::thread::spawn(move || {
            let mut answers = answers.into_iter();
            let mut held = Vec::new();
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut r = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                if r.read_line(&mut line).is_err() {
                    continue;
                }
                let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
                let mut headers = Vec::new();
                loop {
                    let mut h = String::new();
                    if r.read_line(&mut h).is_err() || h.trim().is_empty() {
                        break;
                    }
                    if let Some((k, v)) = h.trim_end().split_once(':') {
                        headers.push((k.trim().to_owned(), v.trim().to_owned()));
                    }
                }
                let len: usize = headers
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                    .and_then(|(_, v)| v.parse().ok())
                    .unwrap_or(0);
                let mut body = vec![0; len];
                let _ = r.read_exact(&mut body);
                seen.lock().unwrap().push(Got {
                    at: Instant::now(),
                    path,
                    headers,
                    body: String::from_utf8_lossy(&body).into_owned(),
                });
                match answers.next().unwrap_or(200) {
                    0 => held.push(stream),
                    code => {
                        let _ = write!(
                            stream,
                            "HTTP/1.1 {code} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        );
                    }
                }
            }
        });
        Receiver { addr, got }
    }

    fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    /// Waits up to 15 s for `n` requests.
    fn wait_for(&self, n: usize) -> Vec<Got> {
        let start = Instant::now();
        while self.got().len() < n {
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "{} of {n} requests came: {:?}",
                self.got().len(),
                self.got()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self.got()
    }
}

fn sleeper() -> std::process::Child {
    std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap()
}

fn count(metrics: &str, channel: &str, outcome: &str) -> u64 {
    let key =
        format!("memwatch_notifications_total{{channel=\"{channel}\",outcome=\"{outcome}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The fixture host is 95 % used, so an attached job is paused at once: each kind of channel is
/// told, with its own format, and the URL's secret and the token never reach the log.
#[test]
fn every_kind_of_channel_is_told_of_a_pause() {
    let rx = Receiver::start(vec![]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("hook.env");
    let hook = dir.path().join("hook.sh");
    std::fs::write(
        &hook,
        format!(
            "#!/bin/sh\nenv | grep ^MEMWATCH_ | sort > {}.tmp && mv {0}.tmp {0}\n",
            out.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let config = format!(
        "[[notify.channels]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"{a}/hook/S3CRET-PATH\"\ntoken = \"T0KEN-abc\"\nevents = [\"pause\"]\n\
         [[notify.channels]]\nname = \"chat\"\nkind = \"slack\"\nurl = \"{a}/services/T0/B0/S3CRET-PATH\"\nevents = [\"pause\"]\n\
         [[notify.channels]]\nname = \"phone\"\nkind = \"ntfy\"\nurl = \"{a}/gpu-box-01\"\ntoken = \"T0KEN-abc\"\nevents = [\"pause\"]\n\
         [[notify.channels]]\nname = \"script\"\nkind = \"command\"\ncommand = [\"{h}\"]\nevents = [\"pause\"]\n",
        a = rx.addr,
        h = hook.display()
    );
    let d = Daemon::start(Opts {
        extra_config: &config,
        ..Opts::default()
    });
    let mut job = sleeper();
    assert_eq!(
        d.ctl(&["attach", &job.id().to_string(), "--name", "ui"]).0,
        0
    );
    let got = rx.wait_for(3);
    let by_path = |p: &str| got.iter().find(|g| g.path.starts_with(p)).cloned().unwrap();
    let hook_req = by_path("/hook/");
    let v: serde_json::Value = serde_json::from_str(&hook_req.body).unwrap();
    assert_eq!(
        (v["event"].as_str(), v["job"].as_str()),
        (Some("pause"), Some("ui"))
    );
    assert_eq!(v["host"], "gpu-box-01");
    assert!(
        v["detail"].as_str().unwrap().contains("host memory at 95"),
        "{v}"
    );
    assert_eq!(hook_req.header("authorization"), Some("Bearer T0KEN-abc"));
    let chat: serde_json::Value = serde_json::from_str(&by_path("/services/").body).unwrap();
    assert!(
        chat["text"]
            .as_str()
            .unwrap()
            .starts_with("*gpu-box-01: ui paused*\n"),
        "{chat}"
    );
    let phone = by_path("/gpu-box-01");
    assert_eq!(phone.header("title"), Some("gpu-box-01: ui paused"));
    assert_eq!(phone.header("priority"), Some("high"));
    assert_eq!(phone.header("tags"), Some("memwatch,pause"));
    assert!(phone.body.contains("host memory at 95"), "{}", phone.body);
    let start = Instant::now();
    while !out.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "the command never ran"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let env = std::fs::read_to_string(&out).unwrap();
    for want in [
        "MEMWATCH_EVENT=pause",
        "MEMWATCH_JOB=ui",
        "MEMWATCH_HOST=gpu-box-01",
    ] {
        assert!(env.contains(want), "{want} not in {env}");
    }
    // A channel counts a delivery once its receiver has answered, after the receiver saw it.
    let metrics = d.wait_metrics("each channel counted as sent once", |m| {
        ["hook", "chat", "phone", "script"]
            .iter()
            .all(|ch| count(m, ch, "sent") == 1)
    });
    // Secrets stay out of the log, the API and the metrics.
    let log = d.log_text();
    let (_, api) = d.get("/api/v1/jobs");
    for text in [&log, &api, &metrics] {
        assert!(
            !text.contains("S3CRET") && !text.contains("T0KEN"),
            "a secret leaked"
        );
    }
    let _ = job.kill();
    let _ = job.wait();
}

/// A receiver that fails twice gets the notice on the third try, after a backoff; one that never
/// answers is abandoned after its timeout, and meanwhile the daemon pauses and answers as usual.
#[test]
fn retries_back_off_and_a_dead_receiver_delays_nothing() {
    let flaky = Receiver::start(vec![503, 503]);
    let dead = Receiver::start(vec![0, 0, 0]);
    let config = format!(
        "[[notify.channels]]\nname = \"flaky\"\nkind = \"webhook\"\nurl = \"{}/x\"\nretries = 3\nretry_base_ms = 200\nevents = [\"pause\"]\n\
         [[notify.channels]]\nname = \"dead\"\nkind = \"webhook\"\nurl = \"{}/x\"\nretries = 0\ntimeout_seconds = 3\nevents = [\"pause\"]\n",
        flaky.addr, dead.addr
    );
    let d = Daemon::start(Opts {
        extra_config: &config,
        ..Opts::default()
    });
    let mut job = sleeper();
    assert_eq!(
        d.ctl(&["attach", &job.id().to_string(), "--name", "r"]).0,
        0
    );
    // While the dead receiver holds its connection, the job is paused and commands are answered.
    dead.wait_for(1);
    assert_eq!(d.job_state("r").as_deref(), Some("paused"));
    let asked = Instant::now();
    assert_eq!(d.ctl(&["jobs"]).0, 0);
    assert!(asked.elapsed() < Duration::from_secs(2));
    assert_eq!(count(&d.metrics(), "dead", "failed"), 0, "still in flight");
    // Backoff doubling from 200 ms: the tries come at least 200 ms, then 400 ms apart.
    let got = flaky.wait_for(3);
    let gaps: Vec<Duration> = got.windows(2).map(|w| w[1].at - w[0].at).collect();
    assert!(
        gaps[0] >= Duration::from_millis(200) && gaps[1] >= Duration::from_millis(400),
        "{gaps:?}"
    );
    d.wait_until(
        |d| count(&d.metrics(), "flaky", "sent") == 1,
        "the third try counted",
    );
    let m = d.metrics();
    assert_eq!(count(&m, "flaky", "retried"), 2);
    assert_eq!(count(&m, "flaky", "failed"), 0);
    d.wait_until(
        |d| count(&d.metrics(), "dead", "failed") == 1,
        "the dead receiver given up",
    );
    // The channel counts the failure, then logs it.
    d.wait_log("the log says why", |l| l.contains("timed out"));
    let _ = job.kill();
    let _ = job.wait();
}

/// Pauses and resumes by hand on a calm host: the same event for the same job is held back within
/// `min_interval_seconds` and counted, and the next one that goes says so; `max_per_hour` caps a
/// channel whatever the events.
#[test]
fn rate_limits_hold_back_and_say_so() {
    let rx = Receiver::start(vec![]);
    let capped = Receiver::start(vec![]);
    let config = format!(
        "[[notify.channels]]\nname = \"calm\"\nkind = \"webhook\"\nurl = \"{}/x\"\nmin_interval_seconds = 3600\nevents = [\"pause\", \"resume\"]\n\
         [[notify.channels]]\nname = \"capped\"\nkind = \"webhook\"\nurl = \"{}/x\"\nmin_interval_seconds = 0\nmax_per_hour = 2\nevents = [\"pause\", \"resume\"]\n",
        rx.addr, capped.addr
    );
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        extra_config: &config,
        ..Opts::default()
    });
    let mut job = sleeper();
    assert_eq!(
        d.ctl(&["attach", &job.id().to_string(), "--name", "hand"])
            .0,
        0
    );
    for _ in 0..3 {
        assert_eq!(d.ctl(&["pause", "hand"]).0, 0);
        assert_eq!(d.ctl(&["resume", "hand"]).0, 0);
    }
    d.wait_until(
        |d| {
            let m = d.metrics();
            count(&m, "calm", "held_back") == 4 && count(&m, "capped", "held_back") == 4
        },
        "4 held back on each channel",
    );
    let got = rx.wait_for(2);
    let events: Vec<String> = got
        .iter()
        .map(|g| serde_json::from_str::<serde_json::Value>(&g.body).unwrap()["event"].to_string())
        .collect();
    assert_eq!(events, vec!["\"pause\"", "\"resume\""]);
    assert_eq!(capped.wait_for(2).len(), 2);
    // Counted as sent once the receivers have answered.
    d.wait_metrics("two sent on each channel", |m| {
        (count(m, "calm", "sent"), count(m, "capped", "sent")) == (2, 2)
    });
    let _ = job.kill();
    let _ = job.wait();
}

/// A job growing toward its cgroup's limit is announced once before anything pauses it, and a
/// collector that starts failing (NVML, made to fail in the fake library) is announced too.
#[test]
fn near_exhaustion_and_a_collector_down_are_told() {
    let cg = common::cgroup::MemCgroup::new(1 << 30).expect("a memory cgroup (needs root)");
    let rx = Receiver::start(vec![]);
    let config = format!(
        "[notify]\nnear_exhaustion_seconds = 120\n[[notify.channels]]\nname = \"ops\"\nkind = \"webhook\"\nurl = \"{}/x\"\nevents = [\"near_exhaustion\", \"collector_down\"]\n",
        rx.addr
    );
    let d = Daemon::start(Opts {
        root: "/".into(),
        extra_config: &config,
        ..Opts::default()
    });
    // 20 MiB/s toward 1 GiB: about 50 s away, well inside 120 s, far from warn.
    let mut hog = cg.spawn(
        &common::memhog(),
        &[
            "--rate-mib",
            "20",
            "--total-mib",
            "400",
            "--hold-ms",
            "60000",
        ],
    );
    // Attached once it is in the cgroup and allocating.
    let mut line = String::new();
    BufReader::new(hog.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(
        d.ctl(&["attach", &hog.id().to_string(), "--name", "grow"])
            .0,
        0
    );
    let got = rx.wait_for(1);
    let v: serde_json::Value = serde_json::from_str(&got[0].body).unwrap();
    assert_eq!(
        (v["event"].as_str(), v["job"].as_str()),
        (Some("near_exhaustion"), Some("grow"))
    );
    assert!(v["detail"].as_str().unwrap().starts_with("cgroup: "), "{v}");
    // The reason is the resource whose limit it is, as docs/api.md lists it.
    assert_eq!(v["reason"], "job_cgroup", "{v}");
    assert_eq!(d.job_state("grow").as_deref(), Some("running"));
    d.set_gpu_state(r#"{"devices": [], "errors": {"nvmlDeviceGetCount_v2": 999}}"#);
    let got = rx.wait_for(2);
    let v: serde_json::Value = serde_json::from_str(&got[1].body).unwrap();
    assert_eq!(v["event"], "collector_down", "{v}");
    assert_eq!(
        (v["job"].as_str(), v["reason"].as_str()),
        (Some(""), Some("gpu"))
    );
    // Once each: the job keeps growing and NVML keeps failing, nothing more is sent.
    assert!(
        d.events()
            .iter()
            .filter(|e| e["action"] == "near_exhaustion")
            .count()
            == 1
    );
    let _ = hog.kill();
    let _ = hog.wait();
}
