//! `scripts/gpu-check.sh` runs only where a real NVIDIA GPU is; its checks (`scripts/gpu-check-lib.sh`)
//! run here, on figures given to them: each passes on a right figure and fails on a wrong one, naming
//! what it compared, and `summary` exits non-zero naming every failed check. A check that cannot run
//! fails unless `GPU_CHECK_SKIP` names it.

mod common;

use std::process::Command;

/// Runs `SCRIPT` in bash after sourcing the checks; returns (exit code, stdout).
fn checks(script: &str, skip: &str) -> (i32, String) {
    let lib = common::repo().join("scripts/gpu-check-lib.sh");
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(". '{}'\n{script}\nsummary", lib.display()))
        .env("GPU_CHECK_SKIP", skip)
        .output()
        .expect("run bash");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn each_check_passes_a_right_figure_and_fails_a_wrong_one_by_name() {
    // Right figures: memory within 2 % + 256 MiB, a temperature within 3 °C, the same count, every
    // process stopped, GPU memory above nothing.
    let (code, out) = checks(
        "near nvml-memory-used 41000000000 40500000000 2 268435456\n\
         near nvml-temperature 44 46 0 3\n\
         equal nvml-count 8 8\n\
         all_states hand-pause 'T|t' '10:T 11:T 12:t'\n\
         above trainer-cuda 812 0",
        "",
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(out.matches("PASS ").count(), 5, "{out}");
    assert!(out.contains("every check passed"), "{out}");

    // Wrong figures, one per check: each fails, by name, saying what it compared.
    let (code, out) = checks(
        "near nvml-memory-used 45000000000 40500000000 2 268435456\n\
         near nvml-temperature 52 46 0 3\n\
         equal nvml-count 7 8\n\
         all_states hand-pause 'T|t' '10:T 11:S 12:T'\n\
         above trainer-cuda 0 0\n\
         near job-gpu-memory '' 1073741824 2",
        "",
    );
    assert_eq!(code, 1, "{out}");
    for (name, says) in [
        (
            "nvml-memory-used",
            "memwatch 45000000000, reference 40500000000: off by more than 2 %",
        ),
        ("nvml-temperature", "memwatch 52, reference 46"),
        ("nvml-count", "got '7', want '8'"),
        ("hand-pause", "not in state T|t: 11:S"),
        ("trainer-cuda", "0, not above 0"),
        ("job-gpu-memory", "not figures: memwatch said ''"),
    ] {
        assert!(
            out.contains(&format!("FAIL {name}: {says}")),
            "{name}: {says}\n{out}"
        );
    }
    assert!(
        out.contains(
            "6 failed: nvml-memory-used nvml-temperature nvml-count hand-pause trainer-cuda job-gpu-memory"
        ),
        "{out}"
    );
}

#[test]
fn a_check_that_cannot_run_fails_unless_named() {
    let (code, out) = checks("not_run trainer 'no memwatch-train'", "");
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FAIL trainer: not run: no memwatch-train (GPU_CHECK_SKIP=trainer allows it)"),
        "{out}"
    );
    let (code, out) = checks("not_run trainer 'no memwatch-train'", "systemd,trainer");
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("SKIP trainer: no memwatch-train (allowed by GPU_CHECK_SKIP)"),
        "{out}"
    );
}
