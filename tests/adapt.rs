//! Adapting jobs: config rewrites that land at the next epoch boundary, the trainer protocol's
//! authentication, and advice from the running daemon (the rewriter's own safety: rewrite_safety.rs).

mod common;

use std::process::{Command, Stdio};

use common::{Daemon, Opts, eventually, memwatch};

fn gpu(used: u64, pid: u32) -> String {
    format!(
        r#"{{"devices":[{{"name":"Fake","uuid":"GPU-t","memory_total":20000000000,"memory_used":{used},
        "temperature":50,"threshold_slowdown":90,"threshold_shutdown":98,
        "processes":[{{"pid":{pid},"used_memory":{used}}}]}}]}}"#
    )
}

#[test]
fn a_full_gpu_halves_the_batch_at_the_next_epoch_boundary_keeping_the_effective_batch() {
    let gpu_json = gpu(8_000_000_000, 1);
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: Some(&gpu_json),
        ..Opts::default()
    });
    let cfg = d.dir.path().join("train.json");
    std::fs::write(&cfg, "{\n  \"model\": \"tiny\",\n  \"train\": {\"micro_batch\": 32, \"accumulation\": 2, \"lr\": 0.0003},\n  \"epochs\": 6\n}\n").unwrap();
    let out = d.dir.path().join("log.json");
    let mut trainer = Command::new("python3")
        .arg(common::repo().join("tests/trainer/train.py"))
        .args([
            cfg.to_str().unwrap(),
            d.socket.to_str().unwrap(),
            &d.url(),
            out.to_str().unwrap(),
            "6",
            "20",
            "0.05",
        ])
        .stdout(Stdio::inherit())
        .spawn()
        .unwrap();
    let pid = trainer.id();
    assert!(
        eventually(10.0, || d.job_state("trainer").is_some()),
        "the trainer did not attach"
    );
    d.set_gpu_state(&gpu(8_000_000_000, pid));
    // An epoch is under way (the trainer reported step 5 or later of it): the GPU fills up.
    d.wait_until(
        |d| {
            d.jobs()
                .first()
                .and_then(|j| j["config"]["progress"]["step"].as_u64())
                >= Some(5)
        },
        "the trainer never reported its progress",
    );
    d.set_gpu_state(&gpu(19_000_000_000, pid));
    assert!(
        eventually(10.0, || d.jobs()[0]["config"]["generation"] == 1),
        "no rewrite was staged: {:?}",
        d.jobs()
    );
    d.set_gpu_state(&gpu(8_000_000_000, pid));
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert_eq!(
        text,
        "{\n  \"model\": \"tiny\",\n  \"train\": {\"micro_batch\": 16, \"accumulation\": 4, \"lr\": 0.0003},\n  \"epochs\": 6\n}\n",
        "only the two values changed"
    );
    assert!(cfg.with_file_name("train.json.memwatch-orig").exists());
    // /metrics shows the acknowledgement while the job runs (its series end with it).
    assert!(
        eventually(10.0, || d.metrics().contains(
            "memwatch_job_config_applied_generation{job_name=\"trainer\"} 1\n"
        )),
        "{}",
        d.metrics()
    );
    // Read while the job runs: it is dropped once the trainer exits.
    let job = &d.jobs()[0].clone();
    let status = trainer.wait().unwrap();
    assert!(status.success());

    let log: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let directive = &job["config"]["directives"][0];
    let staged = directive["staged_at_ms"].as_u64().unwrap();
    let applied_epoch = directive["applied_epoch"].as_u64().expect("acknowledged");
    assert_eq!(job["config"]["applied_generation"], 1);
    // The trainer kept the old batch until the epoch boundary after the rewrite, then the new one.
    let first_epoch_after = log
        .iter()
        .find(|s| s["t_ms"].as_u64().unwrap() > staged && s["step"] == 0)
        .unwrap()["epoch"]
        .as_u64()
        .unwrap();
    assert_eq!(applied_epoch, first_epoch_after);
    for s in &log {
        let (e, m, a) = (
            s["epoch"].as_u64().unwrap(),
            s["micro"].as_u64().unwrap(),
            s["accum"].as_u64().unwrap(),
        );
        if e < applied_epoch {
            assert_eq!((m, a), (32, 2), "changed before the boundary: {s}");
        } else {
            assert_eq!((m, a), (16, 4), "not applied at the boundary: {s}");
        }
        assert_eq!(m * a, 64, "the effective batch changed");
    }
    // Epochs within an epoch never mix values.
    let staged_mid_epoch = log.iter().any(|s| {
        s["epoch"].as_u64().unwrap() == applied_epoch - 1 && s["t_ms"].as_u64().unwrap() < staged
    });
    assert!(
        staged_mid_epoch,
        "the rewrite should have landed mid-epoch for this test to mean anything"
    );
    d.wait_events(
        "the rewrite and its acknowledgement among the events",
        |events| {
            events.iter().any(|e| e["action"] == "rewrite")
                && events.iter().any(|e| e["action"] == "applied")
        },
    );
}

