//! A pause on a projection, as a job growing into its line meets it: probed every 10 ms (as near
//! trouble), a full sample each second, its usage growing while it runs and still while it is held
//! (a frozen job cannot grow, so its measured growth falls to nothing). The pause holds until there
//! is room for the growth that caused it, or the way out ends it (or, finding no step, resumes it
//! once below its critical line: `spared.rs`); it is not resumed on the nil rate of a frozen job, so
//! it does not ping-pong at the line.

use super::harness::{ALL, Kind, Sim};

pub(super) const MIB: u64 = 1 << 20;
/// The job's cgroup limit: a unit's `MemoryMax=400M`.
pub(super) const LIMIT: u64 = 400 * MIB;
/// How fast the job grows while it runs: bytes/s.
pub(super) const RATE: f64 = 148.0 * MIB as f64;
/// The probe's period near trouble (`sampling.fast_interval_ms`).
pub(super) const PROBE_MS: u64 = 10;

/// A job of `kind` with a cgroup limit of `LIMIT`, walked once (so a pause freezes its own cgroup
/// where it has one), at 200 MiB.
pub(super) fn growing(kind: Kind, extra: &str) -> (Sim, f64) {
    let mut s = Sim::with(kind, extra, &[]);
    s.sample(0.5);
    s.cgroup_limit = Some(LIMIT);
    (s, 200.0 * MIB as f64)
}

/// Runs the job until `until` (ms): each probe finds it `rate` bytes/s higher while it runs and
/// where it was while a pause holds it; a full sample each second. Returns its usage at the end.
pub(super) fn run(s: &mut Sim, usage: f64, rate: f64, until: u64) -> f64 {
    run_every(s, usage, rate, until, PROBE_MS)
}

/// [`run`], probed every `period` ms.
pub(super) fn run_every(s: &mut Sim, mut usage: f64, rate: f64, until: u64, period: u64) -> f64 {
    while s.now < until {
        let next = s.now + period;
        s.advance_to(next);
        if s.pause().is_none() {
            usage += rate * period as f64 / 1000.0;
        }
        if s.now % 1000 == 0 {
            s.sample_unchanged(0.5, usage as u64);
        } else {
            s.probe_cgroup(usage as u64, 0);
        }
    }
    usage
}

/// The job is paused and held: stopped, frozen, or (a Slurm job) suspended and not resumed since
/// (the full samples' checks of Slurm's holds come after the suspend).
pub(super) fn held(s: &Sim) -> bool {
    s.pause().is_some()
        && match s.kind {
            Kind::Slurm => !s
                .slurm
                .iter()
                .any(|(c, _)| *c == crate::seam::SlurmCall::Resume),
            _ => s.held(),
        }
}

/// How many times the job was paused and resumed so far.
pub(super) fn cycles(s: &Sim) -> (usize, usize) {
    let events = s.events();
    let count = |action: &str| events.iter().filter(|(a, _, _)| a == action).count();
    (count("pause"), count("resume"))
}

/// Paused on its projection 250 ms short of its limit, a job frozen short of its line shows no
/// growth: that nil rate is the freeze's, not the job's, and resumes nothing. It is held (its cgroup
/// still near its limit) until the limit is raised, then resumed at once, as recovered.
#[test]
fn a_predicted_pause_is_not_resumed_on_a_frozen_jobs_rate() {
    for kind in ALL {
        let (mut s, mut usage) = growing(kind, "");
        while s.pause().is_none() && s.now < 5_000 {
            let next = s.now + PROBE_MS;
            usage = run(&mut s, usage, RATE, next);
        }
        let p = s
            .pause()
            .unwrap_or_else(|| panic!("{kind:?}: never paused: {:?}", s.events()));
        assert_eq!(
            s.events().iter().find(|e| e.0 == "pause").map(|e| &e.1[..]),
            Some("predicted"),
            "{kind:?}: {:?}",
            s.events()
        );
        let view = s.engine.view();
        let said = view.events.iter().find(|e| e.action.as_str() == "pause");
        assert!(
            said.is_some_and(|e| e.detail.starts_with("cgroup limit projected to be reached")),
            "{kind:?}: {said:?}"
        );
        // Frozen for the next 3 s, some 35 MiB short of its limit: held throughout.
        let frozen_at = usage;
        assert!(
            frozen_at < (LIMIT - 20 * MIB) as f64 && frozen_at > (LIMIT / 2) as f64,
            "{kind:?}: {} MiB",
            frozen_at / MIB as f64
        );
        for _ in 0..300 {
            let next = s.now + PROBE_MS;
            run(&mut s, frozen_at, RATE, next);
            assert!(
                held(&s),
                "{kind:?}: resumed at {} MiB of {} with no room, {} ms into its pause: {:?}",
                frozen_at / MIB as f64,
                LIMIT / MIB,
                s.now - p.since_ms,
                s.events()
            );
        }
        assert_eq!(cycles(&s), (1, 0), "{kind:?}: {:?}", s.events());
        // The limit raised (systemd's set-property, a person): room for the growth that caused
        // the pause, and it runs on.
        s.cgroup_limit = Some(4 * LIMIT);
        let raised = s.now;
        run(&mut s, frozen_at, 0.0, raised + 3 * PROBE_MS);
        assert!(s.pause().is_none(), "{kind:?}: {:?}", s.events());
        assert!(s.all_running(), "{kind:?}: {:?}", s.host.acts());
        let resume = s.events().into_iter().rfind(|e| e.0 == "resume");
        assert!(
            resume
                .as_ref()
                .is_some_and(|(_, r, t)| r == "recovered" && *t <= raised + PROBE_MS),
            "{kind:?}: {resume:?}"
        );
    }
}

