//! A pause on a projection with no way out (`policy/spared.rs`): a plain job (no config file, so the
//! ladder's swap, lend and checkpoint all skip) paused on its projection below its critical line is
//! resumed once when the ladder finds nothing, instead of being held to the longest pause and
//! stopped. A job whose burst ended runs on; one that keeps growing is paused at its critical line,
//! not by the projection, and then held to the longest pause and stopped: one resume, no ping-pong.

use super::harness::{ALL, Sim};
use super::predicted::{LIMIT, MIB, PROBE_MS, RATE, cycles, growing, held, run, run_every};
use crate::policy::{Cause, Resource};

/// The default ladder, with nothing to take for a plain job: no config (swap and lend skip), not
/// launched, no checkpoint signal and a Slurm job not requeued (checkpoint skips).
const PLAIN: &str =
    "[slurm]\nrequeue = false\n[way_out]\nsteps = [\"swap\", \"lend\", \"checkpoint\"]\n";

/// Grows the job at `RATE` until its projection pauses it; returns its usage and the pause's start.
fn paused_on_its_projection(s: &mut Sim, mut usage: f64) -> (f64, u64) {
    let kind = s.kind;
    while s.pause().is_none() && s.now < 5_000 {
        let next = s.now + PROBE_MS;
        usage = run(s, usage, RATE, next);
    }
    let since = s
        .pause()
        .unwrap_or_else(|| panic!("{kind:?}: never paused: {:?}", s.events()))
        .since_ms;
    assert_eq!(
        s.events().iter().find(|e| e.0 == "pause").map(|e| &e.1[..]),
        Some("predicted"),
        "{kind:?}: {:?}",
        s.events()
    );
    assert!(
        usage < (LIMIT as f64) * 0.95,
        "{kind:?}: paused at its critical line, not below it: {} MiB",
        usage / MIB as f64
    );
    (usage, since)
}

/// The times of the events with `action` and `reason`.
fn times(s: &Sim, action: &str, reason: &str) -> Vec<u64> {
    s.events()
        .into_iter()
        .filter(|(a, r, _)| a == action && r == reason)
        .map(|e| e.2)
        .collect()
}

/// Its burst ends as it is paused: held while the room it needed does not come, then, the ladder
/// finding no step, resumed once at `decide_seconds`, and it runs to its end — past the longest
/// pause (300 s), which would have stopped it — never paused again, never stopped.
#[test]
fn a_plain_job_whose_burst_ended_is_resumed_when_there_is_no_way_out() {
    for kind in ALL {
        let (mut s, usage) = growing(kind, PLAIN);
        let (usage, since) = paused_on_its_projection(&mut s, usage);
        let decided = since + 5_000;
        let usage = run(&mut s, usage, 0.0, decided - PROBE_MS);
        assert!(held(&s), "{kind:?}: {:?}", s.events());
        let usage = run(&mut s, usage, 0.0, decided + PROBE_MS);
        for step in ["swap", "lend", "checkpoint"] {
            assert_eq!(
                times(&s, "way_out", step),
                vec![decided],
                "{kind:?}: {step}: {:?}",
                s.events()
            );
        }
        assert_eq!(
            times(&s, "way_out", "no_way_out"),
            vec![decided],
            "{kind:?}"
        );
        assert_eq!(
            times(&s, "resume", "no_way_out"),
            vec![decided],
            "{kind:?}: {:?}",
            s.events()
        );
        assert!(s.pause().is_none(), "{kind:?}: {:?}", s.events());
        assert!(s.all_running(), "{kind:?}: {:?}", s.host.acts());
        // Past the longest pause from the pause's start, a full sample each second.
        let aligned = (s.now / 1_000 + 1) * 1_000;
        let usage = run(&mut s, usage, 0.0, aligned);
        run_every(&mut s, usage, 0.0, since + 400_000, 1_000);
        assert!(s.pause().is_none(), "{kind:?}: {:?}", s.events());
        assert_eq!(cycles(&s), (1, 1), "{kind:?}: {:?}", s.events());
        // It ends by itself.
        s.gone = true;
        s.now += 1_000;
        s.sample(0.5);
        let ended: Vec<(String, String)> = s
            .events()
            .into_iter()
            .filter(|(a, _, _)| ["terminate", "kill", "detach"].contains(&a.as_str()))
            .map(|(a, r, _)| (a, r))
            .collect();
        assert_eq!(
            ended,
            vec![("detach".to_owned(), "gone".to_owned())],
            "{kind:?}: {:?}",
            s.events()
        );
    }
}

/// It keeps growing after that resume: its projection does not pause it again (the growth is new
/// evidence, but the episode is the critical line's), its critical line does, short of the limit;
/// then, with no way out and no second resume, it is held and stopped at the longest pause. One
/// resume in the episode: no ping-pong.
#[test]
fn a_plain_job_that_grows_on_after_that_resume_is_paused_at_its_line_and_stopped() {
    for kind in ALL {
        let (mut s, usage) = growing(kind, &format!("[policy]\nmax_pause_seconds = 8\n{PLAIN}"));
        let (usage, since) = paused_on_its_projection(&mut s, usage);
        let decided = since + 5_000;
        let mut usage = run(&mut s, usage, RATE, decided + PROBE_MS);
        assert_eq!(times(&s, "resume", "no_way_out"), vec![decided], "{kind:?}");
        while s.pause().is_none() && s.now < decided + 2_000 {
            let next = s.now + PROBE_MS;
            usage = run(&mut s, usage, RATE, next);
        }
        let p = s
            .pause()
            .unwrap_or_else(|| panic!("{kind:?}: not paused again: {:?}", s.events()));
        assert_eq!(
            p.held.reasons,
            vec![Cause::Resource(Resource::JobCgroup("sim".into()))],
            "{kind:?}: {:?}",
            s.events()
        );
        assert!(
            usage >= LIMIT as f64 * 0.95 && usage < LIMIT as f64,
            "{kind:?}: {} MiB",
            usage / MIB as f64
        );
        let at_line = p.since_ms;
        // On at the probe's usual period, to the way out and past the longest pause.
        run_every(&mut s, usage, RATE, at_line + 10_000, 100);
        assert_eq!(
            times(&s, "way_out", "no_way_out"),
            vec![decided, at_line + 5_000],
            "{kind:?}: {:?}",
            s.events()
        );
        assert_eq!(
            times(&s, "terminate", "way_out"),
            vec![at_line + 8_000],
            "{kind:?}: {:?}",
            s.events()
        );
        assert_eq!(cycles(&s), (2, 1), "{kind:?}: {:?}", s.events());
        assert_eq!(times(&s, "resume", "no_way_out").len(), 1, "{kind:?}");
    }
}
