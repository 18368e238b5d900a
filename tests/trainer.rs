//! memwatch-train against the real daemon (fixture host, fake NVML): a GPU filling up makes memwatch
//! rewrite the batch, which the trainer applies at its next epoch boundary; a hot GPU pauses it and
//! cooling resumes it; it finishes every epoch with a clearly lower loss. And an out-of-memory error
//! inside a step costs that step, not the run: the trainer halves its micro-batch, keeps the result
//! exact, reports it, and at its smallest micro-batch checkpoints and stops. Needs `--features trainer`.
#![cfg(feature = "trainer")]

mod common;
#[path = "trainer/fake.rs"]
mod fake;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Daemon, Opts, eventually, proc_state};

/// The tests here take turns: each runs trainers that keep the cores busy, and the deadlines of the
/// first (and the memory measured by the allocation-failure test) assume the machine to themselves.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn gpu(used: u64, temp: u32, pid: u32) -> String {
    format!(
        r#"{{"devices":[{{"name":"Fake","uuid":"GPU-train","memory_total":20000000000,"memory_used":{used},
        "temperature":{temp},"threshold_slowdown":90,"threshold_shutdown":98,
        "processes":[{{"pid":{pid},"used_memory":{used}}}]}}]}}"#
    )
}

#[test]
fn the_trainer_adapts_pauses_resumes_and_learns() {
    let _turn = turn();
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

/// One memwatch-train run on CPU in a directory of its own: 2 epochs of 5 steps at `micro` ×
/// `accum` (plus `extra` appended to the config), alone or with a stand-in for the daemon.
struct Run {
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Run {
    fn new(micro: i64, accum: i64, steps: u64, extra: &str) -> Run {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(
            common::repo().join("trainer/corpus.txt"),
            dir.path().join("corpus.txt"),
        )
        .unwrap();
        let config = std::fs::read_to_string(common::repo().join("trainer/memwatch-train.toml"))
            .unwrap()
            .replace("micro_batch = 32", &format!("micro_batch = {micro}"))
            .replace("accumulation = 2", &format!("accumulation = {accum}"))
            .replace("epochs = 8", "epochs = 2")
            .replace(
                "steps_per_epoch = 20",
                &format!("steps_per_epoch = {steps}"),
            )
            .replace("\n[model]", &format!("{extra}\n[model]"));
        let path = dir.path().join("memwatch-train.toml");
        std::fs::write(&path, config).unwrap();
        Run { dir, config: path }
    }

    fn edit(&self, from: &str, to: &str) {
        let text = std::fs::read_to_string(&self.config).unwrap();
        assert!(text.contains(from), "{from:?} not in the config");
        std::fs::write(&self.config, text.replacen(from, to, 1)).unwrap();
    }

    fn point_at(&self, d: &fake::Daemon) {
        let text = std::fs::read_to_string(&self.config)
            .unwrap()
            .replace(
                "url = \"http://127.0.0.1:9300\"",
                &format!("url = {:?}", d.url),
            )
            .replace(
                "socket = \"/run/memwatch/control.sock\"",
                &format!("socket = {:?}", d.socket),
            );
        std::fs::write(&self.config, text).unwrap();
    }

    /// Runs the trainer to its end (at most 3 minutes: a trainer that loops fails the test).
    fn go(&self, memwatch: bool, env: &[(&str, &str)]) -> std::process::ExitStatus {
        let log = self.dir.path().join("log.json");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_memwatch-train"));
        cmd.args(["--config", self.config.to_str().unwrap()])
            .args(["--log-json", log.to_str().unwrap()])
            .envs(env.iter().copied())
            .stdout(Stdio::null());
        if !memwatch {
            cmd.arg("--no-memwatch");
        }
        let mut child = cmd.spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("memwatch-train ran for 3 minutes: it loops");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn steps(&self) -> Vec<serde_json::Value> {
        let log = std::fs::read_to_string(self.dir.path().join("log.json")).unwrap();
        let log: serde_json::Value = serde_json::from_str(&log).unwrap();
        log["steps"].as_array().unwrap().clone()
    }

    fn checkpoint(&self) -> Vec<(String, tch::Tensor)> {
        let mut w = tch::Tensor::load_multi(self.dir.path().join("checkpoints/latest.ot")).unwrap();
        w.sort_by(|a, b| a.0.cmp(&b.0));
        w
    }
}

/// How far apart two checkpoints' weights are: the norm of the difference relative to the second's
/// (over all weights), and the largest difference of one weight.
fn distance(a: &[(String, tch::Tensor)], b: &[(String, tch::Tensor)]) -> (f64, f64) {
    assert_eq!(
        a.iter().map(|x| &x.0).collect::<Vec<_>>(),
        b.iter().map(|x| &x.0).collect::<Vec<_>>()
    );
    let (mut diff, mut norm, mut max) = (0.0, 0.0, 0.0f64);
    for ((_, x), (_, y)) in a.iter().zip(b) {
        let d = (x - y).to_kind(tch::Kind::Double);
        diff += d.square().sum(tch::Kind::Double).double_value(&[]);
        norm += y.square().sum(tch::Kind::Double).double_value(&[]);
        max = max.max(d.abs().max().double_value(&[]));
    }
    ((diff / norm).sqrt(), max)
}

/// A run that recovered from an out-of-memory error and one that ran at the smaller micro-batch from
/// the start see the same samples in the same order, each weighted the same: their weights differ
/// only by float rounding, where a step's gradient was summed over other cuts of the same samples.
/// AdamW divides each weight's step by that weight's own running gradient scale, so a weight whose
/// gradient is all but zero can turn its step around on a rounding difference: a few weights in a
/// thousand end up to about the learning rate (0.003) apart, the rest far closer. Measured over 10
/// steps (122,543 weights): 2.9e-5 relative, 1.6e-3 at most, from rounding; 4.5e-3 to 7.1e-3
/// relative, 2.5e-2 at most, when the recovery counted the failed micro-batch twice or lost the
/// step's earlier micro-batches. The bounds sit between: 3e-4 relative (10 times the rounding's, 15
/// times below the errors'), and 1e-2 for one weight (3 times the learning rate).
const RELATIVE_TOLERANCE: f64 = 3e-4;
const ABSOLUTE_TOLERANCE: f64 = 1e-2;

fn assert_exact(run: &Run, reference: &Run, what: &str) {
    let (relative, max) = distance(&run.checkpoint(), &reference.checkpoint());
    eprintln!("{what}: weights {relative:e} apart (relative), {max:e} at most");
    assert!(
        relative <= RELATIVE_TOLERANCE && max <= ABSOLUTE_TOLERANCE,
        "{what}: weights {relative} apart (> {RELATIVE_TOLERANCE}) or {max} at most (> {ABSOLUTE_TOLERANCE})"
    );
}

/// The log's steps: each of micro × accumulation = 16, the first `big` at micro-batch 8, the others
/// at 4 (also after the epoch boundary, which re-reads the config), one out-of-memory error at
/// epoch 0, step 1.
fn assert_halved(steps: &[serde_json::Value], big: usize) {
    assert_eq!(steps.len(), 10, "every step ran: {steps:?}");
    for (i, s) in steps.iter().enumerate() {
        assert_eq!(
            s["micro"].as_i64().unwrap() * s["accum"].as_i64().unwrap(),
            16,
            "{s}"
        );
        assert_eq!(s["micro"], if i < big { 8 } else { 4 }, "{s}");
        assert_eq!(s["oom"], if i == 1 { 1 } else { 0 }, "{s}");
    }
}

/// The reference: micro-batch 4 and accumulation 4 from the start.
fn reference() -> Run {
    let r = Run::new(4, 4, 5, "");
    assert!(r.go(false, &[]).success());
    r
}

#[test]
fn an_oom_in_the_forward_pass_costs_the_step_not_the_run() {
    let _turn = turn();
    // Step 0 runs both micro-batches of 8; step 1's second one fails in the forward pass.
    let run = Run::new(
        8,
        2,
        5,
        "\n[fault]\noom_above_micro_batch = 4\nphase = \"forward\"\nafter_micro_batches = 3\n",
    );
    let daemon = fake::Daemon::start(run.dir.path(), 404);
    run.point_at(&daemon);
    let status = run.go(true, &[]);
    assert!(status.success(), "{status:?}");
    assert_halved(&run.steps(), 1);

    // Reported, with the job's token; the daemon's 404 (no such endpoint yet) did not stop it.
    let ooms = daemon.ooms();
    assert_eq!(ooms.len(), 1, "{ooms:?}");
    let (auth, body) = &ooms[0];
    assert_eq!(auth.as_deref(), Some(&*format!("Bearer {}", fake::TOKEN)));
    let expected = serde_json::json!({
        "epoch": 0, "step": 1, "phase": "forward", "micro_batch_before": 8, "recovered": true,
        "micro_batch_after": 4, "accumulation_after": 4, "min_micro_batch": 1,
        "checkpointed": false, "requested_bytes": 8 << 20,
    });
    for (k, v) in expected.as_object().unwrap() {
        assert_eq!(&body[k], v, "{k} in {body}");
    }
    assert!(body.get("device").is_none(), "no CUDA device: {body}");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.starts_with("CUDA out of memory. Tried to allocate 8.00 MiB"),
        "{message}"
    );
    assert!(!message.contains('\n') && message.len() <= 500);

    assert_exact(&run, &reference(), "forward");
}

#[test]
fn an_oom_in_the_backward_pass_after_the_gradient_accumulated_is_exact() {
    let _turn = turn();
    // Step 1's second micro-batch fails after its backward pass ran: every parameter holds its
    // gradient and the first micro-batch's. The step runs again from its start at 4.
    let run = Run::new(
        8,
        2,
        5,
        "\n[fault]\noom_above_micro_batch = 4\nphase = \"backward\"\nafter_micro_batches = 3\n",
    );
    let status = run.go(false, &[]);
    assert!(status.success(), "{status:?}");
    assert_halved(&run.steps(), 1);
    assert_exact(&run, &reference(), "backward");
}

#[test]
fn an_oom_at_the_smallest_micro_batch_checkpoints_and_stops() {
    let _turn = turn();
    // Two steps at 8 × 2, then step 2 fails at 8, 4 and 2, the smallest allowed.
    let run = Run::new(
        8,
        2,
        5,
        "\n[fault]\noom_above_micro_batch = 1\nafter_micro_batches = 4\n",
    );
    run.edit("min_micro_batch = 1", "min_micro_batch = 2");
    let daemon = fake::Daemon::start(run.dir.path(), 200);
    run.point_at(&daemon);
    let t = Instant::now();
    let status = run.go(true, &[]);
    // Ended by SIGTERM, as `memwatch launch` relaunches a job a signal ended.
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(15), "{status:?}");
    assert!(t.elapsed() < Duration::from_secs(60), "{:?}", t.elapsed());
    assert_eq!(run.steps().len(), 2);

    let reports: Vec<_> = daemon.ooms().into_iter().map(|(_, b)| b).collect();
    assert_eq!(reports.len(), 3, "{reports:?}");
    for (r, (before, after)) in reports.iter().zip([(8, Some(4)), (4, Some(2)), (2, None)]) {
        assert_eq!(r["step"], 2, "{r}");
        assert_eq!(r["micro_batch_before"], before, "{r}");
        assert_eq!(r["recovered"], after.is_some(), "{r}");
        assert_eq!(
            r.get("micro_batch_after").and_then(|v| v.as_i64()),
            after,
            "{r}"
        );
        assert_eq!(r["checkpointed"], after.is_none(), "{r}");
        assert_eq!(r["min_micro_batch"], 2, "{r}");
    }

    // The checkpoint: the weights after steps 0 and 1, to go on from step 2 of epoch 0.
    let meta: serde_json::Value = serde_json::from_slice(
        &std::fs::read(run.dir.path().join("checkpoints/latest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(meta["epoch"], 0, "{meta}");
    assert_eq!(meta["step"], 2, "{meta}");
    let two = Run::new(8, 2, 2, "");
    two.edit("epochs = 2", "epochs = 1");
    assert!(two.go(false, &[]).success());
    assert_exact(&run, &two, "checkpoint");

    // Relaunched (MEMWATCH_RESUME=1) with room again, it goes on from there to the end.
    let config = std::fs::read_to_string(&run.config).unwrap();
    let cut = config.find("\n[fault]").unwrap();
    let end = config[cut + 1..]
        .find("\n[")
        .map_or(config.len(), |i| cut + 1 + i);
    std::fs::write(&run.config, format!("{}{}", &config[..cut], &config[end..])).unwrap();
    let status = run.go(false, &[("MEMWATCH_RESUME", "1")]);
    assert!(status.success(), "{status:?}");
    let steps = run.steps();
    assert_eq!(steps.len(), 8, "{steps:?}");
    assert_eq!(
        (steps[0]["epoch"].clone(), steps[0]["step"].clone()),
        (0.into(), 2.into())
    );
}

/// A real allocation failure: the trainer caps its own address space (`[fault]
/// address_space_headroom_mib`) once libtorch is loaded and has run, so that a micro-batch of 32
/// windows of 256 characters fails in libtorch's CPU allocator and one of 16 fits (measured: 32
/// fails below about 240 MiB of headroom, 16 fits above about 100). glibc is told to map every large
/// block afresh and to keep one arena, so that freed memory does not linger and fragment the room,
/// and libtorch to use 2 threads, whatever the machine.
#[test]
fn a_real_allocation_failure_is_recovered_and_exact() {
    let _turn = turn();
    const ENV: [(&str, &str); 3] = [
        ("MALLOC_MMAP_THRESHOLD_", "131072"),
        ("MALLOC_ARENA_MAX", "1"),
        ("OMP_NUM_THREADS", "2"),
    ];
    let run = Run::new(32, 2, 3, "\n[fault]\naddress_space_headroom_mib = 160\n");
    run.edit("seq_len = 32", "seq_len = 256");
    let daemon = fake::Daemon::start(run.dir.path(), 200);
    run.point_at(&daemon);
    let status = run.go(true, &ENV);
    assert!(status.success(), "{status:?}");

    let steps = run.steps();
    assert_eq!(steps.len(), 6, "every step ran: {steps:?}");
    assert!(
        steps[0]["oom"].as_u64() >= Some(1),
        "no out-of-memory error at 32: {}",
        steps[0]
    );
    let mut micro = 32;
    for s in &steps {
        assert_eq!(
            s["micro"].as_i64().unwrap() * s["accum"].as_i64().unwrap(),
            64,
            "{s}"
        );
        assert!(
            s["micro"].as_i64().unwrap() <= micro,
            "the micro-batch grew again: {s}"
        );
        micro = s["micro"].as_i64().unwrap();
    }
    assert!(micro < 32);
    let reports: Vec<_> = daemon.ooms().into_iter().map(|(_, b)| b).collect();
    assert!(!reports.is_empty());
    let first = &reports[0];
    assert_eq!(first["micro_batch_before"], 32, "{first}");
    assert_eq!(first["recovered"], true, "{first}");
    let message = first["message"].as_str().unwrap();
    assert!(
        message.contains("DefaultCPUAllocator: can't allocate memory"),
        "{message}"
    );
    assert!(first["requested_bytes"].as_u64() > Some(0), "{first}");

    // The reference runs at the micro-batch the run ended with, from the start, without a cap.
    let reference = Run::new(micro, 64 / micro, 3, "");
    reference.edit("seq_len = 32", "seq_len = 256");
    assert!(reference.go(false, &ENV).success());
    assert_exact(&run, &reference, "allocation failure");
}