#[test]
fn trainer_endpoints_need_the_token() {
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        ..Opts::default()
    });
    let cfg = d.dir.path().join("train.toml");
    std::fs::write(&cfg, "[train]\nbatch = 8\n").unwrap();
    let mut s = Command::new("sleep").arg("60").spawn().unwrap();
    let (code, out, err) = d.ctl(&[
        "attach",
        &s.id().to_string(),
        "--name",
        "tok",
        "--config-file",
        cfg.to_str().unwrap(),
        "--key",
        "batch=train.batch",
    ]);
    assert_eq!(code, 0, "{err}");
    let token = out
        .lines()
        .find_map(|l| l.strip_prefix("token: "))
        .unwrap()
        .to_owned();
    let get = |auth: &str| {
        d.request(&format!(
            "GET /api/v1/jobs/tok/directives HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"
        ))
    };
    assert_eq!(get("").0, 403);
    assert_eq!(get("Authorization: Bearer nope\r\n").0, 403);
    let (status, body) = get(&format!("Authorization: Bearer {token}\r\n"));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"micro_batch\":8"), "{body}");
    let ack = |g: u64| {
        let body = format!("{{\"generation\":{g},\"epoch\":1}}");
        d.request(&format!(
            "POST /api/v1/jobs/tok/ack HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ))
    };
    assert_eq!(ack(5).0, 400, "a generation never staged");
    assert_eq!(ack(0).0, 200);
    assert_eq!(d.get("/api/v1/jobs/nope/directives").0, 404);
    // The token never shows in the API: read once the API shows the job (published after the attach
    // is answered).
    let api = d.wait_api("/api/v1/jobs", "the job in /api/v1/jobs", |v| {
        v["jobs"][0]["name"] == "tok"
    });
    assert!(!api.to_string().contains(&token));
    // Without the job's token, /api/v1/jobs shows its name, state and numbers, not its details: no
    // config file, knobs or process names. With it, everything.
    let jobs = |auth: &str| -> serde_json::Value {
        let (status, body) = d.request(&format!(
            "GET /api/v1/jobs HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"
        ));
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["jobs"][0].clone()
    };
    assert!(
        eventually(5.0, || jobs("")["sample"]["process_count"] == 1),
        "{}",
        jobs("")
    );
    for (auth, details) in [
        (String::new(), false),
        (
            "Authorization: Bearer 00000000000000000000000000000000\r\n".to_owned(),
            false,
        ),
        (format!("Authorization: Bearer {token}\r\n"), true),
    ] {
        let j = jobs(&auth);
        assert_eq!(j["name"], "tok");
        assert_eq!(j["details"], details, "{j}");
        assert_eq!(j["config"]["generation"], 0, "{j}");
        assert_eq!(j["config"]["file"].is_string(), details, "{j}");
        assert_eq!(j["config"]["knobs"].is_object(), details, "{j}");
        assert_eq!(j["sample"]["processes"].is_array(), details, "{j}");
        assert_eq!(j.to_string().contains("sleep"), details, "{j}");
    }
    let _ = s.kill();
    let _ = s.wait();
}

#[test]
fn attach_refuses_bad_config_files() {
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        ..Opts::default()
    });
    let mut s = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = s.id().to_string();
    let dir = d.dir.path();
    std::fs::write(
        dir.join("bad.json"),
        "{\"train_micro_batch_size_per_gpu\": 4,,}",
    )
    .unwrap();
    std::fs::write(
        dir.join("ok.json"),
        "{\"train_micro_batch_size_per_gpu\": 4}",
    )
    .unwrap();
    std::os::unix::fs::symlink(dir.join("ok.json"), dir.join("link.json")).unwrap();
    std::fs::write(dir.join("x.ini"), "").unwrap();
    let cases = [
        ("bad.json", "deepspeed", "not valid JSON"),
        ("link.json", "deepspeed", "symbolic link"),
        ("x.ini", "deepspeed", "unknown format"),
        ("ok.json", "nonsense", "unknown profile"),
        ("ok.json", "hf", "none of the profile's keys"),
        ("missing.json", "deepspeed", "No such file"),
    ];
    for (file, profile, want) in cases {
        let f = dir.join(file);
        let (code, _, err) = d.ctl(&[
            "attach",
            &pid,
            "--config-file",
            f.to_str().unwrap(),
            "--profile",
            profile,
        ]);
        assert_ne!(code, 0, "{file}");
        assert!(err.contains(want), "{file}: {err}");
    }
    assert!(d.jobs().is_empty());
    assert_eq!(
        std::fs::read_to_string(dir.join("bad.json")).unwrap(),
        "{\"train_micro_batch_size_per_gpu\": 4,,}"
    );
    let (code, _, err) = d.ctl(&[
        "attach",
        &pid,
        "--config-file",
        dir.join("ok.json").to_str().unwrap(),
        "--profile",
        "deepspeed",
    ]);
    assert_eq!(code, 0, "{err}");
    let _ = s.kill();
    let _ = s.wait();
}

