//! A real Prometheus for dashboard tests: started on a free port with a generated config, queried
//! over its HTTP API, killed on drop.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Prometheus {
    child: Child,
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

/// Percent-encodes a query for a URL.
pub fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl Prometheus {
    /// Scrapes `targets` every second, with `rule_files` loaded.
    pub fn start(targets: &[SocketAddr], rule_files: &[&Path]) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        let targets: Vec<String> = targets.iter().map(|a| format!("'{a}'")).collect();
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: {:?}\nscrape_configs:\n  - job_name: memwatch\n    static_configs:\n      - targets: [{}]\n",
                rule_files,
                targets.join(", ")
            ),
        )
        .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (Debian package prometheus)");
        Prometheus {
            child,
            addr: format!("127.0.0.1:{port}").parse().unwrap(),
            _dir: dir,
        }
    }

    /// GETs an API path; `Null` unless it answered 200 with JSON.
    pub fn get(&self, path: &str) -> serde_json::Value {
        let (status, body) = super::http(
            self.addr,
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        );
        if status != 200 {
            return serde_json::Value::Null;
        }
        serde_json::from_str(&body).unwrap_or(serde_json::Value::Null)
    }

    /// Whether an instant query returns at least one series.
    pub fn has_data(&self, query: &str) -> bool {
        let v = self.get(&format!("/api/v1/query?query={}", encode(query)));
        v["data"]["result"]
            .as_array()
            .is_some_and(|r| !r.is_empty())
    }

    /// The queries of `exprs` (panel title, query) still without data after waiting up to `secs`.
    pub fn without_data(&self, exprs: &[(String, String)], secs: u64) -> Vec<(String, String)> {
        let start = Instant::now();
        let mut empty = exprs.to_vec();
        while !empty.is_empty() && start.elapsed() < Duration::from_secs(secs) {
            std::thread::sleep(Duration::from_millis(500));
            empty.retain(|(_, e)| !self.has_data(e));
        }
        empty
    }

    /// A label's values among the series `series` matches.
    pub fn label_values(&self, name: &str, series: &str) -> Vec<String> {
        let v = self.get(&format!(
            "/api/v1/label/{name}/values?match[]={}",
            encode(series)
        ));
        v["data"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every panel query of a Grafana dashboard file, as (panel title, query) with the variables and
/// `$__rate_interval` replaced by what matches everything.
pub fn dashboard_queries(file: &Path) -> Vec<(String, String)> {
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let vars: Vec<String> = dash["templating"]["list"]
        .as_array()
        .map(|l| {
            l.iter()
                .filter_map(|v| v["name"].as_str().map(|n| format!("${n}")))
                .collect()
        })
        .unwrap_or_default();
    dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| {
            let title = p["title"].as_str().unwrap_or("").to_owned();
            let vars = vars.clone();
            p["targets"].as_array().unwrap().iter().map(move |t| {
                let mut e = t["expr"]
                    .as_str()
                    .unwrap()
                    .replace("$__rate_interval", "1m");
                for v in &vars {
                    e = e.replace(v.as_str(), ".*");
                }
                (title.clone(), e)
            })
        })
        .collect()
}