/// Host memory running out (its lines set high, so that the projection comes first): the job is
/// paused on the host's projection, and held while nothing else frees memory; memory another process
/// frees (the host's use falling while the job is frozen) is the room it needed, and it is resumed.
#[test]
fn a_predicted_pause_on_the_host_resumes_when_other_memory_is_freed() {
    const GIB: f64 = (1u64 << 30) as f64;
    let total: u64 = 16 << 30;
    let lines = "[policy.host_memory]\nwarn = 0.97\nwarn_leave = 0.96\ncritical = 0.99\ncritical_leave = 0.98\n";
    for kind in ALL {
        let mut s = Sim::with(kind, lines, &[]);
        // MemAvailable 3 GiB, falling by 1 GiB/s while the job runs.
        let mut available = 3.0 * GIB;
        s.sample(1.0 - available / total as f64);
        let mut paused_at = None;
        while s.now < 20_000 {
            let next = s.now + PROBE_MS;
            s.advance_to(next);
            if s.pause().is_none() {
                available -= GIB * PROBE_MS as f64 / 1000.0;
            }
            let probed = available.max(0.0) as u64;
            s.engine
                .handle_probe(Some((probed, total)), Vec::new(), s.now);
            s.drain();
            s.check();
            if paused_at.is_none() && s.pause().is_some() {
                paused_at = Some((s.now, probed));
            }
            if paused_at.is_some_and(|(at, _)| s.now >= at + 3_000) {
                break;
            }
        }
        let (at, probed) =
            paused_at.unwrap_or_else(|| panic!("{kind:?}: never paused: {:?}", s.events()));
        assert_eq!(
            s.events().iter().find(|e| e.0 == "pause").map(|e| &e.1[..]),
            Some("predicted"),
            "{kind:?}: {:?}",
            s.events()
        );
        assert!(
            held(&s),
            "{kind:?}: resumed with {} MiB available, {} ms into the pause: {:?}",
            probed / MIB,
            s.now - at,
            s.events()
        );
        assert_eq!(cycles(&s), (1, 0), "{kind:?}: {:?}", s.events());
        // Another process exits: 3 GiB back, room for more than a second of the growth.
        let freed = probed + (3 << 30);
        for _ in 0..3 {
            s.now += PROBE_MS;
            s.engine
                .handle_probe(Some((freed, total)), Vec::new(), s.now);
            s.drain();
            s.check();
        }
        assert!(s.pause().is_none(), "{kind:?}: {:?}", s.events());
        assert!(s.all_running(), "{kind:?}: {:?}", s.host.acts());
        assert_eq!(cycles(&s), (1, 1), "{kind:?}: {:?}", s.events());
    }
}

/// A job growing into its line is paused once, and that pause holds (no resume into the 30 MiB
/// left at 148 MiB/s, no pause again at the line) until the way out acts: here a checkpoint (its
/// signal) and a clean stop, never a resume. (A job with no step to take, below its critical line,
/// is resumed once instead: `spared.rs`.)
#[test]
fn a_job_growing_into_its_line_is_paused_once_until_the_way_out() {
    for kind in ALL {
        let (mut s, usage) = growing(
            kind,
            "[policy]\nmax_pause_seconds = 8\ncheckpoint_signal = \"SIGUSR1\"\n[way_out]\ndecide_seconds = 5\ncheckpoint_grace_seconds = 2\nsteps = [\"checkpoint\"]\n",
        );
        let usage = run(&mut s, usage, RATE, 4_000);
        assert_eq!(
            cycles(&s),
            (1, 0),
            "{kind:?}: paused and resumed at the line: {:?}",
            s.events()
        );
        let since = s.pause().expect("held").since_ms;
        // On at the probe's usual period (100 ms), to the way out and past the longest pause.
        run_every(&mut s, usage, RATE, since + 10_000, 100);
        let at = |action: &str, reason: &str| {
            s.events()
                .into_iter()
                .find(|(a, r, _)| a == action && r == reason)
                .map(|e| e.2)
        };
        assert_eq!(
            at("checkpoint", "way_out"),
            Some(since + 5_000),
            "{kind:?}: {:?}",
            s.events()
        );
        assert_eq!(
            at("terminate", "way_out"),
            Some(since + 7_000),
            "{kind:?}: {:?}",
            s.events()
        );
        assert_eq!(cycles(&s), (1, 0), "{kind:?}: {:?}", s.events());
    }
}
