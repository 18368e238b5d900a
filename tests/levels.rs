//! A level held only by its leave hold: the value is back under its line while the level stays for
//! `leave_hold_ms` (so that a pause does not flap). Seen on a real H200 (BENCHMARKS.md, "On a real
//! GPU"): GPU memory back at 30 % read "CRITICAL" and was advised "nearly full". Now the API says
//! where the level is going (`settling`), `memwatch status` says it is leaving (and so does
//! `memwatch top`, in tmux), and no advice asks to shrink what is no longer full.

mod common;

use common::tmux::Tmux;
use common::{Daemon, Opts, memwatch};

const GPU0_USED: &str = "\"memory_used\": 10307921510";

/// GPU 0's level and where it is settling, from `/api/v1/jobs`.
fn gpu0(d: &Daemon) -> (String, Option<String>) {
    let (code, body) = d.get("/api/v1/jobs");
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let l = v["levels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["resource"] == "gpu_memory:0")
        .cloned()
        .unwrap_or_default();
    (
        l["level"].as_str().unwrap_or_default().to_owned(),
        l["settling"].as_str().map(str::to_owned),
    )
}

fn gpu0_advice(d: &Daemon) -> Vec<String> {
    let (code, body) = d.get("/api/v1/advice");
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["advice"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["id"].as_str())
        .filter(|id| id.ends_with(":0") && id.starts_with("gpu-"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_level_in_its_leave_hold_is_shown_leaving_and_advised_at_its_value() {
    let fixture = include_str!("fixtures/nvml/two-gpus.json");
    let d = Daemon::start(Opts {
        // A hold far longer than the test, so that the level is still held when it is read.
        extra_config: "[policy.gpu_memory]\nleave_hold_ms = 600000\n",
        ..Opts::default()
    });
    // GPU 0 at 98 % of its 20 GiB: critical, and advised.
    d.set_gpu_state(&fixture.replacen(GPU0_USED, "\"memory_used\": 21000000000", 1));
    d.wait_until(
        |d| gpu0(d) == ("critical".into(), None) && !gpu0_advice(d).is_empty(),
        "GPU 0 at 98 % is not critical and advised",
    );
    // Back to 30 %: still critical for its hold, settling to ok.
    d.set_gpu_state(&fixture.replacen(GPU0_USED, "\"memory_used\": 6442450944", 1));
    d.wait_until(
        |d| gpu0(d) == ("critical".into(), Some("ok".into())),
        "GPU 0 back at 30 % is not shown settling to ok",
    );
    assert_eq!(gpu0_advice(&d), Vec::<String>::new());
    let (code, out, err) = memwatch(&["status", "--url", &d.url()]);
    assert_eq!(code, 0, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("CRITICAL"))
        .unwrap_or_default();
    assert!(
        line.contains("GPU 0 memory 30 % for ")
            && line.contains("(leaving: ok unless it rises again)"),
        "{out}"
    );
    // `memwatch top` in a real terminal says the same.
    let url = d.url();
    let bin = common::bin();
    let t = Tmux::start(200, 50, &[bin.to_str().unwrap(), "top", "--url", &url]);
    t.wait_for(", leaving)");
    assert!(
        t.text().contains("CRITICAL GPU 0 memory 30 % ("),
        "{}",
        t.text()
    );
    drop(t);
    // Up again over its leave line: no longer settling.
    d.set_gpu_state(&fixture.replacen(GPU0_USED, "\"memory_used\": 20500000000", 1));
    d.wait_until(
        |d| gpu0(d) == ("critical".into(), None),
        "GPU 0 at 95 % is still shown settling",
    );
}
