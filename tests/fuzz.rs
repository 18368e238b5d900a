//! Property runs over what the outside world controls: the config parser, the control-socket protocol
//! (decoding and the engine's handling of every request), and the /proc, /sys and cgroup parsers. For
//! every input: no panic, and a config that parses is within its documented bounds.
//!
//! Cases per target: PROPTEST_CASES (default 2 000 here; BENCHMARKS.md reports a longer run). Each
//! target prints its count of executions.

use std::path::Path;

use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestRunner};

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000)
}

/// Runs `strategy` through `check` for `cases()` cases; reports the executions.
fn run<S: Strategy>(name: &str, strategy: S, check: impl Fn(S::Value)) {
    let mut runner = TestRunner::new(RunnerConfig {
        cases: cases(),
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    let count = std::cell::Cell::new(0u64);
    runner
        .run(&strategy, |v| {
            count.set(count.get() + 1);
            check(v);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    eprintln!("{name}: {} executions", count.get());
}

/// Values that have broken parsers before: huge and negative numbers, non-finite floats, odd strings.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|v| v.to_string()),
        any::<u64>().prop_map(|v| v.to_string()),
        any::<f64>().prop_map(|v| format!("{v:?}")),
        Just("+inf".to_owned()),
        Just("-inf".to_owned()),
        Just("nan".to_owned()),
        Just("9223372036854775807".to_owned()),
        Just("2305843009213693952".to_owned()),
        Just("18446744073709551616".to_owned()),
        "\"[a-zA-Z0-9 _:./-]{0,12}\"",
        Just("\"SIGSTOP\"".to_owned()),
        Just("\"SIGKILL\"".to_owned()),
        Just("true".to_owned()),
        Just("[]".to_owned()),
        Just("{}".to_owned()),
    ]
}

#[test]
fn the_config_parser_never_panics_and_keeps_its_bounds() {
    let example = memwatch::config::example_toml().unwrap();
    let lines: Vec<String> = example.lines().map(str::to_owned).collect();
    let assignments: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.starts_with('#') && l.contains(" = "))
        .map(|(i, _)| i)
        .collect();
    // The shipped example with one to three values replaced.
    let mutated = proptest::collection::vec((0..assignments.len(), value()), 1..4);
    run("config: mutated example", mutated, |edits| {
        let mut l = lines.clone();
        for (which, v) in edits {
            let i = assignments[which];
            let key = l[i].split(" = ").next().unwrap_or_default().to_owned();
            l[i] = format!("{key} = {v}");
        }
        let text = l.join("\n");
        if let Ok(c) = memwatch::config::parse(&text) {
            assert!(c.http.max_connections.0 <= 65_536, "{text}");
            assert!(c.control.max_connections.0 <= 4096, "{text}");
            assert!(c.policy.max_pause_seconds >= 1);
            assert!(c.policy.max_pause_seconds <= 540 || c.policy.allow_long_pause);
            assert!(c.policy.gpu_temperature.critical_below_shutdown.is_finite());
            assert!(!matches!(
                memwatch::act::signal_by_name(&c.policy.checkpoint_signal),
                Some(nix::sys::signal::Signal::SIGSTOP | nix::sys::signal::Signal::SIGKILL)
            ));
        }
    });
    run("config: arbitrary text", ".{0,300}", |text: String| {
        let _ = memwatch::config::parse(&text);
    });
}

fn request_json() -> impl Strategy<Value = String> {
    let target = prop_oneof![
        "[a-z0-9._-]{0,10}",
        any::<u32>().prop_map(|p| p.to_string()),
        Just("4242".to_owned())
    ];
    let token = proptest::option::of("[a-f0-9]{0,8}");
    prop_oneof![
        (
            any::<u32>(),
            proptest::option::of("[a-zA-Z0-9._-]{0,70}"),
            any::<bool>()
        )
            .prop_map(|(pid, name, itself)| {
                serde_json::json!({"cmd": "attach", "pid": pid % 10_000, "name": name, "self": itself})
                    .to_string()
            }),
        target.clone().prop_map(|t| serde_json::json!({"cmd": "detach", "target": t}).to_string()),
        target.clone().prop_map(|t| serde_json::json!({"cmd": "pause", "target": t}).to_string()),
        target.clone().prop_map(|t| serde_json::json!({"cmd": "resume", "target": t}).to_string()),
        Just(r#"{"cmd":"jobs"}"#.to_owned()),
        (target.clone(), any::<u64>(), token.clone()).prop_map(|(t, since, token)| {
            serde_json::json!({"cmd": "directives", "target": t, "since": since, "token": token})
                .to_string()
        }),
        (target.clone(), any::<u64>(), any::<u64>(), token).prop_map(|(t, g, e, token)| {
            serde_json::json!({"cmd": "ack", "target": t, "generation": g, "epoch": e, "token": token})
                .to_string()
        }),
        (target, any::<u64>(), any::<f64>()).prop_map(|(t, step, loss)| {
            serde_json::json!({"cmd": "progress", "target": t,
                "progress": {"epoch": step % 7, "step": step, "loss": loss}})
            .to_string()
        }),
        ".{0,80}",
    ]
}

#[test]
fn the_control_protocol_never_panics() {
    // The engine on the fixture tree, in dry-run mode: requests are decoded and handled for real, and
    // nothing is ever signalled.
    let state = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/root");
    let text = format!(
        "[host]\nroot = {root:?}\nprocess_root = {root:?}\n[control]\nstate_dir = {:?}\n[policy]\ndry_run = true\n",
        state.path()
    );
    let config = memwatch::config::parse(&text).unwrap();
    let engine = std::cell::RefCell::new(memwatch::engine::open(
        memwatch::engine::Settings::from(&config),
        None,
    ));
    // The reads a request needs, made as the daemon makes them before the engine takes it.
    let preparer = memwatch::control::prepare::Preparer::of(&config);
    let callers = prop_oneof![Just(0u32), Just(1000u32), any::<u32>()];
    run(
        "control: requests",
        (request_json(), callers),
        |(line, uid)| {
            if let Ok(request) = serde_json::from_str::<memwatch::control::Request>(&line) {
                // The socket's peer: none, or a process that may or may not be the one named.
                let caller = memwatch::control::Caller {
                    uid,
                    pid: (uid % 2 == 0).then_some(std::process::id() as i32),
                };
                let prepared = memwatch::engine::Read::of(&request, caller)
                    .map(|read| preparer.read(read, caller))
                    .unwrap_or_default();
                let r = engine
                    .borrow_mut()
                    .handle_command(request, caller, prepared, 1_000);
                assert!(r.ok || r.error.is_some());
            }
        },
    );
}

fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<u64>().prop_map(|v| v.to_string()),
        any::<i64>().prop_map(|v| v.to_string()),
        Just("18446744073709551616".to_owned()),
        Just("NaN".to_owned()),
        Just("".to_owned()),
        Just("-".to_owned()),
    ]
}

