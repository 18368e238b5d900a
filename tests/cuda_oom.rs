//! A trainer's CUDA OOM report, on the real daemon: over the control socket and over HTTP, it is
//! recorded (event), counted (`/metrics`, the jobs' JSON, `memwatch jobs`), the micro-batch the
//! trainer recovered at is staged in its config file as applied and verified, fragmentation shows as
//! advice with its figures, and nonsense or a wrong token is refused. The launch side (an unrecovered
//! OOM with a checkpoint relaunches the run) is in tests/launch.rs.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command};

use common::{Daemon, Opts};

const G: u64 = 1 << 30;

/// One request line on the control socket, and its answer.
fn ask(d: &Daemon, request: &serde_json::Value) -> serde_json::Value {
    let mut s = UnixStream::connect(&d.socket).expect("the control socket");
    writeln!(s, "{request}").expect("a request written");
    let mut line = String::new();
    BufReader::new(s)
        .read_line(&mut line)
        .expect("an answer read");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
}

/// `POST /api/v1/jobs/{job}/oom` with `body` and `token`.
fn post(d: &Daemon, job: &str, token: &str, body: &serde_json::Value) -> (u16, String) {
    let body = body.to_string();
    d.request(&format!(
        "POST /api/v1/jobs/{job}/oom HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ))
}

fn sleeper() -> Child {
    Command::new("sleep").arg("120").spawn().expect("sleep")
}

fn recovered() -> serde_json::Value {
    serde_json::json!({
        "epoch": 2, "step": 37, "phase": "backward", "micro_batch_before": 32, "recovered": true,
        "micro_batch_after": 16, "accumulation_after": 4, "min_micro_batch": 1,
        "requested_bytes": 2 * G, "allocated_bytes": 56 * G, "reserved_bytes": 76 * G,
        "gpu_free_bytes": G * 6 / 5, "gpu_total_bytes": 80 * G, "device": 0,
        "snapshot": "/tmp/oom-snapshot.pickle",
        "message": "CUDA out of memory. Tried to allocate 2.00 GiB.\nmore lines",
        "some_future_field": true
    })
}

#[test]
fn an_oom_report_is_recorded_counted_staged_as_applied_and_advised() {
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        ..Opts::default()
    });
    let dir = d.dir.path();
    let cfg = dir.join("train.json");
    std::fs::write(
        &cfg,
        "{\"train\": {\"micro_batch\": 32, \"accumulation\": 2, \"workers\": 2}}\n",
    )
    .unwrap();
    let mut job = sleeper();
    let pid = job.id().to_string();
    let (code, _, err) = d.ctl(&[
        "attach",
        &pid,
        "--name",
        "t",
        "--config-file",
        cfg.to_str().unwrap(),
        "--profile",
        "generic",
        "--key",
        "batch=train.micro_batch",
        "--key",
        "accumulation=train.accumulation",
        "--token-file",
        dir.join("token").to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let token = std::fs::read_to_string(dir.join("token")).unwrap();
    let token = token.trim();

    // Over the control socket (the caller is root): a recovered OOM.
    let answer = ask(
        &d,
        &serde_json::json!({"cmd": "oom", "target": "t", "oom": recovered()}),
    );
    assert_eq!(answer["ok"], true, "{answer}");
    let events = d.wait_event("the cuda_oom event", |e| e["action"] == "cuda_oom");
    let e = events
        .iter()
        .find(|e| e["action"] == "cuda_oom")
        .expect("the event");
    assert_eq!(e["reason"], "cuda_oom", "{e}");
    let detail = e["detail"].as_str().unwrap_or_default();
    for part in [
        "CUDA OOM on GPU 0 in the backward pass at epoch 2, step 37",
        "recovered at micro-batch 16 × accumulation 4 (was 32 × 2)",
        "tried to allocate 2.00 GiB with 1.20 GiB free of 80.00 GiB",
        "a CUDA memory snapshot was saved",
        "the new micro-batch goes to its config file for the next start",
    ] {
        assert!(detail.contains(part), "{part:?} missing from {detail:?}");
    }

    // The file holds what the trainer runs with now, staged as applied at the report's epoch and
    // verified by the report: nothing left for the trainer to apply.
    common::wait::file("the recovered micro-batch in the file", &cfg, |t| {
        t.contains("\"micro_batch\": 16") && t.contains("\"accumulation\": 4")
    });
    let jobs = d.wait_for(
        "the staged directive",
        || d.jobs(),
        |j| j[0]["config"]["directives"][0]["generation"] == 1,
    );
    let j = &jobs[0];
    let dir0 = &j["config"]["directives"][0];
    assert_eq!(dir0["applied_epoch"], 2, "{dir0}");
    assert_eq!(dir0["verification"]["state"], "verified", "{dir0}");
    assert!(dir0["urgent"].is_null(), "{dir0}");
    assert_eq!(j["config"]["applied_generation"], 1, "{j}");
    assert_eq!(j["config"]["knobs"]["micro_batch"], 16, "{j}");
    assert_eq!(j["cuda_oom"]["recovered"], 1, "{j}");
    assert_eq!(j["cuda_oom"]["stopped"], 0, "{j}");
    let last = &j["cuda_oom"]["last"];
    assert_eq!(last["micro_batch_after"], 16, "{last}");
    assert_eq!(last["phase"], "backward", "{last}");
    assert!(last["at_ms"].as_u64().is_some_and(|t| t > 0), "{last}");
    assert_eq!(
        last["message"], "CUDA out of memory. Tried to allocate 2.00 GiB.",
        "the message keeps its first line: {last}"
    );
    assert!(last.get("some_future_field").is_none(), "{last}");
    // HTTP shows everyone the counts; the report only with the job's token.
    let (_, body) = d.get("/api/v1/jobs");
    let anonymous: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(anonymous["jobs"][0]["cuda_oom"]["recovered"], 1, "{body}");
    let public = &anonymous["jobs"][0]["cuda_oom"]["last"];
    assert_eq!(public["micro_batch_after"], 16, "{body}");
    assert!(
        public["snapshot"].is_null() && public["message"].is_null(),
        "{body}"
    );
    assert!(
        !detail.contains("/tmp/"),
        "an event names no path: {detail}"
    );
    let (_, body) = d.request(&format!(
        "GET /api/v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    ));
    let owner: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        owner["jobs"][0]["cuda_oom"]["last"]["snapshot"], "/tmp/oom-snapshot.pickle",
        "{body}"
    );
    d.wait_event("the rewrite for the recovery", |e| {
        e["action"] == "rewrite" && e["reason"] == "cuda_oom"
    });
    let pending = "memwatch_job_config_pending_changes{job_name=\"t\"} 0\n";
    let recovered_total = "memwatch_job_cuda_oom_total{job_name=\"t\",outcome=\"recovered\"} 1\n";
    d.wait_metrics("the recovered OOM counted", |m| {
        m.contains(recovered_total) && m.contains(pending)
    });

    // Fragmentation: 20 GiB cached of 76 reserved, 2 GiB asked for.
    let advice = d.wait_api("/api/v1/advice?job=t", "the fragmentation advice", |v| {
        v["advice"]
            .as_array()
            .is_some_and(|a| a.iter().any(|a| a["id"] == "cuda-fragmentation:t"))
    });
    let a = advice["advice"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["id"] == "cuda-fragmentation:t"))
        .expect("the advice");
    assert!(
        a["change"]
            .as_str()
            .is_some_and(|c| c.contains("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")),
        "{a}"
    );
    let evidence = a["evidence"].to_string();
    for figure in [
        "56.00 GiB allocated",
        "76.00 GiB reserved",
        "20.00 GiB reserved but unallocated",
        "tried to allocate 2.00 GiB",
    ] {
        assert!(evidence.contains(figure), "{figure:?} missing: {evidence}");
    }

    // Over HTTP with the token: a stop at the floor, with a checkpoint.
    let stop = serde_json::json!({
        "epoch": 3, "step": 5, "phase": "forward", "micro_batch_before": 16, "recovered": false,
        "min_micro_batch": 16, "checkpointed": true
    });
    let (status, body) = post(&d, "t", token, &stop);
    assert_eq!((status, body.trim()), (200, "{\"ok\":true}"));
    d.wait_event("the stop's event", |e| {
        e["action"] == "cuda_oom"
            && e["detail"].as_str().is_some_and(|t| {
                t.contains("at the floor micro-batch 16 (min_micro_batch 16)")
                    && t.contains("saved a checkpoint and stops")
            })
    });
    let stopped_total = "memwatch_job_cuda_oom_total{job_name=\"t\",outcome=\"stopped\"} 1\n";
    d.wait_metrics("the stop counted", |m| {
        m.contains(stopped_total) && m.contains(recovered_total)
    });
    let (_, text, _) = d.ctl(&["jobs"]);
    assert!(
        text.contains("CUDA OOMs: 1 recovered, 1 stopped")
            && text.contains("stopped at micro-batch 16, checkpoint saved"),
        "{text}"
    );
    // A stop stages nothing: still one generation.
    let jobs = d.jobs();
    assert_eq!(jobs[0]["config"]["generation"], 1, "{jobs:?}");

    // Refusals: a wrong token, nonsense over both transports.
    let (status, body) = post(&d, "t", &"0f".repeat(16), &stop);
    assert_eq!(status, 403, "{body}");
    let mut nonsense = recovered();
    nonsense["micro_batch_after"] = serde_json::json!(32);
    let (status, body) = post(&d, "t", token, &nonsense);
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains(
            "micro_batch_after must be at least 1 and below micro_batch_before (32), not 32"
        ),
        "{body}"
    );
    let mut sideways = recovered();
    sideways["phase"] = serde_json::json!("sideways");
    let answer = ask(
        &d,
        &serde_json::json!({"cmd": "oom", "target": "t", "oom": sideways}),
    );
    assert_eq!(answer["ok"], false, "{answer}");
    assert_eq!(answer["kind"], "invalid", "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .is_some_and(|e| e.contains("phase must be \"forward\" or \"backward\"")),
        "{answer}"
    );
    // Nothing refused was counted.
    let jobs = d.jobs();
    assert_eq!(
        (
            &jobs[0]["cuda_oom"]["recovered"],
            &jobs[0]["cuda_oom"]["stopped"]
        ),
        (&serde_json::json!(1), &serde_json::json!(1)),
        "{jobs:?}"
    );

    // A job without a config file: counted and recorded, and the event says nothing was staged.
    let mut bare = sleeper();
    let (code, _, err) = d.ctl(&["attach", &bare.id().to_string(), "--name", "bare"]);
    assert_eq!(code, 0, "{err}");
    let answer = ask(
        &d,
        &serde_json::json!({"cmd": "oom", "target": "bare", "oom": recovered()}),
    );
    assert_eq!(answer["ok"], true, "{answer}");
    d.wait_event("the bare job's event", |e| {
        e["action"] == "cuda_oom"
            && e["job"] == "bare"
            && e["detail"].as_str().is_some_and(|t| {
                t.ends_with("; not staged: the job was attached without a config file")
            })
    });

    for c in [&mut job, &mut bare] {
        let _ = c.kill();
        let _ = c.wait();
    }
}
