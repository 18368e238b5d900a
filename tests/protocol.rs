//! The trainer's side of the protocol beyond the epoch boundary: an acknowledgement memwatch checks
//! against what it sees, an answer that a change cannot be applied, and the token handed to a trainer
//! someone else attached.

mod common;

use std::process::Command;

use common::{Daemon, Opts, eventually};

/// Verify, don't trust: a trainer in a memory cgroup at warn gets "workers 4 → 2". The honest one stops
/// two workers and acknowledges: verified. The one that only acknowledges keeps 4 workers alive: after
/// `verify_seconds` the change is marked unverified (API, event, metric). The one that cannot apply it
/// says so: declined, with its reason, and nothing is left pending.
#[test]
fn an_acknowledged_change_that_did_not_happen_is_caught() {
    for mode in ["honest", "liar", "decline"] {
        let d = Daemon::start(Opts {
            root: "/".into(),
            gpu_state: None,
            extra_config: "[adapt]\nverify_seconds = 2\n",
            ..Opts::default()
        });
        let cfg = d.dir.path().join("train.json");
        std::fs::write(
            &cfg,
            "{\"train\": {\"workers\": 4, \"pin_memory\": true}}\n",
        )
        .unwrap();
        let cg = common::cgroup::MemCgroup::new(256 << 20).expect("a memory cgroup (needs root)");
        let mut trainer = cg.spawn(
            std::path::Path::new("/usr/bin/python3"),
            &[
                common::repo()
                    .join("tests/trainer/workers.py")
                    .to_str()
                    .unwrap(),
                cfg.to_str().unwrap(),
                d.socket.to_str().unwrap(),
                &d.url(),
                "205",
                mode,
            ],
        );
        let directive = |d: &Daemon| {
            d.jobs()
                .first()
                .map(|j| j["config"]["directives"][0].clone())
                .unwrap_or_default()
        };
        let done = |v: &serde_json::Value| match mode {
            "honest" => v["verification"]["state"] == "verified",
            "liar" => v["verification"]["state"] == "unverified",
            _ => v["declined"].is_string(),
        };
        assert!(
            eventually(30.0, || done(&directive(&d))),
            "{mode}: {:?}",
            d.jobs()
        );
        let v = directive(&d);
        assert!(v["changes"].to_string().contains("workers"), "{v}");
        // /metrics renders the snapshot published after the engine's change: wait for it.
        let unverified = "memwatch_job_config_unverified_changes{job_name=\"workers\"} 1\n";
        assert!(
            eventually(5.0, || d.metrics().contains(unverified) == (mode == "liar")),
            "{mode}: {}",
            d.metrics()
        );
        if mode == "decline" {
            assert_eq!(v["declined"], "workers are fixed until the next start");
            let pending = "memwatch_job_config_pending_changes{job_name=\"workers\"} 0\n";
            assert!(
                eventually(5.0, || d.metrics().contains(pending)),
                "{}",
                d.metrics()
            );
            d.wait_event("the declined event", |e| e["action"] == "declined");
        }
        let _ = trainer.kill();
        let _ = trainer.wait();
        let _ = Command::new("pkill")
            .args(["-KILL", "-f", "tests/trainer/workers.py"])
            .status();
        drop(cg);
    }
}

/// `attach --token-file` hands the token to a trainer someone else attached: a private file with the
/// token that the trainer endpoints take. A path through a link is refused before anything is attached,
/// and a refused attach leaves no file.
#[test]
fn attach_writes_the_token_to_a_private_file() {
    use std::os::unix::fs::PermissionsExt;
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        ..Opts::default()
    });
    let dir = d.dir.path();
    let cfg = dir.join("ds.json");
    std::fs::write(&cfg, "{\"train_micro_batch_size_per_gpu\": 4}").unwrap();
    let mut s = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = s.id().to_string();
    let attach = |name: &str, config: &std::path::Path, token_file: &std::path::Path| {
        d.ctl(&[
            "attach",
            &pid,
            "--name",
            name,
            "--config-file",
            config.to_str().unwrap(),
            "--profile",
            "deepspeed",
            "--token-file",
            token_file.to_str().unwrap(),
        ])
    };
    // Through a link: refused, nothing attached.
    std::os::unix::fs::symlink(dir.join("elsewhere"), dir.join("link")).unwrap();
    let (code, _, err) = attach("t", &cfg, &dir.join("link"));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot create the token file"), "{err}");
    assert!(d.jobs().is_empty());
    assert!(!dir.join("elsewhere").exists());
    // A refused attach leaves no token file.
    let (code, _, _) = attach("t", &dir.join("missing.json"), &dir.join("token"));
    assert_ne!(code, 0);
    assert!(!dir.join("token").exists());
    // Attached: the file is private and its token works.
    let (code, _, err) = attach("t", &cfg, &dir.join("token"));
    assert_eq!(code, 0, "{err}");
    let meta = std::fs::metadata(dir.join("token")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let token = std::fs::read_to_string(dir.join("token")).unwrap();
    let token = token.trim();
    assert_eq!(token.len(), 32, "{token}");
    let (status, body) = d.request(&format!(
        "GET /api/v1/jobs/t/directives HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    ));
    assert_eq!(status, 200, "{body}");
    let _ = s.kill();
    let _ = s.wait();
}
