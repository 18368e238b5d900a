//! memwatch-train against the real daemon (fixture host, fake NVML): a GPU filling up makes memwatch
//! rewrite the batch, which the trainer applies at its next epoch boundary; a hot GPU pauses it and
//! cooling resumes it; it finishes every epoch with a clearly lower loss. Needs `--features trainer`.
#![cfg(feature = "trainer")]

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Daemon, Opts, eventually, proc_state};

fn gpu(used: u64, temp: u32, pid: u32) -> String {
    format!(
        r#"{{"devices":[{{"name":"Fake","uuid":"GPU-train","memory_total":20000000000,"memory_used":{used},
        "temperature":{temp},"threshold_slowdown":90,"threshold_shutdown":98,
        "processes":[{{"pid":{pid},"used_memory":{used}}}]}}]}}"#
    )
}

#[test]
fn the_trainer_adapts_pauses_resumes_and_learns() {
    // A calm host: the fixture with plenty of RAM available and no swap in use.
    let host = tempfile::tempdir().unwrap();
    common::copy_tree(&common::fixture_root(), host.path());
    let meminfo = std::fs::read_to_string(host.path().join("proc/meminfo")).unwrap();
    std::fs::write(
        host.path().join("proc/meminfo"),
        meminfo
            .replace("MemAvailable:    1468006 kB", "MemAvailable:   28000000 kB")
            .replace("SwapFree:        2064384 kB", "SwapFree:        4194304 kB"),
    )
    .unwrap();
    let gpu_json = gpu(8_000_000_000, 50, 1);
    let d = Daemon::start(Opts {
        root: host.path().to_owned(),
        gpu_state: Some(&gpu_json),
        extra_config: "[policy.gpu_temperature]\naction = \"pause\"\nwarn_below_slowdown = 3.0\ncritical_below_shutdown = 5.0\n\
                       resume_below_slowdown = 5.0\nfallback_slowdown_celsius = 87.0\nfallback_shutdown_celsius = 95.0\n\
                       enter_hold_ms = 0\nleave_hold_ms = 1000\n",
        ..Opts::default()
    });

    let dir = d.dir.path();
    std::fs::copy(
        common::repo().join("trainer/corpus.txt"),
        dir.join("corpus.txt"),
    )
    .unwrap();
    let config = std::fs::read_to_string(common::repo().join("trainer/memwatch-train.toml"))
        .unwrap()
        .replace("epochs = 8", "epochs = 10")
        .replace("steps_per_epoch = 20", "steps_per_epoch = 30")
        .replace(
            "url = \"http://127.0.0.1:9300\"",
            &format!("url = \"{}\"", d.url()),
        )
        .replace(
            "socket = \"/run/memwatch/control.sock\"",
            &format!("socket = {:?}", d.socket),
        );
    let cfg = dir.join("memwatch-train.toml");
    std::fs::write(&cfg, &config).unwrap();
    let log = dir.join("log.json");
    let mut trainer = Command::new(env!("CARGO_BIN_EXE_memwatch-train"))
        .args([
            "--config",
            cfg.to_str().unwrap(),
            "--log-json",
            log.to_str().unwrap(),
        ])
        .stdout(Stdio::inherit())
        .spawn()
        .unwrap();
    let pid = trainer.id();
    assert!(
        eventually(20.0, || d.job_state("memwatch-train").is_some()),
        "the trainer did not register"
    );
    d.set_gpu_state(&gpu(8_000_000_000, 50, pid));
    let job = || d.jobs().into_iter().find(|j| j["name"] == "memwatch-train");
    assert!(
        eventually(30.0, || job().is_some_and(
            |j| j["config"]["progress"]["epoch"].as_u64() >= Some(1)
        )),
        "no progress reported"
    );

    // 1. The GPU fills up mid-epoch: memwatch halves the micro-batch and doubles accumulation.
    d.set_gpu_state(&gpu(19_000_000_000, 50, pid));
    assert!(
        eventually(10.0, || job()
            .is_some_and(|j| j["config"]["generation"] == 1)),
        "no rewrite staged"
    );
    d.set_gpu_state(&gpu(8_000_000_000, 50, pid));
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(
        text.contains("micro_batch = 16\n") && text.contains("accumulation = 4\n"),
        "{text}"
    );
    assert!(
        text.contains("# Optimizer steps per epoch."),
        "comments survive the rewrite"
    );
    assert!(
        eventually(30.0, || job()
            .is_some_and(|j| j["config"]["applied_generation"] == 1)),
        "never acknowledged"
    );

    // 2. The GPU overheats: the trainer is paused; it cools: the trainer resumes.
    d.set_gpu_state(&gpu(8_000_000_000, 96, pid));
    assert!(
        eventually(10.0, || proc_state(pid) == Some('T')),
        "not paused at 96 °C"
    );
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(proc_state(pid), Some('T'), "resumed while still hot");
    d.set_gpu_state(&gpu(8_000_000_000, 60, pid));
    assert!(
        eventually(10.0, || proc_state(pid).is_some_and(|s| s != 'T')),
        "not resumed after cooling"
    );

    // 3. It finishes every epoch, and learned.
    let status = trainer.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let out: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&log).unwrap()).unwrap();
    let (first, last) = (
        out["initial_loss"].as_f64().unwrap(),
        out["final_loss"].as_f64().unwrap(),
    );
    assert!(last < first * 0.8, "loss {first:.3} → {last:.3}");
    let steps = out["steps"].as_array().unwrap();
    let epochs: std::collections::BTreeSet<u64> =
        steps.iter().map(|s| s["epoch"].as_u64().unwrap()).collect();
    assert_eq!(epochs.len(), 10, "every epoch ran");
    let switched = steps
        .iter()
        .position(|s| s["micro"] == 16)
        .expect("the new batch was used");
    let boundary = &steps[switched];
    assert_eq!(
        boundary["step"], 0,
        "the batch changed mid-epoch: {boundary}"
    );
    for s in steps {
        assert_eq!(
            s["micro"].as_u64().unwrap() * s["accum"].as_u64().unwrap(),
            64,
            "the effective batch changed: {s}"
        );
    }
    assert!(
        steps[switched..].iter().all(|s| s["micro"] == 16),
        "went back to the old batch"
    );
    assert!(dir.join("checkpoints/latest.ot").exists());
}
