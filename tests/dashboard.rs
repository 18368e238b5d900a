//! The live dashboard in a real browser: Debian's Chromium, driven by playwright-core
//! (tests/browser/dashboard.mjs), loads the page from the daemon with no console errors, its charts
//! fill with data, its tiles show the snapshot's numbers and levels, nothing sticks out of its box,
//! one request per endpoint is in flight and history comes incrementally, and a job the daemon
//! pauses shows as paused within seconds (on a phone, on the first screen), with the CUDA OOM its
//! trainer reported, at laptop and phone widths. Its screenshots at 1280 and 390 px are the
//! documentation's (docs/dashboard-1280.png, docs/dashboard-390.png), so they stay current. On a
//! machine with no swap and no GPU the page says so where those charts and tiles would be.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;

use common::{Daemon, Opts};

/// One Chromium at a time: the tests time the page.
static BROWSER: Mutex<()> = Mutex::new(());

fn browser() -> PathBuf {
    let browser = common::repo().join("tests/browser");
    assert!(
        browser.join("node_modules/playwright-core").is_dir(),
        "run `npm ci` in tests/browser (./scripts/test.sh does), and install Debian's chromium"
    );
    browser
}

#[test]
fn the_dashboard_shows_live_data_and_a_paused_job_in_chromium() {
    let _one = BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let browser = browser();
    // The fixture host is 95 % used: the policy pauses whatever is attached.
    let d = Daemon::start(Opts::default());
    let (status, page) = d.get("/");
    assert_eq!(status, 200);
    assert!(
        page.contains("<title>memwatch</title>")
            && !page.contains("http://")
            && !page.contains("https://"),
        "the page must not fetch anything from elsewhere"
    );
    let shot = common::repo().join("docs/dashboard");
    let mut node = Command::new("node")
        .arg(browser.join("dashboard.mjs"))
        .args([&format!("{}/", d.url()), shot.to_str().unwrap(), "ui-job"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("node");
    let mut out = BufReader::new(node.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "charts", "the charts never filled: {line}");
    let mut job = Command::new("sleep").arg("60").spawn().unwrap();
    assert_eq!(
        d.ctl(&["attach", &job.id().to_string(), "--name", "ui-job"])
            .0,
        0
    );
    // Its trainer reports a CUDA OOM it recovered from: the job's entry shows it.
    let mut s = std::os::unix::net::UnixStream::connect(&d.socket).unwrap();
    writeln!(
        s,
        "{}",
        serde_json::json!({"cmd": "oom", "target": "ui-job", "oom": {
            "epoch": 2, "step": 37, "phase": "backward", "micro_batch_before": 32,
            "recovered": true, "micro_batch_after": 16, "accumulation_after": 4}})
    )
    .unwrap();
    let mut answer = String::new();
    BufReader::new(s).read_line(&mut answer).unwrap();
    assert!(answer.contains("\"ok\":true"), "{answer}");
    node.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let output = node.wait_with_output().unwrap();
    let _ = job.kill();
    let _ = job.wait();
    assert!(
        output.status.success(),
        "{rest}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        rest.contains("paused shown after") && rest.trim_end().ends_with("ok"),
        "{rest}"
    );
    eprintln!("{rest}");
    for width in [1280, 390] {
        let png = shot.with_file_name(format!("dashboard-{width}.png"));
        let size = std::fs::metadata(&png).map(|m| m.len()).unwrap_or(0);
        assert!(size > 0, "no screenshot {}", png.display());
    }
}

/// A machine with no swap and no GPU (the fixture root with its swap taken out, NVML seeing no
/// device): the swap chart and tile say "no swap on this machine", the GPU charts, tiles and table
/// "no GPU on this machine", and nothing else is drawn on those charts.
#[test]
fn the_dashboard_says_what_the_machine_does_not_have() {
    let _one = BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let browser = browser();
    let root = common::tempdir();
    common::copy_tree(&common::fixture_root(), root.path());
    let meminfo = root.path().join("proc/meminfo");
    let text: String = std::fs::read_to_string(&meminfo)
        .unwrap()
        .lines()
        .map(|l| match l.split(':').next() {
            Some(k @ ("SwapTotal" | "SwapFree" | "SwapCached")) => format!("{k}:{:>16} kB\n", 0),
            _ => format!("{l}\n"),
        })
        .collect();
    std::fs::write(&meminfo, text).unwrap();
    let d = Daemon::start(Opts {
        root: root.path().into(),
        gpu_state: Some(r#"{"driver_version": "550.54.15", "devices": []}"#),
        ..Opts::default()
    });
    let (status, body) = d.get("/api/v1/snapshot");
    assert_eq!(status, 200);
    let snap: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(snap["host"]["memory"]["swap_total_bytes"], 0, "{snap}");
    assert_eq!(snap["gpus"].as_array().map(Vec::len), Some(0), "{snap}");
    let shot = common::repo().join("target/dashboard");
    let output = Command::new("node")
        .arg(browser.join("dashboard.mjs"))
        .args([&format!("{}/", d.url()), shot.to_str().unwrap(), "--empty"])
        .output()
        .expect("node");
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && out.trim_end().ends_with("ok"),
        "{out}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