#[test]
fn the_proc_and_sys_parsers_never_panic() {
    let p = Path::new("/proc/x");
    // /proc/PID/stat: hostile names (parentheses, spaces, newlines), truncation, overflow.
    let stat = (
        number(),
        ".{0,20}",
        "[RSDZTtXI ]{0,2}",
        proptest::collection::vec(number(), 0..60),
    )
        .prop_map(|(pid, comm, state, rest)| format!("{pid} ({comm}) {state} {}", rest.join(" ")));
    run("proc: stat", stat, |t: String| {
        let _ = memwatch::proc::parse_stat(p, &t);
    });
    let status = proptest::collection::vec(
        (
            prop_oneof![
                Just(String::from("Uid")),
                Just(String::from("Gid")),
                Just(String::from("NSpid")),
                Just(String::from("Name")),
                Just(String::from("PPid")),
                "[A-Za-z_]{1,8}"
            ],
            proptest::collection::vec(number(), 0..5),
        ),
        0..12,
    )
    .prop_map(|fields| {
        fields
            .into_iter()
            .map(|(k, v)| format!("{k}:\t{}\n", v.join("\t")))
            .collect::<String>()
    });
    run("proc: status", status, |t: String| {
        let _ = memwatch::proc::parse_status(p, &t);
    });
    let kv = |keys: &'static [&'static str]| {
        proptest::collection::vec(
            (
                prop_oneof![
                    proptest::sample::select(keys).prop_map(str::to_owned),
                    "[A-Za-z_()]{1,10}"
                ],
                number(),
                prop_oneof![
                    Just(String::from(" kB")),
                    Just(String::from("")),
                    Just(String::from(" MB"))
                ],
            ),
            0..30,
        )
        .prop_map(|fields| {
            fields
                .into_iter()
                .map(|(k, v, unit)| format!("{k}: {v}{unit}\n"))
                .collect::<String>()
        })
    };
    run(
        "proc: smaps_rollup",
        kv(&["Rss", "Pss", "Swap", "SwapPss", "Pss_Anon"]),
        |t: String| {
            let _ = memwatch::proc::parse_rollup(p, &t);
        },
    );
    run(
        "sys: meminfo",
        kv(&[
            "MemTotal",
            "MemFree",
            "MemAvailable",
            "Buffers",
            "Cached",
            "SwapTotal",
            "SwapFree",
            "Shmem",
        ]),
        |t: String| {
            let _ = memwatch::sample::meminfo::parse(p, &t);
        },
    );
    let psi = proptest::collection::vec(
        (
            prop_oneof![
                Just(String::from("some")),
                Just(String::from("full")),
                "[a-z]{0,5}"
            ],
            proptest::collection::vec(
                (
                    prop_oneof![
                        Just(String::from("avg10")),
                        Just(String::from("avg60")),
                        Just(String::from("avg300")),
                        Just(String::from("total")),
                        "[a-z]{0,5}"
                    ],
                    prop_oneof![number(), any::<f64>().prop_map(|f| format!("{f}"))],
                ),
                0..6,
            ),
        ),
        0..4,
    )
    .prop_map(|lines| {
        lines
            .into_iter()
            .map(|(kind, fields)| {
                let f: Vec<String> = fields
                    .into_iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                format!("{kind} {}\n", f.join(" "))
            })
            .collect::<String>()
    });
    run("sys: pressure", psi, |t: String| {
        let _ = memwatch::sample::psi::parse(p, &t);
    });
    let vmstat = proptest::collection::vec(
        (
            prop_oneof![
                Just(String::from("pswpin")),
                Just(String::from("pswpout")),
                Just(String::from("pgmajfault")),
                "[a-z_]{1,10}"
            ],
            number(),
        ),
        0..20,
    )
    .prop_map(|f| {
        f.into_iter()
            .map(|(k, v)| format!("{k} {v}\n"))
            .collect::<String>()
    });
    run("sys: vmstat", vmstat, |t: String| {
        let _ = memwatch::sample::vmstat::parse(p, &t);
    });
    let membership = proptest::collection::vec(
        (number(), "[a-z,=_]{0,20}", "(/[a-z0-9.:_-]{0,12}){0,4}"),
        0..6,
    )
    .prop_map(|l| {
        l.into_iter()
            .map(|(id, c, path)| format!("{id}:{c}:{path}\n"))
            .collect::<String>()
    });
    run("cgroup: membership", membership, |t: String| {
        let _ = memwatch::sample::cgroup::parse_membership(p, &t);
    });
    run("all parsers: arbitrary text", ".{0,200}", |t: String| {
        let _ = memwatch::proc::parse_stat(p, &t);
        let _ = memwatch::proc::parse_status(p, &t);
        let _ = memwatch::proc::parse_rollup(p, &t);
        let _ = memwatch::sample::meminfo::parse(p, &t);
        let _ = memwatch::sample::psi::parse(p, &t);
        let _ = memwatch::sample::vmstat::parse(p, &t);
        let _ = memwatch::sample::cgroup::parse_membership(p, &t);
    });
}
