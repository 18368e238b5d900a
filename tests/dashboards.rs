//! dashboards/: the alert rules and the per-Slurm-job recording rules pass promtool's checks and unit
//! tests, and every query of the Grafana
//! dashboard returns data from a real Prometheus scraping two memwatch instances (the instance variable
//! lists both: one dashboard for many machines).

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Daemon, Opts};

#[test]
fn alert_rules_check_and_pass_their_unit_tests() {
    let dir = common::repo().join("dashboards");
    for args in [
        vec!["check", "rules", "alerts.yml"],
        vec!["test", "rules", "alerts_test.yml"],
        vec!["check", "rules", "recording.yml"],
        vec!["test", "rules", "recording_test.yml"],
    ] {
        let out = Command::new("promtool")
            .args(&args)
            .current_dir(&dir)
            .output()
            .expect("promtool (Debian package prometheus)");
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn get(addr: std::net::SocketAddr, path: &str) -> serde_json::Value {
    let (status, body) = common::http(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    );
    if status != 200 {
        return serde_json::Value::Null;
    }
    serde_json::from_str(&body).unwrap_or(serde_json::Value::Null)
}

struct Prometheus(std::process::Child);
impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn every_dashboard_query_returns_data_from_a_real_prometheus() {
    let a = Daemon::start(Opts::default());
    let b = Daemon::start(Opts::default());
    // A job on `a`, holding GPU memory. The fixture host is 95 % used, so the policy pauses it at once:
    // an intervention for the dashboard to show.
    let mut job = Command::new("sleep").arg("120").spawn().unwrap();
    let state = include_str!("fixtures/nvml/two-gpus.json")
        .replace("\"pid\": 4242", &format!("\"pid\": {}", job.id()));
    a.set_gpu_state(&state);
    assert_eq!(
        a.ctl(&["attach", &job.id().to_string(), "--name", "train"])
            .0,
        0
    );
    assert!(common::eventually(5.0, || a.job_state("train").as_deref() == Some("paused")));

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [{:?}]\nscrape_configs:\n  - job_name: memwatch\n    static_configs:\n      - targets: ['{}', '{}']\n",
            common::repo().join("dashboards/alerts.yml"),
            a.addr,
            b.addr
        ),
    )
    .unwrap();
    let port = free_port();
    let prom = Prometheus(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (Debian package prometheus)"),
    );
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();

    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(common::repo().join("dashboards/memwatch-grafana.json")).unwrap(),
    )
    .unwrap();
    let exprs: Vec<(String, String)> = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| {
            let title = p["title"].as_str().unwrap_or("").to_owned();
            p["targets"]
                .as_array()
                .unwrap()
                .iter()
                .map(move |t| (title.clone(), t["expr"].as_str().unwrap().to_owned()))
        })
        .collect();
    assert!(exprs.len() >= 15);
    let concrete = |e: &str| {
        e.replace("$instance", ".*")
            .replace("$job", ".*")
            .replace("$gpu", ".*")
            .replace("$__rate_interval", "1m")
    };
    let start = Instant::now();
    let mut empty: Vec<(String, String)> = exprs.clone();
    while !empty.is_empty() && start.elapsed() < Duration::from_secs(40) {
        std::thread::sleep(Duration::from_millis(500));
        empty.retain(|(_, e)| {
            let v = get(
                addr,
                &format!("/api/v1/query?query={}", encode(&concrete(e))),
            );
            v["data"]["result"].as_array().is_none_or(|r| r.is_empty())
        });
    }
    assert!(empty.is_empty(), "panels without data: {empty:#?}");
    // The variables: both instances, the job, both GPUs.
    let labels = |name: &str, series: &str| -> Vec<String> {
        let v = get(
            addr,
            &format!("/api/v1/label/{name}/values?match[]={}", encode(series)),
        );
        v["data"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(
        labels("instance", "memwatch_up").len(),
        2,
        "one dashboard, two machines"
    );
    assert_eq!(
        labels("exported_job", "memwatch_job_info"),
        vec!["train".to_owned()]
    );
    assert_eq!(
        labels("gpu", "memwatch_gpu_info"),
        vec!["0".to_owned(), "1".to_owned()]
    );
    // The rules loaded into the real Prometheus too.
    let rules = get(addr, "/api/v1/rules");
    assert_eq!(
        rules["data"]["groups"][0]["rules"]
            .as_array()
            .map(|r| r.len()),
        Some(11)
    );
    drop(prom);
    let _ = job.kill();
    let _ = job.wait();
}