#[test]
fn advice_for_the_fixture_machine() {
    let d = Daemon::start(Opts::default());
    let (code, out, err) = memwatch(&["advise", "--url", &d.url()]);
    assert_eq!(code, 0, "{err}");
    // The fixture: 1.4 GiB available of 30.8, 2.0 GiB in swap: keep swap on.
    assert!(
        out.contains(
            "[WARN] Swap holds 2.0 GiB, more than RAM can take back now: do not run swapoff"
        ),
        "{out}"
    );
    let (code, out, _) = memwatch(&["advise", "--json", "--url", &d.url()]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["advice"][0]["id"], "swap-keep");
    assert!(
        d.metrics().contains(
            "memwatch_advice_active{id=\"swap-keep\",severity=\"warn\",job_name=\"\"} 1\n"
        )
    );
}

/// A daemon killed after a config file was rewritten but before its state was saved comes back knowing
/// the rewrite: the change is journaled before the file is touched, and the restarted daemon adopts
/// the journaled generation when the file shows it, and drops one that never reached the file. The
/// disk is left exactly as such a kill leaves it: the state from before the rewrite, the journal's
/// intent, and the file rewritten (by `memwatch rewrite`, the same writer) or not.
#[test]
fn a_rewrite_that_landed_before_a_kill_is_not_lost() {
    let mut d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        ..Opts::default()
    });
    let cfg = d.dir.path().join("ds.json");
    std::fs::write(
        &cfg,
        "{\"train_micro_batch_size_per_gpu\": 32, \"gradient_accumulation_steps\": 2}\n",
    )
    .unwrap();
    let mut job = Command::new("sleep").arg("120").spawn().unwrap();
    let pid = job.id().to_string();
    let (code, _, err) = d.ctl(&[
        "attach",
        &pid,
        "--name",
        "ds",
        "--config-file",
        cfg.to_str().unwrap(),
        "--profile",
        "deepspeed",
    ]);
    assert_eq!(code, 0, "{err}");
    let journal = d.state.join("journal.jsonl");
    let state = d.state.clone();
    // The events' details (file paths, values) are the owner's: read them from the audit log.
    let audit = |want: &str| {
        std::fs::read_to_string(state.join("events.jsonl"))
            .unwrap_or_default()
            .lines()
            .any(|l| l.contains(want))
    };
    let intent = |generation: u64, micro: u64, accumulation: u64, old: (u64, u64)| {
        let line = serde_json::json!({
            "job": "ds",
            "file": cfg,
            "intent": {
                "generation": generation,
                "changes": [
                    {"knob": "micro_batch", "path": "train_micro_batch_size_per_gpu", "old": old.0, "new": micro},
                    {"knob": "accumulation", "path": "gradient_accumulation_steps", "old": old.1, "new": accumulation},
                ],
                "reason": "GPU memory at warn",
                "staged_at_ms": 0,
                "applied_epoch": null,
                "applied_at_ms": null,
            }
        });
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&journal)
            .unwrap();
        writeln!(f, "{line}").unwrap();
    };

    // Killed after the rename: the file holds generation 1, the state still generation 0.
    d.wait_guardian_pid();
    d.crash(true);
    intent(1, 16, 4, (32, 2));
    let (code, _, err) = memwatch(&[
        "rewrite",
        cfg.to_str().unwrap(),
        "--set",
        "train_micro_batch_size_per_gpu=16",
        "--set",
        "gradient_accumulation_steps=4",
    ]);
    assert_eq!(code, 0, "{err}");
    let mut d2 = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        state: Some(state.clone()),
        ..Opts::default()
    });
    assert!(
        eventually(10.0, || d2
            .jobs()
            .first()
            .is_some_and(|j| j["config"]["generation"] == 1)),
        "the landed rewrite was lost: {:?}",
        d2.jobs()
    );
    let j = &d2.jobs()[0];
    assert_eq!(j["config"]["directives"][0]["changes"][0]["new"], 16, "{j}");
    assert_eq!(j["config"]["knobs"]["micro_batch"], 16, "{j}");
    // The audit log's writer appends a moment after the event is recorded.
    assert!(
        eventually(10.0, || audit("generation 1, written before a restart")),
        "{:?}",
        d2.events()
    );

    // Killed before the rename: the journal says generation 2, the file never got it.
    d2.wait_guardian_pid();
    d2.crash(true);
    intent(2, 8, 8, (16, 4));
    let d3 = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        state: Some(state.clone()),
        ..Opts::default()
    });
    assert!(
        eventually(10.0, || audit(
            "generation 2 was journaled before a restart but never reached"
        )),
        "{:?}",
        d3.events()
    );
    let j = &d3.jobs()[0];
    assert_eq!(j["config"]["generation"], 1, "{j}");
    assert_eq!(j["config"]["knobs"]["micro_batch"], 16, "{j}");
    let _ = job.kill();
    let _ = job.wait();
}
