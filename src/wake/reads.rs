//! A v2 job's usage, read by the wake thread on its own timer (and a v1 job's while its thresholds
//! are being registered, [`register`](super::register), and while it is over its critical line by
//! its page cache, [`UsageReads::over_the_line_only`]). cgroup v2 has no usage thresholds, so
//! these reads stand in for v1's: a read that finds usage on the other side of one of the engine's
//! lines (half the limit, warn, critical, each tenth of a percent for a percent above it, then each
//! half percent) wakes the owner task as a threshold's eventfd would, and a read at or over the
//! critical line looks at the job's reflex (`crate::reflex`), which fires there.
//!
//! A read comes after the time growth at [`FASTEST_GROWTH`] would take to cover the room left to the
//! critical line and half the margin from the line to the limit, between 1 ms and 1 s
//! ([`poll_after`]). So a crossing of critical is told before 4 GiB/s of growth is halfway from the
//! line to the limit, and one of warn or of half the limit within a second at most (the full samples'
//! cadence while the engine is not calm). Over the line by usage and under it by the clean page
//! cache, the room the cache leaves times the next read, to the line itself: the reflex then fires
//! at most a read's interval of growth past it, whatever the thresholds' spacing. Without a reflex,
//! or where it could not read, the next read comes after 100 ms (the engine probes meanwhile).
//!
//! A v1 job's reads, once its thresholds are in, are reads over the line only: the thresholds wake
//! it below its line, and a crossing that finds it over its line by its cache
//! ([`Crossing::Cached`]) times its next read ([`UsageReads::cached`]). Such reads stop at the first
//! that finds its usage under the line, and tell of no crossing (its thresholds do).
//!
//! [`FASTEST_GROWTH`]: crate::reflex::FASTEST_GROWTH

use std::path::Path;
use std::time::Instant;

use crate::reflex::{Armory, Crossing, POLL_AFTER_ERROR, poll_after};
use crate::sample::kept::KeptFile;

/// One v2 job's reads.
pub struct UsageReads {
    job: String,
    usage: KeptFile,
    /// The engine's lines in bytes of usage, ascending.
    thresholds: Vec<u64>,
    /// How many of them usage had reached at the last read (`None` before the first).
    band: Option<usize>,
    critical_bytes: u64,
    /// The limit less the critical line.
    margin: u64,
    /// When the next read is due; `None`: none until a crossing over the line by the cache.
    due: Option<Instant>,
    /// A v1 job's, its thresholds in: read only while over the line by its cache.
    over_the_line_only: bool,
}

/// What one read found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Turn {
    /// Usage crossed one of the lines since the last read (up or down).
    pub crossed: bool,
    /// The job's reflex fired.
    pub fired: bool,
}

impl UsageReads {
    /// Reads of `usage` (a v2 cgroup's `memory.current`; a v1 one's `memory.usage_in_bytes` while
    /// its thresholds register) against `thresholds` (bytes; any order), the critical line among
    /// them at `critical_bytes` of `limit_bytes`; the first read is due at once and tells of no
    /// crossing (as a new v1 threshold does not).
    pub fn new(
        job: &str,
        usage: &Path,
        thresholds: &[u64],
        critical_bytes: u64,
        limit_bytes: u64,
    ) -> UsageReads {
        let mut thresholds = thresholds.to_vec();
        thresholds.sort_unstable();
        UsageReads {
            job: job.to_owned(),
            usage: KeptFile::new(usage.to_owned()),
            thresholds,
            band: None,
            critical_bytes,
            margin: limit_bytes.saturating_sub(critical_bytes),
            due: Some(Instant::now()),
            over_the_line_only: false,
        }
    }

    /// The same, each read timed to reach the critical line itself at the fastest growth, not
    /// halfway from it to the limit: more reads for a while (a v1 job's registration), each stop
    /// at most a millisecond of that growth late.
    pub fn to_the_line(mut self) -> UsageReads {
        self.margin = 0;
        self
    }

    /// The job's name.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// From now on read only while over the line by the page cache (a v1 job's, its thresholds
    /// in): a read that finds usage under the line, or no reflex to fire, is the last until
    /// [`UsageReads::cached`]; a read tells of no crossing (the thresholds do).
    pub fn over_the_line_only(&mut self) {
        self.over_the_line_only = true;
    }

    /// A crossing at `now` found the job over its line by usage, its page cache holding it `room`
    /// bytes under: the next read comes no later than the fastest growth takes to cover that room.
    pub fn cached(&mut self, now: Instant, room: u64) {
        let due = now + poll_after(room, 0);
        self.due = Some(self.due.map_or(due, |d| d.min(due)));
    }

