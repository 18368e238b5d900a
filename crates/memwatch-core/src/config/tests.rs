//! The configuration's parsing, defaults, validation and error positions.

use super::*;
use std::path::Path;

#[test]
fn empty_file_is_defaults() {
    assert_eq!(parse("").unwrap(), Config::default());
}

/// The runtime directory is `state` beside the control socket unless it is given: one daemon per
/// socket is one per runtime directory, whatever else a config moves.
#[test]
fn the_runtime_directory_lies_beside_the_socket_unless_given() {
    assert_eq!(
        parse("").unwrap().control.runtime_dir(),
        Path::new("/run/memwatch/state")
    );
    let moved = parse("[control]\nsocket = \"/run/user/1000/mw/control.sock\"\n").unwrap();
    assert_eq!(
        moved.control.runtime_dir(),
        Path::new("/run/user/1000/mw/state")
    );
    let given = parse("[control]\nruntime_dir = \"/dev/shm/mw\"\n").unwrap();
    assert_eq!(given.control.runtime_dir(), Path::new("/dev/shm/mw"));
}

/// A `[policy.X]` table that gives some keys keeps that resource's defaults for the others (not
/// another resource's); a default that no longer fits a given key is said with both values.
#[test]
fn a_policy_table_keeps_the_defaults_of_the_keys_it_does_not_give() {
    let c = parse(
        "[policy.host_memory]\ncritical = 0.92\n[policy.gpu_temperature]\naction = \"warn\"\n",
    )
    .unwrap();
    let d = Policy::default();
    assert_eq!(
        c.policy.host_memory,
        RatioPolicy {
            critical: Ratio(0.92),
            ..d.host_memory.clone()
        }
    );
    assert_eq!(c.policy.swap, d.swap);
    assert_eq!(c.policy.gpu_temperature.action, OnCritical::Warn);
    assert_eq!(
        c.policy.gpu_temperature.leave_hold_ms,
        d.gpu_temperature.leave_hold_ms
    );
    assert_eq!(c.policy.cpu_temperature, d.cpu_temperature);
    let e = parse("[policy.host_memory]\ncritical = 0.7\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("policy.host_memory.critical_leave") && e.contains("0.85") && e.contains("0.7"),
        "{e}"
    );
    let e = parse("[policy.swap]\ncriticl = 0.9\n").unwrap_err();
    assert!(
        matches!(&e, ParseError::Syntax { line: Some(2), key: Some(k), .. } if k == "policy.swap.criticl"),
        "{e:?}"
    );
    let e = e.to_string();
    assert!(
        e.contains("line 2") && e.contains("policy.swap.criticl"),
        "{e}"
    );
}

/// Errors name the line, column and dotted key however the key was written: under a `[table]`
/// header, as a dotted key, in an inline table, in an array of tables; and a check made after
/// parsing finds its key's line the same ways.
#[test]
fn errors_name_the_key_however_it_is_written() {
    for (text, want) in [
        (
            "listen = \"127.0.0.1:9300\"\n[policy.job_cgroup]\nwarn = \"x\"\n",
            "line 3, column 8, key `policy.job_cgroup.warn`",
        ),
        (
            "policy = { job_cgroup = { warn = \"x\" } }\n",
            "line 1, column 34, key `policy.job_cgroup.warn`",
        ),
        (
            "[sampling]\ninterval_ms = 1000\n\n[[notify.channels]]\nkind = \"x\"\n",
            "line 5, column 8, key `notify.channels[0].kind`",
        ),
        (
            "[sampling]\nprobe_interval_ms = 50\nfast_interval_ms = 60\n",
            "line 3, key `sampling.fast_interval_ms`",
        ),
        // An error on a table (here a missing field) names the table, not the key above it.
        (
            "[notify]\nnear_exhaustion_seconds = 5\n[[notify.channels]]\nname = \"x\"\n",
            "line 3, column 1, key `notify.channels[0]`",
        ),
        (
            "sampling.probe_interval_ms = 50\nsampling.fast_interval_ms = 60\n",
            "line 2, key `sampling.fast_interval_ms`",
        ),
    ] {
        let e = parse(text).unwrap_err().to_string();
        assert!(e.starts_with(want), "{text:?}: {e}");
    }
}

#[test]
fn example_file_matches_defaults() {
    let example = example_toml().unwrap();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../memwatch.example.toml");
    if std::env::var_os("MEMWATCH_BLESS").is_some() {
        std::fs::write(&path, &example).unwrap();
    }
    let on_disk = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        on_disk, example,
        "memwatch.example.toml drifted from the defaults: run `MEMWATCH_BLESS=1 cargo test -p memwatch-core example_file`"
    );
    assert_eq!(parse(&on_disk).unwrap(), Config::default());
}

fn error(text: &str) -> String {
    parse(text).unwrap_err().to_string()
}

