//! When a pause on a projection may end: only into room. A job paused because its growth would
//! reach a limit within the reaction time is held until that limit has room for the growth that
//! caused the pause. What the job's growth reads while it is held says nothing: a frozen or stopped
//! job cannot grow, so its rate falls to nothing whether or not it would go on growing. Room that
//! appears while it is held does: a raised limit, memory another process freed, usage that fell.

use super::{JobObservation, PauseState};
use crate::config::Policy;

/// How long the room a job is resumed into must last at the growth that caused its pause: the
/// configured `resume_headroom_ms`, and never less than twice the reaction time. The projection
/// pauses a job whose room lasts less than one reaction time, so a job resumed into less would be
/// paused again as soon as its growth is measured; the second reaction time is for that measurement.
pub(super) fn resume_window_ms(cfg: &Policy) -> u64 {
    cfg.resume_headroom_ms
        .max(cfg.reaction_ms.saturating_mul(2))
}

/// Whether the pause `p` of `job` has the room to end at `now_ms`: always, for a pause no
/// projection caused (its levels decide); for one a projection caused, once it has been held for
/// the reaction time and the limit it projected has room for [`resume_window_ms`] of growth at the
/// rate seen when it began, or at the rate measured now where that is faster (a host whose other
/// processes go on filling it). Unknown headroom is no room.
pub(super) fn room_to_resume(
    p: &PauseState,
    job: &JobObservation,
    now_ms: u64,
    cfg: &Policy,
) -> bool {
    let Some((limit, at_pause)) = &p.projected else {
        return true;
    };
    let window_s = resume_window_ms(cfg) as f64 / 1000.0;
    now_ms.saturating_sub(p.since_ms) >= cfg.reaction_ms
        && job
            .projections
            .iter()
            .find(|x| &x.limit == limit)
            .is_some_and(|x| {
                let rate = at_pause.max(x.growth_bytes_per_second).max(0.0);
                x.headroom_bytes as f64 >= rate * window_s
            })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{By, Cause, LimitKind, Projection, Reading};

    const MIB: f64 = 1048576.0;

    /// Paused at 0 ms on the cgroup's projection at 148 MiB/s.
    fn paused() -> PauseState {
        PauseState {
            since_ms: 0,
            by: By::Policy,
            reasons: vec![Cause::Predicted],
            projected: Some((LimitKind::Cgroup, 148.0 * MIB)),
            expired: false,
            strict: false,
        }
    }

    /// The job with `headroom` MiB under its cgroup limit, growing at `rate` MiB/s now.
    fn job(headroom: f64, rate: f64) -> JobObservation {
        JobObservation {
            name: "train".into(),
            cgroup: Reading::Absent,
            gpus: None,
            projections: vec![Projection {
                limit: LimitKind::Cgroup,
                headroom_bytes: (headroom * MIB) as u64,
                growth_bytes_per_second: rate * MIB,
            }],
            pause: Some(paused()),
        }
    }

    /// A job frozen 30 MiB short of its limit measures no growth: no room for the 148 MiB/s that
    /// paused it, however long it is held. Room for a second of it ends the pause; faster growth
    /// measured now asks for more; no room on the projected limit (or none known) holds it.
    #[test]
    fn a_projected_pause_ends_only_into_room_for_the_growth_that_caused_it() {
        let cfg = Policy::default();
        assert_eq!(resume_window_ms(&cfg), 1000);
        let p = paused();
        for now in [250, 1_000, 60_000] {
            assert!(!room_to_resume(&p, &job(30.0, 0.0), now, &cfg), "{now}");
        }
        // The limit raised: 150 MiB of room, a second of 148 MiB/s.
        assert!(room_to_resume(&p, &job(150.0, 0.0), 250, &cfg));
        // Not before a reaction time has passed.
        assert!(!room_to_resume(&p, &job(150.0, 0.0), 249, &cfg));
        // Usage falling while held (memory freed) is room, not a rate that lowers the bar.
        assert!(!room_to_resume(&p, &job(100.0, -500.0), 1_000, &cfg));
        // Growth measured faster now (the host's other processes) needs room for that.
        assert!(!room_to_resume(&p, &job(150.0, 300.0), 1_000, &cfg));
        assert!(room_to_resume(&p, &job(300.0, 300.0), 1_000, &cfg));
        // The projected limit unknown now: no room.
        let mut gone = job(1e6, 0.0);
        gone.projections[0].limit = LimitKind::Host;
        assert!(!room_to_resume(&p, &gone, 1_000, &cfg));
        // A pause no projection caused is the levels' to end.
        let level = PauseState {
            projected: None,
            ..paused()
        };
        assert!(room_to_resume(&level, &job(0.0, 0.0), 0, &cfg));
    }

    /// The room lasts at least twice the reaction time, whatever `resume_headroom_ms` says: a
    /// resume into less would be undone by the projection at once.
    #[test]
    fn the_room_lasts_at_least_twice_the_reaction_time() {
        let cfg = Policy {
            resume_headroom_ms: 0,
            ..Policy::default()
        };
        assert_eq!(resume_window_ms(&cfg), 500);
        assert!(!room_to_resume(&paused(), &job(70.0, 0.0), 1_000, &cfg));
        assert!(room_to_resume(&paused(), &job(75.0, 0.0), 1_000, &cfg));
        let cfg = Policy {
            resume_headroom_ms: 3_000,
            ..Policy::default()
        };
        assert_eq!(resume_window_ms(&cfg), 3_000);
    }
}
