//! Scenarios: a sequence of observations and the decisions expected after each.

use super::*;

fn obs(now_ms: u64) -> Observation {
    Observation {
        now_ms,
        host: vec![
            (Resource::HostMemory, Reading::Value(0.30)),
            (Resource::Swap, Reading::Absent),
            (Resource::Pressure, Reading::Value(0.0)),
        ],
        cpu_temperature: None,
        gpus: vec![GpuObservation {
            index: 0,
            memory: Reading::Value(0.5),
            temperature: Some(Temperature {
                celsius: 60.0,
                slowdown: Some(90.0),
                shutdown: Some(98.0),
            }),
        }],
        jobs: vec![JobObservation {
            name: "train".into(),
            cgroup: Reading::Value(0.2),
            gpus: Some(vec![0]),
            projections: Vec::new(),
            pause: None,
        }],
    }
}

/// The policy's state and the job's one pause record, which the engine keeps (the policy keeps no
/// copy) and shows in each observation.
type World = (State, Option<PauseState>);

/// One policy step as the engine takes it: the pause record in the observation, the decisions carried
/// out on it (a pause stores its state, a resume or terminate clears it, staying marks it expired).
fn advance(w: &World, mut o: Observation, cfg: &Policy) -> (World, Vec<Decision>) {
    for j in &mut o.jobs {
        j.pause = w.1.clone();
    }
    let (state, decisions) = evaluate(&w.0, &o, cfg);
    let mut pause = w.1.clone();
    for d in &decisions {
        match d {
            Decision::Pause { pause: p, .. } => pause = Some(p.clone()),
            Decision::Resume { .. } | Decision::Terminate { .. } => pause = None,
            Decision::StayPaused { .. } => {
                if let Some(p) = pause.as_mut() {
                    p.expired = true;
                }
            }
            Decision::LevelChanged { .. } | Decision::Checkpoint { .. } => {}
        }
    }
    ((state, pause), decisions)
}

/// What a step changes from the calm baseline.
type Step = (u64, fn(&mut Observation));

/// The decisions after each step, as short strings ("pause", "resume", "level host_memory critical" …).
fn run(cfg: &Policy, steps: &[Step]) -> Vec<Vec<String>> {
    let mut state = World::default();
    steps
        .iter()
        .map(|(now, change)| {
            let mut o = obs(*now);
            change(&mut o);
            let (next, decisions) = advance(&state, o, cfg);
            state = next;
            decisions
                .into_iter()
                .map(|d| match d {
                    Decision::LevelChanged { key, to, .. } => {
                        format!("level {key} {}", to.as_str())
                    }
                    Decision::Checkpoint { .. } => "checkpoint".into(),
                    Decision::Pause { .. } => "pause".into(),
                    Decision::Resume { .. } => "resume".into(),
                    Decision::Terminate { .. } => "terminate".into(),
                    Decision::StayPaused { .. } => "stay".into(),
                })
                .collect()
        })
        .collect()
}

/// Sets a host-wide resource's reading.
fn set(o: &mut Observation, r: Resource, v: Reading) {
    for (k, reading) in &mut o.host {
        if *k == r {
            *reading = v;
        }
    }
}

