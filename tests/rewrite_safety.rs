//! The safe rewriter, as `memwatch rewrite` uses it: a writer killed at any instant leaves the old
//! file or the new one, a reader never sees a half-written file, and comments survive in every format.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::memwatch;

#[test]
fn a_writer_killed_at_any_point_leaves_the_old_file_or_the_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("ds.json");
    let old = "{\n  \"train_micro_batch_size_per_gpu\": 32,\n  \"gradient_accumulation_steps\": 2,\n  \"pad\": \"".to_owned() + &"x".repeat(200_000) + "\"\n}\n";
    std::fs::write(&f, &old).unwrap();
    let mut seen_old = 0;
    let mut seen_new = 0;
    // Every run starts from the old file (32, 2) and asks for (16, 4): "new" means that run's rewrite
    // completed, "old" that it did not; neither can be left over from an earlier run.
    let (a, b) = (16, 4);
    let rewrite = || {
        Command::new(common::bin())
            .args([
                "rewrite",
                f.to_str().unwrap(),
                "--set",
                &format!("train_micro_batch_size_per_gpu={a}"),
                "--set",
                &format!("gradient_accumulation_steps={b}"),
            ])
            .stdout(Stdio::null())
            .spawn()
            .unwrap()
    };
    // How long one whole rewrite takes here: the kills are spread from its start to past its end.
    let started = std::time::Instant::now();
    assert!(rewrite().wait().unwrap().success());
    let whole = (started.elapsed().as_micros() as u64 * 3 / 2).max(1000);
    for i in 0..150u64 {
        std::fs::write(&f, &old).unwrap();
        let mut child = rewrite();
        std::thread::sleep(Duration::from_micros((i * 7919) % whole));
        let _ = child.kill();
        let _ = child.wait();
        let text = std::fs::read_to_string(&f).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("run {i}: broken file: {e}"));
        let pair = (
            v["train_micro_batch_size_per_gpu"].as_u64().unwrap(),
            v["gradient_accumulation_steps"].as_u64().unwrap(),
        );
        assert!(pair == (32, 2) || pair == (16, 4), "run {i}: {pair:?}");
        if pair == (a, b) {
            seen_new += 1
        } else {
            seen_old += 1
        }
        assert_eq!(v["pad"].as_str().unwrap().len(), 200_000);
    }
    eprintln!("killed writers: {seen_old} left the old file, {seen_new} the new one");
    // Both outcomes happened: some kills landed before the rename, some after.
    assert!(
        seen_old > 0 && seen_new > 0,
        "old {seen_old}, new {seen_new}"
    );
}

/// Whoever reads a config file while memwatch rewrites it reads the whole old file or the whole new one,
/// never an empty or half-written one: the rewrite puts a complete file in place by a rename, it never
/// writes into the file a trainer reads. (A kill lands mid-write too rarely to show this; a reader
/// reading back to back does.)
#[test]
fn a_reader_never_sees_a_half_written_file() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("ds.json");
    let pad = "x".repeat(400_000);
    std::fs::write(
        &f,
        format!("{{\n  \"train_micro_batch_size_per_gpu\": 32,\n  \"gradient_accumulation_steps\": 2,\n  \"pad\": \"{pad}\"\n}}\n"),
    )
    .unwrap();
    let rewrite = |micro: u32, accumulation: u32| {
        let out = Command::new(common::bin())
            .args([
                "rewrite",
                f.to_str().unwrap(),
                "--set",
                &format!("train_micro_batch_size_per_gpu={micro}"),
                "--set",
                &format!("gradient_accumulation_steps={accumulation}"),
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        std::fs::read_to_string(&f).unwrap()
    };
    // The two files the rewrites alternate between, exactly as memwatch writes them.
    let small = rewrite(16, 4);
    let large = rewrite(32, 2);
    assert_ne!(small, large);
    let stop = AtomicBool::new(false);
    let (reads, torn) = std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            let (mut reads, mut torn) = (0u64, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                match std::fs::read_to_string(&f) {
                    Ok(text) if text == small || text == large => {}
                    Ok(text) => torn.push(format!("{} bytes", text.len())),
                    Err(e) => torn.push(e.to_string()),
                }
                reads += 1;
            }
            (reads, torn)
        });
        for i in 0..60 {
            let text = if i % 2 == 0 {
                rewrite(16, 4)
            } else {
                rewrite(32, 2)
            };
            assert!(text == small || text == large);
        }
        stop.store(true, Ordering::Relaxed);
        reader.join().unwrap()
    });
    eprintln!("{reads} reads during 60 rewrites, {} torn", torn.len());
    assert!(reads >= 60, "the reader read only {reads} times");
    assert!(torn.is_empty(), "read a file that was neither: {torn:?}");
}

#[test]
fn rewrite_keeps_comments_in_every_format() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "hf.yaml",
            "# HF TrainingArguments\nper_device_train_batch_size: 32  # tuned\ngradient_accumulation_steps: 2\ndataloader_num_workers: 8\ndataloader_pin_memory: true\n",
            "dataloader_num_workers=0",
            "dataloader_num_workers: 0\n",
        ),
        (
            "t.toml",
            "[train]\n# per device\nbatch = 32\n",
            "train.batch=16",
            "batch = 16\n",
        ),
        (
            "ds.json",
            "{\"train_micro_batch_size_per_gpu\": 32, \"zero_optimization\": {\"stage\": 2}}",
            "zero_optimization.stage=3",
            "\"stage\": 3}",
        ),
    ];
    for (name, text, set, want) in cases {
        let f = dir.path().join(name);
        std::fs::write(&f, text).unwrap();
        let (code, out, err) = memwatch(&["rewrite", f.to_str().unwrap(), "--set", set]);
        assert_eq!(code, 0, "{name}: {err}");
        assert!(out.contains("→"), "{out}");
        let new = std::fs::read_to_string(&f).unwrap();
        assert!(new.contains(want), "{name}: {new}");
        let old_lines: Vec<&str> = text.lines().collect();
        let changed = new.lines().zip(&old_lines).filter(|(a, b)| a != *b).count();
        assert_eq!(changed, 1, "{name}: only one line may change:\n{new}");
    }
    let (code, _, err) = memwatch(&[
        "rewrite",
        dir.path().join("t.toml").to_str().unwrap(),
        "--set",
        "train.nope=1",
    ]);
    assert_eq!(code, 1);
    assert!(err.contains("not in the file"), "{err}");
    // A bare file name, from its directory: rewritten, exit 0 (the directory fsync once got "").
    let out = std::process::Command::new(common::bin())
        .args(["rewrite", "t.toml", "--set", "train.batch=8"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let new = std::fs::read_to_string(dir.path().join("t.toml")).unwrap();
    assert!(new.contains("batch = 8\n"), "{new}");
}
