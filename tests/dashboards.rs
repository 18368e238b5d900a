//! dashboards/: the alert rules and the per-Slurm-job recording rules pass promtool's checks and unit
//! tests, and every query of the Grafana
//! dashboard returns data from a real Prometheus scraping two memwatch instances (the instance variable
//! lists both: one dashboard for many machines).

mod common;

use std::process::Command;

use common::prometheus::{Prometheus, dashboard_queries};
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

    let prom = Prometheus::start(
        &[a.addr, b.addr],
        &[&common::repo().join("dashboards/alerts.yml")],
    );
    let exprs = dashboard_queries(&common::repo().join("dashboards/memwatch-grafana.json"));
    assert!(exprs.len() >= 15);
    let empty = prom.without_data(&exprs, 40);
    assert!(empty.is_empty(), "panels without data: {empty:#?}");
    // The variables: both instances, the job, both GPUs (each once Prometheus has scraped it).
    common::wait::until(
        "one dashboard, two machines",
        || prom.label_values("instance", "memwatch_up"),
        |v| v.len() == 2,
    );
    common::wait::until(
        "the job as the job variable",
        || prom.label_values("job_name", "memwatch_job_info"),
        |v| *v == ["train"],
    );
    common::wait::until(
        "both GPUs as the GPU variable",
        || prom.label_values("gpu", "memwatch_gpu_info"),
        |v| *v == ["0", "1"],
    );
    // The rules loaded into the real Prometheus too.
    let rules = prom.get("/api/v1/rules");
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