fn calm(_: &mut Observation) {}
fn host_critical(o: &mut Observation) {
    set(o, Resource::HostMemory, Reading::Value(0.93));
}
fn host_recovering(o: &mut Observation) {
    set(o, Resource::HostMemory, Reading::Value(0.80));
}
fn host_unknown(o: &mut Observation) {
    set(o, Resource::HostMemory, Reading::Unknown);
}
fn cgroup_critical(o: &mut Observation) {
    o.jobs[0].cgroup = Reading::Value(0.96);
}
fn growing_fast(o: &mut Observation) {
    o.jobs[0].cgroup = Reading::Value(0.5);
    o.jobs[0].projections = vec![Projection {
        limit: LimitKind::Cgroup,
        headroom_bytes: 200 << 20,
        growth_bytes_per_second: (1u64 << 30) as f64,
    }];
}
fn paused_little_room(o: &mut Observation) {
    o.jobs[0].cgroup = Reading::Value(0.6);
    o.jobs[0].projections = vec![Projection {
        limit: LimitKind::Cgroup,
        headroom_bytes: 200 << 20,
        growth_bytes_per_second: 0.0,
    }];
}
fn limit_raised(o: &mut Observation) {
    o.jobs[0].cgroup = Reading::Value(0.2);
    o.jobs[0].projections = vec![Projection {
        limit: LimitKind::Cgroup,
        headroom_bytes: 4 << 30,
        growth_bytes_per_second: 0.0,
    }];
}
fn still_growing_host_has_room(o: &mut Observation) {
    growing_fast(o);
    o.jobs[0].projections.push(Projection {
        limit: LimitKind::Host,
        headroom_bytes: 20 << 30,
        growth_bytes_per_second: 0.0,
    });
}
fn gpu_hot(o: &mut Observation) {
    o.gpus[0].temperature.as_mut().unwrap().celsius = 94.0;
}
fn gpu_hovering(o: &mut Observation) {
    o.gpus[0].temperature.as_mut().unwrap().celsius = 92.0;
}
fn gpu_cool(o: &mut Observation) {
    o.gpus[0].temperature.as_mut().unwrap().celsius = 80.0;
}
fn gpu1_hot_job_on_gpu0(o: &mut Observation) {
    o.gpus.push(GpuObservation {
        index: 1,
        memory: Reading::Value(0.1),
        temperature: Some(Temperature {
            celsius: 97.0,
            slowdown: Some(90.0),
            shutdown: Some(98.0),
        }),
    });
}
fn gpu_memory_full(o: &mut Observation) {
    o.gpus[0].memory = Reading::Value(0.99);
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

#[test]
fn scenarios() {
    let cfg = Policy::default();
    type Case = (&'static str, Vec<Step>, Vec<Vec<String>>);
    let cases: Vec<Case> = vec![
        (
            "calm stays quiet",
            vec![(0, calm), (1000, calm)],
            vec![s(&[]), s(&[])],
        ),
        (
            "host memory critical pauses, recovery resumes after the leave hold",
            vec![
                (0, host_critical),
                (1000, host_recovering),
                (5000, host_recovering),
                (6000, host_recovering),
                (7000, calm),
            ],
            vec![
                s(&["level host_memory critical", "pause"]),
                s(&[]),
                s(&[]),
                s(&["level host_memory warn", "resume"]),
                s(&[]),
            ],
        ),
        (
            "missing data never resumes",
            vec![
                (0, host_critical),
                (1000, host_unknown),
                (60_000, host_unknown),
            ],
            vec![s(&["level host_memory critical", "pause"]), s(&[]), s(&[])],
        ),
        (
            "the job's own cgroup near its limit pauses it",
            vec![(0, cgroup_critical), (100, cgroup_critical)],
            vec![s(&["level job_cgroup:train critical", "pause"]), s(&[])],
        ),
        (
            "fast growth pauses before any level is crossed; it stays paused while it still grows and \
             while, held, it shows no growth (the hold's, not the job's); it resumes only once the \
             limit has room for the rate seen at the pause (`room.rs`)",
            vec![
                (0, growing_fast),
                (10, paused_little_room),
                (100, growing_fast),
                (5000, paused_little_room),
                (6000, limit_raised),
            ],
            vec![s(&["pause"]), s(&[]), s(&[]), s(&[]), s(&["resume"])],
        ),
        (
            "resuming looks at the limit that ran out, not at another with room",
            vec![
                (0, growing_fast),
                (5000, still_growing_host_has_room),
                (6000, limit_raised),
            ],
            vec![s(&["pause"]), s(&[]), s(&["resume"])],
        ),
        (
            "GPU too hot pauses; hovering does not resume; cooling resumes after the hold",
            vec![
                (0, gpu_hot),
                (1000, gpu_hovering),
                (2000, gpu_hot),
                (3000, gpu_hovering),
                (4000, gpu_cool),
                (14_000, gpu_cool),
            ],
            vec![
                s(&["level gpu_temperature:0 critical", "pause"]),
                s(&[]),
                s(&[]),
                s(&[]),
                s(&[]),
                s(&["level gpu_temperature:0 ok", "resume"]),
            ],
        ),
        (
            "a hot GPU the job does not use leaves it alone",
            vec![(0, gpu1_hot_job_on_gpu0)],
            vec![s(&["level gpu_temperature:1 critical"])],
        ),
        (
            "full GPU memory only warns by default",
            vec![(0, gpu_memory_full)],
            vec![s(&["level gpu_memory:0 critical"])],
        ),
        (
            "the maximum pause resumes by default",
            vec![
                (0, host_critical),
                (299_999, host_critical),
                (300_000, host_critical),
                (300_100, host_critical),
            ],
            vec![
                s(&["level host_memory critical", "pause"]),
                s(&[]),
                s(&["resume"]),
                s(&["pause"]),
            ],
        ),
    ];
    for (name, steps, want) in cases {
        assert_eq!(run(&cfg, &steps), want, "{name}");
    }
}

#[test]
fn max_pause_can_stay_or_terminate() {
    let steps: Vec<Step> = vec![
        (0, host_critical),
        (300_000, host_critical),
        (400_000, host_critical),
    ];
    let stay = Policy {
        on_max_pause: OnMaxPause::Stay,
        ..Policy::default()
    };
    assert_eq!(
        run(&stay, &steps),
        vec![
            s(&["level host_memory critical", "pause"]),
            s(&["stay"]),
            s(&[])
        ]
    );
    let term = Policy {
        on_max_pause: OnMaxPause::Terminate,
        ..Policy::default()
    };
    assert_eq!(run(&term, &steps)[1], s(&["terminate"]));
}

#[test]
fn checkpoint_comes_first_when_there_is_time() {
    let cfg = Policy {
        checkpoint_signal: "SIGUSR1".into(),
        checkpoint_grace_ms: 2000,
        ..Policy::default()
    };
    let got = run(&cfg, &[(0, gpu_hot), (1000, gpu_hot), (2000, gpu_hot)]);
    assert_eq!(
        got,
        vec![
            s(&["level gpu_temperature:0 critical", "checkpoint"]),
            s(&[]),
            s(&["pause"])
        ]
    );
    // No time to checkpoint when exhaustion is projected within the reaction time.
    assert_eq!(run(&cfg, &[(0, growing_fast)]), vec![s(&["pause"])]);
}

#[test]
fn user_resume_overrides_the_current_episode_only() {
    let cfg = Policy::default();
    let mut st = World::default();
    let mut o = obs(0);
    host_critical(&mut o);
    let (next, d) = advance(&st, o.clone(), &cfg);
    assert!(d.iter().any(|d| matches!(d, Decision::Pause { .. })));
    st = next;
    // The engine resumes the job and drops its record.
    user_resume(&mut st.0, "train");
    st.1 = None;
    o.now_ms = 100;
    let (next, d) = advance(&st, o, &cfg);
    assert!(d.is_empty(), "{d:?}");
    st = next;
    // The episode ends, a new one starts: the policy may pause again.
    let mut calm_obs = obs(6000);
    set(&mut calm_obs, Resource::HostMemory, Reading::Value(0.5));
    st = advance(&st, calm_obs.clone(), &cfg).0;
    calm_obs.now_ms = 12_000;
    st = advance(&st, calm_obs, &cfg).0;
    assert_eq!(st.0.levels[&Resource::HostMemory].level, Level::Ok);
    let mut again = obs(20_000);
    host_critical(&mut again);
    let (_, d) = advance(&st, again, &cfg);
    assert!(
        d.iter().any(|d| matches!(d, Decision::Pause { .. })),
        "{d:?}"
    );
}

#[test]
fn user_pause_is_never_resumed_by_the_policy() {
    let cfg = Policy::default();
    let mut st = World::default();
    st.1 = Some(user_pause(&mut st.0, "train", 0));
    for t in [0, 1000, 400_000] {
        let (next, d) = advance(&st, obs(t), &cfg);
        assert!(d.is_empty(), "{d:?}");
        st = next;
    }
}

#[test]
fn temperature_thresholds_follow_the_device() {
    let p = Policy::default().gpu_temperature;
    let t = temp_thresholds(
        &Temperature {
            celsius: 0.0,
            slowdown: Some(90.0),
            shutdown: Some(98.0),
        },
        &p,
    );
    assert_eq!(
        (t.warn_enter, t.critical_enter, t.critical_leave),
        (87.0, 93.0, 85.0)
    );
    let f = temp_thresholds(
        &Temperature {
            celsius: 0.0,
            slowdown: None,
            shutdown: None,
        },
        &p,
    );
    assert_eq!((f.critical_enter, f.critical_leave), (90.0, 82.0));
    // Thresholds that nearly coincide still keep leave below enter.
    let tight = temp_thresholds(
        &Temperature {
            celsius: 0.0,
            slowdown: Some(90.0),
            shutdown: Some(91.0),
        },
        &p,
    );
    assert!(
        tight.critical_leave < tight.critical_enter && tight.warn_enter <= tight.critical_enter
    );
}

/// Each decision to act on a job carries its typed cause (what its event's reason is derived from),
/// never only a sentence: the checkpoint and pause for a critical cgroup name that cgroup, the first
/// cause by key leads, a projection comes last, and a resume says what ended the pause.
#[test]
fn decisions_carry_their_typed_cause() {
    let cfg = Policy {
        checkpoint_signal: "SIGUSR1".into(),
        checkpoint_grace_ms: 2000,
        ..Policy::default()
    };
    let train = Cause::Resource(Resource::JobCgroup("train".into()));
    let step = |state: &World, now: u64, change: fn(&mut Observation)| {
        let mut o = obs(now);
        change(&mut o);
        advance(state, o, &cfg)
    };
    let (s1, d) = step(&World::default(), 0, cgroup_critical);
    assert!(
        d.contains(&Decision::Checkpoint {
            job: "train".into(),
            cause: train.clone(),
            reason: "train's cgroup at 96.0 %".into(),
        }),
        "{d:?}"
    );
    let (s2, d) = step(&s1, 2000, cgroup_critical);
    assert!(
        matches!(&d[..], [Decision::Pause { cause, .. }] if *cause == train),
        "{d:?}"
    );
    // Calm for the level's leave hold.
    let (s3, _) = step(&s2, 10_000, calm);
    let (_, d) = step(&s3, 13_000, calm);
    assert!(
        d.iter().any(|d| matches!(
            d,
            Decision::Resume {
                why: Resumed::Recovered,
                ..
            }
        )),
        "{d:?}"
    );
    // Host memory and the job's cgroup both critical: host_memory leads (by key).
    let (_, d) = step(&World::default(), 0, |o| {
        host_critical(o);
        cgroup_critical(o);
    });
    assert!(
        d.iter().any(|d| matches!(
            d,
            Decision::Checkpoint {
                cause: Cause::Resource(Resource::HostMemory),
                ..
            }
        )),
        "{d:?}"
    );
    // A projection alone.
    let (_, d) = step(&World::default(), 0, growing_fast);
    assert!(
        matches!(
            &d[..],
            [Decision::Pause {
                cause: Cause::Predicted,
                ..
            }]
        ),
        "{d:?}"
    );
    // The maximum pause.
    let (s, _) = advance(
        &World::default(),
        {
            let mut o = obs(0);
            host_critical(&mut o);
            o
        },
        &Policy::default(),
    );
    let mut o = obs(300_000);
    host_critical(&mut o);
    let (_, d) = advance(&s, o, &Policy::default());
    assert!(
        matches!(
            &d[..],
            [Decision::Resume {
                why: Resumed::MaxPause,
                ..
            }]
        ),
        "{d:?}"
    );
}

/// The policy keeps no pause of its own: a pause the engine could not make (no record was written)
/// is decided again at the next step, where a copy kept in the policy would have believed the job
/// paused and never paused it again.
#[test]
fn a_pause_that_did_not_happen_is_decided_again() {
    let cfg = Policy::default();
    let mut o = obs(0);
    host_critical(&mut o);
    let (state, d) = evaluate(&State::default(), &o, &cfg);
    assert!(
        d.iter().any(|d| matches!(d, Decision::Pause { .. })),
        "{d:?}"
    );
    o.now_ms = 100;
    let (_, d) = evaluate(&state, &o, &cfg);
    assert!(
        d.iter().any(|d| matches!(d, Decision::Pause { .. })),
        "the failed pause was not decided again: {d:?}"
    );
}

/// A pause carried over a daemon's restart (the policy's state starts empty, the pause record comes
/// from the state file) is not resumed before what caused it has been read again: a probe with no
/// GPU data says nothing about a hot GPU. Once the GPU is read cool, it is resumed.
#[test]
fn a_pause_carried_over_a_restart_waits_for_its_cause_to_be_read() {
    let cfg = Policy::default();
    let hot_gpu = Cause::Resource(Resource::GpuTemperature(0));
    let carried = PauseState {
        since_ms: 500,
        by: By::Policy,
        reasons: vec![hot_gpu],
        projected: None,
        expired: false,
        strict: false,
    };
    let mut w: World = (State::default(), Some(carried));
    // Probes: no GPU in the observation yet.
    for now in [1_000, 1_100, 1_200] {
        let mut o = obs(now);
        o.gpus.clear();
        let (next, d) = advance(&w, o, &cfg);
        assert!(
            !d.iter().any(|d| matches!(d, Decision::Resume { .. })),
            "resumed at {now} before the GPU was read: {d:?}"
        );
        w = next;
    }
    // The first full sample reads the GPU cool: resumed.
    let (w, d) = advance(&w, obs(1_300), &cfg);
    assert!(
        d.iter().any(|d| matches!(d, Decision::Resume { .. })),
        "{d:?}"
    );
    assert_eq!(w.1, None);
}

fn swap_full(o: &mut Observation) {
    set(o, Resource::Swap, Reading::Value(0.95));
}

/// Swap is a host-wide resource like any other: its level comes from its own `[policy.swap]`, and
/// its default action only warns (slow, not fatal); told to pause, it pauses the jobs.
#[test]
fn full_swap_warns_by_default_and_pauses_when_told() {
    let d = Policy::default();
    let out = run(&d, &[(0, calm), (1000, swap_full), (2000, swap_full)]);
    assert_eq!(out[1], s(&["level swap critical"]));
    assert!(out[2].is_empty(), "{:?}", out[2]);
    let cfg = Policy {
        swap: RatioPolicy {
            action: OnCritical::Pause,
            ..d.swap.clone()
        },
        ..d.clone()
    };
    let out = run(&cfg, &[(0, calm), (1000, swap_full)]);
    assert_eq!(out[1], s(&["level swap critical", "pause"]));
    // Its own thresholds, not host_memory's: 0.85 is under swap's critical (0.90).
    let out = run(
        &cfg,
        &[(0, |o: &mut Observation| {
            set(o, Resource::Swap, Reading::Value(0.85))
        })],
    );
    assert_eq!(out[0], s(&["level swap warn"]));
}