#[test]
fn bad_configs_name_key_and_line() {
    let cases = [
        (
            "\n[sampling]\nintervall_ms = 5\n",
            "line 3",
            "unknown field `intervall_ms`",
        ),
        (
            "[sampling]\ninterval_ms = -1\n",
            "key `sampling.interval_ms`",
            "between 10 and",
        ),
        (
            "[sampling]\ninterval_ms = \"fast\"\n",
            "line 2",
            "sampling.interval_ms",
        ),
        ("listen = \"127.0.0.1:70000\"\n", "key `listen`", "line 1"),
        (
            "[http]\nmax_connections = 0\n",
            "key `http.max_connections`",
            "between 1",
        ),
        (
            "[log]\nlevel = \"loud\"\n",
            "key `log.level`",
            "unknown variant",
        ),
        ("[gpu]\nenabled = 1\n", "key `gpu.enabled`", "line 2"),
        ("nonsense", "line 1", ""),
        // Found by mutating configs: these once made `memwatch run` panic or pass.
        (
            "[http]\nmax_connections = 9223372036854775807\n",
            "line 2, key `http.max_connections`",
            "at most 65536",
        ),
        (
            "[http]\nmax_connections = 2305843009213693952\n",
            "line 2, key `http.max_connections`",
            "at most 65536",
        ),
        (
            "[policy]\ncheckpoint_signal = \"SIGSTOP\"\n",
            "line 2, key `policy.checkpoint_signal`",
            "cannot ask for a checkpoint",
        ),
        (
            "[policy]\ncheckpoint_signal = \"kill\"\n",
            "key `policy.checkpoint_signal`",
            "SIGKILL cannot",
        ),
        (
            "[policy]\ncheckpoint_signal = \"SIGCONT\"\n",
            "key `policy.checkpoint_signal`",
            "SIGCONT cannot",
        ),
        (
            "[policy]\nreflex_priority = 100\n",
            "line 2, key `policy.reflex_priority`",
            "not a real-time priority",
        ),
        (
            "[policy]\nreflex_priority = 300\n",
            "key `policy.reflex_priority`",
            "line 2",
        ),
        (
            "[policy]\nmax_pause_seconds = 900\n",
            "line 2, key `policy.max_pause_seconds`",
            "NCCL watchdog",
        ),
        (
            "[policy]\nmax_pause_seconds = 0\n",
            "key `policy.max_pause_seconds`",
            "at least 1",
        ),
        (
            "[policy.gpu_temperature]\naction = \"pause\"\nwarn_below_slowdown = 3.0\n\
             critical_below_shutdown = +inf\nresume_below_slowdown = 5.0\nfallback_slowdown_celsius = 87.0\n\
             fallback_shutdown_celsius = 95.0\nenter_hold_ms = 0\nleave_hold_ms = 1\n",
            "line 4, key `policy.gpu_temperature.critical_below_shutdown`",
            "got inf",
        ),
        (
            "[policy.sensors]\ncount_as_cpu = [\"nvme\", \"iwl wifi\"]\n",
            "line 2, key `policy.sensors.count_as_cpu`",
            "\"iwl wifi\" is not a device name",
        ),
        (
            "[policy.sensors]\ncount_as_cpu = [\"\"]\n",
            "key `policy.sensors.count_as_cpu`",
            "not a device name",
        ),
        (
            "[policy.sensors]\ncount_as_gpu = [\"nvme\"]\n",
            "count_as_gpu",
            "unknown field",
        ),
        (
            "[control]\nmax_connections_per_uid = 300\n",
            "key `control.max_connections_per_uid`",
            "at most 256",
        ),
    ];
    for (text, a, b) in cases {
        let e = error(text);
        assert!(e.contains(a) && e.contains(b), "for {text:?} got {e:?}");
    }
}

#[test]
fn long_pauses_need_the_override_and_still_have_a_ceiling() {
    let ok = parse("[policy]\nmax_pause_seconds = 900\nallow_long_pause = true\n").unwrap();
    assert_eq!(ok.policy.max_pause_seconds, 900);
    let e = error("[policy]\nmax_pause_seconds = 9999999\nallow_long_pause = true\n");
    assert!(e.contains("7 days"), "{e}");
}

#[test]
fn invalid_utf8_names_its_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, b"[sampling]\ninterval_ms = 100\n# caf\xe9\n").unwrap();
    let e = load(Some(&path)).unwrap_err().to_string();
    assert!(
        e.contains("bad.toml") && e.contains("line 3, column 6") && e.contains("0xe9"),
        "{e}"
    );
    std::fs::write(&path, vec![b'#'; 2 << 20]).unwrap();
    let e = load(Some(&path)).unwrap_err().to_string();
    assert!(e.contains("larger than"), "{e}");
}

#[test]
fn missing_explicit_file_is_an_error_but_missing_default_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.toml");
    assert!(matches!(
        load(Some(&missing)),
        Err(ConfigError::Read { .. })
    ));
}

#[test]
fn history_len_follows_interval() {
    let s = Sampling {
        interval_ms: IntervalMs(100),
        history_seconds: HistorySeconds(3600),
        ..Sampling::default()
    };
    assert_eq!(s.history_len(), 36_000);
}

#[test]
fn sensors_counted_as_a_cpus_are_read_by_name() {
    let c = parse("[policy.sensors]\ncount_as_cpu = [\"nvme\", \"iwlwifi_1\"]\n").unwrap();
    assert!(c.policy.sensors.counts("nvme") && c.policy.sensors.counts("iwlwifi_1"));
    assert!(!c.policy.sensors.counts("acpitz"));
    assert!(!parse("").unwrap().policy.sensors.counts("nvme"));
}
