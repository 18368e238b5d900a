//! `memwatch check` when nothing fits, through the real binary: the notes name the real blocker, and
//! every change they suggest, given back to `memwatch check`, fits.

mod common;

use common::memwatch;

/// Qwen2.5-7B's config.json (the fields `check` reads).
const QWEN_7B: &str = r#"{
  "architectures": ["Qwen2ForCausalLM"],
  "model_type": "qwen2",
  "hidden_size": 3584,
  "intermediate_size": 18944,
  "max_position_embeddings": 32768,
  "num_attention_heads": 28,
  "num_hidden_layers": 28,
  "num_key_value_heads": 4,
  "tie_word_embeddings": false,
  "vocab_size": 152064
}"#;

/// The word after `flag` in the first note that suggests it.
fn suggested<'a>(out: &'a str, flag: &str) -> &'a str {
    let at = out
        .find(&format!("would fit with {flag} "))
        .or_else(|| out.find(&format!("({flag} ")))
        .unwrap_or_else(|| panic!("no {flag} suggested:\n{out}"));
    let rest = &out[at..];
    let after = &rest[rest.find(flag).unwrap_or(0) + flag.len() + 1..];
    after.split([' ', ':', ')']).next().unwrap_or("")
}

#[test]
fn qwen_7b_on_a_small_host_names_host_ram_at_load_and_fixes_that_fit() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    std::fs::write(&config, QWEN_7B).unwrap();
    let config = config.to_str().unwrap();
    let args = |extra: &[&str]| {
        let mut a = vec![
            "--config",
            "/dev/null",
            "check",
            "--model-config",
            config,
            "--gpu-memory-gib",
            "80",
        ];
        a.extend_from_slice(extra);
        memwatch(&a)
    };
    let (code, out, err) = args(&["--gpus", "8", "--ram-gib", "23.5"]);
    assert_eq!(code, 3, "{out}{err}");
    assert!(
        out.contains("model: 7.615e9 parameters on 1 node(s) × 8 GPU(s)"),
        "{out}"
    );
    assert!(
        out.contains(
            "note: nothing fits, and host RAM at load is the blocker, not GPU memory: ZeRO-3 fits the GPUs without offload"
        ),
        "{out}"
    );
    assert!(
        out.contains("each of the 8 local ranks loads the model"),
        "{out}"
    );
    assert!(!out.contains("only with CPU offload"), "{out}");
    assert!(
        out.contains("nothing fits: no config is emitted (exit status 3)"),
        "{out}"
    );
    assert!(!out.contains("train_micro_batch_size_per_gpu"), "{out}");
    assert!(
        err.contains("the model does not fit in any layout"),
        "{err}"
    );

    // The RAM that makes it fit, and the GPUs per node that do: each, given back, fits as ZeRO-3.
    let ram = suggested(&out, "--ram-gib");
    assert_eq!(ram, "24.4", "{out}");
    let gpus = suggested(&out, "--gpus");
    assert_eq!(gpus, "7", "{out}");
    for fixed in [
        ["--gpus", "8", "--ram-gib", ram],
        ["--gpus", gpus, "--ram-gib", "23.5"],
    ] {
        let (code, again, err) = args(&fixed);
        assert_eq!(code, 0, "{fixed:?}:\n{again}{err}");
        assert!(again.contains("  layout: ZeRO-3\n"), "{fixed:?}:\n{again}");
    }
    // The least: 0.1 GiB less RAM does not fit.
    let (code, _, _) = args(&["--gpus", "8", "--ram-gib", "24.3"]);
    assert_eq!(code, 3);

    // The JSON report carries the same notes, and no configs.
    let (code, out, _) = args(&["--gpus", "8", "--ram-gib", "23.5", "--json"]);
    assert_eq!(code, 3);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["report"]["recommendation"]["fits"], false);
    assert!(v["deepspeed"].is_null() && v["accelerate"].is_null());
    let notes = v["report"]["recommendation"]["notes"].to_string();
    assert!(notes.contains("host RAM at load is the blocker"), "{notes}");
    assert!(notes.contains("would fit with --ram-gib 24.4"), "{notes}");
}

/// On a fixture machine running earlyoom (-m 10) and systemd-oomd, `memwatch check` names both and
/// warns that memwatch's default host_memory critical (0.90) pauses no sooner than earlyoom kills,
/// with what to set; with critical 0.85 it says memwatch pauses first. JSON carries the same.
#[test]
fn check_warns_beside_earlyoom_and_names_oomd() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    let write = |rel: &str, text: &[u8]| {
        let p = r.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    let stat = |pid: u32, comm: &str| {
        format!("{pid} ({comm}) S 1 {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 500 0 0\n")
    };
    write(
        "proc/meminfo",
        b"MemTotal: 16777216 kB\nMemFree: 8388608 kB\nMemAvailable: 12582912 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n",
    );
    write("proc/311/stat", stat(311, "systemd-oomd").as_bytes());
    write("proc/311/cmdline", b"/usr/lib/systemd/systemd-oomd\0");
    write("proc/400/stat", stat(400, "earlyoom").as_bytes());
    write("proc/400/cmdline", b"/usr/bin/earlyoom\0-m\x0010\0");
    write(
        "usr/lib/systemd/system/-.slice.d/10-oomd-root-slice-defaults.conf",
        b"[Slice]\nManagedOOMSwap=kill\n",
    );
    let config = |extra: &str| {
        let path = r.join(format!("memwatch{}.toml", extra.len()));
        std::fs::write(
            &path,
            format!("[host]\nroot = {r:?}\nprocess_root = {r:?}\n[gpu]\nenabled = false\n{extra}"),
        )
        .unwrap();
        path.display().to_string()
    };
    let defaults = config("");
    let (code, out, err) = memwatch(&["--config", &defaults, "check"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("beside other OOM killers"), "{out}");
    assert!(
        out.contains("warning: earlyoom runs (pid 400) and kills when MemAvailable falls to 10 %"),
        "{out}"
    );
    assert!(
        out.contains("set [policy.host_memory] critical = 0.85, critical_leave = 0.80"),
        "{out}"
    );
    assert!(
        out.contains("note: systemd-oomd runs (pid 311); it kills whole cgroups under -.slice (ManagedOOMSwap=kill)"),
        "{out}"
    );
    let tuned = config(
        "[policy.host_memory]\nwarn = 0.75\nwarn_leave = 0.70\ncritical = 0.85\ncritical_leave = 0.80\n",
    );
    let (code, out, err) = memwatch(&["--config", &tuned, "check", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let notes = v["oom_killers"]["notes"].as_array().unwrap();
    assert_eq!(v["oom_killers"]["found"]["earlyoom"]["pid"], 400);
    assert!(
        notes.iter().any(|n| n["warning"] == false
            && n["text"]
                .as_str()
                .unwrap_or("")
                .contains("memwatch pauses first, at 85 %")),
        "{notes:?}"
    );
}