    /// When the next read is due (`None`: not until a crossing over the line by the cache).
    pub fn due(&self) -> Option<Instant> {
        self.due
    }

    /// Makes the next read due at once.
    pub fn read_now(&mut self) {
        self.due = Some(Instant::now());
    }

    /// Reads the usage if due at `now`, and sets the next read.
    pub fn turn(&mut self, now: Instant, armory: &Armory) -> Turn {
        if self.due.is_none_or(|due| due > now) {
            return Turn::default();
        }
        let usage = self
            .usage
            .read()
            .ok()
            .and_then(|(_, text)| text.trim().parse::<u64>().ok());
        let Some(usage) = usage else {
            self.due = Some(now + POLL_AFTER_ERROR);
            return Turn::default();
        };
        let band = self.thresholds.partition_point(|&t| t <= usage);
        let crossed =
            self.band.replace(band).is_some_and(|b| b != band) && !self.over_the_line_only;
        let crossing = if usage < self.critical_bytes {
            Crossing::Below(self.critical_bytes - usage)
        } else {
            armory.crossing_at(&self.job, now, Some(usage))
        };
        let next = match crossing {
            Crossing::Below(room) => poll_after(room, self.margin),
            // To the line: past it, growth is the reflex's lateness, not a margin to spend.
            Crossing::Cached(room) => poll_after(room, 0),
            Crossing::Fired | Crossing::Unread | Crossing::None => POLL_AFTER_ERROR,
        };
        // Over the line only: on while the cache holds the job under it (or the read is to be made
        // again), off under the line, fired, or with no reflex to fire.
        let on =
            !self.over_the_line_only || matches!(crossing, Crossing::Cached(_) | Crossing::Unread);
        self.due = on.then(|| now + next);
        Turn {
            crossed,
            fired: crossing == Crossing::Fired,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::reflex::tests::{MIB, armed, freeze_word, set, v2_cgroup};

    /// A read across a line, the reflex not fired.
    const CROSSED: Turn = Turn {
        crossed: true,
        fired: false,
    };

    /// Reads at the engine's lines for a 1000 MiB limit: half, warn (80 %), critical (95 %).
    fn reads(dir: &Path) -> UsageReads {
        UsageReads::new(
            "job",
            &dir.join("memory.current"),
            &[950 * MIB, 500 * MIB, 800 * MIB],
            950 * MIB,
            1000 * MIB,
        )
    }

    fn wait(r: &UsageReads, from: Instant) -> Duration {
        r.due().unwrap().saturating_duration_since(from)
    }

    #[test]
    fn the_first_read_is_due_at_once_and_the_next_as_the_room_to_the_line_allows() {
        let d = v2_cgroup(200 * MIB, 0);
        let armory = Armory::default();
        let mut r = reads(d.path());
        let now = Instant::now();
        assert!(r.due().unwrap() <= now);
        assert_eq!(
            r.turn(now, &armory),
            Turn::default(),
            "the first read tells nothing"
        );
        let want = poll_after(750 * MIB, 50 * MIB);
        let got = wait(&r, now);
        assert!(
            got >= want && got < want + Duration::from_millis(50),
            "{got:?} against {want:?}"
        );
        // Not due yet: nothing is read.
        set(d.path(), 600 * MIB, 0);
        assert_eq!(r.turn(now, &armory), Turn::default());
        let due = r.due().unwrap();
        assert_eq!(r.turn(due, &armory), CROSSED, "over half");
        assert!(wait(&r, due) < want, "nearer the line, sooner");
        let due = r.due().unwrap();
        assert_eq!(r.turn(due, &armory), Turn::default(), "the same band");
        set(d.path(), 400 * MIB, 0);
        let due = r.due().unwrap();
        assert_eq!(r.turn(due, &armory), CROSSED, "down again");
    }

    #[test]
    fn reads_to_the_line_are_timed_by_the_room_alone() {
        let d = v2_cgroup(200 * MIB, 0);
        let armory = Armory::default();
        let mut r = reads(d.path()).to_the_line();
        let now = Instant::now();
        assert_eq!(r.turn(now, &armory), Turn::default());
        // 750 MiB to the line at 4 GiB/s, none of the 50 MiB margin's half.
        assert_eq!(wait(&r, now), poll_after(750 * MIB, 0));
        assert!(poll_after(750 * MIB, 0) < poll_after(750 * MIB, 50 * MIB));
    }

    #[test]
    fn a_read_over_the_line_fires_the_reflex_once() {
        let d = v2_cgroup(900 * MIB, 0);
        let armory = armed(d.path());
        let mut r = reads(d.path());
        let now = Instant::now();
        assert_eq!(r.turn(now, &armory), Turn::default());
        set(d.path(), 990 * MIB, 0);
        let due = r.due().unwrap();
        assert_eq!(
            r.turn(due, &armory),
            Turn {
                fired: true,
                ..CROSSED
            }
        );
        assert_eq!(freeze_word(d.path()), "1");
        assert_eq!(armory.take_fired()[0].unreclaimable(), 990 * MIB);
        // Fired and disarmed: the job stays over the line (frozen), read every 100 ms meanwhile.
        let due = r.due().unwrap();
        assert_eq!(r.turn(due, &armory), Turn::default());
        assert!(wait(&r, due) >= POLL_AFTER_ERROR);
    }

    #[test]
    fn cache_over_the_line_times_the_next_read_by_the_room_it_leaves_to_the_line_itself() {
        // 990 MiB charged, 300 MiB of it inactive file cache: 260 MiB of room. The next read comes
        // when the fastest growth would reach the line, not halfway past it to the limit.
        let d = v2_cgroup(990 * MIB, 300 * MIB);
        let armory = armed(d.path());
        let mut r = reads(d.path());
        let now = Instant::now();
        assert_eq!(r.turn(now, &armory), Turn::default());
        assert_eq!(freeze_word(d.path()), "0");
        assert_eq!(wait(&r, now), poll_after(260 * MIB, 0));
        assert!(poll_after(260 * MIB, 0) < poll_after(260 * MIB, 50 * MIB));
    }

    #[test]
    fn reads_over_the_line_only_stop_under_it_and_start_again_at_a_crossing_over_it_by_the_cache() {
        // A v1 job's reads once its thresholds are in: 900 MiB charged, under its line.
        let d = v2_cgroup(900 * MIB, 0);
        let armory = armed(d.path());
        let mut r = reads(d.path());
        r.over_the_line_only();
        let now = Instant::now();
        assert_eq!(r.turn(now, &armory), Turn::default());
        assert_eq!(
            r.due(),
            None,
            "read under the line, where the thresholds wake it"
        );
        // Its cache takes it over the line (a threshold's crossing, which the reflex looked at):
        // 970 MiB charged, 40 MiB clean, 20 MiB under the line.
        set(d.path(), 970 * MIB, 40 * MIB);
        r.cached(now, 20 * MIB);
        assert_eq!(wait(&r, now), poll_after(20 * MIB, 0));
        // A later crossing nearer the line brings the read forward, never back.
        r.cached(now, 4 * MIB);
        assert_eq!(wait(&r, now), poll_after(4 * MIB, 0));
        r.cached(now, 400 * MIB);
        assert_eq!(wait(&r, now), poll_after(4 * MIB, 0));
        // Read: still held under by the cache, so read again, to the line, and no crossing told
        // (its thresholds tell those).
        let due = r.due().unwrap();
        assert_eq!(r.turn(due, &armory), Turn::default());
        assert_eq!(wait(&r, due), poll_after(20 * MIB, 0));
        // Its own memory takes the cache's place: fired, and no more reads.
        set(d.path(), 970 * MIB, 5 * MIB);
        let due = r.due().unwrap();
        assert_eq!(
            r.turn(due, &armory),
            Turn {
                crossed: false,
                fired: true
            }
        );
        // Its first read over the line froze ahead of the cache it had not seen and thawed.
        assert_eq!(freeze_word(d.path()), "101");
        assert_eq!(armory.take_fired()[0].unreclaimable(), 965 * MIB);
        assert_eq!(r.due(), None, "read on after its reflex fired");
        // Over the line with no reflex armed: one read, then none.
        r.read_now();
        let due = r.due().unwrap();
        assert_eq!(r.turn(due, &armory), Turn::default());
        assert_eq!(r.due(), None, "read on with no reflex to fire");
    }

    #[test]
    fn a_read_that_fails_is_tried_again_after_100_ms() {
        let d = v2_cgroup(200 * MIB, 0);
        std::fs::remove_file(d.path().join("memory.current")).unwrap();
        let mut r = reads(d.path());
        let now = Instant::now();
        assert_eq!(r.turn(now, &Armory::default()), Turn::default());
        assert!(wait(&r, now) >= POLL_AFTER_ERROR);
    }
}
